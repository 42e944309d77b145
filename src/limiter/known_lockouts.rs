//! Shared mode's known lockouts: keys the store said are locked, refused
//! here from memory until they end, listed by `lockouts`, forgotten by an
//! unlock here or on another host (by key, or by account after the store
//! lost its index).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use super::route::{Full, KnownLockout, Route};
use super::subject::RuleKeys;
use super::verdict::busy_answer;
use super::verdict::{failure_answer, Answers};
use super::Limiter;
use crate::clock::ceil_ms;
use crate::config::DeviceScope;
use crate::expiring::Slot;
use crate::failure_window::{Counts, Standing};
use crate::keys::{Component, Key};
use crate::protocol::{Lockout, Reason};
use crate::shared::LATE_REPLY_WAIT_MS;
use crate::unpoisoned::Unpoisoned;

/// Who decides whether a device-scoped rule applies to a check.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum DevicesDecided {
    /// The store (a check with a device, before the store's answer): the
    /// rule's lockout is not refused from memory.
    ByStore,
    /// This host (a check without a device, or late with one it knows).
    Here,
    /// This host, for a check with a device it does not know that the
    /// store answered late or not at all, or whose scope a store that lost
    /// its data decided (`store_applied_scoped`): refused, briefly (see
    /// `known_lockout`).
    HereStoreLate,
}

/// The keys of the device-scoped rules whose lockouts this host refuses
/// from memory for an attempt the store admitted (`applied`: the rules it
/// took a place on), as it does without a device. A store that lost its
/// data (a flush, a restart without persistence) forgot its lockouts with
/// the devices it knew: any made-up device would pass the account
/// ceiling's lockout, and a stolen cookie the known-device rule's, which
/// the store then skips (a lockout on a key naming the device was taken
/// while some host knew it, so it refuses on every host). A device this
/// host saw the owner log in on keeps
/// her exemption from the account ceiling; one only another host knows
/// is refused here, briefly: she retries in a second, and a host that
/// knows her device lets her in, its success teaching the store.
pub(super) fn store_applied_scoped(
    route: &Route,
    rule_keys: &RuleKeys,
    applied: impl Iterator<Item = usize> + Clone,
    known_here: bool,
) -> RuleKeys {
    let applies = |i: usize| match route.rules[i].devices {
        DeviceScope::All => false,
        DeviceScope::UnknownDevices => !known_here && applied.clone().any(|j| j == i),
        DeviceScope::KnownDevices => {
            known_here || route.rules[i].key.contains(&Component::Device) || applied.clone().any(|j| j == i)
        }
    };
    (0..route.rules.len()).map(|i| rule_keys[i].filter(|_| applies(i))).collect()
}

/// Unlocks remembered at most; past it the oldest are forgotten, so a
/// flood of them (whoever can publish on the store can send any) costs at
/// most the race this memory closes, never a lockout not remembered.
const RECENT_UNLOCKS_MAX: usize = 4096;

/// How long an unlock heard is kept: longer than any reply is waited for
/// (`timeout_ms`, `LATE_REPLY_WAIT_MS`), and than a long write-back's
/// chunks take, one after another.
pub(super) const RECENT_UNLOCKS_KEEP_US: u64 = 60_000_000;

/// Unlocks heard lately: this host's own, and other hosts' (`U`, `A`).
/// A reply in flight when one was heard may report a lockout that its op
/// found before the unlock ran in the store; remembered then, it would
/// undo the unlock on this host, which would refuse the user from memory
/// until the lockout ran out. So a lockout a reply reports is neither
/// remembered, persisted nor published when an unlock of its key or
/// account was heard after its op began (an op begun after the unlock
/// was heard runs after it in the store, and its lockout is a new one):
/// the store, which put the two in order, refuses it while it answers.
/// An `L` message is held back the same way, by the store's time of its
/// op: it is published a reply's way back after the op ran, so it can
/// reach the channel after an unlock the store ran later.
pub(super) struct RecentUnlocks {
    /// Shared mode: without a store there are no replies to hold back.
    on: bool,
    heard: Mutex<Heard>,
}

