//! The client against fake daemons: ones that speak up to version 1 (as a
//! daemon from before version 2 does), up to 2 (before version 3), up to 3
//! (before version 4), up to 4 (before version 5), up to 5 (before
//! version 6), up to 6 (before version 7), and 7.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tollgate_client::codec::{
    decode_request_versioned, encode_response, encode_response_versioned, request_version, ReplyExtras, WIRE,
};
use tollgate_client::protocol::{
    Activity, Decision, DetectorStatus, ErrorCode, Inspection, Outcome, Reason, Request, Response, SharedStatus,
    SignalsStatus, Status, Subject, Verdict,
};
use tollgate_client::{password_tag, Answer, Client, ClientConfig, FullStatus};

/// Frames seen by a fake daemon, by version, and the password tags of
/// those it answered.
#[derive(Default)]
struct Seen {
    v1: AtomicUsize,
    v2: AtomicUsize,
    v3: AtomicUsize,
    v4: AtomicUsize,
    v5: AtomicUsize,
    v6: AtomicUsize,
    v7: AtomicUsize,
    /// `Abandon` requests answered.
    abandons: AtomicUsize,
    /// `Report` requests answered.
    reports: AtomicUsize,
    tags: std::sync::Mutex<Vec<Option<[u8; 16]>>>,
}

struct Fake {
    socket: PathBuf,
    seen: Arc<Seen>,
    _dir: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn allow() -> Verdict<'static> {
    Verdict {
        decision: Decision::Allow,
        retry_after_ms: 0,
        delay_ms: 0,
        limit: 5,
        remaining: 4,
        reset_ms: 900_000,
        reason: Reason::Allowed,
        rule: "source_failures".into(),
    }
}

fn status() -> Status {
    bincode::decode_from_slice(&[0u8; 512], WIRE).expect("zeroes decode to a Status").0
}

fn shared() -> SharedStatus {
    SharedStatus { url: "redis://10.0.0.5:6379/0".into(), state: "open".into(), degraded: true, ..Default::default() }
}

fn signals() -> SignalsStatus {
    let detector = DetectorStatus { name: "password_spray".into(), mode: "monitor".into(), ..Default::default() };
    SignalsStatus { window_ms: 3_600_000, detectors: vec![detector], ..Default::default() }
}

/// Reply as the daemon does; a daemon that speaks up to `newest` refuses
/// any newer version byte in version 1's bytes.
fn reply(newest: u8, payload: &[u8], seen: &Seen) -> Vec<u8> {
    let mut out = Vec::new();
    let version = request_version(payload).unwrap();
    let id = u64::from_le_bytes(payload[1..9].try_into().unwrap());
    match version {
        1 => seen.v1.fetch_add(1, Ordering::SeqCst),
        2 => seen.v2.fetch_add(1, Ordering::SeqCst),
        3 => seen.v3.fetch_add(1, Ordering::SeqCst),
        4 => seen.v4.fetch_add(1, Ordering::SeqCst),
        5 => seen.v5.fetch_add(1, Ordering::SeqCst),
        6 => seen.v6.fetch_add(1, Ordering::SeqCst),
        _ => seen.v7.fetch_add(1, Ordering::SeqCst),
    };
    if version > newest {
        let refusal = Response::error(
            ErrorCode::UnsupportedVersion,
            format!("protocol version {version} is not supported (this daemon speaks 1 to {newest})"),
        );
        encode_response(id, &refusal, &mut out);
        return out;
    }
    // What this version has no room for (`Activity` before version 4) is
    // malformed, in the request's version.
    let (request, extras) = match decode_request_versioned(payload) {
        Ok((_, request, extras)) => (request, extras),
        Err(failure) => {
            let malformed = Response::error(ErrorCode::Malformed, failure.error.to_string());
            encode_response_versioned(version, id, &malformed, &ReplyExtras::default(), &mut out);
            return out;
        }
    };
    let response = match request {
        Request::Status => Response::Status(Box::new(status())),
        Request::Activity { .. } => Response::Activity(Box::new(Activity { now_ms: 9, ..Activity::default() })),
        Request::Samples { .. } => Response::Samples { samples: vec![], seen: 3, since_ms: 7 },
        Request::Inspect { route, .. } => {
            Response::Inspection(Box::new(Inspection { route: route.into(), ..Inspection::default() }))
        }
        Request::Ban { for_ms, .. } => Response::Banned { until_ms: for_ms, replaced: false },
        Request::Abandon { .. } => {
            seen.abandons.fetch_add(1, Ordering::SeqCst);
            Response::Verdict(allow())
        }
        // bob is refused, as a locked-out account is.
        Request::Check { subject, .. } if subject.account == Some("bob") => {
            Response::Verdict(Verdict { decision: Decision::Deny, reason: Reason::TooManyFailures, ..allow() })
        }
        _ => {
            seen.tags.lock().unwrap().push(extras.password_tag);
            // Spray detection's monitor-mode reason for mallory, which
            // versions 1 and 2 read as `monitor_too_many_failures`.
            let spraying = match request {
                Request::Check { subject, .. } | Request::Report { subject, .. } => subject.account == Some("mallory"),
                _ => false,
            };
            Response::Verdict(Verdict {
                reason: if spraying { Reason::MonitorSignal } else { Reason::Allowed },
                ..allow()
            })
        }
    };
    let (shared, signals) = (shared(), signals());
    let extras = ReplyExtras { degraded: true, shared: Some(&shared), signals: Some(&signals) };
    encode_response_versioned(version, id, &response, &extras, &mut out);
    out
}

