//! Which store keys are in a burst: a late check on such a key is refused
//! while the store is busy, and a lone late check is answered on the share
//! as before, so a flood on other keys cannot make the busy refusals fall
//! on every user. A key is in a burst when another check of this host
//! waited on it at the same time, or when the store's last word on it
//! (within `busy_max_ms`) showed other attempts in flight there, from any
//! host. How long one requester may be refused so: `busy_runs`.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use smallvec::SmallVec;

use crate::expiring::DigestBuildHasher;
use crate::unpoisoned::Unpoisoned;

/// Shards of the map, so checks on different keys rarely meet on a lock.
const SHARDS: usize = 16;
/// Keys one shard holds at most for marks: past it, a new mark is dropped
/// (the key is then judged by this host's checks alone).
const MARKED_PER_SHARD_MAX: usize = 4096;
/// A full shard is swept of ended marks at most this often, so a flood of
/// marks cannot make every reply scan a full shard under its lock.
const SWEEP_INTERVAL_US: u64 = 10_000;

#[derive(Default)]
struct Entry {
    /// Checks of this host waiting on the key.
    waiting: u32,
    /// The newest of them (`HotKeys::seq`).
    newest: u64,
    /// Until when the store's word marks it crowded (µs), 0 not.
    crowded_until_us: u64,
}

#[derive(Default)]
struct Shard {
    /// Keyed by the key's hash (`HotKeys::hasher`, drawn at start), used
    /// as it is: hashing it again cost every check ten SipHash rounds.
    entries: HashMap<u64, Entry, DigestBuildHasher>,
    last_sweep_us: u64,
}

/// Per store key (a 64-bit hash of its name): this host's checks waiting
/// on it and the store's last word. Bounded: an entry lives while a check
/// waits on it or, for at most `MARKED_PER_SHARD_MAX` a shard, while its
/// mark lasts.
pub struct HotKeys {
    shards: [Mutex<Shard>; SHARDS],
    hasher: std::collections::hash_map::RandomState,
    seq: AtomicU64,
    epoch: std::time::Instant,
}

impl Default for HotKeys {
    fn default() -> HotKeys {
        HotKeys {
            shards: std::array::from_fn(|_| Mutex::new(Shard::default())),
            hasher: Default::default(),
            seq: AtomicU64::new(1),
            epoch: std::time::Instant::now(),
        }
    }
}

impl HotKeys {
    /// Counts a check on `keys` waiting until the guard drops; those of
    /// `chosen_keys` (a bit each, by index) name what the requester
    /// chooses (`Op::chosen_keys`).
    pub fn enter<'h>(&'h self, keys: &[String], chosen_keys: u64) -> HotGuard<'h> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut hashes: SmallVec<[u64; 6]> = keys
            .iter()
            .map(|k| {
                let mut h = self.hasher.build_hasher();
                h.write(k.as_bytes());
                h.finish()
            })
            .collect();
        // Its requester, waited on like a key of its own (last): its keys
        // but those naming what it chooses (a cookie, a client id), or all
        // of them if they all do (`reauth`: its limit is per account and
        // device, and so is its requester).
        let chosen = |i: usize| chosen_keys & (1 << i.min(63)) != 0;
        let all_chosen = (0..hashes.len()).all(chosen);
        let mut requester = self.hasher.build_hasher();
        requester.write_u8(b'r');
        for (i, &h) in hashes.iter().enumerate() {
            if all_chosen || !chosen(i) {
                requester.write_u64(h);
            }
        }
        hashes.push(requester.finish());
        let (mut company, mut own) = (false, false);
        let last = hashes.len() - 1;
        for (i, &h) in hashes.iter().enumerate() {
            let mut shard = self.shard(h);
            let entry = shard.entries.entry(h).or_default();
            if entry.waiting > 0 {
                *(if i == last { &mut own } else { &mut company }) = true;
            }
            entry.waiting += 1;
            entry.newest = entry.newest.max(seq);
        }
        HotGuard { hot: self, hashes, seq, company, own }
    }

    /// The store said other attempts are in flight on these keys: crowded
    /// for `for_us` from now.
    pub fn mark_crowded(&self, hashes: &[u64], for_us: u64) {
        let now = self.now_us();
        for &h in hashes {
            let mut shard = self.shard(h);
            // A key already held (a check waits on it) is marked whatever
            // the bound.
            if !shard.entries.contains_key(&h) && shard.entries.len() >= MARKED_PER_SHARD_MAX {
                if now.saturating_sub(shard.last_sweep_us) < SWEEP_INTERVAL_US {
                    continue;
                }
                shard.last_sweep_us = now;
                shard.entries.retain(|_, e| e.waiting > 0 || e.crowded_until_us > now);
                if shard.entries.len() >= MARKED_PER_SHARD_MAX {
                    continue;
                }
            }
            let entry = shard.entries.entry(h).or_default();
            entry.crowded_until_us = entry.crowded_until_us.max(now + for_us);
        }
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64 + 1
    }

    /// A shard by bits its map uses for neither the bucket (the low bits)
    /// nor the tag (the top seven): by the top bits, a shard's keys would
    /// share most of their tag, and each lookup compare more of them.
    fn shard(&self, hash: u64) -> std::sync::MutexGuard<'_, Shard> {
        self.shards[(hash >> 32) as usize % SHARDS].locked()
    }
}