/// The unlocks heard, by what they unlocked (the latest stamp of each), so
/// that asking costs two lookups whatever a flood of messages put there;
/// and in the order they came, for forgetting the oldest.
#[derive(Default)]
struct Heard {
    /// Each unlock's latest stamp, and the number of its last arrival.
    latest: HashMap<Unlocked, (u64, u64)>,
    /// (arrival number, stamp, unlock), oldest first.
    arrivals: VecDeque<(u64, u64, Unlocked)>,
    arrived: u64,
}

#[derive(Clone, PartialEq, Eq, Hash)]
enum Unlocked {
    /// A rule's entry (route, rule tag, key tuple).
    Key(String, u16, u64),
    /// Every rule keyed on an account, on a route.
    Account(String, u64),
}

impl RecentUnlocks {
    /// One for a limiter: the previous one's while both are in shared mode
    /// (a pass or a request begun on the old limiter must see an unlock
    /// heard on the new one), a fresh one otherwise.
    pub(super) fn for_limiter(shared: bool, previous: Option<&Arc<RecentUnlocks>>) -> Arc<RecentUnlocks> {
        match previous {
            Some(previous) if shared && previous.on => previous.clone(),
            _ => Arc::new(RecentUnlocks { on: shared, heard: Mutex::new(Heard::default()) }),
        }
    }

    /// An unlock made at `made_us` (when it was heard, for a live one; its
    /// stamp, for one replayed from the log, which may be long before).
    fn heard(&self, unlocked: Unlocked, made_us: u64, now_us: u64) {
        let stale = |at: u64| at.saturating_add(RECENT_UNLOCKS_KEEP_US) < now_us;
        if !self.on || stale(made_us) {
            return;
        }
        let mut heard = self.heard.locked();
        // The oldest arrivals go when stale or past the cap. A replayed
        // unlock behind newer ones may outlive its minute: its stamp is
        // older than any op still waiting, so it holds nothing back.
        while heard.arrivals.front().is_some_and(|(_, at, _)| stale(*at)) || heard.arrivals.len() >= RECENT_UNLOCKS_MAX
        {
            let (number, _, gone) = heard.arrivals.pop_front().expect("not empty");
            // Kept while a later arrival of the same unlock is.
            if heard.latest.get(&gone).is_some_and(|&(_, last)| last == number) {
                heard.latest.remove(&gone);
            }
        }
        heard.arrived += 1;
        let number = heard.arrived;
        let latest = heard.latest.entry(unlocked.clone()).or_insert((made_us, number));
        *latest = (latest.0.max(made_us), number);
        heard.arrivals.push_back((number, made_us, unlocked));
    }

    /// Whether an unlock of the key or its account was heard after
    /// `since_us`.
    fn covers(&self, route: &str, rule: u16, key: Key, since_us: u64) -> bool {
        let heard = self.heard.locked();
        let after = |unlocked: Unlocked| heard.latest.get(&unlocked).is_some_and(|&(at, _)| at > since_us);
        after(Unlocked::Key(route.to_string(), rule, key.tuple))
            || after(Unlocked::Account(route.to_string(), key.account_tag))
    }
}

/// The tags of a route's rules keyed on the account.
pub(super) fn account_rules(route: &Route) -> SmallVec<[u16; 8]> {
    route.rules.iter().filter(|r| r.key.contains(&Component::Account)).map(|r| r.tag).collect()
}