async fn serve(mut stream: UnixStream, newest: u8, seen: Arc<Seen>) {
    loop {
        let mut header = [0u8; 4];
        if stream.read_exact(&mut header).await.is_err() {
            return;
        }
        let mut payload = vec![0u8; u32::from_le_bytes(header) as usize];
        stream.read_exact(&mut payload).await.unwrap();
        if matches!(decode_request_versioned(&payload), Ok((_, Request::Report { .. }, _))) {
            seen.reports.fetch_add(1, Ordering::SeqCst);
        }
        // A slow daemon for slowpoke's requests: the caller's future can be
        // dropped while they are on the wire.
        if payload.windows(8).any(|w| w == b"slowpoke") {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if stream.write_all(&reply(newest, &payload, &seen)).await.is_err() {
            return; // the caller went away (a cancelled call)
        }
    }
}

fn fake(newest: u8) -> Fake {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tollgate-fallback-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("fake.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let seen = Arc::new(Seen::default());
    let served = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, newest, served.clone()));
        }
    });
    Fake { socket, seen, _dir: TempDir(dir) }
}

fn client(fake: &Fake) -> ClientConfig {
    ClientConfig::new(&fake.socket).timeout(Duration::from_secs(5))
}

fn alice() -> Subject<'static> {
    Subject { peer: Some("198.51.100.7".parse().unwrap()), account: Some("alice"), ..Subject::default() }
}

/// Frames seen in versions 1 to 7.
fn counts(fake: &Fake) -> [usize; 7] {
    let seen = &fake.seen;
    [&seen.v1, &seen.v2, &seen.v3, &seen.v4, &seen.v5, &seen.v6, &seen.v7].map(|n| n.load(Ordering::SeqCst))
}

fn tags(fake: &Fake) -> Vec<Option<[u8; 16]>> {
    fake.seen.tags.lock().unwrap().clone()
}

#[tokio::test]
async fn an_old_daemon_is_asked_again_in_versions_5_4_3_and_2_then_1_once_per_connection() {
    let fake = fake(1);
    let client = Client::new(client(&fake));
    let answered = client.check_tagged("login", &alice(), Some(password_tag(&[1; 32], "hunter2"))).await;
    assert!(matches!(&answered.answer, Answer::Verdict(v) if *v == allow()), "{answered:?}");
    assert!(!answered.degraded, "a version-1 reply has no flag");
    assert_eq!(counts(&fake), [1, 1, 1, 1, 1, 1, 1], "refused in versions 7, 6, 5, 4, 3 and 2, then version 1");
    assert_eq!(tags(&fake), [None], "version 1 has no room for the tag");
    // The pooled connection remembers: no second refusal.
    let report = client.report("login", &alice(), Outcome::Failure).await;
    assert!(matches!(report, Answer::Verdict(_)), "{report:?}");
    let (status, shared) = client.status_with_shared().await.unwrap();
    assert_eq!((status, shared), (self::status(), None));
    assert_eq!(counts(&fake), [3, 1, 1, 1, 1, 1, 1]);
}

