//! The pure limiter, without a daemon or a disk: time is an argument, so
//! each verdict is asserted exactly at a chosen instant.

use std::sync::Arc;

use super::route::Full;
use super::verdict::{combine, RuleAnswer};
use super::{Begun, Limiter};
use crate::classes::ClassTable;
use crate::config::{Config, Rung};
use crate::failure_window::Counts;
use crate::keys::{Component, KeyDeriver, Secret, SECRET_BYTES};
use crate::protocol::{Decision, Outcome, Reason, Subject, Verdict};
use crate::shared::script::Op;
use crate::store::{Journal, PersistedEntry};

const SECOND: u64 = 1_000_000;
const WINDOW: u64 = 60 * SECOND;
/// The start of a one-minute window (index 100), and of a two-minute one.
const T0: u64 = 100 * WINDOW;

/// One failure rule on route `t`: 3 failures a minute per account, no
/// jitter, so every figure is exact.
fn rule(extra: &str) -> String {
    format!(
        "[responses]\njitter_percent = 0\n\
         [routes.t.rules.per_account]\nkind = \"failures\"\nkey = [\"account\"]\nthreshold = 3\nwindow_secs = 60\n{extra}"
    )
}

fn secret() -> Secret {
    Secret::from_bytes([7; SECRET_BYTES])
}

fn limiter(config: &str) -> Limiter {
    let config = Config::build(Config::parse(config).expect("parses")).expect("valid");
    Limiter::new(&config, Arc::new(ClassTable::default()), KeyDeriver::new(&secret()), Journal::discard())
}

fn account(name: &str) -> Subject<'_> {
    Subject { account: Some(name), ..Subject::default() }
}

fn check(limiter: &Limiter, who: &str, now_us: u64) -> Verdict<'static> {
    limiter.check("t", &account(who), now_us).expect("a known route").into_owned()
}

/// An attempt that fails: a check, then its report.
fn fail(limiter: &Limiter, who: &str, now_us: u64) -> Verdict<'static> {
    assert!(check(limiter, who, now_us).proceeds(), "{who} may still try at {now_us}");
    let (verdict, _) = limiter.report("t", &account(who), Outcome::Failure, None, now_us).expect("a known route");
    verdict.into_owned()
}

fn figures(v: &Verdict<'_>) -> (Decision, u64, u64, u32, u64) {
    (v.decision, v.retry_after_ms, v.delay_ms, v.remaining, v.reset_ms)
}

#[test]
fn a_locked_key_climbs_the_ladder_and_lifts_just_after_the_next_window_starts() {
    let limiter = limiter(&rule("responses = [\"delay\", \"challenge\", \"deny\"]\n"));
    assert_eq!(check(&limiter, "alice", T0).remaining, 2, "a check counts its own place");
    let _ = limiter.report("t", &account("alice"), Outcome::Failure, None, T0);
    fail(&limiter, "alice", T0);
    let third = fail(&limiter, "alice", T0);
    // The third failure locks: a report shows the first rung without
    // climbing it. Locked until 1 µs into the next window (the sliding
    // estimate 3·(W−e)/W falls below 3 once e > 0); the counts expire at the
    // end of the next window.
    assert_eq!(figures(&third), (Decision::Delay, 60_001, 1_000, 0, 120_000));

    // Each refusal climbs one rung; Retry-After is never below the true wait
    // and grows by the configured steps (1 s, 5 s, 30 s, 120 s).
    let rungs: Vec<_> = (0..4).map(|_| figures(&check(&limiter, "alice", T0))).collect();
    assert_eq!(
        rungs,
        [
            (Decision::Delay, 60_001, 1_000, 0, 120_000),
            (Decision::Challenge, 60_001, 0, 0, 120_000),
            (Decision::Deny, 60_001, 0, 0, 120_000),
            (Decision::Deny, 120_000, 0, 0, 120_000),
        ]
    );
    assert_eq!(check(&limiter, "alice", T0 + WINDOW).decision, Decision::Deny, "still locked at the window's start");
    let lifted = check(&limiter, "alice", T0 + WINDOW + 1);
    assert_eq!((lifted.decision, lifted.reason), (Decision::Allow, Reason::Allowed), "lifted 1 µs later");
    assert_eq!(check(&limiter, "bob", T0).decision, Decision::Allow, "another account is untouched");
}

#[test]
fn monitor_mode_allows_names_the_would_be_refusal_and_never_climbs() {
    let limiter = limiter(&rule("monitor = true\nresponses = [\"delay\", \"deny\"]\n"));
    for _ in 0..3 {
        fail(&limiter, "alice", T0);
    }
    for _ in 0..4 {
        let v = check(&limiter, "alice", T0 + SECOND);
        assert_eq!(
            (v.decision, v.reason, v.rule.as_ref(), v.retry_after_ms, v.delay_ms),
            (Decision::Allow, Reason::MonitorTooManyFailures, "per_account", 0, 0)
        );
        let _ = limiter.report("t", &account("alice"), Outcome::Success, None, T0 + SECOND);
    }
    let status = limiter.route_status();
    let rule = &status.iter().find(|r| r.name == "t").expect("route t").rules[0];
    assert_eq!((rule.refused, rule.would_refuse), (0, 4), "counted as would-be refusals only");
}

#[test]
fn a_refused_check_holds_no_place_and_a_report_settles_the_place_its_check_took() {
    let limiter = limiter(&rule(""));
    // Three checks in flight fill the rule: a fourth is refused at once.
    for remaining in [2, 1, 0] {
        assert_eq!(figures(&check(&limiter, "alice", T0)).3, remaining);
    }
    let fourth = check(&limiter, "alice", T0);
    assert_eq!(fourth.decision, Decision::Deny);
    // A success releases its place; nothing was counted, so one place is free.
    let _ = limiter.report("t", &account("alice"), Outcome::Success, None, T0);
    assert_eq!(check(&limiter, "alice", T0).decision, Decision::Allow);
}

#[test]
fn restored_rows_written_under_another_window_are_re_dated_rounding_down() {
    let limiter = limiter(&rule(""));
    let keys = KeyDeriver::new(&secret());
    let key = |name: &str| keys.tuple(&[(Component::Account, keys.component(Component::Account, name.as_bytes()))]);
    // Written under a two-minute window; restored half-way through it (at
    // T0 + 1 min, window 50 of the old length). Alice's sliding count is
    // 4·½ + 1 = 3 (locked at 3); Bob's 4·½ = 2.
    let row = |who: &str, previous, current| PersistedEntry {
        rule: "t/per_account".into(),
        key: key(who).to_u128(),
        window_us: 2 * WINDOW,
        counts: Counts { window: 50, previous, current },
    };
    let now = T0 + WINDOW;
    let restored = limiter.restore(vec![row("alice", 4, 1), row("bob", 4, 0)], now);
    assert_eq!((restored.restored, restored.redated, restored.expired), (2, 2, 0));
    assert_eq!(check(&limiter, "alice", now).decision, Decision::Deny, "3 of 3: locked as before the restart");
    let bob = check(&limiter, "bob", now);
    assert_eq!((bob.decision, bob.remaining), (Decision::Allow, 0), "2 of 3, and this attempt's place");
    // A row of a rule no longer configured is not restored.
    let orphan = PersistedEntry { rule: "t/gone".into(), ..row("carol", 0, 1) };
    assert_eq!(limiter.restore(vec![orphan], now).orphaned, 1);
}

fn answer(refused: bool, monitored: bool, rung: Rung, retry_after_ms: u64, remaining: u32) -> RuleAnswer<'static> {
    RuleAnswer {
        refused,
        monitored,
        reason: if refused { Reason::TooManyFailures } else { Reason::Allowed },
        rung,
        retry_after_us: retry_after_ms * 1000,
        delay_us: if rung == Rung::Delay { 2_000_000 } else { 0 },
        limit: 5,
        remaining,
        reset_us: 0,
        rule: match (refused, monitored) {
            (true, true) => "monitored",
            (true, false) => "enforced",
            _ => "open",
        },
    }
}

#[test]
fn combine_takes_the_severest_rung_then_the_longest_wait() {
    let deny_short = RuleAnswer { rule: "deny-short", ..answer(true, false, Rung::Deny, 1_000, 0) };
    let deny_long = RuleAnswer { rule: "deny-long", ..answer(true, false, Rung::Deny, 9_000, 0) };
    let delay = answer(true, false, Rung::Delay, 50_000, 0);
    let v = combine(&[delay, deny_short, deny_long]);
    assert_eq!((v.decision, v.retry_after_ms, v.rule.as_ref(), v.delay_ms), (Decision::Deny, 9_000, "deny-long", 0));

    let v = combine(&[answer(true, false, Rung::Delay, 3_000, 0), answer(false, false, Rung::Deny, 0, 4)]);
    assert_eq!((v.decision, v.delay_ms, v.retry_after_ms), (Decision::Delay, 2_000, 3_000));

    // Nothing enforced: the tightest rule's figures, or the would-be refusal.
    let v = combine(&[answer(false, false, Rung::Deny, 0, 4), answer(false, false, Rung::Deny, 0, 1)]);
    assert_eq!((v.decision, v.remaining, v.reason), (Decision::Allow, 1, Reason::Allowed));
    let v = combine(&[answer(false, false, Rung::Deny, 0, 0), answer(true, true, Rung::Deny, 7_000, 3)]);
    assert_eq!(
        (v.decision, v.rule.as_ref(), v.remaining, v.reason, v.retry_after_ms),
        (Decision::Allow, "monitored", 3, Reason::MonitorTooManyFailures, 0)
    );
    // A monitored refusal never outranks an enforced one.
    let v = combine(&[answer(true, true, Rung::Deny, 90_000, 0), answer(true, false, Rung::Challenge, 1_000, 0)]);
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Challenge, "enforced"));
    // No rule applied: allowed, naming none.
    let v = combine(&[]);
    assert_eq!((v.decision, v.rule.as_ref(), v.limit), (Decision::Allow, "", 0));
}