impl Limiter {
    /// Forgets every known lockout of the route's rules keyed on the
    /// account held for `account_tag` (an account-wide unlock, here or on
    /// another host): found by the account tag kept with each, so it works
    /// whatever the store forgot (its index of the account's entries is
    /// gone after a flush). Only those learned at or before `before_us`
    /// (an unlock replayed from the log must not forget a newer lockout).
    /// How many were forgotten.
    pub fn forget_account_lockouts(&self, route: &str, account_tag: u64, before_us: u64, now_us: u64) -> u32 {
        let Some(route) = self.routes.iter().find(|r| r.name == route) else { return 0 };
        let made_us = before_us.min(now_us);
        self.recent_unlocks.heard(Unlocked::Account(route.name.clone(), account_tag), made_us, now_us);
        let Some(known) = &route.known_lockouts else { return 0 };
        let rules = account_rules(route);
        let mut forgotten = 0;
        for mut table in known.each() {
            let doomed: SmallVec<[u64; 8]> = table
                .iter_live(0)
                .filter(|(_, slot)| {
                    slot.value.account_tag == account_tag
                        && rules.contains(&slot.value.rule)
                        && slot.value.learned_us <= before_us
                })
                .map(|(id, _)| id)
                .collect();
            for id in doomed {
                table.remove(id);
                forgotten += 1;
            }
        }
        forgotten
    }

    /// The known lockouts, listed by `lockouts` after this host's own:
    /// at most `limit` in `out` in all, every one counted in `total`. The
    /// count shown is the rule's threshold (the store holds the real one).
    pub(super) fn list_known_lockouts(&self, limit: usize, now_us: u64, out: &mut Vec<Lockout>, total: &mut u64) {
        for route in &self.routes {
            let Some(known) = &route.known_lockouts else { continue };
            for table in known.each() {
                let room = limit.saturating_sub(out.len());
                let mut found: SmallVec<[(u64, Slot<KnownLockout>); 16]> = SmallVec::new();
                for (tuple, slot) in table.iter_live(now_us) {
                    *total += 1;
                    if found.len() < room {
                        found.push((tuple, slot));
                    }
                }
                drop(table);
                for (tuple, slot) in found {
                    let Some(rule) = route.rules.iter().find(|r| r.tag == slot.value.rule) else { continue };
                    let count = match rule.global {
                        Some(Full::Failures(spec)) => spec.threshold,
                        _ => 0,
                    };
                    out.push(Lockout {
                        route: route.name.clone(),
                        rule: rule.name.clone(),
                        key: Key { account_tag: slot.value.account_tag, tuple }.to_string(),
                        count,
                        until_ms: ceil_ms(slot.expires_us),
                        retry_after_ms: ceil_ms(slot.expires_us - now_us),
                    });
                }
            }
        }
    }

    /// The message that tells the other hosts of an account-wide unlock:
    /// `A <route> <account tag>`.
    pub fn account_unlock_message(&self, route: &str, account: &str) -> String {
        format!("A {route} {:016x}", self.keys.account_tag(account))
    }

    /// An account-wide unlock heard from another host.
    pub fn forget_account_lockouts_heard(
        &self,
        route: &str,
        account_tag_hex: &str,
        before_us: u64,
        now_us: u64,
    ) -> bool {
        let Ok(tag) = u64::from_str_radix(account_tag_hex, 16) else { return false };
        if !self.routes.iter().any(|r| r.name == route) {
            return false;
        }
        self.forget_account_lockouts(route, tag, before_us, now_us);
        true
    }

    /// Forgets a known lockout by its store key name (an unlock here or
    /// on another host), if learned at or before `before_us`. True if the
    /// name is one of this limiter's.
    pub fn forget_known_lockout(&self, name: &str, before_us: u64, now_us: u64) -> bool {
        let Some((route, rule, key)) = self.parse_store_key(name) else { return false };
        let unlocked = Unlocked::Key(route.name.clone(), route.rules[rule].tag, key.tuple);
        self.recent_unlocks.heard(unlocked, before_us.min(now_us), now_us);
        if let Some(known) = &route.known_lockouts {
            let mut known = known.of(key);
            if known
                .get(key.tuple, 0)
                .is_some_and(|s| s.value.rule == route.rules[rule].tag && s.value.learned_us <= before_us)
            {
                known.remove(key.tuple);
            }
        }
        true
    }

    /// Forgets one known lockout of `rule` (an unlock won over it).
    pub(super) fn forget_known(&self, route: &Route, rule: usize, key: Key) {
        if let Some(known) = &route.known_lockouts {
            let mut known = known.of(key);
            if known.get(key.tuple, 0).is_some_and(|s| s.value.rule == route.rules[rule].tag) {
                known.remove(key.tuple);
            }
        }
    }

