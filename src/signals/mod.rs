//! Spray detection: the second axis. Per-key counters cannot see
//! an attack built to stay under every per-key threshold, one attempt per
//! account across thousands of accounts. These signals count *distinct*
//! things across keys over a sliding window, off the request path:
//!
//! - accounts failed per source prefix (`narrow_spray`) and per wide prefix,
//!   IPv4 /24 or IPv6 /48 (`wide_spray`), gated by the failure share, so an
//!   office's typos among thousands of successes do not count as a spray;
//! - prefixes failed per account (`account_distributed`, the distributed
//!   attack on one account);
//! - accounts failed per password tag (`password_spray`, one password tried
//!   everywhere), when the client sends the tag (protocol v3);
//! - a tenant's (or route's) failure ratio against its own baseline
//!   (`tenant_anomaly`);
//! - failing /64s per /56 and failing /56s per /48, which widen an IPv6
//!   block to one source.
//!
//! `report` sends a 64-byte `QueuedEvent` into a bounded queue (`pump`),
//! which the thread expands into a `SignalEvent` (`queued`);
//! successes count from a sample of accounts (`in_success_sample`);
//! the engine here ingests them, raises flags, and publishes a `FlagTable`
//! the request path reads with one atomic load. The engine is pure: no
//! clock (events carry their time), no locks, no I/O, so the simulator
//! drives it deterministically.

mod blocks;
mod family;
pub mod flags;
mod index;
pub mod pump;
pub mod queued;
mod raised;
pub mod sketch;
mod status;
mod tenants;

use std::collections::HashMap;
use std::collections::VecDeque;

use indexmap::IndexMap;

use crate::classes::SourceClass;
use crate::config::{Detector, DetectorMode, SignalsConfig};
use crate::expiring::DigestBuildHasher;
use crate::protocol::{DetectorStatus, FlaggedSubject, Outcome, SignalFamilyStatus, SignalsStatus};
use crate::source::Prefix;
use blocks::judge_block;
use family::{Family, Label, Tracked};
use flags::{flag_key, Flag, FlagTable, Space, WIDEN_48, WIDEN_56};
use raised::{Raised, Shown};
use sketch::SUB_WINDOWS;
pub use tenants::tenant_draw;
use tenants::{Tenant, TENANT_IDLE_US};

/// Flags listed in `status`, newest first.
pub const RECENT_FLAGS_SHOWN: usize = 32;
/// Entries sampled when the tenant or flag table is full.
const EVICTION_SAMPLES: usize = 5;
/// How many events ahead `ingest_all` prefetches index words, and then
/// entries: far enough for a miss (about 100 ns) to land before the event
/// is counted, at about 100 ns an event.
const INDEX_PREFETCH_AHEAD: usize = 8;
const ENTRY_PREFETCH_AHEAD: usize = 4;

/// One report, as the signals see it: digests and prefixes only. Built on
/// the request path without allocating.
#[derive(Clone, Copy, Debug)]
pub enum SignalEvent {
    /// A report the source, account and password axes count.
    Report(ReportEvent),
    /// An IPv4 success outside the success sample (`in_success_sample`)
    /// that `tenant_draw` picked: only its tenant's ratio counts it, as
    /// `weight` successes. The request path derives no wide prefix for it
    /// and the thread probes no table of sources.
    TenantSuccess { now_us: u64, tenant: u64, weight: u32 },
}

impl From<ReportEvent> for SignalEvent {
    fn from(report: ReportEvent) -> SignalEvent {
        SignalEvent::Report(report)
    }
}

/// Whether a success's `element` (an account's digest; for the IPv6
/// blocks, the smaller block's) is one of those whose successes count:
/// one in `every`, by a mix of the keyed digest, so an attacker cannot
/// choose an account in or out of the sample, and the choice shares no
/// bits with the sketches' registers or the tables' buckets. Consistent:
/// an account is in or out wherever it logs in from, so a sampled count
/// of distinct accounts times `every` estimates the distinct count.
pub fn in_success_sample(element: u64, every: u32) -> bool {
    every <= 1 || family::mix64(element).is_multiple_of(u64::from(every))
}

