//! Durable state: the only module that touches redb.
//!
//! Two tables. `failure_entries_v3` maps (rule id, key digest) to the
//! entry's window length and counts. A lockout is its entry with counts at
//! or over the threshold, so restoring entries restores lockouts exactly; no
//! raw identifier is stored. Each row carries its window length because its
//! window index means nothing without it: a rule whose window changed while
//! the daemon was down re-dates its rows at start instead of misreading them.
//! `known_devices_v3` holds each route's known (account, device) digests and
//! its per-account counts of new devices, with their expiry.
//!
//! Every row ends in a check (BLAKE2b-64 over the row), so a row a damaged
//! disk changed is dropped and counted at start instead of silently moving
//! a lockout; and `meta` records a fingerprint of the secret key the
//! digests were made with, so a state file is never paired with another key.
//! A file is checked (redb's integrity check, then every row) on an
//! in-memory copy before the real file is opened, on a thread of its own,
//! so that damage can neither panic nor hang the start, nor be "repaired"
//! into a file that the next start would read without complaint.
//!
//! Writes go through a `Journal` (a channel) to one writer thread that group-
//! commits whatever has queued: a report that trips a lockout waits for its
//! commit, but the event loop never blocks on the disk, and many lockouts
//! tripped at once share one fsync.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use blake2::digest::consts::U8;
use blake2::digest::{FixedOutput, Update};
use blake2::Blake2b;
use redb::{Database, ReadableTable, TableDefinition};

use crate::failure_window::{Change, Counts};

/// A failure entry's row: (window_us, window index, previous, current, check).
type EntryRow = (u64, u32, u32, u32, u64);
/// (rule id, key digest) -> the entry.
const ENTRIES: TableDefinition<(&str, u128), EntryRow> = TableDefinition::new("failure_entries_v3");
/// (route, map, shard, id) -> (expires_us, value, check): a known device
/// (`DeviceMap::Devices`, id the (account, device) digest's low half) or an
/// account's count of new devices (`DeviceMap::PerAccount`, id the account
/// tag). The shard is in the key so that a shard can be replaced whole.
const DEVICES: TableDefinition<DeviceKey, DeviceValue> = TableDefinition::new("known_devices_v3");
/// (route, map, shard, id).
type DeviceKey = (&'static str, u8, u8, u64);
/// (expires_us, value, check).
type DeviceValue = (u64, u16, u64);
/// Schema 2's table: the counts without a check. Migrated at open.
const ENTRIES_V2: TableDefinition<(&str, u128), (u64, u32, u32, u32)> = TableDefinition::new("failure_entries_v2");
/// Schema 1's table: the counts without their window length. Migrated at
/// open (with window length 0: "the rule's length now", as schema 1 assumed).
const ENTRIES_V1: TableDefinition<(&str, u128), (u32, u32, u32)> = TableDefinition::new("failure_entries");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const SCHEMA_VERSION: u64 = 3;
/// `meta` key of the secret key's fingerprint (`Secret::fingerprint`).
const META_KEY_FINGERPRINT: &str = "key_fingerprint";
/// Domain of the row checks: a check of one table's row never matches a
/// row of another shape.
const ROW_CHECK_DOMAIN: &[u8] = b"tollgate state row check v3";

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
/// Longest a start spends checking and reading the state file before it
/// takes the file as damaged. A healthy file at the tables' caps takes
/// about a second; a damaged one can send a tree walk in circles, and under
/// systemd a silent hang is worse than a refusal that says why.
pub const OPEN_TIMEOUT_MS: u64 = 30_000;
/// Largest state file checked at start: it is checked on an in-memory copy.
/// The tables' caps keep a real one far below (66 MiB after a flood at the
/// caps); anything larger is not a file tollgate wrote.
pub const STATE_FILE_BYTES_MAX: u64 = 1 << 30;
/// How far redb may grow the in-memory copy while checking it (a repair or
/// a migration writes a few pages); a damaged header asking for more is
/// damage, not a reason to allocate.
const COPY_GROWTH_BYTES_MAX: u64 = 256 << 20;
/// The thread that checks and opens the state file; its panics are caught
/// and reported as damage, so the panic hook keeps quiet about them.
const GUARDED_THREAD: &str = "tollgate-open-state";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state file {path} cannot be opened: {message}")]
    Open { path: PathBuf, message: String },
    #[error("state file {path} is corrupt or unreadable: {message}; start with --discard-corrupt-state to move it aside and start empty")]
    Corrupt { path: PathBuf, message: String },
    #[error("state file {path}: schema version {found} is not {SCHEMA_VERSION}")]
    Schema { path: PathBuf, found: u64 },
    #[error("state file {path} was written with another secret key (key fingerprint {found:016x}, the secret key file's is {expected:016x}): restore the secret key file it was written with, or start with --discard-corrupt-state to move the state file aside and start empty")]
    KeyMismatch { path: PathBuf, found: u64, expected: u64 },
    #[error("state file {path} holds rows from before key fingerprints were recorded, and its secret key file is missing: restore the secret key file it was written with, or start with --discard-corrupt-state to move the state file aside and start empty")]
    KeyMissing { path: PathBuf },
}

