# shellcheck shell=bash
# shellcheck disable=SC2034 # the variables are used by the scripts that source this file
# Helpers sourced by the other scripts: paths, ports, per-run secrets, waiting.
# Not meant to be run on its own.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SCRIPTS="$ROOT/scripts"
RUN_DIR="$ROOT/run"
LOG_DIR="$RUN_DIR/logs"
PID_DIR="$RUN_DIR/pids"
BIN_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/release"

# rustup puts cargo here; a non-login shell (CI, cron) may not have it on PATH yet.
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    PATH="$HOME/.cargo/bin:$PATH"
fi

# Start order; down.sh walks it backwards (the gateway stops taking traffic first).
SERVICES=(seckill-api order-service gateway)

# The same variables the services read, so a caller's override reaches both.
GATEWAY_PORT="${SECKILL_GATEWAY_PORT:-8080}"
API_PORT="${SECKILL_API_PORT:-8081}"
ORDER_PORT="${SECKILL_ORDER_PORT:-8082}"

# The services' secrets. Each refuses to start on its public development value (docs/security.md)
# unless SECKILL_ALLOW_DEV_SECRETS=true, so the scripts that start services give every secret the
# caller did not set a fresh random value (per_run_secrets); up.sh records the values in
# SECRETS_FILE so that scripts/token.sh and demo.sh's load tester sign with the same ones.
SECRET_VARIABLES=(SECKILL_JWT_SECRET SECKILL_INTERNAL_KEY SECKILL_ORDER_SIGNING_KEY)
SECRETS_FILE="$RUN_DIR/secrets.env"

# What infra.sh prepares and the services use by default.
PG_HOST=127.0.0.1
PG_PORT=5432
PG_USER=postgres
PG_PASSWORD=postgres
PG_DATABASE=seckill
REDIS_HOST=127.0.0.1
REDIS_PORT=6379
AMQP_PORT=5672
RABBIT_UI_PORT=15672

# Progress line.
say() { printf '==> %s\n' "$*" >&2; }

# Error line, then exit 1.
die() {
    printf 'error: %s\n' "$*" >&2
    exit 1
}

# Runs a command as root: directly when we are root, else through sudo.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root (or sudo) to run: $*"
    fi
}

# apt_install PKG...: installs Debian packages (the package lists refreshed first, once per
# script run); dies where there is no apt-get.
APT_UPDATED=0
apt_install() {
    command -v apt-get >/dev/null 2>&1 || die "missing $* and no apt-get to install them"
    say "installing $* (apt-get)"
    if ((APT_UPDATED == 0)); then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
        APT_UPDATED=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

require_cargo() {
    command -v cargo >/dev/null 2>&1 ||
        die "cargo not found. Install Rust with rustup (https://rustup.rs), then open a new shell or run: . \"\$HOME/.cargo/env\""
}

# port_open PORT [HOST]: true when something accepts TCP connections there.
port_open() {
    timeout 2 bash -c "exec 3<>/dev/tcp/${2:-127.0.0.1}/$1" 2>/dev/null
}

# http_ok URL: true on a 2xx answer.
http_ok() {
    curl -fsS -o /dev/null --max-time 3 "$1" 2>/dev/null
}

# wait_until SECONDS WHAT COMMAND...: polls COMMAND every second until it succeeds.
wait_until() {
    local limit=$1 what=$2
    shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            printf 'error: %s not ready after %ss\n' "$what" "$limit" >&2
            return 1
        fi
        sleep 1
    done
}

# wait_for_url URL SECONDS: polls until URL answers 2xx.
wait_for_url() {
    wait_until "$2" "$1" http_ok "$1"
}

port_of() {
    case $1 in
    gateway) echo "$GATEWAY_PORT" ;;
    seckill-api) echo "$API_PORT" ;;
    order-service) echo "$ORDER_PORT" ;;
    *) die "unknown service $1" ;;
    esac
}

pid_file() { echo "$PID_DIR/$1.pid"; }
log_file() { echo "$LOG_DIR/$1.log"; }

