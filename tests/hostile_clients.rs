//! Clients that misbehave, against real daemons: a thousand stalled
//! half-frames, hostile length prefixes, a client that never reads its
//! replies, clients that ask for large replies, and a flood of refusals
//! aimed at the log. Each test asserts exact outcomes and prints what it
//! measured (`--nocapture` to see it).

mod common;

use std::io::{ErrorKind, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use common::*;
use tollgate::codec::{self, FRAME_HEADER_BYTES, REQUEST_PAYLOAD_BYTES_MAX};
use tollgate::protocol::{Decision, ErrorCode, Outcome, Request, Response, PROTOCOL_VERSION};

const LOGIN: &str = "login";

// ---------------------------------------------------------------------------
// 3. A thousand stalled half-frames

const STALLED: usize = 1000;
const STALL_TIMEOUT_MS: u64 = 1000;

/// Raises this process's soft limit on open files towards `want` (the
/// daemon, spawned after, inherits it); returns the limit now in force.
fn raise_open_file_limit(want: u64) -> u64 {
    use nix::libc;
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain system calls on a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        if limit.rlim_cur < want {
            limit.rlim_cur = want.min(limit.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
        }
    }
    limit.rlim_cur
}

#[test]
fn a_thousand_stalled_half_frames_do_not_stall_others_and_are_freed_after_the_timeout() {
    let limit = raise_open_file_limit(4096);
    // 1,000 stalled connections plus the CLI, the client and the test's own
    // files; with a lower hard limit, as many as fit.
    let stalled = STALLED.min(limit.saturating_sub(100) as usize);
    eprintln!("open-file limit {limit}: {stalled} stalled connections");
    let config = format!("[server]\nframe_read_timeout_ms = {STALL_TIMEOUT_MS}\n");
    let daemon = TestDaemon::start_with(Some(&config), true);
    let rt = runtime();
    let client = daemon.client();
    verdict(rt.block_on(client.check(LOGIN, &subject("198.51.100.7", "alice"))));

    let mut rng = Rng(0x00dd_ba11_5ee0);
    let mut streams = Vec::with_capacity(stalled);
    let first_sent = Instant::now();
    for _ in 0..stalled {
        let mut s = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
        // a random half-frame: part of a header, or a header and less
        // payload than it announces
        let mut half = Vec::new();
        if rng.below(4) == 0 {
            let len = 20 + rng.below(REQUEST_PAYLOAD_BYTES_MAX as u64 - 20) as u32;
            half.extend_from_slice(&len.to_le_bytes()[..1 + rng.below(3) as usize]);
        } else {
            let len = 20 + rng.below(REQUEST_PAYLOAD_BYTES_MAX as u64 - 20) as usize;
            half.extend_from_slice(&(len as u32).to_le_bytes());
            half.push(PROTOCOL_VERSION);
            half.extend((0..rng.below(len as u64 - 1)).map(|_| rng.next() as u8));
        }
        s.write_all(&half).unwrap();
        streams.push(s);
    }
    let last_sent = Instant::now();
    let opened_ms = last_sent.duration_since(first_sent).as_millis();

    // The daemon holds every one of them (none can time out before
    // `first_sent` + the timeout, as a frame's deadline runs from its first
    // byte read).
    let held_by = first_sent + Duration::from_millis(STALL_TIMEOUT_MS * 95 / 100);
    let held_ms = loop {
        let connections = rt.block_on(client.status()).unwrap().connections;
        if connections == stalled as u64 + 1 {
            break first_sent.elapsed().as_millis();
        }
        assert!(Instant::now() < held_by, "{connections} connections open; expected {stalled} stalled + 1");
        std::thread::sleep(Duration::from_millis(5));
    };
    // While they stall: an ordinary client is answered at once.
    let mut latencies = Vec::new();
    for n in 0..50u32 {
        let t = Instant::now();
        let v = verdict(rt.block_on(client.check(LOGIN, &who(v4(0xcb00_7100 + n), Some("bob")))));
        latencies.push(t.elapsed());
        assert_eq!(v.decision, Decision::Allow);
    }
    let checked_ms = first_sent.elapsed().as_millis();
    let (p50, p99, max) = latency_summary(latencies.clone());
    eprintln!(
        "{stalled} half-frames sent in {opened_ms} ms, all held open at {held_ms} ms; 50 ordinary checks while \
         they stall (by {checked_ms} ms): p50 {p50:?} p99 {p99:?} max {max:?}"
    );
    assert!(max < Duration::from_millis(STALL_TIMEOUT_MS / 2), "an ordinary check waited {max:?}");

    // After the timeout the daemon frees them: connections drops to the client's own.
    let deadline = last_sent + Duration::from_millis(STALL_TIMEOUT_MS) + Duration::from_secs(4);
    let freed_at = loop {
        let connections = rt.block_on(client.status()).unwrap().connections;
        if connections == 1 {
            break Instant::now();
        }
        assert!(Instant::now() < deadline, "still {connections} connections 4 s after the read timeout");
        std::thread::sleep(Duration::from_millis(20));
    };
    let freed_ms = freed_at.duration_since(first_sent).as_millis();
    eprintln!("all {stalled} freed {freed_ms} ms after the first was sent (timeout {STALL_TIMEOUT_MS} ms)");
    assert!(freed_ms as u64 >= STALL_TIMEOUT_MS, "freed before the read timeout");
    for (n, s) in streams.iter_mut().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rest = Vec::new();
        match s.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
            Err(e) => panic!("stalled connection {n}: {e}"),
        }
        assert!(rest.is_empty(), "stalled connection {n} got {} bytes for a frame it never finished", rest.len());
    }
    assert_eq!(rt.block_on(client.status()).unwrap().verdicts.errors, 0, "a dropped half-frame is no request");
    let v = verdict(rt.block_on(client.check(LOGIN, &subject("198.51.100.7", "alice"))));
    assert_eq!(v.decision, Decision::Allow);
}

