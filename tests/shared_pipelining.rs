//! Shared mode: the promise that no request waits longer than
//! `[shared] timeout_ms` for the store holds for a pipelining client too.
//! A run of pipelined checks queues all its store ops before waiting for
//! any, so they share one deadline (and one batch), not one each in turn.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::redis::{require_redis, Proxy, ProxyMode, RedisServer};
use common::*;
use tollgate::codec::{self, FRAME_HEADER_BYTES};
use tollgate::protocol::{Outcome, Response, Subject};

/// The store's path is delayed `DELAY_MS`, well within the timeout: on two
/// loaded cores a single round trip through the proxy was seen to take up
/// to 52 ms, so 50 ms would flag answers degraded that this fix is not
/// about. 16 checks in turn take 16 x 30 ms, far past 3 x 100 ms.
const TIMEOUT_MS: u64 = 100;
const DELAY_MS: u64 = 30;
const PIPELINED: usize = 16;

fn shared_secret(dir: &Path) -> PathBuf {
    let path = dir.join("secret");
    tollgate::Secret::load_or_create(&path).expect("secret");
    path
}

/// One reply with its version-2 extras (the degraded flag).
fn read_reply_extras(stream: &mut std::os::unix::net::UnixStream) -> (u64, Response<'static>, bool) {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
    let mut payload = vec![0u8; u32::from_le_bytes(header) as usize];
    stream.read_exact(&mut payload).unwrap();
    let (id, response, extras) = codec::decode_response_versioned(&payload).unwrap();
    (id, response, extras.degraded)
}

/// A redis-server behind a proxy, and a daemon sharing it with `shared`
/// added to its `[shared]` table and `rest` after it.
fn daemon_behind_proxy(shared: &str, rest: &str) -> (RedisServer, Proxy, tempfile::TempDir, TestDaemon) {
    require_redis();
    let redis = RedisServer::tcp();
    let proxy = Proxy::new(redis.addr());
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let config = format!(
        "secret = \"{}\"\n\n[shared]\nurl = \"{}\"\nbreaker_failures = 100\nhosts = 3\n\
         probe_interval_ms = 50\nprobe_max_ms = 200\nheartbeat_ms = 60000\nhost_ttl_ms = 180000\n{shared}\n{rest}",
        secret.display(),
        proxy.url()
    );
    let daemon = TestDaemon::start_with(Some(&config), false);
    (redis, proxy, dir, daemon)
}

#[test]
fn a_pipeline_of_checks_waits_for_a_slow_store_about_one_timeout_not_one_per_check() {
    let (_redis, proxy, _dir, daemon) = daemon_behind_proxy(&format!("timeout_ms = {TIMEOUT_MS}"), "");
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    // The store answers (not degraded) before the path is slowed.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut frame = Vec::new();
        check_frame(0, "login", &subject("192.0.2.200", "warmup"), &mut frame);
        stream.write_all(&frame).unwrap();
        if !read_reply_extras(&mut stream).2 {
            break;
        }
        assert!(Instant::now() < deadline, "the store never answered:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    // The heartbeat is a minute apart: its reply, delayed too, does not
    // queue before a pipeline's on the proxy.
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(DELAY_MS)));
    let mut elapsed = Vec::new();
    let mut degraded_ids = Vec::new();
    for round in 0..3 {
        let accounts: Vec<String> = (0..PIPELINED).map(|n| format!("pipelined-{round}-{n}")).collect();
        let mut frames = Vec::new();
        for (n, account) in accounts.iter().enumerate() {
            let s = Subject { peer: Some(ip("192.0.2.201")), account: Some(account), ..Subject::default() };
            check_frame(n + 1, "login", &s, &mut frames);
        }
        let started = Instant::now();
        stream.write_all(&frames).unwrap();
        for n in 0..PIPELINED {
            let (id, response, degraded) = read_reply_extras(&mut stream);
            assert_eq!(id, n as u64 + 1, "replies keep their order");
            assert!(matches!(response, Response::Verdict(_)), "{response:?}");
            if degraded {
                degraded_ids.push((round, id));
            }
        }
        elapsed.push(started.elapsed());
    }
    let slowest = elapsed.iter().copied().max().unwrap();
    assert!(
        slowest < Duration::from_millis(3 * TIMEOUT_MS),
        "a pipeline of {PIPELINED} checks took {slowest:?}: they waited for the store in turn (rounds: {elapsed:?})"
    );
    let (_, shared) = runtime().block_on(daemon.client().status_with_shared()).unwrap();
    let shared = shared.unwrap();
    let batches = (shared.batches, shared.batched_ops, shared.timeouts);
    assert!(
        degraded_ids.is_empty(),
        "checks (round, id) waited past the timeout (rounds: {elapsed:?}; batches, ops, timeouts: {batches:?}): \
         {degraded_ids:?}\n{}",
        daemon.log()
    );
}

