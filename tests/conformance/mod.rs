//! The kit's parts: a runner process spoken to a line at a time, the
//! scenarios and what each runs against, and the digest comparison.

mod front;
mod runner;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use tollgate::client::protocol::{Outcome, Reason, Subject};
use tollgate::client::{password_digest, password_tag, Client, ClientConfig};

use crate::common::TestDaemon;
use front::{Front, Silent};
pub use runner::Runner;

/// The password key every scenario's client and the kit's own Rust client
/// use, so that a digest or tag made by one is recognised from the other.
pub const KEY: [u8; 32] = [7; 32];
pub struct Scenario {
    pub name: String,
    /// `daemon` (with `config`, `front`), `absent` or `silent`.
    target: Value,
    steps: Vec<Value>,
}

impl Scenario {
    pub fn load(path: &Path) -> Vec<Scenario> {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let file: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let scenarios = file["scenarios"].as_array().expect("a `scenarios` list");
        scenarios
            .iter()
            .map(|s| Scenario {
                name: s["name"].as_str().expect("a scenario's name").to_string(),
                target: s["target"].clone(),
                steps: s["steps"].as_array().expect("a scenario's steps").clone(),
            })
            .collect()
    }
}

/// What a scenario runs against, alive until the scenario ends.
enum Target {
    Daemon { daemon: TestDaemon, front: Option<Front> },
    Absent(tempfile::TempDir),
    Silent(Silent),
}

impl Target {
    fn start(spec: &Value) -> Target {
        match spec["kind"].as_str() {
            Some("daemon") => {
                let daemon = TestDaemon::start_with(spec["config"].as_str(), true);
                let front = spec.get("front").map(|f| {
                    let version_max = f["version_max"].as_u64().unwrap_or(5) as u8;
                    Front::start(&daemon.socket, version_max)
                });
                Target::Daemon { daemon, front }
            }
            Some("absent") => Target::Absent(tempfile::tempdir().unwrap()),
            Some("silent") => Target::Silent(Silent::start()),
            other => panic!("unknown target kind {other:?}"),
        }
    }

    fn socket(&self) -> PathBuf {
        match self {
            Target::Daemon { front: Some(front), .. } => front.socket.clone(),
            Target::Daemon { daemon, .. } => daemon.socket.clone(),
            Target::Absent(dir) => dir.path().join("nobody-listens.sock"),
            Target::Silent(silent) => silent.socket.clone(),
        }
    }

    fn front(&self) -> Result<&Front, String> {
        match self {
            Target::Daemon { front: Some(front), .. } => Ok(front),
            _ => Err("the step needs a target with a `front`".to_string()),
        }
    }

    fn log(&self) -> String {
        match self {
            Target::Daemon { daemon, .. } => daemon.log(),
            _ => String::new(),
        }
    }
}

pub fn run_scenario(runner: &mut Runner, scenario: &Scenario) -> Result<(), String> {
    let target = Target::start(&scenario.target);
    run_steps(runner, &scenario.steps, &target).map_err(|why| format!("{why}\ndaemon log:\n{}", target.log()))
}

fn run_steps(runner: &mut Runner, steps: &[Value], target: &Target) -> Result<(), String> {
    let socket = target.socket();
    for (n, step) in steps.iter().enumerate() {
        let at = |why: String| format!("step {}: {why}\n  the step: {step}", n + 1);
        let rounds = step["repeat"].as_u64().unwrap_or(1);
        if let Some(group) = step["steps"].as_array() {
            for round in 0..rounds {
                run_steps(runner, group, target).map_err(|why| at(format!("round {}: {why}", round + 1)))?;
            }
            continue;
        }
        if let Some(kit) = step["kit"].as_str() {
            kit_step(kit, step, target, &socket).map_err(at)?;
            continue;
        }
        let request = substitute(&step["send"], &socket);
        for round in 0..rounds {
            let reply = runner.call(&request).map_err(at)?;
            // (An `unavailable` answer has an `error` too: the kind.)
            if let (Some(error), None) = (reply.get("error"), reply.get("answer")) {
                return Err(at(format!("the runner could not: {error}")));
            }
            let expect = &step["expect"];
            if let Err(why) = matches(expect, &reply, "") {
                return Err(at(format!("round {}: {why}\n  expected {expect}\n  got      {reply}", round + 1)));
            }
        }
    }
    Ok(())
}

