//! A small HTTP login endpoint that uses tollgate the way an auth server
//! should: `check` before the password is hashed, `report` after it is
//! verified, one refusal form whatever the reason, and a constant-time floor
//! so that refusals and unknown accounts are never faster than a real wrong
//! password.
//!
//! Run a daemon, then this server (it binds loopback only):
//!
//! ```sh
//! cargo run --release -- serve --socket /tmp/tollgate/tollgate.sock --state /tmp/tollgate/state.redb
//! cargo run --release --example login_server -- --socket /tmp/tollgate/tollgate.sock --listen 127.0.0.1:8080
//! curl -si -d 'account=alice&password=correct+horse+battery+staple' http://127.0.0.1:8080/login
//! curl -si -H 'content-type: application/json' -d '{"account":"alice","password":"nope"}' http://127.0.0.1:8080/login
//! curl -si http://127.0.0.1:8080/api/ping
//! ```
//!
//! `tests/example_login_server.rs` runs this file in-process against real
//! daemons (it includes it with `#[path]`), so everything the test needs is
//! `pub`: [`Settings`] and [`LoginServer`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use axum::extract::{ConnectInfo, FromRequest, Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, COOKIE, RETRY_AFTER, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use serde::Deserialize;
use tokio::net::TcpListener;
use tollgate::client::{password_digest, Answer, Client, ClientConfig, CALL_TIMEOUT_DEFAULT};
use tollgate::protocol::{Decision, Outcome, Subject};

/// The one body of every refused login, whatever the reason.
pub const REFUSED_BODY: &str = r#"{"error":"too many attempts, try again later"}"#;
/// The one body of every failed login: wrong password or unknown account.
pub const FAILED_BODY: &str = r#"{"error":"invalid account or password"}"#;
/// A body that is neither a form nor JSON with `account` and `password`.
pub const BAD_REQUEST_BODY: &str = r#"{"error":"bad request"}"#;
/// The daemon cannot answer a route whose policy is `closed` (`/api/ping`).
pub const UNAVAILABLE_BODY: &str = r#"{"error":"service unavailable, try again later"}"#;

/// The cookie (and body field) that carries a device id issued at sign-in.
pub const DEVICE_COOKIE: &str = "device";
/// A device id is 16 random bytes, hex: anything else presented is ignored.
const DEVICE_ID_HEX_LEN: usize = 32;
const DEVICE_COOKIE_MAX_AGE_SECS: u64 = 30 * 86_400;

/// The floor when none is configured; raised to the measured verify time.
pub const FLOOR_DEFAULT: Duration = Duration::from_millis(50);
/// The floor is at least this multiple of the slowest measured verify.
const FLOOR_OVER_VERIFY: f64 = 1.5;
/// Verifies timed at start-up to size the floor.
const VERIFY_SAMPLES: usize = 5;

/// Everything the server needs; `Settings::new` has the production defaults.
pub struct Settings {
    /// The tollgate daemon's socket.
    pub socket: PathBuf,
    /// Per call to the daemon; past it the route's fail policy decides.
    pub daemon_timeout: Duration,
    /// Every non-success `/login` answer is held until at least this long
    /// after the request arrived (raised to 1.5 × the slowest measured
    /// argon2 verify, so it always covers a real one).
    pub floor: Duration,
    /// argon2id cost: `Params::default()` is the argon2 crate's
    /// recommendation (19 MiB, 2 passes, 1 lane).
    pub argon2: Params,
    /// (account, password) pairs, hashed at start. A real server loads PHC
    /// strings from its user store instead.
    pub users: Vec<(String, String)>,
    /// This server's own secret for password digests sent to the daemon
    /// (never the daemon's key). Keep it stable across restarts in
    /// production (a secret store); a restart with a new key only forgets
    /// which wrong passwords were repeats.
    pub server_key: [u8; 32],
}

impl Settings {
    pub fn new(socket: impl Into<PathBuf>) -> Settings {
        let mut server_key = [0u8; 32];
        getrandom::getrandom(&mut server_key).expect("OS random source");
        Settings {
            socket: socket.into(),
            daemon_timeout: CALL_TIMEOUT_DEFAULT,
            floor: FLOOR_DEFAULT,
            argon2: Params::default(),
            users: Vec::new(),
            server_key,
        }
    }
}

/// The login server: build it (hashes the users, measures a verify), then
/// serve a listener or take its router.
pub struct LoginServer {
    app: Arc<App>,
}

struct App {
    limiter: Arc<Client>,
    hasher: Argon2<'static>,
    /// account -> PHC string.
    users: HashMap<String, String>,
    /// The hash an unknown account is verified against, with the same
    /// parameters as real ones, so the work is identical.
    dummy_hash: String,
    server_key: [u8; 32],
    floor: Duration,
    verify_time: Duration,
}