#[derive(Clone, Copy, Debug)]
pub struct ReportEvent {
    pub now_us: u64,
    pub outcome: Outcome,
    /// The same wrong password again for (account, prefix): feeds nothing
    /// but the tenant ratio (a stale client is one failure, not sixty).
    pub repeated: bool,
    /// The account knows the device: a failure from it feeds nothing but
    /// the tenant ratio either.
    pub known_device: bool,
    pub class: Option<SourceClass>,
    pub account: Option<u64>,
    /// The source prefix rules key on (/32 or /64 by default) and its digest.
    pub narrow: (u64, Prefix),
    /// IPv4 /24 or IPv6 /48.
    pub wide: (u64, Prefix),
    /// IPv6 only: the /56 and the /64's digest.
    pub v6: Option<V6Blocks>,
    /// The tenant's digest, or the route's when the request has no tenant.
    pub tenant: u64,
    /// The outcomes this report stands for in its tenant's ratio: 1 for a
    /// failure; for a success, `success_sample` if `tenant_draw` picked it,
    /// else 0 (it came for the source axes, as a sampled account's).
    pub tenant_weight: u32,
    /// The password tag re-keyed with the daemon's secret.
    pub password: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
pub struct V6Blocks {
    pub block56: (u64, Prefix),
    pub net64: u64,
}

#[derive(Default, Clone, Copy)]
struct DetectorCounts {
    raised_total: u64,
}

pub struct Signals {
    config: SignalsConfig,
    sub_us: u64,
    narrow: Family,
    wide: Family,
    /// /48 → distinct /56s, failed and succeeded (IPv6 only).
    blocks: Family,
    /// /56 → distinct /64s.
    blocks56: Family,
    /// A block (IPv4 /24, IPv6 /48 or /56) → distinct (part, account)
    /// pairs of its parts' first failed accounts (`accounts_per_source_max`
    /// a part): how many of its parts a count of accounts comes from.
    shares: Family,
    accounts: Family,
    passwords: Family,
    tenants: IndexMap<u64, Tenant, DigestBuildHasher>,
    tenants_evicted: u64,
    raised: IndexMap<u64, Raised, DigestBuildHasher>,
    flags_dropped: u64,
    counts: [DetectorCounts; Detector::ALL.len() + 1],
    recent: VecDeque<Shown>,
    changed: bool,
    events: u64,
    /// The earliest `until_us` among raised flags: `tick` scans them only then.
    next_expiry_us: u64,
    /// The sub-window of the last sweep: entries are swept once per sub-window.
    swept_epoch: u64,
    /// Sampling state (splitmix64) for the tenant and flag tables.
    rng: u64,
}

/// The index of widening in `counts` (after the detectors).
const WIDENING: usize = Detector::ALL.len();

impl Signals {
    pub fn new(config: &SignalsConfig) -> Signals {
        let c = config;
        Signals {
            sub_us: (c.window_us / SUB_WINDOWS as u64).max(1),
            narrow: Family::new("narrow_prefixes", c.prefixes_max, 1),
            wide: Family::new("wide_prefixes", c.wide_prefixes_max, 2),
            blocks: Family::new("blocks_48", c.blocks_max, 3),
            blocks56: Family::new("blocks_56", c.blocks_max, 4),
            shares: Family::new("source_shares", c.prefixes_max, 7),
            accounts: Family::roaming("accounts", c.accounts_max, 5),
            passwords: Family::new("passwords", c.passwords_max, 6),
            tenants: IndexMap::default(),
            tenants_evicted: 0,
            raised: IndexMap::default(),
            flags_dropped: 0,
            counts: Default::default(),
            recent: VecDeque::new(),
            changed: false,
            events: 0,
            next_expiry_us: u64::MAX,
            swept_epoch: 0,
            rng: 0x5EED,
            config: config.clone(),
        }
    }

    /// Applies a reloaded configuration; caps shrink by eviction.
    pub fn reconfigure(&mut self, config: &SignalsConfig) {
        if config.success_sample != self.config.success_sample {
            // The source tables' successes were counted at the old rate and
            // would be judged at the new weight: from 8 to 1, an office's
            // sampled eighth weighs 1 each and its next typos flag it. They
            // start over, as at a restart (failures and successes together,
            // so no share is judged on failures alone).
            for family in [&mut self.narrow, &mut self.wide, &mut self.blocks, &mut self.blocks56, &mut self.shares] {
                family.clear();
            }
            tracing::warn!(
                target: "tollgate::signals",
                from = self.config.success_sample,
                to = config.success_sample,
                "success_sample changed: the source tables start over"
            );
        }
        let caps = |c: &SignalsConfig| (c.wide_spray.accounts_per_source_max, c.narrow_spray.threshold);
        if caps(config) != caps(&self.config) {
            // Sums under other caps: they start over.
            self.shares.clear();
        }
        self.config = config.clone();
        self.sub_us = (config.window_us / SUB_WINDOWS as u64).max(1);
        self.narrow.set_entries_max(config.prefixes_max);
        self.wide.set_entries_max(config.wide_prefixes_max);
        self.blocks.set_entries_max(config.blocks_max);
        self.blocks56.set_entries_max(config.blocks_max);
        self.shares.set_entries_max(config.prefixes_max);
        self.accounts.set_entries_max(config.accounts_max);
        self.passwords.set_entries_max(config.passwords_max);
        self.changed = true;
    }

