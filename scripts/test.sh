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
exec cargo test --workspace "$@"
