//! Gateway settings: `SECKILL_*` shared with the other services, `SECKILL_GATEWAY_*` its own.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use seckill_auth::JwtAlgorithm;
use seckill_config::{
    ConfigError, DEV_INTERNAL_KEY, DEV_JWT_SECRET, LogFormat, Secret, SecretCheck, Validate,
    validate_namespace,
};
use seckill_http1::MAX_HEADERS_CAP;

use crate::client_ip::TrustedProxies;
use crate::proxy::Service;
use crate::proxy::resolve::{DnsServer, Resolve, SystemResolver};

/// Where the rate limits' buckets live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RateLimitBackend {
    /// In this process: each replica limits on its own.
    #[default]
    Memory,
    /// In Redis: the quotas hold across every replica sharing the Redis and namespace.
    Redis,
}

/// What the `redis` rate-limit backend does with a request when Redis cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RateLimitFailure {
    /// Let it through unmetered: an outage of the limiter does not stop the platform.
    #[default]
    Open,
    /// Refuse it with 503: no request passes unmetered.
    Closed,
}

/// Everything the gateway reads at start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Interface to bind.
    pub host: String,
    /// Port to bind; 0 picks a free one (tests).
    pub port: u16,
    /// Threads serving connections, each a single-threaded runtime; 0: the available cores.
    pub workers: usize,
    /// The only algorithm user tokens may be signed with: `HS256`, `RS256` or `EdDSA`.
    pub jwt_algorithm: JwtAlgorithm,
    /// HS256 secret of user tokens (unused with RS256/EdDSA).
    pub jwt_secret: Secret,
    /// RS256/EdDSA: the identity provider's public key, PEM text.
    pub jwt_public_key_pem: String,
    /// RS256/EdDSA: a file holding that PEM, when not given inline.
    pub jwt_public_key_file: String,
    /// Accepted `iss` values (`jwt_issuer`, comma-separated); when set, the claim is required;
    /// empty: not checked. `seckill-token`, `scripts/token.sh` and the load tester read the
    /// same variable and put the first value in the tokens they mint.
    #[serde(rename = "jwt_issuer", with = "seckill_config::formats::list")]
    pub jwt_issuers: Vec<String>,
    /// Accepted `aud` values (`jwt_audience`, comma-separated); when set, the claim is
    /// required; empty: not checked. The token tools read it as they read `jwt_issuer`.
    #[serde(rename = "jwt_audience", with = "seckill_config::formats::list")]
    pub jwt_audiences: Vec<String>,
    /// Clock skew tolerated on `exp`/`nbf`/`iat`, seconds (at most 3600).
    pub jwt_leeway_secs: u64,
    /// Verified tokens remembered per worker thread until they expire, so a client's next
    /// request skips the signature check; 0: every request is verified in full.
    pub jwt_cache_entries: usize,
    /// Key of the identity signature the gateway adds for backends (at least 16 bytes; the
    /// backends' `internal_key`).
    pub internal_key: Secret,
    /// seckill-api replicas, comma-separated base URLs; requests go round-robin.
    #[serde(with = "seckill_config::formats::list")]
    pub seckill_api_urls: Vec<String>,
    /// order-service replicas, comma-separated base URLs.
    #[serde(with = "seckill_config::formats::list")]
    pub order_service_urls: Vec<String>,
    /// How long a replica that refused a connection is skipped (`upstream_eject_ms`; 0: never).
    #[serde(rename = "upstream_eject_ms", with = "seckill_config::formats::millis")]
    pub upstream_eject: Duration,
    /// Deadline to open a connection to a replica (`upstream_connect_timeout_ms`); beyond it
    /// the next is tried.
    #[serde(
        rename = "upstream_connect_timeout_ms",
        with = "seckill_config::formats::millis"
    )]
    pub upstream_connect_timeout: Duration,
    /// Deadline for a replica's whole response (`upstream_request_timeout_ms`; 504 beyond
    /// it, no retry).
    #[serde(
        rename = "upstream_request_timeout_ms",
        with = "seckill_config::formats::millis"
    )]
    pub upstream_request_timeout: Duration,
    /// An idle kept-alive connection to a replica is closed after this
    /// (`upstream_idle_timeout_ms`); set it below the replicas' own keep-alive timeout, so
    /// the gateway, not the replica, closes (0: connections are not reused).
    #[serde(
        rename = "upstream_idle_timeout_ms",
        with = "seckill_config::formats::millis"
    )]
    pub upstream_idle_timeout: Duration,
    /// How often each upstream host name is resolved again (`upstream_resolve_interval_ms`;
    /// also soon after a connect failure): every address is a replica of its own, and a
    /// new one gets traffic at most this long after it appears in DNS. 0: names are not
    /// re-resolved, only looked up by the system resolver when a connection is opened. An
    /// address that left is taken out and its connections closed; a failed or empty lookup
    /// keeps the last known addresses; IP-literal URLs are never resolved.
    #[serde(
        rename = "upstream_resolve_interval_ms",
        with = "seckill_config::formats::millis"
    )]
    pub upstream_resolve_interval: Duration,
    /// A DNS server (`ip:port`) asked over UDP for the upstream names' A records; empty: the
    /// system resolver (`/etc/hosts`, Docker's embedded DNS, IPv4 and IPv6).
    pub dns_server: String,
    /// Requests in flight at once; beyond it the gateway sheds load with a fast 503.
    pub max_in_flight: usize,
    /// Whole-request deadline (`request_timeout_ms`; 504 beyond it).
    #[serde(
        rename = "request_timeout_ms",
        with = "seckill_config::formats::millis"
    )]
    pub request_timeout: Duration,
    /// Largest request body accepted, bytes (413 beyond it).
    pub max_body_bytes: usize,
    /// Largest request line plus headers, bytes (431 beyond it).
    pub max_header_bytes: usize,
    /// Most request headers accepted (431 beyond it); at most 256.
    pub max_headers: usize,
    /// From the first byte of a request head to its end (`client_header_timeout_ms`); a
    /// client that takes longer is disconnected.
    #[serde(
        rename = "client_header_timeout_ms",
        with = "seckill_config::formats::millis"
    )]
    pub client_header_timeout: Duration,
    /// How long a client connection may stay idle between requests (or leave a response
    /// unread) (`client_idle_timeout_ms`).
    #[serde(
        rename = "client_idle_timeout_ms",
        with = "seckill_config::formats::millis"
    )]
    pub client_idle_timeout: Duration,
    /// Master switch of the per-user/per-IP rate limits.
    pub rate_limit_enabled: bool,
    /// `POST /api/seckill/{id}`: requests per second per user (per IP unauthenticated); 0: off.
    pub rate_purchase_per_sec: u32,
    /// `POST /api/seckill/{id}`: burst allowed on top of the rate; 0: off.
    pub rate_purchase_burst: u32,
    /// Every other proxied route: requests per second per user or IP; 0: off.
    pub rate_default_per_sec: u32,
    /// Every other proxied route: burst; 0: off.
    pub rate_default_burst: u32,
    /// Proxies whose `X-Forwarded-For` is believed, comma-separated IPs/CIDRs; empty: none.
    /// The rightmost entry not from a trusted proxy is the client.
    pub trusted_proxies: String,
    /// Where rate-limit buckets live: `memory` (each replica limits alone) or `redis` (one
    /// quota across replicas, in the Redis of `rate_limit_redis_url`, under `namespace`).
    pub rate_limit_backend: RateLimitBackend,
    /// With `redis`: how long a request waits for its check (`rate_limit_redis_timeout_ms`);
    /// one that takes longer is decided by `rate_limit_redis_failure`.
    #[serde(
        rename = "rate_limit_redis_timeout_ms",
        with = "seckill_config::formats::millis"
    )]
    pub rate_limit_redis_timeout: Duration,
    /// Redis of the `redis` backend: one URL, or with `redis_cluster` the seed URLs.
    pub redis_url: Secret,
    /// Whether `redis_url` names a Redis Cluster.
    pub redis_cluster: bool,
    /// Prefix of the gateway's Redis keys (shared with the backends: `SECKILL_NAMESPACE`).
    pub namespace: String,
    /// `json` or `pretty`.
    pub log_format: LogFormat,
    /// `EnvFilter` directive when `RUST_LOG` is unset.
    pub log_filter: String,
    /// Client connections open at once; past it a new one is answered 503 and closed.
    pub max_connections: usize,
    /// Client connections open at once from one TCP peer address (a trusted proxy is held
    /// to `max_connections` only); past it a new one is answered 503 and closed.
    pub max_connections_per_ip: usize,
    /// From a connection's accept to the first byte of its first request
    /// (`client_first_byte_timeout_ms`; the idle timeout when that is shorter); a silent
    /// connection is closed.
    #[serde(
        rename = "client_first_byte_timeout_ms",
        with = "seckill_config::formats::millis"
    )]
    pub client_first_byte_timeout: Duration,
    /// Purchases one verified user may have in flight at once; the next gets 429
    /// `too_many_purchases`.
    pub max_purchases_per_user: usize,
    /// How long the gateway answers a sold-out product's purchases `410` itself after a
    /// replica said so (`sold_out_ttl_ms`; see `crate::sold_out`): at most the replicas'
    /// own `sold_out_local_ttl_ms` (at most 500: `seckill_config::MAX_SOLD_OUT_MEMORY`),
    /// and forgotten at once when units go back on sale (announced on Redis pub/sub at
    /// `redis_url`). Purchases with an `Idempotency-Key` always go to a replica. 0: every
    /// purchase is forwarded.
    #[serde(rename = "sold_out_ttl_ms", with = "seckill_config::formats::millis")]
    pub sold_out_ttl: Duration,
    /// Development only: run even though a secret is its public default
    /// (`SECKILL_ALLOW_DEV_SECRETS`; see `seckill_config::refuse_public_secrets`).
    pub allow_dev_secrets: bool,
    /// Interface of the operator listener (`/metrics`, the detailed `/readyz`): loopback by
    /// default, so only the host (or a scraper beside it) reaches what they tell.
    pub admin_host: String,
    /// Port of the operator listener; 0 picks a free one (tests).
    pub admin_port: u16,
    /// Key of the identity signed for seckill-api
    /// (`SECKILL_GATEWAY_SECKILL_API_INTERNAL_KEY`); unset: `internal_key`. The backend
    /// then gets the same key as `SECKILL_API_INTERNAL_KEY`.
    pub seckill_api_internal_key: Option<Secret>,
    /// Key of the identity signed for order-service
    /// (`SECKILL_GATEWAY_ORDER_SERVICE_INTERNAL_KEY`); unset: `internal_key`. The backend
    /// then gets the same key as `SECKILL_ORDER_INTERNAL_KEY`.
    pub order_service_internal_key: Option<Secret>,
    /// Requests per second per client address whose bearer token this gateway has not yet
    /// verified, charged before the signature check (`rate_unverified_per_sec`; 429 beyond);
    /// 0: off. A verified token is remembered per worker thread and not charged again, but a
    /// load test minting thousands of fresh tokens from one address may need more.
    pub rate_unverified_per_sec: u32,
    /// Burst of `rate_unverified_per_sec`; 0: off.
    pub rate_unverified_burst: u32,
    /// IPv6 clients are charged per network of this many leading bits (1-128): one host
    /// usually holds a whole /64.
    pub rate_limit_ipv6_prefix: u8,
    /// Redis of the `redis` rate-limit backend; unset: `redis_url`.
    pub rate_limit_redis_url: Option<Secret>,
    /// With `redis`: what a request gets when Redis cannot answer in time — `open` (let
    /// through, unmetered) or `closed` (503 with `Retry-After: 1`; not 429: the client is
    /// not over its quota).
    pub rate_limit_redis_failure: RateLimitFailure,
    /// Key the waiting room's tickets and passes are signed with (at least 16 bytes; the
    /// same on every gateway replica); unset: derived from `internal_key`.
    pub room_key: Option<Secret>,
    /// How often each waiting room this gateway follows takes its admission step
    /// (`room_tick_ms`): how soon a poll sees the cursor move or the sale sell out.
    #[serde(rename = "room_tick_ms", with = "seckill_config::formats::millis")]
    pub room_tick: Duration,
    /// Buyers a waiting room admits per second at most: what the backends can take.
    pub room_admit_per_sec: u32,
    /// Admitted buyers allowed beyond the units left, for those who do not buy, in percent
    /// of the units left (at least one).
    pub room_margin_percent: u32,
    /// How long an admitted buyer's pass admits (`room_pass_ttl_ms`).
    #[serde(rename = "room_pass_ttl_ms", with = "seckill_config::formats::millis")]
    pub room_pass_ttl: Duration,
    /// After this long an admitted buyer who has not bought may be one who will not
    /// (`room_no_show_ms`): only then does `room_margin_percent` admit others meanwhile.
    #[serde(rename = "room_no_show_ms", with = "seckill_config::formats::millis")]
    pub room_no_show: Duration,
    /// Polls per second the waiting buyers of one room are paced to, all together: the
    /// pause each is told grows with the crowd.
    pub room_polls_per_sec: u32,
    /// Proof-of-work on joining a waiting room: the difficulty (leading zero bits of a
    /// SHA-256) asked while the room's join rate is below `room_pow_rate`; 0: no proof until
    /// then. Only with `room_pow_max_bits` above 0.
    pub room_pow_min_bits: u32,
    /// The most difficulty the proof-of-work on joining may reach (at most 32, at least
    /// `room_pow_min_bits`); 0, the default: no proof-of-work at all.
    pub room_pow_max_bits: u32,
    /// Joins per second of one room (all gateways together) from which the proof-of-work's
    /// difficulty rises: one bit above `room_pow_min_bits` at this rate, one more at each
    /// doubling of it.
    pub room_pow_rate: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            host: "0.0.0.0".into(),
            port: 8080,
            workers: 0,
            jwt_algorithm: JwtAlgorithm::HS256,
            jwt_secret: DEV_JWT_SECRET.into(),
            jwt_public_key_pem: String::new(),
            jwt_public_key_file: String::new(),
            jwt_issuers: Vec::new(),
            jwt_audiences: Vec::new(),
            jwt_leeway_secs: 5,
            jwt_cache_entries: 10_000,
            internal_key: DEV_INTERNAL_KEY.into(),
            seckill_api_urls: vec!["http://127.0.0.1:8081".into()],
            order_service_urls: vec!["http://127.0.0.1:8082".into()],
            upstream_eject: Duration::from_secs(5),
            upstream_connect_timeout: Duration::from_secs(2),
            upstream_idle_timeout: Duration::from_secs(60),
            upstream_request_timeout: Duration::from_secs(8),
            // A replica added or restarted gets traffic within 2 s; a lookup per name every
            // 2 s is nothing to Docker's embedded DNS or a local resolver.
            upstream_resolve_interval: Duration::from_secs(2),
            dns_server: String::new(),
            max_in_flight: 4096,
            request_timeout: Duration::from_secs(10),
            max_body_bytes: 64 * 1024,
            // Above the 20 kB request ids a hostile client may send (they are replaced, not
            // refused); the read buffer of a connection grows at most to this while a head
            // arrives.
            max_header_bytes: 32 * 1024,
            max_headers: 100,
            client_header_timeout: Duration::from_secs(30),
            client_idle_timeout: Duration::from_secs(60),
            rate_limit_enabled: true,
            // High enough that the load test (one purchase per user) and wrk's repeat
            // purchases are never throttled; they stop a single client's flood.
            rate_purchase_per_sec: 20,
            rate_purchase_burst: 40,
            rate_default_per_sec: 100,
            rate_default_burst: 200,
            trusted_proxies: String::new(),
            rate_limit_backend: RateLimitBackend::Memory,
            rate_limit_redis_timeout: Duration::from_millis(100),
            redis_url: "redis://127.0.0.1:6379".into(),
            redis_cluster: false,
            namespace: "seckill".into(),
            log_format: LogFormat::Json,
            log_filter: "info".into(),
            max_connections: 10_000,
            // The load test's 256 purchases in flight and its result polls come from one
            // address; a browser opens six per host, a NAT of a few hundred users more.
            max_connections_per_ip: 512,
            client_first_byte_timeout: Duration::from_secs(10),
            max_purchases_per_user: 2,
            // seckill-api's `sold_out_local_ttl_ms`: the edge holds a sold-out answer no
            // longer than a replica's own flag does.
            sold_out_ttl: Duration::from_millis(500),
            allow_dev_secrets: false,
            admin_host: "127.0.0.1".into(),
            admin_port: 9080,
            seckill_api_internal_key: None,
            order_service_internal_key: None,
            // Far above what one address sends with real tokens (each is verified once per
            // worker thread, then remembered); a garbage-token flood costs at most this.
            rate_unverified_per_sec: 1000,
            rate_unverified_burst: 2000,
            rate_limit_ipv6_prefix: 64,
            rate_limit_redis_url: None,
            room_key: None,
            room_tick: Duration::from_millis(100),
            room_admit_per_sec: 500,
            room_margin_percent: 10,
            room_pass_ttl: Duration::from_secs(60),
            room_no_show: Duration::from_secs(10),
            room_polls_per_sec: 20_000,
            room_pow_min_bits: 0,
            room_pow_max_bits: 0,
            room_pow_rate: 1000,
            rate_limit_redis_failure: RateLimitFailure::Open,
        }
    }
}

