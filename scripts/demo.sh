#!/usr/bin/env bash
# The main job: bring everything up, run a flash sale under load through the gateway, print
# the verdict, stop the services again.
#
#   scripts/demo.sh                                   # the load tester's defaults
#   scripts/demo.sh --users 20000 --stock 1000 --report out.json
#   scripts/demo.sh --waiting-room fifo --pollers 200000      # a crowd polling, measured
#
# Every argument goes to seckill-loadtest (see `target/release/seckill-loadtest --help`).
# Exit code: the load tester's (0 PASS, 1 FAIL, 2 setup error); 2 when the platform did not
# come up.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# up.sh cleans up after itself when it fails, and must not stop services that were already
# running when it refused, so the trap is set only once it succeeded.
"$SCRIPTS/up.sh" || exit 2
trap '"$SCRIPTS/down.sh"' EXIT
# The load tester mints tokens with the JWT secret up.sh gave the gateway.
load_run_secrets || die "no $SECRETS_FILE after scripts/up.sh"

# The load tester's own defaults point at the standard ports; follow an overridden one.
export SECKILL_GATEWAY_URL="${SECKILL_GATEWAY_URL:-http://127.0.0.1:$GATEWAY_PORT}"
# The gateway this run started, whose memory `--pollers` samples.
SECKILL_LOADTEST_GATEWAY_PID="$(running_pid gateway)" || die "the gateway is not running"
export SECKILL_LOADTEST_GATEWAY_PID
say "running the flash sale: seckill-loadtest $*"
status=0
"$BIN_DIR/seckill-loadtest" "$@" || status=$?
exit "$status"
