//! What a gateway knows of one room, and the answer to a buyer's poll from it: no Redis,
//! no backend.

use std::collections::VecDeque;

use std::sync::Arc;

use serde::Serialize;

use super::draw::Draw;
use super::ticket::{Holder, Pass};

/// How the gateway paces admissions and polls (settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing {
    /// Buyers admitted per second at most (`room_admit_per_sec`).
    pub admit_per_sec: u32,
    /// Polls per second the waiting buyers of one room are spread to (`room_polls_per_sec`).
    pub polls_per_sec: u32,
    /// How long a pass admits after the cursor passed its place (`room_pass_ttl_ms`).
    pub pass_ttl_ms: i64,
}

/// One room as the last admission step returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomView {
    /// The sale's start, unix ms (the sale's identity in tickets and passes).
    pub start_ms: i64,
    /// The line's number (its identity in tickets and passes, with the sale's start).
    pub line: u64,
    /// A `raffle` room: admitted in the order of its draw.
    pub raffle: bool,
    /// A raffle's draw, once entry closed and this gateway drew (`None` until then, and
    /// always for `fifo`).
    pub draw: Option<Arc<Draw>>,
    /// The sale's end, unix ms.
    pub end_ms: i64,
    /// Tickets handed out: places `0..joined`.
    pub joined: u64,
    /// Ranks below it are admitted (a rank is the place, but in a raffle the draw's).
    pub cursor: u64,
    /// No unit left: nobody is admitted.
    pub sold_out: bool,
    /// Admitted, passes still valid, not bought.
    pub outstanding: u64,
    /// The admissions per second the last step credited: `room_admit_per_sec`, or its
    /// ceiling while the backends push back.
    pub admit_per_sec: u64,
    /// The cursor before the oldest admission in `admits`: a rank below it was admitted
    /// longer ago than any pass lives.
    pub floor: u64,
    /// Each admission still within a pass's life: the cursor after it, and when (unix ms),
    /// oldest first.
    pub admits: VecDeque<(u64, i64)>,
}

/// A buyer's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// In line (before the start, or behind the cursor).
    Waiting,
    /// The cursor passed the buyer's place and the pass is still good.
    Admitted,
    /// Admitted, but the pass ran out unused.
    Expired,
    /// No unit left; a unit that comes back admits the next in line.
    SoldOut,
    /// The sale ended.
    Closed,
}

impl State {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Admitted => "admitted",
            Self::Expired => "expired",
            Self::SoldOut => "sold_out",
            Self::Closed => "closed",
        }
    }
}

/// The answer to a poll (and the body of a join, with the ticket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// The buyer's state.
    pub state: State,
    /// The buyer's place in line (arrival order), from 0.
    pub place: u64,
    /// In a drawn raffle, the buyer's rank in the drawn order, from 0.
    pub rank: Option<u64>,
    /// Buyers ahead who are not admitted yet; `None` in a raffle not drawn yet.
    pub ahead: Option<u64>,
    /// Estimated wait until admission, ms (0 unless waiting).
    pub wait_ms: u64,
    /// When to poll again, ms: the server's pace, not the client's.
    pub poll_after_ms: u64,
    /// The pass, when admitted.
    pub pass: Option<Pass>,
}

/// Longest pause the gateway asks of a waiting buyer.
pub const MAX_POLL_AFTER_MS: u64 = 60_000;
/// Shortest pause (the buyers next in line).
pub const MIN_POLL_AFTER_MS: u64 = 1_000;
/// Pause asked of a buyer told `sold_out`: still in line should a unit come back.
pub const SOLD_OUT_POLL_AFTER_MS: u64 = 10_000;

impl RoomView {
    /// Whom a ticket, pass or challenge of `user_id` for this room's sale is signed for.
    pub fn holder(&self, product_id: i64, user_id: i64) -> Holder {
        Holder {
            product_id,
            user_id,
            sale: self.start_ms,
            line: self.line,
        }
    }

    /// The position of `place` in the order of admission: the place itself, or in a raffle
    /// its rank in the draw (`None` before the draw).
    pub fn rank(&self, place: u64) -> Option<u64> {
        if !self.raffle {
            return Some(place);
        }
        self.draw.as_ref().map(|draw| draw.rank(place))
    }

