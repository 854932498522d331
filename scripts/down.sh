#!/usr/bin/env bash
# Stops the services scripts/up.sh started (by their pid files), gateway first so no new
# traffic arrives while the backends drain. SIGTERM, up to 15 s for a graceful exit, then
# SIGKILL. Does nothing when nothing runs; leaves the infrastructure and the logs alone.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

GRACE_SECS=15

stop() {
    local svc=$1 pid
    if ! pid=$(running_pid "$svc"); then
        rm -f "$(pid_file "$svc")"
        return 0
    fi
    say "stopping $svc (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + GRACE_SECS))
    while alive "$pid"; do
        if ((SECONDS >= deadline)); then
            say "$svc did not exit within ${GRACE_SECS}s; killing it"
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.2
    done
    rm -f "$(pid_file "$svc")"
}

for ((i = ${#SERVICES[@]} - 1; i >= 0; i--)); do
    stop "${SERVICES[$i]}"
done
