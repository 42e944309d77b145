//! Full tables degrade, they never stop counting: with both login failure
//! tables full of lockouts, a fresh key is still counted (in the overflow
//! sketch) and locked at its threshold, a fresh user is still let in, and
//! the overflow shows in `status` and metrics.

mod common;

use common::*;
use tollgate::protocol::{Decision, Outcome};

/// One entry per shard in each login failure table; account_failures at 5
/// so that filling it takes as few reports as filling source_failures.
const CONFIG: &str = "\
[routes.login.rules.source_failures]
entries_max = 16
[routes.login.rules.account_failures]
entries_max = 16
threshold = 5
";
/// Enough to fill all 16 shards of each table (each shard misses all of
/// them with probability 16 × (15/16)^200 < 10^-4).
const FILLERS: usize = 200;

/// 5 failures for each of `FILLERS` accounts, each from its own address:
/// enough lockouts to fill every shard of both tables.
fn fill_both_tables_with_lockouts(daemon: &TestDaemon) {
    let accounts: Vec<String> = (0..FILLERS).map(|n| format!("filler-{n}")).collect();
    let addresses: Vec<String> = (0..FILLERS).map(|n| format!("10.{}.{}.1", n / 250, n % 250)).collect();
    runtime().block_on(pipeline(&daemon.socket, FILLERS * 5, 64, |i, out| {
        let n = i / 5;
        report_frame(i, "login", &subject(&addresses[n], &accounts[n]), Outcome::Failure, out);
    }));
}

fn rule_status(daemon: &TestDaemon, rule: &str) -> serde_json::Value {
    let status = daemon.cli_json(&["status"]);
    let login = status["routes"].as_array().unwrap().iter().find(|r| r["name"] == "login").unwrap().clone();
    login["rules"].as_array().unwrap().iter().find(|r| r["name"] == rule).unwrap().clone()
}

#[test]
fn with_both_login_tables_full_of_lockouts_a_fresh_account_still_gets_five_guesses() {
    let daemon = TestDaemon::start_with(Some(CONFIG), true);
    fill_both_tables_with_lockouts(&daemon);
    for rule in ["source_failures", "account_failures"] {
        let status = rule_status(&daemon, rule);
        assert_eq!(status["entries"], status["entries_max"], "{rule} is full: {status}");
        assert!(status["refused_full"].as_u64().unwrap() > 0, "{rule} overflowed: {status}");
    }
    let rt = runtime();
    let client = daemon.client();
    let victim = subject("198.51.100.200", "victim");
    let mut guesses = 0;
    for _ in 0..100 {
        let check = verdict(rt.block_on(client.check("login", &victim)));
        if !check.proceeds() {
            assert_eq!(check.rule, "source_failures", "{check:?}");
            continue;
        }
        guesses += 1;
        verdict(rt.block_on(client.report("login", &victim, Outcome::Failure)));
    }
    assert_eq!(guesses, 5, "the overflow counts the victim's key like the table would");

    let fresh = subject("203.0.113.77", "newcomer");
    let v = verdict(rt.block_on(client.check("login", &fresh)));
    assert_eq!(v.decision, Decision::Allow, "a fresh user from a fresh address is let in: {v:?}");
    let v = verdict(rt.block_on(client.report("login", &fresh, Outcome::Success)));
    assert_eq!(v.decision, Decision::Allow);

    let metrics = String::from_utf8(daemon.cli(&["metrics"]).stdout).unwrap();
    let overflowed = metrics
        .lines()
        .filter(|l| l.starts_with("tollgate_rule_refused_full_total{") && l.contains("failures"))
        .filter(|l| l.rsplit(' ').next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) > 0)
        .count();
    assert!(overflowed >= 2, "both tables' overflow in metrics:\n{metrics}");
}

