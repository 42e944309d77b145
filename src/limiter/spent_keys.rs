//! Shared mode: what a check the store answers late, or not at all, knows
//! of the store. Such a check is counted on this host's share, whose
//! table holds only what was counted here. Two things the store said
//! reach it:
//! - global failure keys the store's last word showed with no room left
//!   (its failures, or its places in flight, at the limit): refused, as
//!   the store would refuse them, until a later word shows room, an
//!   unlock is heard, or `SPENT_WORD_KEPT_US` passes;
//! - the failures this host's reports counted in the store, which use
//!   the host's share as its own failures do (`StoreCounted`).
//!
//! Without them, guesses that never overlapped on a host, with the store
//! late in stretches of 400 ms, were each admitted on a share after the
//! store had refused the key: 9 tried against a limit of 5 on 3 hosts.

use super::known_lockouts::account_rules;
use super::route::{Full, Route, Rule};
use super::shards::SHARDS;
use super::store_reply::{
    entry_counts, is_locked, lock_messages, parse_check, parse_report, store_failure_answer, Found,
};
use super::subject::RuleKeys;
use super::verdict::{busy_answer, Answers};
use super::Limiter;
use crate::config::DeviceScope;
use crate::expiring::Slot;
use crate::failure_window::WindowSpec;
use crate::keys::Key;
use crate::protocol::Reason;
use crate::shared::script::{Op, Reply, StoreEntry};
use crate::store::PersistedDevice;
use smallvec::SmallVec;

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

/// Failures this host's reports took to the store on a global failure
/// key, for the rule's window from the last: what the host admitted
/// through the store, or on its share with the report in time; and the
/// attempts the store admitted through this host whose reports have not
/// come. A check answered without the store counts both against the
/// host's share, which holds only what was counted here; without them
/// each guess's report freed its share's place for the next, and guesses
/// the store had admitted, still in flight, left the share whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StoreCounted {
    rule: u16,
    count: u32,
    /// Those of them whose reports have had no reply yet.
    waiting: u32,
    /// The most failures a reply showed while some were waiting: replies
    /// to reports on different connections are read in any order.
    seen: u32,
    /// Until when `count` lasts (the slot may outlive it for `admitted`).
    count_until_us: u64,
    /// Attempts the store admitted through this host, not yet reported,
    /// until the attempt timeout after the newest (as its place in the
    /// store lapses).
    admitted: u32,
    admitted_until_us: u64,
    /// The newest places in flight the store showed (at its time): what
    /// `admitted` never exceeds. Replies are read in any order, so an
    /// older one does not lower it.
    store_in_flight: (u64, u32),
    /// Found by an account-wide unlock, which clears them.
    account_tag: u64,
    /// Put back at start from a row, which names only the low bits of
    /// `rule` (`ROW_TAG_BITS`); the next change makes it whole.
    restored: bool,
}

/// A persisted count's value (`DeviceMap::StoreCounted`): the low bits
/// of its rule's tag (the id mixes in the whole tag: see `counted_id`),
/// then the failures counted and the attempts admitted, 6 bits each.
/// Past 63 (a threshold over 63) a row keeps 63.
const ROW_TAG_BITS: u32 = 4;
const ROW_TAG_MASK: u16 = (1 << ROW_TAG_BITS) - 1;
const ROW_PART_BITS: u32 = 6;
const ROW_PART_MAX: u32 = (1 << ROW_PART_BITS) - 1;
const _: () = assert!(ROW_TAG_BITS + 2 * ROW_PART_BITS == 16);

impl StoreCounted {
    /// Whether it is the count of the rule tagged `tag`. A restored count
    /// knows only its tag's low bits, which two rules may share; its id,
    /// which mixes in the whole tag (`counted_id`), tells them apart.
    fn is_rule(&self, tag: u16) -> bool {
        if self.restored {
            (self.rule ^ tag) & ROW_TAG_MASK == 0
        } else {
            self.rule == tag
        }
    }

    /// Its row's value as of `now_us` (`ROW_TAG_BITS`).
    pub(super) fn row_value(&self, now_us: u64) -> u16 {
        let live = live_counted(*self, now_us);
        let part = |n: u32, shift: u32| (n.min(ROW_PART_MAX) as u16) << shift;
        (self.rule & ROW_TAG_MASK) | part(live.count, ROW_TAG_BITS) | part(live.admitted, ROW_TAG_BITS + ROW_PART_BITS)
    }
}

/// A live count, as `recount` shows it.
#[derive(Clone, Copy, Default)]
struct Counted {
    count: u32,
    waiting: u32,
    seen: u32,
    expires_us: u64,
    admitted: u32,
    admitted_until_us: u64,
    store_in_flight: (u64, u32),
}

