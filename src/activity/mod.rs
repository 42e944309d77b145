//! What the operator's view shows: verdicts per route, request
//! latency, the top refused prefixes and failing accounts, recent refusals
//! and lockouts, attempts and failures per account per day, and a sample
//! of monitor mode's would-be refusals. Read by `tollgate top`, `sample`,
//! `status` and `metrics` through the version-4 `Activity` and `Samples`
//! requests.
//!
//! Two halves, as spray detection has. The request path counts what every
//! request moves itself (per-route verdicts in `counters`, latency in
//! `latency`), and hands the rarer, richer events (refusals, failures,
//! lockouts, sampled attempts) to one thread through a bounded queue that
//! drops (and counts) rather than block. The thread (`Observer`) keeps
//! every structure bounded by `[activity]`. Accounts are keyed digests
//! (`account_tag`, the `acct:` of spray detection's flags), prefixes are
//! networks: nothing here can name anyone.

pub mod counters;
pub mod latency;
mod per_day;
mod reservoir;
mod top_k;

use std::collections::VecDeque;
use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use siphasher::sip::SipHasher13;

use crate::classes::SourceClass;
use crate::config::{ActivityConfig, ACTIVITY_LATENCY_SAMPLE_EVERY};
use crate::drop_queue::{drop_queue, DropQueue};
use crate::expiring::DigestBuildHasher;
use crate::protocol::{
    AccountCount, Activity, Decision, Distribution, PrefixCount, Reason, RecentLockout, RecentRefusal, WouldBeRefusal,
};
use crate::source::Prefix;
use crate::unpoisoned::Unpoisoned;
use latency::Latency;
use per_day::{sampled, DaySample, DAY_US};
use reservoir::Reservoir;
use top_k::TopK;

/// How often the thread drains the queue. It sleeps rather than waits on
/// the queue: a receiver blocked in `recv` makes every `try_send` wake it
/// (a futex call and a context switch per event, on the request path),
/// while one asleep is never woken. At 20 ms a full default queue
/// (65,536) holds 3 million events a second.
const DRAIN_INTERVAL_MS: u64 = 20;

/// A refusal, would-be refusal or lockout, as the request path saw it.
pub struct Refused {
    pub at_us: u64,
    /// `route/rule`.
    pub rule: Arc<str>,
    pub op: &'static str,
    pub decision: Decision,
    pub reason: Reason,
    pub retry_after_ms: u64,
    pub prefix: Option<Prefix>,
    pub class: Option<SourceClass>,
    /// The account's `account_tag` and 64 bits of the device's digest;
    /// only for a would-be refusal or a lockout (the top lists of enforced
    /// refusals key on the network, and a flood of refusals must not buy
    /// the request path a digest each).
    pub account: Option<u64>,
    pub device: Option<u64>,
    pub known_device: bool,
}

pub enum Event {
    /// A check naming a sampled account (`ActivityLink::sample`).
    Attempt { at_us: u64, sample: u64 },
    /// A failed report: `sample` places it in the day's sample, `account`
    /// in the top failing accounts.
    Failure { at_us: u64, sample: u64, account: u64 },
    /// A check refused, or allowed where a monitored rule would have refused.
    Refused(Box<Refused>),
    /// A report that locked a key.
    Lockout(Box<Refused>),
}

/// What the request path holds.
pub struct ActivityLink {
    queue: DropQueue<Event>,
    events: AtomicU64,
    /// Today's sample: an account is in it when its hash has this many
    /// leading zeros. Published by the thread, read by every check, so an
    /// unsampled account costs one hash and no event. The day it is of
    /// comes with it (`day << 6 | shift`): a check on a later day than the
    /// thread has rolled to is in the new day's sample, which starts whole.
    sample_of: AtomicU64,
    /// The sample's hash key, drawn at start: no client can aim accounts
    /// at the sample or away from it.
    sample_key: (u64, u64),
    pub latency: Latency,
}

