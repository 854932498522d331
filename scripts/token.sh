#!/usr/bin/env bash
# Prints a user token (HS256 JWT) for calling the API through the gateway.
#
#   scripts/token.sh 42            # user 42
#   scripts/token.sh 1 --admin     # an admin, for POST /admin/...
#
# Extra arguments go to seckill-token (e.g. --ttl-secs 600). Signs with SECKILL_JWT_SECRET,
# else the one scripts/up.sh gave the running gateway (run/secrets.env), else the public
# development default (for a gateway started with SECKILL_ALLOW_DEV_SECRETS=true).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if (($# < 1)) || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: scripts/token.sh <user_id> [--admin] [--ttl-secs N]" >&2
    exit 64
fi
user_id=$1
shift

if command -v cargo >/dev/null 2>&1; then
    # A no-op when the binary is fresh.
    (cd "$ROOT" && cargo build --release -q -p seckill-loadtest --bin seckill-token)
elif [ ! -x "$BIN_DIR/seckill-token" ]; then
    require_cargo
fi

load_run_secrets || true
if [ -z "${SECKILL_JWT_SECRET:-}" ]; then
    say "no SECKILL_JWT_SECRET and no $SECRETS_FILE: signing with the public development secret"
fi
# seckill-token reads SECKILL_JWT_SECRET from the environment, which keeps it out of `ps`.
exec "$BIN_DIR/seckill-token" --sub "$user_id" "$@"
