//! The bounds on work under way: requests being forwarded, over all clients
//! ([`InFlight`]), and purchases of one user ([`Purchases`]). Both are taken only once a
//! request's body is in (see `crate::pipeline`), so a client trickling a body holds
//! neither, and both refuse at once rather than queue.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The in-flight bound: a counter shared by every worker thread.
#[derive(Debug)]
pub struct InFlight {
    now: AtomicUsize,
    max: usize,
}

impl InFlight {
    /// At most `max` at once.
    pub fn new(max: usize) -> Self {
        Self {
            now: AtomicUsize::new(0),
            max,
        }
    }

    /// A slot until the guard is dropped, or none when all `max` are taken.
    pub fn enter(&self) -> Option<Slot<'_>> {
        let before = self.now.fetch_add(1, Ordering::AcqRel);
        // Taken either way, so that dropping it gives the count back either way.
        let slot = Slot(&self.now);
        (before < self.max).then_some(slot)
    }
}

/// One taken in-flight slot.
#[derive(Debug)]
pub struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Purchases in flight per verified user: one user's burst of concurrent purchases (a
/// script firing at once) cannot occupy the in-flight bound, nor the stock engine, beyond
/// its share. Only users with a purchase under way are in the map.
#[derive(Debug)]
pub struct Purchases {
    now: Mutex<HashMap<i64, usize>>,
    max: usize,
}

impl Purchases {
    /// At most `max` purchases of one user at once.
    pub fn new(max: usize) -> Self {
        Self {
            now: Mutex::new(HashMap::new()),
            max,
        }
    }

    /// A place for one purchase of `user` until the guard is dropped, or none when the
    /// user has `max` under way.
    pub fn enter(&self, user: i64) -> Option<Purchase<'_>> {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        let count = now.entry(user).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(Purchase { bound: self, user })
    }
}

/// One user's purchase under way.
#[derive(Debug)]
pub struct Purchase<'a> {
    bound: &'a Purchases,
    user: i64,
}

impl Drop for Purchase<'_> {
    fn drop(&mut self) {
        let mut now = self.bound.now.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = now.get_mut(&self.user) {
            *count -= 1;
            if *count == 0 {
                now.remove(&self.user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_in_flight_bound_sheds_past_max_and_frees_on_drop() {
        let bound = InFlight::new(2);
        let first = bound.enter().expect("first");
        let second = bound.enter().expect("second");
        assert!(bound.enter().is_none(), "a third is shed");
        drop(first);
        let third = bound.enter().expect("a freed slot is taken again");
        drop((second, third));
        assert_eq!(
            bound.now.load(Ordering::Relaxed),
            0,
            "shed attempts leave no count"
        );
    }

    #[test]
    fn each_user_has_max_purchases_under_way_and_no_more() {
        let bound = Purchases::new(2);
        let first = bound.enter(7).expect("first");
        let _second = bound.enter(7).expect("second");
        assert!(bound.enter(7).is_none(), "a third of the same user");
        let other = bound.enter(8).expect("another user is not held back");
        drop(first);
        let _third = bound.enter(7).expect("a freed place");
        drop(other);
        assert!(!bound.now.lock().unwrap().contains_key(&8), "left the map");
    }
}