/// Why a write is not (known to be) in the state file a restart opens.
/// What `Durable` resolves to on failure; one failed group commit sends the
/// same error to every write in it, so it is `Clone`.
#[derive(Clone, Debug, thiserror::Error)]
pub enum WriteError {
    /// redb failed to commit (or to set up a fresh file): the file may no
    /// longer match memory, so it is to be rewritten from memory.
    #[error(transparent)]
    Redb(Arc<redb::Error>),
    /// An earlier commit failed; nothing is written to the state file until
    /// a rewrite from memory has replaced it.
    #[error("waiting for the state file to be rewritten from memory")]
    AwaitingRewrite,
    /// A write of the rewrite failed, so the fresh file was not swapped in.
    #[error("rewrite failed")]
    RewriteFailed,
    #[error("rename {path}: {source}")]
    Rename { path: PathBuf, source: Arc<std::io::Error> },
    #[error("sync {path}: {source}")]
    SyncDirectory { path: PathBuf, source: Arc<std::io::Error> },
    /// Committed to the fresh file of a rewrite that the stop cut short, so
    /// not in the file a restart opens.
    #[error("stopped before the state file rewrite finished")]
    StoppedMidRewrite,
    #[error("state writer stopped")]
    WriterStopped,
}

/// Every redb error a write can meet converts with `?`.
macro_rules! write_error_from_redb {
    ($($error:ty),*) => {$(
        impl From<$error> for WriteError {
            fn from(e: $error) -> WriteError {
                WriteError::Redb(Arc::new(e.into()))
            }
        }
    )*};
}
write_error_from_redb!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

impl StoreError {
    fn corrupt(path: &Path, message: impl std::fmt::Display) -> StoreError {
        // One line: redb's messages can span several, and a refusal is read
        // in a journal one line at a time.
        let message = message.to_string().split_whitespace().collect::<Vec<_>>().join(" ");
        StoreError::Corrupt { path: path.into(), message }
    }
}

/// How to open the state file.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// Move a damaged file, or one written with another secret key, aside
    /// and start empty instead of refusing to start.
    pub discard_corrupt: bool,
    /// The secret key's fingerprint: a file holding rows under another
    /// fingerprint is refused; a file without one (written before it was
    /// recorded) or without rows adopts it. `None` checks nothing (tools).
    pub key_fingerprint: Option<u64>,
    /// The key was made just now (its file was missing): a file with rows
    /// but no fingerprint cannot adopt it, since its rows were made with a
    /// key that is lost.
    pub key_is_new: bool,
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

/// Which of a route's known-device maps a row belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceMap {
    /// Known (account, device) digests.
    Devices = 0,
    /// New devices made known per account (by account tag).
    PerAccount = 1,
}

impl DeviceMap {
    fn from_u8(value: u8) -> Option<DeviceMap> {
        match value {
            0 => Some(DeviceMap::Devices),
            1 => Some(DeviceMap::PerAccount),
            _ => None,
        }
    }
}

/// One persisted known-device row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistedDevice {
    pub route: String,
    pub map: DeviceMap,
    /// The shard it was written from (a row is replaced with its shard).
    pub shard: u8,
    pub id: u64,
    pub expires_us: u64,
    /// The per-account count; 0 for a device.
    pub value: u16,
}

/// Changes to one shard of a route's known-device map: `whole` replaces
/// every row of the shard with `rows` (its change list overflowed);
/// otherwise each row is set (`Some((expires_us, value))`) or deleted.
#[derive(Clone, Debug)]
pub struct DeviceRows {
    pub route: Arc<str>,
    pub map: DeviceMap,
    pub shard: u8,
    pub whole: bool,
    pub rows: Vec<DeviceChange>,
}

/// A known-device row set (`Some((expires_us, value))`) or deleted.
pub type DeviceChange = (u64, Option<(u64, u16)>);

/// Everything read from the state file at start.
#[derive(Debug, Default)]
pub struct Loaded {
    pub entries: Vec<PersistedEntry>,
    pub devices: Vec<PersistedDevice>,
    /// Rows whose check did not match (a damaged disk): dropped, and
    /// deleted from the file.
    pub damaged_rows: usize,
}

/// An opened state file and what it held.
pub struct Opened {
    pub store: Store,
    pub loaded: Loaded,
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
pub struct Durable(tokio::sync::oneshot::Receiver<Result<(), WriteError>>);

impl Durable {
    fn done(result: Result<(), WriteError>) -> Durable {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _ = tx.send(result);
        Durable(rx)
    }

    pub async fn wait(self) -> Result<(), WriteError> {
        self.0.await.unwrap_or(Err(WriteError::WriterStopped))
    }

    pub fn wait_blocking(self) -> Result<(), WriteError> {
        self.0.blocking_recv().unwrap_or(Err(WriteError::WriterStopped))
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
    /// Changes to one shard of a route's known devices.
    Devices(DeviceRows),
    /// Every known-device row of a route that keeps none (any more).
    DropDevices(Arc<str>),
}

impl Edit {
    /// Rows it touches, as far as is known before applying it (for logs).
    fn size(&self) -> usize {
        match self {
            Edit::Entries { changes, .. } => changes.len(),
            Edit::DropRule(_) | Edit::DropDevices(_) => 1,
            Edit::Devices(d) => d.rows.len(),
        }
    }
}

enum Message {
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

