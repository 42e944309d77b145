//! The check path: a check is planned (every key derived, no lock taken),
//! its table slots prefetched, then decided rule by rule. Failure rules
//! admit the attempt first, signal rules judge spray detection's flags,
//! then rate rules spend; a refusal gives back the places taken. The
//! daemon reaches `decide_check` through `begin_check` (`global.rs`),
//! which sends here every check no global rule needs the store for, and
//! reuses these steps for this host's rules when one does.

use super::route::{Full, Route, Table};
use super::subject::RuleKeys;
use super::verdict::{
    busy_answer, combine, failure_answer, rate_answer, rate_spec, signal_answer, Answers, RuleAnswer,
};
use super::{CheckPlan, Derived, Facts, Limiter, RequestError, Rules};
use crate::classes::SourceClass;
use crate::config::{Detector, RULES_PER_ROUTE_MAX};
use crate::protocol::{Subject, Verdict};
use crate::signals::flags::{Hits, Space};

impl Limiter {
    /// `check`: may this attempt proceed? Failure rules are read first; an
    /// attempt they refuse spends nothing. Then every rate rule spends one.
    /// A refusal moves the key one rung up its rule's ladder.
    pub fn check<'a>(&'a self, route: &str, subject: &Subject<'_>, now_us: u64) -> Result<Verdict<'a>, RequestError> {
        Ok(self.decide_check(self.plan_check(route, subject, now_us)?, now_us))
    }

