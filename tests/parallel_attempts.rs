//! An attempt counts from its check: many real connections race check →
//! password hash (a sleep) → report on one key, and the daemon admits
//! exactly the threshold, on every failure rule. Real daemons on the manual
//! clock, so no window rolls while the sleeps run.

mod common;

use std::time::Duration;

use common::*;
use tollgate::client::Client;
use tollgate::protocol::{Decision, Outcome, Subject};

/// What argon2 costs a real auth server between its check and its report.
const PASSWORD_HASH: Duration = Duration::from_millis(100);
const ATTEMPTS: usize = 200;

/// One attempt as an auth server makes it, from its own connection: check;
/// if it may proceed, hash the password (sleep), then report `outcome`.
/// True if the password was tried.
async fn guess(client: Client, route: &'static str, subject: Subject<'static>, outcome: Outcome) -> bool {
    let check = client.check(route, &subject).await;
    if !check.proceeds() {
        return false;
    }
    tokio::time::sleep(PASSWORD_HASH).await;
    verdict(client.report(route, &subject, outcome).await);
    true
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Races `ATTEMPTS` wrong-password attempts, the n-th with `subject(n)`,
/// and returns how many passwords were tried.
fn race_guesses(
    daemon: &TestDaemon,
    route: &'static str,
    subject: impl Fn(usize) -> Subject<'static> + Send + Sync + 'static,
) -> usize {
    let rt = runtime();
    let subject = std::sync::Arc::new(subject);
    let n = std::sync::atomic::AtomicUsize::new(0);
    let tried = rt.block_on(race(daemon, ATTEMPTS, |client| {
        let s = subject(n.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        guess(client, route, s, Outcome::Failure)
    }));
    tried.into_iter().filter(|t| *t).count()
}

#[test]
fn two_hundred_parallel_guesses_from_one_address_try_five_passwords() {
    let daemon = TestDaemon::start();
    let tried = race_guesses(&daemon, "login", |_| subject("198.51.100.7", "alice"));
    assert_eq!(tried, 5, "source_failures admits 5 attempts at once, not 5 per read");
    let rt = runtime();
    let v = verdict(rt.block_on(daemon.client().check("login", &subject("198.51.100.7", "alice"))));
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"), "the 5 failures lock it");
    let v = verdict(rt.block_on(daemon.client().check("login", &subject("203.0.113.9", "alice"))));
    assert_eq!(v.decision, Decision::Allow, "alice from her own address is not locked");
}

#[test]
fn two_hundred_parallel_guesses_from_two_hundred_addresses_try_fifty_passwords() {
    let daemon = TestDaemon::start();
    let tried =
        race_guesses(&daemon, "login", |n| subject(leak(format!("198.51.{}.{}", 100 + n / 250, 1 + n % 250)), "bob"));
    assert_eq!(tried, 50, "the account ceiling admits 50 attempts at once");
    let v = verdict(runtime().block_on(daemon.client().check("login", &subject("203.0.113.9", "bob"))));
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "account_failures"));
}

#[test]
fn every_failure_rule_admits_exactly_its_threshold_in_parallel() {
    let daemon = TestDaemon::start();
    let reauth = |_| Subject { device: Some("carol-laptop"), ..subject("203.0.113.9", "carol") };
    assert_eq!(race_guesses(&daemon, "reauth", reauth), 5, "reauth device_failures");
    assert_eq!(race_guesses(&daemon, "mfa_verify", |_| subject("203.0.113.9", "carol")), 5, "mfa_verify");
    let token = |_| Subject { peer: Some(ip("192.0.2.44")), client_id: Some("app-7"), ..Subject::default() };
    assert_eq!(race_guesses(&daemon, "token", token), 10, "token client_failures");
}