/// A refusal made of places in flight says so; one made of failures says
/// that, however many places are held beside them.
#[test]
fn a_refusal_by_places_in_flight_has_its_own_reason() {
    let limiter = limiter(&rule(""));
    for _ in 0..3 {
        assert!(check(&limiter, "alice", T0).proceeds());
    }
    assert_eq!(check(&limiter, "alice", T0).reason, Reason::AttemptsInFlight);
    for _ in 0..3 {
        limiter.report("t", &account("alice"), Outcome::Failure, None, T0).unwrap();
    }
    assert_eq!(check(&limiter, "alice", T0).reason, Reason::TooManyFailures);
}

/// A crafted cell row (its check is an unkeyed BLAKE2b of the row, so any
/// writer of the file can make one that passes) with a window length of 0:
/// entries treat 0 as "the rule's length"; cells divide by it.
#[test]
fn a_cell_row_of_window_length_zero_is_dropped_not_a_panic() {
    use crate::store::PersistedCells;
    let limiter = limiter(&rule(""));
    let row = PersistedCells {
        rule: "t/per_account".into(),
        shard: 0,
        row_bits: 10,
        chunk: 0,
        window_us: 0,
        cells: vec![(0, Counts { window: 100, previous: 0, current: 3 })],
    };
    let mut restored = super::Restored::default();
    let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        limiter.restore_cells(vec![row], T0, &mut restored);
    }));
    assert!(started.is_ok(), "start-up panicked on a cell row with window_us = 0");
}

/// `inspect` reads and never writes: a limiter inspected before every
/// step gives the very verdicts of its twin never inspected (a ladder
/// climbed, places taken and settled, a lockout and its lifting), and each
/// inspection shows the standing the verdicts imply.
#[test]
fn inspecting_between_every_step_changes_no_verdict() {
    let config = rule("responses = [\"delay\", \"challenge\", \"deny\"]\n");
    let (inspected, plain) = (limiter(&config), limiter(&config));
    let standing = |at: u64| {
        let inspection = inspected.inspect("t", &account("alice"), at).expect("a known route");
        let r = &inspection.rules[0];
        (r.failures, r.in_flight, r.remaining, r.locked, r.refuses, r.retry_after_ms)
    };
    let mut steps = Vec::new();
    for (i, at) in
        [T0, T0, T0 + SECOND, T0 + 2 * SECOND, T0 + 3 * SECOND, T0 + WINDOW, T0 + WINDOW + 1].iter().enumerate()
    {
        let shown = standing(*at);
        assert_eq!(standing(*at), shown, "an inspection changes the next one");
        let (a, b) = (check(&inspected, "alice", *at), check(&plain, "alice", *at));
        assert_eq!(a, b, "step {i}");
        if a.proceeds() {
            let reported =
                |l: &Limiter| l.report("t", &account("alice"), Outcome::Failure, None, *at).unwrap().0.into_owned();
            assert_eq!(reported(&inspected), reported(&plain), "step {i}");
        }
        steps.push(shown);
    }
    // (failures, in flight, remaining, locked, refuses, retry after ms):
    // a delay proceeds, so its report makes a fourth failure; in the next
    // window the four weigh less until they fall below three, 15 s in.
    let expected = [
        (0, 0, 3, false, false, 0),
        (1, 0, 2, false, false, 0),
        (2, 0, 1, false, false, 0),
        (3, 0, 0, true, true, 58_001),
        (4, 0, 0, true, true, 72_001),
        (4, 0, 0, true, true, 15_001),
        (4, 0, 0, true, true, 15_000),
    ];
    assert_eq!(steps, expected);
}

/// An exempt source skips the rules everyone behind its prefix shares
/// (keyed on the prefix alone or with the client id), on check and report
/// alike, and no verdict names one; a rule keyed on the account with the
/// prefix is one person's and still counts and locks. A reload that drops
/// the exemption brings the skipped rules back.
#[test]
fn an_exempt_source_skips_the_rules_its_prefix_shares_and_never_an_accounts() {
    let exempt = "[[source.exemptions]]\nprefix = \"203.0.113.0/24\"\nreason = \"office\"\n";
    let per_source =
        "[routes.t.rules.per_source]\nkind = \"failures\"\nkey = [\"account\", \"prefix\"]\nthreshold = 2\n\
                      window_secs = 60\n[routes.t.rules.source_rate]\nkind = \"rate\"\nkey = [\"prefix\"]\nlimit = 1\n\
                      burst = 1\nperiod_secs = 60\n[routes.t.rules.client_rate]\nkind = \"rate\"\n\
                      key = [\"client_id\", \"prefix\"]\nlimit = 1\nburst = 1\nperiod_secs = 60\n";
    let text = format!("{exempt}{}", rule(per_source));
    let limiter = limiter(&text);
    let from = |peer: &str| Subject {
        peer: Some(peer.parse().expect("an address")),
        account: Some("alice"),
        client_id: Some("app"),
        ..Subject::default()
    };
    let office = from("203.0.113.9");
    for n in 0..2 {
        let v = limiter.check("t", &office, T0 + n).expect("known route");
        assert!(v.proceeds() && !v.rule.ends_with("_rate"), "attempt {n}: {v:?}");
        limiter.report("t", &office, Outcome::Failure, None, T0 + n).expect("known route");
    }
    let v = limiter.check("t", &office, T0 + 2).expect("known route");
    assert_eq!((v.decision, &*v.rule), (Decision::Deny, "per_source"), "alice's own rule holds: {v:?}");
    // Her colleagues share the office's source and client rates, which
    // would refuse the second of them: skipped.
    for (n, name) in ["bob", "carol", "dave"].into_iter().enumerate() {
        let colleague = Subject { account: Some(name), ..office };
        let v = limiter.check("t", &colleague, T0 + 3 + n as u64).expect("known route");
        assert!(v.proceeds() && !v.rule.ends_with("_rate"), "{name}: {v:?}");
    }
    assert_eq!(limiter.exemption_values(), vec![("source.exemption 203.0.113.0/24 office".to_string(), 6)]);

    // Not exempt: the neighbour spends its one-a-minute source rate.
    let neighbour = Subject { account: Some("bob"), ..from("203.0.114.9") };
    assert!(limiter.check("t", &neighbour, T0).expect("known route").proceeds());
    let v = limiter.check("t", &neighbour, T0 + 1).expect("known route");
    assert!(!v.proceeds() && v.rule.ends_with("_rate"), "{v:?}");

    // Without the exemption the office meets its shared rules again.
    let reloaded = limiter.reconfigured(&limiter_config(&rule(per_source)), Arc::new(ClassTable::default()), T0);
    let erin = Subject { account: Some("erin"), ..office };
    assert!(reloaded.check("t", &erin, T0 + 10).expect("known route").proceeds());
    let v = reloaded.check("t", &erin, T0 + 11).expect("known route");
    assert!(!v.proceeds() && v.rule.ends_with("_rate"), "{v:?}");
    assert!(reloaded.exemption_values().is_empty());
}

fn limiter_config(text: &str) -> Config {
    Config::build(Config::parse(text).expect("parses")).expect("valid")
}

/// A host hears its own lockout messages too: the first failure that
/// locks publishes the time left then, and that echo may arrive after
/// later failures lengthened the lockout. A message never shortens a known
/// lockout, so what this host refuses from memory after the store forgets
/// is the longer one.
#[test]
fn a_later_message_with_less_time_left_does_not_shorten_a_known_lockout() {
    let config =
        format!("[shared]\nurl = \"redis+unix:///nonexistent/tollgate.sock\"\n{}", rule("scope = \"global\"\n"));
    let limiter = limiter(&config);
    let plan = limiter.plan_check("t", &account("alice"), T0).expect("a known route");
    let key = plan.rule_keys[0].expect("alice's key");
    let name = limiter.store_key(&plan.facts.route.rules[0], key);
    let known_until = |now_us: u64| {
        let (mut out, mut total) = (Vec::new(), 0);
        limiter.list_known_lockouts(10, now_us, &mut out, &mut total);
        out.first().map(|l| l.until_ms)
    };
    assert!(limiter.learn_known_lockout(&name, 100 * SECOND, None, T0));
    assert!(limiter.learn_known_lockout(&name, 10 * SECOND, None, T0 + SECOND), "the echo, late");
    assert_eq!(known_until(T0 + 50 * SECOND), Some((T0 + 100 * SECOND) / 1000), "kept the longer end");
    // A message that lengthens it is taken.
    assert!(limiter.learn_known_lockout(&name, 110 * SECOND, None, T0 + 2 * SECOND));
    assert_eq!(known_until(T0 + 50 * SECOND), Some((T0 + 112 * SECOND) / 1000));
}

/// A published lockout whose op ran in the store before an unlock this
/// host heard is not learned (it would undo the unlock here); one whose op
/// ran after it is, once past a reply's way back; one that says not when
/// its op ran (a host of the previous version) is not learned within a
/// minute of an unlock of its key or account.
#[test]
fn a_published_lockout_from_before_an_unlock_heard_is_not_learned() {
    let tag = KeyDeriver::new(&secret()).account_tag("alice");
    let limiter = global_limiter();
    let name = store_name_of(&limiter, "alice");
    let heard = T0 + 10 * SECOND;
    assert!(limiter.forget_known_lockout(&name, u64::MAX, heard), "a U of alice's key");
    assert!(limiter.learn_known_lockout(&name, 600 * SECOND, Some(heard - SECOND / 10), heard + SECOND / 10));
    assert!(!locked_from_memory(&limiter, heard + SECOND), "ran before the unlock: learned");
    assert!(limiter.learn_known_lockout(&name, 600 * SECOND, None, heard + 59 * SECOND));
    assert!(!locked_from_memory(&limiter, heard + 59 * SECOND), "unstamped, within a minute of an unlock: learned");
    assert!(limiter.learn_known_lockout(&name, 600 * SECOND, Some(heard + 2 * SECOND), heard + 3 * SECOND));
    assert!(locked_from_memory(&limiter, heard + 3 * SECOND), "ran after the unlock: not learned");
    // An account-wide unlock holds back each of the account's keys alike.
    let limiter = global_limiter();
    limiter.forget_account_lockouts("t", tag, u64::MAX, heard);
    assert!(limiter.learn_known_lockout(&name, 600 * SECOND, Some(heard - SECOND), heard + SECOND));
    assert!(!locked_from_memory(&limiter, heard + SECOND), "ran before the account's unlock: learned");
    assert!(limiter.learn_known_lockout(&name, 600 * SECOND, None, heard + 61 * SECOND));
    assert!(locked_from_memory(&limiter, heard + 61 * SECOND), "unstamped, past the minute: not learned");
}

