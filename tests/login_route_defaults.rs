//! The built-in login route's defaults in the scenarios they exist for
//! (offices behind a few addresses, a stranger failing as alice, distributed
//! guessing, IPv6 rotation, bursts across a window boundary, crashes,
//! parallel attempts, unknown accounts, a million claimed accounts), each
//! against a real daemon on the manual clock, asserting exact verdicts.

mod common;

use common::*;
use tollgate::protocol::{Decision, Outcome, Reason, Request, Response, Subject};

const LOGIN: &str = "login";

/// One login attempt as an auth server makes it: check; if allowed, verify
/// (here: decided by `password_ok`) and report. Returns the check's verdict.
async fn attempt(
    client: &tollgate::client::Client,
    subject: &Subject<'_>,
    password_ok: bool,
) -> tollgate::protocol::Verdict<'static> {
    let check = verdict(client.check(LOGIN, subject).await);
    if check.decision == Decision::Allow {
        let outcome = if password_ok { Outcome::Success } else { Outcome::Failure };
        verdict(client.report(LOGIN, subject, outcome).await);
    }
    check
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manila_office_behind_four_addresses_is_never_refused() {
    let daemon = TestDaemon::start();
    let client = daemon.client();
    let offices = ["203.0.113.10", "203.0.113.11", "203.0.113.12", "203.0.113.13"];
    let mut refusals = 0;
    // 2,200 accounts in 120 simulated seconds: 100 every ~5.45 s.
    for i in 0..2200 {
        if i % 100 == 99 {
            daemon.advance("5450ms");
        }
        let account = format!("employee{i}@manila.example");
        let s = subject(offices[i % 4], &account);
        if i % 10 == 0 {
            // one mistyped attempt first
            if !attempt(&client, &s, false).await.proceeds() {
                refusals += 1;
            }
        }
        if !attempt(&client, &s, true).await.proceeds() {
            refusals += 1;
        }
    }
    assert_eq!(refusals, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_cannot_lock_alice_out_from_elsewhere_or_of_reauth() {
    let daemon = TestDaemon::start();
    let client = daemon.client();
    let attacker = subject("198.51.100.7", "alice");
    let reauth = Subject { device: Some("alice-laptop"), ..subject("203.0.113.9", "alice") };
    let mut allowed = 0;
    for n in 0..200 {
        if attempt(&client, &attacker, false).await.proceeds() {
            allowed += 1;
        }
        if n % 20 == 0 {
            let v = verdict(client.check("reauth", &reauth).await);
            assert_eq!(v.decision, Decision::Allow, "re-auth refused after {n} attacks");
            verdict(client.report("reauth", &reauth, Outcome::Success).await);
        }
    }
    assert_eq!(allowed, 5, "the attacker's source is refused after 5 failures");
    let refused = verdict(client.check(LOGIN, &attacker).await);
    assert_eq!((refused.decision, refused.reason), (Decision::Deny, Reason::TooManyFailures));
    assert_eq!(refused.rule, "source_failures");

    let alice = subject("203.0.113.9", "alice");
    let check = attempt(&client, &alice, true).await;
    assert_eq!(check.decision, Decision::Allow);
    assert_eq!(verdict(client.check("reauth", &reauth).await).decision, Decision::Allow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_guessing_hits_the_ceiling_which_only_time_lifts() {
    let daemon = TestDaemon::start_with(Some(COUNTING_RULES_ONLY), true);
    let client = daemon.client();
    let mut first_refused = None;
    for n in 1..=60u32 {
        let source = format!("192.0.2.{n}");
        let check = attempt(&client, &subject(&source, "alice"), false).await;
        if check.decision != Decision::Allow && first_refused.is_none() {
            first_refused = Some(n);
            assert_eq!(check.rule, "account_failures");
        }
        daemon.advance("1s");
    }
    assert_eq!(first_refused, Some(51));
    // refused from every source, including a new one
    let fresh = verdict(client.check(LOGIN, &subject("100.64.0.1", "alice")).await);
    assert_eq!(fresh.decision, Decision::Deny);
    // her own success does not lift the ceiling
    let own = subject("203.0.113.9", "alice");
    verdict(client.report(LOGIN, &own, Outcome::Success).await);
    let still = verdict(client.check(LOGIN, &own).await);
    assert_eq!((still.decision, still.rule.as_ref()), (Decision::Deny, "account_failures"));
    // The 50 failures all fell in the first window (the manual clock starts
    // at a window boundary): the lockout lifts just after the next boundary,
    // 900 s after the start. 60 s have passed.
    assert_eq!(still.retry_after_ms, 840_001);
    daemon.advance("839999ms");
    assert_eq!(verdict(client.check(LOGIN, &own).await).decision, Decision::Deny);
    daemon.advance("2ms");
    assert_eq!(verdict(client.check(LOGIN, &own).await).decision, Decision::Allow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_rotation_inside_one_64_counts_as_one_source() {
    let daemon = TestDaemon::start();
    let client = daemon.client();
    let mut allowed = 0;
    for n in 0..1000u32 {
        let address = format!("2001:db8:aa:bb:{:x}:{:x}::1", n >> 8, n & 0xff);
        if attempt(&client, &subject(&address, "alice"), false).await.proceeds() {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 5);
    // another /64 is another source
    let other = verdict(client.check(LOGIN, &subject("2001:db8:aa:cc::1", "alice")).await);
    assert_eq!(other.decision, Decision::Allow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_across_a_window_boundary_gets_at_most_one_more_in_three_minutes() {
    let daemon = TestDaemon::start();
    let client = daemon.client();
    let s = subject("198.51.100.20", "bob");
    daemon.advance("899s"); // one second before the first boundary
    for _ in 0..5 {
        assert!(attempt(&client, &s, false).await.proceeds());
    }
    daemon.advance("1s"); // the boundary
    let mut admitted_at = Vec::new();
    for step in 0..=18 {
        if attempt(&client, &s, false).await.proceeds() {
            admitted_at.push(step * 10);
        }
        daemon.advance("10s");
    }
    // The bound: after the boundary, failures are admitted only as the
    // previous window's weight drains, T·d/W of them in the first d seconds
    // (5 × 180 / 900 = 1), where a fixed window would admit 5 at once.
    assert_eq!(admitted_at, vec![10]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockouts_survive_kill_9_and_counters_survive_sigterm() {
    let mut daemon = TestDaemon::start();
    let client = daemon.client();
    let mallory = subject("198.51.100.66", "carol");
    for n in 1..=5 {
        let v = verdict(client.report(LOGIN, &mallory, Outcome::Failure).await);
        assert_eq!(v.decision == Decision::Deny, n == 5);
    }
    // The report that tripped the lockout was answered: it must be on disk.
    daemon.kill9();
    daemon.spawn();
    let client = daemon.client();
    let v = verdict(client.check(LOGIN, &mallory).await);
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"));

    let dave = subject("198.51.100.67", "dave");
    for _ in 0..4 {
        assert_eq!(verdict(client.report(LOGIN, &dave, Outcome::Failure).await).decision, Decision::Allow);
    }
    let status = daemon.terminate();
    assert!(status.success(), "SIGTERM exit: {status}\n{}", daemon.log());
    daemon.spawn();
    let client = daemon.client();
    let v = verdict(client.check(LOGIN, &dave).await);
    assert_eq!((v.decision, v.remaining), (Decision::Allow, 0), "4 restored failures and this attempt");
    let v = verdict(client.report(LOGIN, &dave, Outcome::Failure).await);
    assert_eq!(v.decision, Decision::Deny, "the fifth failure trips the restored counter");
    // and the kill -9'd lockout is still there after a graceful restart too
    assert_eq!(verdict(client.check(LOGIN, &mallory).await).decision, Decision::Deny);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_parallel_reports_count_exactly_and_refuse_at_the_threshold() {
    let daemon = TestDaemon::start();
    let verdicts = race(&daemon, 50, |client| async move {
        verdict(client.report(LOGIN, &subject("198.51.100.7", "erin"), Outcome::Failure).await)
    })
    .await;
    let mut remaining: Vec<u32> = verdicts.iter().map(|v| v.remaining).collect();
    remaining.sort();
    let mut expected = vec![0; 46];
    expected.extend([1, 2, 3, 4]);
    assert_eq!(remaining, expected);
    let allowed = verdicts.iter().filter(|v| v.decision == Decision::Allow).count();
    assert_eq!(allowed, 4, "reports 1-4 leave room; the 5th and later are refusals");

    let lockouts = daemon.cli_json(&["lockouts"]);
    let counts: Vec<(String, u64)> = lockouts["lockouts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["rule"].as_str().unwrap().to_string(), l["count"].as_u64().unwrap()))
        .collect();
    assert!(counts.contains(&("source_failures".into(), 50)), "{counts:?}");
    assert!(counts.contains(&("account_failures".into(), 50)), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_parallel_checks_against_a_burst_of_ten_allow_exactly_ten() {
    let daemon = TestDaemon::start_with(
        Some("[routes.burst10.rules.source_rate]\nkind = \"rate\"\nkey = [\"prefix\"]\nlimit = 1\nperiod_secs = 3600\nburst = 10\n"),
        true,
    );
    let decisions = race(&daemon, 50, |client| async move {
        let s = Subject { peer: Some(ip("198.51.100.8")), ..Subject::default() };
        verdict(client.check("burst10", &s).await).decision
    })
    .await;
    let allowed = decisions.iter().filter(|d| **d == Decision::Allow).count();
    assert_eq!(allowed, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_account_behaves_exactly_like_an_existing_one() {
    // The same random sequence of attempts for an account the auth server
    // has and one it has not: the daemon cannot tell them apart.
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let steps: Vec<(u64, u64, u64)> = (0..400).map(|_| (next() % 4, next() % 3, next() % 5)).collect();
    let mut runs = Vec::new();
    for account in ["alice@example.com", "no-such-user-7f3a@example.com"] {
        let daemon = TestDaemon::start();
        let client = daemon.client();
        let mut verdicts = Vec::new();
        for &(source, action, wait) in &steps {
            let s = subject(["198.51.100.1", "198.51.100.2", "2001:db8::5", "203.0.113.4"][source as usize], account);
            let v = match action {
                0 => client.check(LOGIN, &s).await,
                1 => client.report(LOGIN, &s, Outcome::Failure).await,
                _ => client.report(LOGIN, &s, Outcome::Success).await,
            };
            verdicts.push(verdict(v));
            if wait == 0 {
                daemon.advance("97s");
            }
        }
        runs.push(verdicts);
    }
    assert!(runs[0].iter().any(|v| v.decision == Decision::Deny), "the sequence reaches refusals");
    assert_eq!(runs[0], runs[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_claimed_accounts_stay_within_the_caps_and_keep_earlier_lockouts() {
    let daemon = TestDaemon::start_with(Some(COUNTING_RULES_ONLY), true);
    let client = daemon.client();
    let victim = subject("198.51.100.99", "frank");
    for _ in 0..5 {
        verdict(client.report(LOGIN, &victim, Outcome::Failure).await);
    }
    assert_eq!(verdict(client.check(LOGIN, &victim).await).decision, Decision::Deny);
    let before_kib = daemon.rss_kib();

    let flood = 1_000_000;
    let names: Vec<String> = (0..1000).map(|n| format!("10.9.{}.{}", n / 250, n % 250 + 1)).collect();
    let replies = pipeline(&daemon.socket, flood, 512, |i, out| {
        let account = format!("claimed-{i}");
        let s = subject(&names[i % names.len()], &account);
        report_frame(i, LOGIN, &s, Outcome::Failure, out);
    })
    .await;
    assert!(replies.iter().all(|r| matches!(r, Response::Verdict(_))));
    let after_kib = daemon.rss_kib();
    let growth_mib = after_kib.saturating_sub(before_kib) as f64 / 1024.0;
    let status = daemon.cli_json(&["status"]);
    let state_bytes = std::fs::metadata(&daemon.state).unwrap().len();
    eprintln!(
        "flood of {flood} accounts: rss {} KiB -> {} KiB (+{growth_mib:.1} MiB), state file {} KiB",
        before_kib,
        after_kib,
        state_bytes / 1024
    );
    for route in status["routes"].as_array().unwrap() {
        for rule in route["rules"].as_array().unwrap() {
            assert!(rule["entries"].as_u64() <= rule["entries_max"].as_u64(), "{rule}");
        }
    }
    // Two failure tables of 100,000 entries at ~50 bytes each, plus buffers:
    // far below this bound, which a table growing with the flood (1,000,000
    // entries per table) would break.
    assert!(growth_mib < 64.0, "memory grew by {growth_mib:.1} MiB");
    assert_eq!(verdict(client.check(LOGIN, &victim).await).decision, Decision::Deny);
    let raw = Request::Lockouts { limit: 10 };
    assert!(matches!(client.call(&raw).await.unwrap(), Response::Lockouts { total: 1, .. }));
}
