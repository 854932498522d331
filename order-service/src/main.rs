//! order-service binary: load settings, set up telemetry, run — or an operator command.
//!
//! ```text
//! order-service                                   run the service
//! order-service breaker open|closed|auto|status   the breaker mode every replica follows
//! order-service dead-letters list [--status S] [--product N] [--from T] [--to T]
//! order-service dead-letters redrive|ignore|clear [--id ID]… [--product N] [--from T]
//!                                                 [--to T] [--limit N] [--dry-run]
//! order-service dead-letters audit [--limit N]
//! ```
//! Commands read the same settings as the service (`SECKILL_*`), act through Postgres,
//! Redis and RabbitMQ directly, print JSON and exit.

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};

use order_service::breaker::{self, Mode};
use order_service::parking::{self, Selection, Status};
use order_service::{Application, Settings};

#[derive(Debug, Parser)]
#[command(name = "order-service", about = "Turns accepted purchases into orders")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Sets (or shows) the circuit breaker mode every replica follows.
    Breaker {
        /// open, closed, auto or status.
        #[arg(value_parser = ["open", "closed", "auto", "status"])]
        mode: String,
    },
    /// The parking lot of dead letters.
    #[command(subcommand)]
    DeadLetters(DeadLetters),
}

#[derive(Debug, Subcommand)]
enum DeadLetters {
    /// Lists entries, oldest first.
    List {
        /// pending, redriven, ignored or quarantined.
        #[arg(long)]
        status: Option<String>,
        #[command(flatten)]
        filter: Filter,
    },
    /// Sends pending entries back to the orders queue (paced; each at most once).
    Redrive(Action),
    /// Gives entries up for good; their units go back on sale.
    Ignore(Action),
    /// Releases quarantined entries (pending again, redrive count reset).
    Clear(Action),
    /// The newest audit records.
    Audit {
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
}

#[derive(Debug, Args)]
struct Filter {
    /// An entry's event id (repeatable).
    #[arg(long = "id")]
    ids: Vec<String>,
    /// Entries of this product.
    #[arg(long)]
    product: Option<i64>,
    /// First dead-lettered at or after (RFC 3339).
    #[arg(long)]
    from: Option<DateTime<Utc>>,
    /// First dead-lettered before (RFC 3339).
    #[arg(long)]
    to: Option<DateTime<Utc>>,
    /// Most entries.
    #[arg(long)]
    limit: Option<i64>,
}

#[derive(Debug, Args)]
struct Action {
    #[command(flatten)]
    filter: Filter,
    /// Only report what would be done (still audited).
    #[arg(long)]
    dry_run: bool,
    /// Who acts, for the audit trail (default: cli:$USER).
    #[arg(long)]
    operator: Option<String>,
}

impl Filter {
    fn selection(self, dry_run: bool) -> Selection {
        Selection {
            ids: self.ids,
            product_id: self.product,
            from: self.from,
            to: self.to,
            limit: self.limit,
            dry_run,
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let settings: Settings = seckill_config::load("order")?;
    match cli.command {
        None => serve(settings).await,
        Some(Command::Breaker { mode }) => breaker_command(&settings, &mode).await,
        Some(Command::DeadLetters(command)) => dead_letters_command(&settings, command).await,
    }
}

async fn serve(settings: Settings) -> anyhow::Result<()> {
    seckill_telemetry::init_tracing(
        "order-service",
        &settings.backend.log_filter,
        &settings.backend.log_format,
    );
    if settings.backend.internal_key.expose() == seckill_config::DEV_INTERNAL_KEY {
        tracing::warn!("running with the development internal key; set SECKILL_INTERNAL_KEY");
    }
    tracing::info!(?settings, "starting");
    let app = Application::build(settings).await?;
    app.run_until_stopped().await
}

/// `breaker <mode>`: writes the mode where every replica reads it (within its poll period).
async fn breaker_command(settings: &Settings, verb: &str) -> anyhow::Result<()> {
    let redis = seckill_store::Redis::new(
        settings.backend.redis_url.expose(),
        settings.backend.redis_cluster,
        1,
    )?;
    let key = seckill_store::RedisKeys::new(&settings.backend.namespace).breaker_forced();
    let mode = match verb {
        "open" => Mode::Open,
        "closed" => Mode::Closed,
        "auto" => Mode::Auto,
        _ => breaker::read_mode(&redis, &key).await?,
    };
    if verb != "status" {
        breaker::write_mode(&redis, &key, mode).await?;
    }
    println!("{}", serde_json::json!({ "mode": mode }));
    Ok(())
}

/// `dead-letters …`: the parking lot, straight through Postgres (and RabbitMQ to redrive).
async fn dead_letters_command(settings: &Settings, command: DeadLetters) -> anyhow::Result<()> {
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(settings.backend.database_url.expose())
        .await?;
    let operator = |given: Option<String>| {
        given.unwrap_or_else(|| format!("cli:{}", std::env::var("USER").unwrap_or_default()))
    };
    let output = match command {
        DeadLetters::List { status, filter } => {
            let status: Option<Status> = status
                .map(|s| serde_json::from_value(serde_json::Value::String(s)))
                .transpose()
                .map_err(|_| {
                    anyhow::anyhow!("--status is pending, redriven, ignored or quarantined")
                })?;
            let entries = parking::list(&db, &filter.selection(false), status).await?;
            serde_json::to_value(entries)?
        }
        DeadLetters::Redrive(action) => {
            let redriver = order_service::startup::redriver(settings);
            let selection = action.filter.selection(action.dry_run);
            let report = redriver
                .redrive(&db, &selection, &operator(action.operator))
                .await?;
            serde_json::to_value(report)?
        }
        DeadLetters::Ignore(action) => {
            let selection = action.filter.selection(action.dry_run);
            serde_json::to_value(
                parking::ignore(&db, &selection, &operator(action.operator)).await?,
            )?
        }
        DeadLetters::Clear(action) => {
            let selection = action.filter.selection(action.dry_run);
            serde_json::to_value(
                parking::clear(&db, &selection, &operator(action.operator)).await?,
            )?
        }
        DeadLetters::Audit { limit } => {
            serde_json::to_value(parking::audit_log(&db, limit).await?)?
        }
    };
    println!("{output}");
    Ok(())
}