    /// When the cursor passed `rank` (unix ms), if within a pass's life.
    pub fn admitted_at(&self, rank: u64) -> Option<i64> {
        if rank < self.floor || rank >= self.cursor {
            return None;
        }
        let at = self.admits.partition_point(|&(cursor, _)| cursor <= rank);
        self.admits.get(at).map(|&(_, ms)| ms)
    }

    /// The answer to the holder of `place` at `now_ms`.
    pub fn answer(&self, place: u64, now_ms: i64, pacing: Pacing) -> Answer {
        let mut answer = Answer {
            state: State::Waiting,
            place,
            rank: None,
            ahead: None,
            wait_ms: 0,
            poll_after_ms: 0,
            pass: None,
        };
        if now_ms >= self.end_ms {
            answer.state = State::Closed;
            return answer;
        }
        let to_start = u64::try_from(self.start_ms - now_ms).unwrap_or(0);
        let Some(rank) = self.rank(place) else {
            // A raffle not drawn yet: entry closes at the start.
            if self.sold_out {
                answer.state = State::SoldOut;
                answer.poll_after_ms = SOLD_OUT_POLL_AFTER_MS;
                return answer;
            }
            answer.wait_ms = to_start;
            answer.poll_after_ms = self.poll_after(answer, to_start, pacing);
            return answer;
        };
        answer.rank = self.raffle.then_some(rank);
        if rank < self.cursor {
            answer.ahead = Some(0);
            let expires_ms = self
                .admitted_at(rank)
                .map(|at| at.saturating_add(pacing.pass_ttl_ms));
            answer.state = match expires_ms {
                _ if self.sold_out => State::SoldOut,
                Some(expires_ms) if now_ms < expires_ms => {
                    answer.pass = Some(Pass { rank, expires_ms });
                    answer.poll_after_ms = u64::try_from(expires_ms - now_ms).unwrap_or(0);
                    State::Admitted
                }
                _ => State::Expired,
            };
            if answer.state == State::SoldOut {
                answer.poll_after_ms = SOLD_OUT_POLL_AFTER_MS;
            }
            return answer;
        }
        let ahead = rank - self.cursor;
        answer.ahead = Some(ahead);
        if self.sold_out {
            answer.state = State::SoldOut;
            answer.poll_after_ms = SOLD_OUT_POLL_AFTER_MS;
            return answer;
        }
        let rate = u64::from(pacing.admit_per_sec.max(1));
        answer.wait_ms = to_start + ahead * 1000 / rate;
        answer.poll_after_ms = self.poll_after(answer, to_start, pacing);
        answer
    }

