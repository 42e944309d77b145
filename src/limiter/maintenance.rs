//! Off the request path: unlock and the lockouts list (admin), snapshots,
//! rewrites and restores of the state file, and sweeping expired entries.

use std::sync::Arc;

use std::sync::MutexGuard;

use super::route::{Full, KnownLockout, Route, Rule, Table};
use super::shards::{shard_index, Shards, SHARDS};
use super::{Limiter, RequestError, IDENTIFIER_BYTES_MAX};
use crate::clock::ceil_ms;
use crate::expiring::{Changes, ExpiringMap, Slot};
use crate::failure_window::{CellChanges, CellChunk, Counts, FailureWindowTable, WindowSpec};
use crate::keys::{Component, Key};
use crate::protocol::{Lockout, Subject};
use crate::store::{
    CellRows, DeviceChange, DeviceMap, DeviceRows, Durable, Journal, PersistedCells, PersistedDevice, PersistedEntry,
};

/// The two passes of `lockouts`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Listed {
    Locked,
    /// Shared mode: lockouts the store reported, refused here from memory.
    Known,
    InFlight,
}

/// Whether an unlock of an account (and a source) names exactly one of the
/// rule's entries: the rule is keyed on the account, or on the account and
/// the source's prefix. Otherwise (no source, or another component) it
/// clears every entry of the account.
pub(super) fn unlocks_one_entry(rule: &Rule, source: Option<std::net::IpAddr>) -> bool {
    rule.key.iter().all(|c| *c == Component::Account || (*c == Component::Prefix && source.is_some()))
}

impl Limiter {
    /// Every failure rule's shards, each locked in turn (the lock is the
    /// item's: it is released when the loop moves on), with its route, rule
    /// and index.
    fn failure_shards(&self) -> impl Iterator<Item = (&Route, &Rule, u8, MutexGuard<'_, FailureWindowTable>)> {
        let rules = self.routes.iter().flat_map(|route| route.rules.iter().map(move |rule| (route, rule)));
        let failure_rules = rules.filter_map(|(route, rule)| match &rule.table {
            Table::Failures { shards, .. } => Some((route, rule, shards)),
            Table::Rate { .. } | Table::Signal { .. } => None,
        });
        failure_rules.flat_map(|(route, rule, shards)| {
            shards.each().enumerate().map(move |(index, table)| (route, rule, index as u8, table))
        })
    }

    /// Clears an account's entries on a route's failure rules: with a
    /// source, its (account, source) entries and the account-wide ones;
    /// without, every entry of the account. The places attempts in flight
    /// hold on those keys go too, so a refusal made of places nobody
    /// reported is undone like one made of failures. Returns how many keys
    /// held anything; durable before it returns Ok.
    pub fn unlock(
        &self,
        route: &str,
        account: &str,
        source: Option<std::net::IpAddr>,
        now_us: u64,
    ) -> Result<(u32, Vec<Durable>), RequestError> {
        let route = self.route(route)?;
        if account.len() > IDENTIFIER_BYTES_MAX {
            return Err(RequestError::FieldTooLong { field: "account", len: account.len(), max: IDENTIFIER_BYTES_MAX });
        }
        let tag = self.keys.account_tag(account);
        let subject = Subject { peer: source, account: Some(account), ..Subject::default() };
        let mut keys = self.subject_keys(&route.name, &subject);
        let mut cleared = 0;
        let mut writes = Vec::new();
        for rule in &route.rules {
            let Table::Failures { shards, .. } = &rule.table else { continue };
            if !rule.key.contains(&Component::Account) {
                continue;
            }
            if unlocks_one_entry(rule, source) {
                let key = keys.key(&rule.key)?;
                let mut table = shards.of(key);
                let failed = table.clear(key).is_some();
                if failed {
                    writes.push(self.journal.write_durably(&rule.id, table.spec().window_us, vec![(key, None)]));
                }
                if table.clear_places(key, now_us) || failed {
                    cleared += 1;
                }
                continue;
            }
            if source.is_some() {
                continue; // e.g. (account, device): not this source's entry
            }
            for mut table in shards.each() {
                let doomed: Vec<Key> = table.entries().filter(|(k, _)| k.account_tag == tag).map(|(k, _)| k).collect();
                for key in &doomed {
                    table.clear(*key);
                    table.clear_places(*key, now_us);
                }
                // Keys with places and no failures are found by their tag.
                cleared += doomed.len() as u32 + table.clear_account_places(tag, now_us);
                if doomed.is_empty() {
                    continue;
                }
                let removals = doomed.into_iter().map(|k| (k, None)).collect();
                writes.push(self.journal.write_durably(&rule.id, table.spec().window_us, removals));
            }
        }
        Ok((cleared, writes))
    }