impl Settings {
    /// How many threads serve connections: `workers`, or one per available core.
    pub fn worker_threads(&self) -> NonZeroUsize {
        NonZeroUsize::new(self.workers)
            .or_else(|| std::thread::available_parallelism().ok())
            .unwrap_or(NonZeroUsize::MIN)
    }

    /// The parsed `trusted_proxies`.
    pub fn trusted_proxy_list(&self) -> Result<TrustedProxies, String> {
        TrustedProxies::parse(&self.trusted_proxies)
    }

    /// The key identity is signed with for `service`: its own, else `internal_key`.
    pub fn service_key(&self, service: Service) -> &Secret {
        let own = match service {
            Service::SeckillApi => &self.seckill_api_internal_key,
            Service::OrderService => &self.order_service_internal_key,
        };
        own.as_ref().unwrap_or(&self.internal_key)
    }

    /// Stops the gateway on a public development secret unless `allow_dev_secrets`; returns
    /// the variables still on one (allowed), for a warning. A public-key algorithm never
    /// reads the HMAC secret, so its default is harmless there.
    pub fn refuse_public_secrets(&self) -> Result<Vec<&str>, ConfigError> {
        let mut secrets: Vec<SecretCheck<'_>> = Vec::with_capacity(2);
        if self.jwt_algorithm == JwtAlgorithm::HS256 {
            secrets.push(("SECKILL_JWT_SECRET", &self.jwt_secret, DEV_JWT_SECRET));
        }
        secrets.push(("SECKILL_INTERNAL_KEY", &self.internal_key, DEV_INTERNAL_KEY));
        seckill_config::refuse_public_secrets(&secrets, self.allow_dev_secrets)
    }