    /// Queues changes to a shard of a route's known devices; with
    /// `durable`, returns what resolves once they are committed.
    pub fn write_devices(&self, rows: DeviceRows, durable: bool) -> Option<Durable> {
        let tx = self.tx.as_ref()?;
        let edit = Edit::Devices(rows);
        if !durable {
            let _ = tx.send(Message::Write { edit, ack: None });
            return None;
        }
        let (ack, rx) = tokio::sync::oneshot::channel();
        Some(match tx.send(Message::Write { edit, ack: Some(ack) }) {
            Ok(()) => Durable(rx),
            Err(_) => Durable::done(Err(WriteError::WriterStopped)),
        })
    }

    /// Queues the deletion of every known-device row of `route`: a route
    /// that keeps no known devices (any more).
    pub fn drop_devices(&self, route: &str) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Message::Write { edit: Edit::DropDevices(route.into()), ack: None });
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
            Err(_) => Durable::done(Err(WriteError::WriterStopped)),
        }
    }

    /// Queues changes and returns what resolves once they are committed.
    pub fn write_durably(&self, rule: &Arc<str>, window_us: u64, changes: Vec<Change>) -> Durable {
        let Some(tx) = &self.tx else { return Durable::done(Ok(())) };
        let (ack, rx) = tokio::sync::oneshot::channel();
        let edit = Edit::Entries { rule: rule.clone(), window_us, changes };
        match tx.send(Message::Write { edit, ack: Some(ack) }) {
            Ok(()) => Durable(rx),
            Err(_) => Durable::done(Err(WriteError::WriterStopped)),
        }
    }
}

pub struct Store {
    /// Held for as long as the store lives (the writer thread's life): redb's
    /// own lock on the state file lapses while the writer has closed it
    /// (after a failed write, until a rewrite swaps a fresh file in), and a
    /// second daemon must not open the file then.
    _lock: Option<nix::fcntl::Flock<std::fs::File>>,
    db: Database,
    path: PathBuf,
    /// Written into a fresh file when the state is rewritten from memory.
    key_fingerprint: Option<u64>,
}

impl Store {
    /// Opens (or creates) the state file without a key check (tests and
    /// tools; the daemon uses `open_with`).
    pub fn open(path: &Path, discard_corrupt: bool) -> Result<Store, StoreError> {
        Self::open_with(path, OpenOptions { discard_corrupt, key_fingerprint: None, key_is_new: false })
            .map(|opened| opened.store)
    }

    /// Opens the state file, creating it only if it does not exist, and
    /// reads every row. A file that is damaged, or holds rows made with
    /// another secret key, is an error unless `discard_corrupt`, which moves
    /// it aside and starts empty.
    pub fn open_with(path: &Path, options: OpenOptions) -> Result<Opened, StoreError> {
        let lock = lock_for_life(path)?;
        let mut opened = Self::open_unlocked(path, options)?;
        opened.store._lock = Some(lock);
        Ok(opened)
    }

    fn open_unlocked(path: &Path, options: OpenOptions) -> Result<Opened, StoreError> {
        match Self::try_open(path, options.key_fingerprint, options.key_is_new) {
            Ok(opened) => Ok(opened),
            Err(e @ (StoreError::Corrupt { .. } | StoreError::KeyMismatch { .. } | StoreError::KeyMissing { .. }))
                if options.discard_corrupt =>
            {
                let aside = unused_path(path.with_extension(format!("corrupt-{}", std::process::id())));
                std::fs::rename(path, &aside).map_err(|e| StoreError::Open {
                    path: path.into(),
                    message: format!("cannot move the damaged file aside: {e}"),
                })?;
                tracing::warn!(state = %path.display(), moved_to = %aside.display(), error = %e, "discarded the state file; starting empty");
                Self::try_open(path, options.key_fingerprint, options.key_is_new)
            }
            Err(e) => Err(e),
        }
    }