    /// With `bans` the operator's bans, then keys refused by failure rules
    /// now, at most `limit`, and how many are banned or locked in all. Every locked key is listed before any key refused
    /// only by its attempts in flight, which fill what room is left (and
    /// are not in the total): a flood of unreported checks on made-up
    /// accounts can neither push a real lockout out of the list nor raise
    /// the count an operator alerts on.
    ///
    /// A shard's lock is held only to copy its keys and counts (a few bytes
    /// each) and count the rest; the strings of a 10,000-entry reply are
    /// made after it is released, so checks on that shard do not wait for
    /// them.
    pub fn lockouts(&self, limit: usize, bans: bool, now_us: u64) -> (Vec<Lockout>, u64) {
        // The operator's own bans first (with `bans`: an admin's view): there
        // are few, and each is a decision someone is answerable for.
        let mut out = if bans { self.listed_bans(now_us) } else { Vec::new() };
        let mut total = out.len() as u64;
        out.truncate(limit);
        let mut found = Vec::new();
        for pass in [Listed::Locked, Listed::Known, Listed::InFlight] {
            if pass == Listed::Known {
                self.list_known_lockouts(limit, now_us, &mut out, &mut total);
                continue;
            }
            for (route, rule, _, table) in self.failure_shards() {
                let room = limit.saturating_sub(out.len());
                if pass == Listed::InFlight && room == 0 {
                    break;
                }
                let spec = table.spec();
                found.clear();
                match pass {
                    Listed::Locked => {
                        for (key, counts) in table.locked(now_us) {
                            total += 1;
                            if found.len() < room {
                                found.push((key, counts, spec.unlocks_at(counts, now_us)));
                            }
                        }
                    }
                    Listed::InFlight => found.extend(table.refused_by_places(room, now_us)),
                    Listed::Known => unreachable!("listed above"),
                }
                drop(table);
                out.extend(found.iter().map(|&(key, counts, until_us)| Lockout {
                    route: route.name.clone(),
                    rule: rule.name.clone(),
                    key: key.to_string(),
                    // Refused for attempts in flight: the whole failures,
                    // below the rule's limit by definition.
                    count: match pass {
                        Listed::Locked => spec.estimate(counts, now_us),
                        Listed::InFlight => spec.whole_failures(counts, now_us),
                        Listed::Known => unreachable!("listed above"),
                    },
                    until_ms: ceil_ms(until_us),
                    retry_after_ms: ceil_ms(until_us - now_us),
                }));
            }
        }
        (out, total)
    }

    /// Maintenance, off the request path: expires failure entries and sends
    /// every change since the last call to the journal. With `durable`, the
    /// returned writes complete when the changes are on disk.
    pub fn snapshot(&self, now_us: u64, durable: bool) -> Vec<Durable> {
        let mut writes = Vec::new();
        for (_, rule, shard, mut table) in self.failure_shards() {
            table.expire(now_us);
            let changes = table.take_changes();
            // Sent while the shard is locked: see `report`.
            let window_us = table.spec().window_us;
            if let Some(changes) = table.take_cell_changes(now_us) {
                let rows = CellRows { rule: rule.id.clone(), window_us, shard, changes };
                writes.extend(self.journal.write_cells(rows, durable));
            }
            if changes.is_empty() {
                continue;
            }
            if durable {
                writes.push(self.journal.write_durably(&rule.id, window_us, changes));
            } else {
                self.journal.write(&rule.id, window_us, changes);
            }
        }
        self.save_known_devices(now_us, false, &mut writes, durable);
        writes
    }

