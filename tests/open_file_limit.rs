//! The daemon at its open-file limit, against real daemons: it raises its
//! soft limit to the hard one at start, and at the limit the watchdog keeps
//! pinging, the log stays small and serving goes on.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tollgate::protocol::{Decision, Request, Response};

const LOGIN: &str = "login";

// ---------------------------------------------------------------------------
// At the open-file limit

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
