//! Which store keys are in a burst: a late check on such a key is refused
//! while the store is busy, and a lone late check is answered on the share
//! as before, so a flood on other keys cannot make the busy refusals fall
//! on every user. A key is in a burst when another check of this host
//! waited on it at the same time, or when the store's last word on it
//! (within `busy_max_ms`) showed other attempts in flight there, from any
//! host. A burst's age is how long its keys have been hot without a break
//! (`HotGuard::burst_age_us`): a young one is an attacker's burst, one on a
//! key hot for longer a flood kept up on it.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use smallvec::SmallVec;

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
    /// Since when the key has been hot (waited on or marked) without a
    /// break: the entry's first moment.
    since_us: u64,
    /// Until when a key no check waits on any more is remembered, so a
    /// burst back within `linger_us` (a flood on it, the breaker closed
    /// again) goes on aging rather than starting young.
    linger_until_us: u64,
}

impl Entry {
    fn live(&self, now_us: u64) -> bool {
        self.waiting > 0 || self.crowded_until_us > now_us || self.linger_until_us > now_us
    }
}

#[derive(Default)]
struct Shard {
    entries: HashMap<u64, Entry>,
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
    /// How long a key is remembered once no check waits on it
    /// (`busy_max_ms`).
    linger_us: u64,
}

impl HotKeys {
    pub fn new(linger_us: u64) -> HotKeys {
        HotKeys {
            shards: std::array::from_fn(|_| Mutex::new(Shard::default())),
            hasher: Default::default(),
            seq: AtomicU64::new(1),
            epoch: std::time::Instant::now(),
            linger_us,
        }
    }

    /// Counts a check on `keys` waiting until the guard drops.
    pub fn enter<'h>(&'h self, keys: &[String]) -> HotGuard<'h> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let now = self.now_us();
        let mut company = 0u64;
        let hashes: SmallVec<[u64; 6]> = keys
            .iter()
            .map(|k| {
                let mut h = self.hasher.build_hasher();
                h.write(k.as_bytes());
                h.finish()
            })
            .collect();
        for (i, &h) in hashes.iter().enumerate() {
            let mut shard = self.shard(h);
            let entry = shard.entries.entry(h).or_insert_with(|| Entry { since_us: now, ..Entry::default() });
            if !entry.live(now) {
                *entry = Entry { since_us: now, ..Entry::default() };
            }
            if entry.waiting > 0 {
                company |= key_bit(i);
            }
            entry.waiting += 1;
            entry.newest = entry.newest.max(seq);
        }
        HotGuard { hot: self, hashes, seq, company }
    }

    /// The store said other attempts are in flight on these keys: crowded
    /// for `for_us` from now.
    pub fn mark_crowded(&self, hashes: &[u64], for_us: u64) {
        let now = self.now_us();
        for &h in hashes {
            let mut shard = self.shard(h);
            if !shard.entries.contains_key(&h) && !shard.has_room(now) {
                continue;
            }
            let entry = shard.entries.entry(h).or_insert_with(|| Entry { since_us: now, ..Entry::default() });
            if !entry.live(now) {
                *entry = Entry { since_us: now, ..Entry::default() };
            }
            entry.crowded_until_us = entry.crowded_until_us.max(now + for_us);
        }
    }

    pub(super) fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64 + 1
    }

    fn shard(&self, hash: u64) -> std::sync::MutexGuard<'_, Shard> {
        self.shards[(hash >> 60) as usize % SHARDS].locked()
    }
}

impl Shard {
    /// Whether a key may be remembered past its checks: below
    /// `MARKED_PER_SHARD_MAX`, after sweeping ended entries (at most every
    /// `SWEEP_INTERVAL_US`) if full.
    fn has_room(&mut self, now_us: u64) -> bool {
        if self.entries.len() < MARKED_PER_SHARD_MAX {
            return true;
        }
        if now_us.saturating_sub(self.last_sweep_us) < SWEEP_INTERVAL_US {
            return false;
        }
        self.last_sweep_us = now_us;
        self.entries.retain(|_, e| e.live(now_us));
        self.entries.len() < MARKED_PER_SHARD_MAX
    }
}

/// A check's keys, counted waiting while it lives.
pub struct HotGuard<'h> {
    hot: &'h HotKeys,
    hashes: SmallVec<[u64; 6]>,
    seq: u64,
    /// Which of its keys (`key_bit`) another check waited on when it came.
    company: u64,
}

/// A key's bit in `HotGuard::company`; keys past the 64th share the last.
fn key_bit(i: usize) -> u64 {
    1 << i.min(63)
}

impl HotGuard<'_> {
    /// Whether its keys are in a burst: another check of this host waited
    /// on one of them while it did (before or after it came), or the
    /// store's word marks one crowded now.
    #[cfg(test)]
    pub fn in_burst(&self) -> bool {
        self.burst_age_us().is_some()
    }

    /// How long the burst it is in has lasted (µs), None if in none: of
    /// its keys in a burst, the youngest's time hot without a break. A
    /// flood kept up on a user's account makes its key old, while her
    /// own keys are in no burst, so her late check is not refused for
    /// longer than a young burst lasts (`SharedStore::late_is_busy`).
    pub fn burst_age_us(&self) -> Option<u64> {
        let now = self.hot.now_us();
        let mut youngest: Option<u64> = None;
        for (i, &h) in self.hashes.iter().enumerate() {
            let shard = self.hot.shard(h);
            let Some(e) = shard.entries.get(&h) else { continue };
            if self.company & key_bit(i) != 0 || e.newest > self.seq || e.crowded_until_us > now {
                let age = now.saturating_sub(e.since_us);
                youngest = Some(youngest.map_or(age, |y| y.min(age)));
            }
        }
        youngest
    }

    pub fn hashes(&self) -> &[u64] {
        &self.hashes
    }
}

