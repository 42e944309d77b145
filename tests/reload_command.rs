//! `tollgate reload --pid PID`, the unit's `ExecReload=`: it signals the
//! daemon and exits with the daemon's own answer, so `systemctl reload`
//! fails when the daemon refused the new files, not only when
//! `check-config` did.

mod common;
use common::*;

const VALID: &str = "[routes.login.rules.source_rate]\nlimit = 20\nburst = 20\nperiod_secs = 60\n";

#[test]
fn reload_exits_with_the_daemons_answer() {
    let daemon = TestDaemon::start_with(Some(VALID), true);
    let path = daemon.config.clone().expect("a config file");
    let pid = daemon.pid().to_string();
    let reload = || daemon.cli(&["reload", "--pid", &pid]);

    // A file the daemon refuses (as one changed between check-config and
    // the signal would be): exit 1, the reason on stderr, the old limits kept.
    std::fs::write(&path, "[routes.login.rules.source_rate]\nlimit = 0\n").unwrap();
    let refused = reload();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}\n{}", daemon.log());
    assert!(stderr.contains("refused the reload"), "{stderr}");
    assert_eq!(daemon.cli_json(&["status"])["reload_failures"], 1);

    // A valid change: exit 0, applied.
    std::fs::write(&path, VALID.replace("limit = 20", "limit = 30")).unwrap();
    let applied = reload();
    assert!(applied.status.success(), "{}\n{}", String::from_utf8_lossy(&applied.stderr), daemon.log());
    assert_eq!(String::from_utf8_lossy(&applied.stdout).trim(), "reloaded");
    assert_eq!(daemon.cli_json(&["status"])["reloads"], 1);

    // No such process: an error, nothing waited for.
    let gone = daemon.cli(&["reload", "--pid", "999999999"]);
    assert_eq!(gone.status.code(), Some(1));
}

/// `[shared]` is set once, at start: the daemon's store and the limiter's
/// global rules both come from it, and a check with global rules expects
/// the store. A reload that adds it (or would remove it) is refused, and
/// checks go on being decided by this host alone.
#[test]
fn a_reload_that_adds_a_shared_store_is_refused_and_checks_stay_local() {
    let daemon = TestDaemon::start_with(Some(VALID), true);
    daemon.reload_with(&format!("{VALID}[shared]\nurl = \"redis+unix:///nonexistent/tollgate-test.sock\"\n"));
    let status = daemon.cli_json(&["status"]);
    assert_eq!((status["reloads"].as_u64(), status["reload_failures"].as_u64()), (Some(0), Some(1)), "{status}");
    assert!(status["last_reload_error"].as_str().unwrap().contains("[shared] differs"), "{status}");
    assert!(status["shared"].is_null(), "{status}");
    let check = daemon.cli_json(&["check", "--route", "login", "--ip", "198.51.100.7", "--account", "alice"]);
    assert_eq!(check["decision"], "allow", "{check}\n{}", daemon.log());
    let report = daemon.cli_json(&[
        "report",
        "--route",
        "login",
        "--ip",
        "198.51.100.7",
        "--account",
        "alice",
        "--outcome",
        "failure",
    ]);
    assert_eq!(report["decision"], "allow", "{report}\n{}", daemon.log());
}