#[tokio::test]
async fn a_version_2_daemon_is_asked_again_in_versions_5_4_3_and_2_and_never_sees_the_tag() {
    let fake = fake(2);
    let client = Client::new(client(&fake));
    let tag = Some(password_tag(&[1; 32], "hunter2"));
    let answered = client.report_tagged("login", &alice(), Outcome::Failure, None, tag).await;
    assert!(answered.degraded && answered.answer.proceeds(), "{answered:?}");
    assert_eq!(counts(&fake), [0, 1, 1, 1, 1, 1, 1], "refused in versions 7, 6, 5, 4 and 3, then version 2");
    let full = client.status_full().await.unwrap();
    assert_eq!(full, FullStatus { status: status(), shared: Some(shared()), signals: None });
    assert_eq!(counts(&fake), [0, 2, 1, 1, 1, 1, 1]);
    assert_eq!(tags(&fake), [None]);
}

#[tokio::test]
async fn version_1_can_be_forced() {
    let fake = fake(1);
    let client = Client::new(client(&fake).protocol_version(1));
    assert!(client.check("login", &alice()).await.proceeds());
    assert_eq!(counts(&fake), [1, 0, 0, 0, 0, 0, 0]);
}

#[tokio::test]
async fn a_version_2_daemon_shows_the_flag_and_the_shared_status() {
    let fake = fake(2);
    let client = Client::new(client(&fake).protocol_version(2));
    let answered = client.check_answered("login", &alice()).await;
    assert!(answered.degraded && answered.answer.proceeds(), "{answered:?}");
    let answered = client.report_answered("login", &alice(), Outcome::Success, None).await;
    assert!(answered.degraded, "{answered:?}");
    assert_eq!(client.status_with_shared().await.unwrap(), (status(), Some(shared())));
    assert_eq!(client.status().await.unwrap(), status());
    assert_eq!(counts(&fake), [0, 4, 0, 0, 0, 0, 0]);
}

#[tokio::test]
async fn a_version_3_daemon_gets_the_tag_and_shows_the_signals() {
    let fake = fake(3);
    let client = Client::new(client(&fake));
    let tag = password_tag(&[1; 32], "hunter2");
    let answered = client.check_tagged("login", &alice(), Some(tag)).await;
    assert!(matches!(&answered.answer, Answer::Verdict(v) if *v == allow()), "{answered:?}");
    let answered = client.report_tagged("login", &alice(), Outcome::Failure, Some([2; 16]), Some(tag)).await;
    assert!(answered.degraded, "{answered:?}");
    assert!(client.check_answered("login", &alice()).await.answer.proceeds());
    assert_eq!(tags(&fake), [Some(tag), Some(tag), None]);
    let full = client.status_full().await.unwrap();
    assert_eq!(full, FullStatus { status: status(), shared: Some(shared()), signals: Some(signals()) });
    // One version-7, 6, 5 and 4 frame refused, then
    // version 3 on the pooled connection.
    assert_eq!(counts(&fake), [0, 0, 4, 1, 1, 1, 1]);
}

/// The guard's report carries the check's tag unless given another: a
/// failure reported without one would be invisible to spray detection.
#[tokio::test]
async fn the_guards_report_carries_the_checks_tag() {
    let fake = fake(6);
    let client = Arc::new(Client::new(client(&fake)));
    let (tag, other) = (password_tag(&[1; 32], "hunter2"), password_tag(&[1; 32], "other"));
    let attempt = client.begin("login", &alice(), Some(tag)).await;
    attempt.report(Outcome::Failure, None, None).await;
    let attempt = client.begin("login", &alice(), Some(tag)).await;
    attempt.report(Outcome::Failure, None, Some(other)).await;
    let attempt = client.begin("login", &alice(), None).await;
    attempt.report(Outcome::Failure, None, None).await;
    assert_eq!(tags(&fake), [Some(tag), Some(tag), Some(tag), Some(other), None, None]);
}

/// A version-3 daemon has no `Activity` or `Samples`: after stepping down,
/// the client says they need version 4 (and goes on in version 3 for the
/// rest); a version-4 daemon answers them.
#[tokio::test]
async fn activity_and_samples_need_a_version_4_daemon() {
    let old = fake(3);
    let asking_old = Client::new(client(&old));
    let e = asking_old.activity(10).await.unwrap_err().to_string();
    assert!(e.contains("the daemon speaks protocol version 3; this needs version 4"), "{e}");
    let e = asking_old.samples(10).await.unwrap_err().to_string();
    assert!(e.contains("this needs version 4"), "{e}");
    assert!(asking_old.check("login", &alice()).await.proceeds());
    assert_eq!(counts(&old), [0, 0, 3, 1, 1, 1, 1], "one refused version-7, 6, 5 and 4 frame, then version 3");

    let new = fake(4);
    let asking_new = Client::new(client(&new));
    assert_eq!(asking_new.activity(10).await.unwrap(), Activity { now_ms: 9, ..Activity::default() });
    assert_eq!(asking_new.samples(10).await.unwrap(), (vec![], 3, 7));
    assert_eq!(counts(&new), [0, 0, 0, 2, 1, 1, 1], "one refused version-7, 6 and 5 frame, then version 4");
}

