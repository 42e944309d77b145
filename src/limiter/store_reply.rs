//! The store's reply to a check or report, read rule by rule, a global
//! rule's answer from the entry the store found, and what a finished
//! half leaves the daemon to do (`Stored`).

use super::route::{Full, Route, Rule};
use super::subject::RuleKeys;
use super::verdict::{failure_answer, gcra_spec, RuleAnswer};
use crate::classes::SourceClass;
use crate::config::DeviceScope;
use crate::failure_window::{Counts, Standing};
use crate::protocol::{Reason, Verdict};
use crate::shared::script::{Ints, Op, Reply, ReplyError, Scope, StoreEntry};
use crate::store::Durable;
use smallvec::SmallVec;

/// Whether the store knows the check's device, read from how it scoped the
/// global rules (a rule for unknown devices skipped, or one for known
/// devices applied); `None` when no global rule is scoped by device.
pub(super) fn store_knows_device(route: &Route, found: &[(usize, Found)]) -> Option<bool> {
    let mut knows = None;
    for (i, found) in found {
        let skipped = matches!(found, Found::Skipped);
        match route.rules[*i].devices {
            DeviceScope::UnknownDevices => knows = Some(knows.unwrap_or(false) || skipped),
            DeviceScope::KnownDevices => knows = Some(knows.unwrap_or(false) || !skipped),
            DeviceScope::All => {}
        }
    }
    knows
}

/// A rule's device scope for the store's script: decided there when the
/// request has a device it can look up; otherwise already decided here
/// (the rule has a key only if it applies).
pub(super) fn scope(rule: &Rule, store_decides_devices: bool) -> Scope {
    match (store_decides_devices, rule.devices) {
        (false, _) | (true, DeviceScope::All) => 0,
        (true, DeviceScope::UnknownDevices) => 1,
        (true, DeviceScope::KnownDevices) => 2,
    }
}

pub(super) fn full_rate_spec(full: Full, class: Option<SourceClass>) -> crate::gcra::GcraSpec {
    match full {
        Full::Rate { rate, by_class } => gcra_spec(class.and_then(|c| by_class[c]).unwrap_or(rate)),
        Full::Failures(_) => unreachable!("a failure rule has no rate"),
    }
}

pub(super) fn entry_counts(entry: StoreEntry) -> Counts {
    Counts { window: entry.window, previous: entry.previous, current: entry.current }
}

pub(super) fn is_locked(spec: crate::failure_window::WindowSpec, entry: StoreEntry, store_now: u64) -> bool {
    entry.lock_remaining_us > 0 || spec.is_locked(entry_counts(entry), store_now)
}

/// A global failure rule's answer, from the store's entry at its `now`.
pub(super) fn store_failure_answer<'r>(
    rule: &'r Rule,
    spec: crate::failure_window::WindowSpec,
    refused: bool,
    entry: StoreEntry,
    store_now: u64,
) -> RuleAnswer<'r> {
    let standing = Standing {
        counts: entry_counts(entry),
        in_flight: entry.in_flight,
        in_flight_until_us: store_now + if entry.in_flight > 0 { entry.first_lapse_in_us } else { 0 },
    };
    let mut answer = failure_answer(rule, spec, standing, refused, store_now);
    if refused {
        // A lockout written back by a host that counted it while the
        // store was away lasts its own time, and no lockout of a sliding
        // window outlasts its next window: a planted lock-until is held
        // no longer than that.
        let lock_remaining_us = entry.lock_remaining_us.min(spec.window_us.saturating_mul(2));
        answer.retry_after_us = answer.retry_after_us.max(lock_remaining_us);
        // Places alone refuse only when nothing else does: a written-back
        // lockout, or a store whose counts refuse, is a failures' refusal.
        if lock_remaining_us > 0 || standing.in_flight == 0 || spec.is_locked(standing.counts, store_now) {
            answer.reason = Reason::TooManyFailures;
        }
    }
    answer
}

pub(super) enum Found {
    /// A device-scoped rule the store found does not apply.
    Skipped,
    Failures {
        refuses: bool,
        entry: StoreEntry,
    },
    Reported {
        was_locked: bool,
        now_locked: bool,
        entry: StoreEntry,
    },
    Rate {
        tat: u64,
    },
}

/// What the store said of each global rule: a login has three, inline.
pub(super) type FoundRules = SmallVec<[(usize, Found); 4]>;

pub(super) struct Parsed {
    pub(super) admitted: bool,
    pub(super) store_now: u64,
    /// (rule index in the route, what the store said), in op order.
    pub(super) rules: FoundRules,
}