    /// A check's first half: every key it needs, derived without taking a
    /// table lock. The server plans a batch of pipelined checks, prefetches
    /// their table slots, then decides them, so that the cache misses of a
    /// large table overlap instead of queueing one behind the other.
    pub fn plan_check<'a>(
        &'a self,
        route: &str,
        subject: &Subject<'_>,
        now_us: u64,
    ) -> Result<CheckPlan<'a>, RequestError> {
        let route = self.route(route)?;
        let mut keys = self.subject_keys_at(&route.name, subject, now_us);
        let Derived { known, device, rule_keys } = self.derive(route, &mut keys, now_us)?;
        let banned_until = self.bans.banned_until(|| keys.client().ok().map(|(address, _)| address), now_us);
        if let (true, None, Some(exemption)) = (keys.exempted, banned_until, keys.exemption()) {
            self.exemptions.count_check(exemption);
        }
        let hits = if route.feeds_signals { keys.hits(route) } else { Hits::default() };
        Ok(CheckPlan {
            facts: Facts::new(self, route, &mut keys, known),
            rule_keys,
            device,
            password_tag: None,
            hits,
            banned_until,
        })
    }

    /// Asks the memory system for the rate-table slots a planned check will
    /// touch; a hint only, it changes nothing.
    pub fn prefetch(&self, plan: &CheckPlan<'_>) {
        for (rule, key) in plan.facts.route.rules.iter().zip(plan.rule_keys.iter()) {
            if let (Table::Rate { shards, .. }, Some(key)) = (&rule.table, key) {
                shards.prefetch(*key);
            }
        }
    }

    /// A check's second half: the table steps, in rule order. Each failure
    /// rule admits the attempt into a place of its own (`admit`); if any
    /// rule then refuses, the places taken are given back, so a refused
    /// check holds nothing.
    pub fn decide_check<'a>(&'a self, plan: CheckPlan<'a>, now_us: u64) -> Verdict<'a> {
        if let Some(until_us) = plan.banned_until {
            return Limiter::banned_verdict(until_us, now_us);
        }
        let hits = self.plan_hits(&plan, now_us);
        let CheckPlan { facts, rule_keys, device, .. } = plan;
        let (route, class, known) = (facts.route, facts.class, facts.known_device);
        // Only a plan made for the store (a device to look up) has keys of
        // device-scoped rules this host's knowledge excludes.
        let rule_keys = if device.is_some() { self.scoped_here(route, rule_keys, known) } else { rule_keys };
        // Bit i: rule i holds a place for this attempt.
        self.admit_then_spend(route, &rule_keys, class, Rules::All, hits, Answers::new(), 0, now_us)
    }

    /// Every flag the plan's subject carries, its password tag's included.
    pub(super) fn plan_hits(&self, plan: &CheckPlan<'_>, now_us: u64) -> Hits {
        let mut hits = plan.hits;
        if let (true, Some(tag)) = (plan.facts.route.feeds_signals, &plan.password_tag) {
            if let Some(flags) = self.flags_raised() {
                let bits = flags.probe(Space::Password, self.keys.password_tag(tag), now_us);
                hits.add(&flags, bits, Detector::PasswordSpray.bit());
            }
        }
        hits
    }

    /// Each signal rule whose detectors flagged the subject refuses on its
    /// ladder (or, for a monitored detector or rule, counts a would-be
    /// refusal); true if an enforced one refused. `climb` as in `escalate`.
    pub(super) fn judge_signals<'a>(
        &'a self,
        route: &'a Route,
        rule_keys: &RuleKeys,
        hits: Hits,
        now_us: u64,
        climb: bool,
        answers: &mut Answers<'a>,
    ) -> bool {
        if hits.detectors == 0 {
            return false;
        }
        let mut refused = false;
        for (rule, key) in route.rules.iter().zip(rule_keys.iter().copied()) {
            let (Table::Signal { detectors, .. }, Some(key)) = (&rule.table, key) else { continue };
            let Some(leading) = hits.leading(*detectors) else { continue };
            let answer = signal_answer(rule, leading);
            let answer = if hits.enforced & detectors == 0 {
                // A detector in monitor mode: counted like a monitored rule.
                if climb {
                    rule.counters.would_refuse.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                RuleAnswer { monitored: true, ..answer }
            } else {
                self.escalate(rule, key, answer, now_us, climb)
            };
            refused |= answer.refused && !answer.monitored;
            answers.push(answer);
        }
        refused
    }

    /// The failure rules of `admit` admit the attempt, then every rate rule
    /// spends; if any enforced rule refuses, the places taken (`held`, and
    /// those taken here) are given back, so a refused check holds nothing.
    /// A delayed check holds nothing either, though it proceeds after its
    /// delay: keeping its places would hold a victim's account for the
    /// whole delay, and its report could not tell which places are its own
    /// (docs/operations.md says what a delay rung on a failure route costs).
    #[allow(clippy::too_many_arguments)] // the state of a check half done
    pub(super) fn admit_then_spend<'a>(
        &'a self,
        route: &'a Route,
        rule_keys: &RuleKeys,
        class: Option<SourceClass>,
        admit: Rules,
        hits: Hits,
        mut answers: Answers<'a>,
        mut held: u32,
        now_us: u64,
    ) -> Verdict<'a> {
        let mut refused = self.admit_failures(route, rule_keys, admit, now_us, &mut answers, &mut held);
        if !refused {
            refused = self.judge_signals(route, rule_keys, hits, now_us, true, &mut answers);
        }
        if !refused {
            refused = self.spend_rates(route, rule_keys, class, Rules::All, now_us, &mut answers);
        }
        if refused {
            self.give_back(route, rule_keys, held, now_us);
        }
        combine(&answers)
    }

    /// Each failure rule of `which` admits the attempt into a place of its
    /// own (`admit`); true if an enforced one refused.
    pub(super) fn admit_failures<'a>(
        &'a self,
        route: &'a Route,
        rule_keys: &RuleKeys,
        which: Rules,
        now_us: u64,
        answers: &mut Answers<'a>,
        held: &mut u32,
    ) -> bool {
        const _: () = assert!(RULES_PER_ROUTE_MAX <= 32);
        let mut refused = false;
        for (i, (rule, key)) in route.rules.iter().zip(rule_keys.iter().copied()).enumerate() {
            if !which.has(rule) {
                continue;
            }
            if let (Table::Failures { shards, .. }, Some(key)) = (&rule.table, key) {
                let (counted, spec, admitted, standing) = {
                    let mut table = shards.of(key);
                    // On the share, what this host's reports counted in the
                    // store comes off it (`counted_in_store`), read under
                    // the table's lock: checks side by side cannot each pass
                    // it before either takes its place, and a report counts
                    // its failure before it gives its place back, and
                    // records it here before it takes it off the count.
                    let counted = match rule.global {
                        Some(Full::Failures(global)) if which == Rules::Global && !rule.monitor => {
                            self.counted_in_store(route, rule, key, now_us).map(|count| (count, global.threshold))
                        }
                        _ => None,
                    };
                    // A monitored rule's would-be refusal takes no place,
                    // exactly as an enforced one, so that switching it to
                    // enforcing finds the places enforcing would have.
                    let spec = table.spec();
                    let left = spec.threshold.saturating_sub(counted.map_or(0, |(count, _)| count));
                    let (admitted, standing) = table.admit_within(key, now_us, self.attempt_timeout_us, left);
                    (counted, spec, admitted, standing)
                };
                if admitted {
                    *held |= 1 << i;
                } else if let Some((_, limit)) = counted {
                    // A share used with what the store counted: a wait
                    // for the store, not a climb of the ladder.
                    answers.push(busy_answer(rule, limit));
                    refused = true;
                    continue;
                }
                let answer =
                    self.escalate(rule, key, failure_answer(rule, spec, standing, !admitted, now_us), now_us, true);
                refused |= answer.refused && !answer.monitored;
                answers.push(answer);
            }
        }
        refused
    }

    /// Each rate rule of `which` spends one, stopping at the first
    /// enforced refusal; true if there was one.
    pub(super) fn spend_rates<'a>(
        &'a self,
        route: &'a Route,
        rule_keys: &RuleKeys,
        class: Option<SourceClass>,
        which: Rules,
        now_us: u64,
        answers: &mut Answers<'a>,
    ) -> bool {
        for (rule, key) in route.rules.iter().zip(rule_keys.iter().copied()) {
            if !which.has(rule) {
                continue;
            }
            if let (Table::Rate { shards, .. }, Some(key)) = (&rule.table, key) {
                let spec = rate_spec(&rule.table, class);
                let decision = shards.check(spec, key, now_us);
                let answer = self.escalate(rule, key, rate_answer(rule, spec, decision), now_us, true);
                let refused = answer.refused && !answer.monitored;
                answers.push(answer);
                if refused {
                    return true;
                }
            }
        }
        false
    }

    /// Gives back the places a refused check took (bit i: rule i).
    pub(super) fn give_back(&self, route: &Route, rule_keys: &RuleKeys, held: u32, now_us: u64) {
        for (i, (rule, key)) in route.rules.iter().zip(rule_keys.iter().copied()).enumerate() {
            if let (Table::Failures { shards, .. }, Some(key), true) = (&rule.table, key, held & (1 << i) != 0) {
                shards.of(key).settle(key, now_us, false);
            }
        }
    }
}