    /// What resolves the upstream host names: `dns_server`, else the system resolver.
    pub fn resolver(&self) -> Result<Arc<dyn Resolve>, String> {
        let server = self.dns_server.trim();
        if server.is_empty() {
            return Ok(Arc::new(SystemResolver));
        }
        let server: SocketAddr = server
            .parse()
            .map_err(|_| format!("dns_server {server:?} must be an ip:port address"))?;
        Ok(Arc::new(DnsServer::new(server, Duration::from_secs(1))))
    }

    fn validate_jwt(&self) -> Result<(), String> {
        // Clock skew, not a lifetime: beyond an hour it is a mistake, and beyond the epoch's
        // age jsonwebtoken's own arithmetic on it overflows.
        if self.jwt_leeway_secs > MAX_JWT_LEEWAY_SECS {
            return Err(format!(
                "jwt_leeway_secs must be at most {MAX_JWT_LEEWAY_SECS} (clock skew, seconds)"
            ));
        }
        if self.jwt_algorithm == JwtAlgorithm::HS256 {
            if self.jwt_secret.expose().len() < 16 {
                return Err("jwt_secret must be at least 16 bytes".into());
            }
            return Ok(());
        }
        match (
            self.jwt_public_key_pem.trim().is_empty(),
            self.jwt_public_key_file.trim().is_empty(),
        ) {
            (false, false) => Err("set jwt_public_key_pem or jwt_public_key_file, not both".into()),
            (true, true) => Err(format!(
                "jwt_algorithm {:?} needs jwt_public_key_pem or jwt_public_key_file",
                self.jwt_algorithm
            )),
            _ => Ok(()),
        }
    }
}

