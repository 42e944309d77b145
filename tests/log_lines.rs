//! The daemon's log lines keep their targets: audit and refusal lines under
//! `tollgate::server`, start and stop lines under `tollgate`. The formatter
//! prints the target on every line and `TOLLGATE_LOG` (an EnvFilter)
//! selects by it, so a journal search or a `tollgate::server=warn` directive
//! would silently stop matching if code moving between modules moved them.

mod common;

use common::*;

#[test]
fn log_lines_keep_their_targets() {
    let mut daemon = TestDaemon::start_with(Some(""), true);
    let ip = "198.51.100.7";
    for _ in 0..6 {
        daemon.cli(&["report", "--route", "login", "--ip", ip, "--account", "alice", "--outcome", "failure"]);
    }
    daemon.cli(&["check", "--route", "login", "--ip", ip, "--account", "alice"]);
    daemon.cli(&["unlock", "--route", "login", "--account", "alice"]);
    daemon.reload_with("");
    assert_eq!(daemon.terminate().code(), Some(0));
    let log = daemon.log();
    let mut missing = Vec::new();
    for line in [
        "tollgate: tollgate listening",
        "tollgate::server: lockout",
        "tollgate::server: refused",
        "tollgate::server: unlock",
        "tollgate::server: configuration reloaded",
        "tollgate: stopping",
        "tollgate: stopped; counters saved",
    ] {
        if !log.contains(line) {
            missing.push(line);
        }
    }
    assert!(missing.is_empty(), "lines not logged under their targets: {missing:?}\n{log}");
    // The unlock's audit line names the account by its keyed tag, as `top`
    // does, and the admin by uid; never the name.
    let unlock = log.lines().find(|l| l.contains("tollgate::server: unlock")).unwrap();
    assert!(unlock.contains("account=acct:") && unlock.contains("uid="), "{unlock}");
    assert!(!log.contains("alice"), "{log}");
}

/// `TOLLGATE_LOG_FORMAT=json`: every line the daemon logs is one JSON
/// object a log shipper can read, with its level, target and fields (no
/// name in them: the lockout line carries digests only).
#[test]
fn json_logs_are_one_object_a_line() {
    let mut daemon = TestDaemon::prepare(Some(""), true);
    daemon.env.push(("TOLLGATE_LOG_FORMAT".into(), "json".into()));
    daemon.spawn();
    let ip = "198.51.100.7";
    for _ in 0..6 {
        daemon.cli(&["report", "--route", "login", "--ip", ip, "--account", "alice", "--outcome", "failure"]);
    }
    assert_eq!(daemon.terminate().code(), Some(0));
    let log = daemon.log();
    let lines: Vec<&str> = log.lines().filter(|l| !l.starts_with("--- start ")).collect();
    assert!(lines.len() >= 3, "{log}");
    let mut targets = Vec::new();
    for line in &lines {
        let value: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(value["level"].is_string() && value["fields"].is_object(), "{line}");
        targets.push(value["target"].as_str().unwrap_or_default().to_string());
    }
    assert!(targets.iter().any(|t| t == "tollgate::server"), "the lockout line: {log}");
    assert!(!log.contains("alice"), "no account name in the log: {log}");
}