impl ActivityLink {
    /// The account's place in the day's sample (a keyed SipHash, a tenth
    /// of the cost of its BLAKE2 digest).
    pub fn sample(&self, account: &str) -> u64 {
        let mut h = SipHasher13::new_with_keys(self.sample_key.0, self.sample_key.1);
        h.write(account.as_bytes());
        h.finish()
    }

    /// Whether a check at `now_us` of an account whose `sample` this is
    /// is in the day's sample.
    pub fn in_sample(&self, sample: u64, now_us: u64) -> bool {
        let published = self.sample_of.load(Ordering::Relaxed);
        let (day, shift) = (published >> 6, (published & 63) as u32);
        now_us / DAY_US > day || sampled(sample, shift)
    }

    /// The thread's day and sample, for `in_sample`.
    fn publish(&self, today: &DaySample) {
        self.sample_of.store(today.day() << 6 | u64::from(today.shift().min(63)), Ordering::Relaxed);
    }

    /// Queues an event; never blocks (a full queue drops and counts it).
    pub fn send(&self, event: Event) {
        self.events.fetch_add(1, Ordering::Relaxed);
        self.queue.send(event);
    }

    pub fn events(&self) -> (u64, u64) {
        (self.events.load(Ordering::Relaxed), self.queue.dropped())
    }
}

/// The link, the observer (shared with `status`), and the queue's far end
/// for the thread.
pub fn channel(config: &ActivityConfig, now_us: u64) -> (Arc<ActivityLink>, Arc<Mutex<Observer>>, Receiver<Event>) {
    let (queue, rx) = drop_queue(config.queue_max);
    let mut key = [0u8; 24];
    // Without the OS's randomness the sample is still uniform over
    // accounts; only its choice becomes predictable.
    let _ = getrandom::getrandom(&mut key);
    let sample_key = (
        u64::from_le_bytes(key[..8].try_into().expect("8 bytes")),
        u64::from_le_bytes(key[8..16].try_into().expect("8 bytes")),
    );
    // The reservoir's seed is its own: which would-be refusals it keeps is
    // shown to anyone who can connect, so its generator's state must not
    // be half of the sample's key.
    let reservoir_seed = u64::from_le_bytes(key[16..].try_into().expect("8 bytes"));
    let link = Arc::new(ActivityLink {
        queue,
        events: AtomicU64::new(0),
        sample_of: AtomicU64::new((now_us / DAY_US) << 6),
        sample_key,
        latency: Latency::new(ACTIVITY_LATENCY_SAMPLE_EVERY),
    });
    let observer = Arc::new(Mutex::new(Observer::new(config.clone(), now_us, reservoir_seed)));
    (link, observer, rx)
}