/// A late check's burst (`SharedStore::lateness`).
#[derive(Clone, Copy, Debug)]
pub struct Burst {
    pub requester: u64,
    /// Its requester's own (`HotGuard::own_burst`).
    pub own: bool,
}

/// A check's keys, counted waiting while it lives.
pub struct HotGuard<'h> {
    hot: &'h HotKeys,
    hashes: SmallVec<[u64; 6]>,
    seq: u64,
    /// Another check waited on one of its keys when it came.
    company: bool,
    /// Another check of its requester waited when it came.
    own: bool,
}

impl HotGuard<'_> {
    /// Whether its keys are in a burst: another check of this host waited
    /// on one of them while it did (before or after it came), or the
    /// store's word marks one crowded now.
    fn in_burst(&self) -> bool {
        let now = self.hot.now_us();
        self.company
            || self.own
            || self.hashes().iter().any(|&h| {
                let shard = self.hot.shard(h);
                shard.entries.get(&h).is_some_and(|e| e.newest > self.seq || e.crowded_until_us > now)
            })
    }

    /// The burst it is in, if any.
    pub fn burst(&self) -> Option<Burst> {
        self.in_burst().then(|| Burst { requester: self.requester(), own: self.own_burst() })
    }

    /// Whether the burst is its requester's own: another check with the
    /// same keys (a device's aside) waited while it did. A user makes one
    /// attempt at a time; parallel ones on one account and address are a
    /// guesser's, held by the store however long he keeps them up.
    pub fn own_burst(&self) -> bool {
        let requester = self.requester();
        self.own || self.hot.shard(requester).entries.get(&requester).is_some_and(|e| e.newest > self.seq)
    }

    /// Its keys' hashes (without the requester's).
    pub fn hashes(&self) -> &[u64] {
        &self.hashes[..self.hashes.len() - 1]
    }

    /// Its requester: its keys but a device's (account, address), one
    /// hash (`BusyRuns`).
    pub fn requester(&self) -> u64 {
        self.hashes[self.hashes.len() - 1]
    }
}

impl Drop for HotGuard<'_> {
    fn drop(&mut self) {
        let now = self.hot.now_us();
        for &h in &self.hashes {
            let mut shard = self.hot.shard(h);
            if let Some(entry) = shard.entries.get_mut(&h) {
                entry.waiting = entry.waiting.saturating_sub(1);
                if entry.waiting == 0 && entry.crowded_until_us <= now {
                    shard.entries.remove(&h);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(hot: &HotKeys) -> usize {
        hot.shards.iter().map(|s| s.lock().unwrap().entries.len()).sum()
    }

    #[test]
    fn a_key_is_in_a_burst_when_checks_overlap_on_it_or_the_store_says_so() {
        let hot = HotKeys::default();
        let a = hot.enter(&["k1".into(), "account".into()], 0);
        assert!(!a.in_burst(), "alone");
        let b = hot.enter(&["k2".into(), "account".into()], 0);
        assert!(b.in_burst(), "came while a waited on the account key");
        drop(b);
        assert!(a.in_burst(), "b came while a waited, even if b is answered now");
        drop(a);
        let c = hot.enter(&["k3".into()], 0);
        assert!(!c.in_burst());
        hot.mark_crowded(c.hashes(), 60_000_000);
        assert!(c.in_burst(), "the store's word");
        let ended = hot.enter(&["k4".into()], 0);
        hot.mark_crowded(ended.hashes(), 0);
        assert!(!ended.in_burst(), "a mark that has ended");
        drop((c, ended));
        assert_eq!(held(&hot), 1, "only the live mark is remembered");
    }

    #[test]
    fn a_requester_is_its_keys_but_a_devices_and_its_own_burst_is_its_own_checks() {
        let hot = HotKeys::default();
        let keys = |k: &[&str]| k.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        let a = hot.enter(&keys(&["account", "address"]), 0);
        let other = hot.enter(&keys(&["account", "elsewhere"]), 0);
        assert!(a.in_burst() && !a.own_burst(), "her account from elsewhere: a burst, not hers");
        assert_ne!(a.requester(), other.requester());
        let device = hot.enter(&keys(&["cookie", "account", "address", "account+cookie"]), 0b1001);
        assert_eq!(a.requester(), device.requester(), "a device's keys are no part of it");
        assert!(device.own_burst(), "came while a waited");
        assert!(a.own_burst(), "device came while a waited");
        drop((a, other, device));
        let erin = hot.enter(&keys(&["erin+cookie"]), 0b1);
        let frank = hot.enter(&keys(&["frank+cookie"]), 0b1);
        assert!(!erin.own_burst() && !frank.own_burst(), "keys all chosen: the requester is all of them");
        assert_ne!(erin.requester(), frank.requester());
        drop((erin, frank));
        assert_eq!(held(&hot), 0);
    }

    #[test]
    fn marks_past_a_shards_bound_are_dropped_and_ended_ones_swept() {
        let hot = HotKeys::default();
        let hashes: Vec<u64> = (0..MARKED_PER_SHARD_MAX as u64 + 10).collect(); // all in shard 0
        hot.mark_crowded(&hashes, 0);
        assert_eq!(held(&hot), MARKED_PER_SHARD_MAX, "bounded");
        std::thread::sleep(std::time::Duration::from_micros(2 * SWEEP_INTERVAL_US));
        hot.mark_crowded(&[1 << 40], 60_000_000); // shard 0 too
        assert_eq!(held(&hot), 1, "the ended marks swept for the new one");
    }
}
