//! The state file's layout: its tables, what a row holds and how its
//! BLAKE2b-64 check is made, and the migration from schemas 1 and 2 (run
//! inside the opening transaction, see `start_checks.rs`).
//!
//! Opens no file and starts no transaction; what to do with a row whose
//! check fails is decided in `start_checks.rs`.

use blake2::digest::consts::U8;
use blake2::digest::{FixedOutput, Update};
use blake2::Blake2b;
use redb::{ReadableTable, TableDefinition};

use crate::bans::Ban;
use crate::failure_window::Counts;

/// A failure entry's row: (window_us, window index, previous, current, check).
pub(super) type EntryRow = (u64, u32, u32, u32, u64);
/// (rule id, key digest) -> the entry.
pub(super) const ENTRIES: TableDefinition<(&str, u128), EntryRow> = TableDefinition::new("failure_entries_v3");
/// (rule id, shard, row bits, chunk) -> the cells of a shard's overflow
/// sketch at its rule's threshold among the 64 from `chunk × 64`
/// (`cell_chunk_bytes`). `row bits` is the size of the sketch the index is
/// of. Added in schema 3 without a version change: a file without it has
/// no spilled lockouts.
pub(super) const CELLS: TableDefinition<CellKey, &[u8]> = TableDefinition::new("overflow_cells_v1");
/// (rule id, shard, row bits, chunk).
pub(super) type CellKey = (&'static str, u8, u8, u32);
/// A chunk row's bytes: the window length (u64), then per cell its offset
/// (u8), window, previous and current (u32 each), then the row's check
/// (u64), all little-endian.
const CELL_BYTES: usize = 13;
/// (route, map, shard, id) -> (expires_us, value, check): a known device
/// (`DeviceMap::Devices`, id the (account, device) digest's low half) or an
/// account's count of new devices (`DeviceMap::PerAccount`, id the account
/// tag). The shard is in the key so that a shard can be replaced whole.
pub(super) const DEVICES: TableDefinition<DeviceKey, DeviceValue> = TableDefinition::new("known_devices_v3");
/// (route, map, shard, id).
pub(super) type DeviceKey = (&'static str, u8, u8, u64);
/// (expires_us, value, check).
pub(super) type DeviceValue = (u64, u16, u64);
/// Schema 2's table: the counts without a check. Migrated at open.
pub(super) const ENTRIES_V2: TableDefinition<(&str, u128), (u64, u32, u32, u32)> =
    TableDefinition::new("failure_entries_v2");
/// Schema 1's table: the counts without their window length. Migrated at
/// open (with window length 0: "the rule's length now", as schema 1 assumed).
pub(super) const ENTRIES_V1: TableDefinition<(&str, u128), (u32, u32, u32)> = TableDefinition::new("failure_entries");
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// A banned network (its text, `203.0.113.0/24`) -> `ban_row_bytes`. Added
/// in schema 3 without a version change: a file without it holds no bans.
pub(super) const BANS: TableDefinition<&str, &[u8]> = TableDefinition::new("bans_v1");
/// A ban row's fixed bytes: until_us, since_us (u64), uid (u32), then the
/// reason's bytes and the row's check (u64), all little-endian.
const BAN_FIXED_BYTES: usize = 8 + 8 + 4;
pub(super) const SCHEMA_VERSION: u64 = 3;
/// Schema 3's tables with keys of a derivation other than BLAKE2b: a
/// version before derivations refuses the file instead of deriving
/// BLAKE2b keys that match none of its rows (every lockout unenforced).
/// A BLAKE2b file stays schema 3, which those versions read rightly.
pub(super) const SCHEMA_VERSION_DERIVED: u64 = 4;

/// The schema a file whose keys are made by `derivation` records.
pub(super) fn schema_of(derivation: crate::keys::Derivation) -> u64 {
    match derivation {
        crate::keys::Derivation::Blake2b => SCHEMA_VERSION,
        _ => SCHEMA_VERSION_DERIVED,
    }
}
/// `meta` key of the secret key's fingerprint (`Secret::fingerprint`).
pub(super) const META_KEY_FINGERPRINT: &str = "key_fingerprint";
/// `meta` key of the key derivation the rows are made with
/// (`Derivation::number`); absent in a file from before it was recorded.
pub(super) const META_KEY_DERIVATION: &str = "key_derivation";
/// Shared mode: the host count last learned from the store, so a restart
/// while the store is away shares the limits as the hosts last did, not by
/// `hosts_when_unknown`.
pub(super) const META_HOSTS_LEARNED: &str = "shared_hosts_learned";
/// Domain of the row checks: a check of one table's row never matches a
/// row of another shape.
const ROW_CHECK_DOMAIN: &[u8] = b"tollgate state row check v3";

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

pub(super) fn entry_check(
    rule: &str,
    digest: u128,
    (window_us, window, previous, current): (u64, u32, u32, u32),
) -> u64 {
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

fn cell_check((rule, shard, row_bits, chunk): (&str, u8, u8, u32), payload: &[u8]) -> u64 {
    row_check(&[b"cells", rule.as_bytes(), &[shard, row_bits], &chunk.to_le_bytes(), payload])
}

/// A chunk row's bytes (see `CELLS`).
pub(super) fn cell_chunk_bytes(key: (&str, u8, u8, u32), window_us: u64, cells: &[(u8, Counts)]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(16 + cells.len() * CELL_BYTES);
    bytes.extend_from_slice(&window_us.to_le_bytes());
    for (offset, c) in cells {
        bytes.push(*offset);
        for n in [c.window, c.previous, c.current] {
            bytes.extend_from_slice(&n.to_le_bytes());
        }
    }
    let check = cell_check(key, &bytes);
    bytes.extend_from_slice(&check.to_le_bytes());
    bytes
}

/// A chunk row's window length and cells, if its check matches and it is
/// one tollgate writes: a sketch size it makes, a chunk within the
/// sketch, a window length a rule can have, and at most 64 cells in order
/// of offset.
pub(super) fn read_cell_chunk(key: (&str, u8, u8, u32), bytes: &[u8]) -> Option<(u64, Vec<(u8, Counts)>)> {
    let (_, _, row_bits, chunk) = key;
    let sizes = crate::failure_window::ROW_BITS_MIN..=crate::failure_window::ROW_BITS_MAX;
    let chunks = (crate::failure_window::OVERFLOW_ROWS as u64) << row_bits.min(32) >> 6;
    if !sizes.contains(&row_bits) || u64::from(chunk) >= chunks {
        return None;
    }
    let body =
        bytes.len().checked_sub(8).filter(|n| *n >= 8 && (n - 8) % CELL_BYTES == 0 && (n - 8) <= 64 * CELL_BYTES)?;
    let (payload, check) = bytes.split_at(body);
    if cell_check(key, payload) != u64::from_le_bytes(check.try_into().ok()?) {
        return None;
    }
    let word = |at: &[u8]| u32::from_le_bytes(at.try_into().expect("4 bytes"));
    let cells: Vec<(u8, Counts)> = payload[8..]
        .chunks_exact(CELL_BYTES)
        .map(|c| (c[0], Counts { window: word(&c[1..5]), previous: word(&c[5..9]), current: word(&c[9..13]) }))
        .collect();
    let ordered = cells.windows(2).all(|w| w[0].0 < w[1].0) && cells.iter().all(|(offset, _)| *offset < 64);
    let window_us = u64::from_le_bytes(payload[..8].try_into().ok()?);
    (ordered && window_us >= crate::failure_window::WINDOW_US_MIN).then_some((window_us, cells))
}

pub(super) fn device_check((route, map, shard, id): (&str, u8, u8, u64), expires_us: u64, value: u16) -> u64 {
    row_check(&[
        b"device",
        route.as_bytes(),
        &[map, shard],
        &id.to_le_bytes(),
        &expires_us.to_le_bytes(),
        &value.to_le_bytes(),
    ])
}

pub(super) fn entry_row(rule: &str, digest: u128, window_us: u64, counts: Counts) -> EntryRow {
    let check = entry_check(rule, digest, (window_us, counts.window, counts.previous, counts.current));
    (window_us, counts.window, counts.previous, counts.current, check)
}

/// Moves schema 1's and schema 2's rows into schema 3's table, each with
/// its check, inside the opening transaction (so a crash mid-migration
/// leaves the old schema intact).
pub(super) fn migrate_to_v3(txn: &redb::WriteTransaction) -> Result<usize, String> {
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

fn ban_check(network: &str, fixed: &[u8], reason: &[u8]) -> u64 {
    row_check(&[b"ban", network.as_bytes(), fixed, reason])
}

/// A ban's row, keyed by its network's text.
pub(super) fn ban_row_bytes(ban: &Ban) -> (String, Vec<u8>) {
    let network = ban.network.to_string();
    let mut row = Vec::with_capacity(BAN_FIXED_BYTES + ban.reason.len() + 8);
    row.extend_from_slice(&ban.until_us.to_le_bytes());
    row.extend_from_slice(&ban.since_us.to_le_bytes());
    row.extend_from_slice(&ban.uid.to_le_bytes());
    let check = ban_check(&network, &row, ban.reason.as_bytes());
    row.extend_from_slice(ban.reason.as_bytes());
    row.extend_from_slice(&check.to_le_bytes());
    (network, row)
}

/// The ban a row holds, or None when its check fails or it does not parse
/// (the limiter then checks what it means: the network's width, the end).
pub(super) fn read_ban_row(network: &str, row: &[u8]) -> Option<Ban> {
    let (body, check) = row.split_last_chunk::<8>()?;
    if body.len() < BAN_FIXED_BYTES {
        return None;
    }
    let (fixed, reason) = body.split_at(BAN_FIXED_BYTES);
    if u64::from_le_bytes(*check) != ban_check(network, fixed, reason) {
        return None;
    }
    // A row keyed by another spelling of its network (`2001:0db8::/48`)
    // could never be lifted or swept by the network's own text: damage.
    let parsed: ipnet::IpNet = network.parse().ok()?;
    if parsed.to_string() != network {
        return None;
    }
    Some(Ban {
        network: parsed,
        until_us: u64::from_le_bytes(fixed[0..8].try_into().ok()?),
        since_us: u64::from_le_bytes(fixed[8..16].try_into().ok()?),
        uid: u32::from_le_bytes(fixed[16..20].try_into().ok()?),
        reason: String::from_utf8(reason.to_vec()).ok()?,
    })
}