// ---------------------------------------------------------------------------
// 4. Hostile length prefixes

#[test]
fn hostile_length_prefixes_are_refused_from_the_header_without_allocating() {
    let daemon = TestDaemon::start();
    let pid = daemon.pid();
    let connect = || {
        let s = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    // an ordinary connection, open throughout
    let mut ordinary = connect();
    let mut status_frame = Vec::new();
    codec::encode_request(7, &Request::Status, &mut status_frame);
    ordinary.write_all(&status_frame).unwrap();
    assert!(matches!(read_reply(&mut ordinary), (7, Response::Status(_))));
    let (rss_before, peak_before) = (proc_kib(pid, "VmRSS"), proc_kib(pid, "VmPeak"));

    // The largest payload accepted, exactly at the maximum: read whole,
    // refused as malformed, and the connection serves on.
    let mut at_max = connect();
    let mut frame = (REQUEST_PAYLOAD_BYTES_MAX as u32).to_le_bytes().to_vec();
    frame.push(PROTOCOL_VERSION);
    frame.extend_from_slice(&99u64.to_le_bytes());
    frame.extend((0..REQUEST_PAYLOAD_BYTES_MAX - 9).map(|i| (i * 7 + 200) as u8));
    at_max.write_all(&frame).unwrap();
    let (id, reply) = read_reply(&mut at_max);
    assert!(matches!(reply, Response::Error(ref e) if e.code == ErrorCode::Malformed), "{reply:?}");
    assert_eq!(id, 99);
    at_max.write_all(&status_frame).unwrap();
    assert!(matches!(read_reply(&mut at_max), (7, Response::Status(_))));

    // One byte over, 2 GiB and 4 GiB: refused from the header, 200 times.
    let prefixes = [REQUEST_PAYLOAD_BYTES_MAX as u32 + 1, 0x8000_0000, u32::MAX];
    let mut refused = 0;
    for round in 0..10 {
        let mut batch: Vec<_> = (0..20)
            .map(|n| {
                let mut s = connect();
                let mut bytes = prefixes[(round + n) % prefixes.len()].to_le_bytes().to_vec();
                bytes.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7]); // the start of a payload
                s.write_all(&bytes).unwrap();
                s
            })
            .collect();
        for s in &mut batch {
            let (id, reply) = read_reply(s);
            assert!(matches!(reply, Response::Error(ref e) if e.code == ErrorCode::FrameTooLarge), "{reply:?}");
            assert_eq!(id, 0);
            let mut rest = Vec::new();
            match s.read_to_end(&mut rest) {
                Ok(0) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
                other => panic!("the connection stays open after a refused prefix: {other:?}"),
            }
            refused += 1;
        }
        ordinary.write_all(&status_frame).unwrap();
        assert!(matches!(read_reply(&mut ordinary), (7, Response::Status(_))), "the ordinary client is unaffected");
    }
    let (rss_after, peak_after) = (proc_kib(pid, "VmRSS"), proc_kib(pid, "VmPeak"));
    eprintln!(
        "{refused} oversized prefixes refused: daemon RSS {rss_before} -> {rss_after} KiB, \
         VmPeak {peak_before} -> {peak_after} KiB"
    );
    // Buffering even one 2 GiB frame would raise the peak virtual size by
    // 2 GiB (touched or not), and RSS by what was read into it.
    assert!(peak_after - peak_before < 1024 * 1024, "VmPeak grew by {} KiB", peak_after - peak_before);
    assert!(rss_after.saturating_sub(rss_before) < 8 * 1024, "RSS grew by {} KiB", rss_after - rss_before);
    let status = daemon.cli_json(&["status"]);
    assert_eq!(status["verdicts"]["errors"], refused + 1, "one error reply per refused frame");
    // the refused connections are gone: left are `ordinary`, `at_max` and the CLI's
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon.cli_json(&["status"])["connections"] != 3 {
        assert!(Instant::now() < deadline, "refused connections still counted");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `lockouts` is open to anyone who can connect, and its reply lists every
/// lockout. A client that pipelines a thousand of them and never reads gets
/// at most `REPLY_BYTES_BUFFERED_MAX` of replies held for it (not a thousand
/// replies: a quarter of a gigabyte here), and is dropped once it has not
/// taken them for `reply_write_timeout_ms`; others are served throughout.
#[test]
fn a_client_that_never_reads_its_replies_holds_bounded_memory_and_is_dropped() {
    let config = "[server]\nreply_write_timeout_ms = 500\n\
        [routes.trips]\nfail_policy = \"open\"\n[routes.trips.rules.account_failures]\n\
        kind = \"failures\"\nkey = [\"account\"]\nthreshold = 1\nwindow_secs = 3600\nentries_max = 10000\n";
    let daemon = TestDaemon::start_with(Some(config), false);
    let runtime = runtime();
    let accounts: Vec<String> = (0..3000).map(|i| format!("victim{i}")).collect();
    let tripped = runtime.block_on(pipeline(&daemon.socket, accounts.len(), 256, |i, out| {
        report_frame(i, "trips", &who(v4(i as u32), Some(&accounts[i])), Outcome::Failure, out)
    }));
    assert!(tripped.iter().all(|r| matches!(r, Response::Verdict(v) if v.decision != Decision::Allow)));
    let peak_before = proc_kib(daemon.pid(), "VmHWM");

    let mut frames = Vec::new();
    for id in 0..1024 {
        codec::encode_request(id, &Request::Lockouts { limit: 10_000 }, &mut frames);
    }
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    stream.set_write_timeout(Some(Duration::from_secs(15))).unwrap();
    let started = Instant::now();
    let error = loop {
        if let Err(e) = stream.write_all(&frames) {
            break e;
        }
    };
    let dropped_after = started.elapsed();
    assert!(
        matches!(error.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset),
        "the daemon should drop a client that never reads; our write ended with {error:?} after {dropped_after:?}"
    );
    assert!(dropped_after < Duration::from_secs(10), "dropped after {dropped_after:?}");
    let grown_kib = proc_kib(daemon.pid(), "VmHWM").saturating_sub(peak_before);
    assert!(grown_kib < 32 * 1024, "the daemon's peak memory grew by {grown_kib} KiB for one non-reading client");
    let status = runtime.block_on(daemon.client().status()).unwrap();
    assert!(status.limits.iter().any(|l| l.name == "reply_write_timeout_ms" && l.value == 500));
}

// ---------------------------------------------------------------------------
// Large replies

const MANY_LOCKOUTS: usize = 10_000;

/// A daemon with `MANY_LOCKOUTS` lockouts in force: a route whose one rule
/// locks an account at its first failure, and one failure per account,
/// pipelined. One worker thread: with two, a reply built on a worker
/// would leave the other to answer checks, and a test of that could not
/// fail.
fn daemon_with_many_lockouts(rt: &tokio::runtime::Runtime) -> TestDaemon {
    let config = format!(
        "[routes.trips]\nfail_policy = \"open\"\n[routes.trips.rules.account_failures]\n\
         kind = \"failures\"\nkey = [\"account\"]\nthreshold = 1\nwindow_secs = 3600\nentries_max = {}\n",
        MANY_LOCKOUTS * 2
    );
    let mut daemon = TestDaemon::prepare(Some(&config), true);
    daemon.env.push(("TOKIO_WORKER_THREADS".into(), "1".into()));
    daemon.spawn();
    let started = Instant::now();
    let accounts: Vec<String> = (0..MANY_LOCKOUTS).map(|i| format!("victim{i}")).collect();
    let tripped = rt.block_on(pipeline(&daemon.socket, accounts.len(), 512, |i, out| {
        report_frame(i, "trips", &who(v4(i as u32), Some(&accounts[i])), Outcome::Failure, out)
    }));
    assert!(tripped.iter().all(|r| matches!(r, Response::Verdict(v) if v.decision != Decision::Allow)));
    let (_, total) = rt.block_on(daemon.client().lockouts(1)).unwrap();
    assert_eq!(total, MANY_LOCKOUTS as u64);
    eprintln!("{MANY_LOCKOUTS} lockouts made in {:?}", started.elapsed());
    daemon
}

/// Sends `lockouts(10000)` on `stream` and reads the reply's bytes (not
/// decoded: the test's own memory and time stay small); returns its length.
async fn read_big_lockouts(stream: &mut UnixStream, id: u64) -> usize {
    let mut frame = Vec::new();
    codec::encode_request(id, &Request::Lockouts { limit: MANY_LOCKOUTS as u32 }, &mut frame);
    stream.write_all(&frame).await.unwrap();
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).await.unwrap();
    let len = u32::from_le_bytes(header) as usize;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).await.unwrap();
    len
}

