//! The waiting room's routes in the API contract (`docs/openapi.json`): the gateway answers
//! them itself ([`super::Rooms::respond`], [`super::Rooms::purchase`]); these functions only
//! carry their descriptions.

use seckill_http::ErrorBody;

use super::view::State;

/// The answer to a join or a poll.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct RoomAnswer {
    /// The buyer's ticket: present on a join's answer; poll with it.
    #[schema(example = "12.1700000000123.0f1e2d3c4b5a69788796a5b4c3d2e1f0")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ticket: Option<String>,
    /// `waiting`, `admitted`, `expired` (admitted, the pass ran out unused), `sold_out` or
    /// `closed`.
    pub state: State,
    /// The buyer's place in line (order of arrival), from 0.
    pub place: u64,
    /// In a raffle once drawn: the buyer's rank in the drawn order, from 0 (admission
    /// follows it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u64>,
    /// Buyers ahead not admitted yet; `null` in a raffle before its draw.
    pub ahead: Option<u64>,
    /// Estimated wait until admission, ms (0 unless waiting).
    pub wait_ms: u64,
    /// When to poll again, ms (also `Retry-After`, in seconds): the gateway paces polling.
    pub poll_after_ms: u64,
    /// The sale's start, unix ms.
    pub starts_at_ms: i64,
    /// When admitted: the buyer's own purchase path, `/api/seckill/{product_id}/{pass}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub purchase_path: Option<String>,
    /// When admitted: until when the pass admits, unix ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass_expires_at_ms: Option<i64>,
}

/// A raffle's draw, as published (`GET /api/rooms/{product_id}/draw`).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct DrawAnswer<'a> {
    /// SHA-256 of the seed's text, lower-case hex: published from the room's creation on.
    #[schema(example = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")]
    pub commitment: String,
    /// When entry closes and the seed is revealed: the sale's start, unix ms.
    pub closes_at_ms: i64,
    /// Once closed: the places `0..entries` take part in the draw.
    pub entries: Option<u64>,
    /// Once closed: the seed (64 hex digits). The rank of place `p` is the index of
    /// SHA-256(`seed` + ":" + `p`) among the entries' keys in ascending order; later places
    /// follow in arrival order.
    pub seed: Option<String>,
    /// Once closed: the user of each entry, by place (`0` where a ticket was lost).
    pub tickets: Option<&'a [i64]>,
}

/// `GET /api/rooms/{product_id}/draw`.
#[utoipa::path(
    get,
    path = "/api/rooms/{product_id}/draw",
    operation_id = "raffle_draw",
    tag = "waiting room",
    summary = "A raffle's draw: its commitment, then its seed and entries",
    description = "Before the sale's start, the SHA-256 of the seed the draw will use; from \
        the start on, the seed itself, the number of entries and who holds each: anyone can \
        re-derive the order of admission from them.",
    params(("product_id" = i64, Path, description = "The product on sale.")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The draw as published so far.", body = DrawAnswer<'_>),
        (status = 404, description = "`no_waiting_room`: the product has no waiting room on; \
            `no_draw`: its room admits in order of arrival.", body = ErrorBody),
        (status = 503, description = "`unavailable`: the room's Redis did not answer, or its \
            seed is not set up yet (retry after `Retry-After`).", body = ErrorBody),
    ),
)]
pub fn draw() {}

/// A proof-of-work challenge (`GET /api/rooms/{product_id}/challenge`, and in the
/// refusals of a join without a proof that holds).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ChallengeAnswer {
    /// The challenge: `<issued_ms>.<bits>.<mac>`, signed for the caller and this sale.
    #[schema(example = "1700000000456.12.0f1e2d3c4b5a69788796a5b4c3d2e1f0")]
    pub challenge: String,
    /// Leading zero bits SHA-256(`challenge` `:` `nonce`) must have; 0: no proof needed
    /// right now.
    pub bits: u32,
    /// Until when a join may use it, unix ms (60 s after its issue).
    pub expires_at_ms: i64,
}

