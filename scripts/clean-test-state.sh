#!/usr/bin/env bash
# Removes what crashed test runs left behind: Postgres databases `seckill_<prefix>*`, Redis
# keys `<prefix>*` and RabbitMQ queues and exchanges `<prefix>*` (default prefix `t_`, the
# namespace prefix of the tests). Run by scripts/test.sh before the suite; never run it
# while a test run is in progress, it would pull that run's state away.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
export PATH="$PATH:/usr/sbin:/sbin"

prefix="${1:-t_}"
[[ $prefix =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]] || die "bad prefix ${prefix@Q}"

starts_with() { awk -v p="$1" 'index($0, p) == 1'; }

clean_postgres() {
    local db n=0
    while IFS= read -r db; do
        [ -n "$db" ] || continue
        psql_admin -d postgres -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null
        n=$((n + 1))
    done < <(psql_admin -d postgres -Atc 'select datname from pg_database' | starts_with "seckill_$prefix")
    say "postgres: dropped $n leftover database(s) seckill_$prefix*"
}

clean_redis() {
    local keys n
    keys=$(mktemp)
    redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" --scan --pattern "$prefix*" >"$keys"
    n=$(wc -l <"$keys")
    # UNLINK frees memory off the main thread; 500 keys per call keeps each call short.
    xargs -r -d '\n' -n 500 redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" UNLINK <"$keys" >/dev/null
    rm -f "$keys"
    say "redis: unlinked $n leftover key(s) $prefix*"
}

# rabbitmqctl can list but not delete exchanges; the management API (enabled by infra.sh)
# deletes both kinds in one quick HTTP call each.
rabbit_api_delete() {
    curl -fsS -o /dev/null --max-time 10 -u guest:guest -X DELETE \
        "http://127.0.0.1:$RABBIT_UI_PORT/api/$1/%2F/$2"
}

clean_rabbitmq() {
    if ! command -v rabbitmqctl >/dev/null 2>&1; then
        say "rabbitmq: no rabbitmqctl here; leftovers not cleaned"
        return 0
    fi
    local api=0 name queues=0 exchanges=0
    port_open "$RABBIT_UI_PORT" && api=1
    while IFS= read -r name; do
        if ((api)); then
            rabbit_api_delete queues "$name"
        else
            as_root rabbitmqctl -q delete_queue "$name" >/dev/null
        fi
        queues=$((queues + 1))
    done < <(as_root rabbitmqctl -q list_queues name | starts_with "$prefix")
    if ((api)); then
        while IFS= read -r name; do
            rabbit_api_delete exchanges "$name"
            exchanges=$((exchanges + 1))
        done < <(as_root rabbitmqctl -q list_exchanges name | starts_with "$prefix")
    else
        say "rabbitmq: management API not answering; leftover exchanges kept"
    fi
    say "rabbitmq: deleted $queues queue(s) and $exchanges exchange(s) $prefix*"
}

clean_postgres
clean_redis
clean_rabbitmq