/// A version-5 daemon has no `Inspect`: after stepping down, the client
/// says it needs version 6; a version-6 daemon answers it.
#[tokio::test]
async fn inspect_needs_a_version_6_daemon() {
    let old = fake(5);
    let e = Client::new(client(&old)).inspect("login", &alice()).await.unwrap_err().to_string();
    assert!(e.contains("the daemon speaks protocol version 5; this needs version 6"), "{e}");
    assert_eq!(counts(&old), [0, 0, 0, 0, 1, 1, 1], "one refused version-7 and 6 frame, then version 5");

    let new = fake(6);
    let inspection = Client::new(client(&new)).inspect("login", &alice()).await.unwrap();
    assert_eq!(inspection, Inspection { route: "login".into(), ..Inspection::default() });
    assert_eq!(counts(&new), [0, 0, 0, 0, 0, 1, 1]);
}

/// A monitored spray signal reaches an older client as the nearest reason
/// it can read.
#[tokio::test]
async fn a_version_2_client_reads_a_new_reason_as_the_nearest_old_one() {
    let fake = fake(3);
    let mallory = Subject { account: Some("mallory"), ..alice() };
    let old = Client::new(client(&fake).protocol_version(2));
    let answered = old.check_answered("login", &mallory).await;
    assert_eq!(answered.answer.verdict().map(|v| v.reason), Some(Reason::MonitorTooManyFailures));
    let new = Client::new(client(&fake));
    let answered = new.check_answered("login", &mallory).await;
    assert_eq!(answered.answer.verdict().map(|v| v.reason), Some(Reason::MonitorSignal));
}

#[test]
#[should_panic(expected = "protocol version 8 is not one this client speaks")]
fn an_unknown_version_cannot_be_configured() {
    let _ = ClientConfig::new("/nowhere").protocol_version(8);
}

fn abandons(fake: &Fake) -> usize {
    fake.seen.abandons.load(Ordering::SeqCst)
}

