#!/usr/bin/env bash
# The whole purchase path, side by side in one run: a private stack (gateway + seckill-api +
# order-service, release builds) on the shared Postgres/Redis/RabbitMQ in a fresh namespace,
# loaded by wrk through the gateway with a different buyer (token) on every request:
#
#   accepted  POST /api/seckill/{id} on a product that never sells out during the run: 202s
#   soldout   the same on a sold-out product (a flood after the sale): 410s
#   healthz   GET /healthz, answered by the gateway itself: what the gateway can answer alone;
#             sent by the same wrk script as soldout, a different buyer's token on each
#             request, so that the client does the same work in both and the ratio is the
#             gateway's (wrk's Lua costs it ~5 µs a request on a machine it shares)
#   healthz-static  the same with one fixed request (no Lua per request): the ratio as first
#             measured, reported beside it
#   evalsha   redis-benchmark EVALSHA of a minimal deduct script (check stock, SADD the
#             buyer, DECR) on the same Redis, same concurrency, a random buyer per call
#   contended a whole sale, run to its end: a new product of 20,000 units (--sale-stock)
#             each round, bought by 200,000 distinct buyers (--sale-buyers), each once, as
#             fast as wrk sends (loadtest/bench/contended.lua). The buckets run dry one by
#             one, the losers sweep the others, then the product is flagged sold out. Not
#             in the default set (--scenarios contended, or a list naming it): a round
#             mints 200,000 tokens and sends 200,000 purchases, and its figures are not
#             rates of a steady load but the sale's own, in a table of their own:
#               sell-out   first purchase sent -> the 20,000th 202 answered, on the clock of
#                          wrk's Lua (each purchase's send and answer time is recorded; the
#                          gateway echoes the X-Request-Id the script sends, which pairs them)
#               window     from the last accepted purchase sent to its 202: the last unit
#                          went within it (sell-out is its end, an upper bound)
#               accepted/s 20,000 / sell-out
#               p50/p99    of every answer received until then, whatever its status
#               false 410  410 (sold out) answers received before the last accepted
#                          purchase was even sent: fewer than 20,000 units could have been
#                          sold by then, so units remained. Must be 0 (FAIL otherwise), as
#                          must any difference between 20,000 and the 202s, the orders
#                          written once order-service drained, their distinct buyers and the
#                          units GET /admin/products/{id}/stock says were sold
#               410 < last 202  410s received before the last 202 was: these include the
#                          false ones and those whose check came after the last unit went
#                          but whose answer overtook its 202 (for information)
#             Its row in the main table covers the whole run (every purchase, the order
#             drain in the CPU columns). Its warm-up is a sale of a tenth of the size.
#
# The scenarios run in turn, in a different order each round. The summary gives each run's
# rate, p50/p99 and the CPU time per request of each process (from /proc utime+stime), the
# medians with their spread, the ratios docs/benchmarks.md sets goals for (soldout/healthz and
# accepted/evalsha, per round and median) and each service's RSS at the end.
#
#   scripts/bench-e2e.sh                           # 3 rounds of 8 s, -c64 -t2
#   scripts/bench-e2e.sh -r 5 -d 10 --keep
#   scripts/bench-e2e.sh --bin-dir /tmp/new --baseline-bin /tmp/old   # A/B of two builds
#   scripts/bench-e2e.sh --million                 # memory after 1,000,000 distinct buyers
#   scripts/bench-e2e.sh --tuned                   # logs at warn, quotas far above the load
#   scripts/bench-e2e.sh --scenarios contended -r 5 --baseline-bin /tmp/old  # a sale, A/B
#
# With --baseline-bin a second stack (its own namespace, the other build's three binaries)
# runs the HTTP scenarios too (all but healthz-static), in the same rounds. With --million
# there are no rounds: 1,000,000 (--buyers N) purchases, each from its own buyer, flood a
# sold-out product once, and each service's RSS is printed before, right after and while
# idle (--idle-secs, past the gateway's ten-second shrink of its rate-limit tables and
# hand-back of freed memory).
#
# Configuration: by default the services run as scripts/up.sh starts them, every setting at
# its default (logs at `info`, the request spans on, the default rate limits) but one, also
# raised by up.sh: the gateway's pre-limit on tokens it has not verified yet
# (SECKILL_GATEWAY_RATE_UNVERIFIED_PER_SEC/_BURST, 1000/s per address by default), which a
# load tool minting a new buyer per request from one address would hit at once. --tuned runs
# what this script ran before 2026-11-29: logs at `warn` (the request spans off) and every
# rate limit's quota far above the load (bench_gateway_settings in lib.sh).
#
# Tokens: seckill-token mints each run's buyers into a file (one token a line) before the
# run, sized from the warm-up's rate; loadtest/bench/buyers.lua feeds them to wrk. Rate
# limits stay on either way (their cost is part of the path). Statuses come from the
# gateway's own http_requests_total (wrk without a response() callback; contended has one,
# and checks the gateway's counts against its own).
# Starts nothing it does not stop; removes its namespace (database, keys, queues) at the end.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BENCH_DIR="$ROOT/loadtest/bench"

usage() {
    cat <<EOF
usage: scripts/bench-e2e.sh [options]
  -c, --connections N   wrk connections and redis-benchmark clients (default 64)
  -d, --duration SECS   length of each measured run (default 8)
  -t, --threads N       wrk threads, redis-benchmark threads (default 2)
  -r, --rounds N        rounds; each runs every scenario, in a different order (default 3)
  -w, --warmup SECS     unmeasured run per scenario first, also sizing the token files (default 3)
      --bin-dir DIR     gateway, seckill-api and order-service to measure (default: target/release)
      --baseline-bin DIR  another build's three binaries: a second stack, its HTTP scenarios
                        run in the same rounds (labelled base-*): a before/after in one run
      --million         no rounds: flood a sold-out product with --buyers distinct buyers
                        once, then print each service's RSS over --idle-secs
      --buyers N        buyers of --million (default 1000000)
      --idle-secs N     how long RSS is watched after the flood (default 75)
      --scenarios LIST  comma-separated subset of accepted,soldout,healthz,healthz-static,
                        evalsha,contended (default: all but contended; with --baseline-bin
                        accepted, soldout, healthz and contended also run as base-*)
      --sale-stock N    units of each contended sale (default 20000)
      --sale-buyers N   distinct buyers of each contended sale (default 200000)
      --tuned           logs at warn and every rate-limit quota far above the load, instead
                        of the defaults scripts/up.sh runs with
      --no-build        use the binaries already built
      --keep            keep the work directory (logs, raw wrk output, token files)
  -h, --help            this text
EOF
}

