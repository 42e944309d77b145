//! `examples/login_server.rs` driven over HTTP (plain HTTP/1.1 over loopback
//! TCP) against real daemons on the manual clock: refusals, wrong passwords
//! and unknown accounts must be indistinguishable, in content and in time.
//!
//! The example is compiled into this test as a module, so the server runs
//! in-process with cheap argon2 parameters and a small floor.

mod common;

#[allow(dead_code)] // its `main` and flags are not used here
#[path = "../examples/login_server.rs"]
mod login_server;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use argon2::Params;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::client::Client;
use tollgate::protocol::{Decision, Subject};

use common::TestDaemon;
use login_server::{LoginServer, Settings, FAILED_BODY, REFUSED_BODY};

/// X-Forwarded-For from the login server's loopback peer is honoured, so the
/// test can vary the source. No Retry-After jitter: it is derived from each
/// daemon's own secret key, so two independent daemons would phrase the same
/// refusal up to 10% of its step apart, often a different whole second (any
/// two accounts differ by it too, existing or not: it says nothing about
/// membership, but it would defeat an exact comparison).
/// Spray detection off: the tests below drive one account from many
/// addresses and many accounts from one on purpose, to hold the counting
/// rules' answers to the HTTP ones (see `COUNTING_RULES_ONLY`).
const DAEMON_CONFIG: &str = r#"
[source]
trusted_proxies = ["127.0.0.1/32"]

[responses]
jitter_percent = 0

[signals]
enabled = false
"#;

const FLOOR: Duration = Duration::from_millis(5);
/// Cheap argon2id for the test: 1 MiB, 1 pass, 1 lane.
fn cheap_argon2() -> Params {
    Params::new(1024, 1, 1, None).unwrap()
}

/// In the membership run, the probe accounts (`alice<lane>@example.com`)
/// exist on stack A only and only ever get wrong passwords; the other
/// accounts (`carol<lane>@example.com`) exist on both and sign in for real,
/// so successes and known devices are part of the sequences too.
const PROBE: &str = "alice@example.com";
const PROBE_PASSWORD: &str = "alice's real password";
const OTHER_PASSWORD: &str = "carol's password";

const WRONG_PASSWORDS: [&str; 6] = ["123456", "password", "alice2024", "letmein", "qwerty", "hunter2"];
/// Well-formed device ids no server ever issued.
const FAKE_DEVICES: [&str; 3] =
    ["00000000000000000000000000000001", "0123456789abcdef0123456789abcdef", "ffffffffffffffffffffffffffffffff"];

/// One daemon and one login server in front of it.
struct Stack {
    daemon: TestDaemon,
    admin: Client,
    addr: SocketAddr,
    floor: Duration,
    verify_time: Duration,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn start_stack(users: &[(String, String)]) -> Stack {
    start_stack_hashing(users, cheap_argon2()).await
}

async fn start_stack_hashing(users: &[(String, String)], argon2: Params) -> Stack {
    let daemon = tokio::task::spawn_blocking(|| TestDaemon::start_with(Some(DAEMON_CONFIG), true)).await.unwrap();
    let mut settings = Settings::new(&daemon.socket);
    // Generous: a loaded test machine must not turn a verdict into a
    // fail-open (the daemon-down test does not wait: connect fails at once).
    settings.daemon_timeout = Duration::from_secs(5);
    settings.floor = FLOOR;
    settings.argon2 = argon2;
    settings.users = users.to_vec();
    let server = tokio::task::spawn_blocking(move || LoginServer::new(settings)).await.unwrap().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (floor, verify_time) = (server.floor(), server.verify_time());
    let server = tokio::spawn(async move { server.serve(listener).await.unwrap() });
    let admin = daemon.client();
    Stack { daemon, admin, addr, floor, verify_time, server }
}

impl Stack {
    async fn login(&self, account: &str, password: &str, device: Option<&str>, xff: Option<&str>) -> HttpResponse {
        let mut body = serde_json::json!({ "account": account, "password": password });
        if let Some(d) = device {
            body["device"] = d.into();
        }
        let mut headers = vec![("Content-Type", "application/json")];
        if let Some(x) = xff {
            headers.push(("X-Forwarded-For", x));
        }
        http(self.addr, "POST", "/login", &headers, &body.to_string()).await
    }

