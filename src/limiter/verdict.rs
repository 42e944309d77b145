//! Verdict phrasing: one rule's answer, its place on the response ladder
//! (escalate), and one verdict from every rule's answer (combine).

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use super::route::{Rule, Table};
use super::Limiter;
use crate::classes::SourceClass;
use crate::clock::ceil_ms;
use crate::config::{Detector, RateLimit, Rung, RULES_PER_ROUTE_MAX};
use crate::expiring::Slot;
use crate::failure_window::{Standing, WindowSpec};
use crate::gcra::{GcraDecision, GcraSpec};
use crate::keys::Key;
use crate::protocol::{Decision, Reason, Verdict};

/// A check's answers, one per rule, on the stack for a route of up to
/// `ANSWERS_INLINE` rules (the shipped routes have at most 5); a longer
/// route's answers spill to the heap. Room for all `RULES_PER_ROUTE_MAX`
/// made every answer set 912 bytes to move, and a check or report waiting
/// for the store (it holds one) too large for the allocator's fast path.
pub(super) type Answers<'r> = SmallVec<[RuleAnswer<'r>; ANSWERS_INLINE]>;
const ANSWERS_INLINE: usize = 8;
const _: () = assert!(ANSWERS_INLINE <= RULES_PER_ROUTE_MAX);

/// One rule's view of a request, before rules are combined.
pub(super) struct RuleAnswer<'r> {
    pub(super) refused: bool,
    /// The refusal happened in monitor mode: counted, not enforced.
    pub(super) monitored: bool,
    pub(super) reason: Reason,
    pub(super) rung: Rung,
    pub(super) retry_after_us: u64,
    pub(super) delay_us: u64,
    pub(super) limit: u32,
    pub(super) remaining: u32,
    pub(super) reset_us: u64,
    pub(super) rule: &'r str,
}

impl Limiter {
    /// Places a refusal on the rule's ladder and phrases it: the rung, a
    /// Retry-After escalated per key (never shorter than the true wait, plus
    /// jitter), a progressive delay. With `climb`, the key moves up a rung.
    pub(super) fn escalate<'r>(
        &self,
        rule: &'r Rule,
        key: Key,
        mut answer: RuleAnswer<'r>,
        now_us: u64,
        climb: bool,
    ) -> RuleAnswer<'r> {
        if !answer.refused {
            return answer;
        }
        if rule.monitor {
            answer.monitored = true;
            if climb {
                rule.counters.would_refuse.fetch_add(1, Ordering::Relaxed);
            }
            return answer;
        }
        let level = {
            let mut table = rule.escalation.of(key);
            let level = table.get(key.tuple, now_us).map_or(0, |s| s.value);
            if climb {
                let slot = Slot {
                    expires_us: now_us + answer.retry_after_us + rule.cool_down_us(),
                    value: level.saturating_add(1),
                };
                table.set(key.tuple, slot, now_us);
            }
            level as usize
        };
        if climb {
            rule.counters.refused.fetch_add(1, Ordering::Relaxed);
        }
        let policy = &self.responses;
        answer.rung = rule.responses[level.min(rule.responses.len() - 1)];
        let step = policy.retry_after_steps_us[level.min(policy.retry_after_steps_us.len() - 1)];
        // Jitter from the key and level: spread across clients, stable for a
        // client (no randomness source on the request path).
        let spread =
            (key.tuple ^ (level as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        let jitter_max = step / 100 * policy.jitter_percent as u64;
        let jitter = (spread >> 11) % (jitter_max + 1);
        answer.retry_after_us = answer.retry_after_us.max(step + jitter);
        if answer.rung == Rung::Delay {
            let doubled = policy.delay_base_us.saturating_mul(1u64 << level.min(20));
            answer.delay_us = doubled.min(policy.delay_max_us);
        }
        answer
    }
}

pub(super) fn gcra_spec(rate: RateLimit) -> GcraSpec {
    GcraSpec::new(rate.limit, rate.period_us, rate.burst)
}

pub(super) fn rate_spec(table: &Table, class: Option<SourceClass>) -> GcraSpec {
    match table {
        Table::Rate { rate, by_class, .. } => gcra_spec(class.and_then(|c| by_class[c]).unwrap_or(*rate)),
        Table::Failures { .. } | Table::Signal { .. } => unreachable!("rate_spec of a rule without a rate"),
    }
}

/// A failure rule's answer for a key's standing. `refused` is decided by
/// the caller: a check that was not admitted, or a report after which a
/// check would not be.
pub(super) fn failure_answer(
    rule: &Rule,
    spec: WindowSpec,
    standing: Standing,
    refused: bool,
    now_us: u64,
) -> RuleAnswer<'_> {
    let Standing { counts, in_flight, in_flight_until_us } = standing;
    let c = spec.rolled(counts, now_us);
    let reset_us = if c.current > 0 {
        spec.expires_at(c) - now_us
    } else if c.previous > 0 {
        spec.expires_at(c) - spec.window_us - now_us
    } else {
        0
    };
    // Locked by failures: until the count drains. Full of attempts in
    // flight: until they lapse, at the latest (a report may free a place
    // sooner, or lock the key).
    let retry_after_us = match (refused, spec.is_locked(counts, now_us)) {
        (false, _) => 0,
        (true, true) => spec.unlocks_at(counts, now_us) - now_us,
        (true, false) => in_flight_until_us.saturating_sub(now_us).max(1),
    };
    RuleAnswer {
        refused,
        monitored: false,
        reason: match (refused, spec.is_locked(counts, now_us)) {
            (false, _) => Reason::Allowed,
            (true, true) => Reason::TooManyFailures,
            // Refused only because the attempts in flight fill the rule:
            // said apart, so an operator does not look for failures.
            (true, false) => Reason::AttemptsInFlight,
        },
        rung: Rung::Deny,
        retry_after_us,
        delay_us: 0,
        limit: spec.threshold,
        remaining: spec.admits_remaining(counts, in_flight, now_us),
        reset_us,
        rule: &rule.name,
    }
}

