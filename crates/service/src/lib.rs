//! The start-up every service's binary shares, so that each `main.rs` is a few lines.
//!
//! A service describes itself once, as an implementation of [`Service`] on its settings
//! (in its `startup.rs`): its name, the prefix of its own variables, its runtime, where its
//! log settings and secrets are, and how it builds and runs. [`main`] then does the same
//! steps in the same order for all three:
//!
//! 1. transparent huge pages off for the process, before anything allocates
//!    ([`seckill_alloc::no_huge_pages`]);
//! 2. the tokio runtime the service asked for;
//! 3. the settings loaded ([`seckill_config::load`]: defaults, `SECKILL_CONFIG`'s file, the
//!    `SECKILL_*` variables; an unknown variable stops it, naming the closest known one);
//! 4. the refusal to run on a public development secret, unless allowed;
//! 5. logs and traces ([`seckill_telemetry::init_tracing`]), then a warning for each public
//!    secret still in use and the settings logged once (secrets redacted);
//! 6. the service built and run until it is told to stop;
//! 7. the last spans exported.
//!
//! An operator command of a service's binary ([`command`]) loads the same settings but
//! serves nobody and signs nothing: no secret check, no telemetry.

use std::fmt::Debug;
use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;

use seckill_config::{ConfigError, LogFormat, Validate};

/// The runtime a service runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// One thread: for a service that serves its connections on worker threads of its own
    /// (the gateway) and only accepts and keeps house on the runtime.
    CurrentThread,
    /// tokio's worker pool, one thread per core.
    MultiThread,
}

/// What the shared start-up needs to know of a service, implemented on its settings.
pub trait Service: Serialize + DeserializeOwned + Default + Validate + Debug + Sized {
    /// The service's name in logs, traces and metrics (`service.name`).
    const NAME: &'static str;
    /// Its own variables are `SECKILL_<PREFIX>_*` (upper-cased); shared ones `SECKILL_*`.
    const PREFIX: &'static str;
    /// The runtime [`main`] builds for it.
    const RUNTIME: Runtime;

    /// The log filter (`RUST_LOG` syntax) and format.
    fn logging(&self) -> (&str, LogFormat);

    /// Stops the service on a public development secret unless development secrets are
    /// allowed; returns the variables still on one (allowed), for a warning.
    fn refuse_public_secrets(&self) -> Result<Vec<&str>, ConfigError>;

    /// Builds the service and runs it until it is told to stop.
    fn run(self) -> impl Future<Output = anyhow::Result<()>>;
}

/// A service's whole start-up, from the first line of its `main` (see the module's steps).
pub fn main<S: Service>() -> anyhow::Result<()> {
    seckill_alloc::no_huge_pages();
    runtime(S::RUNTIME)?.block_on(start::<S>())
}

/// Runs an operator command of a service's binary on a multi-thread runtime, with the
/// service's settings loaded; no secret check and no telemetry.
pub fn command<S, F>(command: impl FnOnce(S) -> F) -> anyhow::Result<()>
where
    S: Service,
    F: Future<Output = anyhow::Result<()>>,
{
    runtime(Runtime::MultiThread)?.block_on(async {
        let settings: S = seckill_config::load(S::PREFIX)?;
        command(settings).await
    })
}

fn runtime(kind: Runtime) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = match kind {
        Runtime::CurrentThread => tokio::runtime::Builder::new_current_thread(),
        Runtime::MultiThread => tokio::runtime::Builder::new_multi_thread(),
    };
    builder.enable_all().build()
}

/// Steps 3 to 7 of the module's list, on the service's runtime.
async fn start<S: Service>() -> anyhow::Result<()> {
    let settings: S = seckill_config::load(S::PREFIX)?;
    let public: Vec<String> = settings
        .refuse_public_secrets()?
        .into_iter()
        .map(str::to_owned)
        .collect();
    let (filter, format) = settings.logging();
    seckill_telemetry::init_tracing(S::NAME, filter, format);
    if !public.is_empty() {
        tracing::warn!(
            secrets = ?public,
            "running on public development secrets (SECKILL_ALLOW_DEV_SECRETS=true): never in production"
        );
    }
    tracing::info!(?settings, "starting");
    let stopped = settings.run().await;
    // The last batch of spans, when they are exported.
    seckill_telemetry::shutdown_tracing().await;
    stopped
}