/// A report whose connection goes before its reply is still counted in the
/// store. A pipelining client sends a run of 16 frames and closes at once:
/// a check and a failure report on a host rule that locks at once, then
/// 14 failure reports on a global rule. The daemon begins the whole run
/// (queueing the 14 store ops), then answers in order; the lockout's
/// durable write sends the check's reply first, finds the client gone and
/// drops the rest of the run's tickets while the slow store (one op a
/// batch, four at a time) has most of the ops still queued. Nobody will
/// count those on the share, so the dispatcher sends them anyway: the
/// account's rule, at 14, locks (before, 3 were sent).
#[test]
fn reports_whose_connection_closed_before_their_replies_are_counted_in_the_store() {
    orphaned_reports_lock_the_account("", 300);
}

/// The same with a queue of one: most reports never fit in it and are held
/// by their tickets, which queue them as they go. Each waits at most
/// `LATE_REPLY_WAIT_MS` (1 s) for room: replies 40 ms late, four at a
/// time, drain the 14 in about 150 ms, room to spare on a loaded machine
/// (at 100 ms it failed about one CI run in 30).
#[test]
fn reports_held_for_queue_room_when_their_connection_closed_are_counted_in_the_store() {
    orphaned_reports_lock_the_account("pending_max = 1\n", 40);
}

fn orphaned_reports_lock_the_account(shared_extra: &str, delay_ms: u64) {
    let (_redis, proxy, _dir, daemon) = daemon_behind_proxy(
        &format!("timeout_ms = 1000\nbatch_max = 1\n{shared_extra}"),
        "[responses]\njitter_percent = 0\n\
         [routes.h.rules.at_once]\nkind = \"failures\"\nkey = [\"account\"]\nthreshold = 1\n\
         window_secs = 600\nresponses = [\"deny\"]\nscope = \"host\"\n\
         [routes.t.rules.account]\nkind = \"failures\"\nkey = [\"account\"]\nthreshold = 14\n\
         window_secs = 600\nresponses = [\"deny\"]\nscope = \"global\"\n",
    );
    let check = |peer: &str, account: &str| {
        let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
        let mut frame = Vec::new();
        check_frame(1, "t", &subject(peer, account), &mut frame);
        stream.write_all(&frame).unwrap();
        match read_reply_extras(&mut stream) {
            (_, Response::Verdict(v), degraded) => (v.proceeds(), degraded),
            (_, other, _) => panic!("not a verdict: {other:?}"),
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while check("192.0.2.200", "warmup").1 {
        assert!(Instant::now() < deadline, "the store never answered:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }

    let ops_sent = || {
        let (_, shared) = runtime().block_on(daemon.client().status_with_shared()).unwrap();
        shared.expect("shared status").batched_ops
    };
    let before = ops_sent();
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(delay_ms)));
    // One run: the daemon plans and begins 16 frames at a time.
    let mut frames = Vec::new();
    check_frame(1, "h", &subject("192.0.2.60", "other"), &mut frames);
    report_frame(2, "h", &subject("192.0.2.60", "other"), Outcome::Failure, &mut frames);
    for n in 3..=16 {
        report_frame(n, "t", &subject("192.0.2.50", "victim"), Outcome::Failure, &mut frames);
    }
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    stream.write_all(&frames).unwrap();
    drop(stream);
    // Every report's op sent (the store runs each as it arrives; only
    // the replies are slowed), or long past the time that takes.
    let deadline = Instant::now() + Duration::from_secs(10);
    while ops_sent() < before + 14 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    proxy.set_mode(ProxyMode::Pass);

    let (proceeds, degraded) = check("198.51.100.7", "victim");
    assert!(!degraded, "the store decided");
    assert!(
        !proceeds,
        "the account has 14 failures in the store; ops sent {} of 14\n{}",
        ops_sent() - before - 1,
        daemon.log()
    );
}
