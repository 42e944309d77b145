//! The handle side of the writer: `Journal`, on which the limiter queues
//! edits (cheap to clone, never blocks), and `Durable`, which resolves once
//! a queued write is committed or has failed.
//!
//! Touches neither redb nor the disk: edits travel as `Message`s over a
//! channel to the writer thread (`writer.rs`), in the order they were
//! queued.

use std::sync::mpsc::Sender;
use std::sync::Arc;

use super::{CellRows, DeviceRows, WriteError};
use crate::failure_window::Change;

/// Resolves when a write is on disk (or failed to get there). A lockout's
/// write names its rule (`route/rule`), which the operator's view shows.
pub struct Durable(pub(super) tokio::sync::oneshot::Receiver<Result<(), WriteError>>, Option<Arc<str>>);

impl Durable {
    fn done(result: Result<(), WriteError>) -> Durable {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _ = tx.send(result);
        Durable(rx, None)
    }

    fn of_rule(self, rule: &Arc<str>) -> Durable {
        Durable(self.0, Some(rule.clone()))
    }

    /// A lockout a global rule took in the shared store: its known-lockout
    /// write, if the route keeps one, named for the rule (or a write that
    /// is already done), so the operator's view lists it as it does a
    /// host rule's.
    pub fn of_lockout(write: Option<Durable>, rule: &Arc<str>) -> Durable {
        write.unwrap_or_else(|| Durable::done(Ok(()))).of_rule(rule)
    }

    /// The rule whose entries a `write_durably` writes.
    pub fn rule(&self) -> Option<&Arc<str>> {
        self.1.as_ref()
    }

    pub async fn wait(self) -> Result<(), WriteError> {
        self.0.await.unwrap_or(Err(WriteError::WriterStopped))
    }

    pub fn wait_blocking(self) -> Result<(), WriteError> {
        self.0.blocking_recv().unwrap_or(Err(WriteError::WriterStopped))
    }
}

/// One queued edit of the file, applied in the order it was queued.
pub(super) enum Edit {
    /// Upserts and deletions of one rule's entries; `window_us` is the
    /// window length their counts are in.
    Entries { rule: Arc<str>, window_us: u64, changes: Vec<Change> },
    /// Every row of a rule that is not (or no longer) a configured failure
    /// rule, its sketch cells' too.
    DropRule(Arc<str>),
    /// Changes to one shard's overflow-sketch cells of a rule.
    Cells(CellRows),
    /// Changes to one shard of a route's known devices.
    Devices(DeviceRows),
    /// Every known-device row of a route that keeps none (any more).
    DropDevices(Arc<str>),
    /// One value of the `meta` table (kept by the writer for a rewrite).
    Meta(&'static str, u64),
    /// A ban's row (its network's text, the row), or its deletion.
    Ban(String, Option<Vec<u8>>),
}

impl Edit {
    /// Rows it touches, as far as is known before applying it (for logs).
    pub(super) fn size(&self) -> usize {
        match self {
            Edit::Entries { changes, .. } => changes.len(),
            Edit::DropRule(_) | Edit::DropDevices(_) | Edit::Meta(..) | Edit::Ban(..) => 1,
            Edit::Devices(d) => d.rows.len(),
            Edit::Cells(c) => c.changes.chunks.len(),
        }
    }
}

pub(super) enum Message {
    Write {
        edit: Edit,
        ack: Option<Ack>,
    },
    /// Start writing a fresh file: what follows until `RewriteEnd` is the
    /// whole state, collected from memory (see `Limiter::rewrite`).
    RewriteBegin,
    /// Swap the fresh file in for the state file, if every write succeeded.
    RewriteEnd {
        ack: Ack,
    },
    Stop,
}

/// The sending side of the writer. Cheap to clone; never blocks.
#[derive(Clone)]
pub struct Journal {
    pub(super) tx: Option<Sender<Message>>,
}

impl Journal {
    /// A journal that persists nothing (tests of the pure limiter).
    pub fn discard() -> Journal {
        Journal { tx: None }
    }

    /// Queues changes for the next group commit. `window_us` is the
    /// rule's window length the counts are in (taken under the same shard
    /// lock as the changes, so a reload cannot come between them).
    pub fn write(&self, rule: &Arc<str>, window_us: u64, changes: Vec<Change>) {
        if let Some(tx) = &self.tx {
            let _ =
                tx.send(Message::Write { edit: Edit::Entries { rule: rule.clone(), window_us, changes }, ack: None });
        }
    }

