//! What rules and routes offer beyond counting, against real daemons on the
//! manual clock: keys an attacker cannot steer, the login-adjacent routes,
//! the response ladder, monitor mode, known devices, stale passwords and
//! reload.

mod common;

use common::*;
use tollgate::client::{password_digest, Client};
use tollgate::protocol::{Decision, Outcome, Reason, Subject};

const LOGIN: &str = "login";

async fn attempt(
    client: &Client,
    route: &str,
    subject: &Subject<'_>,
    ok: bool,
) -> tollgate::protocol::Verdict<'static> {
    let check = verdict(client.check(route, subject).await);
    if check.proceeds() {
        verdict(client.report(route, subject, if ok { Outcome::Success } else { Outcome::Failure }).await);
    }
    check
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoofed_forwarded_for_fills_only_the_spoofers_bucket() {
    let daemon = TestDaemon::start_with(Some("[source]\ntrusted_proxies = [\"10.0.0.0/8\"]\n"), true);
    let client = daemon.client();
    let proxy = "10.1.1.1";
    // The attacker at 198.51.100.66 claims to be the victim at 203.0.113.9;
    // our proxy appends the address it really saw.
    let spoofed = Subject {
        peer: Some(ip(proxy)),
        forwarded_for: Some("203.0.113.9, 198.51.100.66"),
        account: Some("victim"),
        ..Subject::default()
    };
    let mut allowed = 0;
    for _ in 0..20 {
        allowed += attempt(&client, LOGIN, &spoofed, false).await.proceeds() as u32;
    }
    assert_eq!(allowed, 5, "the attacker's own (account, prefix) bucket filled");
    let victim = Subject {
        peer: Some(ip(proxy)),
        forwarded_for: Some("203.0.113.9"),
        account: Some("victim"),
        ..Subject::default()
    };
    let v = verdict(client.check(LOGIN, &victim).await);
    // After a check, remaining counts the place this attempt now holds.
    assert_eq!((v.decision, v.remaining), (Decision::Allow, 4), "the victim's bucket is untouched");
    // A peer that is not our proxy cannot use the header at all.
    let direct = Subject { peer: Some(ip("198.51.100.66")), forwarded_for: Some("203.0.113.9"), ..victim.clone() };
    assert_eq!(verdict(client.check(LOGIN, &direct).await).decision, Decision::Deny);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_56_configured_all_64s_inside_count_as_one_source() {
    let daemon = TestDaemon::start_with(Some("[source]\nipv6_prefix_len = 56\n"), true);
    let client = daemon.client();
    let mut allowed = 0;
    for n in 0..256u32 {
        let address = format!("2001:db8:1:{:x}::7", 0x4500 + n); // 2001:db8:1:4500::/56 .. its 256 /64s
        allowed += attempt(&client, LOGIN, &subject(&address, "alice"), false).await.proceeds() as u32;
    }
    assert_eq!(allowed, 5);
    let next_56 = verdict(client.check(LOGIN, &subject("2001:db8:1:4600::7", "alice")).await);
    assert_eq!(next_56.decision, Decision::Allow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn business_gateways_log_everyone_in_while_hosting_at_the_same_rate_is_throttled() {
    let classes = "# Manila office egress\n203.0.113.10/31,business\n203.0.113.12/31,business\n192.0.2.0/24,hosting\n";
    let dir = tempfile::tempdir().unwrap();
    let class_file = dir.path().join("classes.csv");
    std::fs::write(&class_file, classes).unwrap();
    let config = format!("[source]\nclass_file = \"{}\"\n", class_file.display());
    let daemon = TestDaemon::start_with(Some(&config), true);
    assert_eq!(daemon.cli_json(&["status"])["class_prefixes"], 3);
    let client = daemon.client();
    let business = ["203.0.113.10", "203.0.113.11", "203.0.113.12", "203.0.113.13"];
    let hosting = ["192.0.2.10", "192.0.2.11", "192.0.2.12", "192.0.2.13"];
    let (mut business_refused, mut hosting_refused) = (0, 0);
    // 5,000 logins in 20 simulated minutes: 250 every minute, from each side.
    for i in 0..5000usize {
        if i % 250 == 249 {
            daemon.advance("60s");
        }
        let account = format!("user{i}");
        if !attempt(&client, LOGIN, &subject(business[i % 4], &account), true).await.proceeds() {
            business_refused += 1;
        }
        if !attempt(&client, LOGIN, &subject(hosting[i % 4], &account), true).await.proceeds() {
            hosting_refused += 1;
        }
    }
    assert_eq!(business_refused, 0);
    assert!(hosting_refused > 4000, "hosting refused only {hosting_refused}");
    // The four hosting addresses share one /24 and its budget of 30 a minute.
    let mut last = None;
    for n in 0..40 {
        let v = attempt(&client, LOGIN, &subject(hosting[n % 4], "someone"), true).await;
        if v.decision != Decision::Allow {
            last = Some(v);
            break;
        }
    }
    let v = last.expect("refused within 40 checks");
    assert_eq!((v.decision, v.reason, v.rule.as_ref()), (Decision::Deny, Reason::RateLimited, "source_rate"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mfa_resends_buy_no_fresh_verification_attempts() {
    let daemon = TestDaemon::start();
    let client = daemon.client();
    let s = subject("198.51.100.7", "alice");
    let mut verify_attempts = 0;
    for _ in 0..100 {
        // a resend (rate limited on its own), then a wrong code
        let _ = verdict(client.check("mfa_resend", &s).await);
        if attempt(&client, "mfa_verify", &s, false).await.proceeds() {
            verify_attempts += 1;
        }
    }
    assert_eq!(verify_attempts, 5, "the per-window verify attempts, however many codes were sent");
    // and from another address too: the count is per account
    assert_eq!(verdict(client.check("mfa_verify", &subject("203.0.113.5", "alice")).await).decision, Decision::Deny);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_naming_a_victim_client_id_does_not_touch_the_victim() {
    let daemon = TestDaemon::start();
    let client = daemon.client();
    let attacker = Subject { peer: Some(ip("198.51.100.66")), client_id: Some("victim-app"), ..Subject::default() };
    for _ in 0..1000 {
        let _ = attempt(&client, "token", &attacker, false).await;
    }
    assert_eq!(verdict(client.check("token", &attacker).await).decision, Decision::Deny);
    let victim = Subject { peer: Some(ip("203.0.113.20")), client_id: Some("victim-app"), ..Subject::default() };
    let v = verdict(client.check("token", &victim).await);
    assert_eq!(v.decision, Decision::Allow);
    assert_eq!(verdict(client.report("token", &victim, Outcome::Success).await).decision, Decision::Allow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_the_threshold_climbs_delay_challenge_deny_with_escalating_retry_after() {
    let config = "[routes.login.rules.source_failures]\nresponses = [\"delay\", \"challenge\", \"deny\"]\n";
    let daemon = TestDaemon::start_with(Some(config), true);
    let client = daemon.client();
    let s = subject("198.51.100.7", "alice");
    for _ in 0..5 {
        verdict(client.report(LOGIN, &s, Outcome::Failure).await);
    }
    let mut seen = Vec::new();
    for _ in 0..5 {
        let v = verdict(client.check(LOGIN, &s).await);
        seen.push((v.decision, v.retry_after_ms, v.delay_ms));
    }
    let decisions: Vec<Decision> = seen.iter().map(|s| s.0).collect();
    assert_eq!(decisions, [Decision::Delay, Decision::Challenge, Decision::Deny, Decision::Deny, Decision::Deny]);
    assert_eq!(seen[0].2, 1000, "the first delay is the base delay");
    // Retry-After never shorter than the lockout itself: the true wait
    // (until the next window boundary) exceeds every step here.
    for (_, retry_after_ms, _) in &seen {
        assert!(*retry_after_ms >= 900_000);
    }

    // With a true wait shorter than the steps, the steps show: a rate rule.
    let config =
        "[routes.burst1.rules.r]\nkind = \"rate\"\nkey = [\"prefix\"]\nlimit = 1\nperiod_secs = 1\nburst = 1\n";
    let daemon = TestDaemon::start_with(Some(config), true);
    let client = daemon.client();
    let s = Subject { peer: Some(ip("198.51.100.8")), ..Subject::default() };
    assert_eq!(verdict(client.check("burst1", &s).await).decision, Decision::Allow);
    let mut retry_after = Vec::new();
    for _ in 0..5 {
        let v = verdict(client.check("burst1", &s).await);
        assert_eq!(v.decision, Decision::Deny);
        retry_after.push(v.retry_after_ms);
    }
    for (got, step) in retry_after.iter().zip([1_000u64, 5_000, 30_000, 120_000, 120_000]) {
        assert!(*got >= step && *got <= step + step / 10, "retry_after {got} ms for step {step} ms: {retry_after:?}");
    }
    // Waiting out what it was told is always enough.
    daemon.advance(&format!("{}ms", retry_after[4]));
    assert_eq!(verdict(client.check("burst1", &s).await).decision, Decision::Allow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_mode_allows_what_enforcing_refuses_and_counts_it() {
    let traffic = |client: Client| async move {
        let s = subject("198.51.100.7", "alice");
        let mut refused = 0;
        let mut reasons = Vec::new();
        for _ in 0..20 {
            let v = attempt(&client, LOGIN, &s, false).await;
            refused += (!v.proceeds()) as u32;
            reasons.push(v.reason);
        }
        (refused, reasons)
    };
    let enforcing = TestDaemon::start();
    let (refused, _) = traffic(enforcing.client()).await;
    assert_eq!(refused, 15);

    let config =
        "[routes.login.rules.source_failures]\nmonitor = true\n[routes.login.rules.account_failures]\nmonitor = true\n";
    let monitoring = TestDaemon::start_with(Some(config), true);
    let (refused, reasons) = traffic(monitoring.client()).await;
    assert_eq!(refused, 0);
    assert_eq!(reasons.iter().filter(|r| **r == Reason::MonitorTooManyFailures).count(), 15);
    let status = monitoring.cli_json(&["status"]);
    let login = status["routes"].as_array().unwrap().iter().find(|r| r["name"] == "login").unwrap();
    let rule = login["rules"].as_array().unwrap().iter().find(|r| r["name"] == "source_failures").unwrap();
    assert_eq!(rule["monitor"], true);
    assert_eq!(rule["would_refuse"], 15);
    assert_eq!(rule["refused"], 0);
    // Monitor mode logs what it would have refused (the log cap allows 100
    // lines a second; the 15 would-be refusals fit).
    let log = monitoring.log();
    let logged = log.lines().filter(|l| l.contains("MonitorTooManyFailures") && l.contains("monitor=true")).count();
    assert_eq!(logged, 15, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alice_on_her_known_device_logs_in_while_a_spray_holds_her_ceiling() {
    let daemon = TestDaemon::start_with(Some(COUNTING_RULES_ONLY), true);
    let client = daemon.client();
    let home = Subject { device: Some("cookie-7f1c2a"), ..subject("203.0.113.9", "alice") };
    assert!(attempt(&client, LOGIN, &home, true).await.proceeds(), "first login makes the device known");
    // the spray: one guess per address from 60 addresses
    for n in 1..=60 {
        let _ = attempt(&client, LOGIN, &subject(&format!("192.0.2.{n}"), "alice"), false).await;
    }
    let unknown = Subject { device: Some("attacker-device"), ..subject("203.0.113.9", "alice") };
    let v = verdict(client.check(LOGIN, &unknown).await);
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "account_failures"));
    let no_device = verdict(client.check(LOGIN, &subject("203.0.113.9", "alice")).await);
    assert_eq!(no_device.decision, Decision::Deny);
    let v = attempt(&client, LOGIN, &home, true).await;
    assert_eq!(v.decision, Decision::Allow, "her known device is counted on its own counter");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_account_cannot_flush_the_known_devices_and_expose_alices_device_to_the_ceiling() {
    // A small table: 64 known devices in all, 4 new ones per account per TTL.
    let config =
        format!("[routes.login]\nknown_devices_max = 64\nknown_devices_per_account_max = 4\n{COUNTING_RULES_ONLY}");
    let daemon = TestDaemon::start_with(Some(&config), true);
    let client = daemon.client();
    let phone = Subject { device: Some("alice-phone"), ..subject("203.0.113.9", "alice") };
    assert!(attempt(&client, LOGIN, &phone, true).await.proceeds());
    daemon.advance("1s"); // mallory's devices would all outlive alice's
                          // mallory logs into her own account with a new device id each time:
                          // without a per-account cap this evicts every other account's devices.
    for n in 0..200 {
        let device = format!("mallory-{n}");
        let mallory = Subject { device: Some(&device), ..subject("198.51.100.66", "mallory") };
        assert!(attempt(&client, LOGIN, &mallory, true).await.proceeds());
    }
    // the spray that holds alice's ceiling (50 failures on unknown devices)
    for n in 1..=60 {
        let _ = attempt(&client, LOGIN, &subject(&format!("192.0.2.{n}"), "alice"), false).await;
    }
    let v = verdict(client.check(LOGIN, &phone).await);
    assert_eq!(v.decision, Decision::Allow, "alice's phone is still known: {v:?}");
    // mallory's fifth new device was never made known
    let fifth = Subject { device: Some("mallory-4"), ..subject("198.51.100.66", "mallory") };
    let first = Subject { device: Some("mallory-0"), ..subject("198.51.100.66", "mallory") };
    for n in 1..=60 {
        let _ = attempt(&client, LOGIN, &subject(&format!("192.0.2.{n}"), "mallory"), false).await;
    }
    assert_eq!(verdict(client.check(LOGIN, &first).await).decision, Decision::Allow);
    assert_eq!(verdict(client.check(LOGIN, &fifth).await).decision, Decision::Deny);
    let status = daemon.cli_json(&["status"]);
    let limit =
        status["limits"].as_array().unwrap().iter().find(|l| l["name"] == "login.known_devices_per_account_max");
    assert_eq!(limit.unwrap()["value"], 4, "the cap is visible in status");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_password_costs_one_failure_and_distinct_guesses_cost_each() {
    let daemon = TestDaemon::start();
    let client = daemon.client();
    let key = [9u8; 32];
    let mail_client = subject("203.0.113.9", "alice");
    let stale = password_digest(&key, "alice", "last-years-password");
    for _ in 0..500 {
        verdict(client.report_with_password(LOGIN, &mail_client, Outcome::Failure, Some(stale)).await);
    }
    let v = verdict(client.check(LOGIN, &mail_client).await);
    assert_eq!((v.decision, v.remaining), (Decision::Allow, 3), "500 repeats cost one failure (and this attempt)");

    let guesser = subject("198.51.100.66", "bob");
    let mut allowed = 0;
    for n in 0..6 {
        let check = verdict(client.check(LOGIN, &guesser).await);
        if check.proceeds() {
            allowed += 1;
            let digest = password_digest(&key, "bob", &format!("guess-{n}"));
            verdict(client.report_with_password(LOGIN, &guesser, Outcome::Failure, Some(digest)).await);
        }
    }
    assert_eq!(allowed, 5, "six distinct wrong passwords are refused after five");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_new_limit_keeping_counters_and_a_bad_file_changes_nothing() {
    let mut daemon = TestDaemon::start_with(Some("# defaults\n"), true);
    let client = daemon.client();
    let locked = subject("198.51.100.1", "carol");
    for _ in 0..5 {
        verdict(client.report(LOGIN, &locked, Outcome::Failure).await);
    }
    let counting = subject("198.51.100.2", "dave");
    for _ in 0..2 {
        verdict(client.report(LOGIN, &counting, Outcome::Failure).await);
    }
    daemon.reload_with("[routes.login.rules.source_failures]\nthreshold = 3\n");
    let status = daemon.cli_json(&["status"]);
    assert_eq!(status["reloads"], 1);
    assert_eq!(verdict(client.check(LOGIN, &locked).await).decision, Decision::Deny, "the lockout survived");
    let v = verdict(client.check(LOGIN, &counting).await);
    assert_eq!((v.decision, v.limit, v.remaining), (Decision::Allow, 3, 0), "two failures kept, new limit of 3");
    assert_eq!(verdict(client.report(LOGIN, &counting, Outcome::Failure).await).decision, Decision::Deny);

    daemon.reload_with("[routes.login.rules.source_failures]\nthreshold = 0\n");
    let status = daemon.cli_json(&["status"]);
    assert_eq!(status["reload_failures"], 1);
    let why = status["last_reload_error"].as_str().unwrap();
    assert!(why.contains("routes.login.rules.source_failures.threshold"), "{why}");
    assert!(daemon.log().contains("reload failed"), "the log says why");
    let fresh = subject("198.51.100.3", "erin");
    assert_eq!(verdict(client.check(LOGIN, &fresh).await).limit, 3, "the previous configuration stays");

    // a class file with an error: the reload names the line, nothing changes
    let bad = daemon.dir.path().join("classes.csv");
    std::fs::write(&bad, "10.0.0.0/8,business\n10.0.0.1/8,hosting\n").unwrap();
    daemon.reload_with(&format!("[source]\nclass_file = \"{}\"\n", bad.display()));
    let why = daemon.cli_json(&["status"])["last_reload_error"].as_str().unwrap().to_string();
    assert!(why.contains("line 2"), "{why}");
    assert!(daemon.terminate().success());
}