#[test]
fn parallel_guesses_on_a_fresh_key_in_a_full_table_are_held_to_five() {
    let daemon = TestDaemon::start_with(Some(CONFIG), true);
    fill_both_tables_with_lockouts(&daemon);
    let rt = runtime();
    let mut tried = 0;
    // Two waves: the second finds the first wave's failures counted in the
    // overflow sketch, not merely its places held.
    for _ in 0..2 {
        let wave = rt.block_on(race(&daemon, 100, |client| async move {
            let s = subject("198.51.100.201", "second-victim");
            if !client.check("login", &s).await.proceeds() {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            verdict(client.report("login", &s, Outcome::Failure).await);
            true
        }));
        tried += wave.iter().filter(|t| **t).count();
    }
    assert_eq!(tried, 5);
}

#[test]
fn a_spilled_lockout_shows_in_report_verdicts_and_survives_a_reload_to_another_window() {
    // Found by review: a report's verdict read the table alone, and a
    // reload that changed the window dropped the overflow sketch.
    let daemon = TestDaemon::start_with(Some(CONFIG), true);
    fill_both_tables_with_lockouts(&daemon);
    let rt = runtime();
    let client = daemon.client();
    let victim = subject("198.51.100.202", "third-victim");
    for _ in 0..5 {
        verdict(rt.block_on(client.report("login", &victim, Outcome::Failure)));
    }
    let v = verdict(rt.block_on(client.report("login", &victim, Outcome::Success)));
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"), "the report sees the sketch");
    let longer = CONFIG.replace(
        "[routes.login.rules.source_failures]\n",
        "[routes.login.rules.source_failures]\nwindow_secs = 1800\n",
    );
    daemon.reload_with(&longer);
    let v = verdict(rt.block_on(client.check("login", &victim)));
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"), "re-dated, not dropped: {v:?}");
}

/// Places at a scale model of the default caps: 16 keys a shard.
const SMALL_PLACES: &str = "\
[routes.login.rules.source_failures]
entries_max = 256
[routes.login.rules.account_failures]
entries_max = 256
";

/// `n` checks on distinct accounts, from 8 addresses, never reported (a
/// client that hangs up, or an attacker's): every shard's places fill.
fn hold_places(daemon: &TestDaemon, n: usize) {
    let accounts: Vec<String> = (0..n).map(|i| format!("held-{i}")).collect();
    let addresses: Vec<String> = (0..8).map(|i| format!("10.9.{i}.1")).collect();
    runtime().block_on(pipeline(&daemon.socket, n, 64, |i, out| {
        check_frame(i, "login", &subject(&addresses[i % 8], &accounts[i]), out);
    }));
}

#[test]
fn with_every_place_held_a_real_attempt_counts_once_and_an_abandon_counts_nothing() {
    let daemon = TestDaemon::start_with(Some(SMALL_PLACES), true);
    // 800 keys over 16 shards of 16 places each: every shard full (a shard
    // draws fewer than 16 of them with probability below 10^-8).
    hold_places(&daemon, 800);
    let rt = runtime();
    let client = daemon.client();
    // Three typos, then her password: each attempt counted once, so the
    // fourth check is admitted (3 of 5) and the success clears her.
    let alice = subject("198.51.100.7", "alice");
    for typo in 0..3 {
        let v = verdict(rt.block_on(client.check("login", &alice)));
        assert!(v.proceeds(), "typo {typo}: {v:?}");
        let after = verdict(rt.block_on(client.report("login", &alice, Outcome::Failure)));
        assert_eq!(after.remaining, 5 - (typo + 1), "typo {typo} counted once: {after:?}");
    }
    assert!(verdict(rt.block_on(client.check("login", &alice))).proceeds(), "her password");
    verdict(rt.block_on(client.report("login", &alice, Outcome::Success)));
    // Attempts with no room were counted at their checks: 4 of them.
    let presumed = rule_status(&daemon, "source_failures")["refused_full"].as_u64().unwrap();
    assert!(presumed >= 4, "{presumed}");

    // Abandoned attempts give back what was counted for them: ten, where
    // five would lock her if they stayed counted.
    let bob = subject("198.51.100.8", "bob");
    for n in 0..10 {
        assert!(verdict(rt.block_on(client.check("login", &bob))).proceeds(), "attempt {n}");
        verdict(rt.block_on(client.abandon("login", &bob)).answer);
    }
    let v = verdict(rt.block_on(client.check("login", &bob)));
    assert_eq!((v.decision, v.remaining), (Decision::Allow, 4), "{v:?}");
}

/// The scale model: each login failure table capped at 1,000.
const SCALE_MODEL: &str = "\
[routes.login.rules.source_failures]
entries_max = 1000
[routes.login.rules.account_failures]
entries_max = 1000
threshold = 5
";

/// Checks every (account, address) of `keys` at once; how many are refused.
fn refused_of(daemon: &TestDaemon, keys: &[(String, String)]) -> usize {
    let replies = runtime().block_on(pipeline(&daemon.socket, keys.len(), 64, |i, out| {
        check_frame(i, "login", &subject(&keys[i].1, &keys[i].0), out);
    }));
    replies
        .into_iter()
        .filter(|r| matches!(r, tollgate::protocol::Response::Verdict(v) if v.decision == Decision::Deny))
        .count()
}

#[test]
fn every_lockout_past_the_tables_caps_survives_a_restart_and_a_kill_9() {
    let mut daemon = TestDaemon::start_with(Some(SCALE_MODEL), true);
    let keys: Vec<(String, String)> = (0..3000)
        .map(|n| (format!("spilled-{n}"), format!("10.{}.{}.{}", 100 + n / 62_500, n / 250 % 250, n % 250 + 1)))
        .collect();
    let replies = runtime().block_on(pipeline(&daemon.socket, keys.len() * 5, 64, |i, out| {
        let (account, address) = &keys[i / 5];
        report_frame(i, "login", &subject(address, account), Outcome::Failure, out);
    }));
    let denied = replies
        .iter()
        .skip(4)
        .step_by(5)
        .filter(|r| matches!(r, tollgate::protocol::Response::Verdict(v) if v.decision == Decision::Deny))
        .count();
    assert_eq!(denied, 3000, "every fifth failure was answered deny");
    assert!(rule_status(&daemon, "source_failures")["refused_full"].as_u64().unwrap() > 1000, "past the cap");
    assert_eq!(refused_of(&daemon, &keys), 3000);

    assert_eq!(daemon.terminate().code(), Some(0), "{}", daemon.log());
    daemon.spawn();
    assert_eq!(refused_of(&daemon, &keys), 3000, "after a clean restart");

    daemon.kill9();
    daemon.spawn();
    assert_eq!(refused_of(&daemon, &keys), 3000, "after kill -9");
    // A stranger is still let in: the sketch's rows over-count only where
    // lockouts are.
    let v = verdict(runtime().block_on(daemon.client().check("login", &subject("203.0.113.9", "stranger"))));
    assert_eq!(v.decision, Decision::Allow, "{v:?}");
}

/// One entry a shard, and no snapshot during the test (the interval is
/// real time; the manual clock moves only when told).
const ONE_A_SHARD_NO_SNAPSHOT: &str = "\
snapshot_interval_ms = 60000
[routes.login.rules.source_failures]
entries_max = 16
[routes.login.rules.account_failures]
entries_max = 16
threshold = 5
";

#[test]
fn a_spilled_key_locked_again_just_after_the_window_turns_stays_refused_after_a_restart() {
    let mut daemon = TestDaemon::start_with(Some(ONE_A_SHARD_NO_SNAPSHOT), true);
    // Six failures each (reports need no check): the tables' lockouts then
    // outlast the window's turn by 150 s, so the tables stay full.
    let accounts: Vec<String> = (0..FILLERS).map(|n| format!("filler-{n}")).collect();
    let addresses: Vec<String> = (0..FILLERS).map(|n| format!("10.{}.{}.1", n / 250, n % 250)).collect();
    runtime().block_on(pipeline(&daemon.socket, FILLERS * 6, 64, |i, out| {
        let n = i / 6;
        report_frame(i, "login", &subject(&addresses[n], &accounts[n]), Outcome::Failure, out);
    }));
    let rt = runtime();
    let victim = subject("198.51.100.203", "fourth-victim");
    let replies: Vec<Decision> = (0..5)
        .map(|_| verdict(rt.block_on(daemon.client().report("login", &victim, Outcome::Failure))).decision)
        .collect();
    assert_eq!(replies[4], Decision::Deny, "locked in the sketch: {replies:?}");
    // The window turns (the manual clock starts on a 15-minute boundary):
    // a 5-of-5 lockout lifts a millisecond later, and the attacker guesses.
    daemon.advance("900001ms");
    let v = verdict(rt.block_on(daemon.client().check("login", &victim)));
    assert!(v.proceeds(), "lifted with the window: {v:?}");
    let v = verdict(rt.block_on(daemon.client().report("login", &victim, Outcome::Failure)));
    assert_eq!(v.decision, Decision::Deny, "locked again: {v:?}");
    // Without a restart it stays refused until 20% into the window.
    daemon.advance("89999ms");
    let v = verdict(rt.block_on(daemon.client().check("login", &victim)));
    assert_eq!(v.decision, Decision::Deny, "refused 90 s into the window: {v:?}");

    assert_eq!(daemon.terminate().code(), Some(0), "{}", daemon.log());
    daemon.spawn();
    daemon.advance("990000ms"); // the same instant on the restarted manual clock
    let v = verdict(rt.block_on(daemon.client().check("login", &victim)));
    assert_eq!(v.decision, Decision::Deny, "after a clean restart the acknowledged lockout is gone: {v:?}");
}