pub(super) fn global_rules<'r>(route: &'r Route, keys: &'r RuleKeys) -> impl Iterator<Item = (usize, &'r Rule)> + 'r {
    route.rules.iter().zip(keys.iter()).enumerate().filter_map(|(i, (rule, key))| match (rule.global, key) {
        (Some(_), Some(_)) => Some((i, rule)),
        _ => None,
    })
}

/// Each global rule's part of a reply, in op order: skipped (the store's
/// 2), or what `read` makes of it.
fn read_rules(
    route: &Route,
    keys: &RuleKeys,
    ints: &mut Ints<'_>,
    mut read: impl FnMut(&Rule, &mut Ints<'_>) -> Result<Found, ReplyError>,
) -> Result<FoundRules, ReplyError> {
    let mut rules = FoundRules::new();
    for (i, rule) in global_rules(route, keys) {
        let found = if ints.peek()? == 2 {
            ints.next()?;
            Found::Skipped
        } else {
            read(rule, ints)?
        };
        rules.push((i, found));
    }
    Ok(rules)
}

/// A check's reply, for the global rules of `route` with `keys`.
pub(super) fn parse_check(route: &Route, keys: &RuleKeys, reply: &Reply) -> Result<Parsed, ReplyError> {
    let mut ints = Ints::new(reply);
    let admitted = ints.flag()?;
    let store_now = ints.unsigned()?;
    let rules = read_rules(route, keys, &mut ints, |rule, ints| {
        let refuses = ints.flag()?;
        Ok(match rule.global {
            Some(Full::Failures(_)) => Found::Failures { refuses, entry: StoreEntry::read(ints)? },
            _ => Found::Rate { tat: ints.unsigned()? },
        })
    })?;
    Ok(Parsed { admitted, store_now, rules })
}

/// A report's reply, for the global rules of `route` with `keys`.
pub(super) fn parse_report(route: &Route, keys: &RuleKeys, reply: &Reply) -> Result<Parsed, ReplyError> {
    let mut ints = Ints::new(reply);
    let _locks = ints.unsigned()?;
    let store_now = ints.unsigned()?;
    let rules = read_rules(route, keys, &mut ints, |rule, ints| {
        let was_locked = ints.flag()?;
        let now_locked = ints.flag()?;
        Ok(match rule.global {
            Some(Full::Failures(_)) => Found::Reported { was_locked, now_locked, entry: StoreEntry::read(ints)? },
            _ => Found::Rate { tat: ints.unsigned()? },
        })
    })?;
    Ok(Parsed { admitted: true, store_now, rules })
}

/// A lockout's messages to the other hosts (`Stored::locked`): stamped
/// with the store's time of the op, so a host that heard an unlock after
/// it forgets nothing; and unstamped, for hosts of the previous version,
/// which read only that form.
pub(super) fn lock_messages(name: &str, retry_after_us: u64, store_now: u64) -> [String; 2] {
    [format!("L {name} {retry_after_us}"), format!("L {name} {retry_after_us} {store_now}")]
}

/// A check's or report's second half from the store's reply.
pub struct Stored<'l> {
    pub verdict: Verdict<'l>,
    pub store_now: u64,
    /// A report's writes the reply waits for.
    pub durable: Vec<Durable>,
    /// A report's message for the other hosts per key it locked:
    /// `L <store key> <µs until it unlocks>`.
    pub locked: Vec<String>,
    /// A check's op to send when a rule on this host refused after the
    /// store admitted: gives back the places the store took.
    pub give_back: Option<Op>,
    /// A check's op teaching the store a device this host knows and it
    /// forgot (`Limiter::teach_device`), sent without waiting.
    pub teach: Option<Op>,
    /// The failure rules (as places among the op's keys) whose places in flight
    /// are at least the admits left: a late check there could carry the
    /// key past its threshold, so it is in a burst
    /// (`SharedStore::mark_crowded`). One place held, or a refusal on
    /// another key of the same check, marks nothing: a stranger's single
    /// check must not make a lone owner's late checks refused.
    pub crowded: SmallVec<[usize; 4]>,
}

impl<'l> Stored<'l> {
    pub(super) fn of_check(
        verdict: Verdict<'l>,
        store_now: u64,
        give_back: Option<Op>,
        crowded: SmallVec<[usize; 4]>,
    ) -> Self {
        Stored { verdict, store_now, durable: Vec::new(), locked: Vec::new(), give_back, teach: None, crowded }
    }

    pub(super) fn teaching(self, teach: Option<Op>) -> Self {
        Stored { teach, ..self }
    }
}
