//! `seckill-token`: mints HS256 tokens for scripts, curl and wrk, one per line.
//!
//! `seckill-token --sub 42` prints a token for user 42; `--count N` prints N user tokens for
//! subs 42..42+N-1 (the input of `loadtest/wrk/seckill.lua`). Tokens carry the `iss` and
//! `aud` a gateway configured to check them expects (read from the same variables).

use std::io::{BufWriter, Write};

use clap::Parser;

/// Mint development tokens signed with the gateway's HS256 secret.
#[derive(Debug, Parser)]
#[command(name = "seckill-token", version, about)]
struct Args {
    /// User id (`sub`) of the (first) token.
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    sub: i64,
    /// Give the token the `admin` role.
    #[arg(long, conflicts_with = "count")]
    admin: bool,
    /// Lifetime of the token in seconds.
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(i64).range(1..))]
    ttl_secs: i64,
    /// HS256 secret.
    #[arg(long, env = "SECKILL_JWT_SECRET", hide_env_values = true,
          default_value = seckill_config::DEV_JWT_SECRET)]
    secret: String,
    /// `iss` claim; the gateway's accepted issuers are a comma-separated list, the first is used.
    #[arg(long, env = "SECKILL_GATEWAY_JWT_ISSUER", default_value = "")]
    issuer: String,
    /// `aud` claim; as for --issuer, the first of a comma-separated list.
    #[arg(long, env = "SECKILL_GATEWAY_JWT_AUDIENCE", default_value = "")]
    audience: String,
    /// Print this many user tokens, for consecutive subs starting at --sub.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
}

fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let roles: &[&str] = if args.admin { &["admin"] } else { &[] };
    let minter = seckill_auth::TokenMinter::new(&args.secret)
        .issuer(&args.issuer)
        .audience(&args.audience);
    let mut out = BufWriter::new(std::io::stdout().lock());
    for offset in 0..args.count.unwrap_or(1) {
        let sub = args.sub + offset as i64;
        let token = minter.mint(sub, roles, args.ttl_secs);
        writeln!(out, "{token}")?;
    }
    out.flush()
}
