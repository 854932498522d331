#!/usr/bin/env bash
# The whole test suite: makes the infrastructure ready, clears leftovers of crashed earlier
# runs, then runs every test of the workspace against the real Postgres, Redis and RabbitMQ.
# Arguments go to `cargo test` (e.g. `scripts/test.sh -p gateway`, `scripts/test.sh -- --nocapture`).
# Set TEST_LOG=1 to see the services' logs in failing tests.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_cargo
"$SCRIPTS/infra.sh"
"$SCRIPTS/clean-test-state.sh" t_

cd "$ROOT"
say "cargo test --workspace $*"
# Keep cargo's output as it is, then close with one total over every test binary (the last
# binary cargo runs is usually a doc-test one with 0 tests, which says nothing on its own).
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace "$@" 2>&1 | tee "$log" || status=$?
totals=$(awk '/^test result:/ { passed += $4; failed += $6 } END { printf "%d passed, %d failed", passed, failed }' "$log")
echo "tests: $totals"
exit "$status"
