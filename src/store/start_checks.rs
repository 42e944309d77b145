//! What a start does before it trusts the state file: it takes
//! `STATE.lock`, refuses a file in use, an empty one or an oversized one,
//! then checks an in-memory copy (redb's integrity check, the schema and its
//! migration, every row's check, the key fingerprint) on a guarded thread
//! (panic caught, timeout), and only then opens the real file. A refused
//! file is left as it was found or, with `discard_corrupt`, moved aside.
//!
//! Writes nothing after start (that is `writer.rs`), and never takes a
//! failure to open the real file, once its copy passed, for damage.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::RwLock;
use std::time::Duration;

use redb::{Database, ReadableTable};

use super::schema::{
    device_check, entry_check, migrate_to_v3, read_ban_row, read_cell_chunk, schema_of, CellKey, DeviceKey,
    DeviceValue, EntryRow, BANS, CELLS, DEVICES, ENTRIES, META, META_HOSTS_LEARNED, META_KEY_DERIVATION,
    META_KEY_FINGERPRINT, SCHEMA_VERSION, SCHEMA_VERSION_DERIVED,
};
use super::writer::rewrite_path;
use super::{
    open_database, DeviceMap, Loaded, OpenOptions, Opened, PersistedCells, PersistedDevice, PersistedEntry, Store,
    StoreError, CACHE_BYTES,
};
use crate::failure_window::Counts;
use crate::keys::Derivation;
use crate::unpoisoned::UnpoisonedRw;

/// Longest a start spends checking and reading the state file before it
/// takes the file as damaged. A healthy file at the tables' caps takes
/// about a second; a damaged one can send a tree walk in circles, and under
/// systemd a silent hang is worse than a refusal that says why.
pub const OPEN_TIMEOUT_MS: u64 = 30_000;
/// Largest state file checked at start: it is checked on an in-memory copy.
/// The tables' caps and their overflow sketches keep a real one below it
/// (129 MiB after ten times a table's cap of lockouts, the sketch then 82%
/// at the threshold); anything larger is not a file tollgate wrote.
pub const STATE_FILE_BYTES_MAX: u64 = 1 << 30;
/// How far redb may grow the in-memory copy while checking it (a repair or
/// a migration writes a few pages); a damaged header asking for more is
/// damage, not a reason to allocate.
const COPY_GROWTH_BYTES_MAX: u64 = 256 << 20;
/// The thread that checks and opens the state file; its panics are caught
/// and reported as damage, so the panic hook keeps quiet about them.
const GUARDED_THREAD: &str = "tollgate-open-state";

impl Store {
    pub(super) fn open_unlocked(path: &Path, options: OpenOptions) -> Result<Opened, StoreError> {
        match Self::try_open(path, options) {
            Ok(opened) => Ok(opened),
            Err(e @ (StoreError::Corrupt { .. } | StoreError::KeyMismatch { .. } | StoreError::KeyMissing { .. }))
                if options.discard_corrupt =>
            {
                let aside = unused_path(path.with_extension(format!("corrupt-{}", std::process::id())));
                std::fs::rename(path, &aside).map_err(|e| StoreError::Open {
                    path: path.into(),
                    message: format!("cannot move the damaged file aside: {e}"),
                })?;
                tracing::warn!(target: super::LOG_TARGET, state = %path.display(), moved_to = %aside.display(), error = %e, "discarded the state file; starting empty");
                Self::try_open(path, options)
            }
            Err(e) => Err(e),
        }
    }

    fn try_open(path: &Path, options: OpenOptions) -> Result<Opened, StoreError> {
        let key_fingerprint = options.key_fingerprint;
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
                let (loaded, key_derivation) = prepare(&db, path, options)?;
                let store = Store { _lock: None, db, path: path.into(), key_fingerprint, key_derivation };
                return Ok(Opened { store, loaded });
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
            prepare(&db, &at, options).map(|_| ())
        })?;
        let at = path.to_path_buf();
        let opened = guarded(path, move || {
            let db = Database::builder().set_cache_size(CACHE_BYTES).open(&at).map_err(|e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => {
                    StoreError::Open { path: at.clone(), message: "in use by a running daemon".into() }
                }
                other => StoreError::corrupt(&at, other),
            })?;
            let (loaded, key_derivation) = prepare(&db, &at, options)?;
            if loaded.damaged_rows > 0 {
                tracing::warn!(target: super::LOG_TARGET, state = %at.display(), rows = loaded.damaged_rows, "state file rows failed their check (a damaged disk); dropped and deleted");
            }
            Ok(Opened { store: Store { _lock: None, db, path: at, key_fingerprint, key_derivation }, loaded })
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
}