    /// Forgets every raised flag (spray detection turned off by a reload).
    pub fn clear_flags(&mut self) {
        self.raised.clear();
        self.next_expiry_us = u64::MAX;
        self.changed = false;
    }

    pub fn config(&self) -> &SignalsConfig {
        &self.config
    }

    fn families(&self) -> [&Family; 7] {
        [&self.narrow, &self.wide, &self.blocks, &self.blocks56, &self.shares, &self.accounts, &self.passwords]
    }

    /// Counts one report.
    pub fn ingest(&mut self, e: &SignalEvent) {
        match e {
            SignalEvent::Report(report) => self.ingest_report(report),
            SignalEvent::TenantSuccess { now_us, tenant, weight } => {
                self.events += 1;
                self.count_tenant(*tenant, Outcome::Success, *weight, *now_us, now_us / self.sub_us);
            }
        }
    }

    /// Ingests `events` in order, hinting the cache at the entries each
    /// will touch a few events ahead: first the index words, then the
    /// entries those words name. One event's misses then overlap with
    /// others' work instead of stalling the thread in turn. The hints
    /// change nothing but timing: the result is `ingest` of each in order.
    pub fn ingest_all(&mut self, events: &[SignalEvent]) {
        for (i, event) in events.iter().enumerate() {
            if let Some(SignalEvent::Report(ahead)) = events.get(i + INDEX_PREFETCH_AHEAD) {
                self.prefetch(ahead, Family::prefetch_index);
            }
            if let Some(SignalEvent::Report(ahead)) = events.get(i + ENTRY_PREFETCH_AHEAD) {
                self.prefetch(ahead, |family, key| family.prefetch_entry(key, ENTRY_PREFETCH_AHEAD as u64));
            }
            self.ingest(event);
        }
    }

    /// Applies `hint` to each large table `e` will probe (as
    /// `ingest_report` decides; the small ones stay cached).
    fn prefetch(&self, e: &ReportEvent, hint: impl Fn(&Family, u64)) {
        match (e.outcome, e.account) {
            (Outcome::Success, Some(account)) if in_success_sample(account, self.config.success_sample) => {
                hint(&self.accounts, account);
                hint(&self.narrow, e.narrow.0);
            }
            (Outcome::Failure, Some(account)) if !e.repeated && !e.known_device => {
                hint(&self.narrow, e.narrow.0);
                hint(&self.accounts, account);
                if let Some(tag) = e.password {
                    hint(&self.passwords, tag);
                }
            }
            _ => {}
        }
    }

