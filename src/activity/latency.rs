//! Request latency inside the daemon, as a histogram of atomics: the
//! request path adds one count, `status` reads them all. The buckets are
//! the protocol's (`LATENCY_BUCKETS`), so a viewer can take percentiles of
//! the difference between two snapshots.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::protocol::{latency_bucket, latency_bucket_upper_ns, LatencyHistogram, LATENCY_BUCKETS};

pub struct Latency {
    buckets: Box<[AtomicU64]>,
    max_ns: AtomicU64,
    sample_every: u32,
}

impl Latency {
    pub fn new(sample_every: u32) -> Latency {
        Latency {
            buckets: (0..LATENCY_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max_ns: AtomicU64::new(0),
            sample_every,
        }
    }

    /// How many batches of a connection go unmeasured for each measured one.
    pub fn sample_every(&self) -> u32 {
        self.sample_every
    }

    pub fn record(&self, ns: u64) {
        self.buckets[latency_bucket(ns)].fetch_add(1, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> LatencyHistogram {
        let buckets: Vec<u64> = self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        let samples = buckets.iter().sum();
        let at = |q: f64| percentile_ns(&buckets, q);
        LatencyHistogram {
            samples,
            sample_every: self.sample_every,
            p50_ns: at(0.50),
            p90_ns: at(0.90),
            p99_ns: at(0.99),
            p999_ns: at(0.999),
            max_ns: self.max_ns.load(Ordering::Relaxed),
            buckets,
        }
    }
}

/// The upper bound of the bucket holding quantile `q` (0 when empty): an
/// overstatement of at most a bucket's width (25%).
pub fn percentile_ns(buckets: &[u64], q: f64) -> u64 {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return 0;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (i, &count) in buckets.iter().enumerate() {
        seen += count;
        if seen >= rank {
            return latency_bucket_upper_ns(i);
        }
    }
    latency_bucket_upper_ns(buckets.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bucket_bounds_rise_and_hold_their_values() {
        for i in 1..LATENCY_BUCKETS {
            assert!(latency_bucket_upper_ns(i) > latency_bucket_upper_ns(i - 1), "bucket {i}");
        }
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(79), 0);
        assert_eq!(latency_bucket(80), 1);
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS - 1);
    }

    proptest! {
        #[test]
        fn a_value_lands_in_the_bucket_whose_bounds_hold_it(ns in 0u64..(1 << 40)) {
            let i = latency_bucket(ns);
            prop_assert!(ns < latency_bucket_upper_ns(i));
            if i > 0 {
                prop_assert!(ns >= latency_bucket_upper_ns(i - 1));
            }
        }

        #[test]
        fn percentiles_bound_the_exact_ones_within_a_bucket(mut values in proptest::collection::vec(1u64..10_000_000, 1..500)) {
            let latency = Latency::new(1);
            for &v in &values {
                latency.record(v);
            }
            values.sort_unstable();
            let snapshot = latency.snapshot();
            for (q, got) in [(0.5, snapshot.p50_ns), (0.99, snapshot.p99_ns)] {
                let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
                let exact = values[rank - 1];
                prop_assert!(got > exact && got <= exact + exact / 4 + 80, "q {q}: exact {exact}, got {got}");
            }
            prop_assert_eq!(snapshot.max_ns, *values.last().unwrap());
        }
    }
}