    fn try_open(path: &Path, key_fingerprint: Option<u64>, key_is_new: bool) -> Result<Opened, StoreError> {
        // A rewrite that a crash interrupted left only a partial fresh file;
        // the state file itself is whole (the swap is a rename).
        let _ = std::fs::remove_file(rewrite_path(path));
        let open_err = |message: String| StoreError::Open { path: path.into(), message };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| open_err(e.to_string()))?;
        }
        match std::fs::metadata(path) {
            // Only a missing file is a fresh start.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let db = open_database(path).map_err(|e| open_err(e.to_string()))?;
                let loaded = prepare(&db, path, key_fingerprint, key_is_new)?;
                return Ok(Opened { store: Store { _lock: None, db, path: path.into(), key_fingerprint }, loaded });
            }
            Err(e) => return Err(open_err(e.to_string())),
            Ok(meta) if meta.len() == 0 => {
                return Err(StoreError::corrupt(path, "the file is empty (0 bytes): tollgate never writes an empty state file, so it was truncated; only a missing file is a fresh start"));
            }
            Ok(meta) if meta.len() > STATE_FILE_BYTES_MAX => {
                let message = format!("{} bytes, more than any state file tollgate writes", meta.len());
                return Err(StoreError::corrupt(path, message));
            }
            Ok(_) => {}
        }
        ensure_not_in_use(path)?;
        let bytes = std::fs::read(path).map_err(|e| open_err(e.to_string()))?;
        // Check a copy first: redb's integrity check repairs what it can by
        // writing, and a file that is refused must stay as it was found (or
        // the next start would read the "repaired" file without a word).
        let at = path.to_path_buf();
        guarded(path, move || {
            let copy = MemoryCopy::new(bytes);
            let mut db = Database::builder()
                .set_cache_size(CACHE_BYTES)
                .create_with_backend(copy)
                .map_err(|e| StoreError::corrupt(&at, e))?;
            match db.check_integrity() {
                Ok(true) => {}
                Ok(false) => {
                    return Err(StoreError::corrupt(&at, "a page failed redb's integrity check (redb could only roll the file back to an earlier commit)"));
                }
                Err(e) => return Err(StoreError::corrupt(&at, e)),
            }
            prepare(&db, &at, key_fingerprint, key_is_new).map(|_| ())
        })?;
        let at = path.to_path_buf();
        let opened = guarded(path, move || {
            let db = Database::builder().set_cache_size(CACHE_BYTES).open(&at).map_err(|e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => {
                    StoreError::Open { path: at.clone(), message: "in use by a running daemon".into() }
                }
                other => StoreError::corrupt(&at, other),
            })?;
            let loaded = prepare(&db, &at, key_fingerprint, key_is_new)?;
            if loaded.damaged_rows > 0 {
                tracing::warn!(state = %at.display(), rows = loaded.damaged_rows, "state file rows failed their check (a damaged disk); dropped and deleted");
            }
            Ok(Opened { store: Store { _lock: None, db, path: at, key_fingerprint }, loaded })
        });
        // The copy passed every check, so what fails now is the disk (full,
        // read-only, an I/O error), not the file: never a reason to discard
        // it, whatever the flag says.
        opened.map_err(|e| match e {
            StoreError::Corrupt { path, message } => StoreError::Open {
                path,
                message: format!("the file passed its checks but could not be opened for writing (is the disk full or read-only?); it is left as it is: {message}"),
            },
            other => other,
        })
    }

    /// Every persisted failure entry whose check matches.
    pub fn load(&self) -> Result<Vec<PersistedEntry>, StoreError> {
        self.load_all().map(|loaded| loaded.entries)
    }

    /// Every row whose check matches, and how many did not.
    pub fn load_all(&self) -> Result<Loaded, StoreError> {
        let corrupt = |e: &dyn std::fmt::Display| StoreError::corrupt(&self.path, e);
        let txn = self.db.begin_read().map_err(|e| corrupt(&e))?;
        let entries = txn.open_table(ENTRIES).map_err(|e| corrupt(&e))?;
        let devices = match txn.open_table(DEVICES) {
            Ok(table) => Some(table),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(corrupt(&e)),
        };
        let (loaded, _) = read_rows(&entries, devices.as_ref()).map_err(|e| corrupt(&e))?;
        Ok(loaded)
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

/// Rows to delete: their check did not match.
struct DamagedRows {
    entries: Vec<(String, u128)>,
    devices: Vec<(String, u8, u8, u64)>,
}

/// Reads both tables, checking every row.
fn read_rows<E, D>(entries: &E, devices: Option<&D>) -> Result<(Loaded, DamagedRows), redb::StorageError>
where
    E: ReadableTable<(&'static str, u128), EntryRow>,
    D: ReadableTable<DeviceKey, DeviceValue>,
{
    let mut loaded = Loaded::default();
    let mut damaged = DamagedRows { entries: Vec::new(), devices: Vec::new() };
    for row in entries.iter()? {
        let (key, value) = row?;
        let (rule, digest) = key.value();
        let (window_us, window, previous, current, check) = value.value();
        if check != entry_check(rule, digest, (window_us, window, previous, current)) {
            damaged.entries.push((rule.to_string(), digest));
            continue;
        }
        let counts = Counts { window, previous, current };
        loaded.entries.push(PersistedEntry { rule: rule.to_string(), key: digest, window_us, counts });
    }
    for row in devices.map(|d| d.iter()).transpose()?.into_iter().flatten() {
        let (key, value) = row?;
        let (route, map, shard, id) = key.value();
        let (expires_us, count, check) = value.value();
        let map_known = DeviceMap::from_u8(map);
        if check != device_check((route, map, shard, id), expires_us, count) || map_known.is_none() {
            damaged.devices.push((route.to_string(), map, shard, id));
            continue;
        }
        loaded.devices.push(PersistedDevice {
            route: route.to_string(),
            map: map_known.expect("checked above"),
            shard,
            id,
            expires_us,
            value: count,
        });
    }
    loaded.damaged_rows = damaged.entries.len() + damaged.devices.len();
    Ok((loaded, damaged))
}

/// BLAKE2b-64 over a row. Unkeyed: it detects damage, not forgery (anyone
/// who can write the file can stop the daemon anyway).
fn row_check(parts: &[&[u8]]) -> u64 {
    let mut hash = Blake2b::<U8>::default();
    Update::update(&mut hash, ROW_CHECK_DOMAIN);
    for part in parts {
        Update::update(&mut hash, &(part.len() as u32).to_le_bytes());
        Update::update(&mut hash, part);
    }
    u64::from_le_bytes(hash.finalize_fixed().into())
}

fn entry_check(rule: &str, digest: u128, (window_us, window, previous, current): (u64, u32, u32, u32)) -> u64 {
    row_check(&[
        b"entry",
        rule.as_bytes(),
        &digest.to_le_bytes(),
        &window_us.to_le_bytes(),
        &window.to_le_bytes(),
        &previous.to_le_bytes(),
        &current.to_le_bytes(),
    ])
}

fn device_check((route, map, shard, id): (&str, u8, u8, u64), expires_us: u64, value: u16) -> u64 {
    row_check(&[
        b"device",
        route.as_bytes(),
        &[map, shard],
        &id.to_le_bytes(),
        &expires_us.to_le_bytes(),
        &value.to_le_bytes(),
    ])
}

fn entry_row(rule: &str, digest: u128, window_us: u64, counts: Counts) -> EntryRow {
    let check = entry_check(rule, digest, (window_us, counts.window, counts.previous, counts.current));
    (window_us, counts.window, counts.previous, counts.current, check)
}

/// In one write transaction: checks the schema (migrating older ones) and
/// the key fingerprint, reads every row, and deletes the rows whose check
/// fails. Nothing is committed unless all of it succeeds.
fn prepare(db: &Database, path: &Path, key_fingerprint: Option<u64>, key_is_new: bool) -> Result<Loaded, StoreError> {
    let corrupt = |e: &dyn std::fmt::Display| StoreError::corrupt(path, e);
    let mut txn = db.begin_write().map_err(|e| corrupt(&e))?;
    txn.set_two_phase_commit(true);
    let loaded = {
        let mut meta = txn.open_table(META).map_err(|e| corrupt(&e))?;
        let found = meta.get("schema_version").map_err(|e| corrupt(&e))?.map(|v| v.value());
        match found {
            None => {
                meta.insert("schema_version", SCHEMA_VERSION).map_err(|e| corrupt(&e))?;
            }
            Some(old @ (1 | 2)) => {
                let migrated = migrate_to_v3(&txn).map_err(|e| corrupt(&e))?;
                meta.insert("schema_version", SCHEMA_VERSION).map_err(|e| corrupt(&e))?;
                tracing::info!(state = %path.display(), rows = migrated, "state file migrated from schema {old} to {SCHEMA_VERSION}");
            }
            Some(SCHEMA_VERSION) => {}
            Some(found) => return Err(StoreError::Schema { path: path.into(), found }),
        }
        let mut entries = txn.open_table(ENTRIES).map_err(|e| corrupt(&e))?;
        let mut devices = txn.open_table(DEVICES).map_err(|e| corrupt(&e))?;
        let (loaded, damaged) = read_rows(&entries, Some(&devices)).map_err(|e| corrupt(&e))?;
        for (rule, digest) in &damaged.entries {
            entries.remove((rule.as_str(), *digest)).map_err(|e| corrupt(&e))?;
        }
        for (route, map, shard, id) in &damaged.devices {
            devices.remove((route.as_str(), *map, *shard, *id)).map_err(|e| corrupt(&e))?;
        }
        if let Some(expected) = key_fingerprint {
            let rows = loaded.entries.len() + loaded.devices.len();
            let found = meta.get(META_KEY_FINGERPRINT).map_err(|e| corrupt(&e))?.map(|v| v.value());
            match found {
                Some(found) if found == expected => {}
                // Rows made with another key: nobody can match or unlock them.
                Some(found) if rows > 0 => return Err(StoreError::KeyMismatch { path: path.into(), found, expected }),
                // Rows from before fingerprints, and the key they were made
                // with is gone: adopting the new one would keep locks that
                // nobody can match or unlock.
                None if rows > 0 && key_is_new => return Err(StoreError::KeyMissing { path: path.into() }),
                // A file from before fingerprints adopts the key it is
                // opened with (its rows were made with the key in use); an
                // empty one has nothing to lose.
                _ => {
                    meta.insert(META_KEY_FINGERPRINT, expected).map_err(|e| corrupt(&e))?;
                }
            }
        }
        loaded
    };
    txn.commit().map_err(|e| corrupt(&e))?;
    Ok(loaded)
}

/// A fresh file (a rewrite from memory) says what it is before any row.
fn init_fresh(db: &Database, key_fingerprint: Option<u64>) -> Result<(), WriteError> {
    let mut txn = db.begin_write()?;
    // Two-phase: after a crash, redb otherwise falls back to the older
    // commit slot when the newer one reads as damaged, silently rolling
    // back an acknowledged lockout; with it, that damage is refused.
    txn.set_two_phase_commit(true);
    {
        let mut meta = txn.open_table(META)?;
        meta.insert("schema_version", SCHEMA_VERSION)?;
        if let Some(fingerprint) = key_fingerprint {
            meta.insert(META_KEY_FINGERPRINT, fingerprint)?;
        }
    }
    txn.commit()?;
    Ok(())
}

/// Refuses a file another process holds open (redb's lock), before the
/// file is read: a copy read under a live writer could look damaged, and
/// `--discard-corrupt-state` would then move a live daemon's file aside.
/// `path`, or the first of `path.1`, `path.2`, ... that does not exist: a
/// PID repeats (PID 1 in a container, after a reboot), and a file moved
/// aside before must not be replaced.
fn unused_path(path: PathBuf) -> PathBuf {
    let mut candidate = path.clone();
    let mut n = 0u32;
    while candidate.symlink_metadata().is_ok() {
        n += 1;
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".{n}"));
        candidate = PathBuf::from(name);
    }
    candidate
}

