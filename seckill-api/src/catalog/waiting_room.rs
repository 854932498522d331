//! A product's waiting-room mode (DESIGN.md §9): whether buyers queue before they may buy.
//!
//! Stored as text in `products.waiting_room` (its CHECK lists the modes), sent and answered
//! in snake case, and written into the room's Redis hash as the same text. A new mode is one
//! variant here (its text follows from the name), an arm in [`WaitingRoom::as_str`], and the
//! migration that widens the CHECK.

use serde::{Deserialize, Serialize};
use sqlx::Postgres;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};

/// How buyers reach a product's sale: `open` (no queue, the default), `fifo` (a waiting
/// room admits them in order of arrival) or `raffle` (in an order drawn at the start;
/// DESIGN.md §9).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum WaitingRoom {
    /// No queue: every buyer may try to buy once the sale opens (DESIGN.md §2).
    #[default]
    Open,
    /// Buyers join a queue and are admitted in order of arrival; a purchase without the
    /// gateway's admission is refused (`428 admission_required`).
    Fifo,
    /// Buyers who join before the sale starts are admitted in an order drawn from a seed the
    /// room committed to beforehand and reveals at the start; later ones follow in order of
    /// arrival. A purchase without the gateway's admission is refused as for `fifo`.
    Raffle,
}

impl WaitingRoom {
    /// The mode's text: in Postgres, in JSON and in the room's Redis hash alike.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Fifo => "fifo",
            Self::Raffle => "raffle",
        }
    }

    /// Whether buyers must be admitted before they may buy.
    pub fn is_on(self) -> bool {
        self != Self::Open
    }
}

impl std::fmt::Display for WaitingRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The mode of its text, as serde reads it (so the names cannot drift apart).
impl std::str::FromStr for WaitingRoom {
    type Err = serde::de::value::Error;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::deserialize(serde::de::value::StrDeserializer::<Self::Err>::new(text))
    }
}

/// A `TEXT` column.
impl sqlx::Type<Postgres> for WaitingRoom {
    fn type_info() -> PgTypeInfo {
        <&str as sqlx::Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <&str as sqlx::Type<Postgres>>::compatible(ty)
    }
}

impl sqlx::Encode<'_, Postgres> for WaitingRoom {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <&str as sqlx::Encode<Postgres>>::encode_by_ref(&self.as_str(), buf)
    }
}

/// Text the column's CHECK would not let in (a mode of a newer version) fails the row.
impl sqlx::Decode<'_, Postgres> for WaitingRoom {
    fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
        let text = <&str as sqlx::Decode<Postgres>>::decode(value)?;
        Ok(text.parse()?)
    }
}

#[cfg(test)]
mod tests {
    use super::WaitingRoom;

    #[test]
    fn every_mode_reads_back_its_own_text() {
        for mode in [WaitingRoom::Open, WaitingRoom::Fifo, WaitingRoom::Raffle] {
            assert_eq!(mode.as_str().parse::<WaitingRoom>().ok(), Some(mode));
            assert_eq!(
                serde_json::to_value(mode).ok(),
                Some(serde_json::Value::from(mode.as_str()))
            );
        }
        assert!("FIFO".parse::<WaitingRoom>().is_err());
        assert!("queue".parse::<WaitingRoom>().is_err());
        assert!(!WaitingRoom::Open.is_on());
        assert!(WaitingRoom::Fifo.is_on());
        assert!(WaitingRoom::Raffle.is_on());
    }
}