connections=64
duration=8
threads=2
rounds=3
warmup=3
bin_dir=
baseline_dir=
million=0
buyers=1000000
sale_stock=20000
sale_buyers=200000
idle_secs=75
build=1
keep=0
tuned=0
only=accepted,soldout,healthz,healthz-static,evalsha
while (($# > 0)); do
    case $1 in
    -c | --connections) connections=${2:?}; shift ;;
    -d | --duration) duration=${2:?}; shift ;;
    -t | --threads) threads=${2:?}; shift ;;
    -r | --rounds) rounds=${2:?}; shift ;;
    -w | --warmup) warmup=${2:?}; shift ;;
    --bin-dir) bin_dir=${2:?}; shift ;;
    --baseline-bin) baseline_dir=${2:?}; shift ;;
    --million) million=1 ;;
    --buyers) buyers=${2:?}; shift ;;
    --sale-stock) sale_stock=${2:?}; shift ;;
    --sale-buyers) sale_buyers=${2:?}; shift ;;
    --idle-secs) idle_secs=${2:?}; shift ;;
    --scenarios) only=${2:?}; shift ;;
    --tuned) tuned=1 ;;
    --no-build) build=0 ;;
    --keep) keep=1 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 64 ;;
    esac
    shift
done
for n in "$connections" "$duration" "$threads" "$rounds" "$buyers" "$sale_stock" "$sale_buyers"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "counts and durations must be positive integers"
done
[[ $warmup =~ ^[1-9][0-9]*$ ]] || die "--warmup must be at least 1 second (it sizes the token files)"
[[ $idle_secs =~ ^[0-9]+$ ]] || die "--idle-secs must be a whole number of seconds"
((connections >= threads)) || die "wrk needs at least one connection per thread"
((sale_buyers > sale_stock)) || die "--sale-buyers must exceed --sale-stock: the sale must run out"

SERVICE_BINS=(gateway seckill-api order-service)
for tool in wrk redis-benchmark redis-cli curl psql; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (wrk, redis-tools, curl, postgresql-client)"
done
if ((build)); then
    require_cargo
    say "building release binaries (gateway, seckill-api, order-service, seckill-token)"
    (cd "$ROOT" && cargo build --release -q -p gateway -p seckill-api -p order-service \
        -p seckill-loadtest --bin gateway --bin seckill-api --bin order-service --bin seckill-token)
fi
bin_dir=${bin_dir:-$BIN_DIR}
TOKEN_BIN="$BIN_DIR/seckill-token"
[ -x "$TOKEN_BIN" ] || TOKEN_BIN="$bin_dir/seckill-token"
[ -x "$TOKEN_BIN" ] || die "no seckill-token in $BIN_DIR or $bin_dir (run without --no-build)"
for dir in "$bin_dir" ${baseline_dir:+"$baseline_dir"}; do
    for bin in "${SERVICE_BINS[@]}"; do
        [ -x "$dir/$bin" ] || die "$dir/$bin is missing"
    done
done
"$SCRIPTS/infra.sh" >/dev/null

# ---------------------------------------------------------------------------------------
# Work directory, clean-up.

WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-e2e.XXXXXX")
mkdir -p "$WORK/wrk" "$WORK/tokens"
RUN_ID=$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
# Every namespace of this run starts with it; clean-test-state.sh removes them by prefix.
NS_PREFIX="bench_e2e_${RUN_ID}_"

pids=()
cleanup() {
    local status=$?
    local pid
    for pid in "${pids[@]+"${pids[@]}"}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]+"${pids[@]}"}"; do
        for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
        alive "$pid" && kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null || true
    done
    "$SCRIPTS/clean-test-state.sh" "$NS_PREFIX" >"$WORK/clean.log" 2>&1 ||
        say "cleaning namespace $NS_PREFIX* failed: see $WORK/clean.log"
    if ((keep || status != 0)); then
        say "work directory kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------
# The stacks: one (main) or two (main and base), each in its own namespace.

per_run_secrets
declare -A GW_PORT GW_ADMIN API ORD NS PID_GW PID_API PID_ORD DIR

start_service() { # start_service STACK BIN LOG VAR=VALUE...: in the background, pid in STARTED
    local stack=$1 bin=$2 log=$3
    shift 3
    env "$@" "${DIR[$stack]}/$bin" </dev/null >"$log" 2>&1 &
    STARTED=$!
    pids+=("$STARTED")
}

start_stack() { # start_stack NAME DIR
    local name=$1 ns="${NS_PREFIX}$1"
    DIR[$name]=$2
    NS[$name]=$ns
    next_port "GW_PORT[$name]"
    next_port "GW_ADMIN[$name]"
    next_port "API[$name]"
    next_port "ORD[$name]"
    local common=(
        SECKILL_DATABASE_URL="postgres://$PG_USER:$PG_PASSWORD@$PG_HOST:$PG_PORT/seckill_$ns"
        SECKILL_REDIS_URL="redis://$REDIS_HOST:$REDIS_PORT"
        SECKILL_AMQP_URL="amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2f"
        SECKILL_NAMESPACE="$ns"
        SECKILL_HOST=127.0.0.1
        SECKILL_LOG_FORMAT=json
        SECKILL_API_PORT="${API[$name]}"
        SECKILL_ORDER_PORT="${ORD[$name]}"
    )
    if ((tuned)); then
        common+=(SECKILL_LOG_FILTER=warn)
    fi
    local log="$WORK/$name"
    start_service "$name" seckill-api "$log-seckill-api.log" "${common[@]}"
    PID_API[$name]=$STARTED
    start_service "$name" order-service "$log-order-service.log" "${common[@]}"
    PID_ORD[$name]=$STARTED
    local gateway_settings=(SECKILL_GATEWAY_RATE_UNVERIFIED_PER_SEC=100000
        SECKILL_GATEWAY_RATE_UNVERIFIED_BURST=100000)
    if ((tuned)); then
        mapfile -t gateway_settings < <(bench_gateway_settings "$connections")
    fi
    start_service "$name" gateway "$log-gateway.log" "${common[@]}" \
        SECKILL_GATEWAY_HOST=127.0.0.1 \
        SECKILL_GATEWAY_PORT="${GW_PORT[$name]}" \
        SECKILL_GATEWAY_ADMIN_PORT="${GW_ADMIN[$name]}" \
        SECKILL_GATEWAY_SECKILL_API_URLS="http://127.0.0.1:${API[$name]}" \
        SECKILL_GATEWAY_ORDER_SERVICE_URLS="http://127.0.0.1:${ORD[$name]}" \
        "${gateway_settings[@]}"
    PID_GW[$name]=$STARTED
    local svc pid url
    for svc in seckill-api order-service gateway; do
        case $svc in
        seckill-api) pid=${PID_API[$name]} url="http://127.0.0.1:${API[$name]}/readyz" ;;
        order-service) pid=${PID_ORD[$name]} url="http://127.0.0.1:${ORD[$name]}/readyz" ;;
        gateway) pid=${PID_GW[$name]} url="http://127.0.0.1:${GW_ADMIN[$name]}/readyz" ;;
        esac
        stack_ready() { alive "$pid" && http_ok "$url"; }
        if ! wait_until 90 "$name $svc" stack_ready; then
            tail -n 30 "$log-$svc.log" >&2
            die "$name: $svc did not become ready"
        fi
    done
    say "stack $name: gateway 127.0.0.1:${GW_PORT[$name]} (pid ${PID_GW[$name]}), seckill-api pid ${PID_API[$name]}, order-service pid ${PID_ORD[$name]}, namespace $ns, binaries ${DIR[$name]}"
}

