//! The limiter's side of manual bans (`crate::bans`): a banned check's
//! verdict, the admin's ban and unban with their durable rows, and the
//! bans among the lockouts, in the rewrite, the sweep and the restore.

use std::borrow::Cow;
use std::net::IpAddr;

use super::Limiter;
use crate::bans::{self, Ban, BanError};
use crate::clock::ceil_ms;
use crate::protocol::{Decision, Lockout, Reason, Verdict};
use crate::store::{Durable, Journal};

/// What a ban or an unban did, for the reply and the audit line.
pub struct BanChange {
    pub ban: Ban,
    /// The ban on the same network it replaced (a ban), or none.
    pub replaced: Option<Ban>,
    /// Resolves once the row is on disk; the reply waits for it.
    pub write: Option<Durable>,
}

impl Limiter {
    /// A check from a banned network: denied until the ban ends, spending
    /// nothing on any rule (a ban is no reason to lock the accounts the
    /// banned network tries).
    pub(super) fn banned_verdict(until_us: u64, now_us: u64) -> Verdict<'static> {
        let retry_after_ms = ceil_ms(until_us.saturating_sub(now_us));
        Verdict {
            decision: Decision::Deny,
            retry_after_ms,
            delay_ms: 0,
            limit: 0,
            remaining: 0,
            reset_ms: retry_after_ms,
            reason: Reason::Banned,
            rule: Cow::Borrowed(bans::LISTED_RULE),
        }
    }

    /// Bans `network`/`prefix_len` for `for_ms` from `now_us` (admin),
    /// replacing a ban on the same network; the row is queued durably.
    pub fn ban(
        &self,
        network: IpAddr,
        prefix_len: u8,
        for_ms: u64,
        reason: &str,
        uid: u32,
        now_us: u64,
    ) -> Result<BanChange, BanError> {
        let network = bans::network(network, prefix_len)?;
        bans::check_terms(for_ms, reason)?;
        // A request that would cut off every client whose header is missing
        // or malformed (they are keyed on their proxy) is refused, as an
        // exemption overlapping a proxy is.
        if let Some(proxy) = self.source.trusted_proxies.iter().find(|p| p.contains(&network) || network.contains(*p)) {
            return Err(BanError::Network(format!(
                "{network} overlaps source.trusted_proxies' {proxy}: a request with a missing or malformed \
                 X-Forwarded-For is keyed on its proxy, so the ban would refuse every such client"
            )));
        }
        let until_us = now_us.saturating_add(for_ms.saturating_mul(1000));
        let ban = Ban { network, until_us, since_us: now_us, uid, reason: reason.trim().to_string() };
        let (replaced, write) = self.bans.insert(ban.clone(), now_us, &self.journal)?;
        Ok(BanChange { ban, replaced, write })
    }

    /// Lifts the ban on exactly `network`/`prefix_len` (admin): the ban
    /// lifted, if there was one, and its row's deletion queued durably.
    pub fn unban(&self, network: IpAddr, prefix_len: u8) -> Result<Option<(Ban, Option<Durable>)>, BanError> {
        let network = bans::network(network, prefix_len)?;
        Ok(self.bans.remove(network, &self.journal))
    }

    /// The bans in force, as `lockouts` lists them (before any rule's).
    pub(super) fn listed_bans(&self, now_us: u64) -> Vec<Lockout> {
        let listed = |ban: Ban| Lockout {
            route: bans::LISTED_ROUTE.to_string(),
            rule: match ban.reason.as_str() {
                "" => bans::LISTED_RULE.to_string(),
                reason => format!("{}: {reason}", bans::LISTED_RULE),
            },
            key: ban.network.to_string(),
            count: 0,
            until_ms: ceil_ms(ban.until_us),
            retry_after_ms: ceil_ms(ban.until_us - now_us),
        };
        self.bans.in_force(now_us).into_iter().map(listed).collect()
    }

    /// Bans held (ended ones not yet swept included), for `status`.
    pub fn bans_held(&self) -> usize {
        self.bans.held()
    }

    /// Every ban in force to a rewrite of the state file.
    pub(super) fn rewrite_bans(&self, now_us: u64) {
        self.bans.write_all(now_us, &self.journal);
    }

    /// Forgets ended bans and deletes their rows.
    pub(super) fn sweep_bans(&self, now_us: u64) {
        self.bans.sweep(now_us, &self.journal);
    }

    /// Puts persisted bans back at start: those still in force whose
    /// network and length a ban request could have made (a crafted row
    /// cannot ban the Internet or for a century). Returns how many.
    pub fn restore_bans(&self, rows: Vec<Ban>, now_us: u64) -> usize {
        let mut restored = 0;
        for ban in rows {
            // Judged by its own times, never by `now`: a host that boots
            // with its clock behind must not forget a ban.
            let plausible = bans::network(ban.network.addr(), ban.network.prefix_len()).is_ok()
                && ban.since_us <= ban.until_us
                && ban.until_us - ban.since_us <= bans::BAN_FOR_MS_MAX * 1000
                && bans::check_terms(1, &ban.reason).is_ok();
            if !plausible {
                tracing::warn!(target: "tollgate::store", network = %ban.network, "a ban row no ban request could make; dropped");
            }
            if ban.until_us <= now_us || !plausible {
                self.journal.remove_ban(ban.network, false);
                continue;
            }
            // Made while the clock was far ahead: in force at most as long
            // as a ban made now could be (the row keeps its own end; the
            // next ban or rewrite writes the shorter one).
            let longest = now_us.saturating_add(bans::BAN_FOR_MS_MAX * 1000);
            if ban.until_us > longest {
                tracing::warn!(target: "tollgate::store", network = %ban.network, "a ban ending more than a year from now; shortened to a year");
            }
            let ban = Ban { until_us: ban.until_us.min(longest), ..ban };
            // Restored rows are in the file already: nothing to write.
            if self.bans.insert(ban, now_us, &Journal::discard()).is_ok() {
                restored += 1;
            }
        }
        restored
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::classes::ClassTable;
    use crate::config::Config;
    use crate::keys::{KeyDeriver, Secret, SECRET_BYTES};
    use crate::protocol::Subject;
    use crate::store::Journal;

    const CONFIG: &str = "[routes.t.rules.per_account]\nkind = \"failures\"\nkey = [\"account\"]\nthreshold = 3\n\
                          window_secs = 60\n";
    const HOUR_US: u64 = 3_600_000_000;

    fn limiter() -> Limiter {
        let config = Config::build(Config::parse(CONFIG).unwrap()).unwrap();
        let keys = KeyDeriver::new(&Secret::from_bytes([7; SECRET_BYTES]));
        Limiter::new(&config, Arc::new(ClassTable::default()), keys, Journal::discard())
    }

    fn from(peer: &str) -> Subject<'static> {
        Subject { peer: Some(peer.parse().unwrap()), account: Some("alice"), ..Subject::default() }
    }

    #[test]
    fn a_banned_check_spends_nothing_and_a_reload_keeps_the_ban() {
        let limiter = limiter();
        limiter.ban("203.0.113.0".parse().unwrap(), 24, 3_600_000, "stuffing", 0, 0).unwrap();
        for _ in 0..10 {
            let verdict = limiter.check("t", &from("203.0.113.9"), 1).unwrap();
            assert_eq!((verdict.decision, verdict.reason), (Decision::Deny, Reason::Banned));
        }
        let config = Config::build(Config::parse(CONFIG).unwrap()).unwrap();
        let reloaded = limiter.reconfigured(&config, Arc::new(ClassTable::default()), 2);
        assert_eq!(reloaded.check("t", &from("203.0.113.9"), 3).unwrap().reason, Reason::Banned);
        reloaded.unban("203.0.113.0".parse().unwrap(), 24).unwrap().expect("it was banned");
        // Ten banned checks took no place on alice's failure rule.
        assert_eq!(reloaded.check("t", &from("203.0.113.9"), 4).unwrap().remaining, 2);
    }

    #[test]
    fn a_rewrite_of_the_state_file_from_memory_keeps_the_bans() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let store = crate::store::Store::open(&path, false).unwrap();
        let (journal, writer) = store.start_writer(Arc::default());
        let config = Config::build(Config::parse(CONFIG).unwrap()).unwrap();
        let keys = KeyDeriver::new(&Secret::from_bytes([7; SECRET_BYTES]));
        let limiter = Limiter::new(&config, Arc::new(ClassTable::default()), keys, journal);
        let change = limiter.ban("2001:db8::".parse().unwrap(), 48, 3_600_000, "", 0, 0).unwrap();
        change.write.unwrap().wait_blocking().unwrap();
        limiter.rewrite(1).wait_blocking().unwrap();
        writer.stop();
        let loaded = crate::store::Store::open(&path, false).unwrap().load_all().unwrap();
        assert_eq!(loaded.bans, vec![change.ban]);
    }

    #[test]
    fn restoring_drops_ended_rows_and_rows_no_ban_request_could_make() {
        let limiter = limiter();
        let row = |network: &str, until_us: u64, reason: &str| Ban {
            network: network.parse().unwrap(),
            until_us,
            since_us: 0,
            uid: 0,
            reason: reason.into(),
        };
        let now = 10 * HOUR_US;
        let rows = vec![
            row("203.0.113.0/24", now + HOUR_US, "kept"),
            Ban {
                since_us: now + 3000 * 24 * HOUR_US,
                ..row("198.51.100.128/25", now + 3001 * 24 * HOUR_US, "far ahead")
            },
            row("198.51.100.0/24", now, "ended"),
            row("0.0.0.0/0", now + HOUR_US, "the Internet"),
            row("192.0.2.7/24", now + HOUR_US, "host bits"),
            row("192.0.2.0/25", now + 400 * 24 * HOUR_US, "longer than a year"),
            Ban { since_us: now + 2 * HOUR_US, ..row("192.0.2.0/26", now + HOUR_US, "ends before it began") },
            // Made while the clock read 300 days later: a clock behind at
            // the restart must not drop it.
            Ban { since_us: now + 300 * 24 * HOUR_US, ..row("192.0.2.64/26", now + 301 * 24 * HOUR_US, "clock ahead") },
            row("192.0.2.128/25", now + HOUR_US, "a\ncontrol character"),
        ];
        assert_eq!(limiter.restore_bans(rows, now), 3);
        let kept: Vec<(String, u64)> =
            limiter.bans.in_force(now).into_iter().map(|b| (b.reason, b.until_us - now)).collect();
        let year = bans::BAN_FOR_MS_MAX * 1000;
        let kept: Vec<(&str, u64)> = kept.iter().map(|(r, left)| (r.as_str(), *left)).collect();
        assert_eq!(kept, [("far ahead", year), ("clock ahead", 301 * 24 * HOUR_US), ("kept", HOUR_US)]);
        assert_eq!(limiter.check("t", &from("1.2.3.4"), now).unwrap().decision, Decision::Allow);
    }
}
