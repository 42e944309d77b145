//! The writer thread, the one place the state file is written after start.
//! It group-commits whatever has queued, each commit two-phase; after a
//! failed commit it writes nothing more to that file until a rewrite from
//! memory has built a fresh file and renamed it over the state file, and
//! writes committed to the fresh file are acknowledged only then.
//!
//! Does not decide what is written (the limiter queues it on the
//! `Journal`), and never reads rows back.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use redb::Database;

use super::journal::{Ack, Edit, Journal, Message};
use super::schema::{
    cell_chunk_bytes, device_check, entry_row, schema_of, CellKey, DeviceKey, DeviceValue, BANS, CELLS, DEVICES,
    ENTRIES, META, META_KEY_DERIVATION, META_KEY_FINGERPRINT,
};
use super::{open_database, CellRows, DeviceRows, Store, StoreStats, WriteError};
use crate::keys::Derivation;
use crate::unpoisoned::Unpoisoned;

/// Messages drained into one transaction at most; bounds a commit's size.
pub const GROUP_COMMIT_MESSAGES_MAX: usize = 4096;
/// Changes counted as unwritten while the disk refuses writes; beyond this
/// they are counted as dropped. (Memory is the truth: every rewrite attempt
/// writes the whole live state, so nothing queued needs to be kept.)
pub const RETRY_CHANGES_MAX: usize = 1_000_000;

impl Store {
    /// Starts the writer thread. Returns the journal to write through and a
    /// handle that stops the thread after everything queued is committed.
    pub fn start_writer(self, stats: Arc<StoreStats>) -> (Journal, Writer) {
        let (tx, rx) = mpsc::channel();
        let journal = Journal { tx: Some(tx.clone()) };
        let thread = std::thread::Builder::new()
            .name("tollgate-writer".into())
            .spawn(move || run_writer(self, rx, stats))
            .expect("spawning the writer thread");
        (journal, Writer { tx, thread: Some(thread) })
    }
}

