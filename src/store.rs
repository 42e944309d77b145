//! Durable state: the only module that touches redb.
//!
//! One table, `failure_entries_v2`, maps (rule id, key digest) to the entry's
//! window length and counts. A lockout is its entry with counts at or over
//! the threshold, so restoring entries restores lockouts exactly; no raw
//! identifier is stored. Each row carries its window length because its
//! window index means nothing without it: a rule whose window changed while
//! the daemon was down re-dates its rows at start instead of misreading them.
//!
//! Writes go through a `Journal` (a channel) to one writer thread that group-
//! commits whatever has queued: a report that trips a lockout waits for its
//! commit, but the event loop never blocks on the disk, and many lockouts
//! tripped at once share one fsync.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use redb::{Database, ReadableTable, TableDefinition};

use crate::failure_window::{Change, Counts};

/// (rule id, key digest) -> (window_us, window index, previous, current).
const ENTRIES: TableDefinition<(&str, u128), (u64, u32, u32, u32)> = TableDefinition::new("failure_entries_v2");
/// Schema 1's table: the counts without their window length. Migrated at
/// open (with window length 0: "the rule's length now", as schema 1 assumed).
const ENTRIES_V1: TableDefinition<(&str, u128), (u32, u32, u32)> = TableDefinition::new("failure_entries");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const SCHEMA_VERSION: u64 = 2;

/// redb's page cache. The file holds at most the tables' caps of 12-byte
/// entries (a few MB), so a small cache keeps it hot; redb's default (1 GiB)
/// would let a flood of short-lived keys grow resident memory far beyond the
/// tables themselves.
pub const CACHE_BYTES: usize = 16 * 1024 * 1024;
/// Messages drained into one transaction at most; bounds a commit's size.
pub const GROUP_COMMIT_MESSAGES_MAX: usize = 4096;
/// Changes counted as unwritten while the disk refuses writes; beyond this
/// they are counted as dropped. (Memory is the truth: every rewrite attempt
/// writes the whole live state, so nothing queued needs to be kept.)
pub const RETRY_CHANGES_MAX: usize = 1_000_000;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state file {path} cannot be opened: {message}")]
    Open { path: PathBuf, message: String },
    #[error("state file {path} is corrupt or unreadable: {message}; start with --discard-corrupt-state to move it aside and start empty")]
    Corrupt { path: PathBuf, message: String },
    #[error("state file {path}: schema version {found} is not {SCHEMA_VERSION}")]
    Schema { path: PathBuf, found: u64 },
}

/// One persisted failure entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistedEntry {
    pub rule: String,
    pub key: u128,
    /// The window length `counts.window` is an index of; 0 for rows
    /// migrated from schema 1, which did not record it.
    pub window_us: u64,
    pub counts: Counts,
}

/// Counters the writer keeps for `tollgate status`.
#[derive(Debug, Default)]
pub struct StoreStats {
    pub commits: AtomicU64,
    pub write_failures: AtomicU64,
    pub changes_dropped: AtomicU64,
    /// Changes held in memory for retry after failed commits (0 when the
    /// state file is healthy).
    pub changes_unwritten: AtomicU64,
    /// A commit failed: the file may no longer match memory, so the whole
    /// state is to be rewritten from memory (the maintenance thread does it).
    pub needs_rewrite: std::sync::atomic::AtomicBool,
    pub last_error: Mutex<Option<String>>,
}

/// Resolves when a write is on disk (or failed to get there).
pub struct Durable(tokio::sync::oneshot::Receiver<Result<(), String>>);

impl Durable {
    fn done(result: Result<(), String>) -> Durable {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _ = tx.send(result);
        Durable(rx)
    }

    pub async fn wait(self) -> Result<(), String> {
        self.0.await.unwrap_or_else(|_| Err("state writer stopped".into()))
    }

    pub fn wait_blocking(self) -> Result<(), String> {
        self.0.blocking_recv().unwrap_or_else(|_| Err("state writer stopped".into()))
    }
}

/// One queued edit of the file, applied in the order it was queued.
enum Edit {
    /// Upserts and deletions of one rule's entries; `window_us` is the
    /// window length their counts are in.
    Entries { rule: Arc<str>, window_us: u64, changes: Vec<Change> },
    /// Every row of a rule that is not (or no longer) a configured failure
    /// rule.
    DropRule(Arc<str>),
}

impl Edit {
    /// Rows it touches, as far as is known before applying it (for logs).
    fn size(&self) -> usize {
        match self {
            Edit::Entries { changes, .. } => changes.len(),
            Edit::DropRule(_) => 1,
        }
    }
}

