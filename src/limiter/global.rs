//! Every check and report begins here (`begin_check`, `begin_report`), in
//! local and shared mode alike, and each gives a `Begun`: one without
//! global rules (every request in local mode) is decided at once by the
//! check and report paths. In shared mode one whose route has global rules
//! is decided in two halves around one store call: the first does this
//! host's rules and builds the op (`Begun::Store`); the second reads the
//! store's reply (`finish_stored`) or, when the store did not answer in
//! time, counts the global rules on this host's degraded tables
//! (`finish_locally`).
//!
//! The store's numbers are in the store's clock, so a global rule's answer
//! is computed at the store's `now` (every figure in a verdict is a
//! duration); a known lockout is kept here until this host's `now` plus
//! the store's remaining duration.

use super::known_lockouts::{store_applied_scoped, DevicesDecided};
use super::route::{Full, Route, Table};
use super::spent_keys::{spent, CountedWaiting, Echo};
use super::store_reply::{
    entry_counts, full_rate_spec, is_locked, lock_messages, parse_check, parse_report, scope, store_failure_answer,
    store_knows_device, Found, Stored,
};
use super::subject::RuleKeys;
use super::verdict::{busy_answer, combine, rate_answer, Answers, RuleAnswer};
use super::{CheckPlan, Facts, Limiter, PreparedReport, Report, RequestError, Rules};
use crate::classes::SourceClass;
use crate::failure_window::Settled;
use crate::gcra::decide;
use crate::keys::{Component, Key};
use crate::protocol::{Outcome, Reason, Subject, Verdict};
use crate::shared::script::{CheckRule, Op, Reply, ReplyError, ReportRule};
use crate::signals::flags::Hits;
use crate::store::Durable;
use smallvec::SmallVec;

/// A check after this host's rules, waiting for the store.
pub struct StoreCheck<'l> {
    pub(super) route: &'l Route,
    pub(super) rule_keys: RuleKeys,
    class: Option<SourceClass>,
    answers: Answers<'l>,
    /// Bit i: host rule i holds a place for this attempt.
    held: u32,
    /// Whether this host knows the device (for a local answer).
    known: bool,
    /// Spray detection's flags on the subject, when the signal rules wait
    /// for the store to say whether the device is known (another host may
    /// have seen it log in).
    hits: Hits,
    /// The (account, device) key when the op's first key is the device's
    /// (the rules' follow).
    device: Option<Key>,
    /// When it began: a lockout its reply reports is not remembered after
    /// an unlock heard since (`unlocked_since`).
    begun_us: u64,
    /// The op to send.
    pub op: Op,
}

