//! Real `redis-server` processes for the shared-store tests
//! (docs/design/shared-store.md §7.1): started in temp dirs, killed with
//! SIGKILL, frozen with SIGSTOP, and a proxy that can delay, drop or
//! black-hole the path to one of them. No mocks: the store's failure modes
//! are what the daemon has to survive, so the tests cause them for real.
#![allow(dead_code)]

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const READY_TIMEOUT: Duration = Duration::from_secs(5);
const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(15);
/// Another process can take a port between our probe bind and Redis's bind.
const PORT_ATTEMPTS: usize = 5;

/// Panics, never skips: a missing Redis must fail the suite, or the
/// shared-store tests would pass by not running.
pub fn require_redis() {
    let found = |tool: &str| {
        std::env::var_os("PATH")
            .map(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
            .unwrap_or(false)
    };
    if !found("redis-server") || !found("redis-cli") {
        panic!("redis-server not found: run `bash scripts/test.sh` or `apt-get install -y redis-server redis-tools`");
    }
}

/// Sends a raw RESP PING and returns the first reply line (`+PONG` from a
/// healthy server). Speaks the bytes itself so a test can put its own read
/// timeout on the stream and see a frozen or black-holed server as a timeout.
pub fn ping(stream: &mut (impl Read + Write)) -> std::io::Result<String> {
    stream.write_all(b"*1\r\n$4\r\nPING\r\n")?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        if stream.read(&mut byte)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        line.push(byte[0]);
    }
    line.truncate(line.len() - 2);
    Ok(String::from_utf8_lossy(&line).into_owned())
}

fn ping_unix(path: &Path) -> bool {
    let Ok(mut s) = UnixStream::connect(path) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    // A server that asks for a password is up too: it answers NOAUTH.
    matches!(ping(&mut s).as_deref(), Ok(line) if line == "+PONG" || line.starts_with("-NOAUTH"))
}

fn ping_tcp(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    matches!(ping(&mut s).as_deref(), Ok("+PONG"))
}

/// `n` loopback ports free at the same instant (all bound before any is
/// released, so they are distinct). Redis may still lose one to a race.
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> =
        (0..n).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0")).collect();
    listeners.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).unwrap_or_else(|e| panic!("{sig} to redis-server: {e}"));
}