/// Owner of the writer thread.
pub struct Writer {
    tx: Sender<Message>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// Commits everything queued before this call, then stops the thread.
    pub fn stop(mut self) {
        let _ = self.tx.send(Message::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run_writer(store: Store, rx: Receiver<Message>, stats: Arc<StoreStats>) {
    let path = store.path.clone();
    let (key_fingerprint, key_derivation) = (store.key_fingerprint, store.key_derivation);
    let fresh = rewrite_path(&path);
    // None after a failed commit: a database that saw an I/O error mid-commit
    // may not match memory any more, so nothing more is written to it; the
    // whole state is rewritten from memory into a fresh file instead.
    let mut db = Some(store.db);
    // The file's `meta` values beyond the schema and key fingerprint, as
    // read at start and written since: a fresh file gets them too, since a
    // rewrite collects only rows from memory.
    let mut meta: Vec<(String, u64)> = db.as_ref().map(store_meta).unwrap_or_default();
    let mut rewriting = false;
    let mut rewrite_failed = false;
    // Changes that could not be written, kept (bounded) until a rewrite
    // makes them moot; they are what `changes_unwritten` reports.
    let mut held: usize = 0;
    // Acks of writes committed to the fresh file during a rewrite. Until the
    // fresh file is renamed over the state file, a crash restarts from the
    // old file without them, so they are not durable yet.
    let mut deferred: Vec<Ack> = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut batch: Vec<Edit> = Vec::new();
        let mut acks: Vec<Ack> = Vec::new();
        let take = |m: Message, batch: &mut Vec<Edit>, acks: &mut Vec<Ack>| match m {
            Message::Write { edit, ack } => {
                batch.push(edit);
                acks.extend(ack);
                None
            }
            other => Some(other),
        };
        let mut control = take(first, &mut batch, &mut acks);
        // Group commit: everything already queued, up to a control message.
        while control.is_none() && acks.len() + batch.len() < GROUP_COMMIT_MESSAGES_MAX {
            match rx.try_recv() {
                Ok(m) => control = take(m, &mut batch, &mut acks),
                Err(_) => break,
            }
        }
        for edit in &batch {
            if let Edit::Meta(key, value) = edit {
                meta.retain(|(k, _)| k != key);
                meta.push((key.to_string(), *value));
            }
        }
        if !batch.is_empty() {
            let attempted = db.is_some() && !(rewriting && rewrite_failed);
            let result = match &db {
                Some(open) if attempted => commit(open, &batch),
                _ => Err(WriteError::AwaitingRewrite),
            };
            match result {
                Ok(()) => {
                    stats.commits.fetch_add(1, Ordering::Relaxed);
                    if rewriting {
                        deferred.append(&mut acks);
                    }
                    for ack in acks {
                        let _ = ack.send(Ok(()));
                    }
                }
                Err(message) => {
                    let changes: usize = batch.iter().map(Edit::size).sum();
                    if rewriting {
                        rewrite_failed = true;
                        // The fresh file will not be swapped in.
                        for ack in deferred.drain(..) {
                            let _ = ack.send(Err(message.clone()));
                        }
                    } else {
                        db = None;
                        held = held.saturating_add(changes);
                        if held > RETRY_CHANGES_MAX {
                            stats.changes_dropped.fetch_add((held - RETRY_CHANGES_MAX) as u64, Ordering::Relaxed);
                            held = RETRY_CHANGES_MAX;
                        }
                        stats.changes_unwritten.store(held as u64, Ordering::Relaxed);
                    }
                    stats.needs_rewrite.store(true, Ordering::Release);
                    stats.write_failures.fetch_add(1, Ordering::Relaxed);
                    // Only a real failure is logged and shown; the writes
                    // that wait for the rewrite after it would flood both.
                    if attempted {
                        tracing::error!(target: super::LOG_TARGET, state = %path.display(), error = %message, changes, "state write failed; answering from memory, will rewrite the file from memory");
                        *stats.last_error.locked() = Some(message.to_string());
                    }
                    for ack in acks {
                        let _ = ack.send(Err(message.clone()));
                    }
                }
            }
        }
        match control {
            None => {}
            Some(Message::RewriteBegin) => {
                db = None;
                rewriting = true;
                let _ = std::fs::remove_file(&fresh);
                match open_database(&fresh).map_err(WriteError::from).and_then(|open| {
                    init_fresh(&open, key_fingerprint, key_derivation, &meta)?;
                    Ok(open)
                }) {
                    Ok(open) => {
                        db = Some(open);
                        rewrite_failed = false;
                    }
                    Err(e) => {
                        tracing::error!(target: super::LOG_TARGET, file = %fresh.display(), error = %e, "cannot start rewriting the state file");
                        rewrite_failed = true;
                    }
                }
            }
            Some(Message::RewriteEnd { ack }) => {
                let result =
                    if rewrite_failed { Err(WriteError::RewriteFailed) } else { swap_in(&mut db, &fresh, &path) };
                rewriting = false;
                for ack in deferred.drain(..) {
                    let _ = ack.send(result.clone());
                }
                match &result {
                    Ok(()) => {
                        held = 0;
                        stats.changes_unwritten.store(0, Ordering::Relaxed);
                        stats.needs_rewrite.store(false, Ordering::Release);
                        *stats.last_error.locked() = None;
                        tracing::warn!(target: super::LOG_TARGET, state = %path.display(), "state file rewritten from memory; everything is on disk again");
                    }
                    Err(e) => {
                        db = None;
                        let _ = std::fs::remove_file(&fresh);
                        stats.needs_rewrite.store(true, Ordering::Release);
                        tracing::error!(target: super::LOG_TARGET, state = %path.display(), error = %e, "state file rewrite failed; will try again");
                    }
                }
                let _ = ack.send(result);
            }
            Some(Message::Stop) => {
                for ack in deferred.drain(..) {
                    let _ = ack.send(Err(WriteError::StoppedMidRewrite));
                }
                if held > 0 {
                    tracing::error!(target: super::LOG_TARGET, changes = held, "stopping with changes that could not be written");
                }
                return;
            }
            Some(Message::Write { .. }) => unreachable!("writes are batched"),
        }
    }
}

/// Where a rewrite builds the fresh state file before it replaces the old.
pub(super) fn rewrite_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".rewrite");
    path.with_file_name(name)
}

/// Closes the fresh file, renames it over the state file (atomic), makes
/// the rename durable, and opens the result as the database.
fn swap_in(db: &mut Option<Database>, fresh: &Path, path: &Path) -> Result<(), WriteError> {
    *db = None;
    std::fs::rename(fresh, path).map_err(|e| WriteError::Rename { path: fresh.into(), source: Arc::new(e) })?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| WriteError::SyncDirectory { path: dir.into(), source: Arc::new(e) })?;
    }
    *db = Some(open_database(path)?);
    Ok(())
}

/// A fresh file (a rewrite from memory) says what it is before any row.
/// The `meta` values a rewrite must carry over (all but the schema version
/// and key fingerprint, which a fresh file writes itself). A file whose
/// `meta` cannot be read gives none: its rows are what matters.
fn store_meta(db: &Database) -> Vec<(String, u64)> {
    use redb::ReadableTable;
    let read = || -> Result<Vec<(String, u64)>, Box<dyn std::error::Error>> {
        let txn = db.begin_read()?;
        let table = txn.open_table(META)?;
        let mut values = Vec::new();
        for row in table.iter()? {
            let (key, value) = row?;
            let key = key.value();
            if key != "schema_version" && key != META_KEY_FINGERPRINT && key != META_KEY_DERIVATION {
                values.push((key.to_string(), value.value()));
            }
        }
        Ok(values)
    };
    read().unwrap_or_default()
}

