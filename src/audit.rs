//! Refusal and audit log lines, capped per second so that an attack cannot
//! flood the journal (the daemon keeps one cap for each kind, so the cheap
//! kind cannot crowd out the other). Lines over the cap are counted; the next line that
//! gets through says how many were suppressed, and `status` shows the total.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug)]
pub struct LogCap {
    per_sec_max: u64,
    second: AtomicU64,
    in_second: AtomicU64,
    /// Suppressed since the last line that got through.
    pending: AtomicU64,
    suppressed_total: AtomicU64,
}

impl LogCap {
    pub fn new(per_sec_max: u64) -> LogCap {
        LogCap {
            per_sec_max,
            second: AtomicU64::new(0),
            in_second: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            suppressed_total: AtomicU64::new(0),
        }
    }

    /// Whether a line may be written at `now_us`; `Some(n)` carries the
    /// number suppressed since the last written line. Lock-free and
    /// approximate at second boundaries, which is all a log cap needs.
    pub fn admit(&self, now_us: u64) -> Option<u64> {
        let second = now_us / 1_000_000;
        if self.second.load(Ordering::Relaxed) != second && self.second.swap(second, Ordering::Relaxed) != second {
            self.in_second.store(0, Ordering::Relaxed);
        }
        if self.in_second.fetch_add(1, Ordering::Relaxed) < self.per_sec_max {
            Some(self.pending.swap(0, Ordering::Relaxed))
        } else {
            self.pending.fetch_add(1, Ordering::Relaxed);
            self.suppressed_total.fetch_add(1, Ordering::Relaxed);
            None
        }
    }

    pub fn suppressed_total(&self) -> u64 {
        self.suppressed_total.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_each_second_and_reports_what_it_suppressed() {
        let cap = LogCap::new(3);
        let t = 5_000_000;
        assert_eq!(cap.admit(t), Some(0));
        assert_eq!(cap.admit(t), Some(0));
        assert_eq!(cap.admit(t + 1), Some(0));
        assert_eq!(cap.admit(t + 2), None);
        assert_eq!(cap.admit(t + 3), None);
        assert_eq!(cap.suppressed_total(), 2);
        assert_eq!(cap.admit(t + 1_000_000), Some(2), "the next second's first line reports the two");
        assert_eq!(cap.admit(t + 1_000_001), Some(0));
    }
}
