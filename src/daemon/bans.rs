//! `ban` and `unban` (admin): the limiter changes the table and queues the
//! row; the reply waits for the row to be on disk, and says so when the
//! state file did not take it (in force on this host, undone by a
//! restart). Every ban, replacement and lift is an audit line with the
//! admin's uid; a network is the operator's words, not a person's
//! identifier, so it is logged as written. Uncapped, as unlocks are: only
//! admins can make them.

use std::net::IpAddr;

use super::{Answer, Daemon, Peer, LOG_TARGET};
use crate::bans::BanError;
use crate::clock::ceil_ms;
use crate::limiter::{BanChange, Limiter};
use crate::protocol::{ErrorCode, Response};
use crate::store::Durable;

impl Daemon {
    pub(super) async fn ban<'l>(
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
                let stored = written(write).await;
                tracing::info!(target: LOG_TARGET, network = %ban.network, until_ms, for_ms, reason = %ban.reason,
                    replaced_until_ms = replaced.as_ref().map(|r| ceil_ms(r.until_us)), uid = peer.uid,
                    store_error = stored.as_ref().err(), "ban");
                let reply = match stored {
                    Ok(()) => Response::Banned { until_ms, replaced: replaced.is_some() },
                    Err(why) => not_on_disk(&format!("banned {} on this host", ban.network), &why),
                };
                (reply, Vec::new(), false)
            }
            Err(e) => {
                tracing::info!(target: LOG_TARGET, %network, prefix_len, uid = peer.uid, error = %e, "ban refused");
                // A full table is the daemon's state, not the request's fault.
                let code = if matches!(e, BanError::Full) { ErrorCode::Internal } else { ErrorCode::Malformed };
                (Response::error(code, e.to_string()), Vec::new(), false)
            }
        }
    }

    pub(super) async fn unban<'l>(
        &self,
        limiter: &'l Limiter,
        (network, prefix_len): (IpAddr, u8),
        peer: &Peer,
    ) -> Answer<'l> {
        match limiter.unban(network, prefix_len) {
            Ok(Some((ban, write))) => {
                let stored = written(write).await;
                tracing::info!(target: LOG_TARGET, network = %ban.network, until_ms = ceil_ms(ban.until_us),
                    reason = %ban.reason, uid = peer.uid, store_error = stored.as_ref().err(), "ban lifted");
                let reply = match stored {
                    Ok(()) => Response::Unlocked { cleared: 1 },
                    Err(why) => not_on_disk(&format!("lifted the ban on {} on this host", ban.network), &why),
                };
                (reply, Vec::new(), false)
            }
            Ok(None) => {
                tracing::info!(target: LOG_TARGET, %network, prefix_len, uid = peer.uid, "unban: no ban on that network");
                (Response::Unlocked { cleared: 0 }, Vec::new(), false)
            }
            Err(e) => (Response::error(ErrorCode::Malformed, e.to_string()), Vec::new(), false),
        }
    }
}

/// Waits for a row's write (none: a journal that persists nothing).
async fn written(write: Option<Durable>) -> Result<(), String> {
    match write {
        Some(write) => write.wait().await.map_err(|e| e.to_string()),
        None => Ok(()),
    }
}

/// The reply when memory changed but the state file did not take it: the
/// change holds until a restart, which the operator must know.
fn not_on_disk(done: &str, why: &str) -> Response<'static> {
    Response::error(
        ErrorCode::Internal,
        format!(
            "{done}, but the state file did not take it ({why}): a restart would undo it; \
             repeat it once `status` shows the state file healthy"
        ),
    )
}
