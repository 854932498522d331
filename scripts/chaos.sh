#!/usr/bin/env bash
# The fault matrix: a flash sale under each single fault, one line per scenario, then
# `chaos: N passed, N failed`.
#
#   scripts/chaos.sh                       # every scenario (about 5 minutes)
#   scripts/chaos.sh --fast                # the fast subset CI runs (no outages, no cluster)
#   scripts/chaos.sh --rounds 3            # the whole matrix three times over
#   scripts/chaos.sh --scenarios redis-restart-empty,kill-seckill-api
#   scripts/chaos.sh --scenarios kill-seckill-api-mid-batch,rabbitmq-confirm-lost
#   scripts/chaos.sh --list                # the scenarios
#   scripts/chaos.sh --debug-build --fast  # on the dev profile's binaries
#   scripts/chaos.sh --debug-build --prebuilt --fast
#                                          # on the dev binaries as they are, not built again:
#                                          # what scripts/test.sh does after its test build, which
#                                          # made them (a build here would resolve features
#                                          # otherwise and build the workspace again)
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
build=1
args=()
for arg in "$@"; do
    case $arg in
        --debug-build)
            profile=()
            bin_dir="${CARGO_TARGET_DIR:-$ROOT/target}/debug"
            ;;
        --prebuilt) build=0 ;;
        *) args+=("$arg") ;;
    esac
done

if ((build)); then
    say "building the services and seckill-chaos (${profile[*]:-dev profile})"
    (cd "$ROOT" && cargo build ${profile[@]+"${profile[@]}"} -p gateway -p seckill-api -p order-service -p seckill-loadtest)
else
    for binary in gateway seckill-api order-service seckill-chaos; do
        [ -x "$bin_dir/$binary" ] || die "--prebuilt: no $bin_dir/$binary (build it, or leave --prebuilt out)"
    done
fi

cd "$ROOT"
exec "$bin_dir/seckill-chaos" --bin-dir "$bin_dir" --log-dir "$RUN_DIR/chaos" ${args[@]+"${args[@]}"}