    /// Learns a lockout another host took (published with its remaining
    /// time): refused here from memory until it ends. `ran_us`: when its
    /// op ran in the store, in this host's time, if the message says. A
    /// message is published a reply's way back after its op ran, so it
    /// may come after an unlock the store ran later: such a lockout, or
    /// one of unknown time with an unlock heard in the last minute, is
    /// not learned (the store refuses a real one, a round trip later).
    pub fn learn_known_lockout(&self, name: &str, remaining_us: u64, ran_us: Option<u64>, now_us: u64) -> bool {
        let Some((route, rule, key)) = self.parse_store_key(name) else { return false };
        // The op's time in this host's clock is known to within a reply's
        // way back (the offset is taken from replies).
        let since = match ran_us {
            Some(ran) => ran.saturating_sub(LATE_REPLY_WAIT_MS * 1000),
            None => now_us.saturating_sub(RECENT_UNLOCKS_KEEP_US),
        };
        if self.unlocked_since(route, rule, key, since) {
            return true;
        }
        // No lockout of a sliding window outlasts its next window: a
        // message claiming longer (garbage, or a forgery by whoever can
        // publish on the store) is held no longer than that.
        let longest = match route.rules[rule].global {
            Some(Full::Failures(spec)) => spec.window_us.saturating_mul(2),
            _ => 0,
        };
        let until = now_us.saturating_add(remaining_us.min(longest));
        // A message never shortens a lockout held here: this host's own
        // echo of a lockout's first message comes back after later
        // failures lengthened it (the store's reply says so), and a
        // shorter end would refuse less from memory after the store
        // forgets. An unlock forgets it first, by its own message.
        if let Some(known) = &route.known_lockouts {
            let held = known.of(key).get(key.tuple, now_us);
            if held.is_some_and(|slot| slot.value.rule == route.rules[rule].tag && slot.expires_us >= until) {
                return true;
            }
        }
        self.remember_lockout(route, rule, key, until, now_us);
        true
    }

    /// (route, rule index, key) of a failure entry's store key name.
    pub(super) fn parse_store_key(&self, name: &str) -> Option<(&Route, usize, Key)> {
        let prefix = self.shared_prefix.as_deref()?;
        let rest = name.strip_prefix(prefix)?.strip_prefix(":{")?;
        let (_tag, rest) = rest.split_once("}:f:")?;
        let (rule_id, hex) = rest.rsplit_once(':')?;
        let key = Key::from_u128(u128::from_str_radix(hex, 16).ok()?);
        let (route_name, _) = rule_id.split_once('/')?;
        let route = self.routes.iter().find(|r| r.name == route_name)?;
        let index = route.rules.iter().position(|r| *r.id == *rule_id)?;
        matches!(route.rules[index].global, Some(Full::Failures(_))).then_some((route, index, key))
    }