enum Message {
    Write {
        edit: Edit,
        ack: Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
    },
    /// Start writing a fresh file: what follows until `RewriteEnd` is the
    /// whole state, collected from memory (see `Limiter::rewrite`).
    RewriteBegin,
    /// Swap the fresh file in for the state file, if every write succeeded.
    RewriteEnd {
        ack: tokio::sync::oneshot::Sender<Result<(), String>>,
    },
    Stop,
}

/// The sending side of the writer. Cheap to clone; never blocks.
#[derive(Clone)]
pub struct Journal {
    tx: Option<Sender<Message>>,
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
            Ok(()) => Durable(rx),
            Err(_) => Durable::done(Err("state writer stopped".into())),
        }
    }

    /// Queues changes and returns what resolves once they are committed.
    pub fn write_durably(&self, rule: &Arc<str>, window_us: u64, changes: Vec<Change>) -> Durable {
        let Some(tx) = &self.tx else { return Durable::done(Ok(())) };
        let (ack, rx) = tokio::sync::oneshot::channel();
        let edit = Edit::Entries { rule: rule.clone(), window_us, changes };
        match tx.send(Message::Write { edit, ack: Some(ack) }) {
            Ok(()) => Durable(rx),
            Err(_) => Durable::done(Err("state writer stopped".into())),
        }
    }
}

pub struct Store {
    db: Database,
    path: PathBuf,
}

impl Store {
    /// Opens (or creates) the state file. A file that exists but cannot be
    /// read is an error unless `discard_corrupt`, which moves it aside.
    pub fn open(path: &Path, discard_corrupt: bool) -> Result<Store, StoreError> {
        match Self::try_open(path) {
            Ok(store) => Ok(store),
            Err(StoreError::Corrupt { message, .. }) if discard_corrupt => {
                let aside = path.with_extension(format!("corrupt-{}", std::process::id()));
                std::fs::rename(path, &aside).map_err(|e| StoreError::Open {
                    path: path.into(),
                    message: format!("cannot move corrupt file aside: {e}"),
                })?;
                tracing::warn!(state = %path.display(), moved_to = %aside.display(), %message, "discarded corrupt state file");
                Self::try_open(path)
            }
            Err(e) => Err(e),
        }
    }

    fn try_open(path: &Path) -> Result<Store, StoreError> {
        // A rewrite that a crash interrupted left only a partial fresh file;
        // the state file itself is whole (the swap is a rename).
        let _ = std::fs::remove_file(rewrite_path(path));
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| StoreError::Open { path: path.into(), message: e.to_string() })?;
        }
        let corrupt = |e: &dyn std::fmt::Display| StoreError::Corrupt { path: path.into(), message: e.to_string() };
        let existed = path.exists();
        let db = open_database(path).map_err(|e| match e {
            redb::DatabaseError::Storage(redb::StorageError::Io(io)) if !existed => {
                StoreError::Open { path: path.into(), message: io.to_string() }
            }
            other => corrupt(&other),
        })?;
        let store = Store { db, path: path.into() };
        let txn = store.db.begin_write().map_err(|e| corrupt(&e))?;
        {
            let mut meta = txn.open_table(META).map_err(|e| corrupt(&e))?;
            let found = meta.get("schema_version").map_err(|e| corrupt(&e))?.map(|v| v.value());
            match found {
                None => {
                    meta.insert("schema_version", SCHEMA_VERSION).map_err(|e| corrupt(&e))?;
                }
                Some(1) => {
                    let migrated = migrate_v1(&txn).map_err(|e| corrupt(&e))?;
                    meta.insert("schema_version", SCHEMA_VERSION).map_err(|e| corrupt(&e))?;
                    tracing::info!(state = %path.display(), rows = migrated, "state file migrated from schema 1 to 2");
                }
                Some(SCHEMA_VERSION) => {}
                Some(found) => return Err(StoreError::Schema { path: path.into(), found }),
            }
            txn.open_table(ENTRIES).map_err(|e| corrupt(&e))?;
        }
        txn.commit().map_err(|e| corrupt(&e))?;
        Ok(store)
    }

    /// Every persisted entry, for restoring at start.
    pub fn load(&self) -> Result<Vec<PersistedEntry>, StoreError> {
        let corrupt =
            |e: &dyn std::fmt::Display| StoreError::Corrupt { path: self.path.clone(), message: e.to_string() };
        let txn = self.db.begin_read().map_err(|e| corrupt(&e))?;
        let table = txn.open_table(ENTRIES).map_err(|e| corrupt(&e))?;
        let mut out = Vec::new();
        for row in table.iter().map_err(|e| corrupt(&e))? {
            let (key, value) = row.map_err(|e| corrupt(&e))?;
            let (rule, digest) = key.value();
            let (window_us, window, previous, current) = value.value();
            out.push(PersistedEntry {
                rule: rule.to_string(),
                key: digest,
                window_us,
                counts: Counts { window, previous, current },
            });
        }
        Ok(out)
    }

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

