#!/usr/bin/env bash
# Brings the platform up locally: infrastructure, a release build, then the three services
# in the background (JSON logs in run/logs, pids in run/pids). Stop them with scripts/down.sh.
#
# Waits until every service's /readyz answers 200 (SECKILL_UP_TIMEOUT seconds, default 90).
# If one fails, prints the end of its log, stops what this run started and exits 1.
#
# Secrets the caller did not set (SECKILL_JWT_SECRET, SECKILL_INTERNAL_KEY,
# SECKILL_ORDER_SIGNING_KEY) get fresh random values, recorded in run/secrets.env for
# scripts/token.sh and demo.sh; SECKILL_ALLOW_DEV_SECRETS=true runs on the public development
# values instead. The backends listen on loopback (their default); the gateway on every
# interface.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_cargo

# Refuse before doing any work if something would collide.
for svc in "${SERVICES[@]}"; do
    if pid=$(running_pid "$svc"); then
        die "$svc is already running (pid $pid); stop it with scripts/down.sh"
    fi
    rm -f "$(pid_file "$svc")"
    port=$(port_of "$svc")
    if port_open "$port"; then
        die "port $port (for $svc) is already taken by another process"
    fi
done

"$SCRIPTS/infra.sh"

say "building release binaries"
(cd "$ROOT" && cargo build --release -p gateway -p seckill-api -p order-service -p seckill-loadtest)

mkdir -p "$LOG_DIR" "$PID_DIR"
per_run_secrets
record_run_secrets

export SECKILL_LOG_FORMAT=json
export SECKILL_GATEWAY_SECKILL_API_URLS="${SECKILL_GATEWAY_SECKILL_API_URLS:-http://127.0.0.1:$API_PORT}"
export SECKILL_GATEWAY_ORDER_SERVICE_URLS="${SECKILL_GATEWAY_ORDER_SERVICE_URLS:-http://127.0.0.1:$ORDER_PORT}"
# The load tester is one address minting thousands of fresh tokens a second: above the
# gateway's per-address pre-limit on tokens it has not verified yet, which a real crowd of
# buyers (many addresses) never meets. Raised here for the local run only.
export SECKILL_GATEWAY_RATE_UNVERIFIED_PER_SEC="${SECKILL_GATEWAY_RATE_UNVERIFIED_PER_SEC:-100000}"
export SECKILL_GATEWAY_RATE_UNVERIFIED_BURST="${SECKILL_GATEWAY_RATE_UNVERIFIED_BURST:-100000}"

# Where a service's /readyz is: the gateway's on its operator port (loopback only), the
# backends' on their own.
GATEWAY_ADMIN_PORT="${SECKILL_GATEWAY_ADMIN_PORT:-9080}"
ready_url_of() {
    case $1 in
    gateway) echo "http://127.0.0.1:$GATEWAY_ADMIN_PORT/readyz" ;;
    *) echo "http://127.0.0.1:$(port_of "$1")/readyz" ;;
    esac
}

started=()
ready=0
# Leaves nothing half-started behind when a service fails or the user presses Ctrl-C.
stop_on_failure() {
    if ((ready == 0 && ${#started[@]} > 0)); then
        say "stopping what this run started"
        "$SCRIPTS/down.sh" || true
    fi
}
trap stop_on_failure EXIT

for svc in "${SERVICES[@]}"; do
    log=$(log_file "$svc")
    : >"$log"
    "$BIN_DIR/$svc" </dev/null >>"$log" 2>&1 &
    echo $! >"$(pid_file "$svc")"
    started+=("$svc")
    say "started $svc (pid $!, port $(port_of "$svc"))"
done

limit="${SECKILL_UP_TIMEOUT:-90}"
deadline=$((SECONDS + limit))
pending=("${SERVICES[@]}")
while ((${#pending[@]} > 0)); do
    still=()
    for svc in "${pending[@]}"; do
        if ! running_pid "$svc" >/dev/null; then
            printf 'error: %s exited during start-up; last lines of %s:\n' "$svc" "$(log_file "$svc")" >&2
            tail -n 40 "$(log_file "$svc")" >&2
            exit 1
        fi
        if http_ok "$(ready_url_of "$svc")"; then
            say "$svc ready"
        else
            still+=("$svc")
        fi
    done
    pending=("${still[@]+"${still[@]}"}")
    ((${#pending[@]} == 0)) && break
    if ((SECONDS >= deadline)); then
        for svc in "${pending[@]}"; do
            url=$(ready_url_of "$svc")
            printf 'error: %s not ready after %ss (%s says: %s); last lines of %s:\n' \
                "$svc" "$limit" "$url" "$(curl -sS --max-time 3 "$url" 2>&1 || true)" "$(log_file "$svc")" >&2
            tail -n 40 "$(log_file "$svc")" >&2
        done
        exit 1
    fi
    sleep 1
done
ready=1

cat <<EOF

Seckill is up.
  gateway        http://127.0.0.1:$GATEWAY_PORT   (the public API, /healthz)
                 http://127.0.0.1:$GATEWAY_ADMIN_PORT   (operator: /readyz /metrics)
  seckill-api    http://127.0.0.1:$API_PORT   (/healthz /readyz /metrics)
  order-service  http://127.0.0.1:$ORDER_PORT   (/healthz /readyz /metrics)
  RabbitMQ UI    http://127.0.0.1:$RABBIT_UI_PORT  (guest/guest: RabbitMQ lets guest in from loopback only)
  secrets        $SECRETS_FILE   (scripts/token.sh signs with them)
  logs           $LOG_DIR/{gateway,seckill-api,order-service}.log
  stop with      scripts/down.sh
EOF