    /// Every route's known devices to the journal: the changes since the
    /// last call, or with `full` everything (see `save_device_map`).
    fn save_known_devices(&self, now_us: u64, full: bool, writes: &mut Vec<Durable>, durable: bool) {
        for route in &self.routes {
            let name: Arc<str> = route.name.as_str().into();
            let journal = &self.journal;
            if let Some(lockouts) = &route.known_lockouts {
                let map = DeviceMap::KnownLockouts;
                save_device_map(journal, &name, map, lockouts, |k| k.rule, now_us, full, writes, durable);
            }
            let Some(known) = &route.known_devices else { continue };
            let (devices, accounts) = (&known.shards, &known.per_account);
            save_device_map(journal, &name, DeviceMap::Devices, devices, |_| 0, now_us, full, writes, durable);
            save_device_map(journal, &name, DeviceMap::PerAccount, accounts, |n| n, now_us, full, writes, durable);
        }
    }

    /// Shared mode, at a stop: what this host's reports counted in the
    /// store and the attempts the store admitted through it, every live
    /// count, for the next start to put back (`restore_store_count`) so
    /// that a restarted host's share still holds them while the store is
    /// away. Saved only here: they change with every login, and a crash
    /// loses them. The returned writes complete when they are on disk.
    pub fn save_store_counts(&self, now_us: u64) -> Vec<Durable> {
        let mut writes = Vec::new();
        for route in &self.routes {
            let Some(counts) = &route.store_counted else { continue };
            let (name, map) = (route.name.as_str().into(), DeviceMap::StoreCounted);
            let value = |c: super::spent_keys::StoreCounted| c.row_value(now_us);
            save_device_map(&self.journal, &name, map, counts, value, now_us, true, &mut writes, true);
        }
        writes
    }