impl LoginServer {
    /// CPU-bound (argon2): call it before serving, or from `spawn_blocking`.
    pub fn new(settings: Settings) -> anyhow::Result<LoginServer> {
        let hasher = Argon2::new(Algorithm::Argon2id, Version::V0x13, settings.argon2);
        let mut users = HashMap::new();
        for (account, password) in &settings.users {
            users.insert(account.clone(), hash_password(&hasher, password)?);
        }
        let dummy_hash = hash_password(&hasher, &hex(&random_bytes::<16>()))?;
        // Time a few real failed verifies (after one untimed, which pays
        // for first-touch page faults): the floor must cover one.
        verify(&hasher, &dummy_hash, "warm-up");
        let mut verify_time = Duration::ZERO;
        for _ in 0..VERIFY_SAMPLES {
            let started = Instant::now();
            let ok = verify(&hasher, &dummy_hash, "not the password");
            verify_time = verify_time.max(started.elapsed());
            debug_assert!(!ok);
        }
        let floor = settings.floor.max(verify_time.mul_f64(FLOOR_OVER_VERIFY));
        let limiter = Arc::new(Client::new(ClientConfig::new(settings.socket).timeout(settings.daemon_timeout)));
        let app = App { limiter, hasher, users, dummy_hash, server_key: settings.server_key, floor, verify_time };
        Ok(LoginServer { app: Arc::new(app) })
    }

    /// The floor in force: max(configured, 1.5 × slowest measured verify).
    pub fn floor(&self) -> Duration {
        self.app.floor
    }

    /// The slowest of the argon2 verifies timed at start.
    pub fn verify_time(&self) -> Duration {
        self.app.verify_time
    }

    /// `POST /login` and `GET /api/ping`. Serve it with
    /// `into_make_service_with_connect_info::<SocketAddr>()`: the handlers
    /// read the TCP peer from `ConnectInfo`.
    pub fn router(&self) -> Router {
        let login = post(login).layer(middleware::from_fn_with_state(self.app.clone(), hold_non_success));
        Router::new().route("/login", login).route("/api/ping", get(ping)).with_state(self.app.clone())
    }

    pub async fn serve(self, listener: TcpListener) -> std::io::Result<()> {
        axum::serve(listener, self.router().into_make_service_with_connect_info::<SocketAddr>()).await
    }
}

// ---- POST /login ----

#[derive(Deserialize)]
struct LoginFields {
    account: String,
    password: String,
    #[serde(default)]
    device: Option<String>,
}

/// `application/json` or `application/x-www-form-urlencoded`, the same fields.
struct LoginBody(LoginFields);

impl<S: Send + Sync> FromRequest<S> for LoginBody {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<LoginBody, Response> {
        let json = request
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("application/json"));
        let fields = if json {
            Json::<LoginFields>::from_request(request, state).await.map(|Json(f)| f).ok()
        } else {
            Form::<LoginFields>::from_request(request, state).await.map(|Form(f)| f).ok()
        };
        fields.map(LoginBody).ok_or_else(|| json_response(StatusCode::BAD_REQUEST, BAD_REQUEST_BODY))
    }
}

/// The constant-time floor: every `/login` answer but a success leaves no
/// sooner than `floor` after the request arrived (here: once its head was
/// read; the body is read inside), so a refusal, an unknown account, a
/// malformed body or an unreachable daemon all take as long as a real wrong
/// password. A success may be faster: its user learns nothing new from it.
async fn hold_non_success(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let arrived = tokio::time::Instant::now();
    let response = next.run(request).await;
    if response.status() != StatusCode::OK {
        tokio::time::sleep_until(arrived + app.floor).await;
    }
    response
}

