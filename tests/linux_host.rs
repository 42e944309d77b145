//! The daemon on a real Linux host: a full disk, peer credentials, systemd
//! readiness, watchdog and socket activation. Each test skips with a printed
//! reason when the machine lacks what it needs (a tool, or root to switch
//! uid); none needs the network.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

fn have(tool: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().is_ok_and(|o| o.status.success())
}

fn report_failures(daemon: &TestDaemon, account: &str, ip: &str, n: usize) {
    for _ in 0..n {
        daemon.cli_json(&["report", "--route", "login", "--ip", ip, "--account", account, "--outcome", "failure"]);
    }
}

fn check_decision(daemon: &TestDaemon, account: &str, ip: &str) -> String {
    daemon.cli_json(&["check", "--route", "login", "--ip", ip, "--account", account])["decision"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_full_disk_keeps_the_daemon_answering_and_nothing_is_lost_once_it_clears() {
    if !have("prlimit") {
        eprintln!("skipped: prlimit (util-linux) is not installed");
        return;
    }
    let mut daemon = TestDaemon::start();
    let pid = daemon.pid().to_string();
    // A file-size limit below the state file's size: every commit now fails
    // as on a full disk (EFBIG instead of ENOSPC, same path in the daemon).
    let limited = Command::new("prlimit").args(["--pid", &pid, "--fsize=4096:unlimited"]).status().unwrap();
    assert!(limited.success());
    for n in 0..5 {
        report_failures(&daemon, &format!("user{n}"), &format!("198.51.100.{n}"), 5);
    }
    for n in 0..5 {
        assert_eq!(check_decision(&daemon, &format!("user{n}"), &format!("198.51.100.{n}")), "deny");
    }
    let status = daemon.cli_json(&["status"]);
    let p = &status["persistence"];
    assert!(p["write_failures"].as_u64().unwrap() > 0, "{p}");
    assert!(p["last_error"].as_str().unwrap().contains("File too large"), "{p}");
    assert!(p["changes_unwritten"].as_u64().unwrap() >= 5, "{p}");
    assert!(daemon.log().contains("state write failed"), "said loudly in the log");

    // The disk clears: the writer's retry commits everything it held.
    let raised = Command::new("prlimit").args(["--pid", &pid, "--fsize=unlimited:unlimited"]).status().unwrap();
    assert!(raised.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon.cli_json(&["status"])["persistence"]["changes_unwritten"] != 0 {
        assert!(Instant::now() < deadline, "never recovered:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(daemon.log().contains("state file rewritten from memory"), "{}", daemon.log());
    daemon.kill9();
    daemon.spawn();
    for n in 0..5 {
        assert_eq!(check_decision(&daemon, &format!("user{n}"), &format!("198.51.100.{n}")), "deny", "lockout {n}");
    }
}

#[test]
fn a_full_disk_under_the_log_as_well_keeps_the_state_writer_alive() {
    // Found by review: a failed log write was reported with `eprintln!`,
    // which panicked in the logging thread: the state writer and the
    // snapshot thread died, and every later lockout lived in memory only.
    if !have("prlimit") {
        eprintln!("skipped: prlimit (util-linux) is not installed");
        return;
    }
    let mut daemon = TestDaemon::start();
    let pid = daemon.pid().to_string();
    report_failures(&daemon, "before", "198.51.100.20", 5);
    // Room for a line or two more of log, none for the state file.
    let log_bytes = std::fs::metadata(daemon.log_path()).unwrap().len();
    let limit = format!("--fsize={}:unlimited", log_bytes + 200);
    assert!(Command::new("prlimit").args(["--pid", &pid, &limit]).status().unwrap().success());
    for n in 0..5 {
        report_failures(&daemon, &format!("during{n}"), &format!("198.51.100.{}", 30 + n), 5);
    }
    assert!(Command::new("prlimit").args(["--pid", &pid, "--fsize=unlimited:unlimited"]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon.cli_json(&["status"])["persistence"]["changes_unwritten"] != 0 {
        assert!(Instant::now() < deadline, "the writer never recovered:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    daemon.kill9();
    daemon.spawn();
    assert_eq!(check_decision(&daemon, "before", "198.51.100.20"), "deny");
    for n in 0..5 {
        assert_eq!(check_decision(&daemon, &format!("during{n}"), &format!("198.51.100.{}", 30 + n)), "deny", "{n}");
    }
}

#[test]
fn a_second_daemon_is_refused_the_state_file_even_while_writes_are_failing() {
    // Found by review: while writes failed the writer closed the state file
    // and with it redb's lock, so a second daemon could open the same file
    // and later lose the lockouts it had acknowledged.
    if !have("prlimit") {
        eprintln!("skipped: prlimit (util-linux) is not installed");
        return;
    }
    let daemon = TestDaemon::start();
    let pid = daemon.pid().to_string();
    assert!(Command::new("prlimit").args(["--pid", &pid, "--fsize=4096:unlimited"]).status().unwrap().success());
    report_failures(&daemon, "ivy", "198.51.100.40", 5);
    let failing = daemon.cli_json(&["status"]);
    assert!(failing["persistence"]["write_failures"].as_u64().unwrap() > 0, "{}", failing["persistence"]);
    let log = daemon.dir.path().join("second.log");
    let mut second = Command::new(common::BIN)
        .args(["serve", "--manual-clock", "--socket"])
        .arg(daemon.dir.path().join("second.sock"))
        .arg("--state")
        .arg(&daemon.state)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = second.kill();
            let _ = second.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(status.is_some(), "a second daemon started on the same state file: {stderr}");
    assert!(!status.unwrap().success() && stderr.contains("in use by a running daemon"), "{stderr}");
    assert!(Command::new("prlimit").args(["--pid", &pid, "--fsize=unlimited:unlimited"]).status().unwrap().success());
}

/// Runs the CLI as `nobody` (uid and gid 65534).
fn as_nobody(daemon: &TestDaemon, args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN])
        .args(args)
        .env("TOLLGATE_SOCKET", &daemon.socket)
        .output()
        .unwrap()
}

fn can_switch_uid() -> Option<&'static str> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not running as root, cannot switch to another uid");
    }
    if !have("setpriv") {
        return Some("setpriv (util-linux) is not installed");
    }
    None
}

fn open_up(daemon: &TestDaemon) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(daemon.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn an_unprivileged_uid_may_check_but_not_unlock_and_root_may() {
    if let Some(why) = can_switch_uid() {
        eprintln!("skipped: {why}");
        return;
    }
    let daemon = TestDaemon::prepare(Some("[server]\nsocket_mode = 0o666\n"), true);
    open_up(&daemon);
    let mut daemon = daemon;
    daemon.spawn();
    let check =
        as_nobody(&daemon, &["check", "--route", "login", "--ip", "198.51.100.7", "--account", "alice", "--json"]);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let unlock = as_nobody(&daemon, &["unlock", "--route", "login", "--account", "alice"]);
    assert!(!unlock.status.success());
    let stderr = String::from_utf8_lossy(&unlock.stderr);
    assert!(stderr.contains("permission denied"), "{stderr}");
    assert!(daemon.log().contains("permission denied"), "an audit line");
    // the refused connection is not the end of anything: root unlocks, and
    // clears the places the unreported check holds on both login rules
    assert_eq!(daemon.cli_json(&["unlock", "--route", "login", "--account", "alice"])["cleared"], 2);
}

#[test]
fn client_lists_narrow_who_may_check() {
    if let Some(why) = can_switch_uid() {
        eprintln!("skipped: {why}");
        return;
    }
    let config = "[server]\nsocket_mode = 0o666\nclient_users = [\"root\"]\n";
    let mut daemon = TestDaemon::prepare(Some(config), true);
    open_up(&daemon);
    daemon.spawn();
    let check = as_nobody(&daemon, &["check", "--route", "login", "--ip", "198.51.100.7", "--account", "alice"]);
    assert!(!check.status.success());
    assert!(String::from_utf8_lossy(&check.stderr).contains("permission denied"));
    // status stays readable for anyone who can reach the socket
    assert!(as_nobody(&daemon, &["status", "--json"]).status.success());
    assert_eq!(
        daemon.cli_json(&["check", "--route", "login", "--ip", "198.51.100.7", "--account", "alice"])["decision"],
        "allow"
    );
}

fn notify_socket(dir: &Path) -> (UnixDatagram, String) {
    let path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (socket, path.display().to_string())
}

#[test]
fn readiness_and_the_watchdog_are_reported_to_systemd() {
    let mut daemon = TestDaemon::prepare(None, true);
    let (notify, path) = notify_socket(daemon.dir.path());
    daemon.env = vec![("NOTIFY_SOCKET".into(), path), ("WATCHDOG_USEC".into(), "200000".into())];
    // systemd names the watched process; a shell that execs the daemon
    // keeps its pid, as systemd's own exec does.
    daemon.wrapper = vec!["sh".into(), "-c".into(), "WATCHDOG_PID=$$ exec \"$0\" \"$@\"".into()];
    daemon.spawn();
    let mut messages = String::new();
    let mut buf = [0u8; 512];
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(messages.contains("READY=1") && messages.matches("WATCHDOG=1").count() >= 2) {
        assert!(Instant::now() < deadline, "got only: {messages:?}");
        let n = notify.recv(&mut buf).unwrap();
        messages.push_str(&String::from_utf8_lossy(&buf[..n]));
        messages.push('\n');
    }
    // READY comes once the socket answers
    assert_eq!(daemon.cli_json(&["status"])["manual_clock"], true);
    assert!(daemon.terminate().success());
    let mut after = String::new();
    while let Ok(n) = notify.recv(&mut buf) {
        after.push_str(&String::from_utf8_lossy(&buf[..n]));
        if after.contains("STOPPING=1") {
            break;
        }
    }
    assert!(after.contains("STOPPING=1"), "after SIGTERM: {after:?}\n{}", daemon.log());
}

#[test]
fn socket_activation_serves_the_socket_systemd_passes() {
    if !have("systemd-socket-activate") {
        eprintln!("skipped: systemd-socket-activate is not installed");
        return;
    }
    let mut daemon = TestDaemon::prepare(None, true);
    let socket = daemon.socket.display().to_string();
    daemon.wrapper = vec!["systemd-socket-activate".into(), "-l".into(), socket];
    daemon.spawn();
    let v = daemon.cli_json(&["check", "--route", "login", "--ip", "198.51.100.7", "--account", "alice"]);
    assert_eq!(v["decision"], "allow");
    assert!(daemon.terminate().success(), "{}", daemon.log());
}