const IDLE_BIG_READERS: usize = 300;
const IDLE_BIG_READERS_RSS_GROWTH_KIB_MAX: u64 = 64 * 1024;

/// Connections that each read one 10,000-entry `lockouts` reply (about a
/// megabyte) and then idle hold their resting buffers, not the reply's.
#[test]
fn connections_idle_after_a_large_reply_hold_no_more_than_resting_buffers() {
    let rt = runtime();
    let daemon = daemon_with_many_lockouts(&rt);
    // One first, so the allocator's and the runtime's first growth is not
    // counted against the connections.
    let mut first = rt.block_on(UnixStream::connect(&daemon.socket)).unwrap();
    let one_reply_bytes = rt.block_on(read_big_lockouts(&mut first, 1));
    let rss_before = proc_kib(daemon.pid(), "VmRSS");
    let started = Instant::now();
    let streams = rt.block_on(async {
        let tasks: Vec<_> = (0..IDLE_BIG_READERS)
            .map(|_| {
                let socket = daemon.socket.clone();
                tokio::spawn(async move {
                    let mut stream = UnixStream::connect(&socket).await.unwrap();
                    assert_eq!(read_big_lockouts(&mut stream, 1).await, one_reply_bytes);
                    stream
                })
            })
            .collect();
        let mut streams = Vec::new();
        for t in tasks {
            streams.push(t.await.unwrap());
        }
        streams
    });
    let read_in = started.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let status = rt.block_on(daemon.client().status()).unwrap();
    let rss_after = proc_kib(daemon.pid(), "VmRSS");
    let peak = proc_kib(daemon.pid(), "VmHWM");
    let growth = rss_after.saturating_sub(rss_before);
    eprintln!(
        "{IDLE_BIG_READERS} connections each read a {one_reply_bytes}-byte lockouts reply in {read_in:?} and idle: \
         daemon RSS {rss_before} -> {rss_after} KiB (+{:.1} MiB), peak {peak} KiB",
        growth as f64 / 1024.0
    );
    assert!(status.connections > IDLE_BIG_READERS as u64, "the connections are held: {}", status.connections);
    assert!(growth <= IDLE_BIG_READERS_RSS_GROWTH_KIB_MAX, "RSS grew by {growth} KiB");
    let limit = |name: &str| status.limits.iter().find(|l| l.name == name).map(|l| l.value);
    assert!(limit("lockouts_reply_bytes_max").is_some() && limit("reply_buffer_resting_bytes").is_some());
    drop(streams);
}