    /// A login whose client hangs up (a TCP reset) `after` the request
    /// is sent: the server has checked it and is verifying the password.
    async fn abort_login(&self, account: &str, password: &str, xff: &str, after: Duration) {
        let body = serde_json::json!({ "account": account, "password": password }).to_string();
        let stream = TcpStream::connect(self.addr).await.unwrap();
        let request = format!(
            "POST /login HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nX-Forwarded-For: {xff}\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        let mut stream = stream;
        stream.write_all(request.as_bytes()).await.unwrap();
        tokio::time::sleep(after).await;
        // A zero linger resets the connection at once instead of blocking
        // the thread on drop, which is what the deprecation warns about.
        #[allow(deprecated)]
        stream.set_linger(Some(Duration::ZERO)).unwrap();
        drop(stream);
    }

    async fn advance(&self, by: Duration) {
        self.admin.advance_clock(by).await.unwrap();
    }
}

// ---- a minimal HTTP/1.1 client ----

#[derive(Debug)]
struct HttpResponse {
    status: u16,
    /// Lower-cased names, in the order sent.
    headers: Vec<(String, String)>,
    body: String,
    /// From before the connect to the last byte read.
    latency: Duration,
}

impl HttpResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn retry_after(&self) -> Option<u64> {
        self.header("retry-after").map(|v| v.parse().unwrap_or_else(|_| panic!("Retry-After {v:?}")))
    }

    /// The device id a success issued (from the body).
    fn device(&self) -> Option<String> {
        let body: serde_json::Value = serde_json::from_str(&self.body).ok()?;
        body["device"].as_str().map(str::to_string)
    }

