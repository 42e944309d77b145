//! Shared mode's busy refusals as the attacker who wants a user kept
//! out would use them: one real daemon on a real redis-server, default
//! `[shared]` settings, floods, and stalls that keep the store late
//! (`RedisServer::stall`: floods alone sometimes left it in time for
//! every check a test judged). A late check in
//! a burst on its keys is refused as busy while the store is there; none
//! of these floods may keep her refused for longer than `busy_max_ms`.
//! The guesser's side: `shared_burst.rs`.

mod common;

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::shared::*;
use common::*;
use tollgate::client::{Client, ClientConfig};
use tollgate::protocol::{Decision, Outcome, Reason, Subject, Verdict};

/// A flood kept up on one account, from many addresses, with the store
/// kept late (stalls, and the flood's other half on other accounts): the
/// account's key is in a burst for as long as it lasts. Its owner's late
/// checks are refused as busy for busy_max at most (her requester's
/// window, `BusyRuns`), then go to the share as lone ones. Refused for it,
/// anyone could keep her out: with any reply from the store excusing a
/// check in a burst, she was refused for the whole flood.
#[test]
fn a_flood_kept_up_on_an_account_refuses_its_owner_as_busy_no_longer_than_busy_max() {
    let (hosts, rt, client) = one_host("");
    let stop = Arc::new(AtomicBool::new(false));
    let stalls = hosts.redis.stall(Duration::from_millis(10), Duration::from_millis(5));
    let answers = rt.block_on(async {
        let flood = flood(&client, &stop, |i, n| leak(format!("10.8.{i}.{}", 1 + n % 200)));
        let answers = logins_for(&client, "login", &subject_of("192.0.2.33", "erin")).await;
        stop.store(true, Relaxed);
        for t in flood {
            t.await.unwrap();
        }
        answers
    });
    drop(stalls);
    // From her first busy refusal to her last: the stalls break runs of
    // them, so the span is what a flood could keep her out for.
    let busy: Vec<_> = answers.iter().filter(|a| a.2).map(|a| a.0).collect();
    let span = busy.last().zip(busy.first()).map_or(Duration::ZERO, |(last, first)| *last - *first);
    let shared = answers.iter().filter(|a| a.1).count();
    eprintln!("erin: {} checks, {} refused as busy over {span:?}, {shared} on the share", answers.len(), busy.len());
    assert!((busy.len() + shared) * 5 >= answers.len(), "the store was seldom late for her: {answers:?}");
    assert!(span < Duration::from_millis(500 + 500), "refused as busy over {span:?}: {answers:?}");
}

/// A flood of checks on other accounts makes the store late for everyone:
/// a user alone on her keys is not refused for it (her late check is
/// answered on the share, as before), only checks in a burst on their own
/// keys are. Else an attacker's pulsed floods would refuse every login
/// (a red team's finding).
#[test]
fn a_flood_on_other_accounts_does_not_refuse_a_user_alone_on_her_keys() {
    let (hosts, rt, client) = one_host("");
    let stalls = hosts.redis.stall(Duration::from_millis(10), Duration::from_millis(5));
    let (refused, late) = rt.block_on(async {
        let flood: Vec<_> = (0..2000)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move {
                    let account = leak(format!("flood-{i}"));
                    let _ = client
                        .check("login", &subject_of(leak(format!("10.9.{}.{}", i / 200, 1 + i % 200)), account))
                        .await;
                })
            })
            .collect();
        let (mut refused, mut late) = (0, 0);
        let erin = subject_of("192.0.2.33", "erin");
        for _ in 0..50 {
            let answered = client.check_answered("login", &erin).await;
            late += answered.degraded as usize;
            let v = verdict(answered.answer);
            refused += (v.decision != Decision::Allow) as usize;
            // She logs in: her attempt's place is settled.
            verdict(client.report("login", &erin, Outcome::Success).await);
            // Her tries out of step with the stalls.
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        for t in flood {
            t.await.unwrap();
        }
        (refused, late)
    });
    eprintln!("erin: {late} of 50 checks late (answered on the share), {refused} refused; {} stalls", stalls.count());
    drop(stalls);
    assert_eq!(refused, 0, "erin was refused {refused} times of 50 during a flood on other accounts");
    assert!(late >= 10, "the store was late for only {late} of her 50 checks");
}