async fn login(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    LoginBody(fields): LoginBody,
) -> Response {
    let forwarded_for = forwarded_for(&headers);
    let presented_device = fields.device.filter(|d| is_device_id(d)).or_else(|| device_cookie(&headers));
    // The account exactly as typed, whether or not it exists; the raw
    // X-Forwarded-For (the daemon decides whether the peer is a trusted
    // proxy); the TCP peer.
    let subject = Subject {
        peer: Some(peer.ip()),
        forwarded_for: forwarded_for.as_deref(),
        account: Some(&fields.account),
        device: presented_device.as_deref(),
        ..Subject::default()
    };

    // 1. Before any expensive work: may this attempt proceed? The attempt
    // is a guard: if this handler is dropped before step 3 (the client hung
    // up, axum cancels the future), it tells the daemon the attempt was
    // abandoned, so no place is held for a password nobody learned about.
    let attempt = app.limiter.begin("login", &subject, None).await;
    let answer = attempt.answer();
    if !answer.proceeds() {
        // One refusal form whatever the reason; the reason and the rule go
        // to the log only.
        match &answer {
            Answer::Verdict(v) if v.decision == Decision::Challenge => {
                // A step-up (CAPTCHA, proof of work, e-mailed link) plugs in
                // here: answer with the challenge instead of a refusal, and
                // let the attempt proceed once it is solved. This example has
                // none, so a challenge is refused like a deny.
                tracing::info!(rule = %v.rule, reason = ?v.reason, "login challenged (no step-up here): refused");
            }
            Answer::Verdict(v) => tracing::info!(rule = %v.rule, reason = ?v.reason, "login refused"),
            Answer::Rejected(e) => tracing::warn!(code = ?e.code, message = %e.message, "tollgate rejected the check"),
            Answer::Unavailable { error, .. } => tracing::warn!(%error, "tollgate unavailable: login refused"),
        }
        return refused(answer.verdict().map_or(1000, |v| v.retry_after_ms));
    }
    match answer {
        Answer::Verdict(v) if v.decision == Decision::Delay => {
            tokio::time::sleep(Duration::from_millis(v.delay_ms)).await;
        }
        // The daemon could not answer in time. Login's built-in fail policy
        // is `open` (`proceeds()` said so): locking every user out because
        // the limiter is down would be worse than a few unlimited guesses,
        // and argon2 still makes each of them expensive. Log it and go on.
        Answer::Unavailable { policy, error, .. } => {
            tracing::warn!(?policy, %error, "tollgate unavailable: login fails open");
        }
        _ => {}
    }

    // 2. Verify. An unknown account is verified against the dummy hash with
    // the same parameters, so the work is the same as for a real one.
    let digest = password_digest(&app.server_key, &fields.account, &fields.password);
    let password_ok = {
        let app = app.clone();
        let account = fields.account.clone();
        let password = fields.password;
        tokio::task::spawn_blocking(move || {
            let stored = app.users.get(&account);
            let ok = verify(&app.hasher, stored.unwrap_or(&app.dummy_hash), &password);
            ok && stored.is_some()
        })
        .await
        .unwrap_or(false)
    };

    // 3. Report the outcome. On success a device id is issued (or the
    // presented one kept) and reported with it, so the daemon knows the
    // device for this account next time. The password digest is sent with
    // failures only: it is what lets the daemon not count a repeated wrong
    // password twice, and a success needs none.
    let device = match (password_ok, &presented_device) {
        (true, None) => Some(hex(&random_bytes::<16>())),
        _ => presented_device.clone(),
    };
    let subject = Subject { device: device.as_deref(), ..subject };
    let (outcome, digest) = if password_ok { (Outcome::Success, None) } else { (Outcome::Failure, Some(digest)) };
    match attempt.report_as(&subject, outcome, digest, None).await.answer {
        Answer::Verdict(_) => {}
        Answer::Rejected(e) => tracing::warn!(code = ?e.code, message = %e.message, "tollgate rejected the report"),
        // The outcome stands either way; the daemon just did not count it.
        Answer::Unavailable { error, .. } => tracing::warn!(%error, "tollgate unavailable: report not counted"),
    }

    if !password_ok {
        return json_response(StatusCode::UNAUTHORIZED, FAILED_BODY);
    }
    let device = device.expect("set on success");
    let cookie = format!(
        "{DEVICE_COOKIE}={device}; Path=/login; Max-Age={DEVICE_COOKIE_MAX_AGE_SECS}; HttpOnly; Secure; SameSite=Strict"
    );
    let mut response = json_response(StatusCode::OK, &format!(r#"{{"status":"ok","device":"{device}"}}"#));
    response.headers_mut().insert(SET_COOKIE, HeaderValue::from_str(&cookie).expect("hex cookie"));
    response
}

/// 429, `Retry-After` in whole seconds (rounded up, at least 1), one body.
/// No `RateLimit-*` headers on login: they would tell an attacker how many
/// guesses are left before a threshold.
fn refused(retry_after_ms: u64) -> Response {
    let mut response = json_response(StatusCode::TOO_MANY_REQUESTS, REFUSED_BODY);
    response.headers_mut().insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(retry_after_ms)));
    response
}

fn retry_after_secs(retry_after_ms: u64) -> u64 {
    retry_after_ms.div_ceil(1000).max(1)
}

// ---- GET /api/ping: a plain rate-limited API route ----

