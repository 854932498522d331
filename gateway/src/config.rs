//! Gateway settings: `SECKILL_*` shared with the other services, `SECKILL_GATEWAY_*` its own.

use serde::{Deserialize, Serialize};

use seckill_config::{DEV_INTERNAL_KEY, DEV_JWT_SECRET, Secret, Validate, split_list};

/// Everything the gateway reads at start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Interface to bind.
    pub host: String,
    /// Port to bind; 0 picks a free one (tests).
    pub port: u16,
    /// HS256 secret of user tokens.
    pub jwt_secret: Secret,
    /// Clock skew tolerated on `exp`/`nbf`, seconds.
    pub jwt_leeway_secs: u64,
    /// Key of the identity signature the gateway adds for backends.
    pub internal_key: Secret,
    /// seckill-api replicas, comma-separated base URLs; requests go round-robin.
    pub seckill_api_urls: String,
    /// order-service replicas, comma-separated base URLs.
    pub order_service_urls: String,
    /// Requests in flight at once; beyond it the gateway sheds load with a fast 503.
    pub max_in_flight: usize,
    /// Whole-request deadline, milliseconds (504 beyond it).
    pub request_timeout_ms: u64,
    /// Largest request body accepted, bytes (413 beyond it).
    pub max_body_bytes: usize,
    /// `json` or `pretty`.
    pub log_format: String,
    /// `EnvFilter` directive when `RUST_LOG` is unset.
    pub log_filter: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            host: "0.0.0.0".into(),
            port: 8080,
            jwt_secret: DEV_JWT_SECRET.into(),
            jwt_leeway_secs: 5,
            internal_key: DEV_INTERNAL_KEY.into(),
            seckill_api_urls: "http://127.0.0.1:8081".into(),
            order_service_urls: "http://127.0.0.1:8082".into(),
            max_in_flight: 4096,
            request_timeout_ms: 10_000,
            max_body_bytes: 64 * 1024,
            log_format: "json".into(),
            log_filter: "info".into(),
        }
    }
}

impl Settings {
    /// The seckill-api upstream base URLs.
    pub fn seckill_api_upstreams(&self) -> Vec<String> {
        split_list(&self.seckill_api_urls)
    }

    /// The order-service upstream base URLs.
    pub fn order_service_upstreams(&self) -> Vec<String> {
        split_list(&self.order_service_urls)
    }
}

impl Validate for Settings {
    fn validate(&self) -> Result<(), String> {
        if self.jwt_secret.expose().len() < 16 {
            return Err("jwt_secret must be at least 16 bytes".into());
        }
        for url in self
            .seckill_api_upstreams()
            .iter()
            .chain(&self.order_service_upstreams())
        {
            if !url.starts_with("http://") {
                return Err(format!("upstream {url:?} must be an http:// URL"));
            }
        }
        if self.seckill_api_upstreams().is_empty() || self.order_service_upstreams().is_empty() {
            return Err("at least one upstream per route is required".into());
        }
        if self.max_in_flight == 0 || self.request_timeout_ms == 0 {
            return Err("max_in_flight and request_timeout_ms must be positive".into());
        }
        Ok(())
    }
}