/// Rows to delete: their check did not match.
pub(super) struct DamagedRows {
    entries: Vec<(String, u128)>,
    devices: Vec<(String, u8, u8, u64)>,
    cells: Vec<(String, u8, u8, u32)>,
}

/// Reads every table, checking every row.
pub(super) fn read_rows<E, D, C>(
    entries: &E,
    devices: Option<&D>,
    cells: Option<&C>,
) -> Result<(Loaded, DamagedRows), redb::StorageError>
where
    E: ReadableTable<(&'static str, u128), EntryRow>,
    D: ReadableTable<DeviceKey, DeviceValue>,
    C: ReadableTable<CellKey, &'static [u8]>,
{
    let mut loaded = Loaded::default();
    let mut damaged = DamagedRows { entries: Vec::new(), devices: Vec::new(), cells: Vec::new() };
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
    for row in cells.map(|c| c.iter()).transpose()?.into_iter().flatten() {
        let (key, value) = row?;
        let (rule, shard, row_bits, chunk) = key.value();
        let Some((window_us, cells)) = read_cell_chunk((rule, shard, row_bits, chunk), value.value()) else {
            damaged.cells.push((rule.to_string(), shard, row_bits, chunk));
            continue;
        };
        loaded.cells.push(PersistedCells { rule: rule.to_string(), shard, row_bits, chunk, window_us, cells });
    }
    loaded.damaged_rows = damaged.entries.len() + damaged.devices.len() + damaged.cells.len();
    Ok((loaded, damaged))
}

/// Every ban row whose check matches, and the networks of those whose
/// check does not.
pub(super) fn read_bans<B>(bans: &B) -> Result<(Vec<crate::bans::Ban>, Vec<String>), redb::StorageError>
where
    B: ReadableTable<&'static str, &'static [u8]>,
{
    let (mut read, mut damaged) = (Vec::new(), Vec::new());
    for row in bans.iter()? {
        let (network, value) = row?;
        match read_ban_row(network.value(), value.value()) {
            Some(ban) => read.push(ban),
            None => damaged.push(network.value().to_string()),
        }
    }
    Ok((read, damaged))
}

/// In one write transaction: checks the schema (migrating older ones),
/// the key fingerprint and the key derivation, reads every row, and
/// deletes the rows whose check fails. Nothing is committed unless all of
/// it succeeds.
fn prepare(db: &Database, path: &Path, options: OpenOptions) -> Result<(Loaded, Derivation), StoreError> {
    let OpenOptions { key_fingerprint, key_is_new, key_derivation: wanted, new_file_derivation, .. } = options;
    let corrupt = |e: &dyn std::fmt::Display| StoreError::corrupt(path, e);
    let mut txn = db.begin_write().map_err(|e| corrupt(&e))?;
    txn.set_two_phase_commit(true);
    let loaded = {
        let mut meta = txn.open_table(META).map_err(|e| corrupt(&e))?;
        let found = meta.get("schema_version").map_err(|e| corrupt(&e))?.map(|v| v.value());
        let made_now = found.is_none();
        match found {
            None => {
                meta.insert("schema_version", SCHEMA_VERSION).map_err(|e| corrupt(&e))?;
            }
            Some(old @ (1 | 2)) => {
                let migrated = migrate_to_v3(&txn).map_err(|e| corrupt(&e))?;
                meta.insert("schema_version", SCHEMA_VERSION).map_err(|e| corrupt(&e))?;
                tracing::info!(target: super::LOG_TARGET, state = %path.display(), rows = migrated, "state file migrated from schema {old} to {SCHEMA_VERSION}");
            }
            Some(SCHEMA_VERSION | SCHEMA_VERSION_DERIVED) => {}
            Some(found) => return Err(StoreError::Schema { path: path.into(), found }),
        }
        let mut entries = txn.open_table(ENTRIES).map_err(|e| corrupt(&e))?;
        let mut devices = txn.open_table(DEVICES).map_err(|e| corrupt(&e))?;
        let mut cells = txn.open_table(CELLS).map_err(|e| corrupt(&e))?;
        let (loaded, damaged) = read_rows(&entries, Some(&devices), Some(&cells)).map_err(|e| corrupt(&e))?;
        for (rule, digest) in &damaged.entries {
            entries.remove((rule.as_str(), *digest)).map_err(|e| corrupt(&e))?;
        }
        for (route, map, shard, id) in &damaged.devices {
            devices.remove((route.as_str(), *map, *shard, *id)).map_err(|e| corrupt(&e))?;
        }
        for (rule, shard, row_bits, cell) in &damaged.cells {
            cells.remove((rule.as_str(), *shard, *row_bits, *cell)).map_err(|e| corrupt(&e))?;
        }
        let mut bans = txn.open_table(BANS).map_err(|e| corrupt(&e))?;
        let (banned, damaged_bans) = read_bans(&bans).map_err(|e| corrupt(&e))?;
        for network in &damaged_bans {
            bans.remove(network.as_str()).map_err(|e| corrupt(&e))?;
        }
        let loaded = Loaded { bans: banned, damaged_rows: loaded.damaged_rows + damaged_bans.len(), ..loaded };
        // Rows keyed by derived digests (bans are keyed by network).
        let rows = loaded.entries.len() + loaded.devices.len() + loaded.cells.len();
        let recorded = match meta.get(META_KEY_DERIVATION).map_err(|e| corrupt(&e))?.map(|v| v.value()) {
            Some(n) => {
                Some(Derivation::from_number(n).ok_or(StoreError::DerivationUnknown { path: path.into(), found: n })?)
            }
            None => None,
        };
        // A file from before derivations were recorded made its rows with
        // BLAKE2b; a file made now takes the configured or the newest.
        let own = match (recorded, made_now) {
            (Some(recorded), _) => recorded,
            // Rows and no schema: not a file tollgate made now. Taken for
            // the oldest derivation, whose keys they most likely are.
            (None, true) if rows > 0 => Derivation::Blake2b,
            (None, true) => wanted.or(new_file_derivation).unwrap_or(Derivation::NEWEST),
            (None, false) if found == Some(SCHEMA_VERSION_DERIVED) => {
                return Err(StoreError::corrupt(path, "schema 4 names no key derivation"));
            }
            (None, false) => Derivation::Blake2b,
        };
        let derivation = match wanted {
            Some(wanted) if wanted != own && rows > 0 => {
                return Err(StoreError::DerivationMismatch {
                    path: path.into(),
                    found: own.number(),
                    wanted: wanted.number(),
                })
            }
            // Nothing is keyed yet: nothing is lost by changing.
            Some(wanted) => wanted,
            None => own,
        };
        // Recorded by the daemon, and in any file made now; a tool opening
        // an older file leaves it as it was.
        if key_fingerprint.is_some() || made_now {
            meta.insert(META_KEY_DERIVATION, derivation.number()).map_err(|e| corrupt(&e))?;
            meta.insert("schema_version", schema_of(derivation)).map_err(|e| corrupt(&e))?;
        }
        if let Some(expected) = key_fingerprint {
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
        let hosts_learned = meta.get(META_HOSTS_LEARNED).map_err(|e| corrupt(&e))?.map(|v| v.value());
        let hosts_learned = hosts_learned.and_then(|n| u32::try_from(n).ok()).filter(|n| *n > 0);
        (Loaded { hosts_learned, ..loaded }, derivation)
    };
    txn.commit().map_err(|e| corrupt(&e))?;
    Ok(loaded)
}

/// `path`, or the first of `path.1`, `path.2`, ... that does not exist: a
/// PID repeats (PID 1 in a container, after a reboot), and a file moved
/// aside before must not be replaced.
pub(super) fn unused_path(path: PathBuf) -> PathBuf {
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
pub(super) fn lock_for_life(path: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, StoreError> {
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

/// Refuses a file another process holds open (redb's lock), before the
/// file is read: a copy read under a live writer could look damaged, and
/// `--discard-corrupt-state` would then move a live daemon's file aside.
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

pub(super) fn guarded_for<T: Send + 'static>(
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
        Ok(self.bytes.read_locked().len() as u64)
    }

    fn read(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let bytes = self.bytes.read_locked();
        Ok(bytes[self.range(offset, len, bytes.len())?].to_vec())
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        if len > self.len_max {
            return Err(std::io::Error::other("the file would grow past any size a state file has"));
        }
        self.bytes.write_locked().resize(len as usize, 0);
        Ok(())
    }

    fn sync_data(&self, _eventual: bool) -> std::io::Result<()> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let mut bytes = self.bytes.write_locked();
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
