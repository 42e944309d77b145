//! Unit tests of the state file: commits, the rewrite, migrations, the key
//! fingerprint, damaged rows and files, and the guarded reader.

use std::time::Duration;

use redb::ReadableTable;

use super::schema::{ENTRIES_V1, ENTRIES_V2, META};
use super::start_checks::{guarded_for, unused_path};
use super::*;
use crate::keys::{Derivation, Key};

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
    let keyed = |fingerprint| OpenOptions {
        discard_corrupt: false,
        key_fingerprint: Some(fingerprint),
        key_is_new: false,
        key_derivation: None,
        new_file_derivation: None,
    };
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
    let new_key = OpenOptions {
        discard_corrupt: false,
        key_fingerprint: Some(0xC),
        key_is_new: true,
        key_derivation: None,
        new_file_derivation: None,
    };
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
        key_derivation: None,
        new_file_derivation: None,
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
            let (w, win, p, _, check) = table.get(("login/source_failures", bad.to_u128())).unwrap().unwrap().value();
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
    assert!(text.contains("panicked") && text.contains("--discard-corrupt-state") && !text.contains('\n'), "{text}");
    let started = std::time::Instant::now();
    let hung = guarded_for(path, Duration::from_millis(100), || -> Result<(), StoreError> {
        std::thread::sleep(Duration::from_secs(3));
        Ok(())
    });
    let err = hung.expect_err("a hang is an error");
    assert!(err.to_string().contains("did not finish within 100 ms"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2), "not waited out");
}

/// The host count learned from a shared store is in the file a restart
/// opens, also after a rewrite from memory (which collects only rows).
#[test]
fn the_learned_host_count_survives_a_restart_and_a_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    {
        let store = Store::open(&path, false).unwrap();
        assert_eq!(store.load_all().unwrap().hosts_learned, None);
        let (journal, writer) = store.start_writer(Arc::default());
        journal.hosts_learned(3);
        journal.hosts_learned(4);
        writer.stop();
    }
    let store = Store::open(&path, false).unwrap();
    assert_eq!(store.load_all().unwrap().hosts_learned, Some(4));
    let (journal, writer) = store.start_writer(Arc::default());
    journal.rewrite_begin();
    journal.rewrite_end().wait_blocking().unwrap();
    writer.stop();
    let opened = Store::open_with(
        &path,
        OpenOptions {
            discard_corrupt: false,
            key_fingerprint: None,
            key_is_new: false,
            key_derivation: None,
            new_file_derivation: None,
        },
    )
    .unwrap();
    assert_eq!(opened.loaded.hosts_learned, Some(4), "a rewrite kept the learned count");
}

