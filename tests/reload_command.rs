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