type Ack = tokio::sync::oneshot::Sender<Result<(), String>>;

fn run_writer(store: Store, rx: Receiver<Message>, stats: Arc<StoreStats>) {
    let path = store.path.clone();
    let fresh = rewrite_path(&path);
    // None after a failed commit: a database that saw an I/O error mid-commit
    // may not match memory any more, so nothing more is written to it; the
    // whole state is rewritten from memory into a fresh file instead.
    let mut db = Some(store.db);
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
        if !batch.is_empty() {
            let attempted = db.is_some() && !(rewriting && rewrite_failed);
            let result = match &db {
                Some(open) if attempted => commit(open, &batch),
                _ => Err("waiting for the state file to be rewritten from memory".to_string()),
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
                        tracing::error!(state = %path.display(), error = %message, changes, "state write failed; answering from memory, will rewrite the file from memory");
                        *stats.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(message.clone());
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
                match open_database(&fresh) {
                    Ok(open) => {
                        db = Some(open);
                        rewrite_failed = false;
                    }
                    Err(e) => {
                        tracing::error!(file = %fresh.display(), error = %e, "cannot start rewriting the state file");
                        rewrite_failed = true;
                    }
                }
            }
            Some(Message::RewriteEnd { ack }) => {
                let result =
                    if rewrite_failed { Err("rewrite failed".to_string()) } else { swap_in(&mut db, &fresh, &path) };
                rewriting = false;
                for ack in deferred.drain(..) {
                    let _ = ack.send(result.clone());
                }
                match &result {
                    Ok(()) => {
                        held = 0;
                        stats.changes_unwritten.store(0, Ordering::Relaxed);
                        stats.needs_rewrite.store(false, Ordering::Release);
                        *stats.last_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
                        tracing::warn!(state = %path.display(), "state file rewritten from memory; everything is on disk again");
                    }
                    Err(e) => {
                        db = None;
                        let _ = std::fs::remove_file(&fresh);
                        stats.needs_rewrite.store(true, Ordering::Release);
                        tracing::error!(state = %path.display(), error = %e, "state file rewrite failed; will try again");
                    }
                }
                let _ = ack.send(result);
            }
            Some(Message::Stop) => {
                for ack in deferred.drain(..) {
                    let _ = ack.send(Err("stopped before the state file rewrite finished".into()));
                }
                if held > 0 {
                    tracing::error!(changes = held, "stopping with changes that could not be written");
                }
                return;
            }
            Some(Message::Write { .. }) => unreachable!("writes are batched"),
        }
    }
}

/// Where a rewrite builds the fresh state file before it replaces the old.
fn rewrite_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".rewrite");
    path.with_file_name(name)
}

/// Closes the fresh file, renames it over the state file (atomic), makes
/// the rename durable, and opens the result as the database.
fn swap_in(db: &mut Option<Database>, fresh: &Path, path: &Path) -> Result<(), String> {
    *db = None;
    std::fs::rename(fresh, path).map_err(|e| format!("rename {}: {e}", fresh.display()))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| format!("sync {}: {e}", dir.display()))?;
    }
    *db = Some(open_database(path).map_err(|e| e.to_string())?);
    Ok(())
}

fn open_database(path: &Path) -> Result<Database, redb::DatabaseError> {
    Database::builder().set_cache_size(CACHE_BYTES).create(path)
}

/// Moves schema 1's rows into schema 2's table, inside the opening
/// transaction (so a crash mid-migration leaves schema 1 intact).
fn migrate_v1(txn: &redb::WriteTransaction) -> Result<usize, String> {
    let text = |e: &dyn std::fmt::Display| e.to_string();
    let mut rows = Vec::new();
    {
        let old = txn.open_table(ENTRIES_V1).map_err(|e| text(&e))?;
        for row in old.iter().map_err(|e| text(&e))? {
            let (key, value) = row.map_err(|e| text(&e))?;
            let (rule, digest) = key.value();
            rows.push((rule.to_string(), digest, value.value()));
        }
    }
    txn.delete_table(ENTRIES_V1).map_err(|e| text(&e))?;
    let mut new = txn.open_table(ENTRIES).map_err(|e| text(&e))?;
    for (rule, digest, (window, previous, current)) in &rows {
        new.insert((rule.as_str(), *digest), (0, *window, *previous, *current)).map_err(|e| text(&e))?;
    }
    Ok(rows.len())
}

