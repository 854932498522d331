//! The buyer-visible purchase result, stored as short text in the product's results hash.

/// Where a buyer's purchase stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurchaseResult {
    /// Accepted by seckill-api; the order is on its way.
    Queued {
        /// The purchase's request id.
        request_id: String,
    },
    /// The order exists in Postgres.
    Success {
        /// The order's id.
        order_id: i64,
    },
    /// The purchase was given up; its unit went back on sale.
    Failed {
        /// Why, in snake_case.
        reason: String,
    },
}

impl PurchaseResult {
    /// The stored text, e.g. `success:42`.
    pub fn encode(&self) -> String {
        match self {
            Self::Queued { request_id } => format!("queued:{request_id}"),
            Self::Success { order_id } => format!("success:{order_id}"),
            Self::Failed { reason } => format!("failed:{reason}"),
        }
    }

    /// Parses stored text; unknown text is `None`.
    pub fn decode(text: &str) -> Option<Self> {
        let (kind, value) = text.split_once(':')?;
        match kind {
            "queued" => Some(Self::Queued {
                request_id: value.to_string(),
            }),
            "success" => value
                .parse()
                .ok()
                .map(|order_id| Self::Success { order_id }),
            "failed" => Some(Self::Failed {
                reason: value.to_string(),
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_result_round_trips() {
        for result in [
            PurchaseResult::Queued {
                request_id: "abc".into(),
            },
            PurchaseResult::Success { order_id: 12 },
            PurchaseResult::Failed {
                reason: "sold_out".into(),
            },
        ] {
            assert_eq!(PurchaseResult::decode(&result.encode()), Some(result));
        }
        assert_eq!(PurchaseResult::decode("nonsense"), None);
    }
}
