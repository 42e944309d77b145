//! When a failure rule's lockout lifts, and what `retry_after_ms` and
//! `reset_ms` say on the way, pinned at chosen instants on the manual clock
//! (PROTOCOL.md, "When a lockout lifts, and `reset_ms`").
//!
//! The login route's `source_failures` rule (5 failures per 15-minute
//! window) with `source_rate` off, and a response ladder of one 0 s step
//! without jitter, so `retry_after_ms` is the true wait, not the ladder's.
//! The manual clock starts at 2030-01-01T00:00:00Z, a multiple of 15
//! minutes, so the daemon starts at a window boundary.

mod common;

use std::time::Duration;

use common::*;
use tollgate::client::Client;
use tollgate::protocol::{Decision, Outcome, Reason, Response, Subject, Verdict};

const LOGIN: &str = "login";
const WINDOW_MS: u64 = 900_000;
const MANUAL_CLOCK_START_MS: u64 = 1_893_456_000_000;

const CONFIG: &str = "[responses]\nretry_after_steps_secs = [0]\njitter_percent = 0\n\
                      [routes.login.rules.source_rate]\nenabled = false\n";

/// The figures of a verdict that a test pins, in one comparable tuple:
/// (decision, retry_after_ms, remaining, reset_ms).
fn figures(v: &Verdict<'_>) -> (Decision, u64, u32, u64) {
    assert_eq!((v.limit, v.rule.as_ref()), (5, "source_failures"), "{v:?}");
    let reason = if v.decision == Decision::Allow { Reason::Allowed } else { Reason::TooManyFailures };
    assert_eq!(v.reason, reason, "{v:?}");
    (v.decision, v.retry_after_ms, v.remaining, v.reset_ms)
}

async fn check(client: &Client, who: &Subject<'_>) -> (Decision, u64, u32, u64) {
    figures(&verdict(client.check(LOGIN, who).await))
}

async fn fail(client: &Client, who: &Subject<'_>) -> (Decision, u64, u32, u64) {
    figures(&verdict(client.report(LOGIN, who, Outcome::Failure).await))
}

async fn advance_ms(client: &Client, by_ms: u64) -> u64 {
    client.advance_clock(Duration::from_millis(by_ms)).await.unwrap()
}

/// Five checked failures; returns the fifth report's verdict.
async fn lock(client: &Client, who: &Subject<'_>) -> Verdict<'static> {
    for _ in 0..4 {
        assert_eq!(check(client, who).await.0, Decision::Allow);
        assert_eq!(fail(client, who).await.0, Decision::Allow);
    }
    assert_eq!(check(client, who).await.0, Decision::Allow);
    verdict(client.report(LOGIN, who, Outcome::Failure).await)
}

/// The frame of the vector `name` in tests/vectors/protocol.json, as bytes.
fn vector_frame(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/protocol.json");
    let file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vector = file["vectors"].as_array().unwrap().iter().find(|v| v["name"] == name).expect("the vector");
    let hex = vector["frame"].as_str().unwrap();
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lockout_made_at_a_window_start_holds_through_the_next_boundary_and_lifts_1us_after_it() {
    let daemon = TestDaemon::start_with(Some(CONFIG), true);
    let client = daemon.client();
    let alice = subject("198.51.100.7", "alice");

    // At the window's start: the lift is one window and 1 µs away (900000 ms
    // rounded up); reset_ms runs to the end of the next window.
    assert_eq!(figures(&lock(&client, &alice).await), (Decision::Deny, WINDOW_MS + 1, 0, 2 * WINDOW_MS));
    let (lockouts, total) = client.lockouts(0).await.unwrap();
    assert_eq!(total, 1);
    assert_eq!(
        (lockouts[0].count, lockouts[0].until_ms, lockouts[0].retry_after_ms),
        (5, MANUAL_CLOCK_START_MS + WINDOW_MS + 1, WINDOW_MS + 1)
    );

    // Exactly one window later, at the boundary: still locked, 1 µs to go
    // (1 ms rounded up); the failures are now the previous window's, so
    // reset_ms runs to the end of this one.
    assert_eq!(advance_ms(&client, WINDOW_MS).await, MANUAL_CLOCK_START_MS + WINDOW_MS);
    assert_eq!(check(&client, &alice).await, (Decision::Deny, 1, 0, WINDOW_MS));
    let (lockouts, _) = client.lockouts(0).await.unwrap();
    assert_eq!((lockouts[0].until_ms, lockouts[0].retry_after_ms), (MANUAL_CLOCK_START_MS + WINDOW_MS + 1, 1));

    // 1 ms past the boundary: lifted. The previous window still weighs
    // 5 × (1 − 1/900000), rounded up to 5, so the allowed check took the
    // last place and `remaining` is 0.
    advance_ms(&client, 1).await;
    assert_eq!(check(&client, &alice).await, (Decision::Allow, 0, 0, WINDOW_MS - 1));
    // Not locked (total 0): listed only as refused by that check's place
    // in flight, with its failures rounded down (4, below the limit).
    let (lockouts, total) = client.lockouts(0).await.unwrap();
    assert_eq!((total, lockouts.len(), lockouts[0].count), (0, 1, 4));

    // One more failure locks the key again until the previous window's
    // weight has drained to 4: a fifth of the window (180 s) and 1 µs after
    // the boundary. Counted in this window, it keeps the entry to the end of
    // the next one.
    assert_eq!(fail(&client, &alice).await, (Decision::Deny, 180_000, 0, 2 * WINDOW_MS - 1));
    advance_ms(&client, 180_000 - 1).await;
    assert_eq!(check(&client, &alice).await, (Decision::Deny, 1, 0, 2 * WINDOW_MS - 180_000));
    advance_ms(&client, 1).await;
    assert_eq!(check(&client, &alice).await.0, Decision::Allow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lockout_made_750ms_into_a_window_lifts_1us_after_that_window_ends() {
    let daemon = TestDaemon::start_with(Some(CONFIG), true);
    let client = daemon.client();
    let bob = subject("198.51.100.8", "bob");

    advance_ms(&client, 750).await;
    // The lift is 899250 ms and 1 µs away (899251 rounded up), not a whole
    // window; reset_ms is the end of the next window, 1799250 ms away.
    let fifth = lock(&client, &bob).await;
    assert_eq!(figures(&fifth), (Decision::Deny, 899_251, 0, 1_799_250));
    // PROTOCOL.md's vector `verdict-deny-lockout` is this reply, byte for
    // byte, as the answer to a report with id 2.
    let mut frame = Vec::new();
    tollgate::codec::encode_response(2, &Response::Verdict(fifth), &mut frame);
    assert_eq!(frame, vector_frame("verdict-deny-lockout"));

    // At the boundary: locked for 1 µs more.
    advance_ms(&client, WINDOW_MS - 750).await;
    assert_eq!(check(&client, &bob).await, (Decision::Deny, 1, 0, WINDOW_MS));
    // 1 ms later, and so a window after the lockout too: lifted.
    advance_ms(&client, 1).await;
    assert_eq!(check(&client, &bob).await, (Decision::Allow, 0, 0, WINDOW_MS - 1));
}
