//! One helper for integration tests: start a real `tollgate serve` in a
//! unique temp dir, speak the real protocol to it, kill it for real. On a
//! failing test the daemon's log is printed.
#![allow(dead_code)]

/// Real Redis servers, a cluster and a fault proxy for the shared-store tests.
pub mod redis;
pub mod shared;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use tollgate::client::{Client, ClientConfig};
use tollgate::codec::{self, FRAME_HEADER_BYTES};
use tollgate::protocol::{Outcome, Request, Response, Subject, Verdict};

pub const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// Turns spray detection off, for tests of the counting rules whose traffic
/// is spray-shaped on purpose (many accounts failing from one address with
/// no successes, or one account failing from many addresses): with it on,
/// `login.spray_signals` would challenge that traffic before the counting
/// rule under test is reached. `tests/spray_detection*.rs` test it.
pub const COUNTING_RULES_ONLY: &str = "\n[signals]\nenabled = false\n";

pub struct TestDaemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub state: PathBuf,
    pub config: Option<PathBuf>,
    pub manual_clock: bool,
    /// Extra environment for the daemon (e.g. NOTIFY_SOCKET).
    pub env: Vec<(String, String)>,
    /// A command the daemon runs under (e.g. `prlimit --fsize=..`).
    pub wrapper: Vec<String>,
    child: Option<Child>,
    starts: u32,
}

impl TestDaemon {
    /// A daemon on the manual clock with built-in defaults.
    pub fn start() -> TestDaemon {
        TestDaemon::start_with(None, true)
    }

    /// A daemon with `config` (TOML text) laid over the defaults.
    pub fn start_with(config: Option<&str>, manual_clock: bool) -> TestDaemon {
        let mut daemon = TestDaemon::prepare(config, manual_clock);
        daemon.spawn();
        daemon
    }

    /// A daemon set up in its temp dir but not started: set `env` or
    /// `wrapper`, then `spawn()`.
    pub fn prepare(config: Option<&str>, manual_clock: bool) -> TestDaemon {
        let dir = tempfile::Builder::new().prefix("tollgate-test").tempdir().expect("temp dir");
        let config_path = config.map(|text| {
            let p = dir.path().join("tollgate.toml");
            std::fs::write(&p, text).unwrap();
            p
        });
        let daemon = TestDaemon {
            socket: dir.path().join("tollgate.sock"),
            state: dir.path().join("state.redb"),
            config: config_path,
            dir,
            manual_clock,
            env: Vec::new(),
            wrapper: Vec::new(),
            child: None,
            starts: 0,
        };
        daemon
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join(format!("daemon-{}.log", self.starts))
    }

    pub fn log(&self) -> String {
        let mut all = String::new();
        for n in 1..=self.starts {
            let p = self.dir.path().join(format!("daemon-{n}.log"));
            all += &format!("--- start {n} ---\n{}", std::fs::read_to_string(p).unwrap_or_default());
        }
        all
    }

