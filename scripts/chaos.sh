#!/usr/bin/env bash
# The fault matrix: every scenario of issue "a 202 that survives any single fault", one line
# each, then `chaos: N passed, N failed`.
#
#   scripts/chaos.sh                       # every scenario (about 4 minutes)
#   scripts/chaos.sh --fast                # the fast subset CI runs (no outages, no cluster)
#   scripts/chaos.sh --rounds 3            # the whole matrix three times over
#   scripts/chaos.sh --scenarios redis-restart-empty,kill-seckill-api
#   scripts/chaos.sh --list                # the scenarios
#   scripts/chaos.sh --debug-build --fast  # on the dev profile's binaries (what the test suite
#                                          # does: they are built already, a release build is not)
#
# It starts its OWN Redis (append-only file), RabbitMQ node (with its management API) and
# PostgreSQL on spare loopback ports, never the shared ones, and for each scenario the three
# services (release build, or with --debug-build the dev profile's); it stops all of them
# when it ends. Service logs go to
# run/chaos/<n>-<scenario>/. Other arguments: `target/release/seckill-chaos --help`.
# Exit code: 0 all passed, 1 an invariant broke, 2 it could not set up.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_cargo
export PATH="$PATH:/usr/sbin:/sbin"

# The servers it runs privately; the shared ones may be elsewhere (Docker), so look for the
# binaries themselves.
pkgs=()
command -v redis-server >/dev/null 2>&1 || pkgs+=(redis-server)
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || command -v rabbitmq-server >/dev/null 2>&1 || pkgs+=(rabbitmq-server)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null 2>&1 || pkgs+=(postgresql)
if ((${#pkgs[@]} > 0)); then
    apt_install "${pkgs[@]}"
fi

profile=(--release)
bin_dir=$BIN_DIR
args=()
for arg in "$@"; do
    if [ "$arg" = --debug-build ]; then
        profile=()
        bin_dir="${CARGO_TARGET_DIR:-$ROOT/target}/debug"
    else
        args+=("$arg")
    fi
done

say "building the services and seckill-chaos (${profile[*]:-dev profile})"
(cd "$ROOT" && cargo build ${profile[@]+"${profile[@]}"} -p gateway -p seckill-api -p order-service -p seckill-loadtest)

cd "$ROOT"
exec "$bin_dir/seckill-chaos" --bin-dir "$bin_dir" --log-dir "$RUN_DIR/chaos" ${args[@]+"${args[@]}"}
