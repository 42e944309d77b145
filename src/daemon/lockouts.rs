//! `lockouts`: the operator's list, made off the request path and within a
//! memory budget, since anyone who can connect may ask for it.

use std::sync::Arc;

use tokio::sync::SemaphorePermit;

use super::Daemon;
use crate::codec;
use crate::limiter::Limiter;
use crate::protocol::Response;

/// Lockouts returned by one `lockouts` request when the client names no limit.
pub const LOCKOUTS_LISTED_DEFAULT: u32 = 100;
/// Most lockouts one reply lists, so a reply stays well inside a frame.
pub const LOCKOUTS_LISTED_MAX: u32 = 10_000;
/// What one listed lockout costs while its reply is made and sent, counted
/// generously: the `Lockout` (96 bytes), its three strings' allocations
/// (about 110), its encoding (about 90), the copy of its key and counts
/// taken under the shard lock (28), and the slack of vectors that grew by
/// doubling. Measured: 300 clients each taking a 10,000-entry reply (four
/// made or sent at a time) raised the daemon's peak resident memory by
/// 18 MB, 6 of them the connections' own: about 3 MB a reply.
pub const LOCKOUT_REPLY_BYTES_ESTIMATE: usize = 400;
/// Bytes all connections' `lockouts` replies may hold at once, counted at
/// `LOCKOUT_REPLY_BYTES_ESTIMATE` a listed entry: four 10,000-entry
/// replies. `lockouts` is open to anyone who can connect; without this, a
/// thousand clients each asking for 10,000 entries at once would make the
/// daemon hold a gigabyte (and the allocator keeps much of what a peak
/// took: this is also about what the daemon's resident size can grow by).
/// A request over the budget waits for a share of it (checks and reports
/// never do).
pub const LOCKOUTS_REPLY_BYTES_MAX: usize = 16 * 1024 * 1024;
/// `lockouts` replies made at once, each on a blocking thread. One: making
/// a 10,000-entry reply keeps a core busy for milliseconds, and with more
/// at once a two-core host has no core left for the runtime threads that
/// answer checks: with three clients pipelining such requests, another
/// client's check p99 was 2.5 ms with three made at once and 0.2 to 1.5 ms
/// with one (p50 11 to 21 µs either way; 2 cores). `lockouts` is an
/// operator's view, not the request path: it may queue.
pub const LOCKOUTS_MADE_CONCURRENTLY_MAX: usize = 1;
const _: () = assert!(LOCKOUTS_LISTED_MAX as usize * LOCKOUT_REPLY_BYTES_ESTIMATE <= LOCKOUTS_REPLY_BYTES_MAX);
const _: () = assert!(LOCKOUTS_REPLY_BYTES_MAX <= u32::MAX as usize, "semaphore permits are u32");

/// The lockouts a `lockouts` request with `limit` lists at most.
pub(crate) fn lockouts_listed(limit: u32) -> usize {
    (if limit == 0 { LOCKOUTS_LISTED_DEFAULT } else { limit.min(LOCKOUTS_LISTED_MAX) }) as usize
}

pub(crate) fn lockouts_reply(limiter: &Limiter, listed: usize, now: u64) -> Response<'static> {
    let (lockouts, total) = limiter.lockouts(listed, now);
    Response::Lockouts { lockouts, total }
}

/// Makes a `lockouts` reply: waits for its share of
/// `LOCKOUTS_REPLY_BYTES_MAX` and its turn to be made, then makes and
/// encodes it on a blocking thread (a 10,000-entry reply takes
/// milliseconds; on a runtime thread it would hold up every check waiting
/// for that thread). Returns the encoded reply and the share, both to be
/// dropped once written; `None`: close the connection.
pub(crate) async fn make_lockouts_reply<'d>(
    daemon: &'d Daemon,
    limiter: &Arc<Limiter>,
    version: u8,
    id: u64,
    limit: u32,
    now: u64,
) -> Option<(Vec<u8>, SemaphorePermit<'d>)> {
    let listed = lockouts_listed(limit);
    let share = (listed * LOCKOUT_REPLY_BYTES_ESTIMATE) as u32;
    let share = daemon.lockouts_reply_bytes.acquire_many(share).await.expect("the budget is never closed");
    let maker = daemon.lockouts_makers.acquire().await.expect("the makers' semaphore is never closed");
    let limiter = limiter.clone();
    let made = tokio::task::spawn_blocking(move || {
        let mut bytes = Vec::new();
        let extras = codec::ReplyExtras::default();
        codec::encode_response_versioned(version, id, &lockouts_reply(&limiter, listed, now), &extras, &mut bytes);
        bytes
    })
    .await;
    drop(maker);
    match made {
        Ok(bytes) => Some((bytes, share)),
        Err(e) => {
            tracing::error!(target: super::LOG_TARGET, error = %e, "making a lockouts reply failed; closing the connection");
            None
        }
    }
}