    pub fn serve_command(&self) -> Command {
        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(BIN);
                cmd
            }
            None => Command::new(BIN),
        };
        cmd.envs(self.env.iter().cloned());
        cmd.arg("serve").arg("--socket").arg(&self.socket).arg("--state").arg(&self.state);
        if let Some(c) = &self.config {
            cmd.arg("--config").arg(c);
        }
        if self.manual_clock {
            cmd.arg("--manual-clock");
        }
        cmd
    }

    /// (Re)starts the daemon on the same state file and waits until it answers.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "already running");
        self.starts += 1;
        let log = std::fs::File::create(self.log_path()).unwrap();
        let child = self
            .serve_command()
            .envs(std::env::vars().filter(|(k, _)| k.starts_with("MALLOC_") || k == "TOLLGATE_LOG"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn tollgate serve");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("daemon exited at start with {status}:\n{}", self.log());
            }
            assert!(Instant::now() < deadline, "daemon did not listen in time:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits up to 20 s until this start's log holds `needle`: the socket
    /// accepts before the start-up line is written.
    pub fn wait_for_log(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !std::fs::read_to_string(self.log_path()).unwrap_or_default().contains(needle) {
            assert!(Instant::now() < deadline, "no {needle:?} in the log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGSTOP, returning once every thread has stopped: a thread running
    /// when the signal came can still answer a request sent after `kill`
    /// returned.
    pub fn freeze(&self) {
        let pid = self.pid();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGSTOP).unwrap();
        let stopped = || {
            std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().all(|task| {
                let stat = std::fs::read_to_string(task.unwrap().path().join("stat")).unwrap_or_default();
                // The state follows the command name's closing parenthesis.
                stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
            })
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !stopped() {
            assert!(Instant::now() < deadline, "the daemon's threads did not all stop");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// SIGCONT after `freeze`.
    pub fn thaw(&self) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid() as i32), nix::sys::signal::Signal::SIGCONT)
            .unwrap();
    }

    /// `kill -9`: no snapshot, no cleanup.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// SIGTERM and wait for the exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM)
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "daemon did not stop on SIGTERM:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Rewrites the config file and sends SIGHUP; waits until the daemon has
    /// counted the reload (as applied or failed).
    pub fn reload_with(&self, config: &str) {
        let path = self.config.as_ref().expect("started with a config file");
        std::fs::write(path, config).unwrap();
        let before = self.cli_json(&["status"]);
        let seen = |s: &serde_json::Value| s["reloads"].as_u64().unwrap() + s["reload_failures"].as_u64().unwrap();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid() as i32), nix::sys::signal::Signal::SIGHUP)
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen(&self.cli_json(&["status"])) == seen(&before) {
            assert!(Instant::now() < deadline, "reload not seen:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Resident memory of the daemon, from /proc.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    /// A client with a generous timeout (tests are not latency tests).
    pub fn client(&self) -> Client {
        Client::new(ClientConfig::new(&self.socket).timeout(Duration::from_secs(10)))
    }

    /// Runs the CLI against this daemon.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(BIN).args(args).env("TOLLGATE_SOCKET", &self.socket).output().expect("run tollgate")
    }

    /// Runs the CLI with `--json` and parses its one JSON object.
    pub fn cli_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all: Vec<&str> = args.to_vec();
        all.push("--json");
        let out = self.cli(&all);
        // `check` exits 3, 4 or 5 for a delay, challenge or deny verdict;
        // `unlock` 6 when it cleared nothing.
        let verdict = (args.first() == Some(&"check") && matches!(out.status.code(), Some(3..=5)))
            || (args.first() == Some(&"unlock") && out.status.code() == Some(6));
        assert!(out.status.success() || verdict, "tollgate {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
    }

    /// A daemon whose socket anyone may connect to, for a test that asks
    /// as an unprivileged uid (`cli_as_nobody`); None, with a line saying
    /// why the test is skipped, without root or setpriv.
    pub fn open_to_everyone() -> Option<TestDaemon> {
        if !nix::unistd::geteuid().is_root() || Command::new("setpriv").arg("--help").output().is_err() {
            eprintln!("skipped: needs root and setpriv to switch to an unprivileged uid");
            return None;
        }
        let mut daemon = TestDaemon::prepare(Some("[server]\nsocket_mode = 0o666\n"), true);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(daemon.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        daemon.spawn();
        Some(daemon)
    }

    /// Runs the CLI against this daemon as uid and gid 65534 (nobody).
    pub fn cli_as_nobody(&self, args: &[&str]) -> Output {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN])
            .args(args)
            .env("TOLLGATE_SOCKET", &self.socket)
            .output()
            .expect("run tollgate as nobody")
    }

    pub fn advance(&self, by: &str) {
        let out = self.cli(&["clock", "advance", by]);
        assert!(out.status.success(), "clock advance: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("daemon log ({}):\n{}", self.dir.path().display(), self.log());
        }
    }
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn subject<'a>(peer: &str, account: &'a str) -> Subject<'a> {
    Subject { peer: Some(ip(peer)), account: Some(account), ..Subject::default() }
}

pub fn verdict(answer: tollgate::client::Answer) -> Verdict<'static> {
    match answer {
        tollgate::client::Answer::Verdict(v) => v,
        other => panic!("expected a verdict, got {other:?}"),
    }
}

