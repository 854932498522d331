#!/usr/bin/env bash
# order-service's drain rate (orders persisted per second from a pre-filled queue) vs.
# pgbench's single-row `INSERT … ON CONFLICT DO NOTHING`, side by side in one run, on the
# local Postgres and RabbitMQ. Arguments go to the benchmark:
#
#   scripts/bench-orders.sh                              # 20000 messages, batch 64, 16 connections
#   scripts/bench-orders.sh --batch 1                    # one transaction per message
#   scripts/bench-orders.sh --messages 50000 --db-pool 8 --rounds 3
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_cargo
"$SCRIPTS/infra.sh"
command -v pgbench >/dev/null 2>&1 || die "pgbench not found (it comes with the postgresql package infra.sh installs)"
cd "$ROOT"
say "cargo bench -p order-service --bench drain -- $*"
cargo bench -p order-service --bench drain -- "$@"
