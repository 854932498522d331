#!/usr/bin/env bash
# The gateway against nginx as a plain reverse proxy, side by side in one run: the same
# upstream, the same wrk concurrency and duration, three paths:
#
#   direct   wrk → upstream
#   gateway  wrk → gateway (JWT verified, rate limits on but set high, identity signed) → upstream
#   nginx    wrk → nginx (proxy_pass, keep-alive upstream) → upstream
#
# The upstream is a second nginx answering a fixed `{"id":1}` (loadtest/bench/upstream.conf.in).
# The paths run in turn, in a different order each round; the summary prints each run and the
# medians: gateway/nginx throughput and the p99 the gateway adds over direct, with the CPU time
# per request each process spent. wrk is closed-loop, so every loaded run saturates the
# machine and its latencies are mostly queueing (connections / throughput); a last pass with
# one connection (--probe) shows the latency each proxy adds when nothing queues.
#
#   scripts/bench-gateway.sh                      # 64 connections, 10 s runs, 3 rounds
#   scripts/bench-gateway.sh -c 256 -d 20 -r 5
#   scripts/bench-gateway.sh --profile            # then perf-profile the gateway in one more run
#   scripts/bench-gateway.sh --baseline /tmp/gateway-old   # A/B: another gateway build as a 4th path
#
# Installs nginx-light and wrk with apt-get when missing (as root or through sudo). Starts
# nothing it does not stop again; the shared Postgres/Redis/RabbitMQ are not used.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# nginx lives in /usr/sbin.
export PATH="$PATH:/usr/sbin:/sbin"

BENCH_DIR="$ROOT/loadtest/bench"