fn init_fresh(
    db: &Database,
    key_fingerprint: Option<u64>,
    key_derivation: Derivation,
    values: &[(String, u64)],
) -> Result<(), WriteError> {
    let mut txn = db.begin_write()?;
    // Two-phase: after a crash, redb otherwise falls back to the older
    // commit slot when the newer one reads as damaged, silently rolling
    // back an acknowledged lockout; with it, that damage is refused.
    txn.set_two_phase_commit(true);
    {
        let mut meta = txn.open_table(META)?;
        meta.insert("schema_version", schema_of(key_derivation))?;
        if let Some(fingerprint) = key_fingerprint {
            meta.insert(META_KEY_FINGERPRINT, fingerprint)?;
        }
        // Always, whatever the old file's `meta` gave: a fresh file
        // without it would read as made with BLAKE2b.
        meta.insert(META_KEY_DERIVATION, key_derivation.number())?;
        for (key, value) in values {
            meta.insert(key.as_str(), *value)?;
        }
    }
    txn.commit()?;
    Ok(())
}

fn commit(db: &Database, batch: &[Edit]) -> Result<(), WriteError> {
    let mut txn = db.begin_write()?;
    // Two-phase: after a crash, redb otherwise falls back to the older
    // commit slot when the newer one reads as damaged, silently rolling
    // back an acknowledged lockout; with it, that damage is refused.
    txn.set_two_phase_commit(true);
    {
        let mut table = txn.open_table(ENTRIES)?;
        let mut devices = txn.open_table(DEVICES)?;
        let mut cells = txn.open_table(CELLS)?;
        let mut meta = txn.open_table(META)?;
        let mut bans = txn.open_table(BANS)?;
        for edit in batch {
            let (rule, window_us, changes) = match edit {
                Edit::Entries { rule, window_us, changes } => (rule, window_us, changes),
                Edit::DropRule(rule) => {
                    let rows = (&**rule, 0u128)..=(&**rule, u128::MAX);
                    table.retain_in(rows, |_, _| false)?;
                    let rows = (&**rule, 0u8, 0u8, 0u32)..=(&**rule, u8::MAX, u8::MAX, u32::MAX);
                    cells.retain_in(rows, |_, _| false)?;
                    continue;
                }
                Edit::Cells(edit) => {
                    commit_cells(&mut cells, edit)?;
                    continue;
                }
                Edit::Devices(edit) => {
                    commit_devices(&mut devices, edit)?;
                    continue;
                }
                Edit::DropDevices(route) => {
                    let rows = (&**route, 0u8, 0u8, 0u64)..=(&**route, u8::MAX, u8::MAX, u64::MAX);
                    devices.retain_in(rows, |_, _| false)?;
                    continue;
                }
                Edit::Meta(key, value) => {
                    meta.insert(*key, *value)?;
                    continue;
                }
                Edit::Ban(network, row) => {
                    match row {
                        Some(row) => bans.insert(network.as_str(), row.as_slice())?,
                        None => bans.remove(network.as_str())?,
                    };
                    continue;
                }
            };
            for (key, counts) in changes {
                let id = (&**rule, key.to_u128());
                match counts {
                    Some(c) => {
                        table.insert(id, entry_row(rule, key.to_u128(), *window_us, *c))?;
                    }
                    None => {
                        table.remove(id)?;
                    }
                }
            }
        }
    }
    txn.commit()?;
    Ok(())
}

fn commit_cells(table: &mut redb::Table<CellKey, &[u8]>, edit: &CellRows) -> Result<(), redb::StorageError> {
    let (rule, shard, row_bits) = (&*edit.rule, edit.shard, edit.changes.row_bits);
    if edit.changes.whole {
        table.retain_in((rule, shard, 0, 0)..=(rule, shard, u8::MAX, u32::MAX), |_, _| false)?;
    }
    for chunk in &edit.changes.chunks {
        let key = (rule, shard, row_bits, chunk.chunk);
        if chunk.cells.is_empty() {
            table.remove(key)?;
        } else {
            table.insert(key, cell_chunk_bytes(key, edit.window_us, &chunk.cells).as_slice())?;
        }
    }
    Ok(())
}

fn commit_devices(
    table: &mut redb::Table<DeviceKey, DeviceValue>,
    edit: &DeviceRows,
) -> Result<(), redb::StorageError> {
    let (route, map, shard) = (&*edit.route, edit.map as u8, edit.shard);
    if edit.whole {
        table.retain_in((route, map, shard, 0)..=(route, map, shard, u64::MAX), |_, _| false)?;
    }
    for (id, row) in &edit.rows {
        let key = (route, map, shard, *id);
        match row {
            Some((expires_us, value)) => {
                table.insert(key, (*expires_us, *value, device_check(key, *expires_us, *value)))?;
            }
            None => {
                table.remove(key)?;
            }
        }
    }
    Ok(())
}