/// The most clock skew `jwt_leeway_secs` may tolerate.
const MAX_JWT_LEEWAY_SECS: u64 = 3600;

/// The fastest quota a bucket can express: one request per microsecond.
const MAX_RATE_PER_SEC: u32 = 1_000_000;

impl Validate for Settings {
    fn validate(&self) -> Result<(), String> {
        self.validate_jwt()?;
        for url in self.seckill_api_urls.iter().chain(&self.order_service_urls) {
            if crate::proxy::upstream::base_authority(url).is_none() {
                return Err(format!(
                    "upstream {url:?} must be an http://host[:port] URL"
                ));
            }
        }
        if self.seckill_api_urls.is_empty() || self.order_service_urls.is_empty() {
            return Err("at least one upstream per route is required".into());
        }
        if self.max_in_flight == 0 || self.request_timeout.is_zero() {
            return Err("max_in_flight and request_timeout_ms must be positive".into());
        }
        if self.upstream_connect_timeout.is_zero() || self.upstream_request_timeout.is_zero() {
            return Err("upstream timeouts must be positive".into());
        }
        // Below these even an ordinary browser request would be refused.
        if self.max_header_bytes < 1024 || self.max_headers < 16 {
            return Err("max_header_bytes must be >= 1024 and max_headers >= 16".into());
        }
        if self.max_headers > MAX_HEADERS_CAP {
            return Err(format!("max_headers must be at most {MAX_HEADERS_CAP}"));
        }
        if self.client_header_timeout.is_zero() || self.client_idle_timeout.is_zero() {
            return Err(
                "client_header_timeout_ms and client_idle_timeout_ms must be positive".into(),
            );
        }
        self.trusted_proxy_list()?;
        self.resolver()?;
        // Buckets count time in microseconds: a faster rate would be a zero interval.
        if self.rate_purchase_per_sec > MAX_RATE_PER_SEC
            || self.rate_default_per_sec > MAX_RATE_PER_SEC
        {
            return Err(format!(
                "rate_purchase_per_sec and rate_default_per_sec must be at most {MAX_RATE_PER_SEC}"
            ));
        }
        if self.rate_limit_backend == RateLimitBackend::Redis {
            validate_namespace(&self.namespace)?;
            if self.rate_limit_redis_timeout.is_zero() {
                return Err("rate_limit_redis_timeout_ms must be positive".into());
            }
        }
        for service in [Service::SeckillApi, Service::OrderService] {
            // An HMAC key shorter than this is guessable offline from one captured request.
            if self.service_key(service).expose().len() < 16 {
                return Err(format!(
                    "the internal key for {} must be at least 16 bytes",
                    service.name()
                ));
            }
        }
        if !(1..=128).contains(&self.rate_limit_ipv6_prefix) {
            return Err("rate_limit_ipv6_prefix must be 1 to 128".into());
        }
        if self.rate_unverified_per_sec > MAX_RATE_PER_SEC {
            return Err(format!(
                "rate_unverified_per_sec must be at most {MAX_RATE_PER_SEC}"
            ));
        }
        if self.sold_out_ttl > seckill_config::MAX_SOLD_OUT_MEMORY {
            return Err(format!(
                "sold_out_ttl_ms must be at most {} (how long a unit put back on sale may \
                 still be answered sold out)",
                seckill_config::MAX_SOLD_OUT_MEMORY.as_millis()
            ));
        }
        if self.admin_host.trim().is_empty() {
            return Err("admin_host must name an interface".into());
        }
        self.validate_room()?;
        self.validate_connection_limits()?;
        Ok(())
    }
}