    /// Queues the deletion of every row of `rule`: a failure rule that a
    /// reload removes or adds, or that the state file names but the
    /// configuration does not. A rule's state lives as long as it is
    /// configured, so a rule switched off and on again starts empty and no
    /// row of an earlier incarnation can come back at a restart.
    pub fn drop_rule(&self, rule: &str) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Message::Write { edit: Edit::DropRule(rule.into()), ack: None });
        }
    }

    /// Queues changes to a shard of a route's known devices; with
    /// `durable`, returns what resolves once they are committed.
    pub fn write_devices(&self, rows: DeviceRows, durable: bool) -> Option<Durable> {
        self.tx.as_ref()?;
        self.queue(Edit::Devices(rows), durable)
    }

    /// Queues changes to a shard's overflow-sketch cells; with `durable`
    /// (a spilled lockout), returns what resolves once they are committed,
    /// named for the rule like a table's lockout.
    pub fn write_cells(&self, rows: CellRows, durable: bool) -> Option<Durable> {
        let rule = rows.rule.clone();
        self.queue(Edit::Cells(rows), durable).map(|d| d.of_rule(&rule))
    }

    /// Queues `edit`; with `durable`, returns what resolves once it is
    /// committed (at once for a journal that persists nothing).
    fn queue(&self, edit: Edit, durable: bool) -> Option<Durable> {
        let Some(tx) = &self.tx else { return durable.then(|| Durable::done(Ok(()))) };
        if !durable {
            let _ = tx.send(Message::Write { edit, ack: None });
            return None;
        }
        let (ack, rx) = tokio::sync::oneshot::channel();
        Some(match tx.send(Message::Write { edit, ack: Some(ack) }) {
            Ok(()) => Durable(rx, None),
            Err(_) => Durable::done(Err(WriteError::WriterStopped)),
        })
    }

    /// Queues a ban's row; with `durable`, returns what resolves once it
    /// is committed.
    pub fn write_ban(&self, ban: &crate::bans::Ban, durable: bool) -> Option<Durable> {
        let (network, row) = super::schema::ban_row_bytes(ban);
        self.queue(Edit::Ban(network, Some(row)), durable)
    }

    /// Queues the deletion of the ban row of `network`; with `durable`,
    /// returns what resolves once it is committed.
    pub fn remove_ban(&self, network: ipnet::IpNet, durable: bool) -> Option<Durable> {
        self.queue(Edit::Ban(network.to_string(), None), durable)
    }

    /// Queues the deletion of every known-device row of `route`: a route
    /// that keeps no known devices (any more).
    pub fn drop_devices(&self, route: &str) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Message::Write { edit: Edit::DropDevices(route.into()), ack: None });
        }
    }

    /// Queues the host count learned from the shared store, for a restart
    /// while the store is away.
    pub fn hosts_learned(&self, hosts: u32) {
        if let Some(tx) = &self.tx {
            let edit = Edit::Meta(super::schema::META_HOSTS_LEARNED, u64::from(hosts));
            let _ = tx.send(Message::Write { edit, ack: None });
        }
    }

    /// Starts rewriting the state file from memory.
    pub fn rewrite_begin(&self) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Message::RewriteBegin);
        }
    }

    /// Ends a rewrite; resolves once the fresh file has replaced the old.
    pub fn rewrite_end(&self) -> Durable {
        let Some(tx) = &self.tx else { return Durable::done(Ok(())) };
        let (ack, rx) = tokio::sync::oneshot::channel();
        match tx.send(Message::RewriteEnd { ack }) {
            Ok(()) => Durable(rx, None),
            Err(_) => Durable::done(Err(WriteError::WriterStopped)),
        }
    }

    /// Queues changes and returns what resolves once they are committed.
    pub fn write_durably(&self, rule: &Arc<str>, window_us: u64, changes: Vec<Change>) -> Durable {
        let edit = Edit::Entries { rule: rule.clone(), window_us, changes };
        self.queue(edit, true).expect("a durable write resolves").of_rule(rule)
    }
}

pub(super) type Ack = tokio::sync::oneshot::Sender<Result<(), WriteError>>;