/// Takes `STATE.lock` (created if missing) for the life of the store: one
/// daemon per state file, including while the state file itself is closed
/// for a rewrite.
fn lock_for_life(path: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, StoreError> {
    use nix::fcntl::{Flock, FlockArg};
    let open_err = |message: String| StoreError::Open { path: path.into(), message };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| open_err(e.to_string()))?;
    }
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| open_err(format!("cannot open its lock file: {e}")))?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| match errno {
        nix::errno::Errno::EWOULDBLOCK => open_err("in use by a running daemon".into()),
        other => open_err(format!("cannot lock its lock file: {other}")),
    })
}

fn ensure_not_in_use(path: &Path) -> Result<(), StoreError> {
    use nix::fcntl::{Flock, FlockArg};
    let Ok(file) = std::fs::File::open(path) else { return Ok(()) };
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(_unlocked_on_drop) => Ok(()),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
            Err(StoreError::Open { path: path.into(), message: "in use by a running daemon".into() })
        }
        // Let redb's own open decide.
        Err(_) => Ok(()),
    }
}

/// Runs `work` (reading the state file) on a thread of its own and turns a
/// panic or a hang into a `Corrupt` error: a damaged file must never take
/// the daemon down (under systemd, a crash loop while login fails open).
/// A hung reader is left behind: the start either stops (refused) or goes
/// on with a fresh file, and the thread only holds an in-memory copy.
fn guarded<T: Send + 'static>(
    path: &Path,
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    guarded_for(path, Duration::from_millis(OPEN_TIMEOUT_MS), work)
}

