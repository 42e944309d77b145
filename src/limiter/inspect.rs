//! `inspect`: a subject's standing on each rule of a route, as a check
//! would find it, read without changing anything. The keys are derived as
//! a check derives them (`plan_check`: the same digests, source prefix,
//! widening and device scope); the tables are only read (`standing`,
//! `peek`, the flags' `probe`), so nothing is spent, no place is taken, no
//! ladder climbs and nothing is journalled or sent to the observers.
//!
//! Unlike a check, a rule whose key needs a field the request lacks is
//! listed as skipped rather than refusing the whole request: an operator
//! asking about an account should not have to invent an address.

use super::route::{Full, Route, Rule, Table};
use super::subject::{check_lengths, SubjectKeys};
use super::verdict::{failure_answer, rate_spec};
use super::{Limiter, RequestError};
use crate::clock::ceil_ms;
use crate::config::DeviceScope;
use crate::keys::Key;
use crate::protocol::{InspectedRule, Inspection, Subject};
use crate::signals::flags::Hits;

impl Limiter {
    /// The subject's standing on every rule of `route` at `now_us`. In
    /// shared mode a global rule shows this host's view: its degraded
    /// share's table and the store's lockouts this host has learned.
    pub fn inspect(&self, route: &str, subject: &Subject<'_>, now_us: u64) -> Result<Inspection, RequestError> {
        let route = self.route(route)?;
        check_lengths(subject)?;
        let mut keys = self.subject_keys_at(&route.name, subject, now_us);
        let known = self.known_device(route, &mut keys, now_us)?;
        keys.known_device_keeps_its_prefix(known);
        let hits = if route.feeds_signals { keys.hits(route) } else { Hits::default() };
        let mut rules = Vec::with_capacity(route.rules.len() + 1);
        // A ban refuses before any rule: listed first, as a rule named
        // `ban` of kind `ban` whose key is the network.
        if let Some(until_us) = self.bans.banned_until(|| keys.client().ok().map(|(address, _)| address), now_us) {
            rules.push(InspectedRule {
                name: crate::bans::LISTED_RULE.to_string(),
                kind: crate::bans::LISTED_RULE.to_string(),
                refuses: true,
                until_ms: ceil_ms(until_us),
                retry_after_ms: ceil_ms(until_us - now_us),
                reset_ms: ceil_ms(until_us - now_us),
                ..InspectedRule::default()
            });
        }
        for rule in &route.rules {
            let mut shown = InspectedRule {
                name: rule.name.clone(),
                kind: match rule.table {
                    Table::Rate { .. } => "rate",
                    Table::Failures { .. } => "failures",
                    Table::Signal { .. } => "signal",
                }
                .to_string(),
                monitor: rule.monitor,
                global: self.is_shared() && rule.global.is_some(),
                ..InspectedRule::default()
            };
            match applicable_key(&mut keys, rule, known)? {
                Ok(key) => {
                    shown.key = key.to_string();
                    self.read_standing(route, rule, key, &mut keys, hits, now_us, &mut shown);
                }
                Err(skipped) => shown.skipped = skipped,
            }
            rules.push(shown);
        }
        let names_device = subject.account.is_some() && subject.device.is_some();
        let device = match (&route.known_devices, names_device, known) {
            (Some(_), true, true) => "known",
            (Some(_), true, false) => "unknown",
            _ => "",
        };
        Ok(Inspection {
            now_ms: ceil_ms(now_us),
            route: route.name.clone(),
            device: device.to_string(),
            shared: self.is_shared(),
            rules,
        })
    }

    /// Fills in one applicable rule's figures from its table, read only.
    #[allow(clippy::too_many_arguments)] // one rule's inputs and its output
    fn read_standing(
        &self,
        route: &Route,
        rule: &Rule,
        key: Key,
        keys: &mut SubjectKeys<'_, '_>,
        hits: Hits,
        now_us: u64,
        shown: &mut InspectedRule,
    ) {
        let mut until_us = now_us;
        match &rule.table {
            Table::Failures { shards, .. } => {
                let (spec, standing) = {
                    let table = shards.of(key);
                    (table.spec(), table.standing(key, now_us))
                };
                let refuses = spec.refuses(standing.counts, standing.in_flight, now_us);
                let answer = failure_answer(rule, spec, standing, refuses, now_us);
                shown.limit = spec.threshold;
                shown.failures = spec.estimate(standing.counts, now_us);
                shown.in_flight = standing.in_flight;
                shown.remaining = answer.remaining;
                shown.locked = spec.is_locked(standing.counts, now_us);
                shown.refuses = refuses;
                shown.reset_ms = ceil_ms(answer.reset_us);
                until_us = now_us + answer.retry_after_us;
                // A lockout the store told this host of, refused here from memory.
                if let (Some(known), Some(Full::Failures(_))) = (&route.known_lockouts, rule.global) {
                    if let Some(slot) = known.of(key).get(key.tuple, now_us).filter(|s| s.value.rule == rule.tag) {
                        shown.locked = true;
                        shown.refuses = true;
                        shown.remaining = 0;
                        until_us = until_us.max(slot.expires_us);
                    }
                }
            }
            Table::Rate { shards, .. } => {
                let spec = rate_spec(&rule.table, keys.source_class());
                let decision = shards.of(key).peek(spec, key, now_us);
                shown.limit = spec.burst;
                // `peek` answers as a check would, after spending its own
                // request: the budget left now is one more.
                shown.remaining = if decision.allowed { decision.remaining.saturating_add(1) } else { 0 };
                shown.refuses = !decision.allowed;
                shown.reset_ms = ceil_ms(decision.reset_us);
                until_us = now_us + decision.retry_after_us;
            }
            Table::Signal { detectors, .. } => {
                // A flag says "not now" without promising when it lifts, so
                // there is no `until`. The password axis needs the
                // attempt's password tag, which an inspection has not.
                if let Some(detector) = hits.leading(*detectors) {
                    shown.flagged_by = detector.name().to_string();
                    shown.refuses = true;
                    shown.monitor |= hits.enforced & detectors == 0;
                }
            }
        }
        if shown.refuses && until_us > now_us {
            shown.until_ms = ceil_ms(until_us);
            shown.retry_after_ms = ceil_ms(until_us - now_us);
        }
    }
}

/// The rule's key as a check derives it, or why the rule does not apply
/// to this subject: its device scope does not match, its key needs a
/// field the request lacks (where a check would refuse the request), or
/// the source is exempt from it.
fn applicable_key(
    keys: &mut SubjectKeys<'_, '_>,
    rule: &Rule,
    known_device: bool,
) -> Result<Result<Key, String>, RequestError> {
    match rule.devices {
        DeviceScope::UnknownDevices if known_device => return Ok(Err("unknown devices only".into())),
        DeviceScope::KnownDevices if !known_device => return Ok(Err("known devices only".into())),
        _ => {}
    }
    if let Some(missing) = rule.key.iter().find(|c| !keys.has(**c)) {
        let field = match missing.name() {
            "prefix" => "peer",
            other => other,
        };
        return Ok(Err(format!("needs {field}")));
    }
    if rule.exemptible {
        if let Some(exemption) = keys.exemption() {
            let prefix = keys.limiter().exemptions.get(exemption).map(|e| e.prefix.to_string()).unwrap_or_default();
            return Ok(Err(format!("exempt source ({prefix})")));
        }
    }
    keys.key(&rule.key).map(Ok)
}