    /// What a client can see, less `Date`, with issued device ids (random
    /// by design) masked.
    fn comparable(&self) -> (u16, Vec<(String, String)>, String) {
        let mask = |s: &str| match self.device() {
            Some(d) => s.replace(&d, "<device>"),
            None => s.to_string(),
        };
        let headers = self.headers.iter().filter(|(n, _)| n != "date").map(|(n, v)| (n.clone(), mask(v))).collect();
        (self.status, headers, mask(&self.body))
    }
}

async fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> HttpResponse {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (name, value) in headers {
        request += &format!("{name}: {value}\r\n");
    }
    request += "\r\n";
    request += body;
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let latency = started.elapsed();
    let raw = String::from_utf8(raw).expect("UTF-8 response");
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no end of head in {raw:?}"));
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status =
        status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap_or_else(|| panic!("header line {l:?}"));
            (n.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    let response = HttpResponse { status, headers, body: body.to_string(), latency };
    let length = response.header("content-length").map(|v| v.parse::<usize>().unwrap());
    assert_eq!(length, Some(response.body.len()), "{response:?}");
    response
}

/// The sequences are the same on every run: the load generator's seeded
/// xorshift, with a picker.
use tollgate::Rng;

trait Pick {
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str;
}

impl Pick for Rng {
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

/// Lanes run side by side, each with its own accounts and sources, so they
/// share no daemon key and their interleaving cannot change any answer.
const LANES: usize = 4;
/// Rounds of one sequence per lane: 1,000 sequences in all.
const ROUNDS: u32 = 250;

#[derive(Default)]
struct Stats {
    a_401: Vec<Duration>,
    a_429: Vec<Duration>,
    b_401: Vec<Duration>,
    b_429: Vec<Duration>,
    other_200: u32,
    other_429: u32,
    pairs: u32,
}

/// One lane of the membership run.
struct Lane {
    index: usize,
    rng: Rng,
    /// Exists on stack A only.
    probe: String,
    /// Exists on both stacks.
    other: String,
    /// The device id each stack last issued to `other`.
    issued: [Option<String>; 2],
    stats: Stats,
}

impl Lane {
    fn new(index: usize) -> Lane {
        Lane {
            index,
            rng: Rng(0x7011_6a7e_5eed_0001 ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            probe: format!("alice{index}@example.com"),
            other: format!("carol{index}@example.com"),
            issued: [None, None],
            stats: Stats::default(),
        }
    }

    /// The source of a sequence: the peer itself (127.0.0.1, lane 0 only)
    /// or a client behind it, sometimes with a spoofed left-hand hop that
    /// the daemon must ignore. Each lane has its own 16 addresses.
    fn source(&mut self) -> Option<String> {
        let n = self.rng.below(16);
        if self.index == 0 && n == 0 {
            return None;
        }
        let address = format!("203.0.113.{}", 16 * self.index as u64 + n);
        Some(if self.rng.below(4) == 0 { format!("198.51.100.77, {address}") } else { address })
    }

    /// A sequence of 1 to 5 attempts from one source, sent to both stacks;
    /// the probe account only ever gets wrong passwords.
    async fn run_sequence(&mut self, a: &Stack, b: &Stack, seq: u32) {
        let xff = self.source();
        for n in 0..1 + self.rng.below(5) {
            let probe = self.rng.below(5) != 0;
            let (account, password, devices) = if probe {
                let device = if self.rng.below(3) == 0 { Some(self.rng.pick(&FAKE_DEVICES).to_string()) } else { None };
                (self.probe.clone(), self.rng.pick(&WRONG_PASSWORDS), [device.clone(), device])
            } else {
                let password = if self.rng.below(2) == 0 { OTHER_PASSWORD } else { self.rng.pick(&WRONG_PASSWORDS) };
                let devices = if self.rng.below(2) == 0 { self.issued.clone() } else { [None, None] };
                (self.other.clone(), password, devices)
            };
            let (ra, rb) = tokio::join!(
                a.login(&account, password, devices[0].as_deref(), xff.as_deref()),
                b.login(&account, password, devices[1].as_deref(), xff.as_deref())
            );
            self.stats.pairs += 1;
            assert_eq!(
                ra.comparable(),
                rb.comparable(),
                "lane {} sequence {seq} attempt {n} ({account}, xff {xff:?}, devices {devices:?}) differs",
                self.index
            );
            for r in [&ra, &rb] {
                assert!(
                    !r.headers.iter().any(|(n, _)| n.starts_with("ratelimit")),
                    "RateLimit headers on /login: {r:?}"
                );
                match r.status {
                    429 => {
                        assert!(r.retry_after().is_some_and(|s| s >= 1), "429 without Retry-After >= 1: {r:?}");
                        assert_eq!(r.body, REFUSED_BODY);
                    }
                    401 => {
                        assert_eq!(r.body, FAILED_BODY);
                        assert_eq!(r.header("retry-after"), None);
                    }
                    200 => assert!(!probe && password == OTHER_PASSWORD, "{r:?}"),
                    other => panic!("status {other}: {r:?}"),
                }
            }
            let s = &mut self.stats;
            match (probe, ra.status) {
                (true, 401) => s.a_401.push(ra.latency),
                (true, _) => s.a_429.push(ra.latency),
                (false, 200) => {
                    s.other_200 += 1;
                    self.issued = [ra.device(), rb.device()];
                }
                (false, 429) => s.other_429 += 1,
                _ => {}
            }
            match (probe, rb.status) {
                (true, 401) => s.b_401.push(rb.latency),
                (true, _) => s.b_429.push(rb.latency),
                _ => {}
            }
        }
    }
}

/// `refused` per rule of route `login`, from the daemon's status.
async fn refused_by_rule(stack: &Stack) -> Vec<(String, u64)> {
    let status = stack.admin.status().await.unwrap();
    let login = status.routes.iter().find(|r| r.name == "login").expect("route login");
    login.rules.iter().map(|r| (r.name.clone(), r.refused)).collect()
}

fn latency_summary(name: &str, samples: &mut [Duration]) -> String {
    samples.sort();
    if samples.is_empty() {
        return format!("{name}: none");
    }
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    format!(
        "{name}: n={} min={:.2?} median={:.2?} p99={:.2?} max={:.2?}",
        samples.len(),
        samples[0],
        at(0.5),
        at(0.99),
        samples[samples.len() - 1]
    )
}

/// 1,000 seeded random sequences of attempts, run identically against
/// existing accounts (stack A) and the same account names that do not exist
/// (stack B): every response pair must be identical but for `Date`, and no
/// refusal or unknown-account answer may come back before the floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_failures_and_unknown_accounts_are_indistinguishable() {
    let mut lanes: [Lane; LANES] = std::array::from_fn(Lane::new);
    let passwords = |probes: bool| -> Vec<(String, String)> {
        let mut users: Vec<_> = lanes.iter().map(|l| (l.other.clone(), OTHER_PASSWORD.to_string())).collect();
        if probes {
            users.extend(lanes.iter().map(|l| (l.probe.clone(), PROBE_PASSWORD.to_string())));
        }
        users
    };
    let (users_a, users_b) = (passwords(true), passwords(false));
    // One after the other: each server times argon2 at start, best not
    // while the other does.
    let a = start_stack(&users_a).await;
    let b = start_stack(&users_b).await;
    for s in [&a, &b] {
        assert!(s.floor >= FLOOR && s.floor >= s.verify_time, "floor {:?} < verify {:?}", s.floor, s.verify_time);
    }

    let mut clock = Rng(0x0c10_c45e_ed00_0002);
    let started = Instant::now();
    for round in 0..ROUNDS {
        // Time between rounds, the same on both daemons: mostly none (so
        // failures pile up to lockouts and the account ceiling), sometimes
        // enough to slide the windows, and now and then a fresh pair.
        let by = match (round % 40, clock.below(20)) {
            (0, _) if round > 0 => Duration::from_secs(31 * 60),
            (_, 0..=14) => Duration::ZERO,
            (_, 15..=18) => Duration::from_secs(20),
            _ => Duration::from_secs(4 * 60),
        };
        if !by.is_zero() {
            tokio::join!(a.advance(by), b.advance(by));
        }
        let [l0, l1, l2, l3] = &mut lanes;
        tokio::join!(
            l0.run_sequence(&a, &b, round),
            l1.run_sequence(&a, &b, round),
            l2.run_sequence(&a, &b, round),
            l3.run_sequence(&a, &b, round)
        );
    }
    let elapsed = started.elapsed();
    let mut all = Stats::default();
    for lane in lanes {
        let s = lane.stats;
        all.a_401.extend(s.a_401);
        all.a_429.extend(s.a_429);
        all.b_401.extend(s.b_401);
        all.b_429.extend(s.b_429);
        all.other_200 += s.other_200;
        all.other_429 += s.other_429;
        all.pairs += s.pairs;
    }

    // The sequences reached refusals, by both failure rules, and identically
    // on both daemons; and the other accounts really signed in.
    let (refused_a, refused_b) = (refused_by_rule(&a).await, refused_by_rule(&b).await);
    assert_eq!(refused_a, refused_b);
    let refused = |rule: &str| refused_a.iter().find(|(n, _)| n == rule).map_or(0, |(_, c)| *c);
    assert!(refused("source_failures") >= 50 && refused("account_failures") >= 5, "refusals by rule: {refused_a:?}");
    assert!(all.a_429.len() >= 100, "only {} refusals of the probe accounts", all.a_429.len());
    assert!(all.a_401.len() >= 100, "only {} wrong-password failures", all.a_401.len());
    assert!(all.other_200 >= 20, "other accounts: only {} sign-ins", all.other_200);

    // Timing: nothing but a success leaves before the floor, and the floor
    // covers a real argon2 verify.
    for (name, samples, floor) in [
        ("A 401", &all.a_401, a.floor),
        ("A 429", &all.a_429, a.floor),
        ("B 401", &all.b_401, b.floor),
        ("B 429", &all.b_429, b.floor),
    ] {
        let fastest = samples.iter().min().copied().unwrap_or(floor);
        assert!(fastest >= floor, "{name}: {fastest:?} is under the floor {floor:?}");
    }
    println!("{} request pairs ({LANES} lanes) in {elapsed:.1?}; refusals by rule {refused_a:?}", all.pairs);
    println!(
        "  floor: A {:?} (configured {FLOOR:?}, slowest start-up verify {:?}), B {:?} (verify {:?})",
        a.floor, a.verify_time, b.floor, b.verify_time
    );
    println!("  {}", latency_summary("A 401 wrong password (real verify)", &mut all.a_401));
    println!("  {}", latency_summary("B 401 unknown account (dummy verify)", &mut all.b_401));
    println!("  {}", latency_summary("A 429 refusal, existing account", &mut all.a_429));
    println!("  {}", latency_summary("B 429 refusal, unknown account", &mut all.b_429));
    println!("  other accounts: {} sign-ins, {} refusals", all.other_200, all.other_429);
}

/// A source-failures refusal and an account-ceiling refusal look the same:
/// the same status, headers (but the Retry-After value) and body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_lockout_and_account_ceiling_give_the_same_refusal() {
    let stack = start_stack(&[(PROBE.to_string(), PROBE_PASSWORD.to_string())]).await;
    let attacker = "198.51.100.1";
    for password in &WRONG_PASSWORDS[..5] {
        let r = stack.login(PROBE, password, None, Some(attacker)).await;
        assert_eq!(r.status, 401, "{r:?}");
    }
    let by_source = stack.login(PROBE, "another guess", None, Some(attacker)).await;
    // 45 more sources, one failure each: 50 failures, the account ceiling.
    for n in 2..=46 {
        let r = stack.login(PROBE, "guess", None, Some(&format!("198.51.100.{n}"))).await;
        assert_eq!(r.status, 401, "source {n}: {r:?}");
    }
    let fresh = "203.0.113.200";
    let by_ceiling = stack.login(PROBE, PROBE_PASSWORD, None, Some(fresh)).await;

    // Which rule refused each, from the daemon (the HTTP answer must not say).
    let rule_for = |xff: &'static str| {
        let admin = &stack.admin;
        async move {
            let subject = Subject {
                peer: Some("127.0.0.1".parse().unwrap()),
                forwarded_for: Some(xff),
                account: Some(PROBE),
                ..Subject::default()
            };
            let v = common::verdict(admin.check("login", &subject).await);
            assert_eq!(v.decision, Decision::Deny);
            v.rule.into_owned()
        }
    };
    assert_eq!(rule_for(attacker).await, "source_failures");
    assert_eq!(rule_for(fresh).await, "account_failures");

    for r in [&by_source, &by_ceiling] {
        assert_eq!(r.status, 429, "{r:?}");
        assert!(r.retry_after().is_some_and(|s| s >= 1), "{r:?}");
        assert!(r.latency >= stack.floor, "{r:?}");
    }
    assert_eq!(by_source.body, by_ceiling.body);
    assert_eq!(by_source.body, REFUSED_BODY);
    let names = |r: &HttpResponse| r.headers.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&by_source), names(&by_ceiling));
    let without = |r: &HttpResponse| {
        r.headers.iter().filter(|(n, _)| n != "date" && n != "retry-after").cloned().collect::<Vec<_>>()
    };
    assert_eq!(without(&by_source), without(&by_ceiling));
    println!(
        "source lockout: Retry-After {:?}; account ceiling: Retry-After {:?}; body {}",
        by_source.retry_after(),
        by_ceiling.retry_after(),
        by_source.body
    );
}

