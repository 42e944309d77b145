//! `lockouts`, and the operator's view's `activity` and `samples`: lists
//! made off the request path and within one memory budget, since anyone
//! who can connect may ask for them.

use std::sync::Arc;

use tokio::sync::SemaphorePermit;

use super::{Daemon, Observing};
use crate::codec;
use crate::limiter::Limiter;
use crate::protocol::{Activity, Request, Response};
use crate::unpoisoned::Unpoisoned;

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

/// With `bans`, the operator's bans come first: they name networks and
/// reasons, so only an admin asking in version 7 or later is shown them.
pub(crate) fn lockouts_reply(limiter: &Limiter, listed: usize, bans: bool, now: u64) -> Response<'static> {
    let (lockouts, total) = limiter.lockouts(listed, bans, now);
    Response::Lockouts { lockouts, total }
}

/// What a listed entry of an `activity` reply (a recent refusal or
/// lockout, a top prefix or account) costs while its reply is made and
/// sent, counted as generously as `LOCKOUT_REPLY_BYTES_ESTIMATE`: the
/// entry (~110 bytes), its strings' allocations (~130), its encoding
/// (~150, names of up to 64 bytes).
pub const ACTIVITY_ENTRY_BYTES_ESTIMATE: usize = 400;
/// The same for a would-be refusal of a `samples` reply: seven strings.
pub const SAMPLE_REPLY_BYTES_ESTIMATE: usize = 640;
/// An `activity` reply's route, distributions and counters: per route, and
/// once (the distributions' histograms are at most 33 buckets each).
pub const ACTIVITY_ROUTE_BYTES_ESTIMATE: usize = 512;
pub const ACTIVITY_FIXED_BYTES_ESTIMATE: usize = 16 * 1024;

/// Entries in each list of an `Activity` or `Samples` reply, at most:
/// 10,000 would-be refusals are ~1.5 MB, well inside a reply's 8 MiB.
pub(crate) const ACTIVITY_LISTED_MAX: usize = 10_000;

/// A request's `limit`, within `ACTIVITY_LISTED_MAX`.
pub(crate) fn activity_listed(limit: u32) -> usize {
    (limit as usize).min(ACTIVITY_LISTED_MAX)
}

/// The operator's view (a version-4 `Activity` reply) from what the daemon
/// observes: at most `limit` entries in each list.
pub(crate) fn activity_view(observing: &Observing, limiter: &Limiter, limit: u32, now: u64) -> Activity {
    let mut view = {
        let observer = observing.observer.locked();
        observer.view(activity_listed(limit), now)
    };
    let link = &observing.link;
    view.routes = limiter.route_activity();
    view.latency = link.latency.snapshot();
    (view.events, view.events_dropped) = link.events();
    view
}

/// A version-4 `Samples` reply: at most `limit` would-be refusals.
pub(crate) fn samples_reply(observing: &Observing, limit: u32) -> Response<'static> {
    let observer = observing.observer.locked();
    let (samples, seen, since_ms) = observer.samples(activity_listed(limit));
    Response::Samples { samples, seen, since_ms }
}

impl Daemon {
    /// The operator's view (a version-4 `Activity` reply): at most `limit`
    /// entries in each list.
    pub(crate) fn activity(&self, limiter: &Limiter, limit: u32, now: u64) -> Activity {
        let mut view = activity_view(&self.activity, limiter, limit, now);
        view.decision_log = self.decision_log_stats();
        view
    }
}

/// A request `serve_connection` answers with `Daemon::listing_reply`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Listing {
    /// The limit, and whether the bans are listed (`lockouts_reply`).
    Lockouts(u32, bool),
    Activity(u32),
    Samples(u32),
}

impl Listing {
    pub(crate) fn of(request: &Request<'_>, bans: bool) -> Option<Listing> {
        match *request {
            Request::Lockouts { limit } => Some(Listing::Lockouts(limit, bans)),
            Request::Activity { limit } => Some(Listing::Activity(limit)),
            Request::Samples { limit } => Some(Listing::Samples(limit)),
            _ => None,
        }
    }

    /// Its share of `LOCKOUTS_REPLY_BYTES_MAX`: what its reply can cost,
    /// from the limit asked and the bounds of what is listed.
    fn share(self, daemon: &Daemon, limiter: &Limiter) -> usize {
        let bytes = match self {
            Listing::Lockouts(limit, _) => lockouts_listed(limit) * LOCKOUT_REPLY_BYTES_ESTIMATE,
            Listing::Activity(limit) => {
                let observer = daemon.activity.observer.locked();
                let c = observer.config();
                let listed = activity_listed(limit);
                let entries = 2 * listed.min(c.recent_max) + 2 * listed.min(2 * c.top_entries_max);
                entries * ACTIVITY_ENTRY_BYTES_ESTIMATE
                    + limiter.route_count() * ACTIVITY_ROUTE_BYTES_ESTIMATE
                    + ACTIVITY_FIXED_BYTES_ESTIMATE
            }
            Listing::Samples(limit) => {
                let observer = daemon.activity.observer.locked();
                activity_listed(limit).min(observer.config().samples_max) * SAMPLE_REPLY_BYTES_ESTIMATE
            }
        };
        // A share over the whole budget would never be granted.
        bytes.min(LOCKOUTS_REPLY_BYTES_MAX)
    }
}

/// Makes a `lockouts`, `activity` or `samples` reply: waits for its share
/// of `LOCKOUTS_REPLY_BYTES_MAX` and its turn to be made, then makes and
/// encodes it on a blocking thread (a 10,000-entry reply takes
/// milliseconds; on a runtime thread it would hold up every check waiting
/// for that thread). Returns the encoded reply and the share, both to be
/// dropped once written; `None`: close the connection.
impl Daemon {
    pub(crate) async fn listing_reply(
        &self,
        limiter: &Arc<Limiter>,
        version: u8,
        id: u64,
        listing: Listing,
        now: u64,
    ) -> Option<(Vec<u8>, SemaphorePermit<'_>)> {
        let daemon = self;
        let share = listing.share(daemon, limiter) as u32;
        let share = daemon.lockouts_reply_bytes.acquire_many(share).await.expect("the budget is never closed");
        let maker = daemon.lockouts_makers.acquire().await.expect("the makers' semaphore is never closed");
        let limiter = limiter.clone();
        let observing = daemon.activity.clone();
        let decision_log = daemon.decision_log_stats();
        let made = tokio::task::spawn_blocking(move || {
            let reply = match listing {
                Listing::Lockouts(limit, bans) => lockouts_reply(&limiter, lockouts_listed(limit), bans, now),
                Listing::Activity(limit) => {
                    let mut view = activity_view(&observing, &limiter, limit, now);
                    view.decision_log = decision_log;
                    Response::Activity(Box::new(view))
                }
                Listing::Samples(limit) => samples_reply(&observing, limit),
            };
            let mut bytes = Vec::new();
            let extras = codec::ReplyExtras::default();
            codec::encode_response_versioned(version, id, &reply, &extras, &mut bytes);
            bytes
        })
        .await;
        drop(maker);
        match made {
            Ok(bytes) => Some((bytes, share)),
            Err(e) => {
                tracing::error!(target: super::LOG_TARGET, error = %e, "making a listing reply failed; closing the connection");
                None
            }
        }
    }
}