# alive PID: true while the process exists and is not a zombie waiting for its parent.
alive() {
    kill -0 "$1" 2>/dev/null || return 1
    ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

# running_pid SERVICE: prints the pid from the pid file when that process is alive and is
# still our binary (a recycled pid belongs to someone else); fails otherwise.
running_pid() {
    local file pid comm
    file=$(pid_file "$1")
    [ -f "$file" ] || return 1
    pid=$(cat "$file")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    alive "$pid" || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
    # /proc/PID/comm holds at most 15 characters of the name.
    [ "$comm" = "${1:0:15}" ] || return 1
    echo "$pid"
}

# random_secret: 32 random bytes as 64 hex digits (URL- and shell-safe).
random_secret() {
    od -An -N32 -tx1 /dev/urandom | tr -d ' \n'
}

# per_run_secrets: exports a fresh random value for each secret the caller did not set, and
# says which. With SECKILL_ALLOW_DEV_SECRETS=true they stay unset: the services, the load
# tester and seckill-token then all use the public development values.
per_run_secrets() {
    local name unset=()
    for name in "${SECRET_VARIABLES[@]}"; do
        [ -n "${!name:-}" ] || unset+=("$name")
    done
    if ((${#unset[@]} == 0)); then
        say "secrets: the caller's own"
    elif [ "${SECKILL_ALLOW_DEV_SECRETS:-}" = true ]; then
        say "secrets: SECKILL_ALLOW_DEV_SECRETS=true, so ${unset[*]} stay on the PUBLIC development values (never in production)"
    else
        for name in "${unset[@]}"; do
            export "$name=$(random_secret)"
        done
        say "secrets: fresh random ${unset[*]} for this run (set them to choose your own)"
    fi
}

# record_run_secrets: writes the exported secrets to SECRETS_FILE (readable by the user only)
# for the scripts that talk to the services this run starts.
record_run_secrets() {
    local name
    mkdir -p "$RUN_DIR"
    (
        umask 077
        for name in "${SECRET_VARIABLES[@]}"; do
            [ -z "${!name:-}" ] || printf '%s=%s\n' "$name" "${!name}"
        done >"$SECRETS_FILE"
    )
}

# load_run_secrets: exports the secrets recorded by the last scripts/up.sh that the caller did
# not set; fails when there is no record.
load_run_secrets() {
    local name value
    [ -f "$SECRETS_FILE" ] || return 1
    while IFS='=' read -r name value; do
        # Only the known names: the file is data, never evaluated.
        [[ " ${SECRET_VARIABLES[*]} " == *" $name "* ]] || continue
        [ -n "${!name:-}" ] || export "$name=$value"
    done <"$SECRETS_FILE"
}

# psql_admin ARGS...: psql as the postgres user over TCP, as the services connect.
psql_admin() {
    PGPASSWORD="$PG_PASSWORD" psql -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -X -q -v ON_ERROR_STOP=1 "$@"
}

# --- Measuring (the benchmark scripts) ---

# free_port: a loopback port below the kernel's ephemeral range (32768 and up) that nobody
# listens on and this shell has not handed out yet. Call it in this shell, not in a $(...)
# subshell, or use next_port, so that TAKEN_PORTS keeps every pick.
TAKEN_PORTS=()
free_port() {
    local port
    for _ in $(seq 200); do
        port=$((20000 + RANDOM % 12000))
        [[ " ${TAKEN_PORTS[*]-} " == *" $port "* ]] && continue
        port_open "$port" && continue
        TAKEN_PORTS+=("$port")
        echo "$port"
        return 0
    done
    die "no free port found"
}

# next_port VAR: a free port into VAR, remembered in this shell.
next_port() {
    local port
    port=$(free_port)
    TAKEN_PORTS+=("$port")
    printf -v "$1" '%s' "$port"
}

# proc_ticks PID...: their CPU time so far (user + system), in clock ticks.
proc_ticks() {
    local total=0 pid t
    for pid in "$@"; do
        t=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | awk '{ print $12 + $13 }') || t=0
        total=$((total + ${t:-0}))
    done
    echo "$total"
}

# machine_ticks: busy and total clock ticks of the whole machine (all CPUs) so far.
machine_ticks() {
    awk '/^cpu / { busy = $2 + $3 + $4 + $7 + $8 + $9; print busy, busy + $5 + $6 }' /proc/stat
}

# median: of the numbers on standard input, one per line ("nan" for none).
median() {
    sort -g |
        awk '{ a[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# bench_gateway_settings CONNECTIONS: the gateway's settings for a benchmark, one VAR=VALUE a
# line: JWT on HS256 (the run's secret), every rate limit on, in memory, with quotas far
# above what a load tool can send (so every request pays for the check but none is refused),
# and room for CONNECTIONS connections from one address; warnings only in its log.
BENCH_QUOTA=1000000
bench_gateway_settings() {
    local connections=$1 high=$BENCH_QUOTA limit
    printf '%s\n' SECKILL_GATEWAY_JWT_ALGORITHM=HS256 \
        SECKILL_GATEWAY_RATE_LIMIT_ENABLED=true SECKILL_GATEWAY_RATE_LIMIT_BACKEND=memory
    for limit in DEFAULT PURCHASE UNVERIFIED; do
        printf '%s\n' "SECKILL_GATEWAY_RATE_${limit}_PER_SEC=$high" \
            "SECKILL_GATEWAY_RATE_${limit}_BURST=$high"
    done
    printf '%s\n' "SECKILL_GATEWAY_MAX_IN_FLIGHT=$((connections * 4 + 1024))" \
        "SECKILL_GATEWAY_MAX_CONNECTIONS_PER_IP=$((connections + 64))" \
        SECKILL_GATEWAY_LOG_FILTER=warn
}