/// Login fails open: with the daemon killed, the right password signs in
/// and a wrong one is still a (floored) 401. The closed API route refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_daemon_down_login_fails_open() {
    let mut stack = start_stack(&[(PROBE.to_string(), PROBE_PASSWORD.to_string())]).await;
    let form = |password: &str| format!("account={}&password={}", form_encode(PROBE), form_encode(password));
    let form_login = |body: String| {
        let addr = stack.addr;
        async move { http(addr, "POST", "/login", &[("Content-Type", "application/x-www-form-urlencoded")], &body).await }
    };
    let up = form_login(form(PROBE_PASSWORD)).await;
    assert_eq!(up.status, 200, "{up:?}");
    assert!(up.header("set-cookie").is_some_and(|c| c.starts_with("device=")), "{up:?}");

    stack.daemon.kill9();
    let ok = form_login(form(PROBE_PASSWORD)).await;
    assert_eq!(ok.status, 200, "right password with the daemon down: {ok:?}");
    assert!(ok.device().is_some(), "{ok:?}");
    let wrong = form_login(form("wrong")).await;
    assert_eq!((wrong.status, wrong.body.as_str()), (401, FAILED_BODY), "{wrong:?}");
    assert!(wrong.latency >= stack.floor, "{wrong:?}");
    let unknown = form_login(format!("account=nobody&password={}", form_encode(PROBE_PASSWORD))).await;
    assert_eq!(unknown.comparable(), wrong.comparable());

    let ping = http(stack.addr, "GET", "/api/ping", &[], "").await;
    assert_eq!(ping.status, 503, "`request` fails closed: {ping:?}");
    assert_eq!(ping.retry_after(), Some(1));
}

