//! The sliding-window arithmetic of one failure rule: `WindowSpec` (window
//! length and threshold), `Counts` (what an entry knows), and what follows
//! from them at an instant: the estimate, locked or not, admitted or not,
//! when a key unlocks, when its entry expires.
//!
//! Holds no table and no state: every function takes the counts and
//! `now_us`.

/// Highest threshold a rule may have. Eviction looks for the lowest non-empty
/// count class, so this bounds the work of one insert into a full table.
pub const THRESHOLD_MAX: u32 = 1000;
/// Shortest window a rule may have: windows are indexed in u32 seconds-ish
/// units, and shorter windows make no sense for failures anyway.
pub const WINDOW_US_MIN: u64 = 1_000_000;

/// Window length and threshold of one failure rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    pub window_us: u64,
    pub threshold: u32,
}

/// What one entry knows: the window it was last written in and two counts.
/// Twelve bytes; the whole persisted state of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Counts {
    /// Index of the window `current` counts (`start_us / window_us`).
    pub window: u32,
    pub previous: u32,
    pub current: u32,
}

impl WindowSpec {
    pub fn window_index(self, now_us: u64) -> u32 {
        (now_us / self.window_us).min(u32::MAX as u64) as u32
    }

    /// The counts as seen from `now_us`'s window.
    pub fn rolled(self, counts: Counts, now_us: u64) -> Counts {
        let now = self.window_index(now_us);
        if now <= counts.window {
            counts
        } else if now == counts.window + 1 {
            Counts { window: now, previous: counts.current, current: 0 }
        } else {
            Counts { window: now, previous: 0, current: 0 }
        }
    }

    /// Estimate × window_us, in integers so that comparisons are exact.
    pub fn weighted(self, counts: Counts, now_us: u64) -> u128 {
        let c = self.rolled(counts, now_us);
        let elapsed = now_us.saturating_sub(c.window as u64 * self.window_us).min(self.window_us);
        c.previous as u128 * (self.window_us - elapsed) as u128 + c.current as u128 * self.window_us as u128
    }

    /// The sliding-window count, rounded up.
    pub fn estimate(self, counts: Counts, now_us: u64) -> u32 {
        self.weighted(counts, now_us).div_ceil(self.window_us as u128).min(u32::MAX as u128) as u32
    }

    /// The sliding-window count rounded down: what an entry re-dated to a
    /// new window length carries as its count. Rounding down keeps a key
    /// locked exactly when it was (locked means weighted ≥ threshold × W,
    /// so floor(weighted / W) ≥ threshold); rounding up would lock a key
    /// that sat at 4.5 of 5.
    pub fn whole_failures(self, counts: Counts, now_us: u64) -> u32 {
        (self.weighted(counts, now_us) / self.window_us as u128).min(u32::MAX as u128) as u32
    }

    pub fn is_locked(self, counts: Counts, now_us: u64) -> bool {
        self.weighted(counts, now_us) >= self.threshold as u128 * self.window_us as u128
    }

    /// Failures that may still be reported before the key locks.
    pub fn remaining(self, counts: Counts, now_us: u64) -> u32 {
        self.threshold.saturating_sub(self.estimate(counts, now_us))
    }

    /// Whether a check is refused: the failures counted plus the attempts
    /// in flight (each presumed to fail) reach the threshold. With nothing
    /// in flight this is `is_locked`.
    pub fn refuses(self, counts: Counts, in_flight: u32, now_us: u64) -> bool {
        let presumed = self.weighted(counts, now_us) + in_flight as u128 * self.window_us as u128;
        presumed >= self.threshold as u128 * self.window_us as u128
    }

    /// Attempts this rule would still admit: the threshold less the
    /// sliding-window failures (rounded up) and the attempts in flight.
    pub fn admits_remaining(self, counts: Counts, in_flight: u32, now_us: u64) -> u32 {
        self.remaining(counts, now_us).saturating_sub(in_flight)
    }

    /// The first instant at which the key is not locked, if no further
    /// failure arrives (`now_us` itself when it is not locked now).
    pub fn unlocks_at(self, counts: Counts, now_us: u64) -> u64 {
        if !self.is_locked(counts, now_us) {
            return now_us;
        }
        let c = self.rolled(counts, now_us);
        let w = self.window_us as u128;
        let t = self.threshold as u128;
        let start = c.window as u64 * self.window_us;
        // In this window: locked while previous·(W−e) ≥ (T−current)·W,
        // i.e. until e = W − ceil((T−current)·W / previous) + 1.
        if (c.current as u128) < t {
            let need = (t - c.current as u128) * w;
            let e = w - need.div_ceil(c.previous as u128) + 1;
            return start + e as u64;
        }
        // Otherwise through this window, then current becomes previous.
        let need = t * w;
        let e = w - need.div_ceil(c.current as u128) + 1;
        start + self.window_us + e as u64
    }

    /// When the entry stops carrying any count (both windows over).
    pub fn expires_at(self, counts: Counts) -> u64 {
        (counts.window as u64 + 2) * self.window_us
    }

    pub(super) fn is_expired(self, counts: Counts, now_index: u32) -> bool {
        counts.window as u64 + 2 <= now_index as u64
    }
}