#[test]
fn an_attempt_holds_its_place_until_its_report_or_the_attempt_timeout() {
    let daemon = TestDaemon::start_with(Some("attempt_timeout_ms = 3000\n"), true);
    let rt = runtime();
    let client = daemon.client();
    let dave = subject("198.51.100.8", "dave");
    for n in 0..5 {
        let v = verdict(rt.block_on(client.check("login", &dave)));
        assert_eq!((v.decision, v.remaining), (Decision::Allow, 4 - n), "check {n}: a place taken, none reported");
    }
    let v = verdict(rt.block_on(client.check("login", &dave)));
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"), "five in flight");
    assert!(v.retry_after_ms >= 1000, "at least the ladder's first step: {v:?}");

    // A success settles its place (and clears the key): room for one more.
    verdict(rt.block_on(client.report("login", &dave, Outcome::Success)));
    let v = verdict(rt.block_on(client.check("login", &dave)));
    assert_eq!(v.decision, Decision::Allow, "the success released a place");
    let v = verdict(rt.block_on(client.check("login", &dave)));
    assert_eq!(v.decision, Decision::Deny, "five in flight again");

    // A failure settles its place into a failure: still five held.
    verdict(rt.block_on(client.report("login", &dave, Outcome::Failure)));
    let v = verdict(rt.block_on(client.check("login", &dave)));
    assert_eq!(v.decision, Decision::Deny, "4 in flight + 1 failure");

    // No more reports: the places lapse after attempt_timeout_ms.
    daemon.advance("2999ms");
    assert_eq!(verdict(rt.block_on(client.check("login", &dave))).decision, Decision::Deny, "not yet");
    daemon.advance("2ms");
    let v = verdict(rt.block_on(client.check("login", &dave)));
    assert_eq!((v.decision, v.remaining), (Decision::Allow, 3), "the 1 failure counted, the lapsed places free");
    let status = daemon.cli_json(&["status"]);
    let limit = status["limits"].as_array().unwrap().iter().find(|l| l["name"] == "attempt_timeout_ms").cloned();
    assert_eq!(limit.map(|l| l["value"].clone()), Some(3000.into()), "a named limit in status");
}

#[test]
fn a_check_refused_by_one_rule_holds_no_place_on_another() {
    // The per-source rate (burst 3 here) refuses erin's 4th check onwards.
    // Refused checks must give back the places they took on the failure
    // rules, or the 4th and 5th would fill source_failures and the 6th on
    // would be refused by it.
    let config = "attempt_timeout_ms = 60000
[routes.login.rules.source_rate]
limit = 3
burst = 3
";
    let daemon = TestDaemon::start_with(Some(config), true);
    let rt = runtime();
    let client = daemon.client();
    let erin = subject("198.51.100.9", "erin");
    for n in 0..20 {
        let v = verdict(rt.block_on(client.check("login", &erin)));
        if n < 3 {
            assert_eq!(v.decision, Decision::Allow, "check {n}");
        } else {
            assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_rate"), "check {n}");
        }
    }
    for _ in 0..3 {
        verdict(rt.block_on(client.report("login", &erin, Outcome::Failure)));
    }
    daemon.advance("20s");
    let v = verdict(rt.block_on(client.check("login", &erin)));
    assert_eq!(v.decision, Decision::Allow, "3 failures and this attempt: {v:?}");
    daemon.advance("20s");
    let v = verdict(rt.block_on(client.check("login", &erin)));
    assert_eq!(v.decision, Decision::Allow, "3 failures, 1 in flight and this attempt: {v:?}");
    daemon.advance("20s");
    let v = verdict(rt.block_on(client.check("login", &erin)));
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"), "3 failures, 2 in flight");
}

