//! Where the limiter's time comes from. Decisions, tables, spray detection
//! and the activity view receive `now_us` as an argument, read here once per
//! batch of frames, so tests can drive them with any time (`--manual-clock`).
//! Elsewhere `Instant` times what is about real waiting, not about the
//! limiter's windows: deadlines on sockets and on the shared store (and its
//! burst marks, which judge those waits), latency, flush and retry
//! intervals (ARCHITECTURE.md lists them). Global rules are decided on the
//! store's clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The instant a `--manual-clock` daemon starts at: 2030-01-01T00:00:00Z.
/// Fixed so that a restarted test daemon sees the same time, and aligned to
/// every window length that divides a day, so scenario tests start a window.
pub const MANUAL_CLOCK_START_US: u64 = 1_893_456_000 * 1_000_000;

/// Wall-clock time in microseconds since the Unix epoch. Wall time (not
/// monotonic) because lockouts are persisted and must age across restarts.
#[derive(Clone, Debug)]
pub enum Clock {
    System,
    /// Starts at [`MANUAL_CLOCK_START_US`] and moves only when told to.
    Manual(Arc<AtomicU64>),
}

impl Clock {
    pub fn manual() -> Clock {
        Clock::Manual(Arc::new(AtomicU64::new(MANUAL_CLOCK_START_US)))
    }

    pub fn now_us(&self) -> u64 {
        match self {
            Clock::System => SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0),
            Clock::Manual(now) => now.load(Ordering::Acquire),
        }
    }

    pub fn is_manual(&self) -> bool {
        matches!(self, Clock::Manual(_))
    }

    /// Moves a manual clock forward; returns the new time, or `None` for the
    /// system clock, which cannot be moved.
    pub fn advance(&self, by_us: u64) -> Option<u64> {
        match self {
            Clock::System => None,
            Clock::Manual(now) => {
                // Saturating: a huge step must never wrap the clock backwards.
                let step = |t: u64| Some(t.saturating_add(by_us));
                let before = now.fetch_update(Ordering::AcqRel, Ordering::Acquire, step).expect("step never fails");
                Some(before.saturating_add(by_us))
            }
        }
    }
}

/// How long a request took inside the daemon (`activity`'s latency):
/// the monotonic clock, whatever the limiter's clock is, since a manual
/// clock does not move while a request is answered.
#[derive(Clone, Copy)]
pub struct Stopwatch(std::time::Instant);

impl Stopwatch {
    pub fn start() -> Stopwatch {
        Stopwatch(std::time::Instant::now())
    }

    pub fn elapsed_ns(self) -> u64 {
        self.0.elapsed().as_nanos().min(u64::MAX as u128) as u64
    }
}

/// Rounds a duration in microseconds up to whole milliseconds, so that a
/// client that waits what it is told is never early.
pub fn ceil_ms(us: u64) -> u64 {
    us.div_ceil(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let clock = Clock::manual();
        assert_eq!(clock.now_us(), MANUAL_CLOCK_START_US);
        assert_eq!(clock.advance(1_500), Some(MANUAL_CLOCK_START_US + 1_500));
        assert_eq!(clock.now_us(), MANUAL_CLOCK_START_US + 1_500);
        assert_eq!(Clock::System.advance(1), None);
        assert_eq!(clock.advance(u64::MAX), Some(u64::MAX));
        assert_eq!(clock.now_us(), u64::MAX, "saturates, never wraps");
    }

    #[test]
    fn ceil_ms_rounds_up() {
        assert_eq!(ceil_ms(0), 0);
        assert_eq!(ceil_ms(1), 1);
        assert_eq!(ceil_ms(1000), 1);
        assert_eq!(ceil_ms(1001), 2);
    }
}
