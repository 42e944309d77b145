//! A failure rule's rows in the state file across restarts and reloads,
//! against real daemons: rows that expire while the daemon is down are
//! deleted at the next start; a window changed while it was down, or by a
//! reload, re-dates lockouts and neither invents nor lifts one; a rule
//! switched off and on starts empty and its rows never come back.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use tollgate::protocol::{Decision, Outcome, Subject};

const LOGIN: &str = "login";

/// Rows in the state file, read as the daemon reads them at start.
fn state_rows(path: &Path) -> Vec<tollgate::PersistedEntry> {
    tollgate::Store::open(path, false).expect("state file opens").load().expect("state file loads")
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
