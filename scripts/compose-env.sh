#!/usr/bin/env bash
# Writes the `.env` docker compose reads: fresh random secrets and passwords for every one
# docker-compose.yml requires (it has no defaults, so `docker compose up` without them stops
# naming the missing variable).
#
#   scripts/compose-env.sh && docker compose up --build
#   scripts/compose-env.sh --output /tmp/check.env     # elsewhere (scripts/check-compose.sh)
#   scripts/compose-env.sh --force                     # replace an existing .env
#
# An existing file keeps its values unless --force: Postgres and RabbitMQ keep the password
# they were first started with in their volumes, so new ones lock the services out of data
# created with the old (`docker compose down -v` drops the volumes along). Only a variable it
# lacks (one docker-compose.yml came to require since it was written, e.g.
# GRAFANA_ADMIN_PASSWORD) is appended. The values are hex: safe inside the URLs of
# docker-compose.yml and in a shell. The file is readable by its owner only; it is in
# .gitignore.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

output="$ROOT/.env"
force=0
while (($# > 0)); do
    case $1 in
    --output)
        (($# >= 2)) || die "--output needs a file name"
        output=$2
        shift 2
        ;;
    --force)
        force=1
        shift
        ;;
    -h | --help)
        sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done

# Every variable docker-compose.yml requires, in the order written, with its comment.
variables() {
    cat <<ENV
# The services' own secrets (the services refuse their public development values).
SECKILL_JWT_SECRET=$(random_secret)
SECKILL_INTERNAL_KEY=$(random_secret)
SECKILL_ORDER_SIGNING_KEY=$(random_secret)
# The stores' accounts (used at their first start, then kept in their volumes).
POSTGRES_PASSWORD=$(random_secret)
REDIS_PASSWORD=$(random_secret)
RABBITMQ_USER=seckill
RABBITMQ_PASSWORD=$(random_secret)
# Grafana's admin account (user admin), http://127.0.0.1:3000.
GRAFANA_ADMIN_PASSWORD=$(random_secret)
ENV
}

umask 077
if [ -e "$output" ] && ((force == 0)); then
    # Keep every value; append those the file lacks.
    added=()
    while IFS= read -r line; do
        case $line in
        '#'* | '') continue ;;
        esac
        name=${line%%=*}
        if ! grep -q "^${name}=" "$output"; then
            printf '%s\n' "$line" >>"$output"
            added+=("$name")
        fi
    done < <(variables)
    if ((${#added[@]} > 0)); then
        say "$output exists; kept its values, added ${added[*]}"
    else
        say "$output exists and has every variable; kept it (--force replaces it, see --help for why that can lock out old volumes)"
    fi
    exit 0
fi

{
    echo "# Written by scripts/compose-env.sh on $(date -u +%FT%TZ). Secrets: keep this file private."
    variables
} >"$output"
say "wrote $output with fresh secrets"