/// `RateLimit-*` headers on the API route (and never on /login, which the
/// membership test checks on every response).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_ping_shows_rate_limit_headers() {
    let stack = start_stack(&[]).await;
    let mut allowed = 0;
    let refused = loop {
        let r = http(stack.addr, "GET", "/api/ping", &[], "").await;
        let limit = r.header("ratelimit-limit").map(|v| v.parse::<u32>().unwrap());
        let remaining = r.header("ratelimit-remaining").map(|v| v.parse::<u32>().unwrap());
        assert_eq!(limit, Some(100), "{r:?}");
        assert!(r.header("ratelimit-reset").is_some(), "{r:?}");
        if r.status != 200 {
            break r;
        }
        allowed += 1;
        assert_eq!(remaining, Some(100 - allowed), "{r:?}");
        assert!(allowed <= 100, "burst exceeded");
    };
    assert_eq!(allowed, 100, "the built-in burst of `request`");
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.header("ratelimit-remaining"), Some("0"));
    assert!(refused.retry_after().is_some_and(|s| s >= 1), "{refused:?}");
}

fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => (b as char).to_string(),
            b' ' => "+".to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An argon2id slow enough to hang up in the middle of: 8 MiB, 48 passes
/// (about 150 ms a verify here).
fn slow_argon2() -> Params {
    Params::new(8 * 1024, 48, 1, None).unwrap()
}

