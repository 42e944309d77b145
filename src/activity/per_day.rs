//! Attempts and failures per account per day, the distribution the
//! thresholds are argued from (p50 to p99.9), in bounded memory.
//!
//! A keyed hash chooses the accounts: one whose hash has at least `shift`
//! leading zeros is counted exactly from its first attempt of the day, the
//! rest not at all. When the sample outgrows its cap, `shift` grows by one
//! and the accounts without the extra zero leave; an account never joins
//! late, because `shift` only grows within a day. The sample is therefore
//! uniform over accounts and each of its counts is exact: the quantiles
//! are those of a random sample of the day's accounts. The hash key is
//! drawn at start (`ActivityLink`), so a client cannot aim its accounts at
//! or away from the sample (a restart draws another, and a new day's
//! sample starts empty anyway).

use std::collections::HashMap;

use crate::protocol::{Distribution, HistogramBucket};

pub const DAY_US: u64 = 86_400 * 1_000_000;

#[derive(Clone, Copy, Default)]
struct Counts {
    attempts: u32,
    failures: u32,
}

pub struct DaySample {
    /// Days since the epoch on the daemon's clock.
    day: u64,
    shift: u32,
    cap: usize,
    accounts: HashMap<u64, Counts>,
}

/// Whether an account hash is in a sample of one in 2^`shift`.
pub fn sampled(hash: u64, shift: u32) -> bool {
    shift == 0 || hash.leading_zeros() >= shift
}

impl DaySample {
    pub fn new(day: u64, cap: usize) -> DaySample {
        DaySample { day, shift: 0, cap, accounts: HashMap::new() }
    }

    pub fn day(&self) -> u64 {
        self.day
    }

    pub fn shift(&self) -> u32 {
        self.shift
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.accounts.len()
    }

    pub fn attempt(&mut self, hash: u64) {
        self.count(hash, |c| c.attempts = c.attempts.saturating_add(1));
    }

    pub fn failure(&mut self, hash: u64) {
        self.count(hash, |c| c.failures = c.failures.saturating_add(1));
    }

    fn count(&mut self, hash: u64, add: impl FnOnce(&mut Counts)) {
        if !sampled(hash, self.shift) {
            return;
        }
        add(self.accounts.entry(hash).or_default());
        while self.accounts.len() > self.cap && self.shift < 63 {
            self.shift += 1;
            let shift = self.shift;
            self.accounts.retain(|&h, _| sampled(h, shift));
        }
    }

    /// The day's distributions: `attempts` over accounts with an attempt,
    /// `failures` over accounts with a failure. `failures_max_floor` is the
    /// most failures any one account is known to have had (from the
    /// top-K summary, which sees every failure).
    pub fn distributions(&self, label: &str, failures_max_floor: u64) -> [Distribution; 2] {
        let mut attempts: Vec<u32> = self.accounts.values().map(|c| c.attempts).filter(|&n| n > 0).collect();
        let mut failures: Vec<u32> = self.accounts.values().map(|c| c.failures).filter(|&n| n > 0).collect();
        [
            self.distribution("attempts", label, &mut attempts, 0),
            self.distribution("failures", label, &mut failures, failures_max_floor.min(u32::MAX as u64) as u32),
        ]
    }

    fn distribution(&self, name: &str, label: &str, counts: &mut [u32], max_floor: u32) -> Distribution {
        counts.sort_unstable();
        let at = |q: f64| -> u32 {
            if counts.is_empty() {
                return 0;
            }
            let rank = ((q * counts.len() as f64).ceil() as usize).clamp(1, counts.len());
            counts[rank - 1]
        };
        let max = counts.last().copied().unwrap_or(0).max(max_floor);
        // Buckets at powers of two: 1, 2, 3-4, 5-8, ... up to the max.
        let mut histogram = Vec::new();
        let mut upto = 1u32;
        let mut i = 0;
        loop {
            let start = i;
            while i < counts.len() && counts[i] <= upto {
                i += 1;
            }
            histogram.push(HistogramBucket { upto, accounts: ((i - start) as u64) << self.shift });
            if i >= counts.len() || upto == u32::MAX {
                break;
            }
            upto = upto.saturating_mul(2);
        }
        Distribution {
            name: name.into(),
            day: label.into(),
            day_start_ms: self.day * (DAY_US / 1000),
            accounts: (counts.len() as u64) << self.shift,
            accounts_sampled: counts.len() as u64,
            sample_shift: self.shift,
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            p999: at(0.999),
            max,
            histogram,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn splitmix(mut x: u64) -> u64 {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    #[test]
    fn below_the_cap_every_account_is_counted_exactly() {
        let mut day = DaySample::new(3, 1024);
        for account in 0..100u64 {
            for _ in 0..=account % 10 {
                day.attempt(splitmix(account));
            }
            if account % 4 == 0 {
                day.failure(splitmix(account));
            }
        }
        let [attempts, failures] = day.distributions("today", 0);
        assert_eq!((attempts.accounts, attempts.sample_shift), (100, 0));
        assert_eq!((attempts.p50, attempts.p90, attempts.max), (5, 9, 10));
        assert_eq!(failures.accounts, 25);
        assert_eq!(failures.max, 1);
        let buckets: Vec<(u32, u64)> = attempts.histogram.iter().map(|b| (b.upto, b.accounts)).collect();
        assert_eq!(buckets, vec![(1, 10), (2, 10), (4, 20), (8, 40), (16, 20)]);
        assert_eq!(attempts.day_start_ms, 3 * 86_400_000);
    }

    #[test]
    fn past_the_cap_the_sample_halves_and_stays_near_the_truth() {
        let cap = 1024;
        let mut day = DaySample::new(0, cap);
        // 100,000 accounts: 84% with 1 attempt, 14% with 10, 2% with 100.
        let n = 100_000u64;
        for account in 0..n {
            let attempts = match account % 100 {
                0..=1 => 100,
                2..=15 => 10,
                _ => 1,
            };
            for _ in 0..attempts {
                day.attempt(splitmix(account));
            }
        }
        assert!(day.len() <= cap && day.len() > cap / 2, "sample of {}", day.len());
        let [attempts, _] = day.distributions("today", 0);
        assert!(attempts.sample_shift >= 6, "shift {}", attempts.sample_shift);
        let estimate = attempts.accounts as f64;
        assert!((estimate / n as f64 - 1.0).abs() < 0.15, "estimated {estimate} of {n}");
        assert_eq!((attempts.p50, attempts.p90, attempts.p99, attempts.max), (1, 10, 100, 100));
    }

    #[test]
    fn the_top_k_floor_raises_the_failures_max() {
        let mut day = DaySample::new(0, 1024);
        day.failure(splitmix(1));
        let [_, failures] = day.distributions("today", 500);
        assert_eq!(failures.max, 500);
    }
}