/// `rule`'s limiter with the rule global, its store never reached: every
/// failure is counted on the share.
fn global_limiter() -> Limiter {
    limiter(&format!(
        "[shared]\nurl = \"redis+unix:///nonexistent/tollgate.sock\"\nhosts = 1\n{}",
        rule("scope = \"global\"\n")
    ))
}

/// The store's name of `who`'s entry on `rule`'s one rule.
fn store_name_of(limiter: &Limiter, who: &str) -> String {
    let plan = limiter.plan_check("t", &account(who), T0).expect("a known route");
    limiter.store_key(&plan.facts.route.rules[0], plan.rule_keys[0].expect("a key"))
}

/// A lockout on a global rule's share is written back aged from when its
/// entry began counting (an unlock made after that loses to it); one
/// restored from the state file, whose start is not known, from the start
/// of the earliest window its counts hold: the previous one when it has
/// counts, since the lockout rests on them too.
#[test]
fn a_write_back_is_aged_from_its_entrys_start_else_from_its_earliest_window() {
    let limiter = global_limiter();
    // (lock left, age) in seconds of the merge listed at `listed_us` and
    // sent `later_us` after: the packed argument is window, threshold,
    // lock left, age. None if it is not sent.
    let merge_s = |who: &str, listed_us: u64, later_us: u64| {
        let name = store_name_of(&limiter, who);
        let lockouts = limiter.degraded_lockouts(listed_us);
        let lockout = lockouts.iter().find(|l| l.op(0).expect("locked").keys[0] == name).expect("written back");
        let op = lockout.op(later_us)?;
        let at = |from: usize| u64::from_le_bytes(op.args[0][from..from + 8].try_into().expect("8 bytes")) / SECOND;
        Some((at(12), at(20)))
    };
    let age_s = |who: &str, now_us: u64| merge_s(who, now_us, 0).expect("sent").1;
    for _ in 0..3 {
        fail(&limiter, "alice", T0 + 10 * SECOND);
    }
    assert_eq!(age_s("alice", T0 + 30 * SECOND), 20, "from alice's first failure");
    // Sent 7 s after it was listed (batches before it): 7 s older, 7 s
    // less to run; not sent once the lock has run out.
    let (left, age) = merge_s("alice", T0 + 30 * SECOND, 0).expect("sent");
    assert_eq!(merge_s("alice", T0 + 30 * SECOND, 7 * SECOND), Some((left - 7, age + 7)));
    assert_eq!(merge_s("alice", T0 + 30 * SECOND, left * SECOND + SECOND), None);
    // 4 in the previous window, 1 in this one, half-way: 4 x 1/2 + 1 = 3.
    let keys = KeyDeriver::new(&secret());
    let bob = keys.tuple(&[(Component::Account, keys.component(Component::Account, b"bob"))]);
    let row = PersistedEntry {
        rule: "t/per_account".into(),
        key: bob.to_u128(),
        window_us: WINDOW,
        counts: Counts { window: 100, previous: 4, current: 1 },
    };
    assert_eq!(limiter.restore(vec![row], T0 + 30 * SECOND).restored, 1);
    assert_eq!(age_s("bob", T0 + 30 * SECOND), 90, "from the previous window's start");
}

/// A written-back lockout leaves the degraded table only as it was
/// listed: a failure this host counted on the key after the listing (it
/// answers from that table until the write-back is done) is not the
/// merge's, and stays for the next write-back.
#[test]
fn a_write_back_keeps_failures_counted_after_its_listing() {
    let limiter = global_limiter();
    for who in ["alice", "bob"] {
        for _ in 0..3 {
            fail(&limiter, who, T0 + SECOND);
        }
    }
    let name = |who: &str| store_name_of(&limiter, who);
    let listed = limiter.degraded_lockouts(T0 + 2 * SECOND);
    assert_eq!(listed.len(), 2);
    limiter.report("t", &account("alice"), Outcome::Failure, None, T0 + 3 * SECOND).expect("reported");
    let cleared: Vec<(String, bool)> = listed
        .iter()
        .map(|l| (l.op(0).expect("locked").keys[0].clone(), limiter.written_back(l, true, T0 + 2 * SECOND)))
        .collect();
    assert!(cleared.contains(&(name("bob"), true)) && cleared.contains(&(name("alice"), false)), "{cleared:?}");
    let left: Vec<String> =
        limiter.degraded_lockouts(T0 + 4 * SECOND).iter().map(|l| l.op(0).expect("locked").keys[0].clone()).collect();
    assert_eq!(left, [name("alice")], "alice's fourth failure is written back next time");
}

/// The built-in login route on one of 3 hosts of a store that never
/// answers, without its source rule (the tests below guess from one address).
fn login_on_three_hosts() -> Limiter {
    limiter(
        "[shared]\nurl = \"redis+unix:///nonexistent/tollgate.sock\"\nhosts = 3\n\
         [routes.login.rules.source_failures]\nenabled = false\n",
    )
}

/// A check the store answers late is decided on this host's share; a
/// lockout the store told of is refused from memory there on every rule
/// this host then decides, device-scoped ones too (briefly: see below).
/// The share alone never fills (the reports of what it admits are counted
/// in the store), so a late check on an account the store has locked,
/// with a made-up device, was admitted every time: a red team's guesses
/// without end.
#[test]
fn a_late_check_on_an_account_the_store_locked_is_refused_whatever_its_device() {
    let limiter = login_on_three_hosts();
    let peer = Some("203.0.113.50".parse().expect("an address"));
    let attacker = Subject { peer, account: Some("alice"), device: Some("attacker-phone"), ..Subject::default() };
    let late_check = |limiter: &Limiter| {
        let plan = limiter.plan_check("login", &attacker, T0).expect("login");
        let Begun::Store(pending) = limiter.begin_check(plan, T0) else { panic!("the store decides its scope") };
        limiter.finish_locally(pending, T0).0.into_owned()
    };
    assert!(late_check(&limiter).proceeds(), "nothing locked yet");
    let plan = limiter.plan_check("login", &attacker, T0).expect("login");
    let rules = &plan.facts.route.rules;
    let i = rules.iter().position(|r| r.name == "account_failures").expect("a built-in rule");
    let name = limiter.store_key(&rules[i], plan.rule_keys[i].expect("an unknown device's key"));
    assert!(limiter.learn_known_lockout(&name, 600 * SECOND, None, T0), "the store locked alice");
    // Refused as by a busy store: a device this host does not know may be
    // one another host saw alice log in on, and she retries in a second
    // (the store, answering in time, then knows it), not in ten minutes.
    for _ in 0..3 {
        let verdict = late_check(&limiter);
        let seen = (verdict.decision, verdict.reason, verdict.retry_after_ms);
        assert_eq!(seen, (Decision::Deny, Reason::AttemptsInFlight, 1000), "no rung climbed either");
    }
    // A lockout on the rule for known devices, taken through a host that
    // knows the device (a stolen cookie): refused on this one too.
    let limiter = login_on_three_hosts();
    let plan = limiter.plan_check("login", &attacker, T0).expect("login");
    let rules = &plan.facts.route.rules;
    let i = rules.iter().position(|r| r.name == "known_device_failures").expect("a built-in rule");
    let name = limiter.store_key(&rules[i], plan.rule_keys[i].expect("the store decides its scope: keyed"));
    assert!(limiter.learn_known_lockout(&name, 600 * SECOND, None, T0), "the store locked (alice, the cookie)");
    let verdict = late_check(&limiter);
    assert_eq!((verdict.decision, verdict.reason), (Decision::Deny, Reason::AttemptsInFlight));
}

/// The store's word that a key of the rule for known devices is spent
/// ((account, device): its places in flight at the limit) refuses a late
/// check with that device on a host that knows it, which decides the
/// device's rules itself; a made-up device still passes the account
/// ceiling's word (another host may know it). Before, the first was
/// admitted on the share: the word was skipped for every device.
#[test]
fn the_stores_word_on_a_known_devices_key_refuses_a_late_check_with_it() {
    let limiter = login_on_three_hosts();
    let peer = Some("203.0.113.50".parse().expect("an address"));
    let from = |device| Subject { peer, account: Some("alice"), device: Some(device), ..Subject::default() };
    let success = super::Report { outcome: Some(Outcome::Success), password_digest: None, password_tag: None };
    for device in ["alice-laptop", "alice-tablet"] {
        let (_, begun) = limiter.begin_report("login", &from(device), &success, T0).expect("login");
        drop(begun);
    }
    let late_check = |device| {
        let plan = limiter.plan_check("login", &from(device), T0 + 1).expect("login");
        let Begun::Store(pending) = limiter.begin_check(plan, T0 + 1) else { panic!("the store") };
        limiter.finish_locally(pending, T0 + 1).0.into_owned()
    };
    let spend = |rule: &str, device| {
        let plan = limiter.plan_check("login", &from(device), T0).expect("login");
        let route = plan.facts.route;
        let i = route.rules.iter().position(|r| r.name == rule).expect("a built-in rule");
        let key = plan.rule_keys[i].expect("the store decides its scope: keyed");
        limiter.store_word(route, i, key, Some((Reason::AttemptsInFlight, 30 * SECOND)), T0, T0);
    };
    spend("known_device_failures", "alice-laptop");
    let verdict = late_check("alice-laptop");
    assert_eq!((verdict.decision, verdict.reason), (Decision::Deny, Reason::AttemptsInFlight), "{verdict:?}");
    assert!((29_000..=30_000).contains(&verdict.retry_after_ms), "the store's wait: {}", verdict.retry_after_ms);
    spend("account_failures", "made-up");
    assert!(late_check("made-up").proceeds(), "a made-up device passes the ceiling's word");
    // The ceiling's word (key: the account) spares a device this host
    // knows, as the ceiling does.
    assert!(late_check("alice-tablet").proceeds(), "her known tablet, under the ceiling's word");
}

