//! Typed, layered configuration shared by every service.
//!
//! Layers, later wins: the service's `Default` → an optional TOML file named by
//! `SECKILL_CONFIG` → `SECKILL_*` environment variables → `SECKILL_<SERVICE>_*` variables.
//! The last layer lets three services share one environment (one `.env`, one shell) while
//! each keeps its own port: `SECKILL_API_PORT` only reaches seckill-api.
//!
//! Secrets are wrapped in [`Secret`], which never prints its value. Durations, lists and
//! choices are read into their types at start by the adapters of [`formats`], so a bad
//! value stops the service with the variable named instead of surfacing at a call site.
//!
//! A secret left on its public development value stops a service's binary unless
//! `SECKILL_ALLOW_DEV_SECRETS=true` ([`dev_secrets`]).
//!
//! A `SECKILL_*` variable that no setting reads (a typo, a renamed setting) stops the
//! service too, naming the closest known variable ([`variables`]). `docs/configuration.md`
//! lists every setting; it and [`known`] are generated from the settings types.

pub mod dev_secrets;
pub mod formats;
pub mod known;
pub mod variables;

pub use dev_secrets::{ALLOW_DEV_SECRETS_VARIABLE, SecretCheck, refuse_public_secrets};

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Why configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A layer held a value of the wrong type or a required key was missing.
    #[error("invalid configuration: {0}")]
    Invalid(#[from] Box<figment::Error>),
    /// The values parsed but break a rule of the service (checked by [`Validate`]).
    #[error("invalid configuration: {0}")]
    Rule(String),
    /// A secret is still its public development value and the development switch is off
    /// (checked by [`refuse_public_secrets`]).
    #[error("{0}")]
    PublicSecret(String),
    /// `SECKILL_*` variables that no setting of the service reads (checked by
    /// [`variables::unknown_variables`]), one per line.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    UnknownVariables(Vec<variables::UnknownVariable>),
}

/// Rules a service checks on its settings once they are loaded.
pub trait Validate {
    /// Returns a human-readable reason when a setting is unusable.
    fn validate(&self) -> Result<(), String>;
}

/// Loads `T` for the service whose own variables start with `SECKILL_<service_prefix>_`,
/// refusing any `SECKILL_*` variable it would not read ([`variables`]).
pub fn load<T>(service_prefix: &str) -> Result<T, ConfigError>
where
    T: Serialize + DeserializeOwned + Default + Validate,
{
    let names: Vec<String> = std::env::vars_os()
        .map(|(name, _)| name.to_string_lossy().into_owned())
        .collect();
    let unknown = variables::unknown_variables(
        names.iter().map(String::as_str),
        service_prefix,
        &settings_keys::<T>()?,
        &variables::all_keys(),
    );
    if !unknown.is_empty() {
        return Err(ConfigError::UnknownVariables(unknown));
    }
    let mut figment = Figment::from(Serialized::defaults(T::default()));
    if let Ok(path) = std::env::var("SECKILL_CONFIG") {
        figment = figment.merge(Toml::file_exact(path));
    }
    let own = format!("SECKILL_{}_", service_prefix.to_ascii_uppercase());
    let settings: T = figment
        .merge(Env::prefixed("SECKILL_").ignore(&["CONFIG", "LOG"]))
        .merge(Env::prefixed(&own))
        .extract()
        .map_err(Box::new)?;
    settings.validate().map_err(ConfigError::Rule)?;
    Ok(settings)
}

/// The keys of `T`'s settings, as its defaults serialize them (flattened groups included):
/// the names its variables may take after `SECKILL_` or the service's own prefix.
pub fn settings_keys<T: Serialize + Default>() -> Result<BTreeSet<String>, ConfigError> {
    let defaults: figment::value::Dict = Figment::from(Serialized::defaults(T::default()))
        .extract()
        .map_err(Box::new)?;
    Ok(defaults.into_keys().collect())
}