/// One unreported check by a stranger on erin's account (from his own
/// address) holds a place on the account-wide key for the attempt
/// timeout. Before, every reply showing a place in flight marked the key
/// crowded, and erin's late check was refused as busy where a lone user's
/// is answered on the share (a red team's finding). A key is crowded only
/// when its places in flight are at least the admits left.
#[test]
fn one_held_place_makes_a_lone_users_late_check_refused_as_busy() {
    let mut hosts = Hosts::start_with(1, "", "");
    let d = &hosts.daemons[0];
    let rt = runtime();
    let client = d.client();
    let mut outcome = Vec::new();
    for (victim, stranger) in [("frank", false), ("erin", true)] {
        quiet();
        let own = subject_of("192.0.2.33", victim);
        if stranger {
            // The stranger: one check on her account, never reported.
            let v = verdict(rt.block_on(client.check("login", &subject_of("203.0.113.9", victim))));
            assert_eq!(v.decision, Decision::Allow);
        }
        // Her own timely login (or the stranger's next check): the reply
        // shows a place in flight on her account key.
        let v = verdict(rt.block_on(client.check("login", &own)));
        assert_eq!(v.decision, Decision::Allow);
        verdict(rt.block_on(client.report("login", &own, Outcome::Success)));
        // The store is late for a moment (any flood on other accounts).
        hosts.redis.pause();
        let answered = rt.block_on(client.check_answered("login", &own));
        hosts.redis.resume();
        let v = verdict(answered.answer);
        eprintln!(
            "{victim} (stranger's place: {stranger}): {:?} {:?} degraded={}",
            v.decision, v.reason, answered.degraded
        );
        outcome.push((victim, v.decision, v.reason));
    }
    assert_eq!(outcome[0].1, Decision::Allow, "control: a lone late check is answered on the share");
    assert_eq!(
        outcome[1].1,
        Decision::Allow,
        "erin, alone on her keys but for one place a stranger left 30 s ago, refused: {:?}",
        outcome[1]
    );
}

/// The same through pulsed floods on other accounts (each shorter than
/// busy_max, a quiet second between), the stranger checking her account
/// every 300 ms (refused by the store once his address holds 5 places:
/// free, and a refusal marked every key of the check). Erin logs in
/// (check, success) every 10 ms while a pulse runs; frank does the same
/// without a stranger's place. Before: erin refused 6 times of 8.
/// Erin's check and the stranger's never wait at the same time: two
/// checks on her account at once are a burst on it, not a lone user, and
/// refused as such (seen about one run in six before they took turns).
#[test]
fn one_held_place_and_pulsed_floods_on_other_accounts_refuse_a_lone_user() {
    let (_hosts, rt, client) = one_host("");
    let turns = Arc::new(tokio::sync::Mutex::new(()));
    let mut results = Vec::new();
    for (account, stranger) in [("frank", false), ("erin", true)] {
        if stranger {
            quiet();
            let v = verdict(rt.block_on(client.check("login", &subject_of("203.0.113.9", account))));
            assert_eq!(v.decision, Decision::Allow);
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refresher = stranger.then(|| {
            let (client, stop, turns) = (client.clone(), stop.clone(), turns.clone());
            rt.spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let turn = turns.lock().await;
                    let _ = client.check("login", &subject_of("203.0.113.9", account)).await;
                    drop(turn);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            })
        });
        let (mut refused, mut late, mut tries) = (0, 0, 0);
        for pulse in 0..5 {
            quiet();
            let (r, l, t) = rt.block_on(async {
                let flood: Vec<_> = (0..400)
                    .map(|i| {
                        let client = client.clone();
                        tokio::spawn(async move {
                            let a = leak(format!("flood-{account}-{pulse}-{i}"));
                            let peer = leak(format!("10.9.{}.{}", i / 200, 1 + i % 200));
                            let _ = client.check("login", &subject_of(peer, a)).await;
                        })
                    })
                    .collect();
                let (mut refused, mut late, mut tries) = (0, 0, 0);
                let me = subject_of("192.0.2.33", account);
                while !flood.iter().all(|t| t.is_finished()) {
                    tries += 1;
                    let turn = turns.lock().await;
                    let answered = client.check_answered("login", &me).await;
                    drop(turn);
                    late += answered.degraded as usize;
                    let v = verdict(answered.answer);
                    if v.decision != Decision::Allow {
                        refused += 1;
                    } else {
                        verdict(client.report("login", &me, Outcome::Success).await);
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                for t in flood {
                    t.await.unwrap();
                }
                (refused, late, tries)
            });
            refused += r;
            late += l;
            tries += t;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(r) = refresher {
            rt.block_on(r).unwrap();
        }
        eprintln!("{account} (stranger's place: {stranger}): {tries} logins during 5 pulses, {late} answered on the share, {refused} refused");
        results.push((account, refused, late, tries));
    }
    assert_eq!(results[0].1, 0, "control: {results:?}");
    assert_eq!(results[1].1, 0, "erin refused during pulsed floods on other accounts: {results:?}");
}

/// A flood kept up on erin's account, each check from a fresh address (a
/// fresh requester, refused as busy in turn), while she tries every 1.1 s
/// from her one address, with `busy_max_ms` = 100. A requester's busy
/// refusals made a stretch that ended after 10 x busy_max without a late
/// check in a burst: each try of hers after such a pause began a new one
/// and was refused (a red team's finding: 38 of 60 tries, 5.2 s apart at
/// the default busy_max). Now a requester is refused as busy for
/// busy_max in a window of 120 x busy_max, 12 s here: once.
#[test]
fn a_user_who_pauses_between_tries_is_refused_as_busy_once_a_window() {
    let (hosts, rt, client) = one_host("busy_max_ms = 100");
    let stop = Arc::new(AtomicBool::new(false));
    let stalls = hosts.redis.stall(Duration::from_millis(10), Duration::from_millis(5));
    let answers = rt.block_on(async {
        let flood = flood(&client, &stop, |i, n| leak(format!("10.{i}.{}.{}", n / 250 % 250, 1 + n % 250)));
        let erin = subject_of("192.0.2.33", "erin");
        let mut answers = Vec::new();
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(1100)).await;
            let answered = client.check_answered("login", &erin).await;
            let v = verdict(answered.answer);
            if v.decision == Decision::Allow {
                verdict(client.report("login", &erin, Outcome::Success).await);
            }
            let busy = refused_as_busy(answered.degraded, &v);
            answers.push((answered.degraded, v.decision, v.reason, v.reset_ms, busy));
        }
        stop.store(true, Relaxed);
        for t in flood {
            t.await.unwrap();
        }
        answers
    });
    drop(stalls);
    let busy = answers.iter().filter(|a| a.1 == Decision::Deny && a.4).count();
    let late = busy + answers.iter().filter(|a| a.0).count();
    eprintln!("erin: {answers:?}");
    assert!(busy <= 1, "refused as busy {busy} times of 6: {answers:?}");
    assert!(late >= 4, "the store was late for only {late} of her 6 tries: {answers:?}");
}