/// Whether alice's check is refused from memory (a known lockout).
fn locked_from_memory(limiter: &Limiter, now_us: u64) -> bool {
    let plan = limiter.plan_check("t", &account("alice"), now_us).expect("a known route");
    matches!(limiter.begin_check(plan, now_us), Begun::KnownLockout(_))
}

/// Alice locked on a global rule's share, listed for a write-back.
fn listing(limiter: &Limiter) -> super::write_back::WriteBack {
    for _ in 0..3 {
        fail(limiter, "alice", T0 + SECOND);
    }
    limiter.degraded_lockouts(T0 + 2 * SECOND).pop().expect("alice locked")
}

/// An unlock heard while a merge was in flight (the merge ran in the store
/// first, its answer came after the unlock's message) does not bring the
/// lockout back on this host: neither the merge's answer nor a failed
/// merge remembers it, by key or by account. An unlock heard long before
/// the listing holds nothing back.
#[test]
fn an_unlock_heard_while_a_merge_is_in_flight_is_not_undone_by_its_answer() {
    let tag = KeyDeriver::new(&secret()).account_tag("alice");
    let now = T0 + 2 * SECOND + SECOND / 2;
    let hear = |limiter: &Limiter, by_account: bool| {
        if by_account {
            limiter.forget_account_lockouts("t", tag, u64::MAX, now);
        } else {
            assert!(limiter.forget_known_lockout(&store_name_of(limiter, "alice"), u64::MAX, now));
        }
    };
    for by_account in [false, true] {
        let heard = if by_account { "an account's A message" } else { "a U message" };
        let limiter = global_limiter();
        let lockout = listing(&limiter);
        hear(&limiter, by_account);
        assert!(limiter.written_back(&lockout, true, T0 + 2 * SECOND), "cleared here");
        assert!(!locked_from_memory(&limiter, now), "{heard}: the merge's answer undid the unlock");
        let limiter = global_limiter();
        let lockout = listing(&limiter);
        hear(&limiter, by_account);
        limiter.not_written_back(&lockout, T0 + 2 * SECOND);
        assert!(!locked_from_memory(&limiter, now), "{heard}: a failed merge undid the unlock");
    }
    // Control: an unlock heard a minute before the listing.
    let limiter = global_limiter();
    limiter.forget_account_lockouts("t", tag, u64::MAX, T0 - 60 * SECOND);
    let lockout = listing(&limiter);
    assert!(limiter.written_back(&lockout, true, T0 + 2 * SECOND));
    assert!(locked_from_memory(&limiter, T0 + 3 * SECOND), "the store took it: refused from memory");
}

/// The unlocks a host keeps (so that a reply in flight across one does
/// not undo it) undo nothing themselves: one replayed from the log is
/// taken at its stamp, so an unlock made before a lockout leaves the
/// lockout remembered; a flood of forged ones forgets the oldest rather
/// than every lockout; and a reload keeps one memory, so a write-back on
/// the old limiter sees an unlock heard on the new one (a red team's
/// findings on the first version).
#[test]
fn the_unlocks_a_host_keeps_never_make_it_forget_a_lockout() {
    let tag = KeyDeriver::new(&secret()).account_tag("alice");
    let replayed_at = T0 + 2 * SECOND + SECOND / 2;
    // Replayed from the log as the subscription comes back, made long before.
    let limiter = global_limiter();
    let lockout = listing(&limiter);
    limiter.forget_account_lockouts("t", tag, T0 - 30 * SECOND, replayed_at);
    assert!(limiter.forget_known_lockout(&store_name_of(&limiter, "alice"), T0 - 30 * SECOND, replayed_at));
    assert!(limiter.written_back(&lockout, true, T0 + 2 * SECOND));
    assert!(locked_from_memory(&limiter, T0 + 3 * SECOND), "an old unlock's replay forgot a newer lockout");
    // 4,097 forged unlocks of other keys.
    let limiter = global_limiter();
    let lockout = listing(&limiter);
    let alice = store_name_of(&limiter, "alice");
    let (stem, _) = alice.rsplit_once(':').expect("a key");
    for i in 0..4097u128 {
        let forged = format!("{stem}:{:032x}", 0xdead_0000_0000_0000_0000_0000_0000_0000u128 + i);
        assert!(limiter.forget_known_lockout(&forged, u64::MAX, replayed_at), "a forged name parses");
    }
    assert!(limiter.written_back(&lockout, true, T0 + 2 * SECOND));
    assert!(locked_from_memory(&limiter, T0 + 3 * SECOND), "forged unlocks of others suppressed alice's lockout");
    // An unlock heard on the limiter a reload built, a merge answered on
    // the one before.
    let old = global_limiter();
    let lockout = listing(&old);
    let text = format!(
        "[shared]\nurl = \"redis+unix:///nonexistent/tollgate.sock\"\nhosts = 1\n{}",
        rule("scope = \"global\"\n")
    );
    let new = old.reconfigured(&limiter_config(&text), Arc::new(ClassTable::default()), T0 + 2 * SECOND);
    new.forget_account_lockouts("t", tag, u64::MAX, replayed_at);
    assert!(old.written_back(&lockout, true, T0 + 2 * SECOND));
    assert!(!locked_from_memory(&new, T0 + 3 * SECOND), "the unlock heard after the reload was undone");
}

/// A known lockout restored from the state file is held no longer than
/// two windows of its rule from the restart, as one learned any other way:
/// a row written while the clock ran a month ahead (a red team's finding)
/// refused for that month. A row of a rule no longer global goes.
#[test]
fn a_restored_known_lockout_is_held_no_longer_than_two_windows() {
    let limiter = global_limiter();
    let (route, rule, key) = limiter.parse_store_key(&store_name_of(&limiter, "alice")).expect("a rule's entry");
    let Some(Full::Failures(spec)) = route.rules[rule].global else { panic!("a global failure rule") };
    let row = |value| crate::store::PersistedDevice {
        route: "t".into(),
        map: crate::store::DeviceMap::KnownLockouts,
        shard: super::shards::shard_index(key.tuple) as u8,
        id: key.tuple,
        expires_us: T0 + 30 * 24 * 3600 * SECOND,
        value,
    };
    assert_eq!(limiter.restore_known_devices(vec![row(route.rules[rule].tag)], T0), 1);
    assert!(locked_from_memory(&limiter, T0 + 2 * spec.window_us - SECOND), "held two windows");
    assert!(!locked_from_memory(&limiter, T0 + 2 * spec.window_us + 1), "held for the month it claimed");
    let limiter = global_limiter();
    assert_eq!(limiter.restore_known_devices(vec![row(route.rules[rule].tag ^ 0x7f)], T0), 0, "no such rule");
}

/// A write-back goes out a chunk at a time, each chunk aged by the time
/// measured as it is sent, so a later chunk claims no younger failures; a
/// lock that has run out by then is not sent. What a failed merge or an
/// entry counted on since its listing leaves is sent at the next
/// heartbeat (`retry`); a pass with neither asks for none.
#[test]
fn a_write_back_pass_ages_each_chunk_as_it_is_sent_and_says_what_is_left() {
    // (lock left, age) in whole seconds of a merge: its packed argument is
    // window, threshold, lock left, age.
    let seconds = |op: &Op| {
        let at = |from: usize| u64::from_le_bytes(op.args[0][from..from + 8].try_into().expect("8 bytes")) / SECOND;
        (at(12), at(20))
    };
    let limiter = global_limiter();
    for who in ["alice", "bob", "carol"] {
        for _ in 0..3 {
            fail(&limiter, who, T0 + SECOND);
        }
    }
    // Listed 10 s before the three locks end, so one runs out mid-pass.
    let (ends_in, _) = seconds(&limiter.degraded_lockouts(T0 + 2 * SECOND)[0].op(0).expect("locked"));
    let listed = T0 + 2 * SECOND + (ends_in - 10) * SECOND;
    let mut pass = limiter.write_back_pass::<&str>(listed, 1, &Default::default());
    let first = pass.next_chunk(0).expect("three to send");
    let (left, age) = seconds(&first[0]);
    assert_eq!((left, age), (10, ends_in - 9), "from the first failure to the listing");
    pass.answered([Ok(true)]);
    let second = pass.next_chunk(7 * SECOND).expect("two to send");
    assert_eq!(seconds(&second[0]), (left - 7, age + 7), "sent 7 s after the listing");
    pass.answered([Err("the store went away")]);
    assert_eq!(pass.next_chunk((left + 1) * SECOND), Some(Vec::new()), "its lock has run out: nothing sent");
    pass.answered([]);
    assert_eq!(pass.next_chunk(0), None);
    assert_eq!((pass.written, pass.failed, pass.last_error, pass.retry), (1, 1, Some("the store went away"), true));
    let left_over: Vec<String> =
        limiter.degraded_lockouts(listed + SECOND).iter().map(|l| l.op(0).expect("locked").keys[0].clone()).collect();
    assert_eq!(left_over.len(), 2, "the failed merge's and the unsent one's entries stay: {left_over:?}");
    assert!(!left_over.contains(&first[0].keys[0]), "the merge taken is cleared here");

    // An entry counted on after the listing: answered, yet sent again.
    let limiter = global_limiter();
    for _ in 0..3 {
        fail(&limiter, "alice", T0 + SECOND);
    }
    let mut pass = limiter.write_back_pass::<&str>(T0 + 2 * SECOND, 64, &Default::default());
    let merges = pass.next_chunk(0).expect("one to send");
    limiter.report("t", &account("alice"), Outcome::Failure, None, T0 + 3 * SECOND).expect("reported");
    pass.answered(merges.iter().map(|_| Ok(true)));
    assert_eq!((pass.next_chunk(0), pass.written, pass.failed, pass.retry), (None, 1, 0, true));
    let mut pass = limiter.write_back_pass::<&str>(T0 + 4 * SECOND, 64, &Default::default());
    let merges = pass.next_chunk(0).expect("sent again");
    pass.answered(merges.iter().map(|_| Ok(true)));
    assert_eq!((pass.next_chunk(0), pass.written, pass.retry), (None, 1, false), "nothing left");
    assert!(limiter.degraded_lockouts(T0 + 5 * SECOND).is_empty());

    // A pass still sending half a minute after its listing (a slow
    // store) stops: what is left stays listed for the next heartbeat, and
    // is not refused from memory (an unlock the store holds may have
    // cleared it: a red team's finding on the first version).
    let limiter = global_limiter();
    for who in ["alice", "bob"] {
        for _ in 0..3 {
            fail(&limiter, who, T0 + SECOND);
        }
    }
    let mut pass = limiter.write_back_pass::<&str>(T0 + 2 * SECOND, 1, &Default::default());
    let first = pass.next_chunk(0).expect("two to send");
    pass.answered([Ok(true)]);
    assert_eq!(pass.next_chunk(31 * SECOND), None, "past the pass's half minute");
    assert!(pass.retry, "the rest is sent at the next heartbeat");
    let left_over = limiter.degraded_lockouts(T0 + 33 * SECOND);
    assert_eq!(left_over.len(), 1, "the unsent one stays listed");
    let unsent = left_over[0].op(0).expect("locked").keys[0].clone();
    assert_ne!(unsent, first[0].keys[0]);
    let taken = if first[0].keys[0] == store_name_of(&limiter, "alice") { "alice" } else { "bob" };
    let refused: Vec<&str> = ["alice", "bob"]
        .into_iter()
        .filter(|who| {
            let plan = limiter.plan_check("t", &account(who), T0 + 33 * SECOND).expect("a known route");
            matches!(limiter.begin_check(plan, T0 + 33 * SECOND), Begun::KnownLockout(_))
        })
        .collect();
    assert_eq!(refused, [taken], "only the one the store took is refused from memory");
}

