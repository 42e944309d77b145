//! Durable state: the only module that touches redb.
//!
//! Four tables. `failure_entries_v3` maps (rule id, key digest) to the
//! entry's window length and counts. A lockout is its entry with counts at
//! or over the threshold, so restoring entries restores lockouts exactly; no
//! raw identifier is stored. Each row carries its window length because its
//! window index means nothing without it: a rule whose window changed while
//! the daemon was down re-dates its rows at start instead of misreading them.
//! `known_devices_v3` holds each route's known (account, device) digests and
//! its per-account counts of new devices, with their expiry.
//! `overflow_cells_v1` holds the cells of each rule's overflow sketches at
//! the rule's threshold, so a lockout of a key its full table could not
//! hold survives too. `bans_v1` holds the operator's bans, by network.
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
//!
//! The files, split by what changes together:
//! - `mod.rs` (here): the public types, the error types, and `Store`'s open
//!   and load API.
//! - `schema.rs`: the tables, a row's layout and its check, and the
//!   migrations from older schemas.
//! - `start_checks.rs`: what a start does before it trusts the file: the
//!   lock, the checks on an in-memory copy (redb's integrity check, every
//!   row's check, the key fingerprint) on a guarded thread, and moving a
//!   refused file aside.
//! - `journal.rs`: the handle side, `Journal` and `Durable`, which the rest
//!   of the daemon holds.
//! - `writer.rs`: the writer thread: group commits, two-phase commits, the
//!   rewrite from memory.
//!
//! Outside this folder nothing imports redb.

/// The target of the store's log lines: the one they had before the store
/// became a folder. The formatter prints it on every line, so journal
/// searches written for it keep working.
const LOG_TARGET: &str = "tollgate::store";

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use redb::Database;

use crate::failure_window::Counts;
use crate::keys::Derivation;

mod journal;
mod schema;
mod start_checks;
#[cfg(test)]
mod tests;
mod writer;

pub use journal::{Durable, Journal};

use schema::{CELLS, DEVICES, ENTRIES, SCHEMA_VERSION, SCHEMA_VERSION_DERIVED};
use start_checks::{lock_for_life, read_bans, read_rows};

/// redb's page cache. The file holds at most the tables' caps of 12-byte
/// entries (a few MB), so a small cache keeps it hot; redb's default (1 GiB)
/// would let a flood of short-lived keys grow resident memory far beyond the
/// tables themselves.
pub const CACHE_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state file {path} cannot be opened: {message}")]
    Open { path: PathBuf, message: String },
    #[error("state file {path} is corrupt or unreadable: {message}; start with --discard-corrupt-state to move it aside and start empty")]
    Corrupt { path: PathBuf, message: String },
    #[error("state file {path}: schema version {found} is not one this version reads ({SCHEMA_VERSION} or {SCHEMA_VERSION_DERIVED}): it was written by a newer tollgate")]
    Schema { path: PathBuf, found: u64 },
    #[error("state file {path} was written with another secret key (key fingerprint {found:016x}, the secret key file's is {expected:016x}): restore the secret key file it was written with, or start with --discard-corrupt-state to move the state file aside and start empty")]
    KeyMismatch { path: PathBuf, found: u64, expected: u64 },
    #[error("state file {path} holds rows from before key fingerprints were recorded, and its secret key file is missing: restore the secret key file it was written with, or start with --discard-corrupt-state to move the state file aside and start empty")]
    KeyMissing { path: PathBuf },
    #[error("state file {path} holds rows made with key derivation {found}, and the configuration asks for {wanted}: a file keeps its derivation while it holds rows (its lockouts among them); remove key_derivation from the configuration")]
    DerivationMismatch { path: PathBuf, found: u64, wanted: u64 },
    #[error("state file {path} names key derivation {found}, which this version does not know: it was written by a newer tollgate")]
    DerivationUnknown { path: PathBuf, found: u64 },
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
    /// The configuration's `key_derivation`: taken by a new file, or by
    /// one without rows; a file with rows of another is refused. `None`: a
    /// new file takes `new_file_derivation`, any other keeps its own.
    pub key_derivation: Option<Derivation>,
    /// What a file made now takes without `key_derivation` (the shared
    /// store's hosts'); `None`: the newest.
    pub new_file_derivation: Option<Derivation>,
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

