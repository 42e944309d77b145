//! Hardening, against real daemons: `kill -9` at random moments, SIGTERM
//! under pipelined load, a thousand stalled half-frames, hostile length
//! prefixes, and a flood of ten million distinct keys. Each test asserts
//! exact outcomes and prints what it measured (`--nocapture` to see it).

mod common;

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use common::*;
use tollgate::client::{Client, ClientConfig};
use tollgate::codec::{self, FRAME_HEADER_BYTES, REQUEST_PAYLOAD_BYTES_MAX, RESPONSE_PAYLOAD_BYTES_MAX};
use tollgate::keys::{KeyDeriver, Secret};
use tollgate::protocol::{Decision, ErrorCode, Outcome, Reason, Request, Response, Subject, PROTOCOL_VERSION};

const LOGIN: &str = "login";

/// xorshift64: seeded, so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn v4(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(n))
}

/// An address in a /64 of its own for every `n` (the /64 is the first four
/// segments; `n` fills the third and fourth).
fn own_64(first: u16, second: u16, n: u32) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(first, second, (n >> 16) as u16, n as u16, 0x1a2b, 0x3c4d, 0, 1))
}

fn who(peer: IpAddr, account: Option<&str>) -> Subject<'_> {
    Subject { peer: Some(peer), account, ..Subject::default() }
}

/// A field of /proc/PID/status in KiB (VmRSS, VmHWM, VmPeak...).
fn proc_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|v| v.strip_prefix(':')))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn latency_summary(mut samples: Vec<Duration>) -> (Duration, Duration, Duration) {
    samples.sort();
    (percentile(&samples, 0.5), percentile(&samples, 0.99), *samples.last().unwrap())
}

/// One connection speaking the raw protocol, one request at a time. Unlike
/// the pooled client it reports every I/O error as such (a killed daemon).
struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
    next_id: u64,
}

impl Conn {
    async fn connect(socket: &Path) -> std::io::Result<Conn> {
        Ok(Conn { stream: UnixStream::connect(socket).await?, buf: Vec::new(), next_id: 1 })
    }