    /// Puts persisted known devices back at start. Rows already expired, or
    /// of a route that keeps no known devices, are deleted; an expiry past
    /// the route's TTL now (shortened while the daemon was down) is cut to
    /// it. Returns how many were restored.
    pub fn restore_known_devices(&self, rows: Vec<PersistedDevice>, now_us: u64) -> usize {
        let mut restored = 0;
        let mut orphans = std::collections::BTreeSet::new();
        let mut stale: Vec<DeviceRows> = Vec::new();
        let mut counted_shards = std::collections::BTreeSet::new();
        // A route keeps its rows while it keeps either map; rows of a map
        // it no longer keeps are deleted one by one.
        let keeps = |name: &str| {
            self.routes.iter().any(|r| r.name == name && (r.known_devices.is_some() || r.known_lockouts.is_some()))
        };
        for row in rows {
            let route = self.routes.iter().find(|r| r.name == row.route);
            if row.map == DeviceMap::KnownLockouts {
                let lockouts = route.and_then(|r| r.known_lockouts.as_ref());
                let index = shard_index(row.id);
                // Held no longer than two windows of its rule from now, as
                // a lockout learned any other way: a row written while the
                // clock ran ahead (or crafted) must not refuse for longer.
                // Found among the global failure rules only: a 16-bit tag
                // may be shared with a host rule.
                let longest = route.and_then(|r| {
                    r.rules.iter().find_map(|rule| match rule.global {
                        Some(Full::Failures(spec)) if rule.tag == row.value => Some(spec.window_us.saturating_mul(2)),
                        _ => None,
                    })
                });
                let expires_us = longest.map_or(0, |longest| row.expires_us.min(now_us.saturating_add(longest)));
                let live = expires_us > now_us;
                if lockouts.is_none() || !live || usize::from(row.shard) != index {
                    let route: Arc<str> = row.route.as_str().into();
                    let rows = vec![(row.id, None)];
                    stale.push(DeviceRows { route, map: row.map, shard: row.shard, whole: false, rows });
                }
                if let (Some(lockouts), true) = (lockouts, live) {
                    let mut table = lockouts.at(index);
                    let value = KnownLockout { rule: row.value, account_tag: 0, learned_us: 0 };
                    table.restore(row.id, Slot { expires_us, value }, now_us);
                    if usize::from(row.shard) != index || expires_us != row.expires_us {
                        table.mark_changed(row.id);
                    }
                    restored += 1;
                }
                continue;
            }
            if row.map == DeviceMap::StoreCounted {
                // Read once: the file keeps none until the next stop saves
                // them again (`save_store_counts`), each shard's emptied
                // in one write below.
                self.restore_store_count(route, &row, now_us);
                counted_shards.insert((row.route, row.shard));
                continue;
            }
            let known = route.and_then(|r| r.known_devices.as_ref());
            let Some(known) = known else {
                if keeps(&row.route) {
                    let route: Arc<str> = row.route.as_str().into();
                    let rows = vec![(row.id, None)];
                    stale.push(DeviceRows { route, map: row.map, shard: row.shard, whole: false, rows });
                } else {
                    orphans.insert(row.route);
                }
                continue;
            };
            let slot_expires_us = row.expires_us.min(now_us.saturating_add(known.ttl_us));
            let index = shard_index(row.id);
            let live = slot_expires_us > now_us;
            // An expired row, or one filed under another shard (a build
            // with another shard count), is deleted where it is.
            if !live || usize::from(row.shard) != index {
                let route: Arc<str> = row.route.as_str().into();
                let rows = vec![(row.id, None)];
                stale.push(DeviceRows { route, map: row.map, shard: row.shard, whole: false, rows });
            }
            if !live {
                continue;
            }
            let moved = usize::from(row.shard) != index || slot_expires_us != row.expires_us;
            match row.map {
                DeviceMap::Devices => {
                    let mut table = known.shards.at(index);
                    table.restore(row.id, Slot { expires_us: slot_expires_us, value: 0 }, now_us);
                    if moved {
                        table.mark_changed(row.id);
                    }
                }
                DeviceMap::PerAccount => {
                    let mut table = known.per_account.at(index);
                    table.restore(row.id, Slot { expires_us: slot_expires_us, value: row.value }, now_us);
                    if moved {
                        table.mark_changed(row.id);
                    }
                }
                DeviceMap::KnownLockouts | DeviceMap::StoreCounted => unreachable!("restored above"),
            }
            restored += 1;
        }
        for (route, shard) in counted_shards {
            let (route, map) = (route.as_str().into(), DeviceMap::StoreCounted);
            stale.push(DeviceRows { route, map, shard, whole: true, rows: Vec::new() });
        }
        for edit in stale {
            self.journal.write_devices(edit, false);
        }
        for route in orphans {
            self.journal.drop_devices(&route);
        }
        restored
    }

    /// Rewrites the whole state file from memory (after a failed write left
    /// it behind). Each shard's entries are sent while its lock is held, so
    /// a change made after a shard was collected reaches the writer after
    /// it; the returned write resolves when the fresh file is in place.
    pub fn rewrite(&self, now_us: u64) -> Durable {
        self.journal.rewrite_begin();
        for (_, rule, shard, mut table) in self.failure_shards() {
            table.expire(now_us);
            let entries = table.full_snapshot();
            let window_us = table.spec().window_us;
            if !entries.is_empty() {
                self.journal.write(&rule.id, window_us, entries);
            }
            if let Some(changes) = table.full_cell_snapshot(now_us) {
                self.journal.write_cells(CellRows { rule: rule.id.clone(), window_us, shard, changes }, false);
            }
        }
        self.save_known_devices(now_us, true, &mut Vec::new(), false);
        self.rewrite_bans(now_us);
        self.journal.rewrite_end()
    }