/// A pass cut short hands on what it sent; the next sends the lockouts
/// it never reached first, so a store slow for pass after pass, failing
/// the same front merges, still gets every lockout (a red team's note).
#[test]
fn a_pass_after_one_cut_short_sends_what_that_never_reached_first() {
    let limiter = global_limiter();
    for who in ["alice", "bob", "carol"] {
        for _ in 0..3 {
            fail(&limiter, who, T0 + SECOND);
        }
    }
    let mut pass = limiter.write_back_pass::<&str>(T0 + 2 * SECOND, 1, &Default::default());
    let first = pass.next_chunk(0).expect("three to send")[0].keys[0].clone();
    pass.answered([Err("timed out")]);
    assert_eq!(pass.next_chunk(31 * SECOND), None, "cut short");
    assert_eq!(pass.tried, [first.clone()].into_iter().collect());
    let mut next = limiter.write_back_pass::<&str>(T0 + 33 * SECOND, 1, &pass.tried);
    let order: Vec<String> = std::iter::from_fn(|| {
        let chunk = next.next_chunk(0)?;
        next.answered(chunk.iter().map(|_| Err("timed out")));
        Some(chunk[0].keys[0].clone())
    })
    .collect();
    assert_eq!(order.len(), 3);
    assert_eq!(order[2], first, "the one tried before goes last: {order:?}");
    assert!(next.tried.is_empty(), "a pass not cut short hands nothing on");
}

/// A merge that failed does not bring back, as a known lockout, one an
/// operator unlocked on another host after the share's entry began: the
/// store takes that unlock over the merge (its `ua` is newer), and so does
/// this host, even when the unlock was heard before the listing.
#[test]
fn a_failed_merge_does_not_undo_an_unlock_heard_before_its_listing() {
    let limiter = global_limiter();
    for _ in 0..3 {
        fail(&limiter, "alice", T0 + SECOND);
    }
    assert!(limiter.forget_known_lockout(&store_name_of(&limiter, "alice"), u64::MAX, T0 + 2 * SECOND));
    let listed = limiter.degraded_lockouts(T0 + 3 * SECOND);
    limiter.not_written_back(&listed[0], T0 + 3 * SECOND);
    assert!(!locked_from_memory(&limiter, T0 + 4 * SECOND), "the unlock heard before the listing was undone");
    // An unlock heard before the entry began counting holds nothing back.
    let limiter = global_limiter();
    assert!(limiter.forget_known_lockout(&store_name_of(&limiter, "alice"), u64::MAX, T0));
    for _ in 0..3 {
        fail(&limiter, "alice", T0 + SECOND);
    }
    let listed = limiter.degraded_lockouts(T0 + 3 * SECOND);
    limiter.not_written_back(&listed[0], T0 + 3 * SECOND);
    assert!(locked_from_memory(&limiter, T0 + 4 * SECOND), "a failed merge is refused from memory");
    // An entry begun longer ago than the unlocks heard are kept may have
    // lost to one no longer kept: not refused from memory, still listed.
    let limiter = global_limiter();
    for at in [1, 1, 61, 61] {
        fail(&limiter, "alice", T0 + at * SECOND);
    }
    let late = T0 + 62 * SECOND;
    let listed = limiter.degraded_lockouts(late);
    assert!(!listed.is_empty(), "still locked on the share");
    limiter.not_written_back(&listed[0], late);
    assert!(!locked_from_memory(&limiter, late + SECOND), "an entry older than the unlocks kept was remembered");
    assert_eq!(limiter.degraded_lockouts(late + SECOND).len(), 1, "listed again");
}

/// A write-back acts on the entry it listed, not on one begun after an
/// operator's unlock on this host: a failed merge does not bring the
/// unlocked lockout back as a known one, and an answered merge does not
/// clear a new lockout that happens to count as many failures.
#[test]
fn a_write_back_never_acts_on_an_entry_begun_after_an_unlock() {
    let limiter = global_limiter();
    for _ in 0..3 {
        fail(&limiter, "alice", T0 + SECOND);
    }
    let listed = limiter.degraded_lockouts(T0 + 2 * SECOND);
    limiter.unlock("t", "alice", None, T0 + 3 * SECOND).expect("unlocked");
    // A late failure after the unlock, then the merge fails.
    limiter.report("t", &account("alice"), Outcome::Failure, None, T0 + 4 * SECOND).expect("reported");
    limiter.not_written_back(&listed[0], T0 + 2 * SECOND);
    let plan = limiter.plan_check("t", &account("alice"), T0 + 5 * SECOND).expect("a known route");
    let begun = limiter.begin_check(plan, T0 + 5 * SECOND);
    assert!(!matches!(begun, Begun::KnownLockout(_)), "the unlock stands: not refused from memory");
    // Two more: a new lockout of as many failures as the one listed.
    for _ in 0..2 {
        limiter.report("t", &account("alice"), Outcome::Failure, None, T0 + 5 * SECOND).expect("reported");
    }
    assert!(!limiter.written_back(&listed[0], true, T0 + 2 * SECOND), "another entry");
    let left: Vec<String> =
        limiter.degraded_lockouts(T0 + 6 * SECOND).iter().map(|l| l.op(0).expect("locked").keys[0].clone()).collect();
    assert_eq!(left, [store_name_of(&limiter, "alice")], "the new lockout is written back next time");
}

/// Observation is given what the decision derived (`Facts`): the client's
/// prefix as the rules resolved it, the account's tag, the device's digest
/// and whether this host knows the device, as the limiter's own
/// derivations give them; digests no rule needed are derived for the
/// decision log all the same.
#[test]
fn facts_give_observation_what_the_decision_derived() {
    let limiter = limiter(
        "[responses]\njitter_percent = 0\n[routes.t]\nknown_device_ttl_secs = 86400\n\
         [routes.t.rules.per_account]\nkind = \"failures\"\nkey = [\"account\"]\nthreshold = 3\n\
         window_secs = 60\nmonitor = true\n",
    );
    let peer = Some("2001:db8::1".parse().expect("an address"));
    let from = |device| Subject { peer, account: Some("alice"), device: Some(device), ..Subject::default() };
    let report = |device, outcome| limiter.report("t", &from(device), outcome, None, T0).expect("reported");
    report("laptop", Outcome::Success);
    for _ in 0..3 {
        report("phone", Outcome::Failure);
    }
    for (device, known) in [("laptop", true), ("phone", false)] {
        let subject = Subject { tenant: Some("acme"), ..from(device) };
        let plan = limiter.plan_check("t", &subject, T0 + SECOND).expect("planned");
        let facts = plan.facts();
        let verdict = limiter.decide_check(plan, T0 + SECOND);
        assert_eq!(verdict.reason, Reason::MonitorTooManyFailures);
        let refused = facts.describe_refusal(&subject, &verdict, "check", T0 + SECOND);
        let device_digest = limiter.keys.component(Component::Device, device.as_bytes());
        assert_eq!(refused.prefix.map(|p| p.to_string()).as_deref(), Some("2001:db8::/64"));
        assert_eq!(refused.account, Some(limiter.account_tag("alice")));
        assert_eq!(refused.device, Some(u64::from_le_bytes(device_digest[..8].try_into().expect("8 bytes"))));
        assert_eq!((refused.known_device, refused.rule.as_ref()), (known, "t/per_account"), "{device}");
        let attempt = crate::decision_log::Attempt::check(None);
        let record = facts.decision_record(&subject, &attempt, &verdict, T0 + SECOND);
        assert_eq!(record.account, Some(limiter.keys.component(Component::Account, b"alice")));
        assert_eq!(record.device, Some(device_digest));
        assert_eq!(record.tenant, Some(limiter.keys.component(Component::Tenant, b"acme")));
        assert_eq!(record.client_id, None);
    }
}