/// A check's or report's first half (`begin_check`, `begin_report`).
pub enum Begun<'l> {
    /// Decided on this host (no global rule for it, a ban, or a host rule
    /// refused), with the durable writes a report's reply waits for:
    /// nothing to ask the store.
    Done(Verdict<'l>, Vec<Durable>),
    /// A check refused from memory: the store said this key is locked.
    KnownLockout(Verdict<'l>),
    /// This host's rules done, the global rules' op ready for the store.
    Store(AwaitingStore<'l>),
}

/// A check or report waiting for the store. Boxed: its keys and answers
/// are several hundred bytes, and the common `Begun::Done` should not
/// carry that size.
pub enum AwaitingStore<'l> {
    Check(Box<StoreCheck<'l>>),
    Report(Box<StoreReport<'l>>),
}

impl AwaitingStore<'_> {
    /// The op to send, taken out (it is sent once).
    pub fn take_op(&mut self) -> Op {
        match self {
            AwaitingStore::Check(check) => std::mem::take(&mut check.op),
            AwaitingStore::Report(report) => std::mem::take(&mut report.op),
        }
    }

    pub fn is_check(&self) -> bool {
        matches!(self, AwaitingStore::Check(_))
    }

    /// What its reply is read with if it comes late (`Limiter::heard_late`).
    pub fn echo(&self) -> Echo {
        let (route, rule_keys, begun_us, check) = match self {
            AwaitingStore::Check(c) => (c.route, &c.rule_keys, c.begun_us, true),
            AwaitingStore::Report(r) => (r.prepared.facts.route, &r.prepared.rule_keys, r.begun_us, false),
        };
        Echo { route: route.name.clone(), rule_keys: rule_keys.clone(), begun_us, check }
    }
}

/// A report after this host's rules, waiting for the store.
pub struct StoreReport<'l> {
    pub(super) prepared: PreparedReport<'l>,
    answers: Answers<'l>,
    durable: Vec<Durable>,
    /// As a check's (`StoreCheck::begun_us`).
    begun_us: u64,
    pub op: Op,
    counted: CountedWaiting<'l>,
}

impl Limiter {
    /// A check's first half, in local and shared mode alike: decided here
    /// (`decide_check`) when the route has no global rule for it or a ban
    /// refuses it, whatever the store would say. Otherwise a known lockout
    /// refuses at once; then this host's failure rules admit; then the op
    /// that takes the global rules' places and spends their rates, all or
    /// nothing, in the store.
    pub fn begin_check<'a>(&'a self, plan: CheckPlan<'a>, now_us: u64) -> Begun<'a> {
        let globals =
            plan.facts.route.rules.iter().zip(plan.rule_keys.iter()).any(|(r, k)| r.global.is_some() && k.is_some());
        if !globals || plan.banned_until.is_some() {
            return Begun::Done(self.decide_check(plan, now_us), Vec::new());
        }
        let hits = self.plan_hits(&plan, now_us);
        let CheckPlan { facts, rule_keys, device, .. } = plan;
        let (route, class, known) = (facts.route, facts.class, facts.known_device);
        let mut answers = Answers::new();
        let devices = if device.is_some() { DevicesDecided::ByStore } else { DevicesDecided::Here };
        if self.known_lockout(route, &rule_keys, devices, now_us, &mut answers) {
            return Begun::KnownLockout(combine(&answers));
        }
        let mut held = 0;
        // A device this host has not seen may be known to another: then the
        // signal rules wait for the store's answer (the owner on a device
        // any host knows is never challenged).
        let (judged_now, deferred) = if device.is_some() { (Hits::default(), hits) } else { (hits, Hits::default()) };
        if self.admit_failures(route, &rule_keys, Rules::Host, now_us, &mut answers, &mut held)
            || self.judge_signals(route, &rule_keys, judged_now, now_us, true, &mut answers)
        {
            self.give_back(route, &rule_keys, held, now_us);
            return Begun::Done(combine(&answers), Vec::new());
        }
        let mut rules: SmallVec<[CheckRule; 4]> = SmallVec::new();
        // Which keys name what the requester chooses (`Op::chosen_keys`).
        let mut chosen_keys = 0u64;
        if let Some(device) = device {
            chosen_keys |= 1;
            rules.push(CheckRule::Device { key: self.device_key(route, device) });
        }
        for (rule, key) in route.rules.iter().zip(rule_keys.iter().copied()) {
            let (Some(full), Some(key)) = (rule.global, key) else { continue };
            if rule.key.iter().any(|c| matches!(c, Component::Device | Component::ClientId)) {
                chosen_keys |= 1 << rules.len().min(63);
            }
            let name = self.store_key(rule, key);
            let scope = scope(rule, device.is_some());
            match full {
                Full::Failures(spec) => {
                    rules.push(CheckRule::Failures {
                        key: name,
                        scope,
                        window_us: spec.window_us,
                        threshold: spec.threshold,
                        timeout_us: self.attempt_timeout_us,
                        monitor: rule.monitor,
                    });
                }
                Full::Rate { .. } => {
                    let spec = full_rate_spec(full, class);
                    rules.push(CheckRule::Rate {
                        key: name,
                        scope,
                        interval_us: spec.interval_us,
                        tolerance_us: spec.interval_us.saturating_mul(spec.burst as u64),
                        monitor: rule.monitor,
                    });
                }
            }
        }
        Begun::Store(AwaitingStore::Check(Box::new(StoreCheck {
            route,
            rule_keys,
            class,
            answers,
            held,
            known,
            hits: deferred,
            device,
            begun_us: now_us,
            op: Op { chosen_keys, ..Op::check(rules) },
        })))
    }

    /// A check's or report's second half, from the store's reply. A check
    /// may leave an op to send (`give_back`); a key a report locked is
    /// remembered, and its lockout written to the state file (the reply
    /// waits for it), so this host refuses it without the store and after
    /// a restart. A reply that does not read as this op's gives the
    /// pending half back, for `finish_locally`.
    pub fn finish_stored<'a>(
        &'a self,
        pending: AwaitingStore<'a>,
        reply: &Reply,
        now_us: u64,
    ) -> Result<Stored<'a>, (AwaitingStore<'a>, ReplyError)> {
        match pending {
            AwaitingStore::Check(check) => {
                self.finish_check_stored(check, reply, now_us).map_err(|(c, e)| (AwaitingStore::Check(c), e))
            }
            AwaitingStore::Report(report) => {
                self.finish_report_stored(report, reply, now_us).map_err(|(r, e)| (AwaitingStore::Report(r), e))
            }
        }
    }

    /// A check's or report's second half without the store: the global
    /// rules are counted on this host's degraded tables (ceil(limit /
    /// hosts)).
    pub fn finish_locally<'a>(&'a self, pending: AwaitingStore<'a>, now_us: u64) -> (Verdict<'a>, Vec<Durable>) {
        match pending {
            AwaitingStore::Check(check) => (self.finish_check_locally(check, now_us), Vec::new()),
            AwaitingStore::Report(report) => self.finish_report_locally(report, now_us),
        }
    }

    /// A check the store has not answered in time while it still answers
    /// others in time (busy, not away), refused (`finish_check_busy`); a
    /// check no global rule enforces back, for `finish_locally`. Only a
    /// check's ticket watches for a burst on its keys, so a report is
    /// never busy; were it, it would be counted on the share too.
    pub fn finish_busy<'a>(
        &'a self,
        pending: AwaitingStore<'a>,
        now_us: u64,
    ) -> Result<Verdict<'a>, AwaitingStore<'a>> {
        match pending {
            AwaitingStore::Check(check) => self.finish_check_busy(check, now_us).map_err(AwaitingStore::Check),
            report => Err(report),
        }
    }

    /// A check's second half, from the store's reply (`finish_stored`).
    fn finish_check_stored<'a>(
        &'a self,
        check: Box<StoreCheck<'a>>,
        reply: &Reply,
        now_us: u64,
    ) -> Result<Stored<'a>, (Box<StoreCheck<'a>>, ReplyError)> {
        let parsed = match parse_check(check.route, &check.rule_keys, reply) {
            Ok(p) => p,
            Err(e) => return Err((check, e)),
        };
        let crowded: SmallVec<[usize; 4]> = parsed
            .rules
            .iter()
            .enumerate()
            .filter(|(_, (i, _))| !check.route.rules[*i].monitor)
            .filter(|(_, (i, found))| match (found, check.route.rules[*i].global) {
                (Found::Failures { entry, .. }, Some(Full::Failures(spec))) => {
                    entry.in_flight > 0
                        && entry.in_flight
                            >= spec.admits_remaining(entry_counts(*entry), entry.in_flight, parsed.store_now)
                }
                _ => false,
            })
            .map(|(j, _)| j + usize::from(check.device.is_some()))
            .collect();
        let StoreCheck { route, rule_keys, class, mut answers, held, known, hits, begun_us, device, .. } = *check;
        let store_now = parsed.store_now;
        let store_knows = store_knows_device(route, &parsed.rules);
        let known_anywhere = store_knows.unwrap_or(known);
        // A device this host saw the owner log in on that the store does not
        // know (it lost its data): taught again, so that the store scopes
        // her rules, and a thief's with her cookie, as before on every host.
        let teach =
            device.filter(|_| known && store_knows == Some(false)).and_then(|d| self.teach_device(route, d, now_us));
        // The rules the store took a place on for this attempt, given back
        // if a rule of this host refuses it after all.
        // With the places the store then held on each (this one's among
        // them).
        let mut taken: SmallVec<[(usize, u64, u32); 4]> = SmallVec::new();
        for (i, found) in parsed.rules {
            if matches!(found, Found::Skipped) {
                continue;
            }
            let rule = &route.rules[i];
            let key = rule_keys[i].expect("a global rule in the op has a key");
            let answer = match (found, rule.global) {
                (Found::Failures { refuses, mut entry }, Some(Full::Failures(spec))) => {
                    // The script reports the entry as it found it; an
                    // admitted attempt also holds the place it took, as a
                    // check on this host's tables shows.
                    if parsed.admitted && !refuses {
                        if entry.in_flight == 0 {
                            entry.first_lapse_in_us = self.attempt_timeout_us;
                        }
                        entry.in_flight += 1;
                        taken.push((i, spec.window_us, entry.in_flight));
                    }
                    let answer = store_failure_answer(rule, spec, refuses, entry, store_now);
                    if !rule.monitor {
                        self.store_word(route, i, key, spent(rule, spec, refuses, entry, store_now), begun_us, now_us);
                    }
                    if refuses
                        && !rule.monitor
                        && answer.retry_after_us > 0
                        && is_locked(spec, entry, store_now)
                        && !self.unlocked_since(route, i, key, begun_us)
                    {
                        self.remember_lockout(route, i, key, now_us + answer.retry_after_us, now_us);
                    }
                    answer
                }
                (Found::Rate { tat }, Some(full @ Full::Rate { .. })) => {
                    let spec = full_rate_spec(full, class);
                    let (decision, _) = decide(spec, Some(tat), store_now, true);
                    rate_answer(rule, spec, decision)
                }
                _ => unreachable!("parse_check reads each rule as its kind"),
            };
            answers.push(self.escalate(rule, key, answer, now_us, true));
        }
        if !parsed.admitted {
            self.give_back(route, &rule_keys, held, now_us);
            return Ok(Stored::of_check(combine(&answers), store_now, None, crowded).teaching(teach));
        }
        // The store may have lost a lockout this host knows (see
        // `store_applied_scoped`).
        let applied = store_applied_scoped(route, &rule_keys, taken.iter().map(|t| t.0), known);
        let signals = if known_anywhere { Hits::default() } else { hits };
        if self.known_lockout(route, &applied, DevicesDecided::HereStoreLate, now_us, &mut answers)
            || self.judge_signals(route, &rule_keys, signals, now_us, true, &mut answers)
            || self.spend_rates(route, &rule_keys, class, Rules::Host, now_us, &mut answers)
        {
            self.give_back(route, &rule_keys, held, now_us);
            // The places go back to the store: no word of this reply holds.
            self.forget_spent(route, &rule_keys, now_us);
            let places: Vec<(String, u64)> = taken
                .iter()
                .map(|&(i, window_us, _)| {
                    let key = rule_keys[i].expect("a global rule in the op has a key");
                    (self.store_key(&route.rules[i], key), window_us)
                })
                .collect();
            let give_back = (!places.is_empty()).then(|| Op::release(&places));
            return Ok(Stored::of_check(combine(&answers), store_now, give_back, crowded).teaching(teach));
        }
        // Admitted: in flight against this host's share until its report.
        for &(i, _, in_flight) in taken.iter().filter(|&&(i, ..)| !route.rules[i].monitor) {
            let key = rule_keys[i].expect("a global rule in the op has a key");
            self.count_admitted(route, &route.rules[i], key, (store_now, in_flight), now_us);
        }
        Ok(Stored::of_check(combine(&answers), store_now, None, crowded).teaching(teach))
    }

    /// A check's second half without the store (`finish_locally`).
    fn finish_check_locally<'a>(&'a self, check: Box<StoreCheck<'a>>, now_us: u64) -> Verdict<'a> {
        let StoreCheck { route, rule_keys, class, mut answers, held, known, hits, device, .. } = *check;
        let device_key = device.is_some();
        let scoped = self.scoped_here(route, rule_keys.clone(), known);
        // `begin_check` left device-scoped rules' known lockouts to the
        // store. A device this host does not know may be one another host
        // knows (the owner's, or a stolen cookie): each such lockout
        // refuses, briefly, whatever scope this host gives it, since the
        // share never fills while the reports of what it admits count in
        // the store, and a made-up device would pass a lockout the store
        // holds on every late check. A device this host saw the owner log
        // in on keeps her exemption from the account ceiling, as in local
        // mode: a stranger's failures there must not shut her out for as
        // long as the store is late or away.
        let (devices, lockout_keys) = if device_key && !known {
            (DevicesDecided::HereStoreLate, &rule_keys)
        } else {
            (DevicesDecided::Here, &scoped)
        };
        if self.known_lockout(route, lockout_keys, devices, now_us, &mut answers)
            || self.spent_refuses(route, &scoped, device_key && !known, now_us, &mut answers)
        {
            self.give_back(route, &rule_keys, held, now_us);
            return combine(&answers);
        }
        // Signal rules deferred for the store are judged on this host's
        // knowledge of the device, as every device-scoped rule is here.
        self.admit_then_spend(route, &scoped, class, Rules::Global, hits, answers, held, now_us)
    }

    /// A check the store has not answered in time while it still answers
    /// others in time (busy, not away): refused on its first enforcing
    /// global rule, as full of attempts in flight (the calls queued ahead
    /// of it are attempts on its keys, or on the store's other keys), with
    /// a short wait. Never admitted on this host's share: added to what the
    /// store admits, the shares would let a burst past the limit. The
    /// check back if no global rule enforces (a monitored one refuses
    /// nothing), for the share.
    fn finish_check_busy<'a>(
        &'a self,
        check: Box<StoreCheck<'a>>,
        now_us: u64,
    ) -> Result<Verdict<'a>, Box<StoreCheck<'a>>> {
        let enforcing = check
            .route
            .rules
            .iter()
            .zip(check.rule_keys.iter())
            .find(|(rule, key)| rule.global.is_some() && key.is_some() && !rule.monitor);
        let Some((rule, _)) = enforcing else { return Err(check) };
        let StoreCheck { route, rule_keys, mut answers, held, .. } = *check;
        self.give_back(route, &rule_keys, held, now_us);
        let (reason, limit) = match rule.global {
            Some(Full::Failures(spec)) => (Reason::AttemptsInFlight, spec.threshold),
            _ => (Reason::RateLimited, 0),
        };
        answers.push(RuleAnswer { reason, ..busy_answer(rule, limit) });
        Ok(combine(&answers))
    }

    /// A report's first half: this host's rules are counted; a global
    /// failure rule settles a place its check took on this host (a check
    /// admitted while degraded); the op carries the rest. An `outcome` of
    /// None is an abandoned attempt: places settled, nothing counted.
    pub fn begin_report<'a>(
        &'a self,
        route: &str,
        subject: &Subject<'_>,
        report: &Report,
        now_us: u64,
    ) -> Result<(Facts<'a>, Begun<'a>), RequestError> {
        let outcome = report.outcome;
        let prepared = self.prepare_report(route, subject, report, now_us)?;
        let (route, facts) = (prepared.facts.route, prepared.facts);
        let globals = route.rules.iter().zip(prepared.rule_keys.iter()).any(|(r, k)| r.global.is_some() && k.is_some());
        if !globals {
            let (verdict, durable) = self.report_here(&prepared, now_us);
            return Ok((facts, Begun::Done(verdict, durable)));
        }
        if outcome != Some(Outcome::Failure) {
            self.forget_spent(route, &prepared.rule_keys, now_us);
        }
        let mut answers = Answers::new();
        let mut durable = Vec::new();
        self.report_rules(&prepared, Rules::Host, true, now_us, &mut answers, &mut durable);
        let mut rules: SmallVec<[ReportRule; 4]> = SmallVec::new();
        let mut counted = CountedWaiting::new(self, route, now_us);
        if let Some(device) = prepared.device {
            rules.push(ReportRule::Device { key: self.device_key(route, device) });
        }
        for (rule, key) in route.rules.iter().zip(prepared.rule_keys.iter().copied()) {
            let (Some(full), Some(key)) = (rule.global, key) else { continue };
            let name = self.store_key(rule, key);
            let scope = scope(rule, prepared.device.is_some());
            match (full, &rule.table) {
                (Full::Failures(spec), Table::Failures { cleared_by_success, shards, .. }) => {
                    // Counted for the store before its place here goes, so
                    // that a check on the share between sees one or both.
                    let count = outcome == Some(Outcome::Failure) && !prepared.repeated;
                    if count {
                        self.count_for_store(route, rule, key, spec.window_us, now_us);
                        counted.keys.push((rule, key));
                    }
                    // A place taken here (degraded) is settled here; the
                    // store's place, if any, is released by the op.
                    // A failure presumed here is taken back: the op counts.
                    let settled_here = shards.of(key).settle(key, now_us, false);
                    if settled_here == Settled::Nothing {
                        // Its attempt was the store's (or lapsed): no
                        // longer in flight against the share.
                        self.report_admitted(route, rule, key, now_us);
                    }
                    if outcome == Some(Outcome::Success) && *cleared_by_success {
                        self.forget_counted_failures(route, rule, key, now_us);
                    }
                    rules.push(ReportRule::Failures {
                        key: name,
                        // Only a failure counted writes the account's index.
                        index: if count { self.index_key(rule, key.account_tag) } else { None },
                        window_us: spec.window_us,
                        threshold: spec.threshold,
                        release: settled_here == Settled::Nothing,
                        count,
                        clear: outcome == Some(Outcome::Success) && *cleared_by_success,
                        scope,
                    });
                }
                _ => rules.push(ReportRule::Rate { key: name, scope }),
            }
        }
        if let (Some(device), Some(known), Some(Outcome::Success)) = (prepared.device, &route.known_devices, outcome) {
            rules.extend(self.remember_device(route, device, known.ttl_us));
        }
        let report = StoreReport { prepared, answers, durable, begun_us: now_us, op: Op::report(rules), counted };
        Ok((facts, Begun::Store(AwaitingStore::Report(Box::new(report)))))
    }

    /// A report's second half, from the store's reply (`finish_stored`).
    fn finish_report_stored<'a>(
        &'a self,
        report: Box<StoreReport<'a>>,
        reply: &Reply,
        now_us: u64,
    ) -> Result<Stored<'a>, (Box<StoreReport<'a>>, ReplyError)> {
        let parsed = match parse_report(report.prepared.facts.route, &report.prepared.rule_keys, reply) {
            Ok(p) => p,
            Err(e) => return Err((report, e)),
        };
        let StoreReport { prepared, mut answers, mut durable, begun_us, counted: waiting, .. } = *report;
        waiting.answered();
        let route = prepared.facts.route;
        let store_now = parsed.store_now;
        let mut locked = Vec::new();
        let counted = prepared.outcome == Some(Outcome::Failure) && !prepared.repeated;
        for (i, found) in parsed.rules {
            if matches!(found, Found::Skipped) {
                // The store found the rule not the device's: not counted.
                if let (true, Some(key)) = (counted, prepared.rule_keys[i]) {
                    self.uncount(route, &route.rules[i], key, now_us);
                }
                continue;
            }
            let rule = &route.rules[i];
            let key = prepared.rule_keys[i].expect("a global rule in the op has a key");
            let answer = match (found, rule.global) {
                (Found::Reported { was_locked, now_locked, entry }, Some(Full::Failures(spec))) => {
                    let answer = store_failure_answer(rule, spec, now_locked, entry, store_now);
                    if counted {
                        self.cap_counted(route, rule, key, spec.estimate(entry_counts(entry), store_now), now_us);
                    }
                    if !rule.monitor {
                        self.store_word(
                            route,
                            i,
                            key,
                            spent(rule, spec, now_locked, entry, store_now),
                            begun_us,
                            now_us,
                        );
                    }
                    // A monitored rule refuses nothing, so there is no
                    // lockout to remember, persist or publish.
                    if now_locked
                        && answer.retry_after_us > 0
                        && !rule.monitor
                        && !self.unlocked_since(route, i, key, begun_us)
                    {
                        let until = now_us + answer.retry_after_us;
                        self.remember_lockout(route, i, key, until, now_us);
                        if !was_locked {
                            let write = self.persist_known_lockout(route, i, key, until);
                            durable.push(Durable::of_lockout(write, &rule.id));
                            locked.extend(lock_messages(&self.store_key(rule, key), answer.retry_after_us, store_now));
                        }
                    }
                    answer
                }
                (Found::Rate { tat }, Some(full @ Full::Rate { .. })) => {
                    let spec = full_rate_spec(full, prepared.facts.class);
                    let (decision, _) = decide(spec, Some(tat), store_now, false);
                    rate_answer(rule, spec, decision)
                }
                _ => unreachable!("parse_report reads each rule as its kind"),
            };
            answers.push(self.escalate(rule, key, answer, now_us, false));
        }
        Ok(Stored {
            verdict: combine(&answers),
            store_now,
            durable,
            locked,
            give_back: None,
            teach: None,
            crowded: SmallVec::new(),
        })
    }

    /// A report's second half without the store (`finish_locally`): its
    /// places were settled in the first half.
    fn finish_report_locally<'a>(&'a self, report: Box<StoreReport<'a>>, now_us: u64) -> (Verdict<'a>, Vec<Durable>) {
        let StoreReport { mut prepared, mut answers, mut durable, counted: waiting, .. } = *report;
        waiting.answered();
        let route = prepared.facts.route;
        let counted_keys = prepared.rule_keys.clone();
        prepared.rule_keys = self.scoped_here(route, prepared.rule_keys, prepared.facts.known_device);
        self.report_rules(&prepared, Rules::Global, false, now_us, &mut answers, &mut durable);
        // Off the count once the share holds it (a check between sees it
        // twice, never not at all): every key `begin_report` counted,
        // whether or not the share counts it here.
        if prepared.outcome == Some(Outcome::Failure) && !prepared.repeated {
            for (rule, key) in route.rules.iter().zip(counted_keys.iter().copied()) {
                if let (Some(Full::Failures(_)), Some(key)) = (rule.global, key) {
                    self.uncount(route, rule, key, now_us);
                }
            }
        }
        (combine(&answers), durable)
    }
}
