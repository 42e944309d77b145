//! A bounded queue from the request path to a thread of its own (spray
//! detection's pump, the activity view, the decision log) that never
//! blocks its sender: a full queue drops the item and counts the drop.
//!
//! `std::sync::mpsc::sync_channel` rather than a crate's queue: one
//! producer call per item (`try_send`, no allocation), one consumer
//! thread, and a full queue must drop, never block; the standard
//! library's channel does exactly that. The drop is counted because
//! under-counting is what an attacker wants, so it must be visible.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

pub struct DropQueue<T> {
    tx: SyncSender<T>,
    dropped: AtomicU64,
}

/// A queue holding at most `capacity` items, and its receiving end.
pub fn drop_queue<T>(capacity: usize) -> (DropQueue<T>, Receiver<T>) {
    let (tx, rx) = sync_channel(capacity);
    (DropQueue { tx, dropped: AtomicU64::new(0) }, rx)
}

impl<T> DropQueue<T> {
    /// Queues `item`; never blocks. A full queue (or one whose receiver is
    /// gone) drops it and counts it.
    pub fn send(&self, item: T) {
        if self.tx.try_send(item).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Items dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_and_counts_and_a_gone_receiver_too() {
        let (queue, rx) = drop_queue(2);
        for i in 0..5 {
            queue.send(i);
        }
        assert_eq!(queue.dropped(), 3);
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), vec![0, 1]);
        drop(rx);
        queue.send(9);
        assert_eq!(queue.dropped(), 4);
    }
}