/// Sends many requests over one connection, `window` in flight at a time,
/// and returns the replies in request order. For floods and bulk set-up.
pub async fn pipeline(
    socket: &Path,
    count: usize,
    window: usize,
    mut make: impl FnMut(usize, &mut Vec<u8>),
) -> Vec<Response<'static>> {
    let mut stream = UnixStream::connect(socket).await.unwrap();
    let mut replies = Vec::with_capacity(count);
    let mut out = Vec::new();
    let mut inbuf: Vec<u8> = Vec::new();
    let mut sent = 0;
    while replies.len() < count {
        out.clear();
        while sent < count && sent - replies.len() < window {
            make(sent, &mut out);
            sent += 1;
        }
        if !out.is_empty() {
            stream.write_all(&out).await.unwrap();
        }
        let mut chunk = vec![0u8; 256 * 1024];
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "daemon closed the connection");
        inbuf.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        while let Some(end) = codec::frame_len(&inbuf[at..], codec::RESPONSE_PAYLOAD_BYTES_MAX).unwrap() {
            let (id, response) = codec::decode_response(&inbuf[at + FRAME_HEADER_BYTES..at + end]).unwrap();
            assert_eq!(id as usize, replies.len(), "replies come in order");
            replies.push(response);
            at += end;
        }
        inbuf.drain(..at);
    }
    replies
}

/// Encodes a report frame (for `pipeline`).
pub fn report_frame(id: usize, route: &str, subject: &Subject<'_>, outcome: Outcome, out: &mut Vec<u8>) {
    let report = Request::Report { route, subject: subject.clone(), outcome, password_digest: None };
    codec::encode_request(id as u64, &report, out);
}

/// Runs `attempt` on `n` clients at once: each connects first, then all wait
/// at a barrier, so the requests really race. Returns the results in order.
pub async fn race<T: Send + 'static, F, Fut>(daemon: &TestDaemon, n: usize, attempt: F) -> Vec<T>
where
    F: Fn(Client) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::new();
    for _ in 0..n {
        let client = daemon.client();
        client.status().await.unwrap();
        let barrier = barrier.clone();
        let run = attempt(client);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            run.await
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

// ---- helpers several test files share ----

/// xorshift64: seeded, so a failing run can be replayed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

pub fn v4(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(n))
}

/// An address in a /64 of its own for every `n` (the /64 is the first four
/// segments; `n` fills the third and fourth).
pub fn own_64(first: u16, second: u16, n: u32) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(first, second, (n >> 16) as u16, n as u16, 0x1a2b, 0x3c4d, 0, 1))
}

pub fn who(peer: IpAddr, account: Option<&str>) -> Subject<'_> {
    Subject { peer: Some(peer), account, ..Subject::default() }
}

/// A field of /proc/PID/status in KiB (VmRSS, VmHWM, VmPeak...).
pub fn proc_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|v| v.strip_prefix(':')))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub fn latency_summary(mut samples: Vec<Duration>) -> (Duration, Duration, Duration) {
    samples.sort();
    (percentile(&samples, 0.5), percentile(&samples, 0.99), *samples.last().unwrap())
}

/// One request and its reply over a blocking connection.
pub fn call_std(stream: &mut std::os::unix::net::UnixStream, id: u64, request: &Request<'_>) -> Response<'static> {
    let mut frame = Vec::new();
    codec::encode_request(id, request, &mut frame);
    stream.write_all(&frame).unwrap();
    let (reply_id, reply) = read_reply(stream);
    assert_eq!(reply_id, id, "the reply names its request");
    reply
}

pub fn read_reply(stream: &mut std::os::unix::net::UnixStream) -> (u64, Response<'static>) {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
    let mut payload = vec![0u8; u32::from_le_bytes(header) as usize];
    stream.read_exact(&mut payload).unwrap();
    codec::decode_response(&payload).unwrap()
}

pub fn check_frame(id: usize, route: &str, subject: &Subject<'_>, out: &mut Vec<u8>) {
    codec::encode_request(id as u64, &Request::Check { route, subject: subject.clone() }, out);
}

/// mallory from 203.0.113.5: the pair the window-change tests lock.
pub fn mallory() -> Subject<'static> {
    who(v4(0xcb00_7105), Some("mallory"))
}

pub fn eve() -> Subject<'static> {
    who(v4(0xcb00_7106), Some("eve"))
}

pub fn fail_five_times(daemon: &TestDaemon, subject: &Subject<'_>) {
    let rt = runtime();
    let client = daemon.client();
    for _ in 0..5 {
        verdict(rt.block_on(client.report("login", subject, Outcome::Failure)));
    }
}
