#!/usr/bin/env python3
"""The slowest tests of a run, from cargo-nextest's JUnit reports.

Usage: slowest-tests.py N REPORT.xml... (scripts/test.sh passes one report per Redis pass).
Prints N lines, slowest first: seconds, the pass's profile (from the report's name), the test.
"""
import sys
import xml.etree.ElementTree as ElementTree


def main() -> None:
    count = int(sys.argv[1])
    timings = []
    for path in sys.argv[2:]:
        # The report is copied as <log>.<profile>.xml: the profile names the pass.
        profile = path.rsplit(".", 2)[-2]
        for case in ElementTree.parse(path).iter("testcase"):
            name = f"{case.get('classname', '')} {case.get('name', '')}".strip()
            timings.append((float(case.get("time", "0")), profile, name))
    timings.sort(reverse=True)
    for seconds, profile, name in timings[:count]:
        print(f"{seconds:8.1f} s  {profile:<8} {name}")


if __name__ == "__main__":
    main()