const BIG_PIPELINERS: usize = 3;
const TIMED_CHECKS: usize = 3000;

/// While three connections pipeline 10,000-entry `lockouts` requests,
/// another connection's checks do not wait behind them: their p99 stays
/// under a quarter of the time one connection's reply takes. Measured
/// against the same run, not a fixed figure, so a loaded machine slows both
/// sides alike; a reply made on the runtime's worker instead of beside it
/// holds checks for a whole reply. (The absolute figures are printed; the
/// benchmark table has the unloaded ones.)
#[test]
fn pipelined_large_lockouts_do_not_hold_up_another_clients_checks() {
    let rt = runtime();
    let daemon = daemon_with_many_lockouts(&rt);
    let stop = Arc::new(AtomicBool::new(false));
    let replies = Arc::new(AtomicU64::new(0));
    let pipeliners: Vec<_> = (0..BIG_PIPELINERS)
        .map(|_| {
            let (socket, stop, replies) = (daemon.socket.clone(), stop.clone(), replies.clone());
            rt.spawn(async move {
                let mut stream = UnixStream::connect(&socket).await.unwrap();
                // Two in flight: the daemon always has the next one read.
                let mut frames = Vec::new();
                codec::encode_request(0, &Request::Lockouts { limit: MANY_LOCKOUTS as u32 }, &mut frames);
                stream.write_all(&frames).await.unwrap();
                let mut id = 1;
                while !stop.load(Ordering::Relaxed) {
                    read_big_lockouts(&mut stream, id).await;
                    replies.fetch_add(1, Ordering::Relaxed);
                    id += 1;
                }
            })
        })
        .collect();
    // Let the pipeliners get going.
    while replies.load(Ordering::Relaxed) < BIG_PIPELINERS as u64 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let replies_before = replies.load(Ordering::Relaxed);
    // Timed on a thread of its own, with a blocking socket: the test's
    // runtime is busy reading megabytes.
    let socket = daemon.socket.clone();
    let started = Instant::now();
    let latencies = std::thread::spawn(move || {
        let mut stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        (0..TIMED_CHECKS)
            .map(|n| {
                let peer = v4(0xc633_6400 + n as u32);
                let t = Instant::now();
                let reply = call_std(
                    &mut stream,
                    n as u64,
                    &Request::Check { route: LOGIN, subject: who(peer, Some("carol")) },
                );
                let took = t.elapsed();
                assert!(matches!(reply, Response::Verdict(_)), "{reply:?}");
                took
            })
            .collect::<Vec<_>>()
    })
    .join()
    .unwrap();
    let elapsed = started.elapsed();
    let big_replies = replies.load(Ordering::Relaxed) - replies_before;
    stop.store(true, Ordering::Relaxed);
    for p in pipeliners {
        rt.block_on(p).unwrap();
    }
    let (p50, p99, max) = latency_summary(latencies);
    eprintln!(
        "{TIMED_CHECKS} checks in {elapsed:?} while {BIG_PIPELINERS} connections took {big_replies} \
         {MANY_LOCKOUTS}-entry lockouts replies: p50 {p50:?} p99 {p99:?} max {max:?}"
    );
    assert!(big_replies >= BIG_PIPELINERS as u64, "the pipeliners were served meanwhile: {big_replies} replies");
    // A check held up would wait for whole replies; on 2 busy cores a
    // tighter bound than half of one measures the machine, not the daemon.
    let one_reply = elapsed * BIG_PIPELINERS as u32 / big_replies as u32;
    assert!(p99 < one_reply / 2, "check p99 {p99:?} against {one_reply:?} for one lockouts reply");
}

#[test]
fn a_flood_of_refusals_cannot_push_a_lockout_out_of_the_log() {
    // A cap of 5 lines a second; the manual clock keeps everything in one.
    let daemon = TestDaemon::start_with(Some("[server]\nlog_lines_per_sec_max = 5\n"), true);
    fail_five_times(&daemon, &mallory());
    let rt = runtime();
    let client = daemon.client();
    for _ in 0..100 {
        assert_eq!(verdict(rt.block_on(client.check(LOGIN, &mallory()))).decision, Decision::Deny);
    }
    fail_five_times(&daemon, &eve());
    let log = daemon.log();
    let lockouts = log.lines().filter(|l| l.contains(" lockout ") && l.contains("rule=source_failures")).count();
    assert_eq!(lockouts, 2, "mallory's and eve's lockouts are both logged:\n{log}");
    let refusals = log.lines().filter(|l| l.contains("decision=Deny")).count();
    assert_eq!(refusals, 5, "refusal lines keep their own cap:\n{log}");
    let status = daemon.cli_json(&["status"]);
    assert_eq!(status["log_lines_suppressed"], 95, "the other 95 refusals are counted");
}