    /// Sweeps expired entries of the rate, escalation, known-device and
    /// password tables and lapsed places of failure rules, one shard per call (round robin by `tick`), so no
    /// call holds a lock for a whole table.
    pub fn sweep(&self, tick: u64, now_us: u64) {
        let shard = tick as usize % SHARDS;
        if shard == 0 {
            self.sweep_bans(now_us);
        }
        for route in &self.routes {
            for rule in &route.rules {
                match &rule.table {
                    Table::Rate { shards, .. } => shards.at(shard).sweep(now_us),
                    Table::Failures { shards, .. } => shards.at(shard).sweep_places(now_us),
                    Table::Signal { .. } => {}
                }
                rule.escalation.at(shard).sweep(now_us);
            }
            if let Some(k) = &route.known_devices {
                k.shards.at(shard).sweep(now_us);
                k.per_account.at(shard).sweep(now_us);
            }
            if let Some(r) = &route.recent_passwords {
                r.shards.at(shard).sweep(now_us);
            }
            if let Some(l) = &route.known_lockouts {
                l.at(shard).sweep(now_us);
            }
        }
    }

    /// Puts persisted entries back at start. Rows already expired are
    /// deleted by the first snapshot; rows of rules not configured are
    /// deleted (see `Journal::drop_rule`). A row written under another
    /// window length is re-dated the way a reload re-dates entries (its
    /// estimate, rounded down, becomes the current window's count) and
    /// written again in the rule's length now.
    pub fn restore(&self, entries: Vec<PersistedEntry>, now_us: u64) -> Restored {
        let mut counts = Restored::default();
        let mut placed = Vec::with_capacity(entries.len());
        let mut orphans = std::collections::BTreeSet::new();
        for entry in entries {
            let rule = self.routes.iter().flat_map(|r| &r.rules).find(|r| *r.id == *entry.rule);
            let Some(Table::Failures { spec, shards, .. }) = rule.map(|r| &r.table) else {
                counts.orphaned += 1;
                orphans.insert(entry.rule);
                continue;
            };
            let redated = entry.window_us != 0 && entry.window_us != spec.window_us;
            let restored = if redated {
                let then = WindowSpec { window_us: entry.window_us, threshold: spec.threshold };
                Counts {
                    window: spec.window_index(now_us),
                    previous: 0,
                    current: then.whole_failures(entry.counts, now_us),
                }
            } else {
                entry.counts
            };
            placed.push((shards, Key::from_u128(entry.key), restored, redated));
        }
        // In window order, so each table's lists stay ordered.
        placed.sort_by_key(|(_, _, c, _)| c.window);
        for (shards, key, restored, redated) in placed {
            let mut table = shards.of(key);
            match table.restore(key, restored, now_us) {
                Ok(true) => {
                    counts.restored += 1;
                    if redated {
                        counts.redated += 1;
                        table.mark_unwritten(key);
                    }
                }
                Ok(false) => counts.expired += 1,
                // No room (a smaller cap now): counted where a full
                // table counts, so its lockout holds.
                Err(_) => {
                    table.restore_spilled(key, restored, now_us);
                    counts.spilled += 1;
                }
            }
        }
        for rule in orphans {
            self.journal.drop_rule(&rule);
        }
        counts
    }
}

