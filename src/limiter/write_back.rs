//! Lockouts taken while the store was away, written back to it when it
//! returns (a merge: the later lockout wins, an unlock made since wins),
//! and the lockouts the store reports kept in the state file.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::route::{Full, Route, Table};
use super::shards::shard_index;
use super::subject::RuleKeys;
use super::Limiter;
use crate::keys::Key;
use crate::shared::script::Op;
use crate::store::{DeviceMap, DeviceRows, Durable};
use crate::unpoisoned::Unpoisoned;

/// Keys whose share start is kept, at most: past it (a flood of distinct
/// keys in one outage) a new key's lockout is aged from its window's
/// start, as after a restart. 65,536 keys is a few MiB.
pub const SHARE_STARTS_MAX: usize = 65_536;

/// When this host's degraded share of each global failure rule began on
/// a key (its first check or report decided there): no lockout of the
/// share on that key is older, so a write-back aged from it loses only to
/// an operator's unlock made after that. Without it the age runs from the
/// window's start, and a lockout the share took after an unlock, in the
/// unlock's window, lost too: each outage gave the key a fresh share.
/// Memory only, kept across reloads; dropped once written back.
#[derive(Default)]
pub(super) struct ShareStarts(Mutex<HashMap<(Arc<str>, Key), u64>>);

impl ShareStarts {
    /// The earliest instant noted stays (a key noted with no counts yet
    /// may be noted again before its first).
    fn note(&self, rule: &Arc<str>, key: Key, now_us: u64) {
        let mut starts = self.0.locked();
        if starts.len() < SHARE_STARTS_MAX || starts.contains_key(&(rule.clone(), key)) {
            starts.entry((rule.clone(), key)).or_insert(now_us);
        }
    }

    fn get(&self, rule: &Arc<str>, key: Key) -> Option<u64> {
        self.0.locked().get(&(rule.clone(), key)).copied()
    }

    fn forget(&self, rule: &Arc<str>, key: Key) {
        self.0.locked().remove(&(rule.clone(), key));
    }
}

/// A lockout taken on a degraded table, to write back to the store.
pub struct WriteBack {
    pub op: Op,
    route: usize,
    rule: usize,
    key: Key,
    lock_remaining_us: u64,
}

impl Limiter {
    /// A check or report about to be decided on the degraded share: each
    /// global failure rule notes when its share began on the key, if the
    /// share counts nothing on it yet. Counts found there with no start
    /// noted (a full map, a restart, counts from before shared mode) are of
    /// an unknown age, and a start noted now would make them look young.
    pub(super) fn note_share_start(&self, route: &Route, rule_keys: &RuleKeys, now_us: u64) {
        for (rule, key) in route.rules.iter().zip(rule_keys.iter().copied()) {
            let (Some(Full::Failures(_)), Table::Failures { shards, .. }, Some(key)) = (rule.global, &rule.table, key)
            else {
                continue;
            };
            let counts = shards.of(key).get(key, now_us);
            if counts.previous == 0 && counts.current == 0 {
                self.share_starts.note(&rule.id, key, now_us);
            }
        }
    }

    /// Forgets the share starts of keys the share no longer counts (after
    /// a write-back: what the outage left).
    pub fn prune_share_starts(&self, now_us: u64) {
        let mut starts = self.share_starts.0.locked();
        starts.retain(|(id, key), _| {
            let rule = self.routes.iter().flat_map(|r| &r.rules).find(|r| r.id == *id);
            let Some(Table::Failures { shards, .. }) = rule.map(|r| &r.table) else { return false };
            let counts = shards.of(*key).get(*key, now_us);
            counts.previous > 0 || counts.current > 0
        });
    }