impl Settings {
    fn validate_room(&self) -> Result<(), String> {
        if self
            .room_key
            .as_ref()
            .is_some_and(|k| k.expose().len() < 16)
        {
            return Err("room_key must be at least 16 bytes".into());
        }
        if self.room_tick.is_zero() || self.room_tick > Duration::from_secs(1) {
            return Err("room_tick_ms must be 1 to 1000 (a sell-out is seen within it)".into());
        }
        if self.room_admit_per_sec == 0 || self.room_polls_per_sec == 0 {
            return Err("room_admit_per_sec and room_polls_per_sec must be positive".into());
        }
        if self.room_margin_percent > 100 {
            return Err("room_margin_percent must be at most 100".into());
        }
        if self.room_no_show.is_zero() || self.room_no_show > self.room_pass_ttl {
            return Err("room_no_show_ms must be positive and at most room_pass_ttl_ms".into());
        }
        if self.room_pow_max_bits > 32 {
            return Err("room_pow_max_bits must be at most 32".into());
        }
        if self.room_pow_min_bits > self.room_pow_max_bits {
            return Err(
                "room_pow_min_bits must be at most room_pow_max_bits (0: proof-of-work off)".into(),
            );
        }
        if self.room_pow_rate == 0 {
            return Err("room_pow_rate must be positive".into());
        }
        Ok(())
    }

