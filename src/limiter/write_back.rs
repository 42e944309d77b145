//! Lockouts taken while the store was away, written back to it when it
//! returns (a merge: the later lockout wins, an unlock made since wins),
//! and the lockouts the store reports kept in the state file.

use std::collections::HashSet;

use super::known_lockouts::RECENT_UNLOCKS_KEEP_US;
use super::route::{Full, Route, Table};
use super::shards::shard_index;
use super::Limiter;
use crate::failure_window::{Counts, FailureWindowTable};
use crate::keys::Key;
use crate::shared::script::Op;
use crate::store::{DeviceMap, DeviceRows, Durable};

/// How long one write-back pass sends merges: well within the time the
/// unlocks heard are kept (`RECENT_UNLOCKS_KEEP_US`), which a late chunk's
/// replies are checked against.
const WRITE_BACK_PASS_MAX_US: u64 = RECENT_UNLOCKS_KEEP_US / 2;

/// A lockout taken on a degraded table, to write back to the store.
pub struct WriteBack {
    store_key: String,
    index_key: Option<String>,
    window_us: u64,
    threshold: u32,
    route: usize,
    rule: usize,
    key: Key,
    /// At the listing: how long since the share's entry began counting
    /// (see `degraded_lockouts`), and how long the lock had left.
    age_us: u64,
    lock_remaining_us: u64,
    unlocks_at_us: u64,
    /// The entry as listed: cleared once written back only if still so.
    counts: Counts,
    started_us: Option<u64>,
}

impl WriteBack {
    /// Whether the entry it was listed from is still on `table`: counts,
    /// and the same start (an unlock clears an entry, and failures after
    /// it begin another). An entry of unknown start (restored, or begun
    /// from spilled failures) is taken to be the same.
    fn listed_entry_stands(&self, table: &FailureWindowTable, listed_us: u64) -> bool {
        let counts = table.get(self.key, listed_us);
        (counts.previous > 0 || counts.current > 0) && table.started_us(self.key) == self.started_us
    }

    /// The merge, sent `since_listing_us` after the lockouts were listed
    /// (a monotonic clock's reading, so a step of the wall clock moves
    /// neither): that much older, with that much less to run. A
    /// write-back of thousands goes out in batches, one after another; a
    /// later batch's merges aged at the listing would claim failures
    /// younger than they are, and an unlock made in between would lose to
    /// them. None once the lock has run out: nothing to merge, and the
    /// store's "not taken" would read as an unlock winning.
    pub fn op(&self, since_listing_us: u64) -> Option<Op> {
        let lock_remaining_us = self.lock_remaining_us.saturating_sub(since_listing_us);
        (lock_remaining_us > 0).then(|| {
            Op::merge(
                self.store_key.clone(),
                self.index_key.clone(),
                self.window_us,
                self.threshold,
                lock_remaining_us,
                self.age_us.saturating_add(since_listing_us),
            )
        })
    }
}

/// One write-back under way: the lockouts listed at `listed_us`, sent to
/// the store a chunk at a time (`next_chunk`), each chunk's replies
/// settled (`answered`) before the next is sent. The daemon's loop only
/// sends; what is sent, and what each reply does here, is decided here.
pub struct WriteBackPass<'l, E> {
    limiter: &'l Limiter,
    lockouts: Vec<WriteBack>,
    chunk: usize,
    listed_us: u64,
    /// Where the next chunk starts in `lockouts`.
    next: usize,
    /// The chunk sent last: its lockouts' places in `lockouts`.
    sent: Vec<usize>,
    /// Merges the store answered (taken, or lost to an unlock made since).
    pub written: usize,
    /// Merges that failed, and the last failure.
    pub failed: usize,
    pub last_error: Option<E>,
    /// Something is left to send at the next heartbeat: a merge failed, or
    /// an entry counted on after its listing.
    pub retry: bool,
    /// When the pass was cut short: the store names it sent, for the next
    /// pass to send last.
    pub tried: HashSet<String>,
}

