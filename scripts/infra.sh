#!/usr/bin/env bash
# Makes local Postgres, Redis and RabbitMQ ready for the services and the tests.
#
# Safe to run again: it installs (apt) only what is missing, starts only what does not
# answer, and otherwise just enables the RabbitMQ management UI and creates the `seckill`
# database when they are missing. A service that already answers is left alone.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# rabbitmq-server, rabbitmq-plugins and pg_* helpers live in sbin on some set-ups.
export PATH="$PATH:/usr/sbin:/sbin"

pg_answers() {
    if command -v pg_isready >/dev/null 2>&1; then
        pg_isready -h "$PG_HOST" -p "$PG_PORT" -q
    else
        port_open "$PG_PORT" "$PG_HOST"
    fi
}
pg_server_installed() { compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; }
redis_answers() { [ "$(redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]; }
rabbit_answers() { port_open "$AMQP_PORT"; }
rabbit_ui_answers() { port_open "$RABBIT_UI_PORT"; }

install_missing() {
    local pkgs=()
    command -v curl >/dev/null 2>&1 || pkgs+=(curl)
    { command -v psql && command -v pg_isready; } >/dev/null 2>&1 || pkgs+=(postgresql-client)
    pg_answers || pg_server_installed || pkgs+=(postgresql)
    command -v redis-cli >/dev/null 2>&1 || pkgs+=(redis-tools)
    port_open "$REDIS_PORT" "$REDIS_HOST" || command -v redis-server >/dev/null 2>&1 || pkgs+=(redis-server)
    rabbit_answers || command -v rabbitmq-server >/dev/null 2>&1 || pkgs+=(rabbitmq-server)
    if ((${#pkgs[@]} == 0)); then
        return 0
    fi
    apt_install "${pkgs[@]}"
}

# psql as the local `postgres` OS user over the Unix socket (peer auth on a fresh install).
psql_as_postgres_user() {
    if [ "$(id -u)" -eq 0 ]; then
        (cd / && runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -d postgres "$@")
    else
        (cd / && sudo -u postgres psql -X -q -v ON_ERROR_STOP=1 -d postgres "$@")
    fi
}

start_postgres() {
    if pg_answers; then
        say "postgres: answering on $PG_HOST:$PG_PORT"
    else
        command -v pg_lsclusters >/dev/null 2>&1 ||
            die "postgres is not answering on $PG_HOST:$PG_PORT and pg_lsclusters (postgresql-common) is missing"
        local ver name port status rest
        if [ -z "$(pg_lsclusters -h 2>/dev/null)" ]; then
            ver=$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -V | tail -n 1)
            say "postgres: creating cluster $ver/main"
            as_root pg_createcluster "$ver" main
        fi
        # Prefer the cluster on our port, else the first one.
        read -r ver name port status rest < <(
            pg_lsclusters -h | awk -v p="$PG_PORT" '$3 == p { print; found = 1; exit } END { if (!found) exit 1 }' ||
                pg_lsclusters -h | head -n 1
        )
        : "$rest"
        [ "$port" = "$PG_PORT" ] || say "postgres: warning: cluster $ver/$name uses port $port, not $PG_PORT"
        if [ "$status" != online ]; then
            say "postgres: starting cluster $ver/$name"
            as_root pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start
        fi
        wait_until 60 "postgres on $PG_HOST:$PG_PORT" pg_answers
        say "postgres: ready"
    fi

    # The services log in as postgres/postgres over TCP. A fresh install has no password
    # for that role (peer/scram auth), so give it the documented development one.
    if ! psql_admin -d postgres -Atc 'select 1' >/dev/null 2>&1; then
        id postgres >/dev/null 2>&1 ||
            die "cannot log in to postgres as $PG_USER/$PG_PASSWORD and there is no local postgres user to fix it"
        say "postgres: setting the development password of role $PG_USER"
        psql_as_postgres_user -c "ALTER ROLE $PG_USER WITH LOGIN PASSWORD '$PG_PASSWORD'" >/dev/null
        psql_admin -d postgres -Atc 'select 1' >/dev/null ||
            die "still cannot log in to postgres as $PG_USER over TCP; check pg_hba.conf for $PG_HOST"
    fi

    if [ -z "$(psql_admin -d postgres -Atc "select 1 from pg_database where datname = '$PG_DATABASE'")" ]; then
        say "postgres: creating database $PG_DATABASE"
        psql_admin -d postgres -c "CREATE DATABASE $PG_DATABASE" >/dev/null
    fi
}

start_redis() {
    if redis_answers; then
        say "redis: answering on $REDIS_HOST:$REDIS_PORT"
        return 0
    fi
    port_open "$REDIS_PORT" "$REDIS_HOST" &&
        die "something listens on $REDIS_HOST:$REDIS_PORT but does not answer PING (a password?)"
    say "redis: starting (append-only file in $RUN_DIR/redis)"
    # With AOF a restarted Redis comes back with its stock, markers and outbox; seckill-api
    # checks this at start (SECKILL_API_REQUIRE_DURABLE_REDIS).
    mkdir -p "$RUN_DIR/redis"
    redis-server --daemonize yes --bind "$REDIS_HOST" --port "$REDIS_PORT" --save "" \
        --appendonly yes --appendfsync everysec --maxmemory-policy noeviction \
        --dir "$RUN_DIR/redis" >/dev/null
    wait_until 30 "redis on $REDIS_HOST:$REDIS_PORT" redis_answers
    say "redis: ready"
}

start_rabbitmq() {
    if rabbit_answers; then
        say "rabbitmq: answering on 127.0.0.1:$AMQP_PORT"
    else
        say "rabbitmq: starting (this takes a few seconds)"
        as_root rabbitmq-server -detached
        wait_until 120 "rabbitmq on 127.0.0.1:$AMQP_PORT" rabbit_answers
        say "rabbitmq: ready"
    fi

    if rabbit_ui_answers; then
        return 0
    fi
    if ! command -v rabbitmq-plugins >/dev/null 2>&1; then
        say "rabbitmq: no rabbitmq-plugins here; management UI not enabled"
        return 0
    fi
    say "rabbitmq: enabling the management UI"
    as_root rabbitmq-plugins -q enable rabbitmq_management >/dev/null
    wait_until 60 "rabbitmq management UI on 127.0.0.1:$RABBIT_UI_PORT" rabbit_ui_answers
    say "rabbitmq: management UI on http://127.0.0.1:$RABBIT_UI_PORT (guest/guest)"
}

install_missing
start_postgres
start_redis
start_rabbitmq
say "infrastructure ready"