/// The thread: drains the queue into the observer until the link is gone.
pub fn run(rx: Receiver<Event>, observer: Arc<Mutex<Observer>>, link: Arc<ActivityLink>, now_us: impl Fn() -> u64) {
    loop {
        std::thread::sleep(Duration::from_millis(DRAIN_INTERVAL_MS));
        let mut more = true;
        while more {
            // The lock is taken per slice, so `status` is not kept waiting
            // behind a flood.
            let mut observer = observer.locked();
            observer.roll(now_us());
            more = false;
            for _ in 0..DRAIN_SLICE {
                match rx.try_recv() {
                    Ok(event) => {
                        observer.ingest(event);
                        more = true;
                    }
                    Err(TryRecvError::Empty) => {
                        more = false;
                        break;
                    }
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            link.publish(&observer.today);
        }
    }
}

/// Events ingested per hold of the observer's lock.
const DRAIN_SLICE: usize = 4096;

/// Everything the thread keeps, each bounded by `[activity]`.
pub struct Observer {
    config: ActivityConfig,
    started_us: u64,
    window_start_us: u64,
    /// Refusals by (prefix, class), this window and the one before.
    prefixes: [TopK<(Prefix, Option<SourceClass>)>; 2],
    /// Failures by account tag, this window and the one before.
    accounts: [TopK<u64, DigestBuildHasher>; 2],
    /// Failures by account tag today: the failures distribution's max.
    day_failures: TopK<u64, DigestBuildHasher>,
    /// Kept as they came and named only when read: a flood of refusals
    /// (what an attack makes of every check) must not format four strings
    /// each on this thread.
    recent_refusals: VecDeque<Box<Refused>>,
    recent_lockouts: VecDeque<RecentLockout>,
    today: DaySample,
    yesterday: Option<[Distribution; 2]>,
    samples: Reservoir<WouldBeRefusal>,
}

impl Observer {
    pub fn new(config: ActivityConfig, now_us: u64, seed: u64) -> Observer {
        let k = config.top_entries_max;
        Observer {
            started_us: now_us,
            window_start_us: now_us,
            prefixes: [TopK::new(k), TopK::new(k)],
            accounts: [TopK::new(k), TopK::new(k)],
            day_failures: TopK::new(k),
            recent_refusals: VecDeque::with_capacity(config.recent_max),
            recent_lockouts: VecDeque::with_capacity(config.recent_max),
            today: DaySample::new(now_us / DAY_US, config.accounts_sampled_max),
            yesterday: None,
            samples: Reservoir::new(config.samples_max, seed),
            config,
        }
    }

    pub fn config(&self) -> &ActivityConfig {
        &self.config
    }

    /// Ends the top-K window and the day when their time has come.
    pub fn roll(&mut self, now_us: u64) {
        let window_us = self.config.top_window_ms * 1000;
        if now_us >= self.window_start_us + window_us {
            // Two windows or more without an event: both are old.
            let idle = now_us >= self.window_start_us + 2 * window_us;
            self.prefixes.swap(0, 1);
            self.accounts.swap(0, 1);
            self.prefixes[0].clear();
            self.accounts[0].clear();
            if idle {
                self.prefixes[1].clear();
                self.accounts[1].clear();
            }
            self.window_start_us = now_us - (now_us - self.window_start_us) % window_us;
        }
        // Only forward: a queued event can be older than the last roll.
        let day = now_us / DAY_US;
        if day > self.today.day() {
            let floor = self.failures_max_floor();
            self.yesterday = (day == self.today.day() + 1).then(|| self.today.distributions("yesterday", floor));
            self.today = DaySample::new(day, self.config.accounts_sampled_max);
            self.day_failures.clear();
        }
    }

    fn failures_max_floor(&self) -> u64 {
        self.day_failures.top(1).first().map_or(0, |(_, count, error)| count - error)
    }

    pub fn ingest(&mut self, event: Event) {
        let at_us = match &event {
            Event::Attempt { at_us, .. } | Event::Failure { at_us, .. } => *at_us,
            Event::Refused(r) | Event::Lockout(r) => r.at_us,
        };
        self.roll(at_us);
        match event {
            Event::Attempt { sample, .. } => self.today.attempt(sample),
            Event::Failure { sample, account, .. } => {
                self.today.failure(sample);
                self.accounts[0].add(account, 1);
                self.day_failures.add(account, 1);
            }
            Event::Refused(r) if r.reason.is_monitored() => {
                self.samples.offer(WouldBeRefusal {
                    at_ms: r.at_us / 1000,
                    route: route_of(&r.rule).into(),
                    rule: rule_of(&r.rule).into(),
                    op: r.op.into(),
                    reason: r.reason,
                    prefix: prefix_text(r.prefix),
                    class: class_text(r.class),
                    account: r.account.map(account_text).unwrap_or_default(),
                    device: r.device.map(|d| format!("dev:{d:016x}")).unwrap_or_default(),
                    known_device: r.known_device,
                });
            }
            Event::Refused(r) => {
                if let Some(prefix) = r.prefix {
                    self.prefixes[0].add((prefix, r.class), 1);
                }
                push_bounded(&mut self.recent_refusals, self.config.recent_max, r);
            }
            Event::Lockout(r) => push_bounded(
                &mut self.recent_lockouts,
                self.config.recent_max,
                RecentLockout {
                    at_ms: r.at_us / 1000,
                    route: route_of(&r.rule).into(),
                    rule: rule_of(&r.rule).into(),
                    prefix: prefix_text(r.prefix),
                    account: r.account.map(account_text).unwrap_or_default(),
                    retry_after_ms: r.retry_after_ms,
                },
            ),
        }
    }

    /// The view, less what the daemon adds (routes, latency, events, the
    /// decision log): at most `limit` entries in each list.
    pub fn view(&self, limit: usize, now_us: u64) -> Activity {
        let prefixes = self.prefixes[0].merged(&self.prefixes[1], limit);
        let accounts = self.accounts[0].merged(&self.accounts[1], limit);
        let mut distributions: Vec<Distribution> =
            self.today.distributions("today", self.failures_max_floor()).into_iter().collect();
        distributions.extend(self.yesterday.iter().flatten().cloned());
        Activity {
            now_ms: now_us / 1000,
            since_ms: self.started_us / 1000,
            top_window_ms: self.config.top_window_ms,
            top_refused_prefixes: prefixes
                .into_iter()
                .map(|((prefix, class), refusals, error)| PrefixCount {
                    prefix: prefix_text(Some(prefix)),
                    class: class_text(class),
                    refusals,
                    error,
                })
                .collect(),
            top_failing_accounts: accounts
                .into_iter()
                .map(|(account, failures, error)| AccountCount { account: account_text(account), failures, error })
                .collect(),
            recent_refusals: self.recent_refusals.iter().rev().take(limit).map(|r| recent_refusal(r)).collect(),
            recent_lockouts: self.recent_lockouts.iter().rev().take(limit).cloned().collect(),
            distributions,
            ..Activity::default()
        }
    }

    /// The sample of would-be refusals, newest first, at most `limit`; how
    /// many there were; since when.
    pub fn samples(&self, limit: usize) -> (Vec<WouldBeRefusal>, u64, u64) {
        // Sorted by reference, then only `limit` cloned: a status reader
        // asking often must not hold the thread's lock for a full copy.
        let mut newest: Vec<&WouldBeRefusal> = self.samples.items().iter().collect();
        newest.sort_by_key(|s| std::cmp::Reverse(s.at_ms));
        let samples = newest.into_iter().take(limit).cloned().collect();
        (samples, self.samples.seen(), self.started_us / 1000)
    }
}

fn push_bounded<T>(ring: &mut VecDeque<T>, max: usize, item: T) {
    if ring.len() == max {
        ring.pop_front();
    }
    ring.push_back(item);
}

fn recent_refusal(r: &Refused) -> RecentRefusal {
    RecentRefusal {
        at_ms: r.at_us / 1000,
        route: route_of(&r.rule).into(),
        rule: rule_of(&r.rule).into(),
        decision: r.decision,
        reason: r.reason,
        prefix: prefix_text(r.prefix),
        class: class_text(r.class),
    }
}

fn route_of(id: &str) -> &str {
    id.split_once('/').map_or(id, |(route, _)| route)
}

fn rule_of(id: &str) -> &str {
    id.split_once('/').map_or("", |(_, rule)| rule)
}

fn prefix_text(prefix: Option<Prefix>) -> String {
    prefix.map(|p| p.to_string()).unwrap_or_default()
}

fn class_text(class: Option<SourceClass>) -> String {
    class.map(|c| c.name().to_string()).unwrap_or_default()
}

/// As spray detection names an account (`acct:` and the tag in hex).
pub fn account_text(tag: u64) -> String {
    format!("acct:{tag:016x}")
}

#[cfg(test)]
mod tests;