/// `reauth` counts failures per (account, device) only. With every key
/// that names a device left out of a requester, every reauth check of a
/// host had the same requester (none left), so a flood of parallel
/// checks on an attacker's own account and cookie made every user's late
/// reauth check part of a burst of its own, refused for the whole flood
/// (a red team's finding). When every key names what the requester
/// chooses, the requester is all of them.
#[test]
fn a_flood_on_anothers_reauth_key_does_not_refuse_a_user_as_busy() {
    let (hosts, rt, client) = one_host("");
    let stop = Arc::new(AtomicBool::new(false));
    let stalls = hosts.redis.stall(Duration::from_millis(10), Duration::from_millis(5));
    let answers = rt.block_on(async {
        let flood: Vec<_> = (0..48)
            .map(|_| {
                let (client, stop) = (client.clone(), stop.clone());
                tokio::spawn(async move {
                    let mallory = Subject { device: Some("his-cookie"), ..subject_of("10.8.0.1", "mallory") };
                    while !stop.load(Relaxed) {
                        if client.check("reauth", &mallory).await.proceeds() {
                            let _ = client.abandon("reauth", &mallory).await;
                        }
                    }
                })
            })
            .collect();
        let erin = Subject { device: Some("her-cookie"), ..subject_of("192.0.2.33", "erin") };
        let answers = logins_for(&client, "reauth", &erin).await;
        stop.store(true, Relaxed);
        for t in flood {
            t.await.unwrap();
        }
        answers
    });
    drop(stalls);
    let busy = answers.iter().filter(|a| a.2).count();
    let late = busy + answers.iter().filter(|a| a.1).count();
    eprintln!("erin: {} reauth checks, {late} late, {busy} refused as busy", answers.len());
    assert!(busy == 0, "refused as busy {busy} times of {}, alone on her keys", answers.len());
    assert!(late * 5 >= answers.len(), "the store was late for only {late} of her {} checks", answers.len());
}

