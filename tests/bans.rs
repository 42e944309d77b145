//! Manual bans against a real daemon on the manual clock: a banned
//! network's checks are denied on every route without spending anything,
//! the ban survives `kill -9`, is listed by `lockouts`, wins over an
//! exemption, ends on time, and `unlock --ip` lifts it durably. Bad bans
//! are refused in words; older clients read the reason as
//! `too_many_failures`; only admins may ban.

mod common;

use common::*;
use tollgate::codec;
use tollgate::protocol::{Decision, ErrorCode, Reason, Request, Response, Subject};

const TWO_HOURS_MS: u64 = 7_200_000;

fn banned_subject() -> Subject<'static> {
    subject("203.0.113.5", "alice")
}

fn check(daemon: &TestDaemon, who: &Subject<'_>) -> tollgate::protocol::Verdict<'static> {
    verdict(runtime().block_on(daemon.client().check("login", who)))
}

fn limit(status: &serde_json::Value, name: &str) -> u64 {
    let limits = status["limits"].as_array().unwrap();
    limits.iter().find(|l| l["name"] == name).and_then(|l| l["value"].as_u64()).unwrap_or_else(|| panic!("no {name}"))
}

#[test]
fn a_ban_denies_its_network_spends_nothing_survives_kill_9_and_unlock_lifts_it() {
    let mut daemon = TestDaemon::start();
    let out = daemon.cli(&["ban", "--ip", "203.0.113.0/24", "--for", "2h", "--reason", "stuffing wave"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(said.starts_with("banned 203.0.113.0/24 until 2030-01-01T02:00:00Z (for 2h)"), "{said}");

    let denied = check(&daemon, &banned_subject());
    assert_eq!((denied.decision, denied.reason, &*denied.rule), (Decision::Deny, Reason::Banned, "ban"));
    assert_eq!((denied.retry_after_ms, denied.reset_ms), (TWO_HOURS_MS, TWO_HOURS_MS));
    // Every route, and every address of the network; not its neighbour.
    let reset = runtime().block_on(daemon.client().check("password_reset", &banned_subject()));
    assert_eq!(verdict(reset).reason, Reason::Banned);
    assert_eq!(check(&daemon, &subject("203.0.113.255", "bob")).reason, Reason::Banned);
    assert_eq!(check(&daemon, &subject("203.0.114.5", "dave")).decision, Decision::Allow);
    // A denied check spent nothing: the rate budget is whole, no place held.
    let standing = runtime().block_on(daemon.client().inspect("login", &banned_subject())).unwrap();
    for rule in &standing.rules {
        assert_eq!(rule.in_flight, 0, "{rule:?}");
        if rule.name == "source_rate" {
            assert_eq!(rule.remaining, rule.limit, "{rule:?}");
        }
    }
    assert_eq!(limit(&daemon.cli_json(&["status"]), "bans_held"), 1);
    // `inspect` shows the ban first and exits 5: a check would be refused.
    let inspected = daemon.cli(&["inspect", "--account", "alice", "--ip", "203.0.113.5"]);
    assert_eq!(inspected.status.code(), Some(5));
    let text = String::from_utf8(inspected.stdout).unwrap();
    assert!(text.lines().nth(1).is_some_and(|l| l.trim_start().starts_with("ban") && l.contains("banned")), "{text}");

    // Networks and reasons are an admin's to see, in version 7: an older
    // frame lists no ban (its clients' keys are digests, never addresses).
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    let mut frame = Vec::new();
    codec::encode_request_versioned(6, 3, &Request::Lockouts { limit: 10 }, &mut frame);
    std::io::Write::write_all(&mut stream, &frame).unwrap();
    let (_, older) = read_reply(&mut stream);
    assert!(matches!(&older, Response::Lockouts { lockouts, total: 0 } if lockouts.is_empty()), "{older:?}");
    let listed = daemon.cli_json(&["lockouts"]);
    let first = &listed["lockouts"][0];
    assert_eq!((first["route"].as_str(), first["rule"].as_str()), (Some("*"), Some("ban: stuffing wave")), "{listed}");
    assert_eq!((first["key"].as_str(), first["retry_after_ms"].as_u64()), (Some("203.0.113.0/24"), Some(TWO_HOURS_MS)));
    assert_eq!(listed["total"], 1);
    let table = String::from_utf8(daemon.cli(&["lockouts"]).stdout).unwrap();
    assert!(table.contains("ban 203.0.113.0/24  every route  until 2030-01-01T02:00:00Z"), "{table}");
    assert!(table.contains("reason: stuffing wave"), "{table}");

    // Durable before its reply: a kill -9 right after keeps it.
    daemon.kill9();
    daemon.spawn();
    assert_eq!(check(&daemon, &banned_subject()).reason, Reason::Banned, "the ban survived kill -9");

    let lifted = daemon.cli(&["unlock", "--ip", "203.0.113.0/24"]);
    assert_eq!(lifted.status.code(), Some(0), "{}", String::from_utf8_lossy(&lifted.stderr));
    assert_eq!(String::from_utf8(lifted.stdout).unwrap().trim(), "lifted the ban on 203.0.113.0/24");
    assert_eq!(check(&daemon, &banned_subject()).decision, Decision::Allow);
    let again = daemon.cli(&["unlock", "--ip", "203.0.113.0/24"]);
    assert_eq!(again.status.code(), Some(6), "nothing left to lift");
    daemon.kill9();
    daemon.spawn();
    assert_eq!(check(&daemon, &banned_subject()).decision, Decision::Allow, "the lift survived kill -9 too");

    let log = daemon.log();
    let ban_line = log.lines().find(|l| l.contains(" ban ") || l.ends_with(" ban")).unwrap_or_else(|| panic!("{log}"));
    assert!(ban_line.contains("203.0.113.0/24") && ban_line.contains("uid="), "{ban_line}");
    assert!(log.lines().any(|l| l.contains("ban lifted") && l.contains("uid=")), "{log}");
}

#[test]
fn a_ban_ends_on_time_and_a_narrow_one_does_not_shorten_a_wide_one() {
    let daemon = TestDaemon::start();
    for (network, duration) in [("2001:db8::/32", "10m"), ("2001:db8:1::/48", "1m")] {
        let out = daemon.cli(&["ban", "--ip", network, "--for", duration]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let inside = subject("2001:db8:1::7", "alice");
    assert_eq!(check(&daemon, &inside).retry_after_ms, 600_000, "the latest-ending ban decides");
    daemon.advance("2m");
    assert_eq!(check(&daemon, &inside).reason, Reason::Banned, "the /32 still holds after the /48 ended");
    assert_eq!(daemon.cli_json(&["lockouts"])["total"], 1, "the ended ban is no longer listed");
    daemon.advance("9m");
    assert_eq!(check(&daemon, &inside).decision, Decision::Allow);
    assert_eq!(daemon.cli_json(&["lockouts"])["total"], 0);
    // Banning a network again replaces its ban, longer or shorter.
    assert!(daemon.cli(&["ban", "--ip", "198.51.100.0/24", "--for", "1h"]).status.success());
    let replaced = daemon.cli_json(&["ban", "--ip", "198.51.100.0/24", "--for", "5m"]);
    assert_eq!(replaced["replaced"], true);
    assert_eq!(check(&daemon, &subject("198.51.100.1", "carol")).retry_after_ms, 300_000);
}

#[test]
fn a_ban_wins_over_a_source_exemption() {
    let config = "[[source.exemptions]]\nprefix = \"203.0.113.0/24\"\nreason = \"office egress\"\n";
    let daemon = TestDaemon::start_with(Some(config), true);
    assert_eq!(check(&daemon, &banned_subject()).decision, Decision::Allow);
    assert!(daemon.cli(&["ban", "--ip", "203.0.113.0/28", "--for", "1h"]).status.success());
    assert_eq!(check(&daemon, &banned_subject()).reason, Reason::Banned);
    assert_eq!(check(&daemon, &subject("203.0.113.100", "bob")).decision, Decision::Allow, "outside the /28");
}

#[test]
fn a_ban_may_not_cover_a_trusted_proxy() {
    let daemon = TestDaemon::start_with(Some("[source]\ntrusted_proxies = [\"10.0.0.0/24\"]\n"), true);
    let out = daemon.cli(&["ban", "--ip", "10.0.0.0/8", "--for", "1h"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("overlaps source.trusted_proxies' 10.0.0.0/24"));
    assert_eq!(check(&daemon, &subject("10.0.0.1", "alice")).decision, Decision::Allow);
}

#[test]
fn bad_bans_are_refused_in_words_and_change_nothing() {
    let daemon = TestDaemon::start();
    let refused = |args: &[&str], code: i32, words: &str| {
        let out = daemon.cli(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(words), "{args:?}: {stderr}");
    };
    refused(&["ban", "--ip", "0.0.0.0/0", "--for", "1h"], 2, "wider than /8, the widest IPv4 ban");
    refused(&["ban", "--ip", "203.0.113.7/24", "--for", "1h"], 2, "host bits set (did you mean 203.0.113.0/24?)");
    refused(&["ban", "--ip", "2001:db8::/16", "--for", "1h"], 2, "the widest IPv6 ban");
    refused(&["ban", "--ip", "203.0.113.0/24", "--for", "400days"], 2, "a ban lasts from 1 ms to 366 days");
    refused(&["ban", "--ip", "203.0.113.0/24", "--for", "500us"], 2, "a ban lasts from 1 ms");
    let long = "x".repeat(201);
    refused(&["ban", "--ip", "203.0.113.0/24", "--for", "1h", "--reason", &long], 2, "at most 200 bytes");
    refused(&["ban", "--ip", "203.0.113.0/24", "--for", "1h", "--reason", "\u{202e}evil"], 2, "invisible");
    refused(&["unlock", "--ip", "203.0.113.0/24", "--account", "alice"], 2, "cannot be used with");

    // The daemon checks what a client of its own sends, too.
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    let wide = Request::Ban { network: ip("0.0.0.0"), prefix_len: 0, for_ms: 1000, reason: "" };
    let Response::Error(e) = call_std(&mut stream, 1, &wide) else { panic!("a /0 ban was accepted") };
    assert_eq!(e.code, ErrorCode::Malformed);
    assert!(e.message.contains("wider than /8"), "{}", e.message);
    let past_end = Request::Ban { network: ip("203.0.113.0"), prefix_len: 33, for_ms: 1000, reason: "" };
    assert!(matches!(call_std(&mut stream, 2, &past_end), Response::Error(_)));
    let forever = Request::Ban { network: ip("203.0.113.0"), prefix_len: 24, for_ms: u64::MAX, reason: "" };
    let Response::Error(e) = call_std(&mut stream, 3, &forever) else { panic!("an endless ban was accepted") };
    assert!(e.message.contains("366 days"), "{}", e.message);
    let hidden = Request::Ban { network: ip("203.0.113.0"), prefix_len: 24, for_ms: 1000, reason: "a\u{2066}b" };
    assert!(matches!(call_std(&mut stream, 4, &hidden), Response::Error(_)));
    let status = daemon.cli_json(&["status"]);
    assert_eq!(limit(&status, "bans_held"), 0, "nothing was banned");
    assert_eq!(limit(&status, "bans_max"), 1024);
}

#[test]
fn older_clients_read_a_ban_as_too_many_failures_and_cannot_send_one() {
    let daemon = TestDaemon::start();
    assert!(daemon.cli(&["ban", "--ip", "203.0.113.0/24", "--for", "1h"]).status.success());
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    for version in 1..=6u8 {
        let mut frame = Vec::new();
        codec::encode_request_versioned(
            version,
            7,
            &Request::Check { route: "login", subject: banned_subject() },
            &mut frame,
        );
        std::io::Write::write_all(&mut stream, &frame).unwrap();
        let (_, reply) = read_reply(&mut stream);
        let Response::Verdict(v) = reply else { panic!("{reply:?}") };
        assert_eq!((v.decision, v.reason, &*v.rule), (Decision::Deny, Reason::TooManyFailures, "ban"), "v{version}");
    }
    let mut frame = Vec::new();
    let ban = Request::Ban { network: ip("198.51.100.0"), prefix_len: 24, for_ms: 1000, reason: "" };
    codec::encode_request_versioned(6, 8, &ban, &mut frame);
    std::io::Write::write_all(&mut stream, &frame).unwrap();
    let (_, reply) = read_reply(&mut stream);
    let Response::Error(e) = reply else { panic!("{reply:?}") };
    assert_eq!(e.message, "request `ban` needs protocol version 7; this frame is version 6");
}

#[test]
fn only_an_admin_may_ban_or_lift_a_ban() {
    let Some(daemon) = TestDaemon::open_to_everyone() else { return };
    assert!(daemon.cli(&["ban", "--ip", "203.0.113.0/24", "--for", "1h"]).status.success(), "root may");
    for (args, operation) in [
        (&["ban", "--ip", "198.51.100.0/24", "--for", "1h"][..], "may not ban"),
        (&["unlock", "--ip", "203.0.113.0/24"][..], "may not unban"),
    ] {
        let out = daemon.cli_as_nobody(args);
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("permission denied") && stderr.contains(operation), "{stderr}");
    }
    let listed = daemon.cli_as_nobody(&["lockouts", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed["total"], 0, "bans are an admin's to list: {listed}");
    assert_eq!(check(&daemon, &banned_subject()).reason, Reason::Banned, "the ban stands");
    assert_eq!(check(&daemon, &subject("198.51.100.1", "bob")).decision, Decision::Allow, "no ban was made");
}