    /// Counts one report that carries its source.
    pub fn ingest_report(&mut self, e: &ReportEvent) {
        self.events += 1;
        let epoch = e.now_us / self.sub_us;
        let now = e.now_us;
        self.count_tenant(e.tenant, e.outcome, e.tenant_weight, now, epoch);
        match e.outcome {
            // Only the sample's successes (see `in_success_sample`); each
            // weighs `success_sample` in the failure shares.
            Outcome::Success => {
                let every = self.config.success_sample;
                if let Some(account) = e.account.filter(|a| in_success_sample(*a, every)) {
                    // An account succeeding from many sources in the window
                    // (one an attacker owns, logged into from every address
                    // it has to dilute their failure shares) dilutes only
                    // the first `success_sources_max`. A person's laptop,
                    // phone and office NAT's addresses are a few.
                    let source = if e.class == Some(SourceClass::Mobile) { e.wide } else { e.narrow };
                    let roaming = self.accounts.succeed(account, Label::Digest, epoch, source.0, now);
                    if roaming.succeeded.count() <= self.config.success_sources_max {
                        self.narrow.succeed(e.narrow.0, Label::Prefix(e.narrow.1), epoch, account, now);
                        if let Some(v6) = e.v6.filter(|_| e.class != Some(SourceClass::Mobile)) {
                            self.narrow.succeed(v6.block56.0, Label::Prefix(v6.block56.1), epoch, account, now);
                        }
                        self.wide.succeed(e.wide.0, Label::Prefix(e.wide.1), epoch, account, now);
                    }
                }
                if let Some(v6) = e.v6 {
                    if in_success_sample(v6.block56.0, every) {
                        self.blocks.succeed(e.wide.0, Label::Prefix(e.wide.1), epoch, v6.block56.0, now);
                    }
                    if in_success_sample(v6.net64, every) {
                        self.blocks56.succeed(v6.block56.0, Label::Prefix(v6.block56.1), epoch, v6.net64, now);
                    }
                }
            }
            // A repeat is one failure, not sixty (a stale client). A failure
            // from a device the account knows is its owner's (a typo, a mail
            // client holding last month's password): a spray across
            // thousands of accounts cannot have their devices.
            Outcome::Failure if e.repeated || e.known_device => {}
            Outcome::Failure => {
                if let Some(account) = e.account {
                    let narrow_before = self.narrow.get(e.narrow.0).map_or(0, |n| n.failed.count_in(epoch));
                    let narrow = self.narrow.fail(e.narrow.0, Label::Prefix(e.narrow.1), epoch, account, now);
                    let weight = self.config.success_sample;
                    let found = judge_source(narrow, &self.config.narrow_spray, weight);
                    let narrow_accounts = narrow.failed.count();
                    // Its first account this sub-window (see `spread`).
                    let mut fresh = narrow_before == 0;
                    self.raise_on(Detector::NarrowSpray, Space::Prefix, e.narrow.0, found, now);
                    let mobile = e.class == Some(SourceClass::Mobile);
                    // A flag on a block (an IPv6 source's /56, its /24 or
                    // /48) falls on every address in it, so it is judged on
                    // its parts' failed accounts, each part's counting at
                    // most `accounts_per_source_max` (`spread`), against its
                    // successes, as well as on its accounts: a few customers
                    // never flag their neighbours, even where those mistype
                    // now and then, while a spray through the block counts
                    // every part. A phone, which hops its carrier's
                    // addresses, adds nothing.
                    if !mobile {
                        let mut part = (e.narrow.0, narrow_accounts);
                        // An IPv6 source is also judged as its /56, a
                        // customer's block, which is the part its /48 counts.
                        if let Some(v6) = e.v6 {
                            let hidden = self.hidden_max();
                            let spread = self.spread(v6.block56, part, fresh, hidden, epoch, now);
                            let label = Label::Prefix(v6.block56.1);
                            let block_before = self.narrow.get(v6.block56.0).map_or(0, |n| n.failed.count_in(epoch));
                            let block = self.narrow.fail(v6.block56.0, label, epoch, account, now);
                            let found = judge_block(block, spread, &self.config.narrow_spray, weight);
                            part = (v6.block56.0, block.failed.count());
                            fresh = block_before == 0;
                            self.raise_on(Detector::NarrowSpray, Space::Prefix, v6.block56.0, found, now);
                        }
                        let hidden = if e.v6.is_some() { self.hidden_max_56() } else { self.hidden_max() };
                        let spread = self.spread(e.wide, part, fresh, hidden, epoch, now);
                        let wide = self.wide.fail(e.wide.0, Label::Prefix(e.wide.1), epoch, account, now);
                        let found = judge_block(wide, spread, &self.config.wide_spray, weight);
                        self.raise_on(Detector::WideSpray, Space::Prefix, e.wide.0, found, now);
                    }
                    // A mobile source hops addresses within its carrier's
                    // pool: count its wide prefix, or one person would look
                    // like many sources.
                    let source = if e.class == Some(SourceClass::Mobile) { e.wide } else { e.narrow };
                    let tracked = self.accounts.fail(account, Label::Digest, epoch, source.0, now);
                    let count = tracked.failed.count();
                    let found = (count >= self.config.account_distributed.threshold).then_some(count);
                    self.raise_on(Detector::AccountDistributed, Space::Account, account, found, now);
                    if let Some(tag) = e.password {
                        let tracked = self.passwords.fail(tag, Label::Digest, epoch, account, now);
                        let count = tracked.failed.count();
                        let found = (count >= self.config.password_spray.threshold).then_some(count);
                        self.raise_on(Detector::PasswordSpray, Space::Password, tag, found, now);
                    }
                }
                if let Some(v6) = e.v6 {
                    let widening = &self.config.ipv6_widening;
                    let may_widen = widening.mode != DetectorMode::Off
                        && e.class.is_none_or(|c| !widening.never_classes.contains(&c));
                    let (per_48, per_56, share_min) = (widening.per_48, widening.per_56, widening.failure_share_min);
                    // A /48 counts its failing /56s, not /64s: one customer's
                    // /56 (256 /64s) can widen only itself, never the
                    // ISP's /48 around it and its other customers.
                    let block = self.blocks.fail(e.wide.0, Label::Prefix(e.wide.1), epoch, v6.block56.0, now);
                    let weight = self.config.success_sample;
                    let found = judge_widening(block, per_48, share_min, weight);
                    if may_widen {
                        self.widen(WIDEN_48, e.wide.0, found, per_48, now);
                    }
                    let block = self.blocks56.fail(v6.block56.0, Label::Prefix(v6.block56.1), epoch, v6.net64, now);
                    let found = judge_widening(block, per_56, share_min, weight);
                    if may_widen {
                        self.widen(WIDEN_56, v6.block56.0, found, per_56, now);
                    }
                }
            }
        }
        self.hold_sketch_budget();
    }