fn redis_cli(target: &[String], args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(target)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running redis-cli: {e}"));
    assert!(
        out.status.success(),
        "redis-cli {target:?} {args:?} exited {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[derive(Clone, Debug)]
enum Addr {
    Unix(PathBuf),
    Tcp(u16),
}

/// One `redis-server` without persistence: a restart comes back empty,
/// like a store that lost its memory.
pub struct RedisServer {
    dir: tempfile::TempDir,
    addr: Addr,
    child: Option<Child>,
    paused: bool,
    /// `requirepass`, if the server asks for one.
    password: Option<String>,
    /// TLS only (`tls()`): the directory of `ca.crt`, `server.crt` and
    /// `server.key`; the port is then a TLS port and plain TCP is off.
    tls: Option<PathBuf>,
    /// TLS (`tls_mutual()`): clients must present a certificate `ca.crt`
    /// issued (`tls-auth-clients yes`); `redis-cli` uses `client.crt`.
    tls_mutual: bool,
}

impl RedisServer {
    /// Listening only on `D/r.sock` (`--port 0` turns TCP off).
    pub fn unix() -> RedisServer {
        require_redis();
        let dir = temp_dir();
        let addr = Addr::Unix(dir.path().join("r.sock"));
        let mut server =
            RedisServer { dir, addr, child: None, paused: false, password: None, tls: None, tls_mutual: false };
        if let Err(why) = server.start() {
            panic!("redis-server did not start: {why}\n{}", server.log());
        }
        server
    }

    /// On a Unix socket, asking for `password` (AUTH) before any command.
    pub fn unix_with_password(password: &str) -> RedisServer {
        require_redis();
        let dir = temp_dir();
        let addr = Addr::Unix(dir.path().join("r.sock"));
        let mut server = RedisServer {
            dir,
            addr,
            child: None,
            paused: false,
            password: Some(password.into()),
            tls: None,
            tls_mutual: false,
        };
        if let Err(why) = server.start() {
            panic!("redis-server did not start: {why}\n{}", server.log());
        }
        server
    }

    /// Listening on a free loopback port.
    pub fn tcp() -> RedisServer {
        require_redis();
        RedisServer::tcp_with(None, false)
    }

    /// TLS only, on a free loopback port, with `certs`' `server.crt` and
    /// `server.key` (issued for 127.0.0.1 by `ca.crt`). Clients are not
    /// asked for a certificate.
    pub fn tls(certs: &Path) -> RedisServer {
        RedisServer::tcp_with(Some(certs.to_path_buf()), false)
    }

    /// As `tls`, and every client must present a certificate `ca.crt`
    /// issued (mutual TLS).
    pub fn tls_mutual(certs: &Path) -> RedisServer {
        RedisServer::tcp_with(Some(certs.to_path_buf()), true)
    }

    fn tcp_with(tls: Option<PathBuf>, tls_mutual: bool) -> RedisServer {
        require_redis();
        let mut server = RedisServer {
            dir: temp_dir(),
            addr: Addr::Tcp(0),
            child: None,
            paused: false,
            password: None,
            tls,
            tls_mutual,
        };
        let mut why = String::new();
        for _ in 0..PORT_ATTEMPTS {
            server.addr = Addr::Tcp(free_ports(1)[0]);
            match server.start() {
                Ok(()) => return server,
                Err(e) => why = format!("{e}\n{}", server.log()),
            }
        }
        panic!("redis-server did not start on a free port after {PORT_ATTEMPTS} tries: {why}");
    }

    fn start(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "redis-server already running");
        let d = self.dir.path();
        // Appended, so a restart's log follows the first run's.
        let log = OpenOptions::new().create(true).append(true).open(self.log_path()).unwrap();
        let mut cmd = Command::new("redis-server");
        match &self.addr {
            Addr::Unix(sock) => {
                cmd.args(["--port", "0", "--unixsocket"]).arg(sock).args(["--unixsocketperm", "700"]);
            }
            Addr::Tcp(port) => match &self.tls {
                None => {
                    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"]);
                }
                Some(certs) => {
                    cmd.args(["--bind", "127.0.0.1"]);
                    tls_only(&mut cmd, *port, certs, self.tls_mutual);
                }
            },
        }
        cmd.args(["--save", "", "--appendonly", "no", "--daemonize", "no", "--dir"]).arg(d);
        if let Some(password) = &self.password {
            cmd.arg("--requirepass").arg(password);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawning redis-server: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let up = match &self.addr {
                Addr::Unix(sock) => ping_unix(sock),
                Addr::Tcp(_) if self.tls.is_some() => self.ping_tls(),
                Addr::Tcp(port) => ping_tcp(*port),
            };
            if up {
                return Ok(());
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Err(format!("redis-server exited with {status}"));
            }
            if Instant::now() > deadline {
                self.stop();
                return Err(format!("no PONG within {READY_TIMEOUT:?}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A PING over TLS, through `redis-cli` (it speaks TLS; the harness
    /// does not).
    fn ping_tls(&self) -> bool {
        Command::new("redis-cli")
            .args(self.cli_target())
            .arg("PING")
            .stdin(Stdio::null())
            .output()
            .is_ok_and(|out| out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "PONG")
    }

    /// How `redis-cli` reaches this server.
    fn cli_target(&self) -> Vec<String> {
        let mut target = match &self.addr {
            Addr::Unix(sock) => vec!["-s".to_string(), sock.display().to_string()],
            Addr::Tcp(port) => vec!["-p".to_string(), port.to_string()],
        };
        if let Some(certs) = &self.tls {
            target.extend(["--tls".to_string(), "--cacert".to_string(), certs.join("ca.crt").display().to_string()]);
            if self.tls_mutual {
                for (flag, file) in [("--cert", "client.crt"), ("--key", "client.key")] {
                    target.extend([flag.to_string(), certs.join(file).display().to_string()]);
                }
            }
        }
        if let Some(password) = &self.password {
            target.extend(["--no-auth-warning".to_string(), "-a".to_string(), password.clone()]);
        }
        target
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.paused {
                let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGCONT);
                self.paused = false;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// `redis+unix:///abs/path/r.sock`, `redis://127.0.0.1:PORT` or
    /// (`tls()`) `rediss://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        match &self.addr {
            Addr::Unix(sock) => format!("redis+unix://{}", sock.display()),
            Addr::Tcp(port) if self.tls.is_some() => format!("rediss://127.0.0.1:{port}"),
            Addr::Tcp(port) => format!("redis://127.0.0.1:{port}"),
        }
    }

    /// The socket of a `unix()` server.
    pub fn socket_path(&self) -> &Path {
        match &self.addr {
            Addr::Unix(sock) => sock,
            Addr::Tcp(_) => panic!("a TCP server has no socket path"),
        }
    }

    /// The port of a `tcp()` server.
    pub fn port(&self) -> u16 {
        match &self.addr {
            Addr::Tcp(port) => *port,
            Addr::Unix(_) => panic!("a Unix-socket server has no port"),
        }
    }

    /// The address of a `tcp()` server, for a `Proxy`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port()))
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("redis-server running").id()
    }

    /// SIGKILL and reap: the store vanishes mid-conversation, no goodbye.
    pub fn kill9(&mut self) {
        assert!(self.child.is_some(), "redis-server not running");
        self.stop();
    }

    /// Starts again on the same socket or port, with no data (nothing is
    /// persisted). Kills the running server first, if any.
    pub fn restart(&mut self) {
        self.stop();
        if let Err(why) = self.start() {
            panic!("redis-server did not restart on {}: {why}\n{}", self.url(), self.log());
        }
    }

    /// SIGSTOP: connections stay open and accept bytes, nothing answers.
    /// The kernel still completes TCP handshakes from the listen backlog.
    pub fn pause(&mut self) {
        signal(self.child.as_ref().expect("redis-server running"), Signal::SIGSTOP);
        self.paused = true;
    }

    pub fn resume(&mut self) {
        signal(self.child.as_ref().expect("redis-server running"), Signal::SIGCONT);
        self.paused = false;
    }

    /// Runs one command through `redis-cli` and returns its stdout, trimmed.
    /// For inspecting and planting keys; it blocks on a paused server.
    pub fn cmd(&self, args: &[&str]) -> String {
        redis_cli(&self.cli_target(), args)
    }

    /// A store that is slow but there, until the guard drops: another
    /// client's script keeps the server busy for `busy`, then lets it
    /// breathe for `idle`, over and over. A call caught behind it is late
    /// while replies keep coming, which a flood of checks makes only
    /// sometimes (once not at all in a fresh-clone CI run). Unix socket,
    /// no password.
    pub fn stall(&self, busy: Duration, idle: Duration) -> Stalls {
        let Addr::Unix(path) = self.addr.clone() else { panic!("stall: a Unix-socket server") };
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stalls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (s, n) = (stop.clone(), stalls.clone());
        let thread = std::thread::spawn(move || {
            let mut stream = UnixStream::connect(&path).expect("stall: connect");
            // The server's own clock, so the busy time is the server's.
            let script = "local t = redis.call('TIME') local t0 = t[1] * 1000000 + t[2] \
                          repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - t0 >= tonumber(ARGV[1])";
            let micros = busy.as_micros().to_string();
            let mut command = Vec::new();
            for arg in ["EVAL", script, "0", &micros] {
                command.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
            }
            let command = [b"*4\r\n".as_slice(), &command].concat();
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                stream.write_all(&command).expect("stall: send");
                let mut reply = [0u8; 64];
                let got = stream.read(&mut reply).expect("stall: reply");
                assert!(
                    reply[..got].starts_with(b"$-1") || reply[..got].starts_with(b"_"),
                    "stall: {:?}",
                    String::from_utf8_lossy(&reply[..got])
                );
                n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(idle);
            }
        });
        Stalls { stop, stalls, thread: Some(thread) }
    }
}

/// `RedisServer::stall`'s guard: the stalls end when it drops.
pub struct Stalls {
    stop: Arc<std::sync::atomic::AtomicBool>,
    stalls: Arc<std::sync::atomic::AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Stalls {
    /// How many stalls the server has run so far.
    pub fn count(&self) -> usize {
        self.stalls.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Stalls {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("redis log ({}):\n{}", self.dir.path().display(), self.log());
        }
    }
}

/// `redis-server` listening with TLS only on `port` (plain TCP off), with
/// `certs`' `server.crt`, `server.key` and `ca.crt`; with `mutual`, every
/// client must present a certificate `ca.crt` issued.
fn tls_only<'c>(cmd: &'c mut Command, port: u16, certs: &Path, mutual: bool) -> &'c mut Command {
    cmd.args(["--port", "0", "--tls-port", &port.to_string()])
        .arg("--tls-cert-file")
        .arg(certs.join("server.crt"))
        .arg("--tls-key-file")
        .arg(certs.join("server.key"))
        .arg("--tls-ca-cert-file")
        .arg(certs.join("ca.crt"))
        .args(["--tls-auth-clients", if mutual { "yes" } else { "no" }])
}

fn temp_dir() -> tempfile::TempDir {
    // Short: a Unix socket path must fit in 108 bytes.
    tempfile::Builder::new().prefix("tg-redis").tempdir_in("/tmp").expect("temp dir")
}

struct Node {
    port: u16,
    bus_port: u16,
    child: Option<Child>,
}

/// Three masters, no replicas: killing one takes its slots away, the way a
/// real node loss does for keys it held.
pub struct Cluster {
    dir: tempfile::TempDir,
    nodes: Vec<Node>,
    /// TLS only (`three_tls()`): the directory of `ca.crt`, `server.crt` and
    /// `server.key`; clients and the cluster bus both speak TLS.
    tls: Option<PathBuf>,
}

impl Cluster {
    pub fn three() -> Cluster {
        Cluster::three_with(None)
    }

    /// As `three`, TLS only (`tls-cluster yes`: the bus too), with `certs`'
    /// `server.crt` and `server.key` (issued for 127.0.0.1 by `ca.crt`).
    /// Clients are not asked for a certificate.
    pub fn three_tls(certs: &Path) -> Cluster {
        Cluster::three_with(Some(certs.to_path_buf()))
    }

    fn three_with(tls: Option<PathBuf>) -> Cluster {
        require_redis();
        let mut why = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let mut cluster = Cluster { dir: temp_dir(), nodes: Vec::new(), tls: tls.clone() };
            match cluster.start() {
                Ok(()) => return cluster,
                Err(e) => why = format!("{e}\n{}", cluster.logs()),
            }
        }
        panic!("redis cluster did not come up after {PORT_ATTEMPTS} tries: {why}");
    }

    fn start(&mut self) -> Result<(), String> {
        // Six at once, so no node's bus port (set explicitly, not the
        // default port+10000) can collide with another node's port.
        let ports = free_ports(6);
        let d = self.dir.path().to_path_buf();
        for i in 0..3 {
            let (port, bus_port) = (ports[i], ports[i + 3]);
            let log = File::create(d.join(format!("redis-{i}.log"))).unwrap();
            let mut cmd = Command::new("redis-server");
            match &self.tls {
                None => cmd.args(["--port", &port.to_string()]),
                Some(certs) => tls_only(&mut cmd, port, certs, false).args(["--tls-cluster", "yes"]),
            };
            let child = cmd
                .args(["--cluster-port", &bus_port.to_string()])
                .args(["--bind", "127.0.0.1", "--cluster-enabled", "yes", "--cluster-config-file"])
                .arg(d.join(format!("nodes-{i}.conf")))
                .args(["--cluster-node-timeout", "2000"])
                // A dead master's slots go unserved; the others' stay served
                // (the default refuses every key once any slot is down).
                .args(["--cluster-require-full-coverage", "no"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no", "--dir"])
                .arg(&d)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .map_err(|e| format!("spawning redis-server: {e}"))?;
            self.nodes.push(Node { port, bus_port, child: Some(child) });
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        for i in 0..3 {
            while !self.ping(i) {
                if let Some(status) = self.nodes[i].child.as_mut().unwrap().try_wait().unwrap() {
                    return Err(format!("node {i} exited with {status}"));
                }
                if Instant::now() > deadline {
                    return Err(format!("node {i}: no PONG within {READY_TIMEOUT:?}"));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let out = Command::new("redis-cli")
            .args(self.tls_args())
            .arg("--cluster")
            .arg("create")
            .args(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running redis-cli --cluster create: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create exited {}:\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let deadline = Instant::now() + CLUSTER_READY_TIMEOUT;
        // Each node must agree, or a client's first MOVED could point at a
        // node that does not yet know its slots.
        for i in 0..3 {
            loop {
                let info = self.node_cmd(i, &["CLUSTER", "INFO"]);
                if info.lines().any(|l| l.trim() == "cluster_state:ok") {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("node {i} not cluster_state:ok within {CLUSTER_READY_TIMEOUT:?}:\n{info}"));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    pub fn logs(&self) -> String {
        (0..3)
            .map(|i| {
                let text = std::fs::read_to_string(self.dir.path().join(format!("redis-{i}.log"))).unwrap_or_default();
                format!("--- node {i} ---\n{text}")
            })
            .collect()
    }

    /// `redis://127.0.0.1:PORT` (TLS: `rediss://`) for each node, in node
    /// order.
    pub fn urls(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        self.nodes.iter().map(|n| format!("{scheme}://127.0.0.1:{}", n.port)).collect()
    }

    /// `redis-cli`'s TLS options for this cluster (none without TLS).
    fn tls_args(&self) -> Vec<String> {
        match &self.tls {
            None => Vec::new(),
            Some(certs) => vec!["--tls".into(), "--cacert".into(), certs.join("ca.crt").display().to_string()],
        }
    }

    /// Whether node `i` answers PING (over TLS through `redis-cli`).
    fn ping(&self, i: usize) -> bool {
        if self.tls.is_none() {
            return ping_tcp(self.nodes[i].port);
        }
        Command::new("redis-cli")
            .args(self.tls_args())
            .args(["-p", &self.nodes[i].port.to_string(), "PING"])
            .stdin(Stdio::null())
            .output()
            .is_ok_and(|out| out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "PONG")
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The cluster-bus port of node `i` (chosen, not port+10000).
    pub fn bus_port(&self, i: usize) -> u16 {
        self.nodes[i].bus_port
    }

    /// SIGKILL node `i`; with no replicas its slots stay unserved.
    pub fn kill9(&mut self, i: usize) {
        let mut child = self.nodes[i].child.take().unwrap_or_else(|| panic!("node {i} not running"));
        let _ = child.kill();
        let _ = child.wait();
    }

    /// SIGSTOP node `i`: its connections stay open and nothing answers.
    /// (Drop's SIGKILL ends a stopped node all the same.)
    pub fn pause(&mut self, i: usize) {
        signal(self.nodes[i].child.as_ref().unwrap_or_else(|| panic!("node {i} not running")), Signal::SIGSTOP);
    }

    pub fn resume(&mut self, i: usize) {
        signal(self.nodes[i].child.as_ref().unwrap_or_else(|| panic!("node {i} not running")), Signal::SIGCONT);
    }

    /// One command on node `i` through `redis-cli` (no `-c`: a key in
    /// another node's slot answers MOVED, which is what a test may want).
    pub fn node_cmd(&self, i: usize, args: &[&str]) -> String {
        let mut target = self.tls_args();
        target.extend(["-p".to_string(), self.nodes[i].port.to_string()]);
        redis_cli(&target, args)
    }
}

impl Cluster {
    /// One command through `redis-cli -c` at node 0, following MOVED the
    /// way a cluster client does.
    pub fn cmd(&self, args: &[&str]) -> String {
        let mut target = self.tls_args();
        target.extend(["-c".to_string(), "-p".to_string(), self.nodes[0].port.to_string()]);
        redis_cli(&target, args)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() {
            eprintln!("cluster logs ({}):\n{}", self.dir.path().display(), self.logs());
        }
    }
}

/// What the path through a `Proxy` does, switchable while connections live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    Pass,
    /// Each reply chunk waits this long before it is forwarded. Requests go
    /// through at once, so a round trip takes `d` longer and the command has
    /// already run when its reply is late, as with a slow return path.
    Delay(Duration),
    /// Resets every open connection (RST) and resets new ones at accept: a
    /// store that is gone and says so.
    Drop,
    /// Accepts, reads and discards, never answers, never closes: a firewall
    /// that drops packets. A connection that has been black-holed stays so
    /// after a switch back to `Pass` (its discarded requests would otherwise
    /// leave replies out of step); only new connections work again.
    BlackHole,
}

/// A TCP forwarder on `127.0.0.1:0` to one Redis, on its own thread and
/// runtime so it keeps working while a test blocks its own thread.
pub struct Proxy {
    listen: SocketAddr,
    mode: Arc<tokio::sync::watch::Sender<ProxyMode>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    pub fn new(target: SocketAddr) -> Proxy {
        let std_listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        std_listener.set_nonblocking(true).unwrap();
        let listen = std_listener.local_addr().unwrap();
        let (mode, mode_rx) = tokio::sync::watch::channel(ProxyMode::Pass);
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("proxy-{}", listen.port()))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                    tokio::select! {
                        _ = accept_loop(listener, target, mode_rx) => {}
                        _ = shutdown_rx => {}
                    }
                });
                // Dropping the runtime cancels every connection task, which
                // closes their sockets.
            })
            .expect("spawn proxy thread");
        Proxy { listen, mode: Arc::new(mode), shutdown: Some(shutdown), thread: Some(thread) }
    }

    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }

    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    pub fn port(&self) -> u16 {
        self.listen.port()
    }

    /// `redis://127.0.0.1:PORT` of the proxy's own listening side.
    pub fn url(&self) -> String {
        format!("redis://{}", self.listen)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    target: SocketAddr,
    mut mode: tokio::sync::watch::Receiver<ProxyMode>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // EMFILE and the like: back off rather than spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        // Marked seen, so a connection's clone reacts only to later switches.
        let now = *mode.borrow_and_update();
        match now {
            ProxyMode::Drop => reset(&client),
            ProxyMode::BlackHole => {
                tokio::spawn(black_hole(client, mode.clone()));
            }
            ProxyMode::Pass | ProxyMode::Delay(_) => {
                let mode = mode.clone();
                tokio::spawn(async move {
                    // Upstream gone: the client sees its connection close.
                    if let Ok(server) = tokio::net::TcpStream::connect(target).await {
                        let _ = server.set_nodelay(true);
                        let _ = client.set_nodelay(true);
                        forward(client, server, mode).await;
                    }
                });
            }
        }
    }
}

fn reset(stream: &tokio::net::TcpStream) {
    // Zero linger turns the close into an RST.
    let _ = stream.set_zero_linger();
}

/// Holds the connection open until the proxy goes away or is switched to
/// `Drop`, which resets black-holed connections like all others.
async fn black_hole(client: tokio::net::TcpStream, mut mode: tokio::sync::watch::Receiver<ProxyMode>) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut peer_closed = false;
    loop {
        tokio::select! {
            r = read_some(&client, &mut buf), if !peer_closed => {
                // The peer closed: still never close first.
                peer_closed = matches!(r, Ok(0) | Err(_));
            }
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
                if *mode.borrow_and_update() == ProxyMode::Drop {
                    reset(&client);
                    return;
                }
            }
        }
    }
}

async fn forward(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    mode: tokio::sync::watch::Receiver<ProxyMode>,
) {
    // Both directions see the same flag, so a hole in one is a hole in both.
    let holed = std::sync::atomic::AtomicBool::new(false);
    let outcome = tokio::select! {
        r = pump(&client, &server, false, mode.clone(), &holed) => r,
        r = pump(&server, &client, true, mode.clone(), &holed) => r,
    };
    match outcome {
        End::Reset => {
            reset(&client);
            reset(&server);
        }
        End::Closed if holed.load(std::sync::atomic::Ordering::Relaxed) => {
            // A black-holed client must not see its connection end.
            drop(server);
            black_hole(client, mode).await;
        }
        End::Closed => {}
    }
}

enum End {
    Closed,
    Reset,
}

/// Copies `from` to `to` chunk by chunk, applying the mode current when each
/// chunk arrives (and again when it is due, so a switch mid-delay counts).
/// A delayed chunk is due `d` after it arrived, whatever arrived before it:
/// the delay is a slow path's latency, not a bottleneck, so two replies that
/// reach the proxy in separate reads still arrive together, `d` late, not
/// one `d` after the other.
async fn pump(
    from: &tokio::net::TcpStream,
    to: &tokio::net::TcpStream,
    is_reply: bool,
    mut mode: tokio::sync::watch::Receiver<ProxyMode>,
    holed: &std::sync::atomic::AtomicBool,
) -> End {
    use std::sync::atomic::Ordering::Relaxed;
    let mut buf = vec![0u8; 16 * 1024];
    let mut held: std::collections::VecDeque<(tokio::time::Instant, Vec<u8>)> = Default::default();
    let mut peer_closed = false;
    loop {
        if peer_closed && held.is_empty() {
            return End::Closed;
        }
        let due = held.front().map(|(at, _)| *at);
        tokio::select! {
            r = read_some(from, &mut buf), if !peer_closed => {
                let n = match r {
                    Ok(0) | Err(_) => {
                        // What arrived before the close is still delivered.
                        peer_closed = true;
                        continue;
                    }
                    Ok(n) => n,
                };
                let delay = match *mode.borrow() {
                    ProxyMode::Drop => return End::Reset,
                    ProxyMode::BlackHole => {
                        holed.store(true, Relaxed);
                        Duration::ZERO
                    }
                    ProxyMode::Delay(d) if is_reply => d,
                    _ => Duration::ZERO,
                };
                if !holed.load(Relaxed) {
                    held.push_back((tokio::time::Instant::now() + delay, buf[..n].to_vec()));
                }
            }
            _ = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)), if due.is_some() => {
                let (_, chunk) = held.pop_front().expect("a chunk is due");
                match *mode.borrow() {
                    ProxyMode::Drop => return End::Reset,
                    ProxyMode::BlackHole => holed.store(true, Relaxed),
                    _ => {}
                }
                if holed.load(Relaxed) {
                    held.clear();
                    continue;
                }
                if write_all(to, &chunk).await.is_err() {
                    return End::Closed;
                }
            }
            changed = mode.changed() => {
                if changed.is_err() {
                    return End::Closed;
                }
                // Idle connections too: Drop resets at once, BlackHole sticks.
                match *mode.borrow_and_update() {
                    ProxyMode::Drop => return End::Reset,
                    ProxyMode::BlackHole => holed.store(true, Relaxed),
                    _ => {}
                }
            }
        }
    }
}

async fn read_some(s: &tokio::net::TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        s.readable().await?;
        match s.try_read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

async fn write_all(s: &tokio::net::TcpStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        s.writable().await?;
        match s.try_write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `dir/certs`, made and filled by `make_test_certs`: its path.
pub fn test_certs(dir: &Path) -> PathBuf {
    let certs = dir.join("certs");
    std::fs::create_dir(&certs).unwrap();
    make_test_certs(&certs);
    certs
}

/// A CA, a server certificate for 127.0.0.1 and localhost it signed, and a
/// client certificate it signed, in `dir` (`ca.crt`, `server.crt`,
/// `server.key`, `client.crt`, `client.key`), made with the openssl CLI.
fn make_test_certs(dir: &Path) {
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .current_dir(dir)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running openssl (needed for the TLS test): {e}"));
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=tollgate-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ]);
    // A certificate for `subject` with `extension`, issued by the CA, as
    // `name.crt` and `name.key`.
    let issue = |name: &str, subject: &str, extension: &str| {
        let (key, csr, ext, crt) =
            (format!("{name}.key"), format!("{name}.csr"), format!("{name}.ext"), format!("{name}.crt"));
        openssl(&["req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", &key, "-out", &csr]);
        std::fs::write(dir.join(&ext), format!("{extension}\n")).unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ]);
    };
    issue("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost");
    // For mutual TLS.
    issue("client", "/CN=tollgate-host", "extendedKeyUsage=clientAuth");
}
