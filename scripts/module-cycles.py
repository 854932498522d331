#!/usr/bin/env python3
"""Finds import cycles between sibling modules of every crate in the workspace.

A module may use its parent and its children freely (that is how Rust nests them); two
siblings that use each other, directly or around a loop, are one idea split in two or a
missing seam. For each crate (a `src/` with `lib.rs` or `main.rs`), every `crate::a::b` and
`super::…` path in a file is resolved to the module it names; an edge joins the two sibling
modules where the user's and the used module's paths part. Prints each cycle and exits 1 if
any; prints the number of modules and edges and exits 0 otherwise.

    scripts/module-cycles.py            # the whole workspace
    scripts/module-cycles.py gateway    # crates under these directories only
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*?)\}", re.S)


def module_path(src: Path, file: Path) -> tuple:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def references(text: str):
    """Yields (anchor, segments) for every crate::/super:: path, groups expanded one level."""
    for m in GROUP.finditer(text):
        base = [s for s in m.group(2).split("::") if s]
        for item in m.group(3).split(","):
            first = item.strip().split("::")[0].strip()
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", first or ""):
                yield m.group(1), base + [first]
    for m in PATH.finditer(text):
        yield m.group(1), [s for s in m.group(2).split("::") if s]


def crate_graph(src: Path):
    files = [f for f in src.rglob("*.rs") if "tests" not in f.relative_to(src).parts[:-1]]
    modules = {module_path(src, f): f for f in files}
    edges = set()
    for path, file in modules.items():
        # A file's own `mod tests` block is a child; the user is the file's module.
        text = strip_comments(file.read_text())
        for anchor, segments in references(text):
            base = []
            if anchor == "super":
                base = list(path)
                while segments and segments[0] == "super":
                    segments = segments[1:]
                    base = base[:-1] if base else base
                base = base[:-1]
            target = base + segments
            # Keep the longest prefix of the target that names a module.
            while target and tuple(target) not in modules:
                target = target[:-1]
            target = tuple(target)
            common = 0
            while common < min(len(path), len(target)) and path[common] == target[common]:
                common += 1
            if common < len(path) and common < len(target):
                edges.add((path[: common + 1], target[: common + 1]))
    return modules, edges


def cycles(edges):
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def main():
    roots = [ROOT / a for a in sys.argv[1:]] or [ROOT]
    srcs = sorted(
        {p.parent for r in roots for p in r.rglob("src/*.rs")
         if p.name in ("lib.rs", "main.rs") and "target" not in p.parts}
    )
    bad = total_modules = total_edges = 0
    for src in srcs:
        modules, edges = crate_graph(src)
        total_modules += len(modules)
        total_edges += len(edges)
        for cycle in cycles(edges):
            bad += 1
            crate = src.parent.relative_to(ROOT)
            print(f"{crate}: " + " -> ".join("::".join(m) for m in cycle))
    if bad:
        print(f"module-cycles: {bad} cycle(s)")
        return 1
    print(f"module-cycles: none ({len(srcs)} crates, {total_modules} modules, {total_edges} edges)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
