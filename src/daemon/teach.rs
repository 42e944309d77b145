//! Teaching a shared store that lost its data (FLUSHALL, a restart
//! without persistence) the devices this host knows, so that every host
//! scopes her rules as before at once, not only once one of her checks
//! reaches the host that saw her log in on the device.

use std::sync::Arc;
use std::time::Duration;

use super::shared::WRITE_BACK_BATCH;
use super::Daemon;
use crate::shared::{CallError, SharedStore, State, LOG_TARGET};

/// The least time between the starts of two passes teaching the store
/// this host's devices (`teach_known_devices`); a device is taught at its
/// check meanwhile.
pub(super) const TEACH_PASS_GAP_MS: u64 = 60_000;

/// The pause after each chunk of a teaching pass (`teach_known_devices`).
pub(super) const TEACH_CHUNK_PAUSE_MS: u64 = 20;

/// The supervisor's record of teaching passes: the shard the next one
/// starts from (none due), the one running, and when the last began.
#[derive(Default)]
pub(super) struct Teaching {
    from: Option<usize>,
    running: Option<tokio::task::JoinHandle<Option<usize>>>,
    last_began: Option<tokio::time::Instant>,
}

impl Teaching {
    /// After a heartbeat's fingerprint check: one pass at a time, each
    /// starting at least `TEACH_PASS_GAP_MS` after the last began, so a
    /// store that keeps losing its `{meta}` (evicting it under memory
    /// pressure, say) is not kept busy with lessons. A pass that stopped
    /// is resumed where it stopped; a new loss starts over.
    pub(super) fn after_heartbeat(&mut self, daemon: &Arc<Daemon>, store: &Arc<SharedStore>) {
        if let Some(pass) = self.running.take_if(|t| t.is_finished()) {
            if let Some(Ok(Some(shard))) = futures_util::FutureExt::now_or_never(pass) {
                self.from = Some(self.from.map_or(shard, |from| from.min(shard)));
            }
        }
        if store.take_store_forgot() {
            self.from = Some(0);
        }
        let rested = self.last_began.is_none_or(|at| at.elapsed() >= Duration::from_millis(TEACH_PASS_GAP_MS));
        if let (Some(from), None, true) = (self.from, &self.running, rested) {
            self.from = None;
            self.last_began = Some(tokio::time::Instant::now());
            self.running = Some(tokio::spawn(teach_known_devices(daemon.clone(), store.clone(), from)));
        }
    }
}

/// After the store was seen to lose its data: every device this host
/// knows taught again, from shard `from` of its tables, a chunk of
/// `WRITE_BACK_BATCH` each `TEACH_CHUNK_PAUSE_MS` (about 3,200 a second:
/// a million devices in five minutes), so the lessons never crowd the
/// checks out of the store's queue or time. Without it, a host that never
/// saw her device refused it (a short wait at a time) while an account
/// ceiling's lockout stood, until one of her checks reached the host that
/// knows it, as a device not yet taught still is. A lesson refused for
/// its own key (a value tollgate did not write, one Cluster node away) is
/// skipped; any other failure, or the breaker leaving Closed, stops the
/// pass: the shard it stopped in, for the next pass to resume from.
async fn teach_known_devices(daemon: Arc<Daemon>, store: Arc<SharedStore>, from: usize) -> Option<usize> {
    let limiter = daemon.limiter().load_full();
    let chunk = WRITE_BACK_BATCH.min(store.config.pending_max);
    let (mut taught, mut skipped, mut stopped) = (0usize, 0usize, None);
    let mut shard = from;
    'pass: while let Some(lessons) = limiter.lessons(shard, daemon.clock().now_us()) {
        for part in lessons.chunks(chunk) {
            if store.state() != State::Closed {
                stopped = Some("the store is away".to_string());
                break 'pass;
            }
            let now_us = daemon.clock().now_us();
            let ops = part.iter().filter_map(|lesson| limiter.lesson_op(lesson, now_us));
            for reply in futures_util::future::join_all(ops.map(|op| store.call_recovering(op))).await {
                match reply {
                    Ok(_) => taught += 1,
                    Err(CallError::BadValue(_) | CallError::NodeAway(_)) => skipped += 1,
                    Err(e) => stopped = Some(e.to_string()),
                }
            }
            if stopped.is_some() {
                break 'pass;
            }
            tokio::time::sleep(Duration::from_millis(TEACH_CHUNK_PAUSE_MS)).await;
        }
        shard += 1;
    }
    match stopped {
        None => {
            tracing::info!(target: LOG_TARGET, taught, skipped,
                "the shared store lost its data; the devices this host knows taught again");
            None
        }
        Some(error) => {
            tracing::warn!(target: LOG_TARGET, taught, skipped, error = %error,
                "teaching the shared store this host's devices stopped; the next pass resumes");
            Some(shard)
        }
    }
}
