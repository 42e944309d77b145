//! The shared store's names: each rule's entries, a device, an account's
//! index, the channel and the unlock log, all under `[shared] key_prefix`;
//! and an operator's unlock as store ops (forgetting the keys it names
//! as known lockouts here). What a check's or report's ops do is in
//! `global.rs` and the store's script.

use super::maintenance::unlocks_one_entry;
use super::route::{Full, Route, Rule};
use super::shards::SHARDS;
use super::{Limiter, RequestError};
use crate::keys::{Component, Key};
use crate::protocol::Subject;
use crate::shared::script::{Op, ReportRule};

/// A device this host knows, of the route at `route` in the limiter that
/// listed it (`Limiter::lessons`), known here until `until_us`.
pub struct Lesson {
    route: usize,
    device: Key,
    until_us: u64,
}

impl Limiter {
    /// How this limiter's keys (and so its store names) are derived: its
    /// state file's derivation.
    pub fn key_derivation(&self) -> crate::keys::Derivation {
        self.keys.derivation()
    }

    /// Whether this limiter sends global rules to a shared store.
    pub fn is_shared(&self) -> bool {
        self.shared_prefix.is_some()
    }

    /// The store's name for a rule's entry: every key of one decision
    /// shares the hash tag (the account's tag when the rule's key has the
    /// account, so a login's rules live on one Cluster node).
    pub(super) fn store_key(&self, rule: &Rule, key: Key) -> String {
        let tag = if rule.key.contains(&Component::Account) { key.account_tag } else { key.tuple };
        let kind = if matches!(rule.global, Some(Full::Rate { .. })) { "r" } else { "f" };
        store_name(self.prefix(), tag, kind, &rule.id, Some(key.to_u128()))
    }

    pub(super) fn prefix(&self) -> &str {
        self.shared_prefix.as_deref().unwrap_or("tg")
    }

    /// The store's name for a device an account logged in from: any host's
    /// success makes it known to all.
    pub(super) fn device_key(&self, route: &Route, device: Key) -> String {
        store_name(self.prefix(), device.account_tag, "d", &route.name, Some(device.to_u128()))
    }

    /// What a success tells the store of its device (`ReportRule::Remember`):
    /// known to every host for `ttl_us`, while the account is under its cap
    /// of new devices.
    pub(super) fn remember_device(&self, route: &Route, device: Key, ttl_us: u64) -> Option<ReportRule> {
        let known = route.known_devices.as_ref()?;
        Some(ReportRule::Remember {
            key: self.device_key(route, device),
            count_key: store_name(self.prefix(), device.account_tag, "dn", &route.name, None),
            ttl_us,
            per_account_max: known.per_account_max,
        })
    }

    /// The op that teaches a store that lost its data a device this host
    /// knows, for what is left of its time here.
    pub(super) fn teach_device(&self, route: &Route, device: Key, now_us: u64) -> Option<Op> {
        let until_us = route.known_devices.as_ref()?.shards.of(device).get(device.tuple, now_us)?.expires_us;
        self.teach_op(route, device, until_us, now_us)
    }

    fn teach_op(&self, route: &Route, device: Key, until_us: u64, now_us: u64) -> Option<Op> {
        let ttl_us = until_us.checked_sub(now_us).filter(|&t| t > 0)?;
        Some(Op::report([self.remember_device(route, device, ttl_us)?]))
    }

    /// The devices this host knows in shard `shard` of every route's
    /// table, with their accounts (`None` past the last shard): what it
    /// teaches a store seen to lose its data, shard by shard, so that no
    /// host refuses her device until her check reaches this one. Those
    /// put back from the state file, whose account is not kept, are
    /// taught at her next check here (`teach_device`).
    pub fn lessons(&self, shard: usize, now_us: u64) -> Option<Vec<Lesson>> {
        if shard >= SHARDS {
            return None;
        }
        let mut lessons = Vec::new();
        for (index, route) in self.routes.iter().enumerate() {
            let Some(known) = &route.known_devices else { continue };
            let table = known.shards.at(shard);
            lessons.extend(table.iter_live(now_us).filter(|(_, slot)| slot.value != 0).map(|(tuple, slot)| Lesson {
                route: index,
                device: Key { account_tag: slot.value, tuple },
                until_us: slot.expires_us,
            }));
        }
        Some(lessons)
    }

    /// The op teaching `lesson` for what is left of its time (none once it
    /// is over): the `Remember` a success sends, which never shortens what
    /// the store holds.
    pub fn lesson_op(&self, lesson: &Lesson, now_us: u64) -> Option<Op> {
        self.teach_op(self.routes.get(lesson.route)?, lesson.device, lesson.until_us, now_us)
    }

    /// An account's index of a rule's entries, for a rule keyed on the
    /// account and something else: what an unlock of the account reads.
    pub(super) fn index_key(&self, rule: &Rule, account_tag: u64) -> Option<String> {
        if !rule.key.contains(&Component::Account) || rule.key.len() < 2 {
            return None;
        }
        Some(store_name(self.prefix(), account_tag, "i", &rule.id, None))
    }