/// A stranger's failures with made-up devices lock alice's account
/// ceiling (`account_failures`, unknown devices only) on three hosts.
/// Her laptop, which she logged in on through host 0, is exempt from it.
/// Then the store stops (SIGSTOP): host 0's checks are late, then the
/// breaker opens. Host 0 still knows her laptop, so her logins there are
/// admitted. Before, a late check carrying a device was judged by its
/// unscoped keys, and the ceiling's lockout refused her laptop 5 of 5 on
/// every host, the one that knows it too (a red team's finding). Host 1,
/// which never saw her laptop, cannot tell it from a made-up device: a
/// short wait there.
#[test]
fn a_strangers_ceiling_lockout_does_not_refuse_her_known_device_while_the_store_is_away() {
    let mut hosts = Hosts::start_with(3, "[routes.login.rules.account_failures]\nthreshold = 5", "");
    let laptop = Subject { device: Some("alice-laptop"), ..subject_of("192.0.2.33", "alice") };
    check(&hosts.daemons[0], &laptop);
    report(&hosts.daemons[0], &laptop, Outcome::Success);
    let stranger = |i: usize| Subject {
        device: Some("attacker-phone"),
        ..subject_of(leak(format!("203.0.113.{}", 10 + i)), "alice")
    };
    for i in 0..5 {
        let d = &hosts.daemons[i % 3];
        assert_eq!(check(d, &stranger(i)).decision, Decision::Allow, "stranger's guess {i}");
        report(d, &stranger(i), Outcome::Failure);
    }
    for d in &hosts.daemons {
        wait_until(d, Duration::from_secs(5), "every host refuses the stranger", || {
            check(d, &stranger(20)).decision == Decision::Deny
        });
    }
    assert_eq!(check(&hosts.daemons[0], &laptop).decision, Decision::Allow, "her laptop, the store answering");
    report(&hosts.daemons[0], &laptop, Outcome::Success);
    hosts.redis.pause();
    let rt = runtime();
    let mut refused = Vec::new();
    for i in 0..5 {
        let client = hosts.daemons[0].client();
        let answered = rt.block_on(client.check_answered("login", &laptop));
        let v = verdict(answered.answer);
        if v.decision == Decision::Allow {
            verdict(rt.block_on(client.report("login", &laptop, Outcome::Success)));
        } else {
            refused.push((i, answered.degraded, v.reason, v.retry_after_ms));
        }
    }
    let v = check(&hosts.daemons[1], &laptop);
    let host_1 = (v.decision, v.retry_after_ms);
    hosts.redis.resume();
    assert!(refused.is_empty(), "her laptop refused on the host that knows it: {refused:?}");
    assert_eq!(host_1, (Decision::Deny, 1000), "host 1, which never saw her laptop");
}

/// 48 connections checking as fast as they can until `stop`: half on
/// erin's account, half on four others, from `peer(connection, n)`, each
/// check given back at once so no places fill. Every check has company
/// on its account; none is lone.
fn flood(
    client: &Arc<Client>,
    stop: &Arc<AtomicBool>,
    peer: fn(usize, usize) -> &'static str,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..48)
        .map(|i| {
            let (client, stop) = (client.clone(), stop.clone());
            tokio::spawn(async move {
                for n in 0.. {
                    if stop.load(Relaxed) {
                        break;
                    }
                    let account = if i % 2 == 0 { "erin" } else { leak(format!("other-{}", i % 4)) };
                    let subject = subject_of(peer(i, n), account);
                    if client.check("login", &subject).await.proceeds() {
                        let _ = client.abandon("login", &subject).await;
                    }
                }
            })
        })
        .collect()
}

/// A busy refusal: attempts in flight, a 1 s wait, nothing said of a
/// reset. The store's own refusal for places in flight (the flood's, on
/// her account's ceiling) waits until they lapse.
fn refused_as_busy(degraded: bool, v: &Verdict<'_>) -> bool {
    !degraded
        && v.decision == Decision::Deny
        && v.reason == Reason::AttemptsInFlight
        && v.reset_ms == 0
        && v.retry_after_ms == 1000
}

/// One daemon on its own store, a runtime, and a client that waits long
/// enough to see every answer (its deadline is not what is tested).
fn one_host(shared: &str) -> (Hosts, tokio::runtime::Runtime, Arc<Client>) {
    let hosts = Hosts::start_with(1, "", shared);
    let client = Client::new(ClientConfig::new(&hosts.daemons[0].socket).timeout(Duration::from_secs(10)));
    (hosts, runtime(), Arc::new(client))
}

/// Her logins on `route` every 10 ms for 3 s (a check, and a success
/// report when allowed): when each was asked, whether it was answered
/// on the share, and whether it was refused as busy.
async fn logins_for(client: &Client, route: &str, erin: &Subject<'_>) -> Vec<(Duration, bool, bool)> {
    let started = Instant::now();
    let mut answers = Vec::new();
    while started.elapsed() < Duration::from_millis(3000) {
        let asked = started.elapsed();
        let answered = client.check_answered(route, erin).await;
        let v = verdict(answered.answer);
        if v.decision == Decision::Allow {
            verdict(client.report(route, erin, Outcome::Success).await);
        }
        answers.push((asked, answered.degraded, refused_as_busy(answered.degraded, &v)));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    answers
}
