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
}
