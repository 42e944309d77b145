//! Between the request path and the engine: a bounded queue of events one
//! way, a published flag table the other.
//!
//! The queue drops and counts when full (`DropQueue`); the drop is
//! alerted on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use super::flags::FlagTable;
use super::queued::QueuedEvent;
use super::Signals;
use crate::config::SignalsConfig;
use crate::drop_queue::{drop_queue, DropQueue};
use crate::keys::KeyDeriver;
use crate::unpoisoned::Unpoisoned;

/// Events taken from the queue before ingesting them together, so the
/// engine can prefetch ahead within the batch (`Signals::ingest_all`).
const BATCH_MAX: usize = 256;

/// The published flags as a request reads them: a guard, which costs no
/// shared reference count while the thread holds few.
pub type FlagsGuard = arc_swap::Guard<Arc<FlagTable>>;

/// What the limiter holds: the sending end and the published flags.
pub struct SignalsLink {
    queue: DropQueue<QueuedEvent>,
    flags: ArcSwap<FlagTable>,
    /// Whether the published table holds any flag: what nearly every
    /// request asks, answered by one plain load. `ArcSwap::load` costs a
    /// fenced write to a per-thread slot, about 1% of a login's time, to
    /// find the table empty.
    raised: AtomicBool,
    /// Held while publishing (rare: once a publish interval at most).
    publishing: Mutex<()>,
    /// `KeyDeriver::prefix_check` of the pump's keys.
    keys_check: [u8; 16],
}

impl SignalsLink {
    /// Queues an event; never blocks (a full queue drops and counts it).
    pub fn send(&self, event: QueuedEvent) {
        self.queue.send(event);
    }

    /// The flags as last published, unless none are.
    pub fn flags_raised(&self) -> Option<FlagsGuard> {
        // Acquire: a table published before `raised` was set is the one
        // (or older than the one) the load below returns.
        if !self.raised.load(Ordering::Acquire) {
            return None;
        }
        Some(self.flags.load()).filter(|f| !f.is_empty())
    }

    /// Withdraws every published flag (spray detection turned off by a
    /// reload: a widened block must not stay widened for the rest of its hour).
    pub fn withdraw(&self) {
        self.publish(FlagTable::default());
    }

    /// Publishes `table`. One publish at a time (the pump, a reload's
    /// withdrawal), so `raised` is always set by the publish whose table
    /// was stored last: two interleaved could leave it false over a table
    /// of flags, unenforced until the next change.
    fn publish(&self, table: FlagTable) {
        let _one_at_a_time = self.publishing.locked();
        let raised = !table.is_empty();
        self.flags.store(Arc::new(table));
        self.raised.store(raised, Ordering::Release);
    }

    /// Whether the pump derives prefix digests as `keys` do.
    pub fn derives_as(&self, keys: &KeyDeriver) -> bool {
        self.keys_check == keys.prefix_check()
    }

    pub fn dropped(&self) -> u64 {
        self.queue.dropped()
    }
}

/// The receiving end and the engine.
pub struct Pump {
    rx: Receiver<QueuedEvent>,
    /// The daemon's keys, to derive what the request path left to the
    /// thread (`QueuedEvent::expand`). The secret is fixed for the
    /// process's life (a reload keeps it).
    keys: KeyDeriver,
    /// The queue's capacity (`queue_max`).
    capacity: usize,
    engine: Arc<Mutex<Signals>>,
    link: Arc<SignalsLink>,
}

/// A link and its pump, with the engine shared for `status`; `keys` are
/// the limiter's.
pub fn channel(config: &SignalsConfig, keys: &KeyDeriver) -> (Arc<SignalsLink>, Pump) {
    let (queue, rx) = drop_queue(config.queue_max);
    let link = Arc::new(SignalsLink {
        queue,
        flags: ArcSwap::from_pointee(FlagTable::default()),
        raised: AtomicBool::new(false),
        publishing: Mutex::new(()),
        keys_check: keys.prefix_check(),
    });
    let engine = Arc::new(Mutex::new(Signals::new(config)));
    (link.clone(), Pump { rx, keys: keys.clone(), capacity: config.queue_max, engine, link })
}

impl Pump {
    pub fn engine(&self) -> Arc<Mutex<Signals>> {
        self.engine.clone()
    }

    /// Ingests every queued event, ticks at `now_us` and publishes if a
    /// flag changed. The simulator calls this itself, on its own clock.
    pub fn drain(&self, now_us: u64) {
        let mut engine = self.engine.locked();
        let mut batch = Vec::with_capacity(BATCH_MAX);
        loop {
            batch.clear();
            batch.extend(self.rx.try_iter().take(BATCH_MAX).map(|event| event.expand(&self.keys)));
            if batch.is_empty() {
                break;
            }
            engine.ingest_all(&batch);
        }
        self.finish(&mut engine, now_us);
    }

    fn finish(&self, engine: &mut Signals, now_us: u64) {
        engine.tick(now_us);
        if engine.changed() {
            self.link.publish(engine.snapshot());
        }
    }

    /// The daemon's thread: every publish interval, ingests what the queue
    /// holds, then publishes. It sleeps rather than blocks on the queue: a
    /// receiver blocked on an empty channel must be woken by the next
    /// sender, a futex call on the request path for every report that finds
    /// the queue drained. It runs for the daemon's life: the pump holds a
    /// link itself (to publish the flags), so the queue never disconnects
    /// while it runs; the `Disconnected` arm only guards a future owner.
    pub fn run(self, now_us: impl Fn() -> u64) {
        let mut batch = Vec::with_capacity(BATCH_MAX);
        loop {
            let interval = {
                let engine = self.engine.locked();
                Duration::from_millis(engine.config().publish_interval_ms)
            };
            std::thread::sleep(interval);
            // At most a queue's worth per round. Each batch is expanded
            // (its digests derived) before the engine's lock is taken and
            // ingested under it, so `status` waits for one batch at most.
            let mut taken = 0;
            while taken < self.capacity {
                batch.clear();
                let mut gone = false;
                while batch.len() < BATCH_MAX.min(self.capacity - taken) {
                    match self.rx.try_recv() {
                        Ok(event) => batch.push(event.expand(&self.keys)),
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => {
                            gone = true;
                            break;
                        }
                    }
                }
                self.engine.locked().ingest_all(&batch);
                taken += batch.len();
                if gone {
                    return;
                }
                if batch.len() < BATCH_MAX {
                    break;
                }
            }
            let mut engine = self.engine.locked();
            self.finish(&mut engine, now_us());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::keys::{Secret, SECRET_BYTES};
    use crate::signals::flags::Flag;

    /// A request sees a published flag, and none once a reload's
    /// withdrawal (or an empty publish) took them back.
    #[test]
    fn raised_follows_the_table_published_last() {
        let config = Config::default().signals.expect("built-in defaults have spray detection on");
        let (link, _pump) = channel(&config, &KeyDeriver::new(&Secret::from_bytes([3; SECRET_BYTES])));
        assert!(link.flags_raised().is_none(), "nothing published yet");
        let one = || {
            let mut map = std::collections::HashMap::default();
            map.insert(7, Flag { bits: 1, until_us: u64::MAX });
            FlagTable::new(map, 0, &[])
        };
        link.publish(one());
        assert_eq!(link.flags_raised().map(|f| f.len()), Some(1));
        link.withdraw();
        assert!(link.flags_raised().is_none());
        link.publish(one());
        assert!(link.flags_raised().is_some());
        link.publish(FlagTable::default());
        assert!(link.flags_raised().is_none());
    }
}