    /// Keeps the sketches' heap under `sketch_bytes_max` by evicting from
    /// the family holding the most.
    fn hold_sketch_budget(&mut self) {
        while self.sketch_bytes() > self.config.sketch_bytes_max {
            let fattest = [
                &mut self.narrow,
                &mut self.wide,
                &mut self.blocks,
                &mut self.blocks56,
                &mut self.shares,
                &mut self.accounts,
                &mut self.passwords,
            ]
            .into_iter()
            .max_by_key(|f| f.heap_bytes)
            .expect("seven families");
            if fattest.len() == 0 {
                break;
            }
            fattest.evict_one();
        }
    }

    /// Expires flags, un-widens calm blocks, and drops entries that count
    /// nothing any more. Cheap unless a sub-window has passed.
    pub fn tick(&mut self, now_us: u64) {
        let per_48 = self.config.ipv6_widening.per_48;
        let per_56 = self.config.ipv6_widening.per_56;
        let epoch = now_us / self.sub_us;
        if now_us >= self.next_expiry_us {
            self.expire_flags(now_us, epoch, per_48, per_56);
        }
        if epoch > self.swept_epoch {
            self.swept_epoch = epoch;
            let window_us = self.config.window_us;
            for family in [
                &mut self.narrow,
                &mut self.wide,
                &mut self.blocks,
                &mut self.blocks56,
                &mut self.shares,
                &mut self.accounts,
                &mut self.passwords,
            ] {
                family.sweep(now_us, window_us);
            }
            // A tenant's baseline outlives the window: a day of silence.
            self.tenants.retain(|_, t| t.touched_us + window_us.max(TENANT_IDLE_US) > now_us);
        }
    }

    fn next_random(&mut self) -> u64 {
        family::splitmix64(&mut self.rng)
    }

    /// Blocks widened so far.
    pub fn widenings_total(&self) -> u64 {
        self.counts[WIDENING].raised_total
    }

    /// Whether flags changed since the last `snapshot`.
    pub fn changed(&self) -> bool {
        self.changed
    }

    /// The table the request path reads.
    pub fn snapshot(&mut self) -> FlagTable {
        self.changed = false;
        let map: HashMap<u64, Flag, DigestBuildHasher> =
            self.raised.iter().map(|(k, r)| (*k, Flag { bits: r.bits, until_us: r.published_us })).collect();
        let mut enforced = Detector::ALL
            .into_iter()
            .filter(|d| self.config.mode(*d) == DetectorMode::Enforce)
            .fold(0u16, |m, d| m | d.bit() as u16);
        if self.config.ipv6_widening.mode == DetectorMode::Enforce {
            enforced |= WIDEN_48 | WIDEN_56;
        }
        FlagTable::new(map, enforced, &self.config.ipv6_widening.never_classes)
    }
}

/// A source detector's judgement: the failed count when it is at the
/// threshold with a failure share at or above the gate.
fn judge_source(entry: &Tracked, detector: &crate::config::DetectorConfig, success_weight: u32) -> Option<u32> {
    let count = entry.failed.count();
    (count >= detector.threshold && entry.failure_share(success_weight) >= detector.failure_share_min).then_some(count)
}

fn judge_widening(block: &Tracked, threshold: u32, share_min: f64, success_weight: u32) -> Option<u32> {
    let count = block.failed.count();
    (count >= threshold && block.failure_share(success_weight) >= share_min).then_some(count)
}

#[cfg(test)]
mod tests;