/// Steps the kit does itself: freezing the front, and reports made with
/// the Rust client (so a runner's digests and tags must match its).
fn kit_step(kit: &str, step: &Value, target: &Target, socket: &Path) -> Result<(), String> {
    match kit {
        "freeze" => target.front()?.freeze(true),
        "thaw" => target.front()?.freeze(false),
        "report" => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let client = Client::new(ClientConfig::new(socket).timeout(Duration::from_secs(5)));
            let (peer, account) = (step["subject"]["peer"].as_str(), step["subject"]["account"].as_str());
            let subject = Subject { peer: peer.map(|p| p.parse().unwrap()), account, ..Subject::default() };
            let password = step["password"].as_str().ok_or("a kit report needs a password")?;
            let digest = password_digest(&KEY, account.unwrap_or(""), password);
            let route = step["route"].as_str().ok_or("a kit report needs a route")?;
            let answered = runtime.block_on(async {
                client.check(route, &subject).await;
                let tag = Some(password_tag(&KEY, password));
                client.report_tagged(route, &subject, Outcome::Failure, Some(digest), tag).await
            });
            if answered.answer.verdict().is_none() {
                return Err(format!("the kit's own report was not answered: {:?}", answered.answer));
            }
        }
        "await_spray_flag" => {
            // Detection runs beside the request path: wait until the Rust
            // client's check with this password is refused for it.
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let client = Client::new(ClientConfig::new(socket).timeout(Duration::from_secs(5)));
            let tag = Some(password_tag(&KEY, step["password"].as_str().ok_or("needs a password")?));
            let subject =
                Subject { peer: Some("192.0.2.99".parse().unwrap()), account: Some("kit"), ..Subject::default() };
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let answered = runtime.block_on(client.check_tagged("login", &subject, tag));
                if answered.answer.verdict().is_some_and(|v| v.reason == Reason::SpraySuspected) {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    return Err("the kit's password was not flagged within 10 s".to_string());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        other => return Err(format!("unknown kit step {other:?}")),
    }
    Ok(())
}

/// `$socket` and `$key` in any string of the request.
fn substitute(value: &Value, socket: &Path) -> Value {
    match value {
        Value::String(s) if s == "$socket" => json!(socket.display().to_string()),
        Value::String(s) if s == "$key" => json!(hex(&KEY)),
        Value::String(s) if s.starts_with("$repeat:") => {
            // `$repeat:<n>:<text>[|<tail>]`: the text n times, then the
            // tail (long identifiers and headers).
            let mut parts = s.splitn(3, ':').skip(1);
            let n: usize = parts.next().and_then(|n| n.parse().ok()).expect("$repeat:<n>:<text>");
            let rest = parts.next().unwrap_or("");
            let (text, tail) = rest.split_once('|').unwrap_or((rest, ""));
            json!(text.repeat(n) + tail)
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| substitute(v, socket)).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), substitute(v, socket))).collect()),
        other => other.clone(),
    }
}

/// Every key of `expect` is in `got` with the same value (objects and
/// lists compared the same way, lists element by element).
fn matches(expect: &Value, got: &Value, path: &str) -> Result<(), String> {
    match (expect, got) {
        (Value::Object(want), Value::Object(have)) => {
            for (key, value) in want {
                let here = format!("{path}.{key}");
                let Some(actual) = have.get(key) else { return Err(format!("{here} is missing")) };
                matches(value, actual, &here)?;
            }
            Ok(())
        }
        (Value::Array(want), Value::Array(have)) if want.len() == have.len() => {
            want.iter().zip(have).enumerate().try_for_each(|(i, (w, h))| matches(w, h, &format!("{path}[{i}]")))
        }
        (want, have) if want == have => Ok(()),
        (want, have) => Err(format!("{path}: expected {want}, got {have}")),
    }
}

/// The runner's digests and tags for the vectors file and for generated
/// inputs, against the Rust client's.
pub fn digests(runner: &mut Runner) -> Result<(), String> {
    let file: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/passwords.json")).unwrap(),
    )
    .unwrap();
    let mut cases: Vec<(String, String, String)> = file["vectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let text = |k: &str| v[k].as_str().unwrap().to_string();
            (text("key"), text("account"), text("password"))
        })
        .collect();
    let mut rng = crate::common::Rng(0x7011_6a7e);
    let alphabet: Vec<char> = "aZ9 _-.@éßж日🔑\u{0}\"\\".chars().collect();
    for _ in 0..40 {
        let key: Vec<u8> = (0..32).map(|_| rng.below(256) as u8).collect();
        let mut text = |max: u64| -> String {
            (0..rng.below(max)).map(|_| alphabet[rng.below(alphabet.len() as u64) as usize]).collect()
        };
        let (account, password) = (text(40), text(300));
        cases.push((hex(&key), account, password));
    }
    for (key, account, password) in cases {
        let key_bytes: [u8; 32] = unhex(&key).try_into().unwrap();
        let want = json!({
            "digest": hex(&password_digest(&key_bytes, &account, &password)),
            "tag": hex(&password_tag(&key_bytes, &password)),
        });
        let request = json!({ "op": "digest", "key": key, "account": account, "password": password });
        let got = runner.call(&request)?;
        matches(&want, &got, "").map_err(|why| format!("{why}\n  for {request}\n  expected {want}\n  got {got}"))?;
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}