    /// The pause asked of a waiting buyer: about a third of the wait (a buyer near the
    /// front polls every second), never so short that the room's waiting buyers together
    /// poll more than `polls_per_sec`, spread by place so that buyers who joined together do
    /// not poll together.
    fn poll_after(&self, answer: Answer, to_start: u64, pacing: Pacing) -> u64 {
        let waiting = self.joined.saturating_sub(self.cursor);
        let spread_floor = waiting * 1000 / u64::from(pacing.polls_per_sec.max(1));
        let own = if to_start > 0 {
            // Before the start: back a little before it, whoever you are.
            to_start
                .saturating_sub(MIN_POLL_AFTER_MS)
                .max(MIN_POLL_AFTER_MS)
        } else {
            answer.wait_ms / 3
        };
        let pause = own
            .max(spread_floor)
            .clamp(MIN_POLL_AFTER_MS, MAX_POLL_AFTER_MS);
        // Up to +25 %, by place.
        pause + pause * (answer.place % 16) / 64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PACING: Pacing = Pacing {
        admit_per_sec: 100,
        polls_per_sec: 1000,
        pass_ttl_ms: 60_000,
    };

    fn view() -> RoomView {
        RoomView {
            start_ms: 10_000,
            line: 1,
            raffle: false,
            draw: None,
            end_ms: 1_000_000,
            joined: 5_000,
            cursor: 300,
            sold_out: false,
            outstanding: 50,
            admit_per_sec: 100,
            floor: 100,
            admits: VecDeque::from([(200, 20_000), (300, 21_000)]),
        }
    }

    #[test]
    fn a_place_behind_the_cursor_waits_its_turn_at_the_admission_rate() {
        let answer = view().answer(1_300, 30_000, PACING);
        assert_eq!(answer.state, State::Waiting);
        assert_eq!(answer.ahead, Some(1_000));
        assert_eq!(answer.rank, None);
        assert_eq!(answer.wait_ms, 10_000);
        assert_eq!(answer.pass, None);
        // A third of the wait, or the room's spread (4,700 waiting at 1,000 polls/s).
        let base = 4_700;
        assert!(
            (base..=base * 5 / 4).contains(&answer.poll_after_ms),
            "{answer:?}"
        );
    }

    #[test]
    fn the_next_in_line_polls_every_second_unless_the_crowd_is_too_big() {
        let near = view().answer(
            301,
            30_000,
            Pacing {
                polls_per_sec: 100_000,
                ..PACING
            },
        );
        assert!((1_000..=1_250).contains(&near.poll_after_ms), "{near:?}");
        let crowded = view().answer(
            301,
            30_000,
            Pacing {
                polls_per_sec: 10,
                ..PACING
            },
        );
        assert_eq!(
            crowded.poll_after_ms,
            MAX_POLL_AFTER_MS + MAX_POLL_AFTER_MS * 13 / 64
        );
    }

    #[test]
    fn an_admitted_place_gets_a_pass_until_a_pass_lifetime_after_its_admission() {
        let room = view();
        let admitted = room.answer(250, 50_000, PACING);
        assert_eq!(admitted.state, State::Admitted);
        assert_eq!(
            admitted.pass,
            Some(Pass {
                rank: 250,
                expires_ms: 81_000
            })
        );
        assert_eq!(admitted.poll_after_ms, 31_000);
        // Admitted by the first admission in the history.
        assert_eq!(room.admitted_at(150), Some(20_000));
        assert_eq!(room.admitted_at(199), Some(20_000));
        assert_eq!(room.admitted_at(200), Some(21_000));
        assert_eq!(room.answer(250, 81_000, PACING).state, State::Expired);
        // Admitted before the history: long expired.
        assert_eq!(room.admitted_at(99), None);
        assert_eq!(room.answer(99, 50_000, PACING).state, State::Expired);
    }

    #[test]
    fn sold_out_and_closed_are_said_to_everyone() {
        let mut room = view();
        room.sold_out = true;
        for place in [0, 250, 300, 4_000] {
            let answer = room.answer(place, 50_000, PACING);
            assert_eq!(answer.state, State::SoldOut, "{place}");
            assert_eq!(answer.pass, None);
        }
        assert_eq!(room.answer(4_000, 1_000_000, PACING).state, State::Closed);
    }

    #[test]
    fn before_the_start_the_wait_counts_the_time_to_it() {
        let mut room = view();
        room.cursor = 0;
        room.floor = 0;
        room.admits.clear();
        let answer = room.answer(100, 4_000, PACING);
        assert_eq!(answer.state, State::Waiting);
        assert_eq!(answer.wait_ms, 6_000 + 1_000);
        assert!(
            (5_000..=6_250).contains(&answer.poll_after_ms),
            "{answer:?}"
        );
    }

    #[test]
    fn a_raffle_waits_for_its_draw_then_admits_by_rank() {
        let mut room = view();
        room.raffle = true;
        room.cursor = 0;
        room.floor = 0;
        room.admits.clear();
        // Before the draw: no rank, no count ahead, back about when entry closes.
        let before = room.answer(7, 4_000, PACING);
        assert_eq!(before.state, State::Waiting);
        assert_eq!((before.rank, before.ahead), (None, None));
        assert_eq!(before.wait_ms, 6_000);

        let draw = Draw::new("seed", 100).expect("a draw");
        let (first, last) = (
            (0..100).find(|&p| draw.rank(p) == 0).expect("rank 0"),
            (0..100).find(|&p| draw.rank(p) == 99).expect("rank 99"),
        );
        room.draw = Some(Arc::new(draw));
        room.cursor = 10;
        room.admits = VecDeque::from([(10, 20_000)]);
        let admitted = room.answer(first, 21_000, PACING);
        assert_eq!(admitted.state, State::Admitted);
        assert_eq!(admitted.rank, Some(0));
        assert_eq!(
            admitted.pass,
            Some(Pass {
                rank: 0,
                expires_ms: 80_000
            })
        );
        let behind = room.answer(last, 21_000, PACING);
        assert_eq!(behind.state, State::Waiting);
        assert_eq!((behind.rank, behind.ahead), (Some(99), Some(89)));
        // Joined after the close: behind every entry, in arrival order.
        let late = room.answer(150, 21_000, PACING);
        assert_eq!((late.rank, late.ahead), (Some(150), Some(140)));
    }
}