    async fn call(&mut self, request: &Request<'_>) -> std::io::Result<Response<'static>> {
        let id = self.next_id;
        self.next_id += 1;
        self.buf.clear();
        codec::encode_request(id, request, &mut self.buf);
        self.stream.write_all(&self.buf).await?;
        let mut header = [0u8; FRAME_HEADER_BYTES];
        self.stream.read_exact(&mut header).await?;
        let len = u32::from_le_bytes(header) as usize;
        assert!(len <= RESPONSE_PAYLOAD_BYTES_MAX, "reply length {len}");
        let mut payload = vec![0u8; len];
        self.stream.read_exact(&mut payload).await?;
        let (reply_id, response) = codec::decode_response(&payload).expect("a complete reply decodes");
        assert_eq!(reply_id, id, "the reply names its request");
        Ok(response)
    }
}

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

fn check_frame(id: usize, route: &str, subject: &Subject<'_>, out: &mut Vec<u8>) {
    codec::encode_request(id as u64, &Request::Check { route, subject: subject.clone() }, out);
}

// ---------------------------------------------------------------------------
// 1. kill -9, 200 times

const KILL_ROUNDS: usize = 200;
const KILL_STREAMS: usize = 2;
const KILL_THRESHOLD: u32 = 2;
const KILL_SEED: u64 = 0x7011_6a7e_c4a5_4001;

/// What the report streams did, across every start of the daemon.
#[derive(Default)]
struct Ledger {
    /// Pairs whose threshold-th failure was written (whole or in part)
    /// before the kill: the daemon may have counted it, or not.
    sent: Vec<u32>,
    /// Pairs whose tripping report was answered `deny`: the lockout must
    /// survive every later kill.
    acknowledged: Vec<u32>,
}

/// Pair `n`: an account and a /32 of its own, used by no other pair.
fn crash_pair(n: u32) -> (String, IpAddr) {
    (format!("crash-{n}"), v4(0x0a00_0000 + n))
}

/// Trips lockouts on fresh pairs, one after the other, until the daemon
/// dies under it.
async fn trip_lockouts(socket: PathBuf, next_pair: Arc<AtomicU64>, ledger: Arc<Mutex<Ledger>>) {
    let Ok(mut conn) = Conn::connect(&socket).await else { return };
    loop {
        let n = next_pair.fetch_add(1, Ordering::Relaxed) as u32;
        let (account, source) = crash_pair(n);
        let report = Request::Report {
            route: LOGIN,
            subject: who(source, Some(&account)),
            outcome: Outcome::Failure,
            password_digest: None,
        };
        for k in 1..=KILL_THRESHOLD {
            if k == KILL_THRESHOLD {
                ledger.lock().unwrap().sent.push(n);
            }
            let Ok(reply) = conn.call(&report).await else { return };
            let Response::Verdict(v) = reply else { panic!("pair {n} report {k}: {reply:?}") };
            if k < KILL_THRESHOLD {
                assert_eq!((v.decision, v.remaining), (Decision::Allow, KILL_THRESHOLD - k), "pair {n} report {k}");
            } else {
                assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"), "pair {n}");
                ledger.lock().unwrap().acknowledged.push(n);
            }
        }
    }
}

#[test]
fn kill_9_at_random_moments_200_times_never_loses_or_invents_a_lockout() {
    let started = Instant::now();
    let config = format!("[routes.login.rules.source_failures]\nthreshold = {KILL_THRESHOLD}\n");
    let mut daemon = TestDaemon::start_with(Some(&config), true);
    let rt = runtime();
    let mut rng = Rng(KILL_SEED);
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let next_pair = Arc::new(AtomicU64::new(0));
    let deriver = KeyDeriver::new(&Secret::load_or_create(&daemon.dir.path().join("secret")).unwrap());
    // account tag -> pair, for every pair sent its threshold
    let mut tag_of_sent: HashMap<u64, u32> = HashMap::new();
    let (mut kill_after_us, mut restart_time, mut checks_pipelined) = (Vec::new(), Duration::ZERO, 0usize);
    for round in 1..=KILL_ROUNDS {
        let streams: Vec<_> = (0..KILL_STREAMS)
            .map(|_| rt.spawn(trip_lockouts(daemon.socket.clone(), next_pair.clone(), ledger.clone())))
            .collect();
        let sleep_us = rng.below(30_001);
        kill_after_us.push(sleep_us);
        std::thread::sleep(Duration::from_micros(sleep_us));
        daemon.kill9();
        for s in streams {
            rt.block_on(s).unwrap(); // a wrong verdict in a stream panics here
        }
        let t = Instant::now();
        daemon.spawn();
        restart_time += t.elapsed();

        let (sent, acknowledged) = {
            let l = ledger.lock().unwrap();
            (l.sent.clone(), l.acknowledged.clone())
        };
        for &n in &sent {
            tag_of_sent.entry(deriver.account_tag(&crash_pair(n).0)).or_insert(n);
        }
        let client = Client::new(ClientConfig::new(&daemon.socket).timeout(Duration::from_secs(10)));
        let (listed, total) = rt.block_on(client.lockouts(10_000)).unwrap();
        // None lost, none invented: every acknowledged pair is locked, and
        // every lockout is one of the pairs sent their threshold.
        assert!(
            acknowledged.len() as u64 <= total && total <= sent.len() as u64,
            "round {round}: {} acknowledged <= {total} in force <= {} sent",
            acknowledged.len(),
            sent.len()
        );
        for lockout in &listed {
            assert_eq!((lockout.route.as_str(), lockout.rule.as_str()), (LOGIN, "source_failures"), "{lockout:?}");
            let tag = u64::from_str_radix(&lockout.key[..16], 16).unwrap();
            assert!(tag_of_sent.contains_key(&tag), "round {round}: a lockout no stream sent: {lockout:?}");
        }
        let replies = rt.block_on(pipeline(&daemon.socket, acknowledged.len(), 512, |i, out| {
            let (account, source) = crash_pair(acknowledged[i]);
            check_frame(i, LOGIN, &who(source, Some(&account)), out);
        }));
        checks_pipelined += replies.len();
        for (i, reply) in replies.iter().enumerate() {
            assert!(
                matches!(reply, Response::Verdict(v) if v.decision == Decision::Deny && v.rule == "source_failures"),
                "round {round}: acknowledged lockout of pair {} lost: {reply:?}",
                acknowledged[i]
            );
        }
        if round % 20 == 0 || round == KILL_ROUNDS {
            let cli = daemon.cli_json(&["lockouts", "--limit", "1"]);
            let cli_total = cli["total"].as_u64().unwrap();
            assert_eq!(cli_total, total, "the CLI sees the same lockouts");
            eprintln!(
                "round {round:3}: {} pairs sent their threshold, {} acknowledged, {total} lockouts in force",
                sent.len(),
                acknowledged.len()
            );
        }
    }
    let l = ledger.lock().unwrap();
    assert!(l.acknowledged.len() >= KILL_ROUNDS, "the streams tripped too few lockouts to mean anything");
    let mean_kill_ms = kill_after_us.iter().sum::<u64>() as f64 / kill_after_us.len() as f64 / 1000.0;
    eprintln!(
        "kill -9: {KILL_ROUNDS} rounds (seed {KILL_SEED:#x}, kill after 0-30 ms, mean {mean_kill_ms:.1} ms), \
         {} lockouts acknowledged and all verified after every restart ({checks_pipelined} checks), \
         {} pairs sent their threshold, mean restart {:.1} ms, {:.1} s in all",
        l.acknowledged.len(),
        l.sent.len(),
        restart_time.as_secs_f64() * 1000.0 / KILL_ROUNDS as f64,
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------
// 2. SIGTERM under pipelined load

const STOP_CONNECTIONS: u16 = 4;
const STOP_GRACE_MS: u64 = 3000;

/// Request `id` of load connection `c`: every 8th is a login failure on a
/// pair of its own, the others checks on `request` from one address.
fn stop_load_frame(c: u16, id: u64, out: &mut Vec<u8>) {
    if id % 8 == 7 {
        let account = format!("load-{c}-{id}");
        let subject = who(own_64(0x2001, c, id as u32), Some(&account));
        let report = Request::Report { route: LOGIN, subject, outcome: Outcome::Failure, password_digest: None };
        codec::encode_request(id, &report, out);
    } else {
        codec::encode_request(id, &Request::Check { route: "request", subject: who(v4(0xc633_64c8), None) }, out);
    }
}

#[derive(Debug, Default)]
struct LoadResult {
    /// Frames the kernel accepted whole before the daemon closed.
    written: u64,
    replies: u64,
    /// Ids of the report replies received.
    answered_reports: Vec<u64>,
    /// Bytes left after the last whole reply when the connection closed.
    trailing_bytes: usize,
    closed_at: Option<Instant>,
}

async fn stop_load(socket: PathBuf, c: u16) -> LoadResult {
    let stream = UnixStream::connect(&socket).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let writer = tokio::spawn(async move {
        let (mut out, mut ends) = (Vec::new(), Vec::new());
        let (mut id, mut written) = (0u64, 0u64);
        let safety = Instant::now() + Duration::from_secs(30);
        while Instant::now() < safety {
            out.clear();
            ends.clear();
            for _ in 0..64 {
                stop_load_frame(c, id, &mut out);
                ends.push(out.len());
                id += 1;
            }
            let mut at = 0;
            while at < out.len() {
                match wr.write(&out[at..]).await {
                    Ok(n) if n > 0 => at += n,
                    _ => return written + ends.iter().take_while(|&&end| end <= at).count() as u64,
                }
            }
            written += ends.len() as u64;
        }
        written
    });
    let mut result = LoadResult::default();
    let mut inbuf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match tokio::time::timeout(Duration::from_secs(40), rd.read(&mut chunk)).await {
            Ok(Ok(n)) => n,
            Ok(Err(e)) if e.kind() == ErrorKind::ConnectionReset => 0,
            Ok(Err(e)) => panic!("connection {c}: {e}"),
            Err(_) => panic!("connection {c}: the daemon neither answered nor closed in 40 s"),
        };
        if n == 0 {
            result.closed_at = Some(Instant::now());
            result.trailing_bytes = inbuf.len();
            break;
        }
        inbuf.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        while let Some(end) = codec::frame_len(&inbuf[at..], RESPONSE_PAYLOAD_BYTES_MAX).unwrap() {
            let (id, reply) = codec::decode_response(&inbuf[at + FRAME_HEADER_BYTES..at + end])
                .unwrap_or_else(|e| panic!("connection {c}: garbled reply {}: {e:?}", result.replies));
            assert_eq!(id, result.replies, "connection {c}: replies in request order");
            let Response::Verdict(v) = reply else { panic!("connection {c} reply {id}: {reply:?}") };
            if id % 8 == 7 {
                assert_eq!((v.decision, v.remaining), (Decision::Allow, 4), "connection {c} report {id}");
                result.answered_reports.push(id);
            } else {
                assert_eq!(v.rule, "source_rate", "connection {c} check {id}");
            }
            result.replies += 1;
            at += end;
        }
        inbuf.drain(..at);
    }
    result.written = writer.await.unwrap();
    result
}

/// What a stop guarantees a client that never stops sending: the daemon
/// answers what it has read and closes, so the replies are a prefix of the
/// requests (whole frames, ids in order, none garbled); requests still in
/// the socket when it closes go unanswered and uncounted. Every report it
/// answered is restored after the restart, and it counted none it did not
/// answer.
#[test]
fn sigterm_under_pipelined_load_answers_in_order_exits_0_and_keeps_counters() {
    // Room for every load report, so no entry is evicted before the count.
    let config = format!(
        "[server]\nshutdown_grace_ms = {STOP_GRACE_MS}\n\
         [routes.login.rules.source_failures]\nentries_max = 1000000\n\
         [routes.login.rules.account_failures]\nentries_max = 1000000\n"
    );
    let mut daemon = TestDaemon::start_with(Some(&config), true);
    let rt = runtime();
    let dave = who(v4(0xc633_6443), Some("dave")); // 198.51.100.67
    {
        let client = daemon.client();
        for n in 1..=4 {
            let v = verdict(rt.block_on(client.report(LOGIN, &dave, Outcome::Failure)));
            assert_eq!((v.decision, v.remaining), (Decision::Allow, 5 - n));
        }
    }
    let loads: Vec<_> = (0..STOP_CONNECTIONS).map(|c| rt.spawn(stop_load(daemon.socket.clone(), c))).collect();
    std::thread::sleep(Duration::from_millis(400));
    let sigterm_at = Instant::now();
    let status = daemon.terminate();
    let exit_ms = sigterm_at.elapsed().as_millis();
    let results: Vec<LoadResult> = loads.into_iter().map(|l| rt.block_on(l).unwrap()).collect();
    let mut answered_reports = 0u64;
    let mut written_reports = 0u64;
    for (c, r) in results.iter().enumerate() {
        let closed_ms = r.closed_at.map(|t| t.saturating_duration_since(sigterm_at).as_millis() as i64);
        eprintln!(
            "connection {c}: {} requests written whole, {} answered ({} not), {} reports answered, \
             closed {closed_ms:?} ms after SIGTERM, {} trailing bytes",
            r.written,
            r.replies,
            r.written - r.replies,
            r.answered_reports.len(),
            r.trailing_bytes
        );
        assert_eq!(r.trailing_bytes, 0, "connection {c}: a reply was cut off");
        assert!(r.replies <= r.written, "connection {c}: more replies than requests");
        assert!(r.replies > 1000, "connection {c}: the load did not run ({} replies)", r.replies);
        answered_reports += r.answered_reports.len() as u64;
        written_reports += (0..r.written).filter(|id| id % 8 == 7).count() as u64;
    }
    eprintln!("SIGTERM: exit {status} after {exit_ms} ms (grace {STOP_GRACE_MS} ms)");
    assert_eq!(status.code(), Some(0), "{}", daemon.log());
    assert!((exit_ms as u64) < STOP_GRACE_MS + 1000, "the daemon took {exit_ms} ms to stop");

    daemon.spawn();
    let client = daemon.client();
    // Every report processed before the stop is restored: exactly the
    // answered ones, plus any the daemon read but could not answer.
    let status = rt.block_on(client.status()).unwrap();
    let login = status.routes.iter().find(|r| r.name == LOGIN).unwrap();
    let entries = login.rules.iter().find(|r| r.name == "source_failures").unwrap().entries;
    let restored_load_reports = entries - 1; // dave's entry
    eprintln!(
        "restart: {restored_load_reports} load reports restored; {answered_reports} answered, \
         {written_reports} written whole"
    );
    assert!(
        answered_reports <= restored_load_reports && restored_load_reports <= written_reports,
        "{answered_reports} answered <= {restored_load_reports} restored <= {written_reports} written"
    );
    assert_eq!(restored_load_reports, answered_reports, "a report was counted but never answered");
    // a sample of the answered reports, each counted exactly once
    let mut rng = Rng(0x516e_7e12);
    let mut sampled = std::collections::HashSet::new();
    while sampled.len() < 100 {
        let c = rng.below(STOP_CONNECTIONS as u64) as usize;
        let answered = &results[c].answered_reports;
        let id = answered[rng.below(answered.len() as u64) as usize];
        if !sampled.insert((c, id)) {
            continue; // a second check would find the first one's place held
        }
        let account = format!("load-{c}-{id}");
        let v = verdict(rt.block_on(client.check(LOGIN, &who(own_64(0x2001, c as u16, id as u32), Some(&account)))));
        // 1 failure restored, and this check's place
        assert_eq!((v.decision, v.remaining, v.rule.as_ref()), (Decision::Allow, 3, "source_failures"), "{account}");
    }
    // dave's 4 failures survived the stop: the fifth trips the lockout
    let v = verdict(rt.block_on(client.report(LOGIN, &dave, Outcome::Failure)));
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"));
}

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

fn read_reply(stream: &mut std::os::unix::net::UnixStream) -> (u64, Response<'static>) {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
    let mut payload = vec![0u8; u32::from_le_bytes(header) as usize];
    stream.read_exact(&mut payload).unwrap();
    codec::decode_response(&payload).unwrap()
}

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

// ---------------------------------------------------------------------------
// 5. The flood

const CLAIMED_ACCOUNTS: usize = 10_000_000;
const CLAIMED_CONNECTIONS: usize = 2;
const DISTINCT_64S: usize = 1_000_000;
const SPRAYED_ACCOUNTS: usize = 1000;
const FLOOD_WINDOW: usize = 512;
/// Bytes per entry a full table may cost, from the layouts: a failure entry
/// is a 40-byte slot in a Vec that grows by doubling (<= 80), its index
/// bucket (<= 10 with hashbrown's load factor and doubling), and up to two
/// 16-byte keys on the change lists (bounded at twice the cap; <= 64 with
/// doubling). A rate entry is a 16-byte hashbrown bucket and a control byte,
/// at most doubled by growth.
const FAILURE_ENTRY_BYTES: u64 = 160;
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
    let daemon = TestDaemon::start();
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

// ---------------------------------------------------------------------------
// 6. Two ways SIGTERM overruns the grace period (daemon bugs found while
// writing the tests above; run with `--ignored`).

/// A client that pipelines at a steady pace and whose every write ends
/// half-way through a frame (as writes split by a full socket buffer do).
async fn half_frame_pipeliner(socket: PathBuf) -> (u64, usize, Instant) {
    let stream = UnixStream::connect(&socket).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let check = |id: u64, out: &mut Vec<u8>| {
        codec::encode_request(id, &Request::Check { route: "request", subject: who(v4(0xc633_64c8), None) }, out)
    };
    tokio::spawn(async move {
        let (mut id, mut carry) = (0u64, Vec::new());
        loop {
            let mut out = std::mem::take(&mut carry);
            for _ in 0..8 {
                check(id, &mut out);
                id += 1;
            }
            let mut next = Vec::new();
            check(id, &mut next);
            id += 1;
            out.extend_from_slice(&next[..next.len() / 2]);
            carry = next[next.len() / 2..].to_vec();
            if wr.write_all(&out).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    let (mut inbuf, mut chunk, mut replies) = (Vec::new(), vec![0u8; 64 * 1024], 0u64);
    loop {
        let n = rd.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return (replies, inbuf.len(), Instant::now());
        }
        inbuf.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        while let Some(end) = codec::frame_len(&inbuf[at..], RESPONSE_PAYLOAD_BYTES_MAX).unwrap() {
            codec::decode_response(&inbuf[at + FRAME_HEADER_BYTES..at + end]).unwrap();
            replies += 1;
            at += end;
        }
        inbuf.drain(..at);
    }
}

/// `serve_connection` watches for the stop only while its buffer is empty;
/// with part of a frame buffered it waits in the frame-read branch, which
/// does not. A client whose writes end mid-frame is served (new requests
/// read and answered) for the whole grace period after SIGTERM, then
/// aborted wherever its task happens to be (possibly mid-reply).
#[test]
fn sigterm_closes_a_connection_that_always_has_half_a_frame_pending() {
    let grace_ms = 3000;
    let mut daemon = TestDaemon::start_with(Some(&format!("[server]\nshutdown_grace_ms = {grace_ms}\n")), true);
    let rt = runtime();
    let load = rt.spawn(half_frame_pipeliner(daemon.socket.clone()));
    std::thread::sleep(Duration::from_millis(300));
    let sigterm_at = Instant::now();
    let status = daemon.terminate();
    let exit = sigterm_at.elapsed();
    let (replies, trailing, closed_at) = rt.block_on(load).unwrap();
    let closed = closed_at.duration_since(sigterm_at);
    eprintln!("exit {status} after {exit:?}; connection closed {closed:?} after SIGTERM; {replies} replies");
    assert!(status.success());
    assert_eq!(trailing, 0, "a reply was cut off");
    assert!(closed < Duration::from_millis(500), "served for {closed:?} after SIGTERM (grace {grace_ms} ms)");
    assert!(exit < Duration::from_millis(grace_ms / 2), "the daemon took {exit:?} to stop");
}

/// The snapshot thread sleeps `snapshot_interval_ms` (up to 60 s) between
/// snapshots and the stop joins it, so SIGTERM waits out the sleep whatever
/// `shutdown_grace_ms` says. The systemd unit's TimeoutStopSec=15 then
/// SIGKILLs a daemon configured with an interval over ~15 s before its final
/// snapshot: every counter since the last snapshot is lost.
#[test]
fn sigterm_exits_within_the_grace_period_whatever_the_snapshot_interval() {
    let config = "snapshot_interval_ms = 20000\n[server]\nshutdown_grace_ms = 1000\n";
    let mut daemon = TestDaemon::start_with(Some(config), true);
    let rt = runtime();
    let dave = who(v4(0xc633_6443), Some("dave"));
    let client = daemon.client();
    for _ in 0..4 {
        assert_eq!(verdict(rt.block_on(client.report(LOGIN, &dave, Outcome::Failure))).decision, Decision::Allow);
    }
    let sigterm_at = Instant::now();
    let status = daemon.terminate();
    let exit = sigterm_at.elapsed();
    eprintln!("exit {status} after {exit:?} (grace 1000 ms, snapshot interval 20000 ms)");
    assert!(status.success());
    assert!(exit < Duration::from_millis(2000), "SIGTERM took {exit:?}");
    daemon.spawn();
    let v = verdict(rt.block_on(daemon.client().report(LOGIN, &dave, Outcome::Failure)));
    assert_eq!(v.decision, Decision::Deny, "the counters were saved at the stop");
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

/// Rows in the state file, read as the daemon reads them at start.
fn state_rows(path: &Path) -> Vec<tollgate::store::PersistedEntry> {
    tollgate::store::Store::open(path, false).expect("state file opens").load().expect("state file loads")
}

#[test]
fn rows_that_expire_while_the_daemon_is_down_are_deleted_at_the_next_start() {
    // One-second windows on the real clock: an entry is over two windows
    // after its last failure at most.
    let config = "[routes.login.rules.source_failures]\nwindow_secs = 1\n\
                  [routes.login.rules.account_failures]\nwindow_secs = 1\n";
    let mut daemon = TestDaemon::start_with(Some(config), false);
    let rt = runtime();
    let client = daemon.client();
    for n in 0..40u32 {
        let account = format!("gone-{n}");
        verdict(rt.block_on(client.report(LOGIN, &who(v4(0x0a00_0000 + n), Some(&account)), Outcome::Failure)));
    }
    assert_eq!(daemon.terminate().code(), Some(0), "{}", daemon.log());
    let rows = state_rows(&daemon.state);
    assert_eq!(rows.len(), 80, "40 source entries and 40 account entries saved at the stop");

    std::thread::sleep(Duration::from_millis(2_200));
    daemon.spawn();
    // Entries made after the restart are live and stay.
    let client = daemon.client();
    for n in 0..3u32 {
        let account = format!("new-{n}");
        verdict(rt.block_on(client.report(LOGIN, &who(v4(0x0b00_0000 + n), Some(&account)), Outcome::Failure)));
    }
    assert_eq!(daemon.terminate().code(), Some(0), "{}", daemon.log());
    let log = daemon.log();
    assert!(log.contains("restored=0") && log.contains("expired=80"), "start-up log counts them: {log}");
    let rows = state_rows(&daemon.state);
    assert_eq!(rows.len(), 6, "only the 3 new pairs' entries are left");
}

/// mallory from 203.0.113.5: the pair the window-change tests lock.
fn mallory() -> Subject<'static> {
    who(v4(0xcb00_7105), Some("mallory"))
}

/// One `check` on the login route.
fn check(daemon: &TestDaemon, subject: &Subject<'_>) -> tollgate::protocol::Verdict<'static> {
    verdict(runtime().block_on(daemon.client().check(LOGIN, subject)))
}

/// Locks mallory's pair on the manual clock with the rule's window at
/// `before_secs`, kills the daemon, restarts it with `after_secs`, and
/// returns the check's retry_after_ms right after the restart.
fn lockout_across_a_window_change(before_secs: u64, after_secs: u64) -> (TestDaemon, u64) {
    let window = |secs: u64| format!("[routes.login.rules.source_failures]\nwindow_secs = {secs}\n");
    let mut daemon = TestDaemon::start_with(Some(&window(before_secs)), true);
    let rt = runtime();
    let client = daemon.client();
    for _ in 0..5 {
        verdict(rt.block_on(client.report(LOGIN, &mallory(), Outcome::Failure)));
    }
    let v = check(&daemon, &mallory());
    assert_eq!((v.decision, v.retry_after_ms), (Decision::Deny, before_secs * 1000 + 1), "locked for the window");
    daemon.kill9();
    std::fs::write(daemon.config.as_ref().unwrap(), window(after_secs)).unwrap();
    daemon.spawn();
    let v = check(&daemon, &mallory());
    assert_eq!(v.decision, Decision::Deny, "a lockout survives a changed window length: {v:?}");
    (daemon, v.retry_after_ms)
}

#[test]
fn a_window_shortened_while_the_daemon_was_down_re_dates_lockouts_instead_of_deleting_them() {
    let (mut daemon, retry_after_ms) = lockout_across_a_window_change(900, 60);
    // Five failures re-dated to the current one-minute window: locked until
    // its end, as a reload to 60 s would have left it.
    assert_eq!(retry_after_ms, 60_001);
    assert!(daemon.log().contains("redated=1"), "{}", daemon.log());
    daemon.advance("60001ms");
    assert_eq!(check(&daemon, &mallory()).decision, Decision::Allow);
    // The row was written again in the new length.
    assert_eq!(daemon.terminate().code(), Some(0));
    let rows = state_rows(&daemon.state);
    assert!(!rows.is_empty() && rows.iter().all(|r| r.window_us == 60_000_000), "{rows:?}");
}

#[test]
fn a_window_lengthened_while_the_daemon_was_down_does_not_lock_for_centuries() {
    let (daemon, retry_after_ms) = lockout_across_a_window_change(60, 900);
    // Re-dated to the current 15-minute window, not read as a window index
    // fifteen times too far in the future.
    assert_eq!(retry_after_ms, 900_001);
    daemon.advance("900001ms");
    assert_eq!(check(&daemon, &mallory()).decision, Decision::Allow);
}

fn eve() -> Subject<'static> {
    who(v4(0xcb00_7106), Some("eve"))
}

fn fail_five_times(daemon: &TestDaemon, subject: &Subject<'_>) {
    let rt = runtime();
    let client = daemon.client();
    for _ in 0..5 {
        verdict(rt.block_on(client.report(LOGIN, subject, Outcome::Failure)));
    }
}

#[test]
fn a_reload_to_another_window_neither_invents_nor_lifts_a_lockout() {
    let window =
        |secs: u64| format!("attempt_timeout_ms = 1000\n[routes.login.rules.source_failures]\nwindow_secs = {secs}\n");
    let daemon = TestDaemon::start_with(Some(&window(60)), true);
    fail_five_times(&daemon, &mallory());
    daemon.advance("66s");
    // 5 × 54/60 = 4.5 of 5: no longer locked.
    assert_eq!(check(&daemon, &mallory()).decision, Decision::Allow);
    fail_five_times(&daemon, &eve());
    assert_eq!(check(&daemon, &eve()).decision, Decision::Deny);
    // Past the attempt timeout, so the allowed check above holds no place:
    // 5 × 53/60 = 4.42 of 5.
    daemon.advance("1s");
    daemon.reload_with(&window(61));
    assert_eq!(check(&daemon, &mallory()).decision, Decision::Allow, "4.42 failures re-dated as 4, not 5");
    assert_eq!(check(&daemon, &eve()).decision, Decision::Deny, "5 failures stay 5");
}

const SOURCE_FAILURES_ON: &str = "[routes.login.rules.source_failures]\nthreshold = 5\n";
const SOURCE_FAILURES_OFF: &str = "[routes.login.rules.source_failures]\nenabled = false\n";

#[test]
fn a_failure_rule_switched_off_and_on_by_reload_starts_empty_and_its_rows_never_come_back() {
    let (on, off) = (SOURCE_FAILURES_ON, SOURCE_FAILURES_OFF);
    let mut daemon = TestDaemon::start_with(Some(on), true);
    fail_five_times(&daemon, &mallory());
    assert_eq!(check(&daemon, &mallory()).decision, Decision::Deny);
    daemon.reload_with(off);
    assert_eq!(check(&daemon, &mallory()).decision, Decision::Allow, "the rule is off");
    daemon.reload_with(on);
    assert_eq!(check(&daemon, &mallory()).decision, Decision::Allow, "switched on again, it starts empty");
    // eve's lockout is acknowledged after the writer has applied everything
    // queued before it, the reloads' deletions included.
    fail_five_times(&daemon, &eve());
    daemon.kill9();
    daemon.spawn();
    assert_eq!(check(&daemon, &mallory()).decision, Decision::Allow, "mallory's old row came back at the restart");
    assert_eq!(check(&daemon, &eve()).decision, Decision::Deny, "eve's lockout is durable");
}

#[test]
fn rows_of_a_failure_rule_switched_off_across_a_restart_are_deleted() {
    let (on, off) = (SOURCE_FAILURES_ON, SOURCE_FAILURES_OFF);
    let mut daemon = TestDaemon::start_with(Some(on), true);
    fail_five_times(&daemon, &mallory());
    assert_eq!(daemon.terminate().code(), Some(0));
    let rule_rows =
        |daemon: &TestDaemon| state_rows(&daemon.state).iter().filter(|r| r.rule == "login/source_failures").count();
    assert_eq!(rule_rows(&daemon), 1);
    std::fs::write(daemon.config.as_ref().unwrap(), off).unwrap();
    daemon.spawn();
    assert_eq!(daemon.terminate().code(), Some(0));
    assert!(daemon.log().contains("orphaned=1"), "{}", daemon.log());
    assert_eq!(rule_rows(&daemon), 0, "the rule's rows are deleted");
    std::fs::write(daemon.config.as_ref().unwrap(), on).unwrap();
    daemon.spawn();
    assert_eq!(check(&daemon, &mallory()).decision, Decision::Allow, "switched on again, it starts empty");
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

// ---------------------------------------------------------------------------
// At the open-file limit

/// One request and its reply over a blocking connection.
fn call_std(stream: &mut std::os::unix::net::UnixStream, id: u64, request: &Request<'_>) -> Response<'static> {
    let mut frame = Vec::new();
    codec::encode_request(id, request, &mut frame);
    stream.write_all(&frame).unwrap();
    let (reply_id, reply) = read_reply(stream);
    assert_eq!(reply_id, id, "the reply names its request");
    reply
}

/// The soft and hard "Max open files" of a process, from /proc.
fn open_file_limits(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).expect("Max open files in /proc/PID/limits");
    let numbers: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    (numbers[0], numbers[1])
}

/// A wrapper that starts the daemon under `ulimit` flags, as a unit's
/// `LimitNOFILE=` or a login shell would; `exec` keeps the pid, so
/// `WATCHDOG_PID` names the daemon as systemd's would.
fn under_ulimit(flags: &str) -> Vec<String> {
    let script = format!("ulimit {flags} && export WATCHDOG_PID=$$ && exec \"$0\" \"$@\"");
    vec!["bash".into(), "-c".into(), script]
}

#[test]
fn the_daemon_raises_its_soft_open_file_limit_to_the_hard_one_at_start() {
    let hard = open_file_limits(std::process::id()).1;
    assert!(hard > 256, "this test needs a hard open-file limit above 256, not {hard}");
    let mut daemon = TestDaemon::prepare(None, true);
    daemon.wrapper = under_ulimit("-S -n 256");
    daemon.spawn();
    let (soft, daemon_hard) = open_file_limits(daemon.pid());
    eprintln!("started with soft limit 256, hard {hard}: the daemon runs with soft {soft}, hard {daemon_hard}");
    assert_eq!((soft, daemon_hard), (hard, hard), "the soft limit is raised to the hard one");
    let status = daemon.cli_json(&["status"]);
    let limit = |name: &str| {
        status["limits"].as_array().unwrap().iter().find(|l| l["name"] == name).map(|l| l["value"].clone())
    };
    assert_eq!(limit("open_files_max"), Some(hard.into()), "status shows the limit in force");
    assert!(!daemon.log().contains("open-file limit 256"), "nothing to warn about:\n{}", daemon.log());
}

const FD_LIMIT: u64 = 64;
const FLOOD_CONNECTIONS: usize = 150;
const FLOOD_HOLD: Duration = Duration::from_secs(3);
const WATCHDOG_USEC: u64 = 200_000;

/// A daemon whose open-file limit (soft and hard, so it cannot raise it) is
/// far below `connections_max`, flooded with connections past the limit:
/// it says so at start, backs off and caps its "accept failed" lines, keeps
/// feeding systemd's watchdog, keeps answering the connections it has, and
/// serves new ones once the flood ends.
#[test]
fn at_the_open_file_limit_the_watchdog_keeps_pinging_the_log_stays_small_and_serving_goes_on() {
    let mut daemon = TestDaemon::prepare(Some("[server]\nconnections_max = 1000\n"), true);
    let notify_path = daemon.dir.path().join("notify");
    let manager = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    manager.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    daemon.wrapper = under_ulimit(&format!("-n {FD_LIMIT}"));
    daemon.env.push(("NOTIFY_SOCKET".into(), notify_path.display().to_string()));
    daemon.env.push(("WATCHDOG_USEC".into(), WATCHDOG_USEC.to_string()));
    daemon.spawn();
    let mut buf = [0u8; 256];
    let mut messages = |until: Instant| {
        let mut got = Vec::new();
        while Instant::now() < until {
            if let Ok(n) = manager.recv(&mut buf) {
                got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
        got
    };
    let before = messages(Instant::now() + Duration::from_millis(500));
    assert!(before.iter().any(|m| m.contains("READY=1")), "READY=1 first: {before:?}");
    assert!(before.iter().any(|m| m.contains("WATCHDOG=1")), "pings before the flood: {before:?}");

    // A connection opened before the flood, and answered during it.
    let mut keeper = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    keeper.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let alice = subject("198.51.100.7", "alice");
    let keeper_check = |keeper: &mut std::os::unix::net::UnixStream, id: u64| {
        let reply = call_std(keeper, id, &Request::Check { route: LOGIN, subject: alice.clone() });
        assert!(matches!(reply, Response::Verdict(_)), "{reply:?}");
    };
    keeper_check(&mut keeper, 1);

    let log_lines = |daemon: &TestDaemon| daemon.log().lines().filter(|l| l.contains("accept failed")).count();
    let flood_started = Instant::now();
    let flood: Vec<_> =
        (0..FLOOD_CONNECTIONS).map(|_| std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap()).collect();
    let pings = messages(flood_started + FLOOD_HOLD);
    let held = flood_started.elapsed();
    let watchdogs = pings.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    let t = Instant::now();
    keeper_check(&mut keeper, 2);
    let keeper_answered_in = t.elapsed();
    let accept_lines = log_lines(&daemon);
    let connections_during = {
        // Over the limit, a new connection waits in the backlog: status
        // goes through the keeper's connection instead.
        match call_std(&mut keeper, 3, &Request::Status) {
            Response::Status(s) => s.connections,
            other => panic!("{other:?}"),
        }
    };
    drop(flood);
    eprintln!(
        "open-file limit {FD_LIMIT}, {FLOOD_CONNECTIONS} connections held {held:?}: {connections_during} served, \
         {watchdogs} watchdog pings (every {} ms), {accept_lines} 'accept failed' lines, an existing connection \
         answered in {keeper_answered_in:?}",
        WATCHDOG_USEC / 2000
    );
    assert!(connections_during < FLOOD_CONNECTIONS as u64, "the flood did reach the limit: {connections_during} open");
    let expected_pings = (FLOOD_HOLD.as_micros() as u64 / (WATCHDOG_USEC / 2)) as usize;
    assert!(
        watchdogs >= expected_pings / 2,
        "{watchdogs} watchdog pings while the table was full, want ~{expected_pings}"
    );
    assert!(
        accept_lines <= FLOOD_HOLD.as_secs() as usize + 3,
        "{accept_lines} 'accept failed' lines:\n{}",
        daemon.log()
    );
    assert!(keeper_answered_in < Duration::from_secs(1), "the keeper waited {keeper_answered_in:?}");

    // After the flood: new connections are served.
    let rt = runtime();
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Ok(s) =
            rt.block_on(async { tokio::time::timeout(Duration::from_secs(1), daemon.client().status()).await })
        {
            break s.unwrap();
        }
        assert!(Instant::now() < deadline, "no new connection served after the flood:\n{}", daemon.log());
    };
    let v = verdict(rt.block_on(daemon.client().check(LOGIN, &subject("198.51.100.8", "bob"))));
    assert_eq!(v.decision, Decision::Allow);
    keeper_check(&mut keeper, 4);
    let log = daemon.log();
    assert!(
        log.contains(&format!("open-file limit {FD_LIMIT} (hard {FD_LIMIT}) is below connections_max 1000")),
        "a warning names the numbers at start:\n{log}"
    );
    assert!(status.limits.iter().any(|l| l.name == "open_files_max" && l.value == FD_LIMIT));
    assert!(status.log_lines_suppressed > 0, "suppressed accept-error lines are counted");
}

// ---------------------------------------------------------------------------
// Large replies

const MANY_LOCKOUTS: usize = 10_000;

/// A daemon with `MANY_LOCKOUTS` lockouts in force: a route whose one rule
/// locks an account at its first failure, and one failure per account,
/// pipelined.
fn daemon_with_many_lockouts(rt: &tokio::runtime::Runtime) -> TestDaemon {
    let config = format!(
        "[routes.trips]\nfail_policy = \"open\"\n[routes.trips.rules.account_failures]\n\
         kind = \"failures\"\nkey = [\"account\"]\nthreshold = 1\nwindow_secs = 3600\nentries_max = {}\n",
        MANY_LOCKOUTS * 2
    );
    let daemon = TestDaemon::start_with(Some(&config), true);
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
/// An auth server's client timeout: a check slower than this is a failed login path.
const CHECK_TIMEOUT: Duration = Duration::from_millis(5);

/// While three connections pipeline 10,000-entry `lockouts` requests,
/// another connection's checks stay well inside a client's 5 ms timeout.
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
    assert!(p99 < CHECK_TIMEOUT, "check p99 {p99:?} with large lockouts replies in flight");
}
