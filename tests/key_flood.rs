//! A flood of ten million distinct keys against a real daemon: its memory
//! stays within the bound the table caps imply, and lockouts made before
//! the flood hold. Prints what it measured (`--nocapture` to see it).

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use common::*;
use tollgate::client::{Client, ClientConfig};
use tollgate::codec::{self, FRAME_HEADER_BYTES, RESPONSE_PAYLOAD_BYTES_MAX};
use tollgate::protocol::{Decision, Outcome, Reason, Response};

const LOGIN: &str = "login";

/// Like `common::pipeline`, but hands each reply to `check` instead of
/// keeping it, so ten million replies cost no memory; returns the replies
/// handled.
async fn flood(
    socket: &Path,
    count: usize,
    window: usize,
    mut make: impl FnMut(usize, &mut Vec<u8>),
    mut check: impl FnMut(usize, Response<'static>),
) -> usize {
    let mut stream = UnixStream::connect(socket).await.unwrap();
    let mut out = Vec::with_capacity(window * 128);
    let mut inbuf: Vec<u8> = Vec::with_capacity(512 * 1024);
    let mut chunk = vec![0u8; 256 * 1024];
    let (mut sent, mut got) = (0usize, 0usize);
    while got < count {
        out.clear();
        while sent < count && sent - got < window {
            make(sent, &mut out);
            sent += 1;
        }
        if !out.is_empty() {
            stream.write_all(&out).await.unwrap();
        }
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "daemon closed the connection after {got} replies");
        inbuf.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        while let Some(end) = codec::frame_len(&inbuf[at..], RESPONSE_PAYLOAD_BYTES_MAX).unwrap() {
            let (id, response) = codec::decode_response(&inbuf[at + FRAME_HEADER_BYTES..at + end]).unwrap();
            assert_eq!(id as usize, got, "replies come in order");
            check(got, response);
            got += 1;
            at += end;
        }
        inbuf.drain(..at);
    }
    got
}

// ---------------------------------------------------------------------------
// 5. The flood

const CLAIMED_ACCOUNTS: usize = 10_000_000;
const CLAIMED_CONNECTIONS: usize = 2;
const DISTINCT_64S: usize = 1_000_000;
const SPRAYED_ACCOUNTS: usize = 1000;
const FLOOD_WINDOW: usize = 512;
/// Bytes per entry a full table may cost, from the layouts: a failure entry
/// is a 48-byte slot in a Vec that grows by doubling (<= 96), its index
/// bucket (a u32 and a control byte at 7/16 load or more: <= 12, and <= 18
/// while a doubling holds both arrays), and up to two 16-byte keys on the
/// change lists (bounded at twice the cap; <= 64 with doubling). A rate
/// entry is a 16-byte hashbrown bucket and a control byte, at most doubled
/// by growth.
const FAILURE_ENTRY_BYTES: u64 = 180;
const RATE_ENTRY_BYTES: u64 = 40;
/// redb's 16 MiB cache, the connections' 64 KiB buffers, a snapshot's
/// changes on their way to the writer, allocator slack.
const FIXED_BYTES: u64 = 64 << 20;

#[derive(Default, Debug, Clone, Copy)]
struct Tally {
    allow: u64,
    deny: u64,
    other: u64,
}