    /// The key of the waiting room's tickets and passes.
    pub fn room_key(&self) -> crate::room::RoomKey {
        match &self.room_key {
            Some(key) => crate::room::RoomKey::new(key.expose().as_bytes()),
            None => crate::room::RoomKey::derived_from(self.internal_key.expose().as_bytes()),
        }
    }

    /// The waiting room's settings.
    pub fn room_settings(&self) -> crate::room::RoomSettings {
        crate::room::RoomSettings {
            tick: self.room_tick,
            pacing: crate::room::Pacing {
                admit_per_sec: self.room_admit_per_sec,
                polls_per_sec: self.room_polls_per_sec,
                pass_ttl_ms: i64::try_from(self.room_pass_ttl.as_millis()).unwrap_or(i64::MAX),
            },
            margin_percent: self.room_margin_percent,
            no_show: self.room_no_show,
            pow: crate::room::PowSettings {
                min_bits: self.room_pow_min_bits,
                max_bits: self.room_pow_max_bits,
                rate: self.room_pow_rate,
            },
        }
    }

    fn validate_connection_limits(&self) -> Result<(), String> {
        if self.max_connections == 0 || self.max_connections_per_ip == 0 {
            return Err("max_connections and max_connections_per_ip must be positive".into());
        }
        if self.max_connections_per_ip > self.max_connections {
            return Err("max_connections_per_ip must be at most max_connections".into());
        }
        if self.client_first_byte_timeout.is_zero() {
            return Err("client_first_byte_timeout_ms must be positive".into());
        }
        if self.max_purchases_per_user == 0 {
            return Err("max_purchases_per_user must be positive".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid() {
        assert_eq!(Settings::default().validate(), Ok(()));
    }

    #[test]
    fn a_public_key_algorithm_needs_exactly_one_key_source() {
        let rs256 = Settings {
            jwt_algorithm: JwtAlgorithm::RS256,
            ..Settings::default()
        };
        assert!(rs256.validate().is_err());
        let inline = Settings {
            jwt_public_key_pem: "-----BEGIN PUBLIC KEY-----".into(),
            ..rs256.clone()
        };
        assert_eq!(inline.validate(), Ok(()));
        let both = Settings {
            jwt_public_key_file: "/etc/key.pem".into(),
            ..inline
        };
        assert!(both.validate().is_err());
    }

    #[test]
    fn a_leeway_beyond_an_hour_is_refused() {
        let hour = Settings {
            jwt_leeway_secs: MAX_JWT_LEEWAY_SECS,
            ..Settings::default()
        };
        assert_eq!(hour.validate(), Ok(()));
        let more = Settings {
            jwt_leeway_secs: MAX_JWT_LEEWAY_SECS + 1,
            ..hour
        };
        assert!(more.validate().is_err());
    }

    #[test]
    fn a_bad_trusted_proxy_or_header_limit_is_refused() {
        let bad_proxy = Settings {
            trusted_proxies: "10.0.0.0/8, nope".into(),
            ..Settings::default()
        };
        assert!(bad_proxy.validate().is_err());
        for out_of_range in [
            Settings {
                max_header_bytes: 100,
                ..Settings::default()
            },
            Settings {
                max_headers: MAX_HEADERS_CAP + 1,
                ..Settings::default()
            },
            Settings {
                client_idle_timeout: Duration::ZERO,
                ..Settings::default()
            },
        ] {
            assert!(out_of_range.validate().is_err());
        }
    }

    #[test]
    fn a_rate_beyond_one_per_microsecond_is_refused_not_a_panic_at_start() {
        let fastest = Settings {
            rate_purchase_per_sec: MAX_RATE_PER_SEC,
            rate_default_per_sec: MAX_RATE_PER_SEC,
            ..Settings::default()
        };
        assert_eq!(fastest.validate(), Ok(()));
        for too_fast in [
            Settings {
                rate_purchase_per_sec: MAX_RATE_PER_SEC + 1,
                ..Settings::default()
            },
            Settings {
                rate_default_per_sec: u32::MAX,
                ..Settings::default()
            },
        ] {
            assert!(too_fast.validate().is_err());
        }
    }

    #[test]
    fn a_sold_out_memory_beyond_500_ms_is_refused() {
        let with = |ms| Settings {
            sold_out_ttl: Duration::from_millis(ms),
            ..Settings::default()
        };
        assert_eq!(with(0).validate(), Ok(()));
        assert_eq!(with(500).validate(), Ok(()));
        let refused = with(501).validate().expect_err("501 ms is past the bound");
        assert!(refused.contains("sold_out_ttl_ms"), "{refused}");
        assert!(with(600_000).validate().is_err());
    }

    #[test]
    fn proof_of_work_bits_out_of_range_are_refused() {
        let pow = |min, max| Settings {
            room_pow_min_bits: min,
            room_pow_max_bits: max,
            ..Settings::default()
        };
        assert_eq!(pow(0, 0).validate(), Ok(()));
        assert_eq!(pow(0, 24).validate(), Ok(()));
        assert_eq!(pow(32, 32).validate(), Ok(()));
        assert!(!pow(0, 0).room_settings().pow.is_on(), "off by default");
        let min_over_max = pow(8, 0).validate().expect_err("min above max");
        assert!(min_over_max.contains("room_pow_min_bits"), "{min_over_max}");
        assert!(pow(0, 33).validate().is_err());
        let no_rate = Settings {
            room_pow_rate: 0,
            ..pow(0, 24)
        };
        assert!(no_rate.validate().is_err());
    }

    #[test]
    fn connection_limits_out_of_range_are_refused() {
        for out_of_range in [
            Settings {
                max_connections_per_ip: 0,
                ..Settings::default()
            },
            Settings {
                max_connections: 100,
                ..Settings::default()
            },
            Settings {
                client_first_byte_timeout: Duration::ZERO,
                ..Settings::default()
            },
            Settings {
                max_purchases_per_user: 0,
                ..Settings::default()
            },
        ] {
            assert!(out_of_range.validate().is_err());
        }
    }
}