/// A file's rows are keyed by the derivation it was made with, for life:
/// a file from before derivations were recorded is BLAKE2b's, a new one
/// the newest (or the configured), a rewrite keeps it, and a file with
/// rows never changes it.
#[test]
fn a_state_file_keeps_the_key_derivation_its_rows_were_made_with() {
    let dir = tempfile::tempdir().unwrap();
    let opening = |wanted, discard_corrupt| OpenOptions {
        discard_corrupt,
        key_fingerprint: Some(0xA),
        key_is_new: false,
        key_derivation: wanted,
        new_file_derivation: None,
    };
    let derivation =
        |path: &Path, wanted| Store::open_with(path, opening(wanted, false)).map(|o| o.store.key_derivation());
    // From before derivations, with rows: BLAKE2b, whatever is asked unless
    // it is BLAKE2b; the refusal leaves the file as it was.
    let old = dir.path().join("old.redb");
    schema_2_file(&old, 5);
    let before = std::fs::read(&old).unwrap();
    let err = derivation(&old, Some(Derivation::SipHash)).expect_err("rows of another derivation");
    assert!(matches!(err, StoreError::DerivationMismatch { found: 1, wanted: 2, .. }), "{err}");
    assert!(std::fs::read(&old).unwrap() == before, "a refused file is not written to");
    assert_eq!(derivation(&old, None).unwrap(), Derivation::Blake2b);
    assert_eq!(derivation(&old, Some(Derivation::Blake2b)).unwrap(), Derivation::Blake2b);
    assert_eq!(derivation(&old, None).unwrap(), Derivation::Blake2b, "recorded");
    // Not even with the flag: that would throw its lockouts away.
    let before = std::fs::read(&old).unwrap();
    let err = Store::open_with(&old, opening(Some(Derivation::SipHash), true)).err().expect("refused");
    assert!(matches!(err, StoreError::DerivationMismatch { .. }) && !err.to_string().contains("--discard"), "{err}");
    assert!(std::fs::read(&old).unwrap() == before, "left as it was");
    // Rows without a schema version (not a file made now): BLAKE2b's.
    let bare = dir.path().join("bare.redb");
    {
        let db = Database::create(&bare).unwrap();
        let txn = db.begin_write().unwrap();
        let row = super::schema::entry_row(
            "login/source_failures",
            5,
            60_000_000,
            Counts { window: 7, previous: 0, current: 5 },
        );
        txn.open_table(ENTRIES).unwrap().insert(("login/source_failures", 5u128), row).unwrap();
        txn.commit().unwrap();
    }
    let opened = Store::open_with(&bare, opening(None, false)).unwrap();
    assert_eq!((opened.store.key_derivation(), opened.loaded.entries.len()), (Derivation::Blake2b, 1));
    drop(opened);
    // New: the newest, or the configured; kept while empty only if asked.
    let new = dir.path().join("new.redb");
    assert_eq!(derivation(&new, None).unwrap(), Derivation::NEWEST);
    assert_eq!(derivation(&new, None).unwrap(), Derivation::NEWEST);
    assert_eq!(derivation(&new, Some(Derivation::Blake2b)).unwrap(), Derivation::Blake2b, "no rows: nothing to lose");
    assert_eq!(derivation(&new, None).unwrap(), Derivation::Blake2b);
    // A file of the newest with a row, rewritten from memory: still the newest.
    let fresh = dir.path().join("fresh.redb");
    let store = Store::open_with(&fresh, opening(None, false)).unwrap().store;
    let (journal, writer) = store.start_writer(Arc::default());
    let rule: Arc<str> = "login/account_failures".into();
    let row = (Key { account_tag: 1, tuple: 2 }, Some(Counts { window: 7, previous: 0, current: 5 }));
    journal.write_durably(&rule, 60_000_000, vec![row]).wait_blocking().unwrap();
    // A rewrite collects the rows from memory (here, the one row).
    journal.rewrite_begin();
    journal.write(&rule, 60_000_000, vec![row]);
    journal.rewrite_end().wait_blocking().unwrap();
    writer.stop();
    assert_eq!(derivation(&fresh, None).unwrap(), Derivation::NEWEST, "the rewrite recorded it");
    // Schema 4 for SipHash keys (a version before derivations refuses the
    // file rather than match none of its rows), 3 for BLAKE2b's.
    let schema = |path: &Path| {
        let db = Store::open(path, false).unwrap().db;
        let txn = db.begin_read().unwrap();
        txn.open_table(META).unwrap().get("schema_version").unwrap().unwrap().value()
    };
    assert_eq!((schema(&fresh), schema(&new), schema(&old)), (4, 3, 3));
    let err = derivation(&fresh, Some(Derivation::Blake2b)).expect_err("rows of the newest");
    assert!(matches!(err, StoreError::DerivationMismatch { found: 2, wanted: 1, .. }), "{err}");
    // A number this version does not know is refused, not guessed.
    {
        let db = Database::create(dir.path().join("future.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META).unwrap().insert("schema_version", SCHEMA_VERSION).unwrap();
        txn.open_table(META).unwrap().insert("key_derivation", 9).unwrap();
        txn.commit().unwrap();
    }
    let err = derivation(&dir.path().join("future.redb"), None).expect_err("unknown");
    assert!(matches!(err, StoreError::DerivationUnknown { found: 9, .. }), "{err}");
}

#[test]
fn overflow_cells_survive_reopening_a_whole_replacement_drops_the_old_size_and_a_dropped_rule_takes_them() {
    use crate::failure_window::{CellChanges, CellChunk};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let rule: Arc<str> = "login/source_failures".into();
    let counts = Counts { window: 7, previous: 1, current: 5 };
    let cells = |row_bits, whole, chunks| CellRows {
        rule: rule.clone(),
        window_us: 900_000_000,
        shard: 3,
        changes: CellChanges { row_bits, whole, chunks },
    };
    let chunk = |chunk, offsets: &[u8]| CellChunk { chunk, cells: offsets.iter().map(|o| (*o, counts)).collect() };
    {
        let store = Store::open(&path, false).unwrap();
        let (journal, writer) = store.start_writer(Arc::default());
        let chunks = vec![chunk(0, &[1, 63]), chunk(2, &[9])];
        journal.write_cells(cells(10, false, chunks), true).unwrap().wait_blocking().unwrap();
        journal.write_cells(cells(10, false, vec![chunk(2, &[])]), false);
        writer.stop();
    }
    let loaded = Store::open(&path, false).unwrap().load_all().unwrap();
    let found: Vec<_> = loaded.cells.iter().map(|c| (c.shard, c.row_bits, c.chunk, c.cells.clone())).collect();
    assert_eq!(found, vec![(3, 10, 0, vec![(1, counts), (63, counts)])]);
    assert!(loaded.cells.iter().all(|c| c.window_us == 900_000_000 && *c.rule == *rule));
    {
        let store = Store::open(&path, false).unwrap();
        let (journal, writer) = store.start_writer(Arc::default());
        journal.write_cells(cells(12, true, vec![chunk(5, &[7])]), false);
        writer.stop();
    }
    let loaded = Store::open(&path, false).unwrap().load_all().unwrap();
    assert_eq!(loaded.cells.iter().map(|c| (c.row_bits, c.chunk)).collect::<Vec<_>>(), vec![(12, 5)]);
    {
        let store = Store::open(&path, false).unwrap();
        let (journal, writer) = store.start_writer(Arc::default());
        journal.drop_rule(&rule);
        writer.stop();
    }
    assert!(Store::open(&path, false).unwrap().load_all().unwrap().cells.is_empty());
}

#[test]
fn crafted_overflow_rows_are_dropped_as_damage_not_loaded() {
    use redb::ReadableTableMetadata;
    use schema::{cell_chunk_bytes, CELLS};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let counts = Counts { window: 7, previous: 0, current: 5 };
    let rule = "login/source_failures";
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(CELLS).unwrap();
            let mut put = |key: (&'static str, u8, u8, u32), window_us: u64, cells: &[(u8, Counts)]| {
                table.insert(key, cell_chunk_bytes(key, window_us, cells).as_slice()).unwrap();
            };
            put((rule, 0, 10, 0), 900_000_000, &[(1, counts)]); // the one good row
            put((rule, 0, 5, 0), 900_000_000, &[(1, counts)]); // a size no sketch has
            put((rule, 0, 30, 0), 900_000_000, &[(1, counts)]);
            put((rule, 1, 10, 64), 900_000_000, &[(1, counts)]); // past the sketch's 4 x 1,024 cells
            put((rule, 2, 10, 0), 0, &[(1, counts)]); // a window no rule has
            put((rule, 3, 10, 0), 900_000_000, &[(9, counts), (1, counts)]); // out of order
            put((rule, 4, 10, 0), 900_000_000, &[(64, counts)]); // not in the chunk
        }
        txn.commit().unwrap();
    }
    let opened = Store::open_with(&path, OpenOptions::default()).unwrap();
    assert_eq!(opened.loaded.cells.len(), 1);
    assert_eq!(opened.loaded.damaged_rows, 6);
    drop(opened);
    let db = redb::Database::open(&path).unwrap();
    assert_eq!(db.begin_read().unwrap().open_table(CELLS).unwrap().len().unwrap(), 1, "deleted");
}