impl Drop for HotGuard<'_> {
    fn drop(&mut self) {
        let now = self.hot.now_us();
        for &h in &self.hashes {
            let mut shard = self.hot.shard(h);
            let Some(entry) = shard.entries.get_mut(&h) else { continue };
            entry.waiting = entry.waiting.saturating_sub(1);
            if entry.waiting > 0 {
                continue;
            }
            entry.linger_until_us = now + self.hot.linger_us;
            // Past the bound, a key is forgotten with its last check: its
            // next burst starts young.
            if !entry.live(now) || !shard.has_room(now) {
                if let Some(entry) = shard.entries.get_mut(&h) {
                    entry.linger_until_us = 0;
                    if !entry.live(now) {
                        shard.entries.remove(&h);
                    }
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
        let hot = HotKeys::new(0);
        let a = hot.enter(&["k1".into(), "account".into()]);
        assert!(!a.in_burst(), "alone");
        let b = hot.enter(&["k2".into(), "account".into()]);
        assert!(b.in_burst(), "came while a waited on the account key");
        drop(b);
        assert!(a.in_burst(), "b came while a waited, even if b is answered now");
        drop(a);
        let c = hot.enter(&["k3".into()]);
        assert!(!c.in_burst());
        hot.mark_crowded(c.hashes(), 60_000_000);
        assert!(c.in_burst(), "the store's word");
        let ended = hot.enter(&["k4".into()]);
        hot.mark_crowded(ended.hashes(), 0);
        assert!(!ended.in_burst(), "a mark that has ended");
        drop((c, ended));
        assert_eq!(held(&hot), 1, "only the live mark is remembered");
    }

    /// A burst's age is its youngest hot key's time hot without a break:
    /// a key kept hot (a flood on it) grows old, a key hot afresh is young,
    /// and a check's own lone keys are in no burst.
    #[test]
    fn a_bursts_age_is_its_youngest_hot_keys_time_hot() {
        let hot = HotKeys::new(0);
        let flood = hot.enter(&["account".into()]);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let owner = hot.enter(&["account".into(), "owner-prefix".into()]);
        let age = owner.burst_age_us().expect("in the flood's burst");
        assert!(age >= 20_000, "the account key has been hot 20 ms: {age}");
        assert!(flood.burst_age_us().is_some_and(|a| a >= 20_000), "the owner came while it waited");
        let fresh = hot.enter(&["account".into(), "fresh".into()]);
        let _fresh_again = hot.enter(&["fresh".into()]);
        assert!(fresh.burst_age_us().unwrap() < 20_000, "the youngest of its hot keys");
        drop((flood, owner, fresh, _fresh_again));
        assert_eq!(held(&hot), 0);
        let again = hot.enter(&["account".into()]);
        let _other = hot.enter(&["account".into()]);
        assert!(again.burst_age_us().unwrap() < 20_000, "a break ends the burst: a new one is young");
        let lone = hot.enter(&["lone".into()]);
        assert_eq!(lone.burst_age_us(), None, "alone on its keys");
        hot.mark_crowded(lone.hashes(), 60_000_000);
        assert!(lone.burst_age_us().is_some(), "the store's word");
    }

    /// A key back in a burst within the linger (a flood on it, paused
    /// while the breaker was open) goes on aging; after it, starts young.
    #[test]
    fn a_burst_back_within_the_linger_goes_on_aging() {
        let hot = HotKeys::new(30_000);
        let first = hot.enter(&["account".into()]);
        std::thread::sleep(std::time::Duration::from_millis(10));
        drop(first);
        assert_eq!(held(&hot), 1, "remembered for the linger");
        let (a, b) = (hot.enter(&["account".into()]), hot.enter(&["account".into()]));
        assert!(b.burst_age_us().unwrap() >= 10_000, "the burst went on: {:?}", b.burst_age_us());
        drop((a, b));
        std::thread::sleep(std::time::Duration::from_millis(40));
        let (a, b) = (hot.enter(&["account".into()]), hot.enter(&["account".into()]));
        assert!(b.burst_age_us().unwrap() < 10_000, "after the linger, a new burst");
        drop((a, b));
        assert!(!hot.enter(&["account".into()]).in_burst(), "a lingering key is no company");
    }

    /// A flood of distinct keys leaves at most the bound remembered.
    #[test]
    fn lingering_keys_are_bounded() {
        let hot = HotKeys::new(60_000_000);
        for n in 0..100_000 {
            drop(hot.enter(&[format!("key-{n}")]));
        }
        assert!(held(&hot) <= SHARDS * MARKED_PER_SHARD_MAX, "{}", held(&hot));
    }

    #[test]
    fn marks_past_a_shards_bound_are_dropped_and_ended_ones_swept() {
        let hot = HotKeys::new(0);
        let hashes: Vec<u64> = (0..MARKED_PER_SHARD_MAX as u64 + 10).collect(); // all in shard 0
        hot.mark_crowded(&hashes, 0);
        assert_eq!(held(&hot), MARKED_PER_SHARD_MAX, "bounded");
        std::thread::sleep(std::time::Duration::from_micros(2 * SWEEP_INTERVAL_US));
        hot.mark_crowded(&[u64::MAX >> 4], 60_000_000);
        assert_eq!(held(&hot), 1, "the ended marks swept for the new one");
    }
}
