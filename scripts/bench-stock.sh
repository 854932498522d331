#!/usr/bin/env bash
# Benchmarks seckill-api's two hot loops side by side, in one go, on the local servers:
#   stock  redis-benchmark EVALSHA of purchase.lua vs. POST /api/seckill/{id} hit directly
#          (same machine, same concurrency, same request count, alternating runs)
#   relay  the outbox relay's confirmed publish rate vs. publishing without confirms
# Builds in release (`cargo bench`), runs both, prints their reports: markdown tables on
# stdout, progress on stderr. Each bench works in a private namespace and cleans it up.
#
# Options (each goes to the bench that knows it):
#   --concurrency N  --requests N  --buckets N  --client-threads N  --api-env KEY=VALUE
#   --no-relay (diagnostic: seckill-api without a broker)                          stock
#   --messages N  --streams N  --batch N[,N...]  --hints on|off|both
#   --baseline-window N  --confirm-probe true|false                                relay
#   --rounds N  --quiet-below CORES  --quiet-wait-secs N                            both
#   --only stock|relay                                              run one bench only
# Defaults: 64 in flight, 100000 requests, 16 buckets; 50000 messages, batch 256; 2 rounds;
# each run first waits (up to 120 s) until the machine's other work uses at most 0.3 cores.
# Results and what limits them: docs/benchmarks.md.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

stock_args=()
relay_args=()
only=""
while (($# > 0)); do
    option=$1
    value=""
    case "$option" in
    --no-relay)
        stock_args+=("$option")
        shift
        continue
        ;;
    --*=*)
        value=${option#*=}
        option=${option%%=*}
        shift
        ;;
    --*)
        (($# >= 2)) || die "$option needs a value"
        value=$2
        shift 2
        ;;
    *) die "unexpected argument '$option' (see the header of $0)" ;;
    esac
    case "$option" in
    --concurrency | --requests | --buckets | --client-threads | --api-env)
        stock_args+=("$option" "$value")
        ;;
    --messages | --streams | --batch | --hints | --baseline-window | --confirm-probe)
        relay_args+=("$option" "$value")
        ;;
    --rounds | --quiet-below | --quiet-wait-secs)
        stock_args+=("$option" "$value")
        relay_args+=("$option" "$value")
        ;;
    --only)
        [[ $value == stock || $value == relay ]] || die "--only takes stock or relay"
        only=$value
        ;;
    *) die "unknown option $option (see the header of $0)" ;;
    esac
done

require_cargo
"$SCRIPTS/infra.sh"
command -v redis-benchmark >/dev/null 2>&1 || apt_install redis-tools

cd "$ROOT"
say "building the benches (release)"
cargo bench -p seckill-api --bench stock --bench relay --no-run
say "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ $only != relay ]]; then
    say "stock: EVALSHA purchase.lua vs. POST /api/seckill ${stock_args[*]}"
    cargo bench -q -p seckill-api --bench stock -- "${stock_args[@]}"
fi
if [[ $only != stock ]]; then
    say "relay: confirmed vs. unconfirmed publishing ${relay_args[*]}"
    cargo bench -q -p seckill-api --bench relay -- "${relay_args[@]}"
fi