/// One persisted row of overflow-sketch cells (see
/// `failure_window::overflow`): those at the threshold among 64.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistedCells {
    pub rule: String,
    pub shard: u8,
    /// The size of the sketch that wrote it: `1 << row_bits` cells a row.
    pub row_bits: u8,
    /// The first cell's index over 64.
    pub chunk: u32,
    pub window_us: u64,
    /// Each cell's offset from `chunk × 64`, and its counts.
    pub cells: Vec<(u8, Counts)>,
}

/// Changes to one shard's overflow-sketch cells of a rule.
#[derive(Clone, Debug)]
pub struct CellRows {
    pub rule: Arc<str>,
    pub window_us: u64,
    pub shard: u8,
    pub changes: crate::failure_window::CellChanges,
}

/// Which of a route's known-device maps a row belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceMap {
    /// Known (account, device) digests.
    Devices = 0,
    /// New devices made known per account (by account tag).
    PerAccount = 1,
    /// Shared mode: keys the store said are locked (id the key's tuple,
    /// value the rule's tag, expiry the lockout's end), so
    /// a restart without the store still refuses them.
    KnownLockouts = 2,
    /// Shared mode: what this host's reports counted in the store and the
    /// attempts the store admitted through it (id the count's, value
    /// packed by `StoreCounted::row_value`), so a restarted host's share
    /// still holds them while the store is away.
    StoreCounted = 3,
}

impl DeviceMap {
    fn from_u8(value: u8) -> Option<DeviceMap> {
        match value {
            0 => Some(DeviceMap::Devices),
            1 => Some(DeviceMap::PerAccount),
            2 => Some(DeviceMap::KnownLockouts),
            3 => Some(DeviceMap::StoreCounted),
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
    pub cells: Vec<PersistedCells>,
    pub devices: Vec<PersistedDevice>,
    /// Manual bans, ended ones included (the limiter drops those).
    pub bans: Vec<crate::bans::Ban>,
    /// Rows whose check did not match (a damaged disk): dropped, and
    /// deleted from the file.
    pub damaged_rows: usize,
    /// Shared mode: the host count last learned from the store, if any.
    pub hosts_learned: Option<u32>,
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
    /// The key derivation the file's rows are made with (`prepare`
    /// decides it); a fresh file from a rewrite records it too.
    key_derivation: Derivation,
}

impl Store {
    /// Opens (or creates) the state file without a key check (tests and
    /// tools; the daemon uses `open_with`).
    pub fn open(path: &Path, discard_corrupt: bool) -> Result<Store, StoreError> {
        Self::open_with(path, OpenOptions { discard_corrupt, ..OpenOptions::default() }).map(|opened| opened.store)
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

    /// The key derivation this file's rows are made with.
    pub fn key_derivation(&self) -> Derivation {
        self.key_derivation
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
        let cells = match txn.open_table(CELLS) {
            Ok(table) => Some(table),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(corrupt(&e)),
        };
        let (mut loaded, _) = read_rows(&entries, devices.as_ref(), cells.as_ref()).map_err(|e| corrupt(&e))?;
        match txn.open_table(schema::BANS) {
            Ok(table) => loaded.bans = read_bans(&table).map_err(|e| corrupt(&e))?.0,
            Err(redb::TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(corrupt(&e)),
        }
        let meta = txn.open_table(schema::META).map_err(|e| corrupt(&e))?;
        let hosts_learned = meta.get(schema::META_HOSTS_LEARNED).map_err(|e| corrupt(&e))?.map(|v| v.value());
        Ok(Loaded { hosts_learned: hosts_learned.and_then(|n| u32::try_from(n).ok()).filter(|n| *n > 0), ..loaded })
    }
}

fn open_database(path: &Path) -> Result<Database, redb::DatabaseError> {
    Database::builder().set_cache_size(CACHE_BYTES).create(path)
}