/// The refusal of a join whose proof-of-work is missing or does not hold: the contract's
/// error body with a fresh challenge, so that the client needs no other request.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct PowRefusal {
    /// `proof_of_work_required`, `invalid_proof_of_work` or `proof_of_work_expired`.
    pub code: &'static str,
    /// For people.
    pub message: &'static str,
    /// A fresh challenge for the caller: `<issued_ms>.<bits>.<mac>`.
    pub challenge: String,
    /// Its bits: the room's difficulty now.
    pub bits: u32,
    /// Until when a join may use it, unix ms.
    pub expires_at_ms: i64,
}

/// A join's optional body: the solution of a challenge.
#[derive(Debug, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema)]
pub struct JoinProof {
    /// The challenge, as given.
    pub challenge: String,
    /// A decimal `u64` (a string: no client loses digits) such that
    /// SHA-256(`challenge` `:` `nonce`) starts with the challenge's bits of zeros.
    #[schema(example = "48213")]
    pub nonce: String,
}

impl JoinProof {
    /// The proof in a join's `body`: `None` when the body is empty (or `{}`, `null`); a message for
    /// the `400` when it is not the contract's JSON.
    pub fn parse(body: &[u8]) -> Result<Option<Self>, &'static str> {
        #[derive(serde::Deserialize)]
        struct Fields {
            challenge: Option<String>,
            nonce: Option<String>,
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        const SHAPE: &str =
            "a join's body is optional; when sent: {\"challenge\": string, \"nonce\": string}";
        // `null` is no proof, as no body is.
        let fields: Option<Fields> = serde_json::from_slice(body).map_err(|_| SHAPE)?;
        let Some(fields) = fields else {
            return Ok(None);
        };
        match (fields.challenge, fields.nonce) {
            (None, None) => Ok(None),
            (Some(challenge), Some(nonce)) => Ok(Some(Self { challenge, nonce })),
            _ => Err(SHAPE),
        }
    }
}

/// `POST /api/rooms/{product_id}/join`.
#[utoipa::path(
    post,
    path = "/api/rooms/{product_id}/join",
    operation_id = "join_waiting_room",
    tag = "waiting room",
    summary = "Join a sale's waiting room",
    description = "One place per user per product: joining again returns the same place. \
        The answer carries the signed ticket to poll with. While the gateway asks for a \
        proof-of-work (its difficulty rises with the room's join rate), a join, a rejoin \
        too, carries the solution of a challenge: from `GET /api/rooms/{product_id}/challenge` \
        or from the `428`/`403` that refused a join without it.",
    params(("product_id" = i64, Path, description = "The product on sale.")),
    request_body(content = Option<JoinProof>, description = "Optional: the proof-of-work.",
        content_type = "application/json"),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The ticket and the buyer's state.", body = RoomAnswer,
            headers(("Retry-After" = String, description = "Seconds until the next poll."))),
        (status = 400, description = "`invalid_request`: a body that is not \
            `{\"challenge\", \"nonce\"}`.", body = ErrorBody),
        (status = 403, description = "`invalid_proof_of_work`: a challenge not the caller's \
            for this sale, below the least difficulty, or a nonce that does not solve it; \
            `proof_of_work_expired`: a \
            challenge older than 60 s. A fresh challenge comes with it.", body = PowRefusal),
        (status = 404, description = "`no_waiting_room`: the product has no waiting room on.",
            body = ErrorBody),
        (status = 410, description = "`closed`: the sale has ended.", body = ErrorBody),
        (status = 428, description = "`proof_of_work_required`: joining takes a proof-of-work \
            right now; solve the challenge that comes with it and join again.",
            body = PowRefusal),
    ),
)]
pub fn join() {}