#[test]
fn ban_rows_survive_reopening_a_lift_sticks_and_a_damaged_one_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let ban = |network: &str, reason: &str| crate::bans::Ban {
        network: network.parse().unwrap(),
        until_us: 7_000_000,
        since_us: 1_000_000,
        uid: 1000,
        reason: reason.into(),
    };
    let (kept, lifted, damaged) =
        (ban("203.0.113.0/24", "stuffing"), ban("2001:db8::/48", ""), ban("192.0.2.0/24", "x"));
    {
        let store = Store::open(&path, false).unwrap();
        let (journal, writer) = store.start_writer(Arc::default());
        for b in [&kept, &lifted, &damaged] {
            journal.write_ban(b, true).unwrap().wait_blocking().unwrap();
        }
        journal.remove_ban(lifted.network, true).unwrap().wait_blocking().unwrap();
        writer.stop();
    }
    {
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut bans = txn.open_table(super::schema::BANS).unwrap();
            let mut row = bans.get("192.0.2.0/24").unwrap().unwrap().value().to_vec();
            row[3] ^= 1; // a later end, under the old check
            bans.insert("192.0.2.0/24", row.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let opened = Store::open_with(&path, OpenOptions::default()).unwrap();
    assert_eq!((opened.loaded.bans.clone(), opened.loaded.damaged_rows), (vec![kept.clone()], 1));
    assert_eq!(opened.store.load_all().unwrap().bans, vec![kept], "the damaged row was deleted");
}
