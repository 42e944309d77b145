//! The limiter: routes, their rules, and the tables behind them. Given a
//! request and the time, it answers with a verdict. It reads no clock and
//! does no I/O; changes to persist go to the `Journal` it is given.
//!
//! Tables are sharded, each shard behind a `std::sync::Mutex` held for one
//! table step and never across an `.await`: a step is a few hundred
//! nanoseconds, so a blocking mutex beats an async one, and sharding keeps
//! two cores from queueing on one lock. Tables live behind `Arc`s so that a
//! reloaded limiter keeps every counter and lockout of the rules it keeps.

mod bans;
mod build;
mod check;
mod global;
mod inspect;
mod known_lockouts;
mod maintenance;
mod observe;
mod route;
mod shards;
mod spent_keys;
mod status;
mod store_names;
mod store_reply;
mod subject;
mod verdict;
mod write_back;

pub use bans::BanChange;
pub use global::{AwaitingStore, Begun};
pub use maintenance::Restored;
pub use observe::Facts;
pub use spent_keys::Echo;
pub use store_reply::Stored;

use std::sync::Arc;

use crate::bans::BanTable;
use crate::classes::ClassTable;
use crate::config::Detector;
use crate::config::{DeviceScope, ResponsePolicy};
use crate::exemptions::ExemptionTable;
use crate::expiring::Slot;
use crate::failure_window::{FailureWindowTable, Recorded, Settled};
use crate::keys::{Component, Key, KeyDeriver};
use crate::protocol::{Outcome, Subject, Verdict};
use crate::signals::flags::{Hits, Space};
use crate::signals::pump::SignalsLink;
use crate::source::SourcePolicy;
use crate::store::{CellRows, Durable, Journal};
use route::{RecentPasswords, Route, Rule, Table};
use shards::shard_index;
use subject::{check_lengths, RuleKeys, SubjectKeys};
use verdict::{combine, failure_answer, rate_answer, rate_spec, Answers};

pub use crate::protocol::IDENTIFIER_BYTES_MAX;
pub use crate::source::FORWARDED_FOR_BYTES_MAX;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    /// The name asked (its first 64 characters) and the routes there are.
    #[error("unknown route `{name}`; the routes are {known}")]
    UnknownRoute { name: String, known: String },
    #[error("route `{route}` needs `{field}` in the subject")]
    MissingField { route: String, field: &'static str },
    #[error("`{field}` is {len} bytes; the maximum is {max}")]
    FieldTooLong { field: &'static str, len: usize, max: usize },
}

/// Which of a route's rules a step covers: in shared mode the global
/// rules go to the store, and this host's tables hold only their
/// degraded share.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rules {
    All,
    Host,
    Global,
}

impl Rules {
    /// Whether this host's rules (signal rules among them) are covered.
    fn has_host(self) -> bool {
        self != Rules::Global
    }

    fn has(self, rule: &route::Rule) -> bool {
        match self {
            Rules::All => true,
            Rules::Host => rule.global.is_none(),
            Rules::Global => rule.global.is_some(),
        }
    }
}

/// What `Limiter::derive` gives a check and a report beside their subject's
/// keys (which stay in the caller's frame: a few hundred bytes).
struct Derived {
    known: bool,
    device: Option<Key>,
    rule_keys: RuleKeys,
}

/// A report with its keys derived and its password judged.
struct PreparedReport<'l> {
    /// The route, the client's class and whether this host knows the
    /// device, as for a check (`CheckPlan`).
    facts: Facts<'l>,
    rule_keys: RuleKeys,
    /// None: the attempt was abandoned (it settles its places, counts nothing).
    outcome: Option<Outcome>,
    repeated: bool,
    /// As in `CheckPlan`.
    device: Option<Key>,
    /// What spray detection has flagged of this subject.
    hits: Hits,
}

/// What a report says beyond its route and subject: the outcome (None: the
/// attempt ended without one and gives its place back) and the client's
/// keyed password digest and tag, when it sent them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub outcome: Option<Outcome>,
    pub password_digest: Option<[u8; 16]>,
    pub password_tag: Option<[u8; 16]>,
}

/// A check with its keys derived, not yet decided (see `plan_check`).
pub struct CheckPlan<'l> {
    /// The route, the client's class, whether this host knows the device,
    /// and what observation is given with the verdict.
    facts: Facts<'l>,
    rule_keys: RuleKeys,
    /// Shared mode, with an account and a device: the (account, device)
    /// key, which the store looks up to decide device-scoped global rules.
    device: Option<Key>,
    /// The client's keyed digest of the password alone (protocol v3): a
    /// check looks it up among the flagged passwords, never stores it.
    password_tag: Option<[u8; 16]>,
    /// What spray detection's flags say of this subject so far (not the
    /// flags themselves: a plan may wait across a slow reply, and a held
    /// guard takes one of the few slots that keep every other load on its
    /// thread free of a shared reference count).
    hits: Hits,
    /// When the ban covering the client's network ends, if one does: the
    /// check is denied without touching a rule.
    banned_until: Option<u64>,
}