/// What seckill-api and order-service both read: where the stores are, the namespace, the
/// gateway's identity key, logging. Each service flattens it into its own `Settings`
/// (`#[serde(flatten)]`), so the variable names stay flat: `SECKILL_DATABASE_URL`, ….
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct BackendSettings {
    /// Interface to bind: loopback by default, as only the gateway is meant to reach a
    /// backend.
    pub host: String,
    /// Postgres, including the database name (created if missing; migrations run at start).
    pub database_url: Secret,
    /// Redis: one server's URL, or with `redis_cluster` a comma-separated list of the
    /// cluster's seed nodes.
    pub redis_url: Secret,
    /// Whether `redis_url` names a Redis Cluster.
    pub redis_cluster: bool,
    /// RabbitMQ.
    pub amqp_url: Secret,
    /// The type of the order queues (main, retry tiers, dead letters): `quorum`, replicated
    /// and fsynced, as RabbitMQ recommends for data that must not be lost; `classic` for
    /// queues declared by older versions. Quorum queues dead-letter at least once and the main
    /// one has a delivery limit of 20. A queue's type cannot change in place: an existing
    /// namespace keeps `classic`, or has its classic queues drained and deleted first
    /// (docs/DESIGN.md §5).
    pub amqp_queue_type: AmqpQueueType,
    /// Prefix of every Redis key and AMQP name: isolates tests and tenants.
    pub namespace: String,
    /// Key of the gateway's identity signature (shared with the gateway, which refuses one
    /// shorter than 16 bytes).
    pub internal_key: Secret,
    /// How far from now a gateway identity credential's time may be, either way
    /// (`identity_window_ms`, at most 5000): its whole life, and the clock skew allowed. A
    /// credential is also accepted only once (docs/DESIGN.md §2).
    #[serde(rename = "identity_window_ms", with = "formats::millis")]
    pub identity_window: Duration,
    /// Key of the order messages' signature: seckill-api signs with it, order-service
    /// accepts only what it signed (shared by both backends); a message it did not sign is
    /// dead-lettered (`unsigned`, `bad_signature`).
    pub order_signing_key: Secret,
    /// The order signing key being rotated out: still accepted by order-service, never
    /// used to sign; empty when no rotation is under way. Set it on order-service, roll the
    /// new key out to seckill-api, clear it once the queues have drained.
    pub order_signing_key_previous: Secret,
    /// How long start-up waits for Postgres/RabbitMQ before giving up
    /// (`startup_patience_secs`).
    #[serde(rename = "startup_patience_secs", with = "formats::secs")]
    pub startup_patience: Duration,
    /// `json` (one object per line) or `pretty`.
    pub log_format: LogFormat,
    /// `EnvFilter` directive when `RUST_LOG` is unset.
    pub log_filter: String,
    /// Development only: run even though a secret is its public default
    /// (`SECKILL_ALLOW_DEV_SECRETS`).
    pub allow_dev_secrets: bool,
}

impl Default for BackendSettings {
    fn default() -> Self {
        Self {
            // Only the gateway is meant to be reached; a backend answers any caller holding
            // the identity key, so it is private unless a deployment opens it (compose binds
            // the container network).
            host: "127.0.0.1".into(),
            database_url: "postgres://postgres:postgres@127.0.0.1:5432/seckill".into(),
            redis_url: "redis://127.0.0.1:6379".into(),
            redis_cluster: false,
            amqp_url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            amqp_queue_type: AmqpQueueType::default(),
            namespace: "seckill".into(),
            internal_key: DEV_INTERNAL_KEY.into(),
            identity_window: Duration::from_secs(5),
            order_signing_key: DEV_ORDER_SIGNING_KEY.into(),
            order_signing_key_previous: Secret::default(),
            startup_patience: Duration::from_secs(60),
            log_format: LogFormat::Json,
            log_filter: "info".into(),
            allow_dev_secrets: false,
        }
    }
}

impl Validate for BackendSettings {
    fn validate(&self) -> Result<(), String> {
        if self.internal_key.expose().is_empty() || self.order_signing_key.expose().is_empty() {
            return Err("internal_key and order_signing_key must not be empty".into());
        }
        validate_namespace(&self.namespace)?;
        if self.identity_window.is_zero() || self.identity_window > MAX_IDENTITY_WINDOW {
            return Err(format!(
                "identity_window_ms must be 1 to {}",
                MAX_IDENTITY_WINDOW.as_millis()
            ));
        }
        Ok(())
    }
}

/// The longest an identity credential may live: a captured one is useless after this.
pub const MAX_IDENTITY_WINDOW: Duration = Duration::from_secs(5);

/// The longest a sold-out answer may be remembered outside Redis (seckill-api's
/// `sold_out_local_ttl_ms`, the gateway's `sold_out_ttl_ms`): a unit put back on sale is
/// offered again within this much even when its announcement was lost (docs/DESIGN.md §3).
pub const MAX_SOLD_OUT_MEMORY: Duration = Duration::from_millis(500);

impl BackendSettings {
    /// The backend's secrets with their public development values, for
    /// [`refuse_public_secrets`].
    pub fn secret_checks(&self) -> Vec<SecretCheck<'_>> {
        vec![
            ("SECKILL_INTERNAL_KEY", &self.internal_key, DEV_INTERNAL_KEY),
            (
                "SECKILL_ORDER_SIGNING_KEY",
                &self.order_signing_key,
                DEV_ORDER_SIGNING_KEY,
            ),
        ]
    }

    /// Stops a backend on a public development secret unless `allow_dev_secrets`; returns
    /// the variables still on one (allowed) for a warning.
    pub fn refuse_public_secrets(&self) -> Result<Vec<&str>, ConfigError> {
        refuse_public_secrets(&self.secret_checks(), self.allow_dev_secrets)
    }
}

