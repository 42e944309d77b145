//! Spray detection in a real daemon: flags raised by its detection thread
//! reach `check` on the next request, a known device is never touched, a
//! monitored detector only counts, an IPv6 block widened in the daemon is
//! one source for the counting rules, a full event queue drops and counts
//! rather than block, and `status`, `metrics` and the log show flags as
//! prefixes and digests, never the account name.

mod common;

use std::time::Duration;

use common::*;
use tollgate::client::{Client, ClientConfig};
use tollgate::protocol::{Decision, Outcome, Reason, Subject};

/// Checks `subject` until `done` holds for its verdict (the detection
/// thread publishes within a few milliseconds), at most 5 s.
async fn check_until(
    client: &Client,
    subject: &Subject<'_>,
    done: impl Fn(&tollgate::protocol::Verdict<'_>) -> bool,
) -> tollgate::protocol::Verdict<'static> {
    for _ in 0..500 {
        let v = verdict(client.check("login", subject).await);
        if done(&v) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no such verdict within 5 s");
}

/// Ten distinct accounts failing from one address, no device: a spray's shape.
async fn spray_from(client: &Client, peer: &str, accounts: std::ops::Range<u32>) {
    for n in accounts {
        let account = format!("target{n}");
        let s = subject(peer, &account);
        assert!(verdict(client.check("login", &s).await).proceeds());
        verdict(client.report("login", &s, Outcome::Failure).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flag_raised_by_the_thread_challenges_unknown_devices_and_never_a_known_one() {
    // Every success counted: with the default sample, Alice's account is in
    // it one time in 8 (the daemon's secret is new each run), and a source
    // with a sampled success needs 16 failing accounts, not 10 (see
    // `Tracked::failure_share`). This test is about what a flag does.
    let daemon = TestDaemon::start_with(Some("[signals]\nsuccess_sample = 1\n"), true);
    let client = daemon.client();
    // Alice logs in from her laptop behind the same address first.
    let laptop = Subject { device: Some("alice-laptop"), ..subject("203.0.113.7", "alice.planted@example.com") };
    assert!(verdict(client.check("login", &laptop).await).proceeds());
    verdict(client.report("login", &laptop, Outcome::Success).await);

    spray_from(&client, "203.0.113.7", 0..10).await;
    let stranger = subject("203.0.113.7", "target99");
    let v = check_until(&client, &stranger, |v| v.decision != Decision::Allow).await;
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Challenge, "spray_signals"));
    // A version-3 client reads why; a version-2 one reads its old reason.
    assert_eq!(v.reason, Reason::SpraySuspected);
    let old = Client::new(ClientConfig::new(&daemon.socket).timeout(Duration::from_secs(10)).protocol_version(2));
    let v2 = verdict(old.check("login", &stranger).await);
    assert_eq!((v2.decision, v2.reason), (Decision::Challenge, Reason::TooManyFailures));

    // Alice on her laptop, from the flagged address: untouched.
    let v = verdict(client.check("login", &laptop).await);
    assert_eq!((v.decision, v.reason), (Decision::Allow, Reason::Allowed), "{v:?}");
    // Another address is not flagged.
    assert!(verdict(client.check("login", &subject("203.0.113.8", "target99")).await).proceeds());

    // What is flagged and why: a prefix and digests, never the name.
    let status = daemon.cli_json(&["status"]);
    let flagged = status["signals"]["flagged"].as_array().expect("flagged subjects").clone();
    assert!(flagged.iter().any(|f| f["subject"] == "203.0.113.7/32" && f["detector"] == "narrow_spray"), "{flagged:?}");
    let metrics = String::from_utf8(daemon.cli(&["metrics"]).stdout).unwrap();
    assert!(
        metrics.contains("tollgate_signal_flags_active{detector=\"narrow_spray\",mode=\"enforce\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("tollgate_signal_events_dropped_total 0"));
    let human = String::from_utf8(daemon.cli(&["status"]).stdout).unwrap();
    assert!(human.contains("flagged 203.0.113.7/32 by narrow_spray"), "{human}");
    let log = daemon.log();
    assert!(log.contains("flag raised"), "{log}");
    for text in [status.to_string(), metrics, human, log] {
        assert!(!text.contains("planted") && !text.contains("target9"), "a raw identifier leaked: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitored_detector_raises_flags_that_only_count() {
    let daemon = TestDaemon::start_with(Some("[signals.narrow_spray]\nmode = \"monitor\"\n"), true);
    let client = daemon.client();
    spray_from(&client, "203.0.113.7", 0..10).await;
    let v = check_until(&client, &subject("203.0.113.7", "target99"), |v| v.reason != Reason::Allowed).await;
    assert_eq!((v.decision, v.reason, v.rule.as_ref()), (Decision::Allow, Reason::MonitorSignal, "spray_signals"));
    let status = daemon.cli_json(&["status"]);
    let login = status["routes"].as_array().unwrap().iter().find(|r| r["name"] == "login").unwrap().clone();
    let rule = login["rules"].as_array().unwrap().iter().find(|r| r["name"] == "spray_signals").unwrap().clone();
    assert!(rule["would_refuse"].as_u64().unwrap() >= 1 && rule["refused"] == 0, "{rule}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_password_tried_on_twenty_accounts_is_flagged_from_anywhere() {
    let daemon = TestDaemon::start();
    let client = daemon.client();
    let key = [9u8; 32];
    let tag = Some(tollgate::client::password_tag(&key, "Winter2030!"));
    // Every attempt from a different /24: no source axis can see it.
    for n in 0..20u32 {
        let account = format!("target{n}");
        let peer = format!("11.{}.{}.7", n / 200, n % 200);
        let s = subject(&peer, &account);
        assert!(client.check_tagged("login", &s, tag).await.answer.proceeds());
        client.report_tagged("login", &s, Outcome::Failure, None, tag).await;
    }
    let next = subject("12.0.0.1", "target21");
    let mut challenged = false;
    for _ in 0..500 {
        let v = verdict(client.check_tagged("login", &next, tag).await.answer);
        if v.decision == Decision::Challenge {
            assert_eq!(v.reason, Reason::SpraySuspected);
            challenged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(challenged, "the password tag is flagged");
    // The same attempt with another password is not.
    let other = Some(tollgate::client::password_tag(&key, "correct horse"));
    assert!(client.check_tagged("login", &next, other).await.answer.proceeds());
}

/// Fails one account from five fresh /64s of 2001:db8:aa00::/48 after 16
/// other /64s of it failed, and returns the verdict of a sixth /64's check.
async fn guess_across_a_48(daemon: &TestDaemon) -> tollgate::protocol::Verdict<'static> {
    let client = daemon.client();
    for n in 0..16u32 {
        let peer = format!("2001:db8:aa00:{:x}::1", n << 8);
        let account = format!("seed{n}");
        let s = subject(&peer, &account);
        assert!(verdict(client.check("login", &s).await).proceeds());
        verdict(client.report("login", &s, Outcome::Failure).await);
    }
    let widened = || {
        let status = daemon.cli_json(&["status"]);
        status["signals"]["flagged"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["detector"] == "ipv6_widening" && f["subject"] == "2001:db8:aa00::/48")
    };
    for _ in 0..500 {
        if widened() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(widened(), "the /48 is shown widened (in monitor mode too)");
    for n in 0..5u32 {
        let peer = format!("2001:db8:aa00:{:x}::1", 0x2000 + n);
        let s = subject(&peer, "victim");
        assert!(verdict(client.check("login", &s).await).proceeds(), "guess {n}");
        verdict(client.report("login", &s, Outcome::Failure).await);
    }
    verdict(client.check("login", &subject("2001:db8:aa00:3000::1", "victim")).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_widened_48_is_one_source_for_the_counting_rules() {
    // Widening enforced (the default): five guesses from five /64s meet one
    // (account, /48) count, and the sixth is refused as from one address.
    let daemon = TestDaemon::start();
    let v = guess_across_a_48(&daemon).await;
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"), "{v:?}");
    // Outside the block, nothing is shared.
    let client = daemon.client();
    assert!(verdict(client.check("login", &subject("2001:db8:bb00::1", "victim")).await).proceeds());

    // The control: widening only watched, every /64 keeps its own count.
    let watched = TestDaemon::start_with(Some("[signals.ipv6_widening]\nmode = \"monitor\"\n"), true);
    let v = guess_across_a_48(&watched).await;
    assert!(v.proceeds(), "{v:?}");
}

#[test]
fn a_full_event_queue_drops_and_counts_and_never_blocks_a_report() {
    let daemon = TestDaemon::start_with(Some("[signals]\nqueue_max = 1\npublish_interval_ms = 10000\n"), true);
    let rt = runtime();
    let accounts: Vec<String> = (0..5_000).map(|n| format!("flood{n}")).collect();
    let replies = rt.block_on(pipeline(&daemon.socket, accounts.len(), 256, |i, out| {
        report_frame(
            i,
            "login",
            &subject(&format!("10.{}.{}.1", i / 250, i % 250), &accounts[i]),
            Outcome::Failure,
            out,
        );
    }));
    assert_eq!(replies.len(), 5_000, "every report answered");
    let status = daemon.cli_json(&["status"]);
    let dropped = status["signals"]["events_dropped"].as_u64().unwrap();
    assert!(dropped > 0, "{}", status["signals"]);
    // The counter only grows; metrics read it after status did.
    let metrics = String::from_utf8(daemon.cli(&["metrics"]).stdout).unwrap();
    let line = metrics.lines().find(|l| l.starts_with("tollgate_signal_events_dropped_total ")).expect("the family");
    let in_metrics: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(in_metrics >= dropped, "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_turns_spray_detection_off_withdraws_its_flags_at_once() {
    let daemon = TestDaemon::start_with(Some("# defaults\n"), true);
    let client = daemon.client();
    spray_from(&client, "203.0.113.7", 0..10).await;
    let stranger = subject("203.0.113.7", "target99");
    check_until(&client, &stranger, |v| v.decision == Decision::Challenge).await;
    daemon.reload_with("[signals]\nenabled = false\n");
    let v = check_until(&client, &stranger, |v| v.decision == Decision::Allow).await;
    assert_eq!(v.reason, Reason::Allowed);
    let status = daemon.cli_json(&["status"]);
    assert!(status["signals"].is_null(), "{}", status["signals"]);
}

/// Whether `status` lists `subject` flagged by `detector`.
fn flagged(daemon: &TestDaemon, subject: &str, detector: &str) -> bool {
    let status = daemon.cli_json(&["status"]);
    let flagged = status["signals"]["flagged"].as_array().cloned().unwrap_or_default();
    flagged.iter().any(|f| f["subject"] == subject && f["detector"] == detector)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_customer_failing_many_accounts_never_flags_its_neighbours() {
    let daemon = TestDaemon::start();
    let client = daemon.client();
    // Fifteen neighbours in each prefix mistype once.
    for n in 0..15u32 {
        spray_from(&client, &format!("203.0.113.{}", 100 + n), 1000 + n..1001 + n).await;
        spray_from(&client, &format!("2001:db8:1:{:x}::1", 0x1000 + n * 0x100), 2000 + n..2001 + n).await;
    }
    // Six addresses of one /24 and six /64s of one /56, each failing ten
    // accounts, and one of them sixty more: 120 distinct accounts from each
    // /24 and /48, past `wide_spray`'s 50, from what is one customer in each.
    for host in 0..6u32 {
        spray_from(&client, &format!("203.0.113.{}", host + 1), host * 10..host * 10 + 10).await;
        // The /56 is flagged at its tenth: the rest are reported past it.
        for n in 100 + host * 10..110 + host * 10 {
            let (peer, account) = (format!("2001:db8:1:{host:x}::1"), format!("target{n}"));
            verdict(client.report("login", &subject(&peer, &account), Outcome::Failure).await);
        }
    }
    // Past its own flag: the auth server reports what its challenge let by.
    for n in 0..60u32 {
        for (peer, account) in
            [("203.0.113.6", format!("target{}", 300 + n)), ("2001:db8:1:5::1", format!("target{}", 400 + n))]
        {
            verdict(client.report("login", &subject(peer, &account), Outcome::Failure).await);
        }
    }
    // Each of those sources is flagged itself (`narrow_spray`, their own
    // tenth account, the last events the thread counts).
    for peer in ["203.0.113.6", "2001:db8:1:5::1"] {
        let v = check_until(&client, &subject(peer, "target999"), |v| v.decision != Decision::Allow).await;
        assert_eq!((v.decision, v.rule.as_ref()), (Decision::Challenge, "spray_signals"));
    }
    // Their neighbours are not: another address of the /24, and another
    // customer's /56 of the /48, on a new device.
    for peer in ["203.0.113.200", "2001:db8:1:100::1"] {
        let v = verdict(client.check("login", &subject(peer, "bystander")).await);
        assert_eq!((v.decision, v.reason), (Decision::Allow, Reason::Allowed), "{peer}: {v:?}");
    }
    assert!(!flagged(&daemon, "203.0.113.0/24", "wide_spray") && !flagged(&daemon, "2001:db8:1::/48", "wide_spray"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spray_rotating_through_a_24_or_a_48_is_flagged_at_its_fiftieth_account() {
    let daemon = TestDaemon::start();
    let client = daemon.client();
    // One account per attempt, from 64 addresses of a /24 in turn, and from
    // a fresh /64 of a /48 each time: no address fails ten accounts.
    for n in 0..50u32 {
        let (v4_peer, v4_account) = (format!("198.51.100.{}", n % 64), format!("v4target{n}"));
        let (v6_peer, v6_account) = (format!("2001:db8:77:{:x}::1", n * 0x0101), format!("v6target{n}"));
        for s in [subject(&v4_peer, &v4_account), subject(&v6_peer, &v6_account)] {
            if n < 49 {
                // The budget is unchanged: nothing flags the wide prefix
                // before its 50th distinct account.
                assert!(!flagged(&daemon, "198.51.100.0/24", "wide_spray"), "flagged at {n}");
            }
            assert!(verdict(client.check("login", &s).await).proceeds(), "attempt {n}");
            verdict(client.report("login", &s, Outcome::Failure).await);
        }
    }
    for (peer, wide) in [("198.51.100.99", "198.51.100.0/24"), ("2001:db8:77:ffff::1", "2001:db8:77::/48")] {
        let v = check_until(&client, &subject(peer, "target999"), |v| v.decision != Decision::Allow).await;
        assert_eq!((v.decision, v.rule.as_ref()), (Decision::Challenge, "spray_signals"), "{peer}");
        assert!(flagged(&daemon, wide, "wide_spray"), "{wide}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spray_from_one_56_rotating_its_64s_is_flagged_on_that_56_alone() {
    let daemon = TestDaemon::start();
    let client = daemon.client();
    // Where an ISP gives each customer a /64, one of them failing twenty
    // accounts flags its /64 alone, never the /56 around it.
    spray_from(&client, "2001:db8:8:1::1", 0..10).await;
    for n in 10..20u32 {
        let account = format!("target{n}");
        verdict(client.report("login", &subject("2001:db8:8:1::1", &account), Outcome::Failure).await);
    }
    check_until(&client, &subject("2001:db8:8:1::1", "target99"), |v| v.decision != Decision::Allow).await;
    let v = verdict(client.check("login", &subject("2001:db8:8:2::1", "bystander")).await);
    assert_eq!((v.decision, v.reason), (Decision::Allow, Reason::Allowed), "{v:?}");
    // A fresh /64 of one customer's /56 for each account: no /64 fails two.
    for n in 0..10u32 {
        let (peer, account) = (format!("2001:db8:9:{:x}::1", 0x500 + n), format!("target{n}"));
        let s = subject(&peer, &account);
        assert!(verdict(client.check("login", &s).await).proceeds(), "attempt {n}");
        verdict(client.report("login", &s, Outcome::Failure).await);
    }
    // Its next /64 is challenged; the next customer's /56 is not.
    let v = check_until(&client, &subject("2001:db8:9:5ff::1", "target99"), |v| v.decision != Decision::Allow).await;
    assert_eq!((v.decision, v.reason), (Decision::Challenge, Reason::SpraySuspected));
    assert!(flagged(&daemon, "2001:db8:9:500::/56", "narrow_spray"));
    let v = verdict(client.check("login", &subject("2001:db8:9:600::1", "bystander")).await);
    assert_eq!((v.decision, v.reason), (Decision::Allow, Reason::Allowed), "{v:?}");
}
