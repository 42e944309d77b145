//! Shared mode: global failure keys the store's last word showed with no
//! room left (its failures, or its places in flight, at the limit). A
//! check the store answers late, or not at all, is counted on this host's
//! share, which knows nothing of what the store admitted; on such a key it
//! is refused instead, as the store would have refused it, until a later
//! word shows room, an unlock is heard, or `SPENT_WORD_KEPT_US` passes.
//! Without it, guesses that never overlapped on a host, with the store
//! late in stretches of 400 ms, were each admitted on a share after the
//! store had refused the key: 9 tried against a limit of 5 on 3 hosts.

use super::global::{busy_answer, lock_messages};
use super::route::{Full, Route, Rule};
use super::store_reply::{entry_counts, is_locked, parse_check, parse_report, store_failure_answer, Found};
use super::subject::RuleKeys;
use super::verdict::Answers;
use super::Limiter;
use crate::config::DeviceScope;
use crate::expiring::Slot;
use crate::keys::Key;
use crate::protocol::Reason;
use crate::shared::script::{Op, Reply, StoreEntry};

/// How long the store's word that a key is spent is believed without a
/// later one. Its refusals fall only on checks the store did not answer
/// in time, so a word gone stale (a place given back on another host)
/// refuses a user at most this long, and only while the store is late
/// for her or away (the wait it tells her is the store's); longer than
/// the stalls a guesser would wait out.
pub(super) const SPENT_WORD_KEPT_US: u64 = 2_000_000;

/// A spent key's mark: its rule's tag, why the store refused (or would
/// refuse) it, until when it said to wait, and when the word came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Spent {
    rule: u16,
    reason: Reason,
    retry_until_us: u64,
    marked_us: u64,
}

/// Whether the store's entry for a failure rule has no room left, and if
/// so the reason and wait of its refusal.
pub(super) fn spent(
    rule: &Rule,
    spec: crate::failure_window::WindowSpec,
    refuses: bool,
    entry: StoreEntry,
    store_now: u64,
) -> Option<(Reason, u64)> {
    let room = spec.admits_remaining(entry_counts(entry), entry.in_flight, store_now);
    (refuses || room == 0).then(|| {
        let refusal = store_failure_answer(rule, spec, true, entry, store_now);
        (refusal.reason, refusal.retry_after_us)
    })
}

/// A check or report whose reply came late: what it is read with
/// (`AwaitingStore::echo`).
pub struct Echo {
    pub(super) route: String,
    pub(super) rule_keys: RuleKeys,
    pub(super) begun_us: u64,
    pub(super) check: bool,
}

/// What a late reply asks of the daemon.
#[derive(Default)]
pub struct HeardLate {
    /// The places a late check took in the store, given back: it was
    /// answered on this host.
    pub give_back: Option<Op>,
    /// A late report's lockouts, for the other hosts (`Stored::locked`).
    pub locked: Vec<String>,
}

impl Limiter {
    /// A reply that came after its request was answered without it (the
    /// store busy): its words on the keys, and the lockouts it reports,
    /// are learned as a timely one's are, so this host's share stops
    /// admitting what the store refuses. Read with the limiter the
    /// request was begun on; nothing is learned from a reply it cannot
    /// read.
    pub fn heard_late(&self, echo: &Echo, reply: &Reply, now_us: u64) -> HeardLate {
        let mut heard = HeardLate::default();
        let Ok(route) = self.route(&echo.route) else { return heard };
        let parsed = if echo.check {
            parse_check(route, &echo.rule_keys, reply)
        } else {
            parse_report(route, &echo.rule_keys, reply)
        };
        let Ok(parsed) = parsed else { return heard };
        let store_now = parsed.store_now;
        let mut places = Vec::new();
        for (i, found) in parsed.rules {
            let rule = &route.rules[i];
            let (Some(Full::Failures(spec)), Some(key)) = (rule.global, echo.rule_keys[i]) else { continue };
            let (refused, entry, newly_locked) = match found {
                Found::Failures { refuses, entry } => {
                    if parsed.admitted && !refuses {
                        places.push((self.store_key(rule, key), spec.window_us));
                    }
                    (refuses, entry, false)
                }
                Found::Reported { was_locked, now_locked, entry } => (now_locked, entry, now_locked && !was_locked),
                _ => continue,
            };
            if rule.monitor {
                continue;
            }
            self.store_word(route, i, key, spent(rule, spec, refused, entry, store_now), echo.begun_us, now_us);
            if self.unlocked_since(route, i, key, echo.begun_us) {
                continue;
            }
            let retry_after_us = store_failure_answer(rule, spec, true, entry, store_now).retry_after_us;
            if refused && retry_after_us > 0 && is_locked(spec, entry, store_now) {
                self.remember_lockout(route, i, key, now_us + retry_after_us, now_us);
                if newly_locked {
                    heard.locked.extend(lock_messages(&self.store_key(rule, key), retry_after_us, store_now));
                }
            }
        }
        heard.give_back = (!places.is_empty()).then(|| Op::release(&places));
        heard
    }