impl<E> WriteBackPass<'_, E> {
    /// The next chunk's merges, sent `since_listing_us` after the listing
    /// (a monotonic clock's reading, so a wall-clock step moves nothing):
    /// each aged by that much, and a lock that ran out meanwhile left out
    /// (its counts stay on the degraded table, as any unlocked entry's
    /// do). None when every lockout has been sent.
    pub fn next_chunk(&mut self, since_listing_us: u64) -> Option<Vec<Op>> {
        if self.next >= self.lockouts.len() {
            return None;
        }
        // A pass against a slow store may run long; the unlocks its
        // replies are checked against are kept only so long. What is left
        // stays on the share, listed afresh at the next heartbeat. It is
        // not refused from memory meanwhile: an unlock the store holds may
        // have cleared it (the shares' bound still holds).
        if since_listing_us > WRITE_BACK_PASS_MAX_US {
            self.tried = self.lockouts[..self.next].iter().map(|l| l.store_key.clone()).collect();
            self.next = self.lockouts.len();
            self.retry = true;
            return None;
        }
        let end = (self.next + self.chunk).min(self.lockouts.len());
        self.sent.clear();
        let mut ops = Vec::with_capacity(end - self.next);
        for i in self.next..end {
            if let Some(op) = self.lockouts[i].op(since_listing_us) {
                self.sent.push(i);
                ops.push(op);
            }
        }
        self.next = end;
        Some(ops)
    }

    /// The replies to the chunk sent last, in its order: Ok(true) if the
    /// store took the merge, Ok(false) if an unlock made since won, Err if
    /// it failed.
    pub fn answered(&mut self, replies: impl IntoIterator<Item = Result<bool, E>>) {
        let limiter = self.limiter;
        for (&i, reply) in self.sent.iter().zip(replies) {
            let lockout = &self.lockouts[i];
            match reply {
                Ok(applied) => {
                    self.written += 1;
                    self.retry |= !limiter.written_back(lockout, applied, self.listed_us);
                }
                Err(e) => {
                    // Not in the store: this host refuses it from memory
                    // (the degraded table is not read while the store
                    // answers) and sends it again at the next heartbeat,
                    // so the other hosts refuse it too.
                    limiter.not_written_back(lockout, self.listed_us);
                    self.failed += 1;
                    self.last_error = Some(e);
                    self.retry = true;
                }
            }
        }
    }
}