/// A slot's count and attempts admitted as of `now_us`: either part
/// past its time is none (the slot lives as long as the longer).
fn live_counted(c: StoreCounted, now_us: u64) -> Counted {
    let counted = now_us < c.count_until_us;
    let admitted = now_us < c.admitted_until_us;
    Counted {
        count: if counted { c.count } else { 0 },
        waiting: if counted { c.waiting } else { 0 },
        seen: if counted { c.seen } else { 0 },
        expires_us: c.count_until_us,
        admitted: if admitted { c.admitted } else { 0 },
        admitted_until_us: c.admitted_until_us,
        store_in_flight: c.store_in_flight,
    }
}

/// A count's place in its map: its key's tuple, apart for each rule (two
/// rules of a route may be keyed on the same parts).
fn counted_id(rule: &Rule, key: Key) -> u64 {
    key.tuple ^ u64::from(rule.tag).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Whether the store's entry for a failure rule has no room left, and if
/// so the reason and wait of its refusal.
pub(super) fn spent(
    rule: &Rule,
    spec: WindowSpec,
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
    /// showed spent; true if one is. `device`: the check has a device
    /// whose rules only the store can scope (this host does not know it).
    /// No climb of the escalation ladder:
    /// the refusal is the store's, repeated. (What this host's reports
    /// counted in the store is taken off its share as the check is
    /// admitted: `counted_in_store`, `admit_failures`.)
    pub(super) fn spent_refuses<'a>(
        &'a self,
        route: &'a Route,
        keys: &RuleKeys,
        device: bool,
        now_us: u64,
        answers: &mut Answers<'a>,
    ) -> bool {
        let marks = route.spent_keys.as_ref();
        let mut refused = false;
        for (i, (rule, key)) in route.rules.iter().zip(keys.iter().copied()).enumerate() {
            let (Some(Full::Failures(spec)), Some(key), false) = (rule.global, key, rule.monitor) else { continue };
            // Whether a device-scoped rule applies to a check with a device
            // this host does not know is the store's to say (another host
            // may know it): a
            // place held on it, unlike a lockout, must not refuse her. So a
            // made-up device passes the account ceiling's mark, and gets
            // the share there, which counts what the store counted.
            let device_scoped = device && rule.devices != DeviceScope::All;
            let mark = marks.filter(|_| !device_scoped).and_then(|m| m.of(key).get(key.tuple, now_us));
            let mut answer = busy_answer(rule, spec.threshold);
            match mark.map(|slot| slot.value) {
                Some(spent) if spent.rule == rule.tag && !self.unlocked_since(route, i, key, spent.marked_us) => {
                    answer.reason = spent.reason;
                    answer.retry_after_us = spent.retry_until_us.saturating_sub(now_us).max(answer.retry_after_us);
                }
                _ => continue,
            }
            answers.push(answer);
            refused = true;
        }
        refused
    }

    /// The failures this host's reports counted in the store on a global
    /// failure key (`StoreCounted`), taken off its share of the key
    /// (ceil(limit / hosts)) when a check is answered without the store;
    /// None when none are counted. Without them, a host whose guesses the
    /// store admitted had its whole share left when the store went away or
    /// was late: 5 + 3 x 2 on 3 hosts; with them, 5 + 2 x 2 at most, the
    /// store's admissions all through one host. The share's own lockouts,
    /// which are written back after an outage, count only what was
    /// counted on it.
    pub(super) fn counted_in_store(&self, route: &Route, rule: &Rule, key: Key, now_us: u64) -> Option<u32> {
        let counted = route.store_counted.as_ref()?.of(key).get(counted_id(rule, key), now_us)?.value;
        let live = live_counted(counted, now_us);
        counted.is_rule(rule.tag).then_some(live.count.saturating_add(live.admitted))
    }

    /// Puts a persisted count back at start (`restore_known_devices`) in
    /// the shard it was written from, for the route's global failure rules
    /// its tag bits fit (`is_rule`); false if it is gone (the route keeps
    /// no counts or has no such rule, it ran out).
    /// Its failures last at most their rule's window from now and its
    /// attempts in flight at most the attempt timeout, whatever the row
    /// claims (a clock run ahead, a crafted file). Its account is not
    /// known, so an account-wide unlock made here leaves it to lapse.
    pub(super) fn restore_store_count(&self, route: Option<&Route>, row: &PersistedDevice, now_us: u64) -> bool {
        let Some((route, counts)) = route.and_then(|r| Some((r, r.store_counted.as_ref()?))) else { return false };
        let value = u32::from(row.value);
        let part = |shift: u32| (value >> shift) & ROW_PART_MAX;
        let tag = row.value & ROW_TAG_MASK;
        // The longest window of the rules it may be the count of.
        let window_us = route
            .rules
            .iter()
            .filter_map(|r| match r.global {
                Some(Full::Failures(spec)) if r.tag & ROW_TAG_MASK == tag => Some(spec.window_us),
                _ => None,
            })
            .max();
        let (Some(window_us), Some(mut table)) =
            (window_us, (usize::from(row.shard) < SHARDS).then(|| counts.at(usize::from(row.shard))))
        else {
            return false;
        };
        let (count, admitted) = (part(ROW_TAG_BITS), part(ROW_TAG_BITS + ROW_PART_BITS));
        let count_until_us = row.expires_us.min(now_us.saturating_add(window_us));
        let admitted_until_us = row.expires_us.min(now_us.saturating_add(self.attempt_timeout_us));
        let expires_us = match (count > 0, admitted > 0) {
            (true, true) => count_until_us.max(admitted_until_us),
            (true, false) => count_until_us,
            (false, true) => admitted_until_us,
            (false, false) => return false,
        };
        if expires_us <= now_us {
            return false;
        }
        let counted = StoreCounted {
            rule: tag,
            count,
            waiting: 0,
            seen: 0,
            count_until_us,
            admitted,
            admitted_until_us,
            store_in_flight: (0, admitted),
            account_tag: 0,
            restored: true,
        };
        table.restore(row.id, Slot { expires_us, value: counted }, now_us);
        true
    }

    /// An attempt the store admitted through this host (its check's reply
    /// in time), `in_flight` places held there at the store's `store_us`:
    /// counted against the share until its report, or until the attempt
    /// timeout after the newest, when its place in the store lapses. Never
    /// more than the newest places the store showed: checks never
    /// reported, one every half timeout, would else pile up here while the
    /// store's places lapse one by one.
    pub(super) fn count_admitted(
        &self,
        route: &Route,
        rule: &Rule,
        key: Key,
        (store_us, in_flight): (u64, u32),
        now_us: u64,
    ) {
        let until_us = now_us.saturating_add(self.attempt_timeout_us.max(1));
        self.recount(route, rule, key, now_us, |before| {
            let c = before.unwrap_or_default();
            let store_in_flight = c.store_in_flight.max((store_us, in_flight));
            let admitted = c.admitted.saturating_add(1).min(store_in_flight.1.max(1));
            Some(Counted { admitted, admitted_until_us: until_us, store_in_flight, ..c })
        });
    }

    /// A report of an attempt the store admitted through this host, if
    /// one is counted (`count_admitted`): no longer in flight.
    pub(super) fn report_admitted(&self, route: &Route, rule: &Rule, key: Key, now_us: u64) {
        self.recount(route, rule, key, now_us, |before| {
            before.map(|c| Counted { admitted: c.admitted.saturating_sub(1), ..c })
        });
    }

    /// A failure report this host sends the store, counted as it leaves,
    /// for the rule's window from the last: while it waits on the store
    /// its place on the share is settled already.
    pub(super) fn count_for_store(&self, route: &Route, rule: &Rule, key: Key, window_us: u64, now_us: u64) {
        self.recount(route, rule, key, now_us, |before| {
            let c = before.unwrap_or_default();
            let (count, waiting) = (c.count.saturating_add(1), c.waiting.saturating_add(1));
            Some(Counted { count, waiting, expires_us: now_us + window_us, ..c })
        });
    }

    /// The store's reply shows the key's failures there, this report's
    /// among them: this host's count is never more than the most a reply
    /// showed while reports waited and those still on their way (a
    /// success through another host cleared them, the window slid).
    pub(super) fn cap_counted(&self, route: &Route, rule: &Rule, key: Key, store_failures: u32, now_us: u64) {
        self.recount(route, rule, key, now_us, |before| {
            before.map(|c| {
                let (waiting, seen) = (c.waiting.saturating_sub(1), c.seen.max(store_failures));
                let count = c.count.min(seen.saturating_add(waiting));
                Counted { count, waiting, seen: if waiting == 0 { 0 } else { seen }, ..c }
            })
        });
    }

    /// A report the store did not count as sent (it answered late, or
    /// not at all, and the share counts it; or the rule did not apply to
    /// the device): off the count, so it is counted once at most.
    pub(super) fn uncount(&self, route: &Route, rule: &Rule, key: Key, now_us: u64) {
        self.recount(route, rule, key, now_us, |before| {
            before.map(|c| {
                let waiting = c.waiting.saturating_sub(1);
                Counted { count: c.count.saturating_sub(1), waiting, seen: if waiting == 0 { 0 } else { c.seen }, ..c }
            })
        });
    }

    /// A report sent to the store whose reply never came here (its
    /// connection closed first): no longer waiting, but still counted. The
    /// store counts it (an orphan is sent); if the orphan is lost (the
    /// queue full, the store away), nothing else counts it, so it stays.
    fn stop_waiting(&self, route: &Route, rule: &Rule, key: Key, now_us: u64) {
        self.recount(route, rule, key, now_us, |before| {
            before.map(|c| {
                let waiting = c.waiting.saturating_sub(1);
                Counted { waiting, seen: if waiting == 0 { 0 } else { c.seen }, ..c }
            })
        });
    }

    /// Rewrites a count: `f` gets the live one and returns the new one; a
    /// count of 0 drops it. (Another rule's slot at the same id, a 64-bit
    /// collision of keyed digests, is overwritten.)
    fn recount(
        &self,
        route: &Route,
        rule: &Rule,
        key: Key,
        now_us: u64,
        f: impl FnOnce(Option<Counted>) -> Option<Counted>,
    ) {
        let Some(counts) = &route.store_counted else { return };
        counts.of(key).update(counted_id(rule, key), now_us, |slot| {
            let before = slot.filter(|s| s.value.is_rule(rule.tag)).map(|s| live_counted(s.value, now_us));
            let next = f(before).filter(|c| c.count > 0 || c.admitted > 0).map(|c| Slot {
                expires_us: if c.admitted > 0 { c.expires_us.max(c.admitted_until_us) } else { c.expires_us },
                value: StoreCounted {
                    rule: rule.tag,
                    count: c.count,
                    waiting: c.waiting,
                    seen: c.seen,
                    count_until_us: c.expires_us,
                    admitted: c.admitted,
                    admitted_until_us: c.admitted_until_us,
                    store_in_flight: c.store_in_flight,
                    account_tag: key.account_tag,
                    restored: false,
                },
            });
            (next.or(slot.filter(|s| !s.value.is_rule(rule.tag))), ())
        });
    }

    /// A success clears what a key's rule clears on success: the
    /// failures counted in the store go from this host's count too. Other
    /// attempts the store admitted through it are still in flight.
    pub(super) fn forget_counted_failures(&self, route: &Route, rule: &Rule, key: Key, now_us: u64) {
        self.recount(route, rule, key, now_us, |before| before.map(|c| Counted { count: 0, waiting: 0, seen: 0, ..c }));
    }

    /// An unlock made here forgets the key's count whole.
    fn forget_counted(&self, route: &Route, rule: &Rule, key: Key) {
        let Some(counts) = &route.store_counted else { return };
        let mut table = counts.of(key);
        let id = counted_id(rule, key);
        if table.get(id, 0).is_some_and(|slot| slot.value.is_rule(rule.tag)) {
            table.remove(id);
        }
    }

    /// An unlock made on this host forgets its count of the entry a store
    /// key names. One heard from another host does not: whoever can
    /// publish could give every share back. There the next failure
    /// report's reply lowers the count to the store's.
    pub fn forget_count_unlocked(&self, name: &str) {
        if let Some((route, rule, key)) = self.parse_store_key(name) {
            self.forget_counted(route, &route.rules[rule], key);
        }
    }

    /// The same for an account-wide unlock made here: every count of the
    /// route's rules keyed on the account, by its tag.
    pub fn forget_account_counts_unlocked(&self, route: &str, account: &str) {
        let Some(route) = self.routes.iter().find(|r| r.name == route) else { return };
        let Some(counts) = &route.store_counted else { return };
        let (account_tag, rules) = (self.keys.account_tag(account), account_rules(route));
        for mut table in counts.each() {
            let doomed: SmallVec<[u64; 8]> = table
                .iter_live(0)
                .filter(|(_, slot)| slot.value.account_tag == account_tag && rules.contains(&slot.value.rule))
                .map(|(id, _)| id)
                .collect();
            for id in doomed {
                table.remove(id);
            }
        }
    }
}

/// The keys a failure report counted for the store (`count_for_store`),
/// waiting for its reply. The reply's finisher settles them (`answered`).
/// Dropped unanswered (the request's connection closed while it waited),
/// they stop waiting: else each count's `waiting` stayed one too high,
/// lifting its cap, until the count expired, a trickle of failures
/// keeping it alive.
pub(super) struct CountedWaiting<'l> {
    limiter: &'l Limiter,
    route: &'l Route,
    pub(super) keys: SmallVec<[(&'l Rule, Key); 2]>,
    counted_us: u64,
}

impl<'l> CountedWaiting<'l> {
    pub(super) fn new(limiter: &'l Limiter, route: &'l Route, now_us: u64) -> CountedWaiting<'l> {
        CountedWaiting { limiter, route, keys: SmallVec::new(), counted_us: now_us }
    }

    /// The reply came (or the store did not count the report): its
    /// finisher has settled the keys.
    pub(super) fn answered(mut self) {
        self.keys.clear();
    }
}

impl Drop for CountedWaiting<'_> {
    fn drop(&mut self) {
        for &(rule, key) in &self.keys {
            self.limiter.stop_waiting(self.route, rule, key, self.counted_us);
        }
    }
}