impl Limiter {
    /// Puts the overflow sketches' persisted cells back at start, after
    /// `restore`. A row written under another window length is re-dated as
    /// an entry is; rows of a rule not configured are deleted with its
    /// entries (`restore` drops them).
    pub fn restore_cells(&self, rows: Vec<PersistedCells>, now_us: u64, restored: &mut Restored) {
        let mut orphans = std::collections::BTreeSet::new();
        for row in rows {
            let rule = self.routes.iter().flat_map(|r| &r.rules).find(|r| *r.id == *row.rule);
            let Some(Table::Failures { spec, shards, .. }) = rule.map(|r| &r.table) else {
                orphans.insert(row.rule);
                continue;
            };
            if usize::from(row.shard) >= SHARDS || row.window_us < crate::failure_window::WINDOW_US_MIN {
                // Not a shard this daemon has, or a window no rule has (the
                // store reads none): the row goes.
                let gone = CellChunk { chunk: row.chunk, cells: Vec::new() };
                let changes = CellChanges { row_bits: row.row_bits, whole: false, chunks: vec![gone] };
                let rule: Arc<str> = row.rule.into();
                self.journal.write_cells(CellRows { rule, window_us: 0, shard: row.shard, changes }, false);
                continue;
            }
            let then = WindowSpec { window_us: row.window_us, threshold: spec.threshold };
            let mut table = shards.at(usize::from(row.shard));
            for (offset, counts) in row.cells {
                let counts = if row.window_us == spec.window_us {
                    counts
                } else {
                    Counts {
                        window: spec.window_index(now_us),
                        previous: 0,
                        current: then.whole_failures(counts, now_us),
                    }
                };
                let cell = row.chunk.saturating_mul(64).saturating_add(u32::from(offset));
                table.restore_cell(row.row_bits, cell, counts, now_us);
                restored.cells += 1;
            }
            if row.window_us != spec.window_us {
                table.forget_cell_rows();
            }
        }
        for rule in orphans {
            self.journal.drop_rule(&rule);
        }
    }
}

/// What `Limiter::restore` did with the state file's rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Live again in their tables.
    pub restored: usize,
    /// Both windows over while the daemon was down; their rows are deleted.
    pub expired: usize,
    /// Restored from rows written under another window length (counted in
    /// `restored` too).
    pub redated: usize,
    /// Naming a rule that is not configured (or is no longer a failure
    /// rule); deleted.
    pub orphaned: usize,
    /// No room in the table (full of lockouts): counted in its overflow
    /// sketch instead.
    pub spilled: usize,
    /// Overflow-sketch cells put back.
    pub cells: usize,
}

/// A known-device map's changes as state-file rows.
fn device_rows<V: Copy>(changes: Changes<V>, value: impl Fn(V) -> u16) -> (bool, Vec<DeviceChange>) {
    let row = |slot: Slot<V>| (slot.expires_us, value(slot.value));
    match changes {
        Changes::Some(list) => (false, list.into_iter().map(|(id, slot)| (id, slot.map(row))).collect()),
        Changes::Whole(all) => (true, all.into_iter().map(|(id, slot)| (id, Some(row(slot)))).collect()),
    }
}

/// Sends one known-device map to the journal, shard by shard, each while
/// its lock is held (so a later change of an entry is queued after it):
/// the changes since the last call, or with `full` every live entry (a
/// rewrite into a fresh file). Durable writes are pushed onto `writes`.
#[allow(clippy::too_many_arguments)]
fn save_device_map<V: Copy>(
    journal: &Journal,
    route: &Arc<str>,
    map: DeviceMap,
    shards: &Shards<ExpiringMap<V>>,
    value: impl Fn(V) -> u16,
    now_us: u64,
    full: bool,
    writes: &mut Vec<Durable>,
    durable: bool,
) {
    for (index, mut table) in shards.each().enumerate() {
        let changes = if full {
            table.take_changes(now_us);
            Some(Changes::Whole(table.live(now_us)))
        } else {
            table.take_changes(now_us)
        };
        let Some(changes) = changes else { continue };
        let (whole, rows) = device_rows(changes, &value);
        if rows.is_empty() && (full || !whole) {
            continue;
        }
        let edit = DeviceRows { route: route.clone(), map, shard: index as u8, whole, rows };
        writes.extend(journal.write_devices(edit, durable));
    }
}
