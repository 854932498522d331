//! What admins send to create or change a product, and the rules it must follow.

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::WaitingRoom;

/// What an admin sends to create a product.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct NewProduct {
    /// Display name, 1–200 characters.
    #[schema(min_length = 1, max_length = 200)]
    pub name: String,
    /// Price per unit, in cents, ≥ 0.
    #[schema(minimum = 0)]
    pub price_cents: i64,
    /// Units on sale, 0–10,000,000.
    #[schema(minimum = 0, maximum = 10_000_000)]
    pub stock: i32,
    /// When the sale opens.
    pub start_at: DateTime<Utc>,
    /// When the sale closes; after `start_at`.
    pub end_at: DateTime<Utc>,
    /// Redis buckets to split the stock into, 1–1024; the service's default when absent.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1024)]
    pub buckets: Option<i16>,
    /// Whether buyers queue before they may buy (DESIGN.md §9); `open` (no queue) when absent.
    #[serde(default)]
    pub waiting_room: Option<WaitingRoom>,
}

/// The most buckets a product may have.
pub const MAX_BUCKETS: i16 = 1024;

impl NewProduct {
    /// Explains the first rule the request breaks.
    pub fn validate(&self) -> Result<(), String> {
        check_name(&self.name)?;
        check_price(self.price_cents)?;
        if !(0..=10_000_000).contains(&self.stock) {
            return Err("stock must be between 0 and 10000000".into());
        }
        check_window(self.start_at, self.end_at)?;
        if self
            .buckets
            .is_some_and(|b| !(1..=MAX_BUCKETS).contains(&b))
        {
            return Err(format!("buckets must be between 1 and {MAX_BUCKETS}"));
        }
        Ok(())
    }
}

/// What an admin sends to change a product: any of its catalogue fields. The stock and its
/// buckets are not here on purpose (a sale's units and key layout are fixed once set up), so
/// a body naming them is refused rather than half applied.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProductChanges {
    /// New display name, 1–200 characters.
    #[schema(min_length = 1, max_length = 200)]
    pub name: Option<String>,
    /// New price per unit, in cents, ≥ 0.
    #[schema(minimum = 0)]
    pub price_cents: Option<i64>,
    /// New opening time; with the (new or current) `end_at` after it.
    pub start_at: Option<DateTime<Utc>>,
    /// New closing time; after the (new or current) `start_at`.
    pub end_at: Option<DateTime<Utc>>,
    /// New waiting-room mode (DESIGN.md §9); the purchases that follow obey it.
    pub waiting_room: Option<WaitingRoom>,
}

impl ProductChanges {
    /// Explains the first rule the request breaks. A window half of which is stored is
    /// checked by [`super::Catalog::update`], against the row.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.is_none()
            && self.price_cents.is_none()
            && self.start_at.is_none()
            && self.end_at.is_none()
            && self.waiting_room.is_none()
        {
            return Err(
                "nothing to change: send name, price_cents, start_at, end_at or waiting_room"
                    .into(),
            );
        }
        if let Some(name) = &self.name {
            check_name(name)?;
        }
        if let Some(price) = self.price_cents {
            check_price(price)?;
        }
        if let (Some(start), Some(end)) = (self.start_at, self.end_at) {
            check_window(start, end)?;
        }
        Ok(())
    }
}

fn check_name(name: &str) -> Result<(), String> {
    let len = name.trim().chars().count();
    if len == 0 || len > 200 {
        return Err("name must be 1-200 characters".into());
    }
    Ok(())
}

fn check_price(price_cents: i64) -> Result<(), String> {
    if price_cents < 0 {
        return Err("price_cents must not be negative".into());
    }
    Ok(())
}

/// The window rule, also reported when a stored half of the window breaks it.
pub(super) const WINDOW_RULE: &str = "end_at must be after start_at";

fn check_window(start: DateTime<Utc>, end: DateTime<Utc>) -> Result<(), String> {
    if end <= start {
        return Err(WINDOW_RULE.into());
    }
    Ok(())
}