impl<'l> CheckPlan<'l> {
    /// What observation is given with this check's verdict.
    pub fn facts(&self) -> Facts<'l> {
        self.facts
    }

    /// The attempt's password tag, when the client sent one.
    pub fn password_tag(&self) -> Option<[u8; 16]> {
        self.password_tag
    }

    /// The attempt's password tag, when the client sent one.
    pub fn with_password_tag(mut self, password_tag: Option<[u8; 16]>) -> Self {
        self.set_password_tag(password_tag);
        self
    }

    /// The same, in place.
    pub fn set_password_tag(&mut self, password_tag: Option<[u8; 16]>) {
        self.password_tag = password_tag;
    }
}

/// The routes and tables; shared by every connection.
pub struct Limiter {
    routes: Vec<Route>,
    source: SourcePolicy,
    /// `[[source.exemptions]]`, with the checks each has exempted.
    exemptions: ExemptionTable,
    /// The operator's bans; one table for every limiter a reload builds.
    bans: Arc<BanTable>,
    classes: Arc<ClassTable>,
    responses: ResponsePolicy,
    keys: KeyDeriver,
    journal: Journal,
    /// How long a checked attempt holds its place on failure rules without
    /// a report (`attempt_timeout_ms`).
    attempt_timeout_us: u64,
    /// Shared mode: the store's key prefix. Global rules go to the store.
    shared_prefix: Option<String>,
    /// Shared mode: unlocks heard lately, so that a reply in flight across
    /// one does not bring its lockout back (`known_lockouts.rs`).
    recent_unlocks: Arc<known_lockouts::RecentUnlocks>,
    /// The hosts sharing the global rules' limits, for their degraded share.
    hosts: u32,
    /// Spray detection: where reports go, and the flags checks read.
    signals: Option<Arc<SignalsLink>>,
    /// Whether this configuration has `[signals]`. The link outlives a
    /// reload that turns spray detection off (the engine keeps its flags
    /// until they expire), so this, not the link, says whether checks read
    /// the flags: off means no widening and no signal rule, at once.
    signals_on: bool,
    /// `signals.success_sample`: the request path leaves the other
    /// accounts' IPv4 successes at their tenant's count.
    success_sample: u32,
}

impl Limiter {
    fn route(&self, name: &str) -> Result<&Route, RequestError> {
        self.routes.iter().find(|r| r.name == name).ok_or_else(|| RequestError::UnknownRoute {
            name: name.chars().take(64).collect(),
            known: self.routes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(", "),
        })
    }

    /// Shared mode, a route that keeps known devices, and a request with an
    /// account and a device: the (account, device) key the store looks up.
    fn device_in_store(&self, route: &Route, keys: &mut SubjectKeys<'_, '_>) -> Result<Option<Key>, RequestError> {
        if self.shared_prefix.is_none()
            || route.known_devices.is_none()
            || keys.subject.account.is_none()
            || keys.subject.device.is_none()
        {
            return Ok(None);
        }
        keys.key(&[Component::Account, Component::Device]).map(Some)
    }

    /// The keys of a plan made for the store (`rule_keys_deciding`) as this
    /// host decides device scope, when it decides alone (degraded, or no
    /// store): a rule whose scope does not match this host's knowledge of
    /// the device does not apply.
    fn scoped_here(&self, route: &Route, mut rule_keys: RuleKeys, known: bool) -> RuleKeys {
        for (rule, key) in route.rules.iter().zip(rule_keys.iter_mut()) {
            let applies = match rule.devices {
                DeviceScope::All => true,
                DeviceScope::UnknownDevices => !known,
                DeviceScope::KnownDevices => known,
            };
            if !applies {
                *key = None;
            }
        }
        rule_keys
    }

    /// What a check and a report derive alike, before any table is
    /// touched: whether this host knows the device (a known device keeps
    /// its narrow prefix in `keys`), the (account, device) key the store
    /// looks up, and each rule's key. One derivation for both, so a
    /// report always counts on the keys its check spent.
    fn derive(&self, route: &Route, keys: &mut SubjectKeys<'_, '_>, now_us: u64) -> Result<Derived, RequestError> {
        check_lengths(keys.subject)?;
        let known = self.known_device(route, keys, now_us)?;
        keys.known_device_keeps_its_prefix(known);
        let device = self.device_in_store(route, keys)?;
        let rule_keys = keys.rule_keys(&route.rules, known, device.is_some())?;
        Ok(Derived { known, device, rule_keys })
    }

