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