fn guarded_for<T: Send + 'static>(
    path: &Path,
    timeout: Duration,
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    quiet_guarded_panics();
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name(GUARDED_THREAD.into())
        .spawn(move || {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)));
        })
        .map_err(|e| StoreError::Open { path: path.into(), message: format!("cannot start a thread: {e}") })?;
    match rx.recv_timeout(timeout) {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no message");
            Err(StoreError::corrupt(path, format!("reading it panicked in redb ({what})")))
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            Err(StoreError::corrupt(path, format!("reading it did not finish within {} ms", timeout.as_millis())))
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err(StoreError::corrupt(path, "reading it stopped without an answer"))
        }
    }
}

/// A panic on the guarded thread is reported as one line by `guarded`; the
/// default hook would print a backtrace prompt before it. Other threads'
/// panics go to the previous hook as before.
fn quiet_guarded_panics() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() != Some(GUARDED_THREAD) {
                previous(info);
            }
        }));
    });
}

/// The state file's bytes in memory, for redb to check (and repair, if it
/// must) without writing to the file.
#[derive(Debug)]
struct MemoryCopy {
    bytes: RwLock<Vec<u8>>,
    len_max: u64,
}

impl MemoryCopy {
    fn new(bytes: Vec<u8>) -> MemoryCopy {
        let len_max = bytes.len() as u64 + COPY_GROWTH_BYTES_MAX;
        MemoryCopy { bytes: RwLock::new(bytes), len_max }
    }

    fn range(&self, offset: u64, len: usize, have: usize) -> std::io::Result<std::ops::Range<usize>> {
        let start = usize::try_from(offset).ok();
        match start.and_then(|s| Some(s..s.checked_add(len)?)) {
            Some(range) if range.end <= have => Ok(range),
            _ => Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "read past the end of the file")),
        }
    }
}

impl redb::StorageBackend for MemoryCopy {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.bytes.read().unwrap_or_else(|e| e.into_inner()).len() as u64)
    }

    fn read(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let bytes = self.bytes.read().unwrap_or_else(|e| e.into_inner());
        Ok(bytes[self.range(offset, len, bytes.len())?].to_vec())
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        if len > self.len_max {
            return Err(std::io::Error::other("the file would grow past any size a state file has"));
        }
        self.bytes.write().unwrap_or_else(|e| e.into_inner()).resize(len as usize, 0);
        Ok(())
    }

    fn sync_data(&self, _eventual: bool) -> std::io::Result<()> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let mut bytes = self.bytes.write().unwrap_or_else(|e| e.into_inner());
        let end = offset.saturating_add(data.len() as u64);
        if end > bytes.len() as u64 {
            if end > self.len_max {
                return Err(std::io::Error::other("the file would grow past any size a state file has"));
            }
            bytes.resize(end as usize, 0);
        }
        let range = self.range(offset, data.len(), bytes.len())?;
        bytes[range].copy_from_slice(data);
        Ok(())
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

type Ack = tokio::sync::oneshot::Sender<Result<(), WriteError>>;