impl Tally {
    fn add(&mut self, reply: &Response<'_>) {
        match reply {
            Response::Verdict(v) if v.decision == Decision::Allow => self.allow += 1,
            Response::Verdict(v) if v.decision == Decision::Deny => self.deny += 1,
            _ => self.other += 1,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_10m_claimed_accounts_and_1m_ipv6_64s_stays_bounded_and_keeps_lockouts() {
    let daemon = TestDaemon::start_with(Some(COUNTING_RULES_ONLY), true);
    let pid = daemon.pid();
    let client = daemon.client();
    let victim = subject("198.51.100.99", "frank");
    for _ in 0..5 {
        verdict(client.report(LOGIN, &victim, Outcome::Failure).await);
    }
    assert_eq!(verdict(client.check(LOGIN, &victim).await).decision, Decision::Deny);
    let rss_before = proc_kib(pid, "VmRSS");

    // An ordinary user, checked every 2 ms from a thread of its own, each
    // time from a fresh address, while the flood runs.
    let stop = Arc::new(AtomicBool::new(false));
    let ordinary = {
        let (socket, stop) = (daemon.socket.clone(), stop.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let client = Client::new(ClientConfig::new(&socket).timeout(Duration::from_secs(10)));
            let (mut latencies, mut n, begun) = (Vec::new(), 0u32, Instant::now());
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let ordinary = who(v4(0x6440_0000 + n), Some("ordinary"));
                let v = verdict(rt.block_on(client.check(LOGIN, &ordinary)));
                latencies.push((t.duration_since(begun), t.elapsed()));
                assert_eq!((v.decision, v.reason), (Decision::Allow, Reason::Allowed), "ordinary check {n}");
                // A login completes: its report settles the check's place.
                verdict(rt.block_on(client.report(LOGIN, &ordinary, Outcome::Success)));
                n += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            latencies
        })
    };

    let started = Instant::now();
    let mut floods = Vec::new();
    // 10,000,000 distinct claimed accounts failing once each, from a botnet
    // of 1,000 IPv4 addresses.
    for part in 0..CLAIMED_CONNECTIONS {
        let socket = daemon.socket.clone();
        floods.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let per = CLAIMED_ACCOUNTS / CLAIMED_CONNECTIONS;
            let mut account = String::new();
            let n = flood(
                &socket,
                per,
                FLOOD_WINDOW,
                |i, out| {
                    use std::fmt::Write as _;
                    let global = part * per + i;
                    account.clear();
                    write!(account, "claimed-{global}").unwrap();
                    let s = who(v4(0x0a09_0000 + (global % 1000) as u32), Some(&account));
                    report_frame(i, LOGIN, &s, Outcome::Failure, out);
                },
                |_, reply| tally.add(&reply),
            )
            .await;
            ("claimed-account reports", n, tally)
        }));
    }
    // 1,000,000 /64s each checking the `request` route once.
    let socket = daemon.socket.clone();
    floods.push(tokio::spawn(async move {
        let mut tally = Tally::default();
        let n = flood(
            &socket,
            DISTINCT_64S,
            FLOOD_WINDOW,
            |i, out| check_frame(i, "request", &who(own_64(0x2a00, 0x0001, i as u32), None), out),
            |_, reply| tally.add(&reply),
        )
        .await;
        ("request checks from distinct /64s", n, tally)
    }));
    // 1,000,000 /64s each logging in once: a bystander's successful login
    // (check, then report), and a failed login spraying 1,000 accounts (a
    // distinct /64 per attempt).
    let socket = daemon.socket.clone();
    floods.push(tokio::spawn(async move {
        let (mut checks, mut reports) = (Tally::default(), Tally::default());
        let mut account = String::new();
        let n = flood(
            &socket,
            3 * DISTINCT_64S,
            FLOOD_WINDOW,
            |i, out| {
                let source = own_64(0x2a00, 0x0002, (i / 3) as u32);
                if i % 3 == 0 {
                    check_frame(i, LOGIN, &who(source, Some("bystander")), out);
                } else if i % 3 == 1 {
                    report_frame(i, LOGIN, &who(source, Some("bystander")), Outcome::Success, out);
                } else {
                    use std::fmt::Write as _;
                    account.clear();
                    write!(account, "sprayed-{}", (i / 3) % SPRAYED_ACCOUNTS).unwrap();
                    report_frame(i, LOGIN, &who(source, Some(&account)), Outcome::Failure, out);
                }
            },
            |i, reply| match i % 3 {
                0 => checks.add(&reply),
                1 => {}
                _ => reports.add(&reply),
            },
        )
        .await;
        assert_eq!(checks.allow, DISTINCT_64S as u64, "login checks from fresh /64s: {checks:?}");
        ("login check + report from distinct /64s", n, reports)
    }));
    let mut results = Vec::new();
    for f in floods {
        results.push(f.await.unwrap());
    }
    let flood_secs = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let timed = ordinary.join().unwrap();
    let latencies: Vec<Duration> = timed.iter().map(|t| t.1).collect();
    let mut slowest = timed.clone();
    slowest.sort_by_key(|t| std::cmp::Reverse(t.1));
    slowest.truncate(5);
    eprintln!("slowest ordinary checks (at, took): {slowest:?}");
    let rss_after = proc_kib(pid, "VmRSS");
    let rss_peak = proc_kib(pid, "VmHWM");
    let total: usize = results.iter().map(|r| r.1).sum();
    for (what, n, tally) in &results {
        eprintln!("{what}: {n} replies, {tally:?}");
    }
    eprintln!("flood: {total} requests in {flood_secs:.1} s ({:.0} per second)", total as f64 / flood_secs);
    let (p50, p99, max) = latency_summary(latencies.clone());
    let over_5ms = latencies.iter().filter(|l| **l > Duration::from_millis(5)).count();
    eprintln!(
        "ordinary client during the flood: {} checks, p50 {p50:?} p99 {p99:?} max {max:?}; {over_5ms} over the \
         client's default 5 ms timeout",
        latencies.len()
    );

    // Exact outcomes: every one-off key is allowed; each sprayed account is
    // refused from its 50th failure on, whatever the source.
    let claimed: Vec<_> = results.iter().filter(|r| r.0 == "claimed-account reports").collect();
    assert_eq!(claimed.iter().map(|r| r.2.allow).sum::<u64>(), CLAIMED_ACCOUNTS as u64, "{claimed:?}");
    let request = results.iter().find(|r| r.0.starts_with("request")).unwrap().2;
    assert_eq!(request.allow, DISTINCT_64S as u64, "{request:?}");
    let sprayed = results.iter().find(|r| r.0.starts_with("login check")).unwrap().2;
    let allowed_per_account = 49; // the default ceiling is 50
    assert_eq!(
        (sprayed.allow, sprayed.deny, sprayed.other),
        (
            (SPRAYED_ACCOUNTS * allowed_per_account) as u64,
            (DISTINCT_64S - SPRAYED_ACCOUNTS * allowed_per_account) as u64,
            0
        )
    );

    // Memory: bounded by the caps the daemon reports, not by the flood.
    let status = daemon.cli_json(&["status"]);
    let touched = [
        ("login", "source_failures"),
        ("login", "account_failures"),
        ("login", "source_rate"),
        ("request", "source_rate"),
    ];
    let mut bound = FIXED_BYTES;
    for route in status["routes"].as_array().unwrap() {
        for rule in route["rules"].as_array().unwrap() {
            let (entries, max) = (rule["entries"].as_u64().unwrap(), rule["entries_max"].as_u64().unwrap());
            assert!(entries <= max, "{} {}: {entries} entries over the cap {max}", route["name"], rule["name"]);
            let name = (route["name"].as_str().unwrap(), rule["name"].as_str().unwrap());
            if touched.contains(&name) {
                let per_entry = if rule["kind"] == "failures" { FAILURE_ENTRY_BYTES } else { RATE_ENTRY_BYTES };
                bound += max * per_entry;
                eprintln!("  {}/{}: {entries} of {max} entries", name.0, name.1);
            }
        }
    }
    let bound_kib = bound / 1024;
    let growth_kib = rss_after.saturating_sub(rss_before);
    eprintln!(
        "daemon RSS {rss_before} KiB -> {rss_after} KiB (+{:.1} MiB; peak {rss_peak} KiB, +{:.1} MiB); \
         bound on growth {:.1} MiB; state file {} KiB",
        growth_kib as f64 / 1024.0,
        rss_peak.saturating_sub(rss_before) as f64 / 1024.0,
        bound_kib as f64 / 1024.0,
        std::fs::metadata(&daemon.state).unwrap().len() / 1024
    );
    assert!(rss_peak.saturating_sub(rss_before) < bound_kib, "peak RSS grew past the bound");

    // The lockout from before the flood holds, and exactly the expected
    // lockouts are in force: frank's, and the 1,000 sprayed accounts'.
    let v = verdict(client.check(LOGIN, &victim).await);
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"));
    let (_, total_lockouts) = client.lockouts(1).await.unwrap();
    assert_eq!(total_lockouts, 1 + SPRAYED_ACCOUNTS as u64);
    // Latency is printed, not bounded tightly: the flood's own generator
    // shares the cores. The median says the flood does not starve others.
    assert!(p50 < Duration::from_millis(50), "median ordinary check {p50:?} during the flood");
}