/// A route of the most rules config allows: their answers outgrow the
/// room kept on the stack for them, and each is still counted and heard.
#[test]
fn a_route_of_the_most_rules_allowed_decides_by_every_one_of_them() {
    let mut config = String::from("[responses]\njitter_percent = 0\n");
    for i in 0..crate::config::RULES_PER_ROUTE_MAX {
        let threshold = if i == crate::config::RULES_PER_ROUTE_MAX - 1 { 2 } else { 100 };
        config += &format!(
            "[routes.t.rules.r{i:02}]\nkind = \"failures\"\nkey = [\"account\"]\nthreshold = {threshold}\nwindow_secs = 60\n"
        );
    }
    let limiter = limiter(&config);
    let first = check(&limiter, "alice", T0);
    assert!(first.proceeds());
    assert_eq!((first.remaining, &*first.rule), (1, "r15"), "the tightest rule is the last one");
    limiter.report("t", &account("alice"), Outcome::Failure, None, T0).expect("a known route");
    fail(&limiter, "alice", T0 + 1);
    let refused = check(&limiter, "alice", T0 + 2);
    assert_eq!((refused.decision, &*refused.rule), (Decision::Deny, "r15"), "{refused:?}");
    assert_eq!(figures(&check(&limiter, "bob", T0 + 2)).3, 1, "another account is untouched");
}

#[test]
fn the_shipped_routes_plan_checks_and_reports_without_spilling_their_keys() {
    let limiter = limiter("");
    let peer = Some("203.0.113.9".parse().expect("an address"));
    let subject = Subject {
        peer,
        account: Some("alice"),
        device: Some("laptop"),
        tenant: Some("acme"),
        client_id: Some("app"),
        ..Subject::default()
    };
    for route in &limiter.routes {
        assert!(route.rules.len() <= super::subject::RULE_KEYS_INLINE, "route {} has more rules than fit", route.name);
        let plan = limiter.plan_check(&route.name, &subject, T0).expect("plans");
        assert!(!plan.rule_keys.spilled(), "route {}'s check keys spill to the heap", route.name);
        let report = super::Report { outcome: Some(Outcome::Failure), ..super::Report::default() };
        let prepared = limiter.prepare_report(&route.name, &subject, &report, T0).expect("prepares");
        assert!(!prepared.rule_keys.spilled(), "route {}'s report keys spill to the heap", route.name);
    }
}

/// One global failure rule, 5 a minute on the account, on 3 hosts: a
/// share of 2.
fn three_host_limiter() -> Limiter {
    limiter(
        "[shared]\nurl = \"redis+unix:///nonexistent/tollgate.sock\"\nhosts = 3\n\
         [responses]\njitter_percent = 0\n\
         [routes.t.rules.per_account]\nkind = \"failures\"\nkey = [\"account\"]\nthreshold = 5\n\
         window_secs = 60\nscope = \"global\"\ncleared_by_success = true\n",
    )
}

/// A check on route `t` for `who`, begun and waiting for the store.
fn store_check<'l>(limiter: &'l Limiter, who: &str, now_us: u64) -> super::AwaitingStore<'l> {
    let plan = limiter.plan_check("t", &account(who), now_us).expect("a known route");
    let Begun::Store(pending) = limiter.begin_check(plan, now_us) else { panic!("a global rule: the store") };
    pending
}

/// The store's reply to a failure report on `three_host_limiter`'s rule:
/// not locked, `current` failures in window 100.
fn failure_reply(current: i64) -> crate::shared::script::Reply {
    crate::shared::script::Reply {
        ints: [[0, T0 as i64, 0, 0].as_slice(), &[100, 0, current, 0, 0, 0, WINDOW as i64]].concat(),
        strings: vec![],
    }
}

/// Failure reports sent together are answered one by one, each reply
/// showing the store's count as its report made it, and read in any
/// order: the reports still on their way stay counted here. Before, the first reply cut the
/// count to 1, and a host that took 49 of 50 through the store had 16 of
/// its 17 left (a red team's finding).
#[test]
fn replies_to_failure_reports_sent_together_keep_the_ones_still_waiting() {
    let limiter = three_host_limiter();
    let sent = failure_reports_sent(&limiter, 2);
    // Read in the other order, as replies on two connections may be.
    for (n, pending) in sent.into_iter().enumerate().rev() {
        assert!(limiter.finish_stored(pending, &failure_reply(n as i64 + 1), T0 + 3).is_ok(), "read");
    }
    let plan = limiter.plan_check("t", &account("alice"), T0 + 4).expect("a known route");
    let Begun::Store(pending) = limiter.begin_check(plan, T0 + 4) else { panic!("a global rule: the store") };
    let (verdict, _) = limiter.finish_locally(pending, T0 + 4);
    assert_eq!(verdict.reason, Reason::AttemptsInFlight, "the share used by the store's two");
}

/// `n` failure reports on alice's account, begun a microsecond apart from
/// T0, each waiting for the store.
fn failure_reports_sent(limiter: &Limiter, n: u64) -> Vec<super::AwaitingStore<'_>> {
    (0..n)
        .map(|n| {
            let report = super::Report { outcome: Some(Outcome::Failure), ..super::Report::default() };
            let (_, begun) = limiter.begin_report("t", &account("alice"), &report, T0 + n).expect("a known route");
            let Begun::Store(pending) = begun else { panic!("a global rule: the store") };
            pending
        })
        .collect()
}

/// A failure report whose connection closed before the store replied is
/// dropped unanswered: it stops waiting, though the store (sent it as an
/// orphan) still counts it. Before, its count kept `waiting` one too high,
/// and the store's word that the failures were gone (a success through
/// another host) left one of the share used while the store was away.
#[test]
fn a_failure_report_dropped_before_the_stores_reply_stops_waiting() {
    let limiter = three_host_limiter();
    let mut sent = failure_reports_sent(&limiter, 2).into_iter();
    drop(sent.next());
    // The store's reply to the other: no failures left on the key.
    assert!(limiter.finish_stored(sent.next().unwrap(), &failure_reply(0), T0 + 2).is_ok(), "read");
    let unanswered = |now_us: u64| {
        let plan = limiter.plan_check("t", &account("alice"), now_us).expect("a known route");
        let Begun::Store(pending) = limiter.begin_check(plan, now_us) else { panic!("a global rule: the store") };
        limiter.finish_locally(pending, now_us).0.into_owned()
    };
    assert!(unanswered(T0 + 3).proceeds() && unanswered(T0 + 4).proceeds(), "the whole share: nothing waits");
}

/// A host's share of a global failure rule (ceil(5 / 3) = 2) counts the
/// failures its reports counted in the store. Before, a host whose guesses
/// the store had admitted still had its whole share when the store was
/// late or away: 5 + 3 x 2 over three hosts, 9 seen. A success clears
/// the count as it clears the failures; so does an unlock.
#[test]
fn a_hosts_share_counts_the_failures_its_reports_counted_in_the_store() {
    let limiter = three_host_limiter();
    let report = |outcome, now_us| {
        let report = super::Report { outcome: Some(outcome), password_digest: None, password_tag: None };
        let (_, begun) = limiter.begin_report("t", &account("alice"), &report, now_us).expect("a known route");
        let Begun::Store(pending) = begun else { panic!("a global rule: the store") };
        pending
    };
    // The store's reply to a failure report: not locked, `current`
    // failures in window 100.
    let counted = |current: i64, now_us: u64| {
        let reply = failure_reply(current);
        assert!(limiter.finish_stored(report(Outcome::Failure, now_us), &reply, now_us).is_ok(), "read");
    };
    let unanswered = |now_us: u64| {
        let plan = limiter.plan_check("t", &account("alice"), now_us).expect("a known route");
        let Begun::Store(pending) = limiter.begin_check(plan, now_us) else { panic!("a global rule: the store") };
        limiter.finish_locally(pending, now_us).0.into_owned()
    };
    let succeeded = |now_us: u64| drop(limiter.finish_locally(report(Outcome::Success, now_us), now_us));
    counted(1, T0);
    assert!(unanswered(T0 + 1).proceeds(), "one of the share left");
    let refused = unanswered(T0 + 2);
    assert_eq!((refused.decision, refused.reason), (Decision::Deny, Reason::AttemptsInFlight), "its place and 1");
    succeeded(T0 + 3);
    assert!(unanswered(T0 + 4).proceeds() && unanswered(T0 + 5).proceeds(), "a success clears the count");
    succeeded(T0 + 6);
    succeeded(T0 + 7);
    counted(1, T0 + 8);
    counted(2, T0 + 9);
    assert!(!unanswered(T0 + 10).proceeds(), "the share used by the store's two");
    // An unlock heard from another host (anyone who can publish) leaves
    // it; one made here clears it.
    let (tag, name) = (limiter.keys.account_tag("alice"), store_name_of(&limiter, "alice"));
    limiter.forget_account_lockouts("t", tag, u64::MAX, T0 + 11);
    assert!(limiter.forget_known_lockout(&name, u64::MAX, T0 + 11));
    assert!(!unanswered(T0 + 11).proceeds(), "an unlock heard leaves the count");
    limiter.forget_account_counts_unlocked("t", "alice");
    assert!(unanswered(T0 + 12).proceeds(), "an account-wide unlock made here clears the count");
    succeeded(T0 + 13);
    counted(1, T0 + 14);
    counted(2, T0 + 15);
    assert!(!unanswered(T0 + 16).proceeds());
    limiter.forget_count_unlocked(&name);
    assert!(unanswered(T0 + 18).proceeds(), "an unlock of the key made here clears the count");
    // The store's count caps this host's: a success through another host
    // cleared her failures there, and this failure is the store's one.
    succeeded(T0 + 19);
    counted(1, T0 + 20);
    counted(2, T0 + 21);
    counted(1, T0 + 22);
    assert!(unanswered(T0 + 23).proceeds(), "no more than the store holds");
    // A failure report still on its way to the store counts already: its
    // place on the share went when it was sent.
    succeeded(T0 + 24);
    let waiting = report(Outcome::Failure, T0 + 25);
    assert!(unanswered(T0 + 26).proceeds());
    assert!(!unanswered(T0 + 27).proceeds(), "a failure on its way to the store, and a place");
    drop(limiter.finish_locally(waiting, T0 + 28));
}