STACKS=(main)
start_stack main "$bin_dir"
if [ -n "$baseline_dir" ]; then
    STACKS+=(base)
    start_stack base "$baseline_dir"
fi

# ---------------------------------------------------------------------------------------
# Products and buyers.

ADMIN_TOKEN=$("$TOKEN_BIN" --sub 1 --admin --ttl-secs 86400)
# Buyers are numbered from here on, never twice in a run.
next_buyer=1000

iso() { date -u -d "$1" +%Y-%m-%dT%H:%M:%S.000Z; }

create_product() { # create_product STACK STOCK: the new product's id on stdout
    local body answer
    body=$(printf '{"name":"bench-e2e %s","price_cents":100,"stock":%d,"start_at":"%s","end_at":"%s"}' \
        "$RUN_ID" "$2" "$(iso '-5 seconds')" "$(iso '+3 hours')")
    answer=$(curl -sS --max-time 10 -X POST -H "Authorization: Bearer $ADMIN_TOKEN" \
        -H 'Content-Type: application/json' -d "$body" \
        "http://127.0.0.1:${GW_PORT[$1]}/admin/products") || die "$1: POST /admin/products failed"
    [[ $answer =~ \"id\":([0-9]+) ]] || die "$1: POST /admin/products answered $answer"
    echo "${BASH_REMATCH[1]}"
}

mint() { # mint COUNT FILE: COUNT tokens of new buyers
    "$TOKEN_BIN" --sub "$next_buyer" --count "$1" --ttl-secs 86400 >"$2"
    next_buyer=$((next_buyer + $1))
}

purchase() { # purchase STACK PRODUCT: one purchase by a new buyer, its status in STATUS
    local token
    token=$("$TOKEN_BIN" --sub "$next_buyer" --ttl-secs 86400)
    next_buyer=$((next_buyer + 1))
    STATUS=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 10 -X POST \
        -H "Authorization: Bearer $token" "http://127.0.0.1:${GW_PORT[$1]}/api/seckill/$2")
}

declare -A SOLDOUT
for stack in "${STACKS[@]}"; do
    # One unit, bought once: every purchase after is refused 410.
    SOLDOUT[$stack]=$(create_product "$stack" 1)
    purchase "$stack" "${SOLDOUT[$stack]}"
    [ "$STATUS" = 202 ] || die "$stack: buying the single unit answered $STATUS, not 202"
    purchase "$stack" "${SOLDOUT[$stack]}"
    [ "$STATUS" = 410 ] || die "$stack: a purchase of the sold-out product answered $STATUS, not 410"
    say "$stack: sold-out product ${SOLDOUT[$stack]} (202 then 410)"
done

# ---------------------------------------------------------------------------------------
# Measuring.

HZ=$(getconf CLK_TCK)
REDIS_PID=$(redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" info server | tr -d '\r' | awk -F: '$1 == "process_id" { print $2 }')
BEAM_PIDS=$(pgrep -x beam.smp | paste -sd' ' || true)

ticks() { proc_ticks "$@"; }
pg_backends() { # pg_backends STACK: pids of the Postgres backends serving its database
    psql_admin -d postgres -Atc \
        "select pid from pg_stat_activity where datname = 'seckill_${NS[$1]}'" 2>/dev/null | paste -sd' '
}
rss_mb() { # rss_mb PID: VmRSS in MB
    awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo "-"
}
# post_statuses STACK: "code count" lines of the POSTs its gateway answered so far.
post_statuses() {
    curl -fsS --max-time 5 "http://127.0.0.1:${GW_ADMIN[$1]}/metrics" 2>/dev/null |
        awk '/^http_requests_total\{/ && /service="gateway"/ && /method="POST"/ {
                if (match($0, /status="[0-9]+"/)) n[substr($0, RSTART + 8, 3)] += $NF
            }
            END { for (s in n) print s, n[s] }' | sort
}
status_delta() { # status_delta BEFORE AFTER: "202:n,410:m" of what was answered in between
    join -a2 -e0 -o 0,1.2,2.2 <(echo "$1") <(echo "$2") 2>/dev/null |
        awk '$3 - $2 > 0 { printf "%s%s:%d", sep, $1, $3 - $2; sep = "," }'
}
orders_in_db() { # orders_in_db STACK
    psql_admin -d "seckill_${NS[$1]}" -Atc 'select count(*) from orders' 2>/dev/null || echo 0
}

accepted_between() { # accepted_between BEFORE AFTER: the 202s the gateway answered in between
    local n
    n=$(status_delta "$1" "$2" | tr ',' '\n' | awk -F: '$1 == 202 { print $2 }')
    echo "${n:-0}"
}
# wait_orders STACK WANT: until its database holds WANT orders (order-service wrote every
# accepted purchase), at most 120 s, or 10 s without progress; the seconds waited in DRAIN.
wait_orders() {
    local got last=-1 since=$SECONDS start=$SECONDS
    while :; do
        got=$(orders_in_db "$1")
        ((got >= $2)) && break
        ((got != last)) && { last=$got; since=$SECONDS; }
        ((SECONDS - since > 10 || SECONDS - start > 120)) && {
            say "$1: orders stopped at $got of $2: going on without the rest"
            break
        }
        sleep 0.2
    done
    DRAIN=$((SECONDS - start))
}

percentiles() { # numbers on stdin: "count p50 p99" (nearest rank) on stdout
    sort -n | awk 'function rank(q, i) { i = int(q * NR); if (i < q * NR) i++; return a[i < 1 ? 1 : i] }
        { a[NR] = $1 }
        END { if (NR == 0) print 0, 0, 0; else print NR, rank(0.5), rank(0.99) }'
}

# analyse_sale RECORDS STOCK: the sale as contended.lua's records (RECORDS.<thread>, lines
# "<sent µs> <answered µs> <status>") tell it, on one line of key=value:
#   purchases, first_us (first sent), last_us (last answered), all_p50_us, all_p99_us: every
#     purchase of the run;
#   sold_out_us: when the STOCK-th 202 was answered (the last one, unless the product was
#     oversold), -1 if there were fewer; sellout_us: from first_us to then;
#   sale_answers, sale_p50_us, sale_p99_us: every answer received by then, any status;
#   last_sold_sent_us: when the STOCK-th accepted purchase, in the order they were sent, was
#     sent (-1 if fewer): before that instant fewer than STOCK units can have been sold;
#   false_410: 410s answered before that instant (all of them if the stock never ran out);
#   early_410: 410s answered before sold_out_us (the false ones, and those whose answer
#     overtook the last 202's);
#   accepted, gone (410), other: answers by status.
analyse_sale() {
    local all="$1-all" stock=$2 last_sent last_sold sale
    cat "$1".* >"$all" 2>/dev/null || : >"$all"
    last_sent=$(awk '$3 == 202 { print $1 }' "$all" | sort -n | sed -n "${stock}p")
    last_sold=$(awk '$3 == 202 { print $2 }' "$all" | sort -n | sed -n "${stock}p")
    local all_p50 all_p99
    read -r _ all_p50 all_p99 < <(awk '{ print $2 - $1 }' "$all" | percentiles)
    sale=$(awk -v r="${last_sold:-1e300}" '$2 <= r { print $2 - $1 }' "$all" | percentiles)
    awk -v s="${last_sent:--1}" -v r="${last_sold:--1}" -v sale="$sale" \
        -v p50="$all_p50" -v p99="$all_p99" '
        NR == 1 || $1 < first { first = $1 }
        $2 > last { last = $2 }
        $3 == 202 { accepted++ }
        $3 == 410 { gone++; if (s < 0 || $2 < s) false410++; if (r < 0 || $2 < r) early++ }
        $3 != 202 && $3 != 410 { other++ }
        END {
            split(sale, q, " ")
            printf "SALE purchases=%d first_us=%.0f last_us=%.0f all_p50_us=%d all_p99_us=%d", NR, first, last, p50, p99
            printf " sold_out_us=%.0f sellout_us=%.0f sale_answers=%d sale_p50_us=%d sale_p99_us=%d", r, (r < 0 ? -1 : r - first), q[1], q[2], q[3]
            printf " last_sold_sent_us=%.0f false_410=%d early_410=%d accepted=%d gone=%d other=%d\n", s, false410, early, accepted, gone, other
        }' "$all"
    ((keep)) || rm -f "$all"
}

# record_sale ROUND SCENARIO OUT STATUSES: after a contended run (and the order drain): the
# checks of the sale, one row of SALES, and FAIL on the spot when one does not hold.
record_sale() {
    local round=$1 scenario=$2 stack sale bench json problems=() notes=()
    stack=$(stack_of "$scenario")
    sale=$(<"$3.sale")
    bench=$(grep '^BENCH ' "$3")
    declare -A v
    local kv
    for kv in $sale $bench; do
        [[ $kv == *=* ]] && v[${kv%%=*}]=${kv#*=}
    done
    # What seckill-api says of the product's units, and what Postgres holds.
    json=$(curl -sS --max-time 10 -H "Authorization: Bearer $ADMIN_TOKEN" \
        "http://127.0.0.1:${GW_PORT[$stack]}/admin/products/$LOAD_PRODUCT/stock" 2>/dev/null) || json=
    for kv in redis_remaining sold_out_flag drift in_flight; do
        if [[ $json =~ \"$kv\":([a-z0-9-]+) ]]; then v[$kv]=${BASH_REMATCH[1]}; else v[$kv]='?'; fi
    done
    read -r 'v[orders]' 'v[buyers]' < <(psql_admin -d "seckill_${NS[$stack]}" -Atc \
        "select count(*), count(distinct user_id) from orders where product_id = $LOAD_PRODUCT" \
        2>/dev/null | tr '|' ' ' || echo '? ?')
    local gw202
    gw202=$(tr ',' '\n' <<<"$4" | awk -F: '$1 == 202 { print $2 }')
    ((v[false_410] == 0)) || problems+=("${v[false_410]} false sold-out(s)")
    ((v[accepted] == LOAD_STOCK)) || problems+=("${v[accepted]} accepted of $LOAD_STOCK units")
    [ "${v[orders]}" = "$LOAD_STOCK" ] || problems+=("${v[orders]} orders of $LOAD_STOCK units")
    [ "${v[buyers]}" = "${v[orders]}" ] || problems+=("${v[buyers]} distinct buyers in ${v[orders]} orders")
    [ "${v[redis_remaining]}" = 0 ] || problems+=("stock endpoint: ${v[redis_remaining]} units left")
    [ "${v[drift]}" = 0 ] || problems+=("stock endpoint: drift ${v[drift]}")
    [ "${gw202:-0}" = "${v[accepted]}" ] ||
        problems+=("the gateway counted ${gw202:-0} 202s, the script ${v[accepted]}")
    ((v[purchases] == v[taken] && v[finished] == v[threads])) ||
        problems+=("$((v[taken] - v[purchases])) purchase(s) never answered")
    ((v[unmatched] == 0)) || problems+=("${v[unmatched]} answer(s) without their X-Request-Id")
    [ "${v[sold_out_flag]}" = true ] || notes+=("sold-out flag not up at the end")
    ((v[other] == 0)) || notes+=("${v[other]} answer(s) neither 202 nor 410")
    local verdict=ok
    if ((${#problems[@]} > 0)); then
        verdict="FAIL: $(IFS=';'; echo "${problems[*]}")"
    fi
    local note=-
    ((${#notes[@]} > 0)) && note=$(IFS=';'; echo "${notes[*]}")
    awk -v OFS='\t' -v round="$round" -v scenario="$scenario" -v product="$LOAD_PRODUCT" \
        -v stock="$LOAD_STOCK" -v buyers="${v[taken]}" -v sellout="${v[sellout_us]}" \
        -v answers="${v[sale_answers]}" -v p50="${v[sale_p50_us]}" -v p99="${v[sale_p99_us]}" \
        -v false410="${v[false_410]}" -v early="${v[early_410]}" -v acc="${v[accepted]}" \
        -v gone="${v[gone]}" -v other="${v[other]}" -v orders="${v[orders]}" -v distinct="${v[buyers]}" \
        -v left="${v[redis_remaining]}" -v flag="${v[sold_out_flag]}" -v verdict="$verdict" -v note="$note" \
        -v sold="${v[sold_out_us]}" -v last_sent="${v[last_sold_sent_us]}" \
        'BEGIN {
            s = sellout < 0 ? "-" : sprintf("%.3f", sellout / 1e6)
            rate = sellout > 0 ? sprintf("%.0f", stock * 1e6 / sellout) : "-"
            window = sold < 0 || last_sent < 0 ? "-" : sprintf("%.0f", (sold - last_sent) / 1000)
            print round, scenario, product, stock, buyers, s, rate, sprintf("%.3f", p50 / 1000),
                sprintf("%.3f", p99 / 1000), answers, false410, early, acc, gone, other, orders,
                distinct, left, flag, verdict, note, window
        }' >>"$SALES"
    tail -n 1 "$SALES" | awk -F'\t' '{ printf "    %-6s %-13s sold out in %s s (%s accepted/s), p50 %s ms  p99 %s ms until then; false 410: %s; %s\n", $1, $2, $6, $7, $8, $9, $11, $20 }' >&2
    if [ "$verdict" != ok ]; then
        echo "FAIL: round $round $scenario: ${verdict#FAIL: }" >&2
    fi
    [ "$note" = - ] || say "round $round $scenario: $note"
}

RESULTS="$WORK/results.tsv"
SALES="$WORK/sales.tsv"
printf 'round\tscenario\tproduct\tstock\tbuyers\tsellout_s\taccepted_per_s\tp50_ms\tp99_ms\tanswers\tfalse_410\tearly_410\taccepted\tgone\tother\torders\tdistinct_buyers\tleft\tflag\tverdict\tnote\twindow_ms\n' >"$SALES"
printf 'round\tscenario\trps\tp50_ms\tp99_ms\trequests\tstatuses\terrors\treused\tgateway_us\tapi_us\torders_us\tredis_us\tbeam_us\tpg_us\twrk_us\tother_pct\tdrain_s\n' >"$RESULTS"

# The minimal deduct script of the evalsha scenario: KEYS[1] stock (a counter), KEYS[2] the
# buyers (a set); ARGV[1] the buyer. 1 bought, 0 sold out, -1 already bought.
DEDUCT_LUA='local stock = tonumber(redis.call("GET", KEYS[1]) or "0")
if stock <= 0 then return 0 end
if redis.call("SADD", KEYS[2], ARGV[1]) == 0 then return -1 end
redis.call("DECR", KEYS[1])
return 1'
R=(redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT")
EVAL_STOCK="${NS_PREFIX}main:bench:stock"
EVAL_BUYERS="${NS_PREFIX}main:bench:buyers"
DEDUCT_SHA=$("${R[@]}" SCRIPT LOAD "$DEDUCT_LUA")
[[ $DEDUCT_SHA =~ ^[0-9a-f]{40}$ ]] || die "SCRIPT LOAD answered $DEDUCT_SHA"

# Expected rate of each scenario (req/s), from the warm-up and every run since: it sizes
# the next run's token file and redis-benchmark's request count.
declare -A RATE

stack_of() { [[ $1 == base-* ]] && echo base || echo main; }
kind_of() { echo "${1#base-}"; }

# prepare_load SCENARIO SECONDS NAME: what a run of SCENARIO needs, made before its
# measurement starts: the token file of its buyers (LOAD_TOKENS) and the product
# (LOAD_PRODUCT; contended: with LOAD_STOCK units), or redis-benchmark's request count
# (LOAD_COUNT) and a fresh buyers set.
prepare_load() {
    local scenario=$1 secs=$2 stack kind
    stack=$(stack_of "$scenario")
    kind=$(kind_of "$scenario")
    LOAD_TOKENS='' LOAD_PRODUCT='' LOAD_COUNT='' LOAD_STOCK=''
    case $kind in
    accepted | soldout | healthz)
        # Twice the fastest rate seen so far, plus a margin: buyers must not repeat.
        LOAD_COUNT=$(awk -v r="${RATE[$scenario]:-20000}" -v s="$secs" 'BEGIN { printf "%d", r * s * 2 + 20000 }')
        LOAD_TOKENS="$WORK/tokens/$3.txt"
        mint "$LOAD_COUNT" "$LOAD_TOKENS"
        if [ "$kind" = accepted ]; then
            # Its own product, with a unit for every buyer in the file: it never sells out.
            LOAD_PRODUCT=$(create_product "$stack" "$LOAD_COUNT")
        elif [ "$kind" = healthz ]; then
            LOAD_PRODUCT=healthz
        else
            LOAD_PRODUCT=${SOLDOUT[$stack]}
        fi
        ;;
    contended)
        # A whole sale: a new product, more buyers than units; the warm-up's is a tenth.
        LOAD_COUNT=$sale_buyers LOAD_STOCK=$sale_stock
        if [[ $3 == warmup-* ]]; then
            LOAD_COUNT=$(((sale_buyers + 9) / 10)) LOAD_STOCK=$(((sale_stock + 9) / 10))
        fi
        LOAD_TOKENS="$WORK/tokens/$3.txt"
        mint "$LOAD_COUNT" "$LOAD_TOKENS"
        LOAD_PRODUCT=$(create_product "$stack" "$LOAD_STOCK")
        ;;
    evalsha)
        LOAD_COUNT=$(awk -v r="${RATE[$scenario]:-50000}" -v s="$secs" 'BEGIN { printf "%d", r * s }')
        "${R[@]}" SET "$EVAL_STOCK" 1000000000000 >/dev/null
        "${R[@]}" UNLINK "$EVAL_BUYERS" >/dev/null
        ;;
    esac
}

# run_load SCENARIO SECONDS OUT: one run of the load prepared by prepare_load; wrk's report
# (or a BENCH line made from redis-benchmark's CSV) in OUT; the client's CPU seconds in
# OUT.cpu; contended: each purchase's times in OUT.rec.<thread> (loadtest/bench/contended.lua).
run_load() {
    local scenario=$1 secs=$2 out=$3 stack kind url TIMEFORMAT='%U %S'
    stack=$(stack_of "$scenario")
    kind=$(kind_of "$scenario")
    url="http://127.0.0.1:${GW_PORT[$stack]}"
    case $kind in
    healthz-static)
        { time wrk -t"$threads" -c"$connections" -d"$secs"s --latency \
            -s "$BENCH_DIR/report.lua" "$url/healthz" >"$out" 2>&1; } 2>"$out.time" ||
            { cat "$out" >&2; die "wrk failed ($scenario)"; }
        ;;
    accepted | soldout | healthz)
        { time THREADS=$threads wrk -t"$threads" -c"$connections" -d"$secs"s --latency \
            -s "$BENCH_DIR/buyers.lua" "$url" -- "$LOAD_TOKENS" "$LOAD_PRODUCT" >"$out" 2>&1; } 2>"$out.time" ||
            { cat "$out" >&2; die "wrk failed ($scenario)"; }
        ((keep)) || rm -f "$LOAD_TOKENS"
        ;;
    contended)
        # Ends once every purchase is answered; -d only bounds a run in which one never is
        # (at 1,000 purchases/s, far below any rate this path has shown).
        rm -f "$out.rec".*
        { time THREADS=$threads wrk -t"$threads" -c"$connections" -d"$((60 + LOAD_COUNT / 1000))"s \
            --latency -s "$BENCH_DIR/contended.lua" "$url" -- "$LOAD_TOKENS" "$LOAD_PRODUCT" \
            "$out.rec" >"$out" 2>&1; } 2>"$out.time" ||
            { cat "$out" >&2; die "wrk failed ($scenario)"; }
        ((keep)) || rm -f "$LOAD_TOKENS"
        ;;
    evalsha)
        { time redis-benchmark -h "$REDIS_HOST" -p "$REDIS_PORT" -c "$connections" \
            --threads "$threads" -n "$LOAD_COUNT" -r 1000000000 --csv \
            EVALSHA "$DEDUCT_SHA" 2 "$EVAL_STOCK" "$EVAL_BUYERS" "buyer:__rand_int__" \
            >"$out.csv" 2>&1; } 2>"$out.time" || { cat "$out.csv" >&2; die "redis-benchmark failed"; }
        # CSV: "test","rps","avg","min","p50","p95","p99","max" (ms); the test name may hold
        # commas, so fields are read from the right.
        awk -F, -v n="$LOAD_COUNT" '/^"EVALSHA/ {
                for (i = 1; i <= NF; i++) gsub(/"/, "", $i)
                rps = $(NF - 6); p50 = $(NF - 3); p99 = $(NF - 1); max = $NF
                printf "BENCH requests=%d duration_us=%.0f rps=%.1f p50_us=%.0f p90_us=0 p99_us=%.0f p999_us=0 max_us=%.0f connect_err=0 read_err=0 write_err=0 timeout_err=0 non2xx=0 taken=%d reused=0\n",
                    n, n / rps * 1e6, rps, p50 * 1000, p99 * 1000, max * 1000, n
            }' "$out.csv" >"$out"
        local sold
        sold=$("${R[@]}" SCARD "$EVAL_BUYERS")
        # Random buyers collide now and then (-r draws from 10^9): nearly all must buy.
        awk -v s="$sold" -v n="$LOAD_COUNT" 'BEGIN { exit !(s >= 0.99 * n) }' ||
            die "EVALSHA added $sold buyers for $LOAD_COUNT calls: not the deduct path (see $out.csv)"
        ;;
    esac
    awk '{ print $1 + $2 }' "$out.time" >"$out.cpu"
}

# measure ROUND SCENARIO: one measured run, appended to RESULTS.
measure() {
    local round=$1 scenario=$2 out="$WORK/wrk/$1-$2.txt" stack kind
    stack=$(stack_of "$scenario")
    kind=$(kind_of "$scenario")
    local pg orders0 st0 st1 m0 m1 line drain=0
    local -a t0 t1 procs
    pg=$(pg_backends "$stack")
    # shellcheck disable=SC2206 # lists of pids
    procs=("${PID_GW[$stack]}" "${PID_API[$stack]}" "${PID_ORD[$stack]}" "$REDIS_PID" "$BEAM_PIDS" "$pg")
    [[ $kind == accepted || $kind == contended ]] && orders0=$(orders_in_db "$stack")
    prepare_load "$scenario" "$duration" "$1-$2"
    st0=$(post_statuses "$stack")
    m0=$(machine_ticks)
    for i in "${!procs[@]}"; do
        # shellcheck disable=SC2086 # a list of pids
        t0[i]=$(ticks ${procs[i]})
    done
    run_load "$scenario" "$duration" "$out"
    line=$(grep '^BENCH ' "$out") || { cat "$out" >&2; die "no BENCH line ($scenario)"; }
    st1=$(post_statuses "$stack")
    if [[ $kind == accepted || $kind == contended ]]; then
        # Until order-service has written every accepted purchase (their CPU belongs to these
        # requests); then the CPU is read.
        wait_orders "$stack" "$((orders0 + $(accepted_between "$st0" "$st1")))"
        drain=$DRAIN
    fi
    for i in "${!procs[@]}"; do
        # shellcheck disable=SC2086
        t1[i]=$(ticks ${procs[i]})
    done
    m1=$(machine_ticks)
    if [ "$kind" = contended ]; then
        # The sale's own figures; the main table's row gets the whole run as the records
        # tell it (purchases only, not the health checks of a thread waiting for its last
        # answers), with wrk's error counts.
        analyse_sale "$out.rec" "$LOAD_STOCK" >"$out.sale"
        ((keep)) || rm -f "$out.rec".*
        local sale
        sale=$(<"$out.sale")
        line=$(awk -v sale="$sale" '{
                for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                n = split(sale, f, " ")
                for (i = 2; i <= n; i++) { split(f[i], kv, "="); s[kv[1]] = kv[2] }
                d = s["last_us"] - s["first_us"]
                printf "BENCH requests=%d duration_us=%d rps=%.1f p50_us=%d p90_us=0 p99_us=%d p999_us=0 max_us=0 connect_err=%d read_err=%d write_err=%d timeout_err=%d non2xx=0 taken=%d reused=0\n",
                    s["purchases"], d, (d > 0 ? s["purchases"] * 1e6 / d : 0), s["all_p50_us"], s["all_p99_us"],
                    v["connect_err"], v["read_err"], v["write_err"], v["timeout_err"], v["taken"]
            }' <<<"$line")
    fi
    local statuses
    if [ "$kind" = evalsha ]; then
        statuses=-
    else
        statuses=$(status_delta "$st0" "$st1")
        [ -n "$statuses" ] || statuses=-
    fi
    awk -v round="$round" -v scenario="$scenario" -v hz="$HZ" -v wrk_s="$(<"$out.cpu")" \
        -v statuses="$statuses" -v drain="$drain" -v m0="$m0" -v m1="$m1" \
        -v d="$((t1[0] - t0[0])) $((t1[1] - t0[1])) $((t1[2] - t0[2])) $((t1[3] - t0[3])) $((t1[4] - t0[4])) $((t1[5] - t0[5]))" '
        {
            for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
            n = v["requests"]; split(d, t, " "); split(m0, a, " "); split(m1, b, " ")
            sum = 0; for (i = 1; i <= 6; i++) sum += t[i]
            busy = b[1] - a[1]; total = b[2] - a[2]
            other = total > 0 ? 100 * (busy - sum - wrk_s * hz) / total : 0
            if (other < 0) other = 0
            errors = v["connect_err"] + v["read_err"] + v["write_err"] + v["timeout_err"]
            printf "%s\t%s\t%.0f\t%.3f\t%.3f\t%d\t%s\t%d\t%d", round, scenario, v["rps"],
                v["p50_us"] / 1000, v["p99_us"] / 1000, n, statuses, errors, v["reused"]
            for (i = 1; i <= 6; i++) printf "\t%.1f", (n > 0 ? t[i] * 1e6 / hz / n : 0)
            printf "\t%.1f\t%.0f\t%d\n", (n > 0 ? wrk_s * 1e6 / n : 0), other, drain
        }' <<<"$line" >>"$RESULTS"
    local rps
    rps=$(tail -n 1 "$RESULTS" | cut -f3)
    # The fastest rate seen sizes the next token file.
    ((rps > ${RATE[$scenario]:-0})) && RATE[$scenario]=$rps
    tail -n 1 "$RESULTS" | awk -F'\t' '{ printf "    %-6s %-13s %8s req/s  p50 %7s ms  p99 %7s ms  %s\n", $1, $2, $3, $4, $5, $7 }' >&2
    if [ "$kind" = contended ]; then
        record_sale "$round" "$scenario" "$out" "$(status_delta "$st0" "$st1")"
    fi
}

scenarios=()
IFS=, read -ra picked <<<"$only"
for scenario in accepted soldout healthz healthz-static evalsha contended; do
    [[ ",$only," == *",$scenario,"* ]] && scenarios+=("$scenario")
done
for scenario in "${picked[@]}"; do
    [[ $scenario =~ ^(accepted|soldout|healthz|healthz-static|evalsha|contended)$ ]] ||
        die "unknown scenario: $scenario"
done
((${#scenarios[@]} > 0)) || die "--scenarios names none"
if [ -n "$baseline_dir" ]; then
    for scenario in accepted soldout healthz contended; do
        [[ ",$only," == *",$scenario,"* ]] && scenarios+=("base-$scenario")
    done
fi

# warm_up SCENARIO: an unmeasured run; its rate sizes the first measured run. The warm-up
# sale of contended is left to drain before anything else runs.
warm_up() {
    local out="$WORK/wrk/warmup-$1.txt" line stack orders0 st0
    stack=$(stack_of "$1")
    orders0=$(orders_in_db "$stack")
    prepare_load "$1" "$warmup" "warmup-$1"
    st0=$(post_statuses "$stack")
    run_load "$1" "$warmup" "$out"
    line=$(grep '^BENCH ' "$out") || { cat "$out" >&2; die "no BENCH line (warm-up $1)"; }
    if [ "$(kind_of "$1")" = contended ]; then
        ((keep)) || rm -f "$out.rec".*
        wait_orders "$stack" "$((orders0 + $(accepted_between "$st0" "$(post_statuses "$stack")")))"
    fi
    [[ $line =~ rps=([0-9]+) ]] && RATE[$1]=${BASH_REMATCH[1]}
    say "warm-up $1: ${RATE[$1]:-?} req/s"
}

# ---------------------------------------------------------------------------------------
# --million: the memory a flood of distinct buyers leaves behind.

if ((million)); then
    rss_line() { # rss_line LABEL: RSS of each service
        local stack=main
        printf '| %-22s | %8s | %11s | %13s |\n' "$1" "$(rss_mb "${PID_GW[$stack]}")" \
            "$(rss_mb "${PID_API[$stack]}")" "$(rss_mb "${PID_ORD[$stack]}")"
    }
    out="$WORK/wrk/million.txt"
    tokens="$WORK/tokens/million.txt"
    say "minting $buyers tokens"
    mint "$buyers" "$tokens"
    {
        echo
        echo "RSS (MB, VmRSS) of each service around a flood of $buyers distinct buyers on a sold-out product"
        echo "(wrk -t$threads -c$connections, each buyer once; $(nproc) CPUs; binaries $bin_dir)"
        echo
        printf '| %-22s | %8s | %11s | %13s |\n' when gateway seckill-api order-service
        echo '|------------------------|---------:|------------:|--------------:|'
        rss_line "before"
    } >"$WORK/million.md"
    say "flooding: $buyers purchases of product ${SOLDOUT[main]}, each from its own buyer"
    st0=$(post_statuses main)
    started=$SECONDS
    BUYERS_DONE_FILE="$WORK/million.done" THREADS=$threads wrk -t"$threads" -c"$connections" \
        -d3600s --latency -s "$BENCH_DIR/buyers.lua" "http://127.0.0.1:${GW_PORT[main]}" \
        -- "$tokens" "${SOLDOUT[main]}" once >"$out" 2>&1 || { cat "$out" >&2; die "wrk failed"; }
    took=$((SECONDS - started))
    ((keep)) || rm -f "$tokens"
    statuses=$(status_delta "$st0" "$(post_statuses main)")
    rss_line "right after (${took} s)" >>"$WORK/million.md"
    say "flood done in ${took}s: $statuses; watching RSS for ${idle_secs}s"
    for ((s = 15; s <= idle_secs; s += 15)); do
        sleep 15
        rss_line "idle ${s} s" >>"$WORK/million.md"
    done
    cat "$WORK/million.md"
    echo
    echo "answered: $statuses; $(grep '^BENCH ' "$out" | awk '{ for (i = 2; i <= NF; i++) if ($i ~ /^(rps|p99_us|taken)=/) printf "%s ", $i }')"
    echo "redis-server $(rss_mb "$REDIS_PID") MB; the memory goal: every service <= 64 MB"
    exit 0
fi

# ---------------------------------------------------------------------------------------
# Rounds.

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
say "warm-up: ${warmup}s per scenario (not counted)"
for scenario in "${scenarios[@]}"; do
    warm_up "$scenario"
done

say "measuring: wrk -t$threads -c$connections -d${duration}s --latency, $rounds round(s)"
k=${#scenarios[@]}
for ((r = 1; r <= rounds; r++)); do
    # Rotated by one more each round, and reversed every other round.
    order=()
    for ((i = 0; i < k; i++)); do
        order+=("${scenarios[$(((i + r - 1) % k))]}")
    done
    if ((r % 2 == 0)); then
        rev=()
        for ((i = k - 1; i >= 0; i--)); do rev+=("${order[i]}"); done
        order=("${rev[@]}")
    fi
    for scenario in "${order[@]}"; do
        measure "$r" "$scenario"
    done
done

# ---------------------------------------------------------------------------------------
# Report.

column_of() { # column_of SCENARIO COLUMN: its values over the rounds
    awk -F'\t' -v s="$1" -v c="$2" 'NR > 1 && $2 == s { print $c }' "$RESULTS"
}
median_of() { # median_of SCENARIO COLUMN [PRINTF-FORMAT]
    column_of "$1" "$2" | median | awk -v f="${3:-%.1f}" '{ if ($1 == "nan") print "-"; else printf f "\n", $1 }'
}
spread_of() { column_of "$1" "$2" | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s–%s", lo, hi }'; }
ratios() { # ratios A B: A/B throughput by round, then the median
    local list
    list=$(awk -F'\t' -v a="$1" -v b="$2" '
        NR > 1 { rps[$1, $2] = $3; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
        END { for (i = 1; i <= n; i++) if (rps[order[i], a] > 0 && rps[order[i], b] > 0) printf "%.6f\n", rps[order[i], a] / rps[order[i], b] }' "$RESULTS")
    [ -n "$list" ] || { echo "n/a"; return; }
    printf '%s (median **%.2f×**)' "$(echo "$list" | awk '{ printf "%s%.2f", (NR > 1 ? " " : ""), $1 }')" "$(echo "$list" | median)"
}

echo
echo "## bench-e2e: wrk -t$threads -c$connections -d${duration}s, $rounds round(s), $(nproc) CPUs, load average before $LOAD_BEFORE"
echo
if ((tuned)); then
    echo "Configuration: tuned (logs at warn, every rate-limit quota far above the load)."
else
    echo "Configuration: the defaults scripts/up.sh runs with (logs at info, default rate limits)."
fi
echo "Binaries: $bin_dir${baseline_dir:+ (base-*: $baseline_dir)}. CPU columns: CPU time per request (µs) of each process over the"
echo "run (accepted: until order-service wrote every order, 'drain' s after the run); redis-server and RabbitMQ are shared, so"
echo "they include whatever else used them; pg = the Postgres backends of the stack's database; other = % of the machine used by"
echo "anything else (builds, other tenants)."
echo
printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' round scenario 'req/s' 'p50 ms' 'p99 ms' \
    statuses 'gateway µs' 'api µs' 'orders µs' 'redis µs' 'rabbit µs' 'pg µs' 'wrk µs' other drain
echo '|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|'
awk -F'\t' 'NR > 1 {
    s = $7; if ($8 > 0) s = s " err:" $8; if ($9 > 0) s = s " reused:" $9
    printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s%% | %s |\n",
        $1, $2, $3, $4, $5, s, $10, $11, $12, $13, $14, $15, $16, $17, $18 }' "$RESULTS"
echo
echo "Medians over the rounds (spread min–max):"
echo
echo '| scenario | req/s | p50 ms | p99 ms | gateway µs | api µs | orders µs | redis µs | rabbit µs | pg µs | wrk µs |'
echo '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|'
for scenario in "${scenarios[@]}"; do
    printf '| %s | %s (%s) | %s | %s (%s) | %s | %s | %s | %s | %s | %s | %s |\n' "$scenario" \
        "$(median_of "$scenario" 3 %.0f)" "$(spread_of "$scenario" 3)" "$(median_of "$scenario" 4 %.2f)" \
        "$(median_of "$scenario" 5 %.2f)" "$(spread_of "$scenario" 5)" \
        "$(median_of "$scenario" 10)" "$(median_of "$scenario" 11)" "$(median_of "$scenario" 12)" \
        "$(median_of "$scenario" 13)" "$(median_of "$scenario" 14)" "$(median_of "$scenario" 15)" \
        "$(median_of "$scenario" 16)"
done
echo
echo "- soldout / healthz by round: $(ratios soldout healthz)  (goal ≥ 0.8×, p99 ≤ 10 ms)"
echo "- soldout / healthz-static by round: $(ratios soldout healthz-static)  (the client's Lua counted too)"
echo "- accepted / evalsha by round: $(ratios accepted evalsha)  (goal ≥ 0.35×)"
if [ -n "$baseline_dir" ]; then
    echo "- base: soldout / healthz $(ratios base-soldout base-healthz); accepted / evalsha $(ratios base-accepted evalsha)"
    for kind in accepted soldout healthz; do
        echo "- $kind, main / base by round: $(ratios "$kind" "base-$kind")"
    done
fi
echo
if (($(wc -l <"$SALES") > 1)); then
    sale_column() { awk -F'\t' -v s="$1" -v c="$2" 'NR > 1 && $2 == s && $c != "-" { print $c }' "$SALES"; }
    sale_median() { sale_column "$1" "$2" | median | awk -v f="$3" '{ if ($1 == "nan") print "-"; else printf f "\n", $1 }'; }
    sale_spread() { sale_column "$1" "$2" | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s–%s", lo, hi }'; }
    echo "Contended sale: each round a new product of $sale_stock units, $sale_buyers distinct buyers, each once, as fast as"
    echo "wrk -t$threads -c$connections sends. Sell-out: first purchase sent to the ${sale_stock}th 202 answered (wrk's Lua clock);"
    echo "window = from the last accepted purchase sent to the last 202 answered: the last unit went in those ms before"
    echo "sell-out. accepted/s = units / sell-out; p50/p99 of every answer received until then (any status); false 410 = 410s"
    echo "answered before the last accepted purchase was sent (units certainly remained: must be 0); 410 < last 202 = 410s"
    echo "answered before the last 202 (the false ones and those that overtook it); orders (distinct buyers) once"
    echo "order-service drained; left and flag from GET /admin/products/{id}/stock at the end."
    echo
    echo '| round | scenario | sell-out s | window ms | accepted/s | p50 ms | p99 ms | answers | false 410 | 410 < last 202 | 202 | 410 | other | orders (buyers) | left | flag | verdict |'
    echo '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|'
    awk -F'\t' 'NR > 1 {
        printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s (%s) | %s | %s | %s |\n",
            $1, $2, $6, $22, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20 }' "$SALES"
    echo
    echo "Medians over the rounds (spread min–max):"
    echo
    echo '| scenario | sell-out s | window ms | accepted/s | p50 ms | p99 ms | false 410 (all rounds) |'
    echo '|---|---:|---:|---:|---:|---:|---:|'
    for scenario in "${scenarios[@]}"; do
        [ "$(kind_of "$scenario")" = contended ] || continue
        printf '| %s | %s (%s) | %s (%s) | %s (%s) | %s (%s) | %s (%s) | %s |\n' "$scenario" \
            "$(sale_median "$scenario" 6 %.3f)" "$(sale_spread "$scenario" 6)" \
            "$(sale_median "$scenario" 22 %.0f)" "$(sale_spread "$scenario" 22)" \
            "$(sale_median "$scenario" 7 %.0f)" "$(sale_spread "$scenario" 7)" \
            "$(sale_median "$scenario" 8 %.2f)" "$(sale_spread "$scenario" 8)" \
            "$(sale_median "$scenario" 9 %.2f)" "$(sale_spread "$scenario" 9)" \
            "$(sale_column "$scenario" 11 | awk '{ n += $1 } END { print n + 0 }')"
    done
    if [ -n "$baseline_dir" ]; then
        list=$(awk -F'\t' 'NR > 1 && $7 != "-" { rate[$1, $2] = $7; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
            END { for (i = 1; i <= n; i++) if (rate[order[i], "contended"] > 0 && rate[order[i], "base-contended"] > 0)
                printf "%.6f\n", rate[order[i], "contended"] / rate[order[i], "base-contended"] }' "$SALES")
        if [ -n "$list" ]; then
            printf '\n- contended accepted/s, main / base by round: %s (median **%.2f×**)\n' \
                "$(echo "$list" | awk '{ printf "%s%.2f", (NR > 1 ? " " : ""), $1 }')" "$(echo "$list" | median)"
        fi
    fi
    echo
fi
echo "RSS at the end (MB, VmRSS):"
echo
echo '| stack | gateway | seckill-api | order-service |'
echo '|---|---:|---:|---:|'
for stack in "${STACKS[@]}"; do
    printf '| %s | %s | %s | %s |\n' "$stack" "$(rss_mb "${PID_GW[$stack]}")" \
        "$(rss_mb "${PID_API[$stack]}")" "$(rss_mb "${PID_ORD[$stack]}")"
done
echo
echo "(redis-server $(rss_mb "$REDIS_PID") MB, shared.)"

# Verdict on the answers: accepted all 202, soldout all 410; a 5xx or a socket error fails.
failed=0
while IFS=$'\t' read -r round scenario _ _ _ _ statuses errors reused _; do
    [ "$round" = round ] && continue
    want=
    case $(kind_of "$scenario") in
    accepted) want='202:[0-9]+' ;;
    soldout) want='410:[0-9]+' ;;
    contended) want='202:[0-9]+,410:[0-9]+' ;;
    esac
    if [[ ",$statuses" =~ ,5[0-9][0-9]: ]] || ((errors > 0)); then
        echo "FAIL: round $round $scenario: $statuses, $errors socket error(s)"
        failed=1
    elif [ -n "$want" ] && ! [[ $statuses =~ ^$want$ ]]; then
        echo "WARNING: round $round $scenario answered $statuses (expected only ${want//:\[0-9\]+/})"
    fi
    ((reused > 0)) && echo "WARNING: round $round $scenario repeated $reused buyer(s): the token file was too small"
done <"$RESULTS"
# The sale's checks (record_sale): false sold-outs, units oversold or left unsold, orders.
while IFS=$'\t' read -r round scenario _ _ _ _ _ _ _ _ false410 _ _ _ _ _ _ _ _ verdict _; do
    [ "$round" = round ] && continue
    if [ "$verdict" != ok ]; then
        echo "FAIL: round $round $scenario: ${verdict#FAIL: }"
        failed=1
    fi
    ((false410 == 0)) || echo "FAIL: round $round $scenario: $false410 buyer(s) answered 410 sold out while units remained"
done <"$SALES"
other=$(median_of soldout 17 %.0f)
awk -v o="$other" 'BEGIN { exit !(o > 10) }' &&
    echo "NOTE: other processes used ~${other}% of the machine during the soldout runs: numbers are disturbed."
if ((failed)); then
    keep=1
    die "FAIL (above): see $WORK/wrk and the logs in $WORK"
fi
