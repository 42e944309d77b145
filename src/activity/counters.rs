//! Verdicts per route, counted on the request path without two cores
//! bouncing one cache line: each thread adds to its own shard, a reader
//! sums them. (The daemon-wide verdict counts are kept per connection and
//! added per batch instead; a route is not known there.)

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::protocol::{Decision, DecisionCounts, Outcome, RouteActivity, Verdict};

/// checks by decision (4) and would-refuse, the same for reports, then
/// failures and successes.
const COUNTERS: usize = 12;
const WOULD_REFUSE: usize = 4;
const REPORTS: usize = 5;
const FAILURES: usize = 10;
const SUCCESSES: usize = 11;
/// More shards than the runtime has threads on any host we expect; a
/// thread past them shares one, which is correct, only slower.
const SHARDS: usize = 16;

/// A cache line (two, for the adjacent-line prefetcher) of counters.
#[repr(align(128))]
#[derive(Default)]
struct Shard([AtomicU64; COUNTERS]);

pub struct RouteCounters {
    shards: Box<[Shard]>,
}

impl Default for RouteCounters {
    fn default() -> Self {
        RouteCounters { shards: (0..SHARDS).map(|_| Shard::default()).collect() }
    }
}

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn my_shard() -> usize {
    SHARD.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS);
        }
        s.get()
    })
}

impl RouteCounters {
    fn add(&self, counter: usize) {
        self.shards[my_shard()].0[counter].fetch_add(1, Ordering::Relaxed);
    }

    /// A check's verdict.
    pub fn check(&self, verdict: &Verdict<'_>) {
        self.add(decision_index(verdict.decision));
        if verdict.reason.is_monitored() {
            self.add(WOULD_REFUSE);
        }
    }

    /// A report's outcome and verdict.
    pub fn report(&self, verdict: &Verdict<'_>, outcome: Outcome) {
        self.add(REPORTS + decision_index(verdict.decision));
        if verdict.reason.is_monitored() {
            self.add(REPORTS + WOULD_REFUSE);
        }
        self.add(if outcome == Outcome::Failure { FAILURES } else { SUCCESSES });
    }

    pub fn read(&self, name: &str) -> RouteActivity {
        let mut sum = [0u64; COUNTERS];
        for shard in self.shards.iter() {
            for (total, counter) in sum.iter_mut().zip(shard.0.iter()) {
                *total += counter.load(Ordering::Relaxed);
            }
        }
        let counts = |at: usize| DecisionCounts {
            allow: sum[at],
            delay: sum[at + 1],
            challenge: sum[at + 2],
            deny: sum[at + 3],
            would_refuse: sum[at + WOULD_REFUSE],
        };
        RouteActivity {
            name: name.to_string(),
            checks: counts(0),
            reports: counts(REPORTS),
            failures: sum[FAILURES],
            successes: sum[SUCCESSES],
        }
    }
}

fn decision_index(decision: Decision) -> usize {
    match decision {
        Decision::Allow => 0,
        Decision::Delay => 1,
        Decision::Challenge => 2,
        Decision::Deny => 3,
    }
}