/// Checks answered side by side on the share each see what the store
/// counted and the places the others took: the count comes off the share
/// under the lock the place is taken with. Before, each could pass the
/// count before any took its place, and a host with one failure counted
/// in the store admitted its whole share (2 of 2) again.
#[test]
fn checks_side_by_side_on_the_share_never_pass_what_the_store_counted() {
    let limiter = three_host_limiter();
    let checks_at_once = 8;
    let mut admitted_most = 0;
    for n in 0..2000 {
        let who = format!("user{n}");
        let report = super::Report { outcome: Some(Outcome::Failure), password_digest: None, password_tag: None };
        let (_, begun) = limiter.begin_report("t", &account(&who), &report, T0).expect("a known route");
        let Begun::Store(pending) = begun else { panic!("a global rule: the store") };
        assert!(limiter.finish_stored(pending, &failure_reply(1), T0).is_ok(), "one failure counted in the store");
        let barrier = std::sync::Barrier::new(checks_at_once);
        let admitted = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..checks_at_once)
                .map(|_| {
                    scope.spawn(|| {
                        let pending = store_check(&limiter, &who, T0 + 1);
                        barrier.wait();
                        limiter.finish_locally(pending, T0 + 1).0.proceeds()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().expect("no panic")).filter(|&admitted| admitted).count()
        });
        admitted_most = admitted_most.max(admitted);
    }
    assert_eq!(admitted_most, 1, "a share of 2 with 1 counted in the store admits 1 at a time");
}

/// A failure report on a share's key, side by side with checks there:
/// the report counts its failure for the store before it gives its place
/// back, and (the store away) records it on the share before it takes it
/// off the count, and a check reads the count under the share's lock. A
/// check between sees the failure once or twice, never not at all.
/// Before, a check in either gap found one failure and one place on a
/// share of two and was admitted (a red team's finding: up to half the
/// trials).
#[test]
fn a_failure_report_beside_checks_on_the_share_is_never_missed() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let limiter = three_host_limiter();
    let mut let_through = 0;
    for n in 0..2000 {
        let who = format!("reported{n}");
        let check = || limiter.finish_locally(store_check(&limiter, &who, T0), T0).0.proceeds();
        assert!(check() && check() && !check(), "two places fill the share");
        let (reported, barrier) = (AtomicBool::new(false), std::sync::Barrier::new(2));
        let admitted = std::thread::scope(|scope| {
            let checker = scope.spawn(|| {
                barrier.wait();
                let mut admitted = 0;
                loop {
                    let last = reported.load(Relaxed);
                    admitted += usize::from(check());
                    if last {
                        break admitted;
                    }
                }
            });
            barrier.wait();
            for _ in 0..n % 64 {
                std::hint::spin_loop();
            }
            let report = super::Report { outcome: Some(Outcome::Failure), password_digest: None, password_tag: None };
            let (_, begun) = limiter.begin_report("t", &account(&who), &report, T0).expect("a known route");
            let Begun::Store(pending) = begun else { panic!("a global rule: the store") };
            drop(limiter.finish_locally(pending, T0));
            reported.store(true, Relaxed);
            checker.join().expect("no panic")
        });
        let_through += usize::from(admitted > 0);
    }
    assert_eq!(let_through, 0, "trials of 2000 with a check past a share of one failure and one place");
}

/// The store's reply to a check on `three_host_limiter`'s rule: admitted
/// or not, and its entry as found (window 100, `current` failures,
/// `in_flight` places).
fn check_reply(admitted: bool, current: i64, in_flight: i64) -> crate::shared::script::Reply {
    let entry = [100, 0, current, in_flight, 30 * SECOND as i64 * in_flight, 0, WINDOW as i64];
    let head = [i64::from(admitted), T0 as i64, i64::from(!admitted)];
    crate::shared::script::Reply { ints: [head.as_slice(), &entry].concat(), strings: vec![] }
}

/// Guesses the store admitted through a host, still in flight, count
/// against its share until their reports (or the attempt timeout). Before,
/// four in flight through one host left its share whole when the store
/// went away: 4 + 2 + 2 + 2 = 10 against the bound of 9 (a red team's
/// finding). Their abandons, reported while the store is away, each end
/// one attempt: the share then holds 2 in flight at most (before, each
/// freed a place of a guess on the share: 6 at once).
#[test]
fn guesses_the_store_admitted_count_against_the_share_while_in_flight() {
    let limiter = three_host_limiter();
    let check = |now_us: u64| store_check(&limiter, "alice", now_us);
    for k in 0..4u64 {
        let stored = limiter.finish_stored(check(T0 + k), &check_reply(true, 0, k as i64), T0 + k);
        assert!(stored.ok().expect("read").verdict.proceeds(), "the store admits guess {k}");
    }
    let on_share = |now_us: u64| limiter.finish_locally(check(now_us), now_us).0.proceeds();
    assert!(!on_share(T0 + 10), "four in flight through this host fill its share of 2");
    let mut in_flight_on_share = 0;
    for k in 0..4u64 {
        let abandon = super::Report { outcome: None, password_digest: None, password_tag: None };
        let (_, begun) = limiter.begin_report("t", &account("alice"), &abandon, T0 + 20 + k).expect("a known route");
        let Begun::Store(pending) = begun else { panic!("a global rule: the store") };
        drop(limiter.finish_locally(pending, T0 + 20 + k));
        in_flight_on_share += usize::from(on_share(T0 + 20 + k));
    }
    assert_eq!(in_flight_on_share, 2, "after the four abandons, the share's 2 and no more");
    // Unreported, they lapse with their places in the store.
    let bob = |now_us: u64| store_check(&limiter, "bob", now_us);
    for k in 0..4u64 {
        assert!(limiter.finish_stored(bob(T0 + k), &check_reply(true, 0, k as i64), T0 + k).is_ok());
    }
    let lapsed = T0 + 3 + limiter.attempt_timeout_us;
    assert!(!limiter.finish_locally(bob(lapsed - 1), lapsed - 1).0.proceeds(), "in flight until then");
    assert!(limiter.finish_locally(bob(lapsed), lapsed).0.proceeds(), "lapsed with their places in the store");
}

/// Checks the store admitted and nobody reported, one every half attempt
/// timeout, never hold more of the share than the store holds places:
/// each lapses there in its turn, while here they lapse together after
/// the newest. Before, they piled up here (20 against a share of 2), and
/// the owner was refused on it for a whole outage (a red team's finding).
#[test]
fn unreported_checks_the_store_admitted_never_pile_up_on_the_share() {
    let limiter = three_host_limiter();
    let check = |now_us: u64| store_check(&limiter, "alice", now_us);
    let half = limiter.attempt_timeout_us / 2;
    for k in 0..20u64 {
        let at = T0 + k * half;
        assert!(limiter.finish_stored(check(at), &check_reply(true, 0, k.min(1) as i64), at).is_ok());
    }
    let last = T0 + 19 * half;
    // The two the store still holds end; nothing else is in flight.
    for n in 1..=2 {
        let abandon = super::Report { outcome: None, password_digest: None, password_tag: None };
        let (_, begun) = limiter.begin_report("t", &account("alice"), &abandon, last + n).expect("a known route");
        let Begun::Store(pending) = begun else { panic!("a global rule: the store") };
        drop(limiter.finish_locally(pending, last + n));
    }
    assert!(limiter.finish_locally(check(last + 3), last + 3).0.proceeds(), "the share is free again");
}

/// Replies are read in any order: an older one, showing fewer places in
/// the store, does not lower what this host counts in flight. Before, two
/// guesses admitted together counted as one when the later reply was read
/// first, and the share had a place too many (a red team's finding).
#[test]
fn an_older_reply_read_last_does_not_lower_the_count_in_flight() {
    let limiter = three_host_limiter();
    let check = |now_us: u64| store_check(&limiter, "alice", now_us);
    let (first, second) = (check(T0), check(T0));
    // One batch: the second op found the first's place; its reply is read first.
    assert!(limiter.finish_stored(second, &check_reply(true, 0, 1), T0).is_ok());
    assert!(limiter.finish_stored(first, &check_reply(true, 0, 0), T0).is_ok());
    let abandon = super::Report { outcome: None, password_digest: None, password_tag: None };
    let (_, begun) = limiter.begin_report("t", &account("alice"), &abandon, T0 + 1).expect("a known route");
    let Begun::Store(pending) = begun else { panic!("a global rule: the store") };
    drop(limiter.finish_locally(pending, T0 + 1));
    assert!(limiter.finish_locally(check(T0 + 2), T0 + 2).0.proceeds(), "one of the two ended: one place");
    assert!(!limiter.finish_locally(check(T0 + 3), T0 + 3).0.proceeds(), "the other still in flight");
}

/// A report that counts no failure (a repeated password) ends the attempt
/// the store admitted, not the place of a guess on the share. Before, it
/// settled that place, and the share admitted past what it held (a red
/// team's finding).
#[test]
fn an_uncounted_report_ends_the_stores_attempt_not_a_guess_on_the_share() {
    let limiter = limiter(
        "[shared]\nurl = \"redis+unix:///nonexistent/tollgate.sock\"\nhosts = 3\n\
         [responses]\njitter_percent = 0\n[routes.t]\nrecent_passwords = 4\n\
         [routes.t.rules.per_account]\nkind = \"failures\"\nkey = [\"account\"]\nthreshold = 5\n\
         window_secs = 60\nscope = \"global\"\ncleared_by_success = true\n",
    );
    let check = |now_us: u64| store_check(&limiter, "alice", now_us);
    let report = |now_us: u64| {
        let report =
            super::Report { outcome: Some(Outcome::Failure), password_digest: Some([7; 16]), password_tag: None };
        let (_, begun) = limiter.begin_report("t", &account("alice"), &report, now_us).expect("a known route");
        let Begun::Store(pending) = begun else { panic!("a global rule: the store") };
        pending
    };
    let on_share = |now_us: u64| limiter.finish_locally(check(now_us), now_us).0.proceeds();
    assert!(limiter.finish_stored(report(T0), &failure_reply(1), T0).is_ok(), "a wrong password, counted");
    let repeat = limiter.finish_stored(check(T0 + 1), &check_reply(true, 1, 0), T0 + 1);
    assert!(repeat.ok().expect("read").verdict.proceeds(), "its repeat, admitted by the store");
    assert!(!on_share(T0 + 2), "a failure and an attempt in flight: the share of 2 is used");
    assert!(limiter.finish_stored(report(T0 + 3), &failure_reply(1), T0 + 3).is_ok(), "the repeat, not counted");
    assert!(on_share(T0 + 4), "its attempt ended: one left");
    assert!(!on_share(T0 + 5), "and no more while that guess is in flight");
}

