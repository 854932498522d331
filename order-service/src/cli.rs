//! The operator's command line: run the service, or act on the breaker or the parking lot.
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
use clap::builder::PossibleValue;
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;

use crate::Settings;
use crate::breaker::{self, Mode};
use crate::parking::{self, Selection, Status};

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "order-service", about = "Turns accepted purchases into orders")]
pub struct Cli {
    /// An operator command; none runs the service.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// An operator command.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sets (or shows) the circuit breaker mode every replica follows.
    Breaker {
        /// open, closed, auto or status.
        mode: BreakerVerb,
    },
    /// The parking lot of dead letters.
    #[command(subcommand)]
    DeadLetters(DeadLetters),
}

/// What `breaker` does: force a mode, or show the one in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BreakerVerb {
    /// Forces every replica's breaker open: the consumers pause.
    Open,
    /// Forces every replica's breaker closed.
    Closed,
    /// Hands the decision back to each breaker.
    Auto,
    /// Shows the mode in force.
    Status,
}

/// The parking-lot commands.
#[derive(Debug, Subcommand)]
pub enum DeadLetters {
    /// Lists entries, oldest first.
    List {
        /// pending, redriven, ignored or quarantined.
        #[arg(long)]
        status: Option<Status>,
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

/// Which entries a command acts on.
#[derive(Debug, Args)]
pub struct Filter {
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

/// A selection, and who acts on it.
#[derive(Debug, Args)]
pub struct Action {
    #[command(flatten)]
    filter: Filter,
    /// Only report what would be done (still audited).
    #[arg(long)]
    dry_run: bool,
    /// Who acts, for the audit trail (default: cli:$USER).
    #[arg(long)]
    operator: Option<String>,
}

// `--status` takes the same words the admin API and the database use.
impl ValueEnum for Status {
    fn value_variants<'a>() -> &'a [Self] {
        &[
            Self::Pending,
            Self::Redriven,
            Self::Ignored,
            Self::Quarantined,
        ]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(match self {
            Self::Pending => "pending",
            Self::Redriven => "redriven",
            Self::Ignored => "ignored",
            Self::Quarantined => "quarantined",
        }))
    }
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

impl Action {
    fn selection(self) -> (Selection, String) {
        let operator = self
            .operator
            .unwrap_or_else(|| format!("cli:{}", std::env::var("USER").unwrap_or_default()));
        (self.filter.selection(self.dry_run), operator)
    }
}

impl Command {
    /// Runs the command against the services `settings` name, printing JSON.
    pub async fn run(self, settings: &Settings) -> anyhow::Result<()> {
        match self {
            Self::Breaker { mode } => breaker_command(settings, mode).await,
            Self::DeadLetters(command) => dead_letters_command(settings, command).await,
        }
    }
}

/// `breaker <mode>`: writes the mode where every replica reads it (within its poll period).
async fn breaker_command(settings: &Settings, verb: BreakerVerb) -> anyhow::Result<()> {
    let redis = seckill_store::Redis::new(
        settings.backend.redis_url.expose(),
        settings.backend.redis_cluster,
        1,
    )?;
    let key = seckill_store::RedisKeys::new(&settings.backend.namespace).breaker_forced();
    let mode = match verb {
        BreakerVerb::Open => Mode::Open,
        BreakerVerb::Closed => Mode::Closed,
        BreakerVerb::Auto => Mode::Auto,
        BreakerVerb::Status => breaker::read_mode(&redis, &key).await?,
    };
    if verb != BreakerVerb::Status {
        breaker::write_mode(&redis, &key, mode).await?;
    }
    print(serde_json::json!({ "mode": mode }))
}

/// `dead-letters …`: the parking lot, straight through Postgres (and RabbitMQ to redrive).
async fn dead_letters_command(settings: &Settings, command: DeadLetters) -> anyhow::Result<()> {
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(settings.backend.database_url.expose())
        .await?;
    match command {
        DeadLetters::List { status, filter } => {
            print(parking::list(&db, &filter.selection(false), status).await?)
        }
        DeadLetters::Redrive(action) => {
            let redriver = crate::startup::redriver(settings);
            let (selection, operator) = action.selection();
            print(redriver.redrive(&db, &selection, &operator).await?)
        }
        DeadLetters::Ignore(action) => {
            let (selection, operator) = action.selection();
            print(parking::ignore(&db, &selection, &operator).await?)
        }
        DeadLetters::Clear(action) => {
            let (selection, operator) = action.selection();
            print(parking::clear(&db, &selection, &operator).await?)
        }
        DeadLetters::Audit { limit } => print(parking::audit_log(&db, limit).await?),
    }
}

/// Prints `output` as one line of JSON (through `Value`, so keys come out sorted as before).
fn print(output: impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_value(output)?);
    Ok(())
}