/// Waits (a bounded while) for the abandons a dropped guard sends on a task.
async fn wait_for_abandons(fake: &Fake, expected: usize) {
    for _ in 0..200 {
        if abandons(fake) >= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // And a little longer, so that one too many would show.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(abandons(fake), expected);
}

/// The attempt guard: an admitted attempt dropped without its report (a
/// cancelled future, a panic) sends one `abandon`; a reported one, a
/// refused one and one explicitly abandoned send no more than they should.
#[tokio::test]
async fn an_admitted_attempt_dropped_without_its_report_is_abandoned() {
    let fake = fake(5);
    let client = Arc::new(Client::new(client(&fake)));

    let attempt = client.begin("login", &alice(), None).await;
    assert!(attempt.proceeds());
    drop(attempt);
    wait_for_abandons(&fake, 1).await;

    let attempt = client.begin("login", &alice(), None).await;
    let answered = attempt.report(Outcome::Failure, None, None).await;
    assert!(answered.answer.proceeds());
    wait_for_abandons(&fake, 1).await;

    let bob = Subject { account: Some("bob"), ..alice() };
    let refused = client.begin("login", &bob, None).await;
    assert!(!refused.proceeds());
    drop(refused);
    wait_for_abandons(&fake, 1).await;

    let attempt = client.begin("login", &alice(), None).await;
    assert!(attempt.abandon().await.is_some_and(|a| a.answer.proceeds()));
    wait_for_abandons(&fake, 2).await;

    // A handler cancelled in the middle of its verify (its future dropped).
    let handler = {
        let client = client.clone();
        async move {
            let _attempt = client.begin("login", &alice(), None).await;
            std::future::pending::<()>().await;
        }
    };
    assert!(tokio::time::timeout(Duration::from_millis(50), handler).await.is_err());
    wait_for_abandons(&fake, 3).await;

    // A handler that panics.
    let panicking = {
        let client = client.clone();
        tokio::spawn(async move {
            let _attempt = client.begin("login", &alice(), None).await;
            panic!("the handler's own bug");
        })
    };
    assert!(panicking.await.is_err());
    wait_for_abandons(&fake, 4).await;
}

/// A handler cancelled while its check is on the wire (the end user hung
/// up before the daemon answered) still abandons the attempt once the
/// answer comes; one cancelled while its report is on the wire still
/// reports, and abandons nothing.
#[tokio::test]
async fn a_guard_cancelled_mid_call_abandons_or_reports_all_the_same() {
    let fake = fake(5);
    let client = Arc::new(Client::new(client(&fake)));
    let slowpoke = Subject { account: Some("slowpoke"), ..alice() };
    let begun = tokio::time::timeout(Duration::from_millis(20), client.begin("login", &slowpoke, None)).await;
    assert!(begun.is_err(), "cancelled while the check was on the wire");
    wait_for_abandons(&fake, 1).await;

    let attempt = client.begin("login", &slowpoke, None).await;
    let reporting = tokio::time::timeout(Duration::from_millis(20), attempt.report(Outcome::Failure, None, None)).await;
    assert!(reporting.is_err(), "cancelled while the report was on the wire");
    wait_for_abandons(&fake, 1).await;
    assert_eq!(fake.seen.reports.load(Ordering::SeqCst), 1, "the report went out all the same");
}

/// A check whose reply never came is never abandoned: the daemon may not
/// have seen it, and an abandon would free another attempt's place.
#[tokio::test]
async fn an_unanswered_check_is_not_abandoned() {
    let client = Arc::new(Client::new(ClientConfig::new("/nonexistent/tollgate.sock")));
    let attempt = client.begin("login", &alice(), None).await;
    assert!(attempt.proceeds(), "login fails open");
    assert!(matches!(attempt.answer(), Answer::Unavailable { .. }));
    assert!(attempt.abandon().await.is_none(), "nothing held, nothing sent");
}

/// A version-4 daemon has no `Abandon`: the client steps down and the
/// daemon refuses it as malformed (its places lapse on their own).
#[tokio::test]
async fn a_version_4_daemon_cannot_be_told_of_an_abandon() {
    let fake = fake(4);
    let client = Arc::new(Client::new(client(&fake)));
    let answered = client.abandon("login", &alice()).await;
    match answered.answer {
        Answer::Rejected(e) => {
            assert_eq!(e.code, ErrorCode::Malformed);
            assert!(e.message.contains("needs protocol version 5"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(abandons(&fake), 0);
}

/// A runtime shutting down while a check is on the wire: the guard comes
/// back with the route's fail policy (login: open), as for a daemon that
/// cannot be reached, instead of a panic, and holds nothing.
#[test]
fn a_runtime_shutting_down_mid_check_answers_by_the_fail_policy() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let fake = rt.block_on(async { fake(5) });
    let client = Arc::new(Client::new(client(&fake)));
    let handle = rt.handle().clone();
    let asking = std::thread::spawn(move || {
        let slowpoke = Subject { account: Some("slowpoke"), ..alice() };
        let attempt = handle.block_on(client.begin("login", &slowpoke, None));
        (matches!(attempt.answer(), Answer::Unavailable { .. }), attempt.proceeds())
    });
    std::thread::sleep(Duration::from_millis(30));
    rt.shutdown_background();
    assert_eq!(asking.join().expect("no panic"), (true, true));
}

/// A version-6 daemon has no `Ban`: after stepping down, the client says
/// it needs version 7; a version-7 daemon answers it.
#[tokio::test]
async fn ban_needs_a_version_7_daemon() {
    let network = "203.0.113.0".parse().unwrap();
    let old = fake(6);
    let e = Client::new(client(&old)).ban(network, 24, Duration::from_secs(60), "").await.unwrap_err().to_string();
    assert!(e.contains("the daemon speaks protocol version 6; this needs version 7"), "{e}");
    assert_eq!(counts(&old), [0, 0, 0, 0, 0, 1, 1], "one refused version-7 frame, then version 6");

    let new = fake(7);
    let banned = Client::new(client(&new)).ban(network, 24, Duration::from_secs(60), "").await.unwrap();
    assert_eq!(banned, (60_000, false));
    assert_eq!(counts(&new), [0, 0, 0, 0, 0, 0, 1]);
}