fn commit(db: &Database, batch: &[Edit]) -> Result<(), String> {
    let txn = db.begin_write().map_err(|e| e.to_string())?;
    {
        let mut table = txn.open_table(ENTRIES).map_err(|e| e.to_string())?;
        for edit in batch {
            let (rule, window_us, changes) = match edit {
                Edit::Entries { rule, window_us, changes } => (rule, window_us, changes),
                Edit::DropRule(rule) => {
                    let rows = (&**rule, 0u128)..=(&**rule, u128::MAX);
                    table.retain_in(rows, |_, _| false).map_err(|e| e.to_string())?;
                    continue;
                }
            };
            for (key, counts) in changes {
                let id = (&**rule, key.to_u128());
                match counts {
                    Some(c) => {
                        table.insert(id, (*window_us, c.window, c.previous, c.current)).map_err(|e| e.to_string())?;
                    }
                    None => {
                        table.remove(id).map_err(|e| e.to_string())?;
                    }
                }
            }
        }
    }
    txn.commit().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Key;

    #[test]
    fn committed_entries_survive_reopening_and_removals_stick() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let rule: Arc<str> = "login/source_failures".into();
        let k1 = Key { account_tag: 1, tuple: 2 };
        let k2 = Key { account_tag: 3, tuple: 4 };
        {
            let store = Store::open(&path, false).unwrap();
            let (journal, writer) = store.start_writer(Arc::default());
            let counts = Counts { window: 7, previous: 1, current: 5 };
            journal
                .write_durably(&rule, 900_000_000, vec![(k1, Some(counts)), (k2, Some(counts))])
                .wait_blocking()
                .unwrap();
            journal.write(&rule, 900_000_000, vec![(k2, None)]);
            writer.stop();
        }
        let store = Store::open(&path, false).unwrap();
        let entries = store.load().unwrap();
        assert_eq!(
            entries,
            vec![PersistedEntry {
                rule: rule.to_string(),
                key: k1.to_u128(),
                window_us: 900_000_000,
                counts: Counts { window: 7, previous: 1, current: 5 }
            }]
        );
    }

    #[test]
    fn a_write_acknowledged_during_a_rewrite_is_in_the_file_a_restart_opens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let rule: Arc<str> = "login/source_failures".into();
        let key = Key { account_tag: 5, tuple: 6 };
        let lockout = Counts { window: 7, previous: 0, current: 5 };
        let store = Store::open(&path, false).unwrap();
        let (journal, writer) = store.start_writer(Arc::default());
        journal.rewrite_begin();
        let mut durable = journal.write_durably(&rule, 900_000_000, vec![(key, Some(lockout))]);
        std::thread::sleep(std::time::Duration::from_millis(300));
        // An ack now promises the lockout survives a crash now, and a crash
        // restarts from `path` (the half-built fresh file is discarded).
        if let Ok(result) = durable.0.try_recv() {
            result.unwrap();
            let restarted = Store::open(&path, false).unwrap().load().unwrap();
            assert!(restarted.iter().any(|e| e.key == key.to_u128()), "acknowledged, then lost by a crash");
            return;
        }
        journal.write(&rule, 900_000_000, vec![(Key { account_tag: 1, tuple: 1 }, Some(lockout))]);
        journal.rewrite_end().wait_blocking().unwrap();
        durable.wait_blocking().unwrap();
        writer.stop();
        let keys: Vec<u128> = Store::open(&path, false).unwrap().load().unwrap().iter().map(|e| e.key).collect();
        assert!(keys.contains(&key.to_u128()) && keys.len() == 2, "{keys:?}");
    }

    #[test]
    fn a_schema_1_file_is_migrated_with_its_rows_and_their_window_length_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let digest = Key { account_tag: 9, tuple: 8 }.to_u128();
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(META).unwrap().insert("schema_version", 1).unwrap();
            txn.open_table(ENTRIES_V1).unwrap().insert(("login/source_failures", digest), (7, 2, 5)).unwrap();
            txn.commit().unwrap();
        }
        let expected = vec![PersistedEntry {
            rule: "login/source_failures".into(),
            key: digest,
            window_us: 0,
            counts: Counts { window: 7, previous: 2, current: 5 },
        }];
        assert_eq!(Store::open(&path, false).unwrap().load().unwrap(), expected);
        // Migrated once: the second open finds schema 2 and the same rows.
        let store = Store::open(&path, false).unwrap();
        assert_eq!(store.load().unwrap(), expected);
        let txn = store.db.begin_read().unwrap();
        assert_eq!(txn.open_table(META).unwrap().get("schema_version").unwrap().unwrap().value(), 2);
        assert!(txn.open_table(ENTRIES_V1).is_err(), "the schema 1 table is gone");
    }

    #[test]
    fn a_corrupt_file_is_refused_unless_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        std::fs::write(&path, vec![0xAB; 8192]).unwrap();
        let err = Store::open(&path, false).err().expect("corrupt file refused");
        assert!(err.to_string().contains("--discard-corrupt-state"), "{err}");
        let store = Store::open(&path, true).unwrap();
        assert!(store.load().unwrap().is_empty());
    }
}