/// The RabbitMQ queue type of the order queues (`x-queue-type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AmqpQueueType {
    /// Raft-replicated, durable, with delivery limits and at-least-once dead-lettering.
    #[default]
    Quorum,
    /// The queues as versions before quorum declared them (no `x-queue-type`).
    Classic,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One JSON object per line, for collectors.
    #[default]
    Json,
    /// Human-readable lines, for a terminal.
    Pretty,
}

/// A string that must not appear in logs: printed as `[redacted]`.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself; call only where it is used, never to log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

/// The JWT secret used when none is configured. Documented in the repository, so public: the
/// gateway refuses to start with it unless `SECKILL_ALLOW_DEV_SECRETS=true`.
pub const DEV_JWT_SECRET: &str = "seckill-dev-jwt-secret-change-me";

/// The gateway-to-backend identity key used when none is configured; public like
/// [`DEV_JWT_SECRET`], and refused the same way.
pub const DEV_INTERNAL_KEY: &str = "seckill-dev-internal-key-change-me";

/// The order messages' signing key used when none is configured (public: development only).
pub const DEV_ORDER_SIGNING_KEY: &str = "seckill-dev-order-signing-key-change-me";

/// Checks a namespace: it prefixes Redis keys, AMQP names and (in tests) database names.
pub fn validate_namespace(namespace: &str) -> Result<(), String> {
    let ok = !namespace.is_empty()
        && namespace.len() <= 48
        && namespace
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "namespace {namespace:?} must be 1-48 characters of letters, digits, '_', '-', '.'"
        ))
    }
}

/// Splits a comma-separated list setting, dropping blanks.
pub fn split_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_debug_never_shows_the_value() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret:?}"), "[redacted]");
        assert_eq!(secret.expose(), "hunter2");
    }

    #[derive(Debug, Default, Serialize, Deserialize)]
    #[serde(default)]
    struct Service {
        #[serde(flatten)]
        backend: BackendSettings,
        port: u16,
    }

    #[test]
    fn flattened_backend_settings_take_flat_keys() {
        // The shape env variables arrive in: flat keys, numbers parsed as numbers.
        let settings: Service = Figment::from(Serialized::defaults(Service::default()))
            .merge(Serialized::default("namespace", "t_x"))
            .merge(Serialized::default("identity_window_ms", 5))
            .merge(Serialized::default("port", 9))
            .extract()
            .expect("extract");
        assert_eq!(settings.backend.namespace, "t_x");
        assert_eq!(settings.backend.identity_window, Duration::from_millis(5));
        assert_eq!(
            settings.backend.log_format,
            LogFormat::Json,
            "defaults survive"
        );
        assert_eq!(settings.port, 9);
    }

    #[test]
    fn settings_keys_include_flattened_renamed_and_unset_settings() {
        #[derive(Default, Serialize)]
        struct WithOptional {
            #[serde(flatten)]
            backend: BackendSettings,
            own_key: Option<Secret>,
        }
        let keys = settings_keys::<WithOptional>().expect("keys");
        for key in ["own_key", "namespace", "identity_window_ms"] {
            assert!(keys.contains(key), "{key} in {keys:?}");
        }
        assert!(!keys.contains("backend") && !keys.contains("identity_window"));
    }

    #[test]
    fn the_queue_type_reads_quorum_or_classic_and_nothing_else() {
        let read = |value: &str| {
            Figment::from(Serialized::defaults(Service::default()))
                .merge(Serialized::default("amqp_queue_type", value))
                .extract::<Service>()
                .map(|s| s.backend.amqp_queue_type)
                .ok()
        };
        assert_eq!(
            Service::default().backend.amqp_queue_type,
            AmqpQueueType::Quorum
        );
        assert_eq!(read("classic"), Some(AmqpQueueType::Classic));
        assert_eq!(read("quorum"), Some(AmqpQueueType::Quorum));
        assert_eq!(
            read("stream"),
            None,
            "a typo is refused, not read as a default"
        );
    }

    #[test]
    fn the_identity_window_is_positive_and_at_most_five_seconds() {
        let with = |ms| BackendSettings {
            identity_window: Duration::from_millis(ms),
            ..BackendSettings::default()
        };
        assert_eq!(BackendSettings::default().validate(), Ok(()));
        assert_eq!(with(5_000).validate(), Ok(()));
        assert!(with(0).validate().is_err());
        assert!(with(5_001).validate().is_err());
    }

    #[test]
    fn split_list_drops_blanks_and_spaces() {
        assert_eq!(
            split_list(" a, ,b ,"),
            vec!["a".to_string(), "b".to_string()]
        );
    }
}