/// A check the store answers late is counted on this host's share, which
/// knows nothing of what the store admitted. The store's word that the
/// key is spent, in a timely reply or one heard late, refuses it there
/// until a later word shows room, a success, or two seconds; a late
/// check's reply gives back the place its op took; a late report's
/// lockout is remembered and published. Before, the share admitted each
/// such check: 9 guesses of 5 over three hosts with the store late in
/// 400 ms stalls.
#[test]
fn the_stores_word_that_a_key_is_spent_refuses_a_late_check_until_it_has_room() {
    use super::spent_keys::SPENT_WORD_KEPT_US;
    use crate::shared::script::Reply;
    let limiter = global_limiter();
    let begin = |now_us: u64| store_check(&limiter, "alice", now_us);
    let late_check = |now_us: u64| limiter.finish_locally(begin(now_us), now_us).0.into_owned();
    // The store's entry: window 100 of one minute, `current` failures and
    // `in_flight` places (the first lapsing in 30 s).
    let entry =
        |current: i64, in_flight: i64| [100, 0, current, in_flight, 30 * SECOND as i64 * in_flight, 0, WINDOW as i64];
    let check_reply = |admitted: i64, refuses: i64, current, in_flight| Reply {
        ints: [[admitted, T0 as i64, refuses].as_slice(), &entry(current, in_flight)].concat(),
        strings: vec![],
    };
    // A timely check the store admitted into the last room (1 failure, 1
    // other place, its own): late checks are refused as the store would.
    let stored = limiter.finish_stored(begin(T0), &check_reply(1, 0, 1, 1), T0).ok().expect("read");
    assert!(stored.verdict.proceeds());
    let refused = late_check(T0 + 1);
    assert_eq!((refused.decision, refused.reason), (Decision::Deny, Reason::AttemptsInFlight));
    assert!(refused.retry_after_ms >= 29_000, "the store's wait: {}", refused.retry_after_ms);
    // Its success gives the room back, whether or not the store hears.
    let report = |outcome, now_us| {
        let report = super::Report { outcome: Some(outcome), password_digest: None, password_tag: None };
        let (_, begun) = limiter.begin_report("t", &account("alice"), &report, now_us).expect("a known route");
        let Begun::Store(pending) = begun else { panic!("a global rule: the store") };
        pending
    };
    let _ = limiter.finish_locally(report(Outcome::Success, T0 + 2), T0 + 2);
    assert!(late_check(T0 + 3).proceeds(), "no word of room after a success");
    // A late check's reply, heard: refused (1 failure, 2 places), it gives
    // nothing back and marks the key; admitted, it gives its place back,
    // and its word of room clears the mark.
    let echo = begin(T0 + 4).echo();
    let heard = limiter.heard_late(&echo, &check_reply(0, 1, 1, 2), T0 + 5);
    assert!(heard.give_back.is_none() && heard.locked.is_empty());
    let refused = late_check(T0 + 6);
    assert_eq!((refused.decision, refused.reason), (Decision::Deny, Reason::AttemptsInFlight), "heard late");
    let heard = limiter.heard_late(&echo, &check_reply(1, 0, 0, 0), T0 + 7);
    let give_back = heard.give_back.expect("a place to give back");
    assert_eq!((give_back.kind, give_back.keys.len()), (b'X', 1), "its one place");
    assert!(late_check(T0 + 8).proceeds(), "a later word of room");
    // A word lasts two seconds.
    let _ = limiter.heard_late(&echo, &check_reply(0, 1, 1, 2), T0 + 9);
    assert!(!late_check(T0 + 9 + SPENT_WORD_KEPT_US - 1).proceeds());
    assert!(late_check(T0 + 9 + SPENT_WORD_KEPT_US).proceeds(), "for two seconds");
    // A late report that locked the key: remembered, and told to the
    // other hosts.
    let pending = report(Outcome::Failure, T0 + 8);
    let report_reply = Reply { ints: [[0, T0 as i64, 0, 1].as_slice(), &entry(3, 0)].concat(), strings: vec![] };
    let heard = limiter.heard_late(&pending.echo(), &report_reply, T0 + 9);
    assert_eq!(heard.locked.len(), 2, "stamped and unstamped: {:?}", heard.locked);
    assert!(locked_from_memory(&limiter, T0 + 10), "the store's lockout, refused from memory");
}

/// What a host counted for the store, saved at a stop
/// (`save_store_counts`'s rows), comes back at the next start: its
/// failures for their window, its attempts in flight for the attempt
/// timeout, whatever later end a row claims (a month ahead here). A row
/// of no rule of the route goes.
#[test]
fn store_counts_saved_at_a_stop_come_back_for_their_own_time_only() {
    let limiter = three_host_limiter();
    let (route, i, key) = limiter.parse_store_key(&store_name_of(&limiter, "alice")).expect("a rule's entry");
    let rule = &route.rules[i];
    for _ in 0..3 {
        limiter.count_for_store(route, rule, key, WINDOW, T0);
    }
    limiter.count_admitted(route, rule, key, (T0, 1), T0);
    assert_eq!(limiter.counted_in_store(route, rule, key, T0), Some(4));
    let rows = |value_xor: u16| {
        let mut rows = saved_store_counts(route, T0);
        for row in &mut rows {
            (row.expires_us, row.value) = (T0 + 30 * 24 * 3600 * SECOND, row.value ^ value_xor);
        }
        rows
    };
    let restarted = three_host_limiter();
    let (route, i, key) = restarted.parse_store_key(&store_name_of(&restarted, "alice")).expect("a rule's entry");
    let rule = &route.rules[i];
    let at = T0 + SECOND;
    restarted.restore_known_devices(rows(0), at);
    assert_eq!(restarted.counted_in_store(route, rule, key, at), Some(4), "three failures, one in flight");
    let timeout = restarted.attempt_timeout_us;
    assert_eq!(restarted.counted_in_store(route, rule, key, at + timeout + 1), Some(3), "the attempt lapsed");
    assert_eq!(restarted.counted_in_store(route, rule, key, at + WINDOW - 1), Some(3));
    assert_eq!(restarted.counted_in_store(route, rule, key, at + WINDOW + 1).unwrap_or(0), 0, "not the month");
    // The tag's bits in the row fitting no rule of the route.
    let restarted = three_host_limiter();
    restarted.restore_known_devices(rows(0b1110), at);
    let (route, i, key) = restarted.parse_store_key(&store_name_of(&restarted, "alice")).expect("a rule's entry");
    assert_eq!(restarted.counted_in_store(route, &route.rules[i], key, at), None, "no such rule");
}

/// Two global failure rules whose tags share the low bits a saved count
/// keeps of its rule: each rule's count comes back as its own. Filed
/// under the first rule that fit, the second's was found by no lookup.
#[test]
fn saved_store_counts_of_rules_sharing_tag_bits_come_back_as_their_own() {
    let names: Vec<String> = (0..64).map(|i| format!("r{i}")).collect();
    let tag = |name: &str| super::build::rule_tag("t", name) & 0xf;
    let (first, second) = names
        .iter()
        .enumerate()
        .find_map(|(i, a)| names[i + 1..].iter().find(|b| tag(b) == tag(a)).map(|b| (a.clone(), b.clone())))
        .expect("17 names share 4 bits");
    let rules = [&first, &second].map(|name| {
        format!(
            "[routes.t.rules.{name}]\nkind = \"failures\"\nkey = [\"account\"]\nthreshold = 5\n\
             window_secs = 60\nscope = \"global\"\n"
        )
    });
    let config =
        format!("[shared]\nurl = \"redis+unix:///nonexistent/tollgate.sock\"\nhosts = 3\n{}{}", rules[0], rules[1]);
    let limiter = self::limiter(&config);
    let plan = limiter.plan_check("t", &account("alice"), T0).expect("a known route");
    let keys = plan.rule_keys.clone();
    let at =
        |route: &super::route::Route, name: &str| route.rules.iter().position(|r| r.name == *name).expect("a rule");
    let route = plan.facts.route;
    let (i, j) = (at(route, &first), at(route, &second));
    for _ in 0..2 {
        limiter.count_for_store(route, &route.rules[j], keys[j].expect("keyed"), WINDOW, T0);
    }
    limiter.count_for_store(route, &route.rules[i], keys[i].expect("keyed"), WINDOW, T0);
    let rows = saved_store_counts(route, T0);
    let restarted = self::limiter(&config);
    restarted.restore_known_devices(rows, T0 + SECOND);
    let plan = restarted.plan_check("t", &account("alice"), T0).expect("a known route");
    let route = plan.facts.route;
    let counted = |k: usize| restarted.counted_in_store(route, &route.rules[k], keys[k].expect("keyed"), T0 + SECOND);
    assert_eq!((counted(i), counted(j)), (Some(1), Some(2)), "{first} and {second}");
}

/// Route `t`'s store counts as a stop saves them (`save_store_counts`).
fn saved_store_counts(route: &super::route::Route, now_us: u64) -> Vec<crate::store::PersistedDevice> {
    let mut rows = Vec::new();
    for (shard, table) in route.store_counted.as_ref().expect("a shared route").each().enumerate() {
        for (id, slot) in table.live(now_us) {
            rows.push(crate::store::PersistedDevice {
                route: "t".into(),
                map: crate::store::DeviceMap::StoreCounted,
                shard: shard as u8,
                id,
                expires_us: slot.expires_us,
                value: slot.value.row_value(now_us),
            });
        }
    }
    rows
}