/// A login whose client hangs up while its password is verified learned
/// nothing, so it is no guess: the attempt gives back its places (the
/// example's guard sends `abandon` when axum drops the handler) and counts
/// no failure. A stranger who aborts 6 logins from each of 10 addresses (as
/// many places as the per-source threshold and the account ceiling hold)
/// must not keep the account's owner out, from her own address or another.
/// The daemon runs on the manual clock, so no place lapses by itself here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_aborted_at_any_point_hold_no_place() {
    const ABORT_AFTER: Duration = Duration::from_millis(15);
    let stack = start_stack_hashing(&[(PROBE.to_string(), PROBE_PASSWORD.to_string())], slow_argon2()).await;
    assert!(
        stack.verify_time >= ABORT_AFTER * 3,
        "a verify takes {:?}: too fast to hang up in the middle of",
        stack.verify_time
    );
    let sources: Vec<String> = (1..=10).map(|n| format!("198.51.100.{n}")).collect();
    for source in &sources {
        for _ in 0..6 {
            stack.abort_login(PROBE, "a guess never answered", source, ABORT_AFTER).await;
        }
    }
    // The aborted verifies still run to the end on the blocking pool; wait
    // for them and for the abandons (nothing here moves the manual clock).
    tokio::time::sleep(stack.verify_time * 35 + Duration::from_millis(500)).await;
    let status = stack.admin.status().await.unwrap();
    let login = status.routes.iter().find(|r| r.name == "login").expect("the login route");
    let failure_entries: u64 = login.rules.iter().filter(|r| r.kind == "failures").map(|r| r.entries).sum();
    assert_eq!(failure_entries, 0, "an aborted login counted a failure: {:?}", login.rules);
    let own = stack.login(PROBE, PROBE_PASSWORD, None, Some(&sources[0])).await;
    assert_eq!(own.status, 200, "from her own address: {own:?}");
    let elsewhere = stack.login(PROBE, PROBE_PASSWORD, None, Some("203.0.113.9")).await;
    assert_eq!(elsewhere.status, 200, "from another address: {elsewhere:?}");

    // Hung up sooner, from 0 to 3 ms after the request: before the check
    // reached the daemon, while it was on the wire, and early in the
    // verify. Whenever it happens, no place stays held.
    let victim = "victim@example.com";
    for n in 0..60u32 {
        let source = format!("198.51.{}.{}", 101 + n / 4, 1 + n % 4);
        stack.abort_login(victim, "x", &source, Duration::from_micros(u64::from(n) * 50)).await;
    }
    tokio::time::sleep(stack.verify_time * 35 + Duration::from_millis(500)).await;
    let mut room = 0;
    for n in 0..50u32 {
        let peer = format!("203.0.{}.{}", 100 + n / 5, 1 + n % 5).parse().unwrap();
        let probe = Subject { peer: Some(peer), account: Some(victim), ..Subject::default() };
        room += u32::from(stack.admin.check("login", &probe).await.proceeds());
    }
    assert_eq!(room, 50, "places on the account held by hung-up logins");
}
