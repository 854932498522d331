//! The in-memory backend: one tower_governor layer (GCRA, keyed) per quota, per replica.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use governor::middleware::StateInformationMiddleware;
use tower_governor::governor::{Governor, GovernorConfig, GovernorConfigBuilder};
use tower_governor::key_extractor::KeyExtractor;
use tower_governor::{GovernorError, GovernorLayer};

use super::{QuotaSpec, RateKey, limited_response, no_key_response};
use crate::auth::Caller;
use crate::client_ip::ClientIp;

/// Reads the [`RateKey`] that [`crate::auth::identify`] left in the request extensions.
#[derive(Debug, Clone, Copy)]
pub struct CallerOrClientIp;

impl KeyExtractor for CallerOrClientIp {
    type Key = RateKey;

    fn name(&self) -> &'static str {
        "caller or client ip"
    }

    fn extract<T>(&self, req: &axum::http::Request<T>) -> Result<RateKey, GovernorError> {
        let extensions = req.extensions();
        if let Some(caller) = extensions.get::<Caller>() {
            return Ok(RateKey::User(caller.user_id));
        }
        extensions
            .get::<ClientIp>()
            .map(|ip| RateKey::Client(ip.0))
            .ok_or(GovernorError::UnableToExtractKey)
    }

    fn key_name(&self, key: &RateKey) -> Option<String> {
        Some(key.to_string())
    }
}

type Config = GovernorConfig<CallerOrClientIp, StateInformationMiddleware>;

/// A service behind one in-memory quota.
pub type Limited<S> = Governor<CallerOrClientIp, StateInformationMiddleware, S, Body>;

/// One quota's keyed limiter and the layer that applies it.
#[derive(Clone)]
pub struct MemoryQuota {
    config: Arc<Config>,
    layer: GovernorLayer<CallerOrClientIp, StateInformationMiddleware, Body>,
}

impl MemoryQuota {
    /// The limiter for `spec`.
    pub fn new(spec: QuotaSpec) -> Self {
        // tower_governor's `per_second(n)` is the replenish *period*: a rate of n per second
        // is one token every 1/n s, set here as that period.
        let mut builder = GovernorConfigBuilder::default()
            .key_extractor(CallerOrClientIp)
            .use_headers();
        let config = builder
            .period(Duration::from_micros(spec.interval_us()))
            .burst_size(spec.burst)
            .finish()
            .expect("QuotaSpec holds a positive rate and burst");
        let config = Arc::new(config);
        let layer = GovernorLayer::new(config.clone()).error_handler(move |error| match error {
            // tower_governor truncates the wait to whole seconds; one more rounds it up.
            GovernorError::TooManyRequests { wait_time, .. } => {
                limited_response(spec, wait_time.saturating_add(1))
            }
            _ => no_key_response(spec.route),
        });
        Self { config, layer }
    }

    /// `inner` behind this quota.
    pub fn wrap<S>(&self, inner: S) -> Limited<S> {
        tower::Layer::layer(&self.layer, inner)
    }

    /// Forgets keys whose buckets are full again, and the memory they held.
    pub fn forget_idle(&self) {
        self.config.limiter().retain_recent();
        self.config.limiter().shrink_to_fit();
    }
}