    /// The channel unlocks and lockouts are published on.
    pub fn shared_channel(&self) -> String {
        format!("{}:events", self.shared_prefix.as_deref().unwrap_or("tg"))
    }

    /// The store key logging recent unlock messages, replayed by a host
    /// when it subscribes (`SharedStore::log_unlocks`).
    pub fn shared_unlock_log(&self) -> String {
        format!("{}:{{unlocks}}", self.shared_prefix.as_deref().unwrap_or("tg"))
    }

    /// How long a logged unlock can matter: the longest a known lockout
    /// is held (two windows of the longest global failure rule).
    pub fn unlock_log_keep_us(&self) -> u64 {
        let longest = self
            .routes
            .iter()
            .flat_map(|r| r.rules.iter())
            .filter_map(|rule| match rule.global {
                Some(Full::Failures(spec)) => Some(spec.window_us),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        longest.saturating_mul(2).max(60_000_000)
    }

    /// The store ops of an operator's unlock (what `unlock` does on this
    /// host's tables, for the global rules): one entry with a source or on
    /// an account-wide rule; every entry of the account (by its index)
    /// without a source. This host forgets the keys as known lockouts.
    pub fn unlock_ops(
        &self,
        route: &str,
        account: &str,
        source: Option<std::net::IpAddr>,
        now_us: u64,
    ) -> Result<Vec<Op>, RequestError> {
        let route = self.route(route)?;
        let subject = Subject { peer: source, account: Some(account), ..Subject::default() };
        let mut keys = self.subject_keys(&route.name, &subject);
        let tag = self.keys.account_tag(account);
        let channel = self.shared_channel();
        let mut ops = Vec::new();
        for rule in &route.rules {
            let Some(Full::Failures(spec)) = rule.global else { continue };
            if !rule.key.contains(&Component::Account) {
                continue;
            }
            if unlocks_one_entry(rule, source) {
                let key = keys.key(&rule.key)?;
                if let Some(known) = &route.known_lockouts {
                    let mut known = known.of(key);
                    if known.get(key.tuple, now_us).is_some_and(|s| s.value.rule == rule.tag) {
                        known.remove(key.tuple);
                    }
                }
                ops.push(Op::unlock(self.store_key(rule, key), spec.window_us, false, &channel));
            } else if let (None, Some(index)) = (source, self.index_key(rule, tag)) {
                ops.push(Op::unlock(index, spec.window_us, true, &channel));
            }
        }
        Ok(ops)
    }
}

/// A store key: `{prefix}:{{tag:016x}}:{kind}:{name}` and, for an entry,
/// `:{digest:032x}`. Every request names two to five of them; `format!`'s
/// padded hex was a tenth of the daemon's time in shared mode.
pub(super) fn store_name(prefix: &str, tag: u64, kind: &str, name: &str, digest: Option<u128>) -> String {
    // A byte's two digits looked up at once, into a buffer pushed at once:
    // a `char` pushed at a time was most of what naming a key cost, and a
    // digit looked up at a time still half of it.
    const PAIRS: [[u8; 2]; 256] = {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut pairs = [[0u8; 2]; 256];
        let mut byte = 0;
        while byte < 256 {
            pairs[byte] = [DIGITS[byte >> 4], DIGITS[byte & 0xf]];
            byte += 1;
        }
        pairs
    };
    fn hex(out: &mut String, v: u128, digits: usize) {
        let mut buf = [[0u8; 2]; 16];
        for (pair, byte) in buf.iter_mut().zip(v.to_be_bytes()) {
            *pair = PAIRS[usize::from(byte)];
        }
        out.push_str(std::str::from_utf8(&buf.as_flattened()[32 - digits..]).expect("hex digits are ASCII"));
    }
    let mut out = String::with_capacity(prefix.len() + kind.len() + name.len() + 56);
    out.push_str(prefix);
    out.push_str(":{");
    hex(&mut out, u128::from(tag), 16);
    out.push_str("}:");
    out.push_str(kind);
    out.push(':');
    out.push_str(name);
    if let Some(digest) = digest {
        out.push(':');
        hex(&mut out, digest, 32);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::store_name;

    /// The names are the store's data: a host that named a key otherwise
    /// would not share it. The same bytes `format!` made before.
    #[test]
    fn store_names_are_the_padded_hex_names_format_made() {
        for (tag, digest) in [(0u64, 0u128), (0xdead_beef, 0xabc), (u64::MAX, u128::MAX), (1 << 60, 1 << 100)] {
            assert_eq!(
                store_name("tg", tag, "f", "login/source_failures", Some(digest)),
                format!("tg:{{{tag:016x}}}:f:login/source_failures:{digest:032x}")
            );
            assert_eq!(store_name("acme", tag, "i", "login/x", None), format!("acme:{{{tag:016x}}}:i:login/x"));
        }
        // Every byte value in every place of both fields.
        for byte in 0..=255u128 {
            for shift in (0..128).step_by(8) {
                let (tag, digest) = ((byte << shift) as u64, byte << shift);
                assert_eq!(
                    store_name("tg", tag, "f", "r", Some(digest)),
                    format!("tg:{{{tag:016x}}}:f:r:{digest:032x}")
                );
            }
        }
    }
}
