//! The client against fake daemons: one that speaks version 1 only (as a
//! daemon from before version 2 does), and one that speaks version 2.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tollgate_client::codec::{
    decode_request, encode_response, encode_response_versioned, request_version, ReplyExtras, WIRE,
};
use tollgate_client::protocol::{
    Decision, ErrorCode, Outcome, Reason, Request, Response, SharedStatus, Status, Subject, Verdict,
};
use tollgate_client::{Answer, Client, ClientConfig};

/// Frames seen by a fake daemon, by version.
#[derive(Default)]
struct Seen {
    v1: AtomicUsize,
    v2: AtomicUsize,
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

/// Reply as the daemon does; `speaks_v2: false` is a daemon from before
/// version 2: it refuses any other version byte in version 1's bytes.
fn reply(speaks_v2: bool, payload: &[u8], seen: &Seen) -> Vec<u8> {
    let mut out = Vec::new();
    let version = request_version(payload).unwrap();
    let id = u64::from_le_bytes(payload[1..9].try_into().unwrap());
    match version {
        1 => seen.v1.fetch_add(1, Ordering::SeqCst),
        _ => seen.v2.fetch_add(1, Ordering::SeqCst),
    };
    if version != 1 && !speaks_v2 {
        let refusal = Response::error(
            ErrorCode::UnsupportedVersion,
            format!("protocol version {version} is not supported (this daemon speaks 1)"),
        );
        encode_response(id, &refusal, &mut out);
        return out;
    }
    let (_, request) = decode_request(payload).unwrap();
    let response = match request {
        Request::Status => Response::Status(Box::new(status())),
        _ => Response::Verdict(allow()),
    };
    let shared = shared();
    encode_response_versioned(version, id, &response, &ReplyExtras { degraded: true, shared: Some(&shared) }, &mut out);
    out
}

async fn serve(mut stream: UnixStream, speaks_v2: bool, seen: Arc<Seen>) {
    loop {
        let mut header = [0u8; 4];
        if stream.read_exact(&mut header).await.is_err() {
            return;
        }
        let mut payload = vec![0u8; u32::from_le_bytes(header) as usize];
        stream.read_exact(&mut payload).await.unwrap();
        stream.write_all(&reply(speaks_v2, &payload, &seen)).await.unwrap();
    }
}

fn fake(speaks_v2: bool) -> Fake {
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
            tokio::spawn(serve(stream, speaks_v2, served.clone()));
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

fn counts(fake: &Fake) -> (usize, usize) {
    (fake.seen.v1.load(Ordering::SeqCst), fake.seen.v2.load(Ordering::SeqCst))
}

#[tokio::test]
async fn an_old_daemon_is_asked_again_in_version_1_once_per_connection() {
    let fake = fake(false);
    let client = Client::new(client(&fake));
    let answered = client.check_answered("login", &alice()).await;
    assert!(matches!(&answered.answer, Answer::Verdict(v) if *v == allow()), "{answered:?}");
    assert!(!answered.degraded, "a version-1 reply has no flag");
    assert_eq!(counts(&fake), (1, 1), "one refused version-2 frame, then version 1");
    // The pooled connection remembers: no second refusal.
    let report = client.report("login", &alice(), Outcome::Failure).await;
    assert!(matches!(report, Answer::Verdict(_)), "{report:?}");
    let (status, shared) = client.status_with_shared().await.unwrap();
    assert_eq!((status, shared), (self::status(), None));
    assert_eq!(counts(&fake), (3, 1));
}

#[tokio::test]
async fn version_1_can_be_forced() {
    let fake = fake(false);
    let client = Client::new(client(&fake).protocol_version(1));
    assert!(client.check("login", &alice()).await.proceeds());
    assert_eq!(counts(&fake), (1, 0));
}

#[tokio::test]
async fn a_version_2_daemon_shows_the_flag_and_the_shared_status() {
    let fake = fake(true);
    let client = Client::new(client(&fake));
    let answered = client.check_answered("login", &alice()).await;
    assert!(answered.degraded && answered.answer.proceeds(), "{answered:?}");
    let answered = client.report_answered("login", &alice(), Outcome::Success, None).await;
    assert!(answered.degraded, "{answered:?}");
    assert_eq!(client.status_with_shared().await.unwrap(), (status(), Some(shared())));
    assert_eq!(client.status().await.unwrap(), status());
    assert_eq!(counts(&fake), (0, 4));
}

#[test]
#[should_panic(expected = "protocol version 3 is not one this client speaks")]
fn an_unknown_version_cannot_be_configured() {
    let _ = ClientConfig::new("/nowhere").protocol_version(3);
}