/// Route `request` (a rate per source prefix). Here the `RateLimit-*`
/// headers are right: a well-behaved API client paces itself with them, and
/// they reveal nothing about anyone's credentials.
async fn ping(State(app): State<Arc<App>>, ConnectInfo(peer): ConnectInfo<SocketAddr>, headers: HeaderMap) -> Response {
    let forwarded_for = forwarded_for(&headers);
    let subject = Subject { peer: Some(peer.ip()), forwarded_for: forwarded_for.as_deref(), ..Subject::default() };
    let answer = app.limiter.check("request", &subject).await;
    let mut response = match &answer {
        _ if answer.proceeds() => json_response(StatusCode::OK, r#"{"pong":true}"#),
        Answer::Verdict(v) => {
            let mut r = json_response(StatusCode::TOO_MANY_REQUESTS, REFUSED_BODY);
            r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(v.retry_after_ms)));
            r
        }
        Answer::Rejected(e) => {
            tracing::warn!(code = ?e.code, message = %e.message, "tollgate rejected the check");
            refused(1000)
        }
        // `request` fails closed: without the limiter, no API.
        Answer::Unavailable { error, .. } => {
            tracing::warn!(%error, "tollgate unavailable: api fails closed");
            let mut r = json_response(StatusCode::SERVICE_UNAVAILABLE, UNAVAILABLE_BODY);
            r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(1u64));
            r
        }
    };
    if let Some(v) = answer.verdict() {
        let h = response.headers_mut();
        h.insert("ratelimit-limit", HeaderValue::from(v.limit));
        h.insert("ratelimit-remaining", HeaderValue::from(v.remaining));
        h.insert("ratelimit-reset", HeaderValue::from(v.reset_ms.div_ceil(1000)));
    }
    response
}

// ---- helpers ----

fn json_response(status: StatusCode, body: &str) -> Response {
    let headers = [(CONTENT_TYPE, "application/json"), (CACHE_CONTROL, "no-store")];
    (status, headers, body.to_string()).into_response()
}

/// Every X-Forwarded-For line, joined as one header (RFC 9110 §5.3), raw.
/// A line that is not valid UTF-8 is passed lossily: the daemon then finds
/// the header malformed and uses the peer, as it should.
fn forwarded_for(headers: &HeaderMap) -> Option<String> {
    let lines: Vec<_> =
        headers.get_all("x-forwarded-for").iter().map(|v| String::from_utf8_lossy(v.as_bytes())).collect();
    (!lines.is_empty()).then(|| lines.join(", "))
}

fn device_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().strip_prefix(DEVICE_COOKIE)?.strip_prefix('='))
        .find(|d| is_device_id(d))
        .map(str::to_string)
}

fn is_device_id(d: &str) -> bool {
    d.len() == DEVICE_ID_HEX_LEN && d.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn hash_password(hasher: &Argon2<'_>, password: &str) -> anyhow::Result<String> {
    let salt = SaltString::encode_b64(&random_bytes::<16>()).map_err(|e| anyhow::anyhow!("salt: {e}"))?;
    let hash = hasher.hash_password(password.as_bytes(), &salt).map_err(|e| anyhow::anyhow!("argon2: {e}"))?;
    Ok(hash.to_string())
}

/// The parameters come from the PHC string, so the dummy hash costs what a
/// real one costs as long as both were made with the same `Params`.
fn verify(hasher: &Argon2<'_>, phc: &str, password: &str) -> bool {
    PasswordHash::new(phc).is_ok_and(|hash| hasher.verify_password(password.as_bytes(), &hash).is_ok())
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::getrandom(&mut bytes).expect("OS random source");
    bytes
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ---- main ----

#[derive(clap::Parser)]
#[command(about = "Example login server in front of a tollgate daemon")]
struct Args {
    /// The tollgate daemon's socket.
    #[arg(long, env = "TOLLGATE_SOCKET", default_value = tollgate::SOCKET_PATH_DEFAULT)]
    socket: PathBuf,
    /// Address to listen on; loopback only (this is an example).
    #[arg(long, env = "LOGIN_SERVER_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Minimum time of every non-success login answer (raised to cover a
    /// real argon2 verify).
    #[arg(long, env = "LOGIN_SERVER_FLOOR", default_value = "50ms", value_parser = humantime::parse_duration)]
    floor: Duration,
    /// Password of the demo account `alice`.
    #[arg(long, env = "LOGIN_SERVER_DEMO_PASSWORD", default_value = "correct horse battery staple")]
    demo_password: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    use clap::Parser;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    anyhow::ensure!(args.listen.ip().is_loopback(), "--listen {}: this example binds loopback only", args.listen);
    let mut settings = Settings::new(&args.socket);
    settings.floor = args.floor;
    settings.users.push(("alice".to_string(), args.demo_password));
    let server = tokio::task::spawn_blocking(move || LoginServer::new(settings)).await??;
    let listener = TcpListener::bind(args.listen).await.with_context(|| format!("bind {}", args.listen))?;
    tracing::info!(
        listen = %args.listen,
        socket = %args.socket.display(),
        floor = ?server.floor(),
        argon2_verify = ?server.verify_time(),
        "login server ready (demo account: alice)"
    );
    server.serve(listener).await?;
    Ok(())
}
