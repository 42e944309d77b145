//! Resident bytes per live entry of the daemon's tables, measured as the
//! growth of VmRSS (/proc/self/status) while a table is filled.
//!
//! `nice -n 10 cargo bench --bench memory` prints one `name=value` line per
//! figure (bytes per entry, then `entries=` the fill it was measured at),
//! each after a human line, so scripts can `grep '^gcra_bytes_per_key='`.
//!
//! Each figure comes from a fresh child process (this binary re-run with
//! `--child`): memory freed by an earlier fill and kept by the allocator
//! would otherwise be reused without growing VmRSS, and hide part of the
//! next fill. In the child the empty table is created first, VmRSS read,
//! the table filled with live entries, and VmRSS read again.
//!
//! Children run with glibc's mmap threshold pinned at its initial 128 KiB
//! (`MALLOC_MMAP_THRESHOLD_`, unless already set), so every large block is
//! returned to the system when freed. Otherwise glibc raises the threshold
//! after the first large free and keeps freed transients on its heap: the
//! failure-window figure after the snapshot drain then reads ~3-4 bytes per
//! entry higher (the drain's temporary output, kept for reuse), which is
//! allocator behaviour rather than the table's footprint.
//!
//! hashbrown grows by doubling (its bucket count is the smallest power of
//! two holding the entries at 7/8 load), and so does the GCRA table's slot
//! array (`TatTable`: rebuilt at 7/8 occupancy, sized for 3/8 to 3/4 load),
//! so bytes per entry depend on where the fill falls relative to the
//! table's capacity: just after a doubling a table is under half full and
//! costs about twice as much per entry as just before one. The figures are
//! therefore reported at several fills (1, 2 and 5 million), with what a
//! fully resident table of that size would take, rather than as one number.

use std::process::Command;

use tollgate::Key;
use tollgate::{ExpiringMap, Slot};
use tollgate::{FailureWindowTable, WindowSpec};
use tollgate::{GcraSpec, GcraTable};

const SECOND: u64 = 1_000_000;
const NOW_US: u64 = 1_700_000_000 * SECOND;
const FILLS: [usize; 3] = [1_000_000, 2_000_000, 5_000_000];
/// No eviction during a fill: every entry stays.
const ENTRIES_MAX: usize = 100_000_000;

/// `(kind, figure name, entry bytes in a hashbrown bucket (key and value)
/// or a TatTable slot, other bytes per entry outside the hash table)`.
const KINDS: [(&str, &str, usize, usize); 5] = [
    ("gcra", "gcra_bytes_per_key", 16, 0),
    // Slots (48 bytes) live in a Vec; the hash index holds a u32 per bucket.
    ("failure_window", "failure_window_bytes_per_entry", 4, 48),
    // As above, plus the change log's 4-byte slot index per entry written
    // since the last snapshot (the daemon drains it every
    // `snapshot_interval_ms`).
    ("failure_window_pending", "failure_window_bytes_per_entry_with_pending_changes", 4, 52),
    // Escalation levels: u64 id, u64 expiry, u16 level (padded to 24).
    ("expiring_u16", "expiring_map_u16_bytes_per_entry", 24, 0),
    // Recent password digests: u64 id, u64 expiry, [u32; 4].
    ("expiring_u32x4", "expiring_map_u32x4_bytes_per_entry", 32, 0),
];

/// splitmix64's finaliser: distinct, uniformly spread keys, like digests.
fn mix64(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn key(n: u64) -> Key {
    Key { account_tag: n, tuple: mix64(n) }
}

fn vm_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
    let kib: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmRSS value");
    kib * 1024
}

/// hashbrown's bucket count for `n` entries grown one insert at a time.
fn buckets_for(n: usize) -> usize {
    let mut buckets = 16;
    while buckets / 8 * 7 < n {
        buckets *= 2;
    }
    buckets
}

/// Fills a fresh table of `kind` with `n` live entries; returns the growth
/// of VmRSS, read while the table is still alive, and the table's buckets
/// (or slots).
fn fill(kind: &str, n: usize) -> (u64, usize) {
    let n64 = n as u64;
    match kind {
        "gcra" => {
            let spec = GcraSpec::new(1, 3600 * SECOND, 10);
            let mut table = GcraTable::new(ENTRIES_MAX);
            let before = vm_rss_bytes();
            for i in 0..n64 {
                table.check(spec, key(i), NOW_US, true);
            }
            assert_eq!(table.len(), n);
            (vm_rss_bytes() - before, table.capacity())
        }
        "failure_window" | "failure_window_pending" => {
            let spec = WindowSpec { window_us: 3600 * SECOND, threshold: 5 };
            let mut table = FailureWindowTable::new(spec, ENTRIES_MAX);
            let before = vm_rss_bytes();
            for i in 0..n64 {
                table.record_failure(key(i), NOW_US).expect("room");
            }
            if kind == "failure_window" {
                // The snapshot writer's drain; its output is freed at once.
                drop(table.take_changes());
            }
            assert_eq!(table.len(), n);
            (vm_rss_bytes() - before, buckets_for(n))
        }
        "expiring_u16" => {
            let mut map = ExpiringMap::<u16>::new(ENTRIES_MAX);
            let before = vm_rss_bytes();
            for i in 0..n64 {
                map.set(mix64(i), Slot { expires_us: NOW_US + 3600 * SECOND, value: 1 }, NOW_US);
            }
            assert_eq!(map.len(), n);
            (vm_rss_bytes() - before, buckets_for(n))
        }
        "expiring_u32x4" => {
            let mut map = ExpiringMap::<[u32; 4]>::new(ENTRIES_MAX);
            let before = vm_rss_bytes();
            for i in 0..n64 {
                map.set(mix64(i), Slot { expires_us: NOW_US + 3600 * SECOND, value: [i as u32; 4] }, NOW_US);
            }
            assert_eq!(map.len(), n);
            (vm_rss_bytes() - before, buckets_for(n))
        }
        other => panic!("unknown table kind {other}"),
    }
}

fn child(kind: &str, n: usize) {
    let (_, name, bucket_bytes, other_bytes) = KINDS.iter().copied().find(|k| k.0 == kind).expect("known table kind");
    let (grown, buckets) = fill(kind, n);
    let per_entry = grown as f64 / n as f64;
    // hashbrown has one control byte per bucket besides the entry.
    let (structure, control) = if kind == "gcra" { ("TatTable", 0) } else { ("hashbrown", 1) };
    let full = (buckets * (bucket_bytes + control)) as f64 / n as f64 + other_bytes as f64;
    println!(
        "{kind}: {n} live entries: VmRSS +{} KiB = {per_entry:.1} bytes/entry \
         ({structure} {buckets} buckets, {:.1}% full; {full:.1} bytes/entry if fully resident)",
        grown / 1024,
        100.0 * n as f64 / buckets as f64,
    );
    println!("{name}={per_entry:.1} entries={n}");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--child") {
        let kind = &args[at + 1];
        let n = args[at + 2].parse().expect("entry count");
        child(kind, n);
        return;
    }
    let exe = std::env::current_exe().expect("own path");
    for (kind, ..) in KINDS {
        for n in FILLS {
            let mut command = Command::new(&exe);
            command.args(["--child", kind, &n.to_string()]);
            if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
                command.env("MALLOC_MMAP_THRESHOLD_", "131072");
            }
            let out = command.output().expect("run child");
            assert!(out.status.success(), "{kind} {n}: {}", String::from_utf8_lossy(&out.stderr));
            print!("{}", String::from_utf8_lossy(&out.stdout));
        }
    }
}
