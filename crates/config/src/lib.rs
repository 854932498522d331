//! Typed, layered configuration shared by every service.
//!
//! Layers, later wins: the service's `Default` → an optional TOML file named by
//! `SECKILL_CONFIG` → `SECKILL_*` environment variables → `SECKILL_<SERVICE>_*` variables.
//! The last layer lets three services share one environment (one `.env`, one shell) while
//! each keeps its own port: `SECKILL_API_PORT` only reaches seckill-api.
//!
//! Secrets are wrapped in [`Secret`], which never prints its value.

use std::fmt;

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
}

/// Rules a service checks on its settings once they are loaded.
pub trait Validate {
    /// Returns a human-readable reason when a setting is unusable.
    fn validate(&self) -> Result<(), String>;
}

/// Loads `T` for the service whose own variables start with `SECKILL_<service_prefix>_`.
pub fn load<T>(service_prefix: &str) -> Result<T, ConfigError>
where
    T: Serialize + DeserializeOwned + Default + Validate,
{
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

/// The JWT secret used when none is configured. Documented in the README; services log a
/// warning when they run with it.
pub const DEV_JWT_SECRET: &str = "seckill-dev-jwt-secret-change-me";

/// The gateway-to-backend identity key used when none is configured.
pub const DEV_INTERNAL_KEY: &str = "seckill-dev-internal-key-change-me";

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

    #[test]
    fn split_list_drops_blanks_and_spaces() {
        assert_eq!(
            split_list(" a, ,b ,"),
            vec!["a".to_string(), "b".to_string()]
        );
    }
}