    /// Refuses from memory a key the store said is locked; true if one is.
    pub(super) fn known_lockout<'a>(
        &'a self,
        route: &'a Route,
        keys: &RuleKeys,
        devices: DevicesDecided,
        now_us: u64,
        answers: &mut Answers<'a>,
    ) -> bool {
        let Some(known) = &route.known_lockouts else { return false };
        let mut refused = false;
        for (rule, key) in route.rules.iter().zip(keys.iter().copied()) {
            let (Some(Full::Failures(spec)), Some(key), false) = (rule.global, key, rule.monitor) else { continue };
            // Whether a device-scoped rule applies is the store's to say
            // (the account ceiling exempts a device any host has seen log
            // in): its lockout is not refused from memory.
            let device_scoped = rule.devices != DeviceScope::All;
            if device_scoped && devices == DevicesDecided::ByStore {
                continue;
            }
            let Some(slot) = known.of(key).get(key.tuple, now_us) else { continue };
            if slot.value.rule != rule.tag {
                continue;
            }
            if device_scoped && devices == DevicesDecided::HereStoreLate {
                // The device may be one another host saw the owner log in
                // on (this host would not know): a short wait, no climb, as
                // for a busy store, rather than the lockout's whole time.
                answers.push(busy_answer(rule, spec.threshold));
                refused = true;
                continue;
            }
            let standing = Standing { counts: Counts::default(), in_flight: 0, in_flight_until_us: now_us };
            let mut answer = failure_answer(rule, spec, standing, true, now_us);
            answer.retry_after_us = slot.expires_us - now_us;
            answer.remaining = 0;
            // The store said this key is locked by its failures; with no
            // counts here `failure_answer` would call it places in flight.
            answer.reason = Reason::TooManyFailures;
            let answer = self.escalate(rule, key, answer, now_us, true);
            refused |= answer.refused && !answer.monitored;
            answers.push(answer);
        }
        refused
    }

    /// Whether an unlock of `key` on the route's rule, or of its account,
    /// was heard after `since_us` (when the op whose reply reports its
    /// lockout began): the lockout is then not remembered (see
    /// `RecentUnlocks`).
    pub(super) fn unlocked_since(&self, route: &Route, rule_index: usize, key: Key, since_us: u64) -> bool {
        self.recent_unlocks.covers(&route.name, route.rules[rule_index].tag, key, since_us)
    }

    pub(super) fn remember_lockout(&self, route: &Route, rule_index: usize, key: Key, until_us: u64, now_us: u64) {
        if let Some(known) = &route.known_lockouts {
            if until_us > now_us {
                let value = KnownLockout {
                    rule: route.rules[rule_index].tag,
                    account_tag: key.account_tag,
                    learned_us: now_us,
                };
                known.of(key).set(key.tuple, Slot { expires_us: until_us, value }, now_us);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000;

    /// The memory answers by key whatever else it holds: an unlock heard
    /// twice is kept while its later arrival is, the oldest arrivals go
    /// past the cap or the minute, and an unlock of the account covers
    /// each of its keys.
    #[test]
    fn the_unlocks_heard_are_kept_by_what_they_unlocked_and_forgotten_oldest_first() {
        let memory = RecentUnlocks::for_limiter(true, None);
        let key = |tuple: u64| Key { account_tag: 7, tuple };
        let t0 = 100 * SECOND;
        memory.heard(Unlocked::Key("login".into(), 1, 1), t0, t0);
        memory.heard(Unlocked::Key("login".into(), 1, 1), t0 + SECOND, t0 + SECOND);
        assert!(memory.covers("login", 1, key(1), t0 + SECOND / 2), "the later arrival's stamp");
        assert!(!memory.covers("login", 2, key(1), 0) && !memory.covers("other", 1, key(1), 0));
        // Forged unlocks of other keys, to the cap: the first arrival of
        // key 1 goes, its second stays.
        for i in 0..RECENT_UNLOCKS_MAX as u64 - 1 {
            memory.heard(Unlocked::Key("login".into(), 1, 1000 + i), t0 + SECOND, t0 + SECOND);
        }
        assert!(memory.covers("login", 1, key(1), t0), "evicted with its first arrival");
        memory.heard(Unlocked::Key("login".into(), 1, 9000), t0 + SECOND, t0 + SECOND);
        assert!(!memory.covers("login", 1, key(1), 0), "the oldest goes past the cap");
        assert_eq!(memory.heard.locked().latest.len(), RECENT_UNLOCKS_MAX);
        // An account's unlock covers each key of the account; past the
        // minute, the next unlock heard sweeps it.
        memory.heard(Unlocked::Account("login".into(), 7), t0 + 2 * SECOND, t0 + 2 * SECOND);
        assert!(memory.covers("login", 3, key(99), t0 + SECOND));
        let later = t0 + 2 * SECOND + RECENT_UNLOCKS_KEEP_US + 1;
        memory.heard(Unlocked::Key("login".into(), 1, 2), later, later);
        assert!(!memory.covers("login", 3, key(99), 0), "stale after a minute");
        assert_eq!(memory.heard.locked().latest.len(), 1);
    }
}