    /// The store's word on rule `rule_index`'s `key`, from the reply to an
    /// op begun at `begun_us`: spent (the reason and wait of its refusal),
    /// or with room (`None`), which forgets a mark. A spent word from
    /// before an unlock heard is not believed.
    pub(super) fn store_word(
        &self,
        route: &Route,
        rule_index: usize,
        key: Key,
        spent: Option<(Reason, u64)>,
        begun_us: u64,
        now_us: u64,
    ) {
        let Some(marks) = &route.spent_keys else { return };
        if spent.is_some() && self.unlocked_since(route, rule_index, key, begun_us) {
            return;
        }
        let rule = route.rules[rule_index].tag;
        let mut table = marks.of(key);
        match spent {
            Some((reason, retry_after_us)) => {
                let value = Spent { rule, reason, retry_until_us: now_us + retry_after_us, marked_us: now_us };
                table.set(key.tuple, Slot { expires_us: now_us + SPENT_WORD_KEPT_US, value }, now_us);
            }
            None => {
                if table.get(key.tuple, now_us).is_some_and(|s| s.value.rule == rule) {
                    table.remove(key.tuple);
                }
            }
        }
    }

    /// A success or an abandoned attempt gives its keys' room back: their
    /// marks go, whether or not the store hears of it in time.
    pub(super) fn forget_spent(&self, route: &Route, keys: &RuleKeys, now_us: u64) {
        for (i, (rule, key)) in route.rules.iter().zip(keys.iter().copied()).enumerate() {
            if let (Some(Full::Failures(_)), Some(key)) = (rule.global, key) {
                self.store_word(route, i, key, None, now_us, now_us);
            }
        }
    }

    /// Refuses a check answered without the store on a key its last word
    /// showed spent; true if one is. No climb of the escalation ladder:
    /// the refusal is the store's, repeated.
    pub(super) fn spent_refuses<'a>(
        &'a self,
        route: &'a Route,
        keys: &RuleKeys,
        device: bool,
        now_us: u64,
        answers: &mut Answers<'a>,
    ) -> bool {
        let Some(marks) = &route.spent_keys else { return false };
        let mut refused = false;
        for (i, (rule, key)) in route.rules.iter().zip(keys.iter().copied()).enumerate() {
            let (Some(Full::Failures(spec)), Some(key), false) = (rule.global, key, rule.monitor) else { continue };
            // Whether a device-scoped rule applies to a check with a device
            // is the store's to say (another host may know the device): a
            // place held on it, unlike a lockout, must not refuse her. So a
            // made-up device passes the account ceiling's mark, and gets
            // the share there, as before the marks.
            if device && rule.devices != DeviceScope::All {
                continue;
            }
            let Some(slot) = marks.of(key).get(key.tuple, now_us) else { continue };
            let spent = slot.value;
            if spent.rule != rule.tag || self.unlocked_since(route, i, key, spent.marked_us) {
                continue;
            }
            let mut answer = busy_answer(rule, spec.threshold);
            answer.reason = spent.reason;
            answer.retry_after_us = spent.retry_until_us.saturating_sub(now_us).max(answer.retry_after_us);
            answers.push(answer);
            refused = true;
        }
        refused
    }
}
