//! `ban` and `unban` (admin): the limiter changes the table and queues the
//! row; the reply waits for the row to be on disk (its durable write rides
//! in the answer, as a lockout's does). Every ban, replacement and lift is
//! an audit line with the admin's uid; a network is the operator's words,
//! not a person's identifier, so it is logged as written. Uncapped, as
//! unlocks are: only admins can make them.

use std::net::IpAddr;

use super::{Answer, Daemon, Peer, LOG_TARGET};
use crate::clock::ceil_ms;
use crate::limiter::{BanChange, Limiter};
use crate::protocol::{ErrorCode, Response};

impl Daemon {
    pub(super) fn ban<'l>(
        &self,
        limiter: &'l Limiter,
        (network, prefix_len): (IpAddr, u8),
        for_ms: u64,
        reason: &str,
        peer: &Peer,
        now: u64,
    ) -> Answer<'l> {
        match limiter.ban(network, prefix_len, for_ms, reason, peer.uid, now) {
            Ok(BanChange { ban, replaced, write }) => {
                let until_ms = ceil_ms(ban.until_us);
                tracing::info!(target: LOG_TARGET, network = %ban.network, until_ms, for_ms, reason = %ban.reason,
                    replaced_until_ms = replaced.as_ref().map(|r| ceil_ms(r.until_us)), uid = peer.uid, "ban");
                (Response::Banned { until_ms, replaced: replaced.is_some() }, write.into_iter().collect(), false)
            }
            Err(e) => {
                tracing::info!(target: LOG_TARGET, %network, prefix_len, uid = peer.uid, error = %e, "ban refused");
                (Response::error(ErrorCode::Malformed, e.to_string()), Vec::new(), false)
            }
        }
    }

    pub(super) fn unban<'l>(
        &self,
        limiter: &'l Limiter,
        (network, prefix_len): (IpAddr, u8),
        peer: &Peer,
    ) -> Answer<'l> {
        match limiter.unban(network, prefix_len) {
            Ok(Some((ban, write))) => {
                tracing::info!(target: LOG_TARGET, network = %ban.network, until_ms = ceil_ms(ban.until_us),
                    reason = %ban.reason, uid = peer.uid, "ban lifted");
                (Response::Unlocked { cleared: 1 }, write.into_iter().collect(), false)
            }
            Ok(None) => {
                tracing::info!(target: LOG_TARGET, %network, prefix_len, uid = peer.uid, "unban: no ban on that network");
                (Response::Unlocked { cleared: 0 }, Vec::new(), false)
            }
            Err(e) => (Response::error(ErrorCode::Malformed, e.to_string()), Vec::new(), false),
        }
    }
}
