//! Which entries an operator's action applies to, what it did, and why it failed.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Which entries an action applies to. An action needs at least one of ids, product or a
/// time bound, so "everything" is never selected by accident.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = DeadLetterSelection)]
pub struct Selection {
    /// These entries.
    #[serde(default)]
    pub ids: Vec<String>,
    /// Entries of this product.
    pub product_id: Option<i64>,
    /// First dead-lettered at or after this instant.
    pub from: Option<DateTime<Utc>>,
    /// First dead-lettered before this instant.
    pub to: Option<DateTime<Utc>>,
    /// Most entries to act on (default and cap: [`MAX_SELECTION`]).
    pub limit: Option<i64>,
    /// Only report what would be done.
    #[serde(default)]
    pub dry_run: bool,
}

/// Most entries one action or listing touches.
pub const MAX_SELECTION: i64 = 10_000;

impl Selection {
    /// Whether the selection names something.
    pub fn is_bounded(&self) -> bool {
        !self.ids.is_empty()
            || self.product_id.is_some()
            || self.from.is_some()
            || self.to.is_some()
    }

    /// Refuses a selection that names nothing or that no entry could match sensibly.
    pub fn check(&self) -> Result<(), ParkingError> {
        if !self.is_bounded() {
            return Err(ParkingError::Unbounded);
        }
        // Event ids are request ids (UUIDs) or hex digests: the rule for request ids.
        let usable = |id: &String| seckill_http::layers::is_usable_request_id(id.as_bytes());
        if !self.ids.iter().all(usable) {
            return Err(ParkingError::Invalid(
                "ids must be event ids (letters, digits, '-', at most 128 characters)",
            ));
        }
        if let (Some(from), Some(to)) = (self.from, self.to)
            && from >= to
        {
            return Err(ParkingError::Invalid("from must be before to"));
        }
        Ok(())
    }

    /// How many entries at most (the caller's limit, within [`MAX_SELECTION`]).
    pub(super) fn limit(&self) -> i64 {
        self.limit.unwrap_or(MAX_SELECTION).clamp(1, MAX_SELECTION)
    }

    /// The ids named, if any.
    pub(super) fn ids(&self) -> Option<&[String]> {
        (!self.ids.is_empty()).then_some(self.ids.as_slice())
    }
}

/// What an action did (or, on a dry run, would do).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[schema(as = ParkingReport)]
pub struct Report {
    /// `redrive`, `ignore` or `clear`.
    pub action: String,
    /// Nothing was changed.
    pub dry_run: bool,
    /// The entries acted on (or that would be).
    pub event_ids: Vec<String>,
    /// Of those, units put back on sale (ignore only).
    pub compensated: usize,
}

/// Why an action failed.
#[derive(Debug, thiserror::Error)]
pub enum ParkingError {
    /// The selection names nothing.
    #[error("name entries by ids, product_id or a from/to window")]
    Unbounded,
    /// The selection is malformed.
    #[error("{0}")]
    Invalid(&'static str),
    /// Postgres failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// The broker refused or failed a redrive's publish; `done` were redriven before it.
    #[error("redrive stopped after {done} entries: {reason}")]
    Publish {
        /// Entries redriven before the failure.
        done: usize,
        /// What went wrong.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_must_name_something() {
        assert!(!Selection::default().is_bounded());
        let by_product = Selection {
            product_id: Some(3),
            ..Selection::default()
        };
        assert!(by_product.is_bounded());
        assert_eq!(Selection::default().limit(), MAX_SELECTION);
        let huge = Selection {
            limit: Some(i64::MAX),
            ..Selection::default()
        };
        assert_eq!(huge.limit(), MAX_SELECTION);
    }

    #[test]
    fn a_selection_with_a_malformed_id_or_an_empty_window_is_refused() {
        let ids = |ids: &[&str]| Selection {
            ids: ids.iter().map(|s| s.to_string()).collect(),
            ..Selection::default()
        };
        assert!(
            ids(&["0193c2a4-7d1e-7f00-9c1a-1b2c3d4e5f60", "ab12"])
                .check()
                .is_ok()
        );
        for bad in ["a\0b", "", "has space", &"x".repeat(129)] {
            assert!(
                matches!(ids(&[bad]).check(), Err(ParkingError::Invalid(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            Selection::default().check(),
            Err(ParkingError::Unbounded)
        ));
        let now = Utc::now();
        let window = |from, to| Selection {
            from: Some(from),
            to: Some(to),
            ..Selection::default()
        };
        assert!(
            window(now - chrono::Duration::hours(1), now)
                .check()
                .is_ok()
        );
        assert!(matches!(
            window(now, now).check(),
            Err(ParkingError::Invalid(_))
        ));
    }
}
