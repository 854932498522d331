//! The names of the gateway's own metrics, in one place (docs/metrics.md lists every metric
//! with its labels and meaning, and which alert or panel reads it). The request metrics
//! every service shares are named in `seckill_http::request_metrics`.

/// Refused tokens and non-admins on admin routes, by `reason`.
pub const AUTH_FAILURES: &str = "gateway_auth_failures_total";
/// Tokens verified.
pub const TOKEN_VERIFICATIONS: &str = "gateway_token_verifications_total";
/// Requests refused by the rate limit, by `route`.
pub const RATE_LIMITED: &str = "gateway_rate_limited_total";
/// Failures of the shared rate-limit store, by `error`.
pub const RATE_LIMIT_BACKEND_ERRORS: &str = "gateway_rate_limit_backend_errors_total";
/// Purchases refused because the user has too many under way.
pub const PURCHASES_REFUSED: &str = "gateway_purchases_refused_total";
/// Requests shed at the in-flight bound.
pub const SHED: &str = "gateway_shed_total";
/// Purchases of a sold-out product answered `410` by the gateway itself.
pub const SOLD_OUT_ANSWERS: &str = "gateway_sold_out_answers_total";
/// 1 while subscribed to the announcements of units going back on sale.
pub const SOLD_OUT_FOLLOWING: &str = "gateway_sold_out_following";
/// Requests that ran out of time.
pub const TIMEOUTS: &str = "gateway_timeouts_total";
/// Client connections closed by the gateway, by `reason`.
pub const CONNECTIONS_CLOSED: &str = "gateway_connections_closed_total";
/// Client connections refused, by `reason`.
pub const CONNECTIONS_REFUSED: &str = "gateway_connections_refused_total";
/// Failed forwards, by `upstream` and more.
pub const UPSTREAM_ERRORS: &str = "gateway_upstream_errors_total";
/// Upstream replicas ejected, by `upstream` and more.
pub const UPSTREAM_EJECTIONS: &str = "gateway_upstream_ejections_total";
/// Re-resolutions of an upstream's host name, by `upstream` and `outcome`.
pub const UPSTREAM_RESOLUTIONS: &str = "gateway_upstream_resolutions_total";
/// Addresses an upstream's host name resolved to, by `upstream`.
pub const UPSTREAM_ADDRESSES: &str = "gateway_upstream_addresses";

/// Tickets handed out or handed again by `POST /api/rooms/{id}/join`.
pub const ROOM_JOINS: &str = "gateway_room_joins_total";
/// Answers to joins and polls of a waiting room, by the buyer's `state`.
pub const ROOM_POLLS: &str = "gateway_room_polls_total";
/// Purchases of a queued sale refused, by `reason` (`no_pass`, `invalid_pass`,
/// `pass_expired`).
pub const ROOM_REFUSED: &str = "gateway_room_refused_total";
/// Purchases with a pass that seckill-api accepted (`202`).
pub const ROOM_BOUGHT: &str = "gateway_room_bought_total";
/// Waiting-room steps and requests Redis did not answer.
pub const ROOM_ERRORS: &str = "gateway_room_errors_total";
/// Tickets handed out, by `product` (as of this gateway's last admission step).
pub const ROOM_JOINED: &str = "gateway_room_joined";
/// Places admitted, by `product`: its rate is the admission rate.
pub const ROOM_ADMITTED: &str = "gateway_room_admitted";
/// Admitted buyers whose pass is still good and who have not bought, by `product`.
pub const ROOM_OUTSTANDING: &str = "gateway_room_admitted_not_bought";
/// The admissions per second a room's last step credited, by `product`.
pub const ROOM_ADMIT_RATE: &str = "gateway_room_admit_rate";
/// Purchases with a pass the backends could not take (`502`, `503`, `504`).
pub const ROOM_PUSHBACK: &str = "gateway_room_pushback_total";

/// Joins refused for their proof-of-work, by `reason` (`missing`, `invalid`, `expired`).
pub const ROOM_POW_FAILURES: &str = "gateway_room_pow_failures_total";
/// The proof-of-work's difficulty asked of a join, in bits, by `product`.
pub const ROOM_POW_BITS: &str = "gateway_room_pow_bits";

/// Every name above.
pub const ALL: [&str; 27] = [
    AUTH_FAILURES,
    TOKEN_VERIFICATIONS,
    RATE_LIMITED,
    RATE_LIMIT_BACKEND_ERRORS,
    PURCHASES_REFUSED,
    SHED,
    SOLD_OUT_ANSWERS,
    SOLD_OUT_FOLLOWING,
    TIMEOUTS,
    CONNECTIONS_CLOSED,
    CONNECTIONS_REFUSED,
    UPSTREAM_ERRORS,
    UPSTREAM_EJECTIONS,
    UPSTREAM_RESOLUTIONS,
    UPSTREAM_ADDRESSES,
    ROOM_JOINS,
    ROOM_POLLS,
    ROOM_REFUSED,
    ROOM_BOUGHT,
    ROOM_ERRORS,
    ROOM_JOINED,
    ROOM_ADMITTED,
    ROOM_OUTSTANDING,
    ROOM_ADMIT_RATE,
    ROOM_PUSHBACK,
    ROOM_POW_FAILURES,
    ROOM_POW_BITS,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gateway_metric_is_listed_in_the_metrics_docs() {
        let docs = include_str!("../../docs/metrics.md");
        for name in ALL {
            assert!(
                docs.contains(&format!("| `{name}` |")),
                "{name} is not in docs/metrics.md"
            );
        }
    }
}