    /// Every key locked on a global rule's degraded table: lockouts taken
    /// while the store was away (or before shared mode), each as a merge.
    /// A merge carries durations, not instants, so skew between this host
    /// and the store does not move it; its age is counted from when the
    /// share began on the key (`ShareStarts`), or if that is not known
    /// from the start of the window the lockout was taken in, so an
    /// operator's unlock made in the store after that wins.
    pub fn degraded_lockouts(&self, now_us: u64) -> Vec<WriteBack> {
        let mut out = Vec::new();
        for (r, route) in self.routes.iter().enumerate() {
            for (i, rule) in route.rules.iter().enumerate() {
                let (Some(Full::Failures(full)), Table::Failures { shards, .. }) = (rule.global, &rule.table) else {
                    continue;
                };
                for table in shards.each() {
                    let spec = table.spec();
                    for (key, counts) in table.locked(now_us) {
                        let lock_remaining_us = spec.unlocks_at(counts, now_us) - now_us;
                        let began_us =
                            self.share_starts.get(&rule.id, key).unwrap_or(counts.window as u64 * spec.window_us);
                        let age_us = now_us.saturating_sub(began_us);
                        let op = Op::merge(
                            self.store_key(rule, key),
                            self.index_key(rule, key.account_tag),
                            full.window_us,
                            full.threshold,
                            lock_remaining_us,
                            age_us,
                        );
                        out.push(WriteBack { op, route: r, rule: i, key, lock_remaining_us });
                    }
                }
            }
        }
        out
    }

    /// The store has a lockout written back: it leaves the degraded table
    /// and, if the store took it (`applied`: no unlock made since), it is
    /// known here (refused from memory until it ends).
    pub fn written_back(&self, lockout: &WriteBack, applied: bool, now_us: u64) {
        let route = &self.routes[lockout.route];
        let key = lockout.key;
        self.clear_degraded_key(route, lockout.rule, key);
        self.share_starts.forget(&route.rules[lockout.rule].id, key);
        if !applied {
            // An unlock made since won: a lockout refused here from memory
            // meanwhile (`not_written_back`) goes too.
            self.forget_known(route, lockout.rule, key);
            return;
        }
        let until = now_us + lockout.lock_remaining_us;
        self.remember_lockout(route, lockout.rule, key, until, now_us);
        let _ = self.persist_known_lockout(route, lockout.rule, key, until);
    }

    /// The store did not take a lockout written back (the merge failed):
    /// this host refuses it from memory meanwhile, and it stays on the
    /// degraded table, so the next write-back sends it again.
    pub fn not_written_back(&self, lockout: &WriteBack, now_us: u64) {
        let route = &self.routes[lockout.route];
        let Table::Failures { shards, .. } = &route.rules[lockout.rule].table else { return };
        // Only while it is still due: an unlock on this host meanwhile
        // cleared it, and must not be undone here.
        let counts = shards.of(lockout.key).get(lockout.key, now_us);
        if counts.previous == 0 && counts.current == 0 {
            return;
        }
        self.remember_lockout(route, lockout.rule, lockout.key, now_us + lockout.lock_remaining_us, now_us);
    }

    /// Clears a key's entry on a global rule's degraded table (journaled).
    fn clear_degraded_key(&self, route: &Route, rule_index: usize, key: Key) {
        let rule = &route.rules[rule_index];
        let (Some(Full::Failures(_)), Table::Failures { shards, .. }) = (rule.global, &rule.table) else { return };
        let mut table = shards.of(key);
        if table.clear(key).is_some() {
            self.journal.write(&rule.id, table.spec().window_us, vec![(key, None)]);
        }
    }

    /// Writes a lockout the store reported to the state file; the reply
    /// waits for it, as for a lockout taken on this host.
    pub(super) fn persist_known_lockout(
        &self,
        route: &Route,
        rule_index: usize,
        key: Key,
        until_us: u64,
    ) -> Option<Durable> {
        let rows = DeviceRows {
            route: route.name.as_str().into(),
            map: DeviceMap::KnownLockouts,
            shard: shard_index(key.tuple) as u8,
            whole: false,
            rows: vec![(key.tuple, Some((until_us, route.rules[rule_index].tag)))],
        };
        self.journal.write_devices(rows, true)
    }
}
