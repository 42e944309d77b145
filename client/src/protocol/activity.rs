//! The operator's view (version 4): the `Activity` reply that `tollgate top`
//! shows, the `Samples` reply's would-be refusals, and the latency
//! histogram's bucket arithmetic, which the daemon and the client must
//! agree on.

use super::{Decision, Reason};
use bincode::{Decode, Encode};

/// Version 4's operator view (`tollgate top`). Every list is bounded by
/// the daemon (named limits `activity.*` in `status`) and by the request's
/// `limit`. Accounts appear as `acct:` and 16 hex digits of their keyed
/// digest (the same as spray detection's flags), prefixes in CIDR form:
/// never a raw identifier.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Activity {
    pub now_ms: u64,
    /// When the counters below began (the daemon's start).
    pub since_ms: u64,
    pub routes: Vec<RouteActivity>,
    /// Check and report latency inside the daemon: from the start of the
    /// batch of frames a read delivered to the verdict's reply encoded (so a
    /// pipelined frame's includes the frames before it in its batch); one
    /// batch in `sample_every` per connection (see `LATENCY_BUCKETS`).
    pub latency: LatencyHistogram,
    /// The top-K summaries cover the current window and the one before it.
    pub top_window_ms: u64,
    pub top_refused_prefixes: Vec<PrefixCount>,
    pub top_failing_accounts: Vec<AccountCount>,
    /// Newest first.
    pub recent_refusals: Vec<RecentRefusal>,
    /// Newest first.
    pub recent_lockouts: Vec<RecentLockout>,
    /// Attempts and failures per account per day: today so far and yesterday.
    pub distributions: Vec<Distribution>,
    /// Events handed to the activity thread, and those dropped because its
    /// queue was full (the request path never waits for it).
    pub events: u64,
    pub events_dropped: u64,
    /// The decision log, when `[decision_log]` is on.
    pub decision_log: Option<DecisionLogStatus>,
}

/// Verdicts given on one route since the daemon started.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RouteActivity {
    pub name: String,
    pub checks: DecisionCounts,
    /// Reports' verdicts (a report answers with what a check would now say).
    pub reports: DecisionCounts,
    pub failures: u64,
    pub successes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DecisionCounts {
    pub allow: u64,
    pub delay: u64,
    pub challenge: u64,
    pub deny: u64,
    /// Allowed, but a rule in monitor mode would have refused.
    pub would_refuse: u64,
}

/// A log-linear histogram of nanoseconds: bucket `i` holds values below
/// `latency_bucket_upper_ns(i)` and at or above the bucket before's bound.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LatencyHistogram {
    /// Requests measured: one in `sample_every` of each connection's.
    pub samples: u64,
    pub sample_every: u32,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    /// `LATENCY_BUCKETS` counts, so that a viewer can take percentiles of
    /// the difference between two snapshots (the last second's).
    pub buckets: Vec<u64>,
}

/// Buckets of `LatencyHistogram`: four per power of two from 64 ns (the
/// first holds everything below 80 ns), so a bucket's upper bound
/// overstates any value in it by at most 25%; the last is unbounded.
pub const LATENCY_BUCKETS: usize = 4 * 30;

/// The exclusive upper bound of latency bucket `i`, in nanoseconds
/// (`u64::MAX` for the last).
pub fn latency_bucket_upper_ns(i: usize) -> u64 {
    if i + 1 >= LATENCY_BUCKETS {
        return u64::MAX;
    }
    let octave = (i / 4) as u32;
    let step = (i % 4) as u64 + 1;
    // 64 * 2^octave * (1 + step / 4)
    (64u64 << octave) + (16u64 << octave) * step
}

/// The bucket a latency of `ns` falls in.
pub fn latency_bucket(ns: u64) -> usize {
    if ns < 80 {
        return 0;
    }
    let scaled = ns / 16; // >= 5
    let octave = 63 - u64::leading_zeros(scaled) as usize; // floor(log2(scaled)) >= 2
                                                           // Within the octave [4 * 2^(octave-2), 8 * 2^(octave-2)) of `scaled`, 4 steps.
    let unit = 1u64 << (octave - 2);
    let step = (scaled / unit - 4) as usize; // 0..=3
    let i = (octave - 2) * 4 + step;
    // `upper(i)` = 16 * unit * (5 + step); the value may sit on a bound's
    // far side because of the division: one more bucket.
    let i = if ns >= latency_bucket_upper_ns(i) { i + 1 } else { i };
    i.min(LATENCY_BUCKETS - 1)
}

/// A source prefix and how many refusals it drew (a space-saving
/// summary: `refusals` may overstate by at most `error`).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PrefixCount {
    pub prefix: String,
    /// The source class, or empty when the address is in none.
    pub class: String,
    pub refusals: u64,
    pub error: u64,
}

/// An account digest (`acct:` and 16 hex digits) and its failures.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AccountCount {
    pub account: String,
    pub failures: u64,
    pub error: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RecentRefusal {
    pub at_ms: u64,
    pub route: String,
    pub rule: String,
    pub decision: Decision,
    pub reason: Reason,
    pub prefix: String,
    pub class: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RecentLockout {
    pub at_ms: u64,
    pub route: String,
    pub rule: String,
    pub prefix: String,
    /// `acct:` and 16 hex digits, or empty when the route has no account.
    pub account: String,
    pub retry_after_ms: u64,
}

/// How many attempts (or failures) accounts made in one day, from a
/// uniform sample of accounts chosen by a keyed hash: each sampled account
/// is counted exactly, from its first attempt of the day.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Distribution {
    /// `attempts` (checks) or `failures` (failed reports).
    pub name: String,
    /// `today` or `yesterday` (UTC days on the daemon's clock).
    pub day: String,
    pub day_start_ms: u64,
    /// Accounts seen that day, estimated: sampled accounts times 2^`sample_shift`.
    pub accounts: u64,
    pub accounts_sampled: u64,
    /// One account in 2^`sample_shift` is sampled.
    pub sample_shift: u32,
    pub p50: u32,
    pub p90: u32,
    pub p99: u32,
    pub p999: u32,
    /// The most of any account seen: the larger of the sample's and the
    /// top-K summary's (which sees every failure, not only the sample's).
    pub max: u32,
    pub histogram: Vec<HistogramBucket>,
}

/// Accounts whose count was at most `upto` and above the bucket before's.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HistogramBucket {
    pub upto: u32,
    /// Estimated accounts (sampled times 2^`sample_shift`).
    pub accounts: u64,
}

/// One would-be refusal of a rule in monitor mode: enough to walk it to
/// its cause, and nothing that names anyone.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct WouldBeRefusal {
    pub at_ms: u64,
    pub route: String,
    pub rule: String,
    /// `check` (only checks count would-be refusals; the field leaves room
    /// for a later daemon's `report`).
    pub op: String,
    pub reason: Reason,
    pub prefix: String,
    pub class: String,
    /// `acct:` and 16 hex digits, or empty.
    pub account: String,
    /// `dev:` and 16 hex digits of the device's keyed digest, or empty.
    pub device: String,
    /// Whether the account has succeeded from this device before.
    pub known_device: bool,
}

/// The decision log's state (`[decision_log]`).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DecisionLogStatus {
    /// The directory the files are in.
    pub path: String,
    pub records_written: u64,
    /// Records lost: the queue was full, or the file could not be written.
    pub records_dropped: u64,
    pub bytes_written: u64,
    /// Log files in the directory now (the one being written among them).
    pub files: u64,
    pub write_errors: u64,
    pub last_error: Option<String>,
}