    fn known_device(&self, route: &Route, keys: &mut SubjectKeys<'_, '_>, now_us: u64) -> Result<bool, RequestError> {
        let Some(known) = &route.known_devices else { return Ok(false) };
        if keys.subject.account.is_none() || keys.subject.device.is_none() {
            return Ok(false);
        }
        let key = keys.key(&[Component::Account, Component::Device])?;
        Ok(known.shards.of(key).get(key.tuple, now_us).is_some())
    }

    /// `report`: counts a failure on every failure rule that applies, or
    /// clears the (own-key) entries of rules cleared by success, and records
    /// a known device on success. Returns the verdict a check would now give
    /// (without spending or climbing), and, for each key this report
    /// locked, the durable write the reply must wait for.
    pub fn report<'a>(
        &'a self,
        route: &str,
        subject: &Subject<'_>,
        outcome: Outcome,
        password_digest: Option<[u8; 16]>,
        now_us: u64,
    ) -> Result<(Verdict<'a>, Vec<Durable>), RequestError> {
        let report = Report { outcome: Some(outcome), password_digest, password_tag: None };
        self.report_with(route, subject, &report, now_us)
    }

    /// `report` with all a client may send: the attempt's password tag
    /// (protocol v3), which a failure feeds to the password axis of spray
    /// detection, or no outcome (an abandoned attempt: each failure rule
    /// gives back the newest place held on its key, and nothing is
    /// counted, remembered or sent to spray detection).
    pub fn report_with<'a>(
        &'a self,
        route: &str,
        subject: &Subject<'_>,
        report: &Report,
        now_us: u64,
    ) -> Result<(Verdict<'a>, Vec<Durable>), RequestError> {
        let prepared = self.prepare_report(route, subject, report, now_us)?;
        Ok(self.report_here(&prepared, now_us))
    }

    /// A prepared report counted on every rule by this host alone: what
    /// `report_with` does, and what `begin_report` does for a report no
    /// global rule needs the store for.
    fn report_here<'a>(&'a self, prepared: &PreparedReport<'a>, now_us: u64) -> (Verdict<'a>, Vec<Durable>) {
        let mut answers = Answers::new();
        let mut durable = Vec::new();
        self.report_rules(prepared, Rules::All, true, now_us, &mut answers, &mut durable);
        debug_assert!(prepared.outcome.is_some() || durable.is_empty(), "an abandoned attempt locks nothing");
        (combine(&answers), durable)
    }

    /// A report's first half, the same for every rule: its keys, whether
    /// its password is a repeat, and a success's known device.
    fn prepare_report<'a>(
        &'a self,
        route: &str,
        subject: &Subject<'_>,
        report: &Report,
        now_us: u64,
    ) -> Result<PreparedReport<'a>, RequestError> {
        let Report { outcome, password_digest, password_tag } = *report;
        let route = self.route(route)?;
        // Every key is derived before any table is touched, so a missing
        // field cannot leave a report counted on some rules and not others.
        let mut keys = self.subject_keys_at(&route.name, subject, now_us);
        let Derived { known, device, rule_keys } = self.derive(route, &mut keys, now_us)?;
        let repeated = match (outcome, password_digest, &route.recent_passwords) {
            (Some(Outcome::Failure), Some(digest), Some(recent))
                if keys.has(Component::Prefix) && keys.has(Component::Account) =>
            {
                let key = keys.key(&[Component::Account, Component::Prefix])?;
                self.remember_password(recent, key, &digest, now_us)
            }
            _ => false,
        };
        if outcome == Some(Outcome::Success) {
            if let (Some(known_devices), true) =
                (&route.known_devices, keys.has(Component::Device) && keys.has(Component::Account))
            {
                let key = keys.key(&[Component::Account, Component::Device])?;
                known_devices.remember(key, now_us);
            }
        }
        let mut hits = Hits::default();
        if let (true, Some(link)) = (route.feeds_signals, &self.signals) {
            let password64 = password_tag.map(|tag| self.keys.password_tag(&tag));
            let event = outcome.and_then(|outcome| {
                keys.signal_event(route, outcome, repeated, known, password64, self.success_sample)
            });
            if let Some(event) = event {
                link.send(event);
            }
            hits = keys.hits(route);
            if let (Some(flags), Some(tag)) = (&keys.flags, password64) {
                hits.add(flags, flags.probe(Space::Password, tag, now_us), Detector::PasswordSpray.bit());
            }
        }
        let facts = Facts::new(self, route, &mut keys, known);
        Ok(PreparedReport { facts, rule_keys, outcome, repeated, device, hits })
    }

    /// Counts a report on this host's tables for the rules of `which`. With
    /// `settle`, each failure rule first settles the place its check took.
    fn report_rules<'a>(
        &'a self,
        report: &PreparedReport<'a>,
        which: Rules,
        settle: bool,
        now_us: u64,
        answers: &mut Answers<'a>,
        durable: &mut Vec<Durable>,
    ) {
        let PreparedReport { facts: Facts { route, class, .. }, ref rule_keys, outcome, repeated, .. } = *report;
        for (rule, key) in route.rules.iter().zip(rule_keys.iter().copied()) {
            let Some(key) = key else { continue };
            if !which.has(rule) {
                continue;
            }
            match &rule.table {
                Table::Failures { cleared_by_success, shards, .. } => {
                    let mut table = shards.of(key);
                    // The report settles the place its check took, in the
                    // same step as it is counted: the place becomes a
                    // failure, or is released, never both nor neither. A
                    // presumed failure (no room for a place) is the
                    // failure already, or is taken back.
                    let fails = outcome == Some(Outcome::Failure) && !repeated;
                    let settled = if settle { table.settle(key, now_us, fails) } else { Settled::Nothing };
                    match outcome {
                        _ if fails && settled == Settled::Presumed => {}
                        Some(Outcome::Failure) if !repeated => match table.record_failure(key, now_us) {
                            Ok(recorded) if recorded.now_locked && !recorded.was_locked => {
                                self.journal_lockout(rule, &mut table, key, recorded, durable);
                            }
                            Ok(_) => {}
                            Err(_) => self.spill_failure(rule, &mut table, key, now_us, durable),
                        },
                        Some(Outcome::Success) if *cleared_by_success => {
                            table.clear(key);
                        }
                        _ => {}
                    }
                    let spec = table.spec();
                    // The failures the table and its overflow sketch hold.
                    let standing = table.standing(key, now_us);
                    drop(table);
                    let refused = spec.refuses(standing.counts, standing.in_flight, now_us);
                    let answer = failure_answer(rule, spec, standing, refused, now_us);
                    answers.push(self.escalate(rule, key, answer, now_us, false));
                }
                Table::Rate { shards, .. } => {
                    let spec = rate_spec(&rule.table, class);
                    let decision = shards.of(key).peek(spec, key, now_us);
                    answers.push(self.escalate(rule, key, rate_answer(rule, spec, decision), now_us, false));
                }
                Table::Signal { .. } => {}
            }
        }
        if which.has_host() {
            self.judge_signals(route, rule_keys, report.hits, now_us, false, answers);
        }
    }

    /// A failure that locked its key: written while the shard is locked, so
    /// it is queued before any later change of this key. Out of line (a
    /// lockout is rare beside the failures before it), as is the spill:
    /// their code kept the common failure's from fitting the instruction
    /// cache.
    #[cold]
    #[inline(never)]
    fn journal_lockout(
        &self,
        rule: &Rule,
        table: &mut FailureWindowTable,
        key: Key,
        recorded: Recorded,
        durable: &mut Vec<Durable>,
    ) {
        let window_us = table.spec().window_us;
        let change = vec![(key, Some(recorded.counts))];
        durable.push(self.journal.write_durably(&rule.id, window_us, change));
        table.mark_persisted(key);
    }

    /// A failure the full table could not hold: a lockout of such a key is
    /// as durable as any other, its sketch cells written before the
    /// refusal is given.
    #[cold]
    #[inline(never)]
    fn spill_failure(
        &self,
        rule: &Rule,
        table: &mut FailureWindowTable,
        key: Key,
        now_us: u64,
        durable: &mut Vec<Durable>,
    ) {
        if !table.spill(key, now_us) {
            return;
        }
        if let Some(changes) = table.take_spilled_lockout(key, now_us) {
            let shard = shard_index(key.tuple) as u8;
            let rows = CellRows { rule: rule.id.clone(), window_us: table.spec().window_us, shard, changes };
            durable.extend(self.journal.write_cells(rows, true));
        }
    }

    /// Records a wrong-password digest for (account, prefix); true if it was
    /// one of the last few already (a repeat, not a new guess).
    fn remember_password(&self, recent: &RecentPasswords, key: Key, digest: &[u8; 16], now_us: u64) -> bool {
        // Re-keyed with the daemon's secret and cut to 32 bits: enough to
        // tell a few passwords apart, useless to anyone reading memory.
        let mine = self.keys.component(Component::Account, digest);
        let tag = u32::from_le_bytes([mine[0], mine[1], mine[2], mine[3]]) | 1; // 0 marks an empty slot
        let mut table = recent.shards.of(key);
        let mut seen = table.get(key.tuple, now_us).map_or([0; 4], |s| s.value);
        let repeated = seen[..recent.remembered].contains(&tag);
        if !repeated {
            seen.copy_within(0..recent.remembered - 1, 1);
            seen[0] = tag;
        }
        table.set(key.tuple, Slot { expires_us: now_us + recent.ttl_us, value: seen }, now_us);
        repeated
    }
}

#[cfg(test)]
mod spray_tests;
#[cfg(test)]
mod tests;