/// The wait a check refused by a busy store is told: the attempts queued
/// ahead of it are reported within about a password hash.
const BUSY_RETRY_AFTER_US: u64 = 1_000_000;

/// A refusal while the store is busy or late: attempts in flight, a
/// short wait, no rung climbed.
pub(super) fn busy_answer(rule: &Rule, limit: u32) -> RuleAnswer<'_> {
    RuleAnswer {
        refused: true,
        monitored: false,
        reason: Reason::AttemptsInFlight,
        rung: Rung::Deny,
        retry_after_us: BUSY_RETRY_AFTER_US,
        delay_us: 0,
        limit,
        remaining: 0,
        reset_us: 0,
        rule: &rule.name,
    }
}

pub(super) fn rate_answer(rule: &Rule, spec: GcraSpec, decision: GcraDecision) -> RuleAnswer<'_> {
    RuleAnswer {
        refused: !decision.allowed,
        monitored: false,
        reason: if decision.allowed { Reason::Allowed } else { Reason::RateLimited },
        rung: Rung::Deny,
        retry_after_us: decision.retry_after_us,
        delay_us: 0,
        limit: spec.burst,
        remaining: decision.remaining,
        reset_us: decision.reset_us,
        rule: &rule.name,
    }
}

/// A signal rule's refusal, before its ladder: named for the detector.
/// The wait is the ladder's step (`escalate`): a flag says "not now"
/// without promising when it lifts.
pub(super) fn signal_answer(rule: &Rule, detector: Detector) -> RuleAnswer<'_> {
    RuleAnswer {
        refused: true,
        monitored: false,
        reason: match detector {
            Detector::AccountDistributed => Reason::DistributedAttack,
            Detector::TenantAnomaly => Reason::TenantAnomaly,
            Detector::PasswordSpray | Detector::NarrowSpray | Detector::WideSpray => Reason::SpraySuspected,
        },
        rung: Rung::Deny,
        retry_after_us: 0,
        delay_us: 0,
        limit: 0,
        remaining: 0,
        reset_us: 0,
        rule: &rule.name,
    }
}

/// One verdict from the rules' answers: if any enforcing rule refuses, its
/// severest rung (then longest wait) decides; else allowed with the tightest
/// rule's figures, or, when a monitored rule would have refused, allowed
/// with that would-be refusal as the reason.
pub(super) fn combine<'r>(answers: &[RuleAnswer<'r>]) -> Verdict<'r> {
    let enforced = answers.iter().filter(|a| a.refused && !a.monitored).max_by_key(|a| (a.rung, a.retry_after_us));
    if let Some(a) = enforced {
        let delay_us = answers.iter().filter(|a| a.refused && !a.monitored).map(|a| a.delay_us).max().unwrap_or(0);
        return Verdict {
            decision: match a.rung {
                Rung::Delay => Decision::Delay,
                Rung::Challenge => Decision::Challenge,
                Rung::Deny => Decision::Deny,
            },
            retry_after_ms: ceil_ms(a.retry_after_us),
            delay_ms: if a.rung == Rung::Delay { ceil_ms(delay_us) } else { 0 },
            limit: a.limit,
            remaining: a.remaining,
            reset_ms: ceil_ms(a.reset_us),
            reason: a.reason,
            rule: Cow::Borrowed(a.rule),
        };
    }
    // A would-be refusal names its rule and shows that rule's figures.
    let monitored = answers.iter().filter(|a| a.monitored).max_by_key(|a| a.retry_after_us);
    let tightest = monitored.or_else(|| answers.iter().min_by_key(|a| a.remaining));
    let Some(t) = tightest else {
        return Verdict {
            decision: Decision::Allow,
            retry_after_ms: 0,
            delay_ms: 0,
            limit: 0,
            remaining: 0,
            reset_ms: 0,
            reason: Reason::Allowed,
            rule: Cow::Borrowed(""),
        };
    };
    let reason = match monitored {
        Some(m) if m.reason == Reason::RateLimited => Reason::MonitorRateLimited,
        Some(m) if matches!(m.reason, Reason::SpraySuspected | Reason::DistributedAttack | Reason::TenantAnomaly) => {
            Reason::MonitorSignal
        }
        Some(_) => Reason::MonitorTooManyFailures,
        None => Reason::Allowed,
    };
    Verdict {
        decision: Decision::Allow,
        retry_after_ms: 0,
        delay_ms: 0,
        limit: t.limit,
        remaining: t.remaining,
        reset_ms: ceil_ms(t.reset_us),
        reason,
        rule: Cow::Borrowed(t.rule),
    }
}