impl Limiter {
    /// A write-back of every lockout on a global rule's degraded table
    /// (`degraded_lockouts` at `now_us`), `chunk` merges at a time.
    /// `tried`: the store names a pass cut short before this one sent
    /// (`WriteBackPass::tried`), sent after the others: the lockouts it
    /// never reached go first, so a store slow for many passes still gets
    /// every one.
    pub fn write_back_pass<E>(&self, now_us: u64, chunk: usize, tried: &HashSet<String>) -> WriteBackPass<'_, E> {
        let mut lockouts = self.degraded_lockouts(now_us);
        if !tried.is_empty() {
            lockouts.sort_by_key(|l| tried.contains(&l.store_key));
        }
        WriteBackPass {
            limiter: self,
            lockouts,
            chunk: chunk.max(1),
            listed_us: now_us,
            next: 0,
            sent: Vec::new(),
            written: 0,
            failed: 0,
            last_error: None,
            retry: false,
            tried: HashSet::new(),
        }
    }

    /// Every key locked on a global rule's degraded table: lockouts taken
    /// while the store was away (or before shared mode), each as a merge.
    /// A merge carries durations, not instants, so skew between this host
    /// and the store does not move it. Its age runs from when the share's
    /// entry began counting from nothing (`started_us`): no failure it
    /// holds is older, so an unlock made after that loses to it and one
    /// made before wins. Not known (restored, begun from spilled
    /// failures), from the start of the earliest window the counts hold.
    /// Without it, a lockout the share took after an unlock, in the
    /// unlock's window, lost too, and each outage gave a fresh share.
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
                        let earliest_window = (counts.window as u64).saturating_sub((counts.previous > 0) as u64);
                        let began_us = table.started_us(key).unwrap_or(earliest_window * spec.window_us);
                        let unlocks_at_us = spec.unlocks_at(counts, now_us);
                        out.push(WriteBack {
                            store_key: self.store_key(rule, key),
                            index_key: self.index_key(rule, key.account_tag),
                            window_us: full.window_us,
                            threshold: full.threshold,
                            route: r,
                            rule: i,
                            key,
                            age_us: now_us.saturating_sub(began_us),
                            lock_remaining_us: unlocks_at_us - now_us,
                            unlocks_at_us,
                            counts: spec.rolled(counts, now_us),
                            started_us: table.started_us(key),
                        });
                    }
                }
            }
        }
        out
    }

    /// The store has a lockout written back: it leaves the degraded table
    /// and, if the store took it (`applied`: no unlock made since), it is
    /// known here (refused from memory until it ends). `now_us`: when the
    /// lockouts were listed. False if the entry changed since (this host
    /// counted more failures on it meanwhile, or it was cleared and began
    /// again): it stays, for the next write-back to send.
    pub fn written_back(&self, lockout: &WriteBack, applied: bool, now_us: u64) -> bool {
        let route = &self.routes[lockout.route];
        let key = lockout.key;
        let cleared = self.clear_degraded_entry(lockout, now_us);
        if !applied {
            // An unlock made since won: a lockout refused here from memory
            // meanwhile (`not_written_back`) goes too, whatever the entry
            // counted since.
            self.forget_known(route, lockout.rule, key);
            return cleared;
        }
        if !cleared {
            return false;
        }
        // An unlock heard since the listing may have run in the store after
        // the merge: taken from the answer, the lockout would undo it here.
        if self.unlocked_since(route, lockout.rule, key, now_us) {
            return true;
        }
        let until = lockout.unlocks_at_us;
        self.remember_lockout(route, lockout.rule, key, until, now_us);
        let _ = self.persist_known_lockout(route, lockout.rule, key, until);
        true
    }

    /// The store did not take a lockout written back (the merge failed):
    /// this host refuses it from memory meanwhile, and it stays on the
    /// degraded table, so the next write-back sends it again.
    pub fn not_written_back(&self, lockout: &WriteBack, now_us: u64) {
        let route = &self.routes[lockout.route];
        let Table::Failures { shards, .. } = &route.rules[lockout.rule].table else { return };
        // Only while it is still the entry listed: an unlock on this host
        // meanwhile cleared it (and failures since began another), and
        // must not be undone here.
        // Nor after an unlock heard from another host since the entry
        // began counting, which clears nothing here: the store would take
        // the unlock over the merge, and so does this host.
        // The unlocks heard are kept a minute: an entry begun longer ago
        // may have lost to one no longer kept, so it is not refused from
        // memory (it stays listed; the shares' bound holds meanwhile).
        let began_us = now_us.saturating_sub(lockout.age_us);
        if !lockout.listed_entry_stands(&shards.of(lockout.key), now_us)
            || lockout.age_us >= RECENT_UNLOCKS_KEEP_US
            || self.unlocked_since(route, lockout.rule, lockout.key, began_us)
        {
            return;
        }
        self.remember_lockout(route, lockout.rule, lockout.key, lockout.unlocks_at_us, now_us);
    }

    /// Clears a written-back lockout's entry on its degraded table
    /// (journaled), unless it changed since it was listed: false then.
    /// Written back or not, failures counted after the listing (the host
    /// still answers from this table until the write-back is done) are
    /// not the merge's, and must not be lost with it.
    fn clear_degraded_entry(&self, lockout: &WriteBack, listed_us: u64) -> bool {
        let rule = &self.routes[lockout.route].rules[lockout.rule];
        let (Some(Full::Failures(_)), Table::Failures { shards, .. }) = (rule.global, &rule.table) else {
            return true;
        };
        let key = lockout.key;
        let mut table = shards.of(key);
        if !lockout.listed_entry_stands(&table, listed_us) || table.get(key, listed_us) != lockout.counts {
            return false;
        }
        if table.clear(key).is_some() {
            self.journal.write(&rule.id, table.spec().window_us, vec![(key, None)]);
        }
        true
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
