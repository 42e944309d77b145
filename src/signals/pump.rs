//! Between the request path and the engine: a bounded queue of events one
//! way, a published flag table the other.
//!
//! `std::sync::mpsc::sync_channel` rather than a crate's queue: one
//! producer call per report (`try_send`, no allocation), one consumer
//! thread, and a full queue must drop, never block; the standard library's
//! channel does exactly that. The drop is counted and alerted on: under-
//! counting is what an attacker wants, so it must be visible.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use super::flags::FlagTable;
use super::{SignalEvent, Signals};
use crate::config::SignalsConfig;

/// Events the thread takes per batch before it publishes.
const BATCH_MAX: usize = 4_096;

/// What the limiter holds: the sending end and the published flags.
pub struct SignalsLink {
    tx: SyncSender<SignalEvent>,
    flags: ArcSwap<FlagTable>,
    dropped: AtomicU64,
}

impl SignalsLink {
    /// Queues an event; never blocks (a full queue drops and counts it).
    pub fn send(&self, event: SignalEvent) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(event) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The flags as last published.
    pub fn flags(&self) -> arc_swap::Guard<Arc<FlagTable>> {
        self.flags.load()
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The receiving end and the engine.
pub struct Pump {
    rx: Receiver<SignalEvent>,
    engine: Arc<Mutex<Signals>>,
    link: Arc<SignalsLink>,
}

/// A link and its pump, with the engine shared for `status`.
pub fn channel(config: &SignalsConfig) -> (Arc<SignalsLink>, Pump) {
    let (tx, rx) = sync_channel(config.queue_max);
    let link =
        Arc::new(SignalsLink { tx, flags: ArcSwap::from_pointee(FlagTable::default()), dropped: AtomicU64::new(0) });
    let engine = Arc::new(Mutex::new(Signals::new(config)));
    (link.clone(), Pump { rx, engine, link })
}

impl Pump {
    pub fn engine(&self) -> Arc<Mutex<Signals>> {
        self.engine.clone()
    }

    /// Ingests every queued event, ticks at `now_us` and publishes if a
    /// flag changed. The simulator calls this itself, on its own clock.
    pub fn drain(&self, now_us: u64) {
        let mut engine = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        for event in self.rx.try_iter() {
            engine.ingest(&event);
        }
        self.finish(&mut engine, now_us);
    }

    fn finish(&self, engine: &mut Signals, now_us: u64) {
        engine.tick(now_us);
        if engine.changed() {
            self.link.flags.store(Arc::new(engine.snapshot()));
        }
    }

    /// The daemon's thread: waits up to a publish interval for events,
    /// ingests a batch, publishes. Returns when every link is dropped.
    pub fn run(self, now_us: impl Fn() -> u64) {
        loop {
            let interval = {
                let engine = self.engine.lock().unwrap_or_else(|e| e.into_inner());
                Duration::from_millis(engine.config().publish_interval_ms)
            };
            let first = match self.rx.recv_timeout(interval) {
                Ok(event) => Some(event),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let mut engine = self.engine.lock().unwrap_or_else(|e| e.into_inner());
            for event in first.into_iter().chain(self.rx.try_iter().take(BATCH_MAX - 1)) {
                engine.ingest(&event);
            }
            self.finish(&mut engine, now_us());
        }
    }
}