/// `GET /api/rooms/{product_id}/challenge`.
#[utoipa::path(
    get,
    path = "/api/rooms/{product_id}/challenge",
    operation_id = "waiting_room_challenge",
    tag = "waiting room",
    summary = "A proof-of-work challenge for joining",
    description = "Signed for the caller and this sale, at the room's current difficulty \
        (0 bits while no proof is asked), good for 60 s. Stateless: any gateway verifies it.",
    params(("product_id" = i64, Path, description = "The product on sale.")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The challenge.", body = ChallengeAnswer),
        (status = 404, description = "`no_waiting_room`: the product has no waiting room on.",
            body = ErrorBody),
    ),
)]
pub fn challenge() {}

/// `GET /api/rooms/{product_id}/tickets/{ticket}`.
#[utoipa::path(
    get,
    path = "/api/rooms/{product_id}/tickets/{ticket}",
    operation_id = "poll_waiting_room",
    tag = "waiting room",
    summary = "A buyer's state in a waiting room",
    description = "Answered from the gateway's memory of the room (no backend, no Redis). \
        Poll again after `poll_after_ms`; when admitted, buy at `purchase_path`.",
    params(
        ("product_id" = i64, Path, description = "The product on sale."),
        ("ticket" = String, Path, description = "The ticket the join answered."),
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The buyer's state.", body = RoomAnswer,
            headers(("Retry-After" = String, description = "Seconds until the next poll."))),
        (status = 403, description = "`invalid_ticket`: not the caller's ticket for this sale.",
            body = ErrorBody),
        (status = 404, description = "`no_waiting_room`: the product has no waiting room on.",
            body = ErrorBody),
    ),
)]
pub fn poll() {}

/// `POST /api/seckill/{product_id}/{pass}`.
#[utoipa::path(
    post,
    path = "/api/seckill/{product_id}/{pass}",
    operation_id = "purchase_with_pass",
    tag = "purchases",
    summary = "Buy one unit of a queued sale, admitted",
    description = "The path an admitted poll gave (`purchase_path`): the gateway checks the \
        pass and forwards the purchase; the answers are then the purchase's.",
    params(
        ("product_id" = i64, Path, description = "The product on sale."),
        ("pass" = String, Path, description = "The pass from the admitted poll."),
        ("Idempotency-Key" = Option<String>, Header,
            description = "Retries with the same key get the first attempt's answer."),
    ),
    responses(
        (status = 202, description = "Accepted and queued: the body of \
            `POST /api/seckill/{product_id}`'s 202."),
        (status = 400, description = "`invalid_request`: a malformed request.", body = ErrorBody),
        (status = 403, description = "`invalid_pass`: not the caller's pass for this sale; \
            `pass_expired`: the turn has passed.", body = ErrorBody),
        (status = 404, description = "`product_not_found`.", body = ErrorBody),
        (status = 409, description = "`already_purchased`.", body = ErrorBody),
        (status = 410, description = "`sold_out`.", body = ErrorBody),
        (status = 422, description = "`activity_not_active`: outside the sale window.",
            body = ErrorBody),
    ),
)]
pub fn purchase_with_pass() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_join_body_is_nothing_or_a_challenge_with_its_nonce() {
        assert_eq!(JoinProof::parse(b""), Ok(None));
        assert_eq!(JoinProof::parse(b" \r\n"), Ok(None));
        assert_eq!(JoinProof::parse(b"{}"), Ok(None));
        assert_eq!(JoinProof::parse(b"null"), Ok(None));
        assert_eq!(
            JoinProof::parse(br#"{"challenge":"1.2.ab","nonce":"7","extra":1}"#),
            Ok(Some(JoinProof {
                challenge: "1.2.ab".into(),
                nonce: "7".into()
            }))
        );
        for body in [
            &br#"{"challenge":"1.2.ab"}"#[..],
            br#"{"nonce":"7"}"#,
            br#"{"challenge":"1.2.ab","nonce":7}"#,
            br#""text""#,
            b"{",
            b"\xff",
        ] {
            assert!(
                JoinProof::parse(body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