usage() {
    cat <<EOF
usage: scripts/bench-gateway.sh [options]
  -c, --connections N  wrk connections, the same for every path (default 64)
  -d, --duration SECS  length of each measured run (default 10)
  -t, --threads N      wrk threads (default 2)
  -r, --rounds N       rounds; each runs the three paths, in a different order (default 3)
  -w, --warmup SECS    unmeasured run per path before the first round (default 3)
      --probe N        after the rounds, one more run per path with N connections (default 1;
                       0: skip): the latency each proxy adds when nothing queues
      --path PATH      request path; must be one the gateway routes (default /api/products/1)
      --profile        after the rounds, one more gateway run under \`perf record\` (top symbols)
      --baseline BIN   another gateway binary (e.g. a build of an older commit), run with the
                       same settings as a fourth path in every round: an A/B of two builds
      --no-build       use the binaries already in target/release
      --keep           keep the work directory (configs, logs, raw wrk output)
  -h, --help           this text
EOF
}

connections=64
duration=10
threads=2
rounds=3
warmup=3
path=/api/products/1
probe=1
profile=0
baseline=
build=1
keep=0
while (($# > 0)); do
    case $1 in
    -c | --connections) connections=${2:?}; shift ;;
    -d | --duration) duration=${2:?}; shift ;;
    -t | --threads) threads=${2:?}; shift ;;
    -r | --rounds) rounds=${2:?}; shift ;;
    -w | --warmup) warmup=${2:?}; shift ;;
    --path) path=${2:?}; shift ;;
    --probe) probe=${2:?}; shift ;;
    --profile) profile=1 ;;
    --baseline) baseline=${2:?}; shift ;;
    --no-build) build=0 ;;
    --keep) keep=1 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 64 ;;
    esac
    shift
done
for n in "$connections" "$duration" "$threads" "$rounds"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "counts and durations must be positive integers"
done
[[ $warmup =~ ^[0-9]+$ ]] || die "--warmup must be a whole number of seconds"
[[ $probe =~ ^[0-9]+$ ]] || die "--probe must be a whole number of connections"
((connections >= threads)) || die "wrk needs at least one connection per thread"
[ -z "$baseline" ] || [ -x "$baseline" ] || die "--baseline $baseline is not an executable"
[[ $path == /* ]] || die "--path must start with /"

install_missing() {
    local pkgs=()
    command -v curl >/dev/null 2>&1 || pkgs+=(curl)
    command -v nginx >/dev/null 2>&1 || pkgs+=(nginx-light)
    command -v wrk >/dev/null 2>&1 || pkgs+=(wrk)
    ((${#pkgs[@]} == 0)) && return 0
    # Debian 13 made nginx-light a transitional name; fall back to plain nginx.
    if ! (apt_install "${pkgs[@]}"); then
        pkgs=("${pkgs[@]/nginx-light/nginx}")
        apt_install "${pkgs[@]}"
    fi
    command -v nginx >/dev/null 2>&1 && command -v wrk >/dev/null 2>&1 ||
        die "nginx or wrk still missing after apt-get install"
}

install_missing
if ((build)); then
    require_cargo
    say "building release binaries (gateway, seckill-token)"
    (cd "$ROOT" && cargo build --release -q -p gateway -p seckill-loadtest)
fi
for bin in gateway seckill-token; do
    [ -x "$BIN_DIR/$bin" ] || die "$BIN_DIR/$bin is missing (run without --no-build)"
done
if ((profile)) && ! command -v perf >/dev/null 2>&1; then
    die "--profile needs perf (Debian: linux-perf)"
fi

# ---------------------------------------------------------------------------------------
# Work directory, ports, clean-up.

WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-gateway.XXXXXX")
# nginx workers may run as another user (nobody) and must reach their temp paths.
chmod 755 "$WORK"
mkdir -p "$WORK/upstream-tmp" "$WORK/proxy-tmp" "$WORK/wrk"

pids=()
cleanup() {
    local status=$?
    local pid
    for pid in "${pids[@]+"${pids[@]}"}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]+"${pids[@]}"}"; do
        # Up to 5 s for a graceful exit, then the hard way.
        for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
        alive "$pid" && kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null || true
    done
    if ((keep || status != 0)); then
        say "work directory kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

next_port UPSTREAM_PORT
next_port GATEWAY_PORT_BENCH
next_port NGINX_PORT
next_port BASELINE_PORT
# The gateways' operator listeners (/readyz, /metrics), one each: the default is shared.
next_port GATEWAY_ADMIN_PORT
next_port BASELINE_ADMIN_PORT

render() { # render TEMPLATE OUT
    sed -e "s|@WORK@|$WORK|g" -e "s|@UPSTREAM_PORT@|$UPSTREAM_PORT|g" \
        -e "s|@PROXY_PORT@|$NGINX_PORT|g" "$1" >"$2"
}

# start_nginx NAME: validates and starts nginx with $WORK/NAME.conf (daemon off, in the
# background); the master's pid goes to `pids` and to NAME_PID.
start_nginx() {
    local name=$1
    render "$BENCH_DIR/$name.conf.in" "$WORK/$name.conf"
    nginx -q -t -e "$WORK/$name-error.log" -p "$WORK" -c "$WORK/$name.conf" ||
        die "nginx refused $WORK/$name.conf"
    nginx -e "$WORK/$name-error.log" -p "$WORK" -c "$WORK/$name.conf" </dev/null \
        >>"$WORK/$name-error.log" 2>&1 &
    pids+=($!)
    printf -v "${name^^}_PID" '%s' "$!"
}

# ---------------------------------------------------------------------------------------
# The three paths.

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
say "work directory $WORK (load average $LOAD_BEFORE)"
start_nginx upstream
wait_for_url "http://127.0.0.1:$UPSTREAM_PORT/healthz" 15 || die "upstream nginx did not start"
say "upstream: nginx on 127.0.0.1:$UPSTREAM_PORT (pid $UPSTREAM_PID)"

start_nginx proxy
wait_for_url "http://127.0.0.1:$NGINX_PORT/healthz" 15 || die "proxy nginx did not start"
say "nginx proxy: 127.0.0.1:$NGINX_PORT (pid $PROXY_PID)"

# Secrets: the caller's, else fresh random ones (the gateway refuses the public defaults);
# seckill-token below signs with the same exported SECKILL_JWT_SECRET.
per_run_secrets
# The gateway: lib.sh's bench_gateway_settings (JWT on HS256 with the run's secret, in-memory
# rate limits far above what wrk can send, so every request pays for the check but none is
# refused); everything else at its defaults. SECKILL_CONFIG and RUST_LOG of the caller would
# change what is measured, so they are dropped.
# start_gateway NAME BINARY PORT ADMIN_PORT: starts a gateway, waits until it is ready; its
# pid goes to `pids` and to NAME_PID. Readiness is asked on the operator port, or on the
# public one for a baseline built before the operator listener existed.
start_gateway() {
    local name=$1 bin=$2 port=$3 admin=$4 pid gateway_settings
    mapfile -t gateway_settings < <(bench_gateway_settings "$connections")
    env -u SECKILL_CONFIG -u RUST_LOG \
        SECKILL_HOST=127.0.0.1 \
        SECKILL_GATEWAY_PORT="$port" \
        SECKILL_GATEWAY_ADMIN_PORT="$admin" \
        SECKILL_GATEWAY_SECKILL_API_URLS="http://127.0.0.1:$UPSTREAM_PORT" \
        SECKILL_GATEWAY_ORDER_SERVICE_URLS="http://127.0.0.1:$UPSTREAM_PORT" \
        "${gateway_settings[@]}" \
        SECKILL_LOG_FORMAT=json \
        "$bin" </dev/null >"$WORK/$name.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    printf -v "${name^^}_PID" '%s' "$pid"
    gateway_ready() {
        alive "$pid" || { tail -n 20 "$WORK/$name.log" >&2; die "$name exited"; }
        http_ok "http://127.0.0.1:$admin/readyz" || http_ok "http://127.0.0.1:$port/readyz"
    }
    wait_until 30 "$name" gateway_ready || { tail -n 20 "$WORK/$name.log" >&2; exit 1; }
    say "$name: 127.0.0.1:$port (pid $pid, $bin)"
}
start_gateway gateway "$BIN_DIR/gateway" "$GATEWAY_PORT_BENCH" "$GATEWAY_ADMIN_PORT"
paths=(direct gateway nginx)
if [ -n "$baseline" ]; then
    start_gateway baseline "$baseline" "$BASELINE_PORT" "$BASELINE_ADMIN_PORT"
    paths+=(baseline)
fi

TOKEN=$("$BIN_DIR/seckill-token" --sub 42 --ttl-secs 86400)
AUTH="Authorization: Bearer $TOKEN"

url_of() {
    case $1 in
    direct) echo "http://127.0.0.1:$UPSTREAM_PORT$path" ;;
    gateway) echo "http://127.0.0.1:$GATEWAY_PORT_BENCH$path" ;;
    nginx) echo "http://127.0.0.1:$NGINX_PORT$path" ;;
    baseline) echo "http://127.0.0.1:$BASELINE_PORT$path" ;;
    esac
}

# Sanity: each path answers the upstream's body, the gateway refuses a missing token and
# shows its rate-limit headers (the limiter is in the path).
for target in "${paths[@]}"; do
    body=$(curl -fsS --max-time 3 -H "$AUTH" "$(url_of "$target")") ||
        die "$target: $(url_of "$target") did not answer 2xx"
    [ "$body" = '{"id":1}' ] || die "$target answered $body, not the upstream's body"
done
status=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 3 "$(url_of gateway)")
[ "$status" = 401 ] || die "the gateway answered $status without a token: is JWT auth on?"
curl -fsS -D - -o /dev/null --max-time 3 -H "$AUTH" "$(url_of gateway)" |
    grep -qi "^x-ratelimit-limit: $BENCH_QUOTA" || die "the gateway's answer has no x-ratelimit-limit: $BENCH_QUOTA"
say "checked: same body on all paths; gateway 401 without a token, rate-limit headers with one"

# ---------------------------------------------------------------------------------------
# Measuring.

# CPU time (clock ticks) of processes and of their children (nginx workers).
# cpu_ticks PID...: their CPU time and their children's, in clock ticks.
cpu_ticks() {
    # shellcheck disable=SC2046 # one pid per word
    proc_ticks "$@" $(ps -o pid= --ppid "$(
        IFS=,
        echo "$*"
    )" 2>/dev/null)
}
HZ=$(getconf CLK_TCK)

# run_wrk TARGET SECONDS OUT [CONNECTIONS THREADS]: one wrk run; raw output in OUT, wrk's
# own CPU seconds (user + system) in OUT.cpu.
run_wrk() {
    local c=${4:-$connections} t=${5:-$threads} TIMEFORMAT='%U %S'
    if ! { time wrk -t"$t" -c"$c" -d"$2"s --latency -s "$BENCH_DIR/report.lua" \
        -H "$AUTH" "$(url_of "$1")" >"$3" 2>&1; } 2>"$3.time"; then
        cat "$3" >&2
        die "wrk failed against $1"
    fi
    awk '{ print $1 + $2 }' "$3.time" >"$3.cpu"
}

RESULTS="$WORK/results.tsv"
printf 'round\ttarget\trps\tp50_ms\tp99_ms\tnon2xx\terrors\tproxy_cpu_us\tupstream_cpu_us\twrk_cpu_us\tother_pct\n' >"$RESULTS"

# measure ROUND TARGET [CONNECTIONS THREADS]: one measured run, with the CPU each process
# used per request, appended to RESULTS. other_pct: the share of the machine's CPU that
# neither wrk nor the upstream nor the proxy used (the kernel's own work, other tenants).
measure() {
    local round=$1 target=$2 out="$WORK/wrk/$1-$2.txt"
    local proxy_pids=() up0 up1 px0 px1 m0 m1 line
    case $target in
    gateway) proxy_pids=("$GATEWAY_PID") ;;
    nginx) proxy_pids=("$PROXY_PID") ;;
    baseline) proxy_pids=("$BASELINE_PID") ;;
    esac
    up0=$(cpu_ticks "$UPSTREAM_PID")
    px0=0
    ((${#proxy_pids[@]})) && px0=$(cpu_ticks "${proxy_pids[@]}")
    m0=$(machine_ticks)
    run_wrk "$target" "$duration" "$out" "${3:-}" "${4:-}"
    m1=$(machine_ticks)
    up1=$(cpu_ticks "$UPSTREAM_PID")
    px1=0
    ((${#proxy_pids[@]})) && px1=$(cpu_ticks "${proxy_pids[@]}")
    line=$(grep '^BENCH ' "$out") || { cat "$out" >&2; die "no BENCH line from wrk ($target)"; }
    awk -v round="$round" -v target="$target" -v hz="$HZ" -v wrk_s="$(<"$out.cpu")" \
        -v up=$((up1 - up0)) -v px=$((px1 - px0)) -v m0="$m0" -v m1="$m1" '
        {
            for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
            n = v["requests"]; split(m0, a, " "); split(m1, b, " ")
            busy = b[1] - a[1]; total = b[2] - a[2]
            other = total > 0 ? 100 * (busy - up - px - wrk_s * hz) / total : 0
            if (other < 0) other = 0
            errors = v["connect_err"] + v["read_err"] + v["write_err"] + v["timeout_err"]
            printf "%s\t%s\t%.0f\t%.3f\t%.3f\t%d\t%d\t%s\t%.1f\t%.1f\t%.0f\n", round, target, v["rps"],
                v["p50_us"] / 1000, v["p99_us"] / 1000, v["non2xx"], errors,
                target == "direct" ? "-" : sprintf("%.1f", px * 1e6 / hz / n),
                up * 1e6 / hz / n, wrk_s * 1e6 / n, other
        }' <<<"$line" >>"$RESULTS"
    tail -n 1 "$RESULTS" | awk -F'\t' '{ printf "    %-6s %-8s %8s req/s  p50 %7s ms  p99 %7s ms\n", $1, $2, $3, $4, $5 }' >&2
}

if ((warmup > 0)); then
    say "warm-up: ${warmup}s per path (not counted)"
    for target in "${paths[@]}"; do
        run_wrk "$target" "$warmup" "$WORK/wrk/warmup-$target.txt"
    done
fi

orders=("direct gateway nginx" "nginx gateway direct" "gateway direct nginx"
    "direct nginx gateway" "nginx direct gateway" "gateway nginx direct")
say "measuring: wrk -t$threads -c$connections -d${duration}s --latency, $rounds round(s)"
for ((r = 1; r <= rounds; r++)); do
    # shellcheck disable=SC2206 # the order is a list of words
    order=(${orders[$(((r - 1) % ${#orders[@]}))]})
    # The baseline build takes a different place in each round too.
    [ -n "$baseline" ] && order=("${order[@]:0:$(((r - 1) % 4))}" baseline "${order[@]:$(((r - 1) % 4))}")
    for target in "${order[@]}"; do
        measure "$r" "$target"
    done
done
if ((probe > 0)); then
    say "unloaded latency: wrk -t1 -c$probe -d${duration}s per path"
    for target in "${paths[@]}"; do
        measure "c$probe" "$target" "$probe" 1
    done
fi

# ---------------------------------------------------------------------------------------
# Report.

median_of() { # median_of TARGET COLUMN [ROUND-PATTERN]: median over the loaded rounds
    awk -F'\t' -v t="$1" -v c="$2" -v r="${3:-^[0-9]+$}" 'NR > 1 && $2 == t && $1 ~ r { print $c }' "$RESULTS" |
        median
}
row() { printf '| %-6s | %-8s | %8s | %7s | %7s | %7s | %10s | %13s | %8s | %6s |\n' "$@"; }

echo
echo "Gateway vs nginx: wrk -t$threads -c$connections -d${duration}s, GET $path, $rounds round(s), $(nproc) CPU(s), load average before: $LOAD_BEFORE"
echo "CPU columns: CPU time per request (µs) of the proxy (gateway or nginx master+workers), the upstream and wrk;"
echo "other: share of the machine's CPU used by anything else during the run (kernel threads, other tenants)."
echo
row round path 'req/s' 'p50 ms' 'p99 ms' non-2xx 'proxy µs' 'upstream µs' 'wrk µs' other
echo '|--------|----------|---------:|--------:|--------:|--------:|-----------:|--------------:|---------:|-------:|'
awk -F'\t' 'NR > 1 { printf "| %-6s | %-8s | %8s | %7s | %7s | %7s | %10s | %13s | %8s | %5s%% |\n", $1, $2, $3, $4, $5, $6 + $7, $8, $9, $10, $11 }' "$RESULTS"
for target in "${paths[@]}"; do
    row median "$target" "$(median_of "$target" 3)" "$(median_of "$target" 4)" "$(median_of "$target" 5)" "" \
        "$(median_of "$target" 8)" "$(median_of "$target" 9)" "$(median_of "$target" 10)" "$(median_of "$target" 11)%"
done
echo
awk -v d="$(median_of direct 3)" -v g="$(median_of gateway 3)" -v n="$(median_of nginx 3)" \
    -v dp="$(median_of direct 5)" -v gp="$(median_of gateway 5)" -v np="$(median_of nginx 5)" \
    -v gc="$(median_of gateway 8)" -v nc="$(median_of nginx 8)" -v c="$connections" '
    BEGIN {
        printf "gateway / nginx throughput    %.2fx   (goal >= 1.00x)\n", g / n
        printf "gateway / direct throughput   %.2fx\n", g / d
        printf "nginx / direct throughput     %.2fx\n", n / d
        printf "gateway added p99             %+.2f ms (%.2f - %.2f; goal <= +1 ms)\n", gp - dp, gp, dp
        printf "nginx added p99               %+.2f ms (%.2f - %.2f)\n", np - dp, np, dp
        printf "proxy CPU per request         gateway %.1f us, nginx %.1f us (%.2fx)\n", gc, nc, gc / nc
        verdict = (g / n >= 1.0 ? "met" : "not met") " / " (gp - dp <= 1.0 ? "met" : "not met")
        printf "goals at -c%s (throughput / p99)  %s\n", c, verdict
    }'
# The same ratio round by round: the paths of one round ran minutes apart at most, so on a
# machine whose speed drifts (shared hosts do) the spread of these says how far to trust it.
# shellcheck disable=SC2016 # awk's own $ fields
per_round() { # per_round A B: A's / B's throughput in each loaded round, then their median
    local ratios
    ratios=$(awk -F'\t' -v a="$1" -v b="$2" '
        NR > 1 && $1 ~ /^[0-9]+$/ { rps[$1, $2] = $3; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
        END { for (i = 1; i <= n; i++) if (rps[order[i], b] > 0) printf "%.2f\n", rps[order[i], a] / rps[order[i], b] }' "$RESULTS")
    [ -n "$ratios" ] || return 0
    printf '%s (median %.2fx)' "$(echo "$ratios" | paste -sd' ')" "$(echo "$ratios" | median)"
}
echo "gateway / nginx by round       $(per_round gateway nginx)"
if [ -n "$baseline" ]; then
    echo "gateway / baseline by round    $(per_round gateway baseline)"
    awk -v g="$(median_of gateway 3)" -v b="$(median_of baseline 3)" \
        -v gc="$(median_of gateway 8)" -v bc="$(median_of baseline 8)" 'BEGIN {
        printf "gateway / baseline throughput %.2fx; CPU per request %.1f vs %.1f us (%.2fx)\n", g / b, gc, bc, gc / bc
    }'
fi
if ((probe > 0)); then
    awk -F'\t' -v r="c$probe" '
        $1 == r { p99[$2] = $5; p50[$2] = $4; rps[$2] = $3 }
        END {
            printf "unloaded (-c%s): p50 direct %.3f / gateway %.3f / nginx %.3f ms; added p99 gateway %+.3f ms, nginx %+.3f ms\n",
                substr(r, 2), p50["direct"], p50["gateway"], p50["nginx"],
                p99["gateway"] - p99["direct"], p99["nginx"] - p99["direct"]
        }' "$RESULTS"
fi
bad=$(awk -F'\t' 'NR > 1 && ($6 + $7) > 0 { n++ } END { print n + 0 }' "$RESULTS")
if ((bad > 0)); then
    echo "WARNING: $bad run(s) had non-2xx answers or socket errors: see $WORK/wrk"
    keep=1
fi
busy_other=$(median_of gateway 11)
awk -v o="$busy_other" 'BEGIN { exit !(o > 10) }' &&
    echo "NOTE: other processes used ~${busy_other}% of the CPU during the gateway runs: numbers are disturbed."

if ((profile)); then
    echo
    say "profiling: one more ${duration}s gateway run under perf record (cpu-clock, 999 Hz)"
    perf record -q -e cpu-clock -F 999 -g -p "$GATEWAY_PID" -o "$WORK/perf.data" -- sleep "$duration" \
        >"$WORK/perf.log" 2>&1 &
    perf_pid=$!
    run_wrk gateway "$duration" "$WORK/wrk/profile-gateway.txt"
    wait "$perf_pid" || true
    echo "gateway CPU by binary:"
    perf report -i "$WORK/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null |
        grep -v '^#' | grep -v '^$' | awk '{ $1 = $1; print "  " $0 }' | head -n 6 || true
    echo "top symbols (self time):"
    perf report -i "$WORK/perf.data" --no-children --sort symbol --stdio -g none --percent-limit 0.7 \
        2>/dev/null | grep -v '^#' | grep -v '^$' | awk '{ $1 = $1; print "  " $0 }' | cut -c1-160 | head -n 40 || true
    keep=1
    echo "(perf data kept: perf report -i $WORK/perf.data)"
fi