fn run_writer(store: Store, rx: Receiver<Message>, stats: Arc<StoreStats>) {
    let path = store.path.clone();
    let key_fingerprint = store.key_fingerprint;
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
                        tracing::error!(state = %path.display(), error = %message, changes, "state write failed; answering from memory, will rewrite the file from memory");
                        *stats.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(message.to_string());
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
                    init_fresh(&open, key_fingerprint)?;
                    Ok(open)
                }) {
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
                    let _ = ack.send(Err(WriteError::StoppedMidRewrite));
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

fn open_database(path: &Path) -> Result<Database, redb::DatabaseError> {
    Database::builder().set_cache_size(CACHE_BYTES).create(path)
}

/// Moves schema 1's and schema 2's rows into schema 3's table, each with
/// its check, inside the opening transaction (so a crash mid-migration
/// leaves the old schema intact).
fn migrate_to_v3(txn: &redb::WriteTransaction) -> Result<usize, String> {
    let text = |e: &dyn std::fmt::Display| e.to_string();
    let mut rows: Vec<(String, u128, u64, Counts)> = Vec::new();
    {
        let old = txn.open_table(ENTRIES_V1).map_err(|e| text(&e))?;
        for row in old.iter().map_err(|e| text(&e))? {
            let (key, value) = row.map_err(|e| text(&e))?;
            let (rule, digest) = key.value();
            let (window, previous, current) = value.value();
            rows.push((rule.to_string(), digest, 0, Counts { window, previous, current }));
        }
    }
    {
        let old = txn.open_table(ENTRIES_V2).map_err(|e| text(&e))?;
        for row in old.iter().map_err(|e| text(&e))? {
            let (key, value) = row.map_err(|e| text(&e))?;
            let (rule, digest) = key.value();
            let (window_us, window, previous, current) = value.value();
            rows.push((rule.to_string(), digest, window_us, Counts { window, previous, current }));
        }
    }
    txn.delete_table(ENTRIES_V1).map_err(|e| text(&e))?;
    txn.delete_table(ENTRIES_V2).map_err(|e| text(&e))?;
    let mut new = txn.open_table(ENTRIES).map_err(|e| text(&e))?;
    for (rule, digest, window_us, counts) in &rows {
        new.insert((rule.as_str(), *digest), entry_row(rule, *digest, *window_us, *counts)).map_err(|e| text(&e))?;
    }
    Ok(rows.len())
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
        for edit in batch {
            let (rule, window_us, changes) = match edit {
                Edit::Entries { rule, window_us, changes } => (rule, window_us, changes),
                Edit::DropRule(rule) => {
                    let rows = (&**rule, 0u128)..=(&**rule, u128::MAX);
                    table.retain_in(rows, |_, _| false)?;
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
        assert_eq!(txn.open_table(META).unwrap().get("schema_version").unwrap().unwrap().value(), SCHEMA_VERSION);
        assert!(txn.open_table(ENTRIES_V1).is_err(), "the schema 1 table is gone");
    }

    /// A schema 2 file (no row checks, no key fingerprint) as the previous
    /// version wrote it.
    fn schema_2_file(path: &Path, digest: u128) {
        let db = Database::create(path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META).unwrap().insert("schema_version", 2).unwrap();
        txn.open_table(ENTRIES_V2).unwrap().insert(("login/source_failures", digest), (60_000_000, 7, 2, 5)).unwrap();
        txn.commit().unwrap();
    }

    #[test]
    fn a_schema_2_file_is_migrated_with_checks_and_adopts_the_key_it_is_opened_with() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let digest = Key { account_tag: 9, tuple: 8 }.to_u128();
        schema_2_file(&path, digest);
        let expected = vec![PersistedEntry {
            rule: "login/source_failures".into(),
            key: digest,
            window_us: 60_000_000,
            counts: Counts { window: 7, previous: 2, current: 5 },
        }];
        let keyed =
            |fingerprint| OpenOptions { discard_corrupt: false, key_fingerprint: Some(fingerprint), key_is_new: false };
        let opened = Store::open_with(&path, keyed(0xA)).unwrap();
        assert_eq!((&opened.loaded.entries, opened.loaded.damaged_rows), (&expected, 0));
        drop(opened);
        // Migrated, with the fingerprint recorded: the same key opens it,
        // another is refused (and the file is left as it was).
        assert_eq!(Store::open_with(&path, keyed(0xA)).unwrap().loaded.entries, expected);
        let before = std::fs::read(&path).unwrap();
        let err = Store::open_with(&path, keyed(0xB)).err().expect("another key is refused");
        assert!(matches!(err, StoreError::KeyMismatch { found: 0xA, expected: 0xB, .. }), "{err}");
        assert!(err.to_string().contains("--discard-corrupt-state"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), before, "a refused file is not written to");
        let txn = Store::open(&path, false).unwrap().db.begin_read().unwrap();
        assert!(txn.open_table(ENTRIES_V2).is_err(), "the schema 2 table is gone");
    }

    #[test]
    fn a_file_moved_aside_never_replaces_an_earlier_one() {
        // Found by review: `STATE.corrupt-PID` was made by a rename that
        // replaces, and PIDs repeat.
        let dir = tempfile::tempdir().unwrap();
        let aside = dir.path().join("state.corrupt-1");
        assert_eq!(unused_path(aside.clone()), aside);
        std::fs::write(&aside, b"earlier").unwrap();
        std::fs::write(dir.path().join("state.corrupt-1.1"), b"earlier too").unwrap();
        assert_eq!(unused_path(aside), dir.path().join("state.corrupt-1.2"));
    }

    #[test]
    fn a_schema_2_file_with_rows_refuses_a_key_made_just_now() {
        // Found by review: with its secret key file missing, a schema 2
        // file (rows, no fingerprint) adopted the newly made key, keeping
        // locks nobody could match or unlock.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        schema_2_file(&path, Key { account_tag: 9, tuple: 8 }.to_u128());
        let new_key = OpenOptions { discard_corrupt: false, key_fingerprint: Some(0xC), key_is_new: true };
        let err = Store::open_with(&path, new_key).err().expect("refused");
        assert!(matches!(err, StoreError::KeyMissing { .. }), "{err}");
        assert!(err.to_string().contains("--discard-corrupt-state"), "{err}");
        let discard = OpenOptions { discard_corrupt: true, ..new_key };
        assert!(Store::open_with(&path, discard).unwrap().loaded.entries.is_empty(), "moved aside with the flag");
    }

    #[test]
    fn a_file_without_rows_adopts_any_key_and_with_the_flag_another_keys_file_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let keyed = |fingerprint, discard_corrupt| OpenOptions {
            discard_corrupt,
            key_fingerprint: Some(fingerprint),
            key_is_new: false,
        };
        drop(Store::open_with(&path, keyed(1, false)).unwrap());
        drop(Store::open_with(&path, keyed(2, false)).expect("nothing to lose"));
        schema_2_file(&dir.path().join("other.redb"), 5);
        let other = dir.path().join("other.redb");
        drop(Store::open_with(&other, keyed(3, false)).unwrap());
        let opened = Store::open_with(&other, keyed(4, true)).expect("moved aside");
        assert!(opened.loaded.entries.is_empty());
        let aside = other.with_extension(format!("corrupt-{}", std::process::id()));
        assert!(aside.exists());
    }

    #[test]
    fn a_row_whose_check_fails_is_dropped_counted_and_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let rule: Arc<str> = "login/source_failures".into();
        let (good, bad) = (Key { account_tag: 1, tuple: 2 }, Key { account_tag: 3, tuple: 4 });
        let counts = Counts { window: 7, previous: 0, current: 5 };
        {
            let store = Store::open(&path, false).unwrap();
            let (journal, writer) = store.start_writer(Arc::default());
            journal.write_durably(&rule, 1, vec![(good, Some(counts)), (bad, Some(counts))]).wait_blocking().unwrap();
            let devices = DeviceRows {
                route: "login".into(),
                map: DeviceMap::Devices,
                shard: 3,
                whole: false,
                rows: vec![(11, Some((99, 0))), (12, Some((99, 0)))],
            };
            journal.write_devices(devices, true).unwrap().wait_blocking().unwrap();
            writer.stop();
        }
        {
            // What a flipped bit in a row looks like: the value changed
            // under its check.
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut table = txn.open_table(ENTRIES).unwrap();
                let (w, win, p, _, check) =
                    table.get(("login/source_failures", bad.to_u128())).unwrap().unwrap().value();
                table.insert(("login/source_failures", bad.to_u128()), (w, win, p, 1, check)).unwrap();
                let mut devices = txn.open_table(DEVICES).unwrap();
                let (expires, value, check) = devices.get(("login", 0, 3, 12)).unwrap().unwrap().value();
                devices.insert(("login", 0, 3, 12), (expires ^ 1 << 40, value, check)).unwrap();
            }
            txn.commit().unwrap();
        }
        let opened = Store::open_with(&path, OpenOptions::default()).unwrap();
        assert_eq!(opened.loaded.damaged_rows, 2);
        assert_eq!(opened.loaded.entries.iter().map(|e| e.key).collect::<Vec<_>>(), vec![good.to_u128()]);
        assert_eq!(opened.loaded.devices.iter().map(|d| d.id).collect::<Vec<_>>(), vec![11]);
        assert_eq!(opened.store.load_all().unwrap().damaged_rows, 0, "deleted from the file");
    }

    #[test]
    fn an_empty_or_truncated_file_is_damage_not_a_fresh_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        {
            let store = Store::open(&path, false).unwrap();
            let (journal, writer) = store.start_writer(Arc::default());
            let lockout = Counts { window: 7, previous: 0, current: 5 };
            let keys = (0..500u64).map(|n| (Key { account_tag: n, tuple: n }, Some(lockout))).collect();
            journal.write_durably(&"login/source_failures".into(), 1, keys).wait_blocking().unwrap();
            writer.stop();
        }
        let good = std::fs::read(&path).unwrap();
        for len in [0, 1, 100, 511, 512, 4096, good.len() / 2, good.len() - 1] {
            std::fs::write(&path, &good[..len]).unwrap();
            let err = Store::open(&path, false).err().unwrap_or_else(|| panic!("a {len}-byte cut opened"));
            assert!(matches!(err, StoreError::Corrupt { .. }), "{len}: {err}");
            assert!(!err.to_string().contains('\n'), "one line: {err}");
            assert_eq!(std::fs::read(&path).unwrap().len(), len, "left as it was");
            assert!(Store::open(&path, true).unwrap().load().unwrap().is_empty());
        }
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

    #[test]
    fn a_panic_or_a_hang_while_reading_is_a_one_line_refusal() {
        let path = Path::new("/var/lib/tollgate/state.redb");
        let panicked = guarded_for(path, Duration::from_secs(5), || -> Result<(), StoreError> {
            panic!("assertion failed: storage.raw_file_len()? >= header.layout().len()\nmore")
        });
        let err = panicked.expect_err("a panic is an error");
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("panicked") && text.contains("--discard-corrupt-state") && !text.contains('\n'),
            "{text}"
        );
        let started = std::time::Instant::now();
        let hung = guarded_for(path, Duration::from_millis(100), || -> Result<(), StoreError> {
            std::thread::sleep(Duration::from_secs(3));
            Ok(())
        });
        let err = hung.expect_err("a hang is an error");
        assert!(err.to_string().contains("did not finish within 100 ms"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2), "not waited out");
    }
}