#[test]
fn an_office_of_a_thousand_behind_four_addresses_logging_in_at_once_is_never_refused() {
    // 1,000 accounts, a tenth mistyping once, through 4 addresses (275
    // checks each, inside the per-source burst), 50 connections at once.
    // The counting rules alone: this burst puts every typo before any
    // success (each worker's first account mistypes), which spray
    // detection's failure-share gate reads as a spray at the first instant;
    // `tests/spray_detection.rs` holds the office's precision on a real
    // day's shape (zero people bothered).
    let daemon = TestDaemon::start_with(Some(COUNTING_RULES_ONLY), true);
    let rt = runtime();
    const WORKERS: usize = 50;
    const ACCOUNTS_PER_WORKER: usize = 20;
    let worker = std::sync::atomic::AtomicUsize::new(0);
    let refusals = rt.block_on(race(&daemon, WORKERS, |client| {
        let me = worker.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        async move {
            let offices = ["203.0.113.10", "203.0.113.11", "203.0.113.12", "203.0.113.13"];
            let mut refused = 0;
            for a in 0..ACCOUNTS_PER_WORKER {
                let account = format!("employee{me}-{a}@office.example");
                let s = subject(offices[(me + a) % 4], &account);
                let attempts: &[bool] = if a % 10 == 0 { &[false, true] } else { &[true] };
                for &password_ok in attempts {
                    let check = verdict(client.check("login", &s).await);
                    if !check.proceeds() {
                        refused += 1;
                        continue;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let outcome = if password_ok { Outcome::Success } else { Outcome::Failure };
                    verdict(client.report("login", &s, outcome).await);
                }
            }
            refused
        }
    }));
    assert_eq!(refusals.iter().sum::<usize>(), 0);
}

#[test]
fn a_flood_of_checks_on_other_keys_never_frees_a_victims_places() {
    // Found by review: places lived in a map that evicted live entries, so
    // a flood of distinct keys freed a victim's places and its attempts got
    // past the threshold. 64 keys of places per rule (4 per shard), then
    // 4,000 admitted checks on other keys, none reported.
    let config = "[routes.login.rules.source_failures]\nentries_max = 64\n\
                  [routes.login.rules.account_failures]\nentries_max = 64\n";
    let daemon = TestDaemon::start_with(Some(config), true);
    let rt = runtime();
    let client = daemon.client();
    let victims: Vec<String> = (0..8).map(|n| format!("victim-{n}")).collect();
    let mut admitted = 0;
    for v in &victims {
        for _ in 0..10 {
            admitted += verdict(rt.block_on(client.check("login", &subject("198.51.100.7", v)))).proceeds() as u32;
        }
    }
    assert_eq!(admitted, 40, "5 places each");
    let flood: Vec<(String, String)> =
        (0..4000).map(|n| (format!("flood-{n}"), format!("2001:db8:{:x}:{:x}::1", n / 1000, n % 1000))).collect();
    rt.block_on(pipeline(&daemon.socket, flood.len(), 64, |i, out| {
        let request = tollgate::protocol::Request::Check { route: "login", subject: subject(&flood[i].1, &flood[i].0) };
        tollgate::codec::encode_request(i as u64, &request, out);
    }));
    for v in &victims {
        for _ in 0..10 {
            admitted += verdict(rt.block_on(client.check("login", &subject("198.51.100.7", v)))).proceeds() as u32;
        }
    }
    assert_eq!(admitted, 40, "the flood freed none of the victims' places");
}

#[test]
fn a_place_whose_report_never_comes_lapses_however_busy_its_key() {
    // Found by review: a key's places lapsed together after its latest
    // check, so steady traffic kept places whose reports were lost alive
    // for good. 4 lost reports, then a check and its report every second.
    let daemon = TestDaemon::start_with(Some("attempt_timeout_ms = 5000\n"), true);
    let rt = runtime();
    let client = daemon.client();
    let gina = subject("198.51.100.10", "gina");
    for _ in 0..4 {
        assert_eq!(verdict(rt.block_on(client.check("login", &gina))).decision, Decision::Allow);
    }
    for second in 0..30 {
        daemon.advance("1s");
        let v = verdict(rt.block_on(client.check("login", &gina)));
        assert_eq!(v.decision, Decision::Allow, "second {second}");
        verdict(rt.block_on(client.report("login", &gina, Outcome::Success)));
    }
    let admitted: u32 = (0..5).map(|_| verdict(rt.block_on(client.check("login", &gina))).proceeds() as u32).sum();
    assert_eq!(admitted, 5, "the 4 lost places lapsed 5 s after their own checks");
}

#[test]
fn monitor_mode_holds_no_place_it_would_have_refused() {
    // Found by review: monitored rules took a place even when they would
    // refuse, so switching to enforcing refused a key with no failure.
    let monitor = "[routes.login.rules.source_failures]\nmonitor = true\n";
    let daemon = TestDaemon::start_with(Some(monitor), true);
    let rt = runtime();
    let client = daemon.client();
    let hana = subject("198.51.100.11", "hana");
    for _ in 0..45 {
        assert_eq!(verdict(rt.block_on(client.check("login", &hana))).decision, Decision::Allow);
    }
    daemon.reload_with("[routes.login.rules.source_failures]\nmonitor = false\n");
    let v = verdict(rt.block_on(client.check("login", &hana)));
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"), "the 5 places enforcing takes");
    let status = daemon.cli_json(&["status"]);
    let login = status["routes"].as_array().unwrap().iter().find(|r| r["name"] == "login").unwrap().clone();
    let rule = login["rules"].as_array().unwrap().iter().find(|r| r["name"] == "source_failures").unwrap().clone();
    assert_eq!(rule["would_refuse"], 40, "45 checks, 5 places: 40 would-be refusals");
    // The 5 admitted attempts report; nothing else holds a place.
    for _ in 0..5 {
        verdict(rt.block_on(client.report("login", &hana, Outcome::Success)));
    }
    assert_eq!(verdict(rt.block_on(client.check("login", &hana))).decision, Decision::Allow);
}

#[test]
fn keys_refused_by_attempts_in_flight_are_listed_and_unlock_clears_them() {
    let daemon = TestDaemon::start();
    let rt = runtime();
    let client = daemon.client();
    fail_five_times(&daemon, &subject("198.51.100.9", "bob"));
    // Five checks never reported hold her five places from this address.
    let alice = subject("198.51.100.7", "alice");
    for n in 0..5 {
        assert!(verdict(rt.block_on(client.check("login", &alice))).proceeds(), "check {n}");
    }
    let held = verdict(rt.block_on(client.check("login", &alice)));
    assert_eq!(held.reason, tollgate::protocol::Reason::AttemptsInFlight, "{held:?}");
    // Bob's lockout first and alone in the total; then her key.
    let lockouts = daemon.cli_json(&["lockouts"]);
    assert_eq!(lockouts["total"], 1, "{lockouts}");
    assert_eq!(lockouts["lockouts"][0]["count"], 5, "{lockouts}");
    let listed = &lockouts["lockouts"][1];
    assert_eq!((listed["rule"].as_str(), listed["count"].as_u64()), (Some("source_failures"), Some(0)), "{listed}");
    assert!(listed["retry_after_ms"].as_u64().unwrap() <= 30_000, "{listed}");
    let human = String::from_utf8(daemon.cli(&["lockouts"]).stdout).unwrap();
    assert!(human.contains("count 5  until") && human.contains("count 0 + attempts in flight"), "{human}");
    // With room for one, the lockout.
    assert_eq!(daemon.cli_json(&["lockouts", "--limit", "1"])["lockouts"][0]["count"], 5);
    // The operator's unlock frees them.
    let unlocked = daemon.cli_json(&["unlock", "--route", "login", "--account", "alice"]);
    assert_eq!(unlocked["cleared"], 2, "her key and her account's: {unlocked}");
    assert!(verdict(rt.block_on(client.check("login", &alice))).proceeds());
    assert_eq!(daemon.cli_json(&["lockouts"])["lockouts"].as_array().unwrap().len(), 1, "bob's");
}
