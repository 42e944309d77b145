//! The Rust client's conformance runner: one JSON request a line on stdin,
//! one JSON reply a line on stdout, as docs/clients.md ("The runner")
//! defines for every client. `tests/client_conformance.rs` runs the
//! scenarios through it and through the other languages' runners.
//!
//! `cargo run --example conformance_runner` and type requests.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::client::codec;
use tollgate::client::protocol::{Outcome, Request, Subject, PROTOCOL_VERSION};
use tollgate::client::{password_digest, password_tag, Answer, Answered, Attempt, Client, ClientConfig, ClientError};
use tollgate::FailPolicy;

pub fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    let mut runner = Runner { client: None, key: [0; 32], attempts: HashMap::new() };
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(request) => runtime.block_on(runner.serve(&request)).unwrap_or_else(|why| json!({ "error": why })),
            Err(e) => json!({ "error": format!("not JSON: {e}") }),
        };
        writeln!(stdout, "{reply}").and_then(|()| stdout.flush()).expect("stdout is open");
    }
}

struct Runner {
    client: Option<Arc<Client>>,
    key: [u8; 32],
    /// Begun attempts by name, with the subject they were checked for;
    /// None once finished (the guard is spent, and `end` sends nothing).
    attempts: HashMap<String, Option<(Attempt, OwnedSubject)>>,
}

/// A request's subject, owned: `Subject` borrows its strings.
#[derive(Clone, Default)]
struct OwnedSubject {
    peer: Option<IpAddr>,
    fields: [Option<String>; 5],
}

impl OwnedSubject {
    fn of(value: &Value) -> Result<OwnedSubject, String> {
        let text = |name: &str| value.get(name).and_then(Value::as_str).map(str::to_owned);
        let peer = match text("peer") {
            Some(p) => Some(p.parse().map_err(|e| format!("subject.peer {p:?}: {e}"))?),
            None => None,
        };
        let fields = ["forwarded_for", "account", "device", "tenant", "client_id"].map(text);
        Ok(OwnedSubject { peer, fields })
    }

    fn subject(&self) -> Subject<'_> {
        let [forwarded_for, account, device, tenant, client_id] = self.fields.each_ref().map(Option::as_deref);
        Subject { peer: self.peer, forwarded_for, account, device, tenant, client_id }
    }
}

impl Runner {
    fn client(&self) -> Result<Arc<Client>, String> {
        self.client.clone().ok_or_else(|| "no client: send `open` first".to_string())
    }

    async fn serve(&mut self, request: &Value) -> Result<Value, String> {
        let op = request["op"].as_str().ok_or("no `op`")?;
        let route = request["route"].as_str().unwrap_or_default();
        let subject = OwnedSubject::of(&request["subject"])?;
        let password = request["password"].as_str();
        let tag = password.map(|p| password_tag(&self.key, p));
        match op {
            "open" => self.open(request),
            "check" => Ok(answer_json(&self.client()?.check_tagged(route, &subject.subject(), tag).await)),
            "report" => {
                let outcome = outcome(request)?;
                let digest = password.map(|p| password_digest(&self.key, account(&subject), p));
                let client = self.client()?;
                Ok(answer_json(&client.report_tagged(route, &subject.subject(), outcome, digest, tag).await))
            }
            "abandon" => Ok(answer_json(&self.client()?.abandon(route, &subject.subject()).await)),
            "checks" => {
                let subjects = request["subjects"].as_array().ok_or("no `subjects`")?;
                let client = self.client()?;
                let mut calls = Vec::new();
                for s in subjects {
                    let (client, route, subject) = (client.clone(), route.to_owned(), OwnedSubject::of(s)?);
                    calls.push(tokio::spawn(async move { client.check_answered(&route, &subject.subject()).await }));
                }
                let mut answers = Vec::new();
                for call in calls {
                    answers.push(answer_json(&call.await.map_err(|e| e.to_string())?));
                }
                Ok(json!({ "answers": answers }))
            }
            "begin" => {
                let name = attempt_name(request)?;
                let attempt = self.client()?.begin(route, &subject.subject(), tag).await;
                let reply = answer_json(attempt.answered());
                self.attempts.insert(name, Some((attempt, subject)));
                Ok(reply)
            }
            "finish" => {
                let name = attempt_name(request)?;
                let slot = self.attempts.get_mut(&name).ok_or("no such attempt")?;
                let (attempt, begun) = slot.take().ok_or("the attempt is finished already")?;
                let outcome = outcome(request)?;
                let answered = if request["subject"].is_object() {
                    let digest = password.map(|p| password_digest(&self.key, account(&subject), p));
                    attempt.report_as(&subject.subject(), outcome, digest, tag).await
                } else {
                    let digest = password.map(|p| password_digest(&self.key, account(&begun), p));
                    attempt.report(outcome, digest, tag).await
                };
                Ok(answer_json(&answered))
            }
            "end" => {
                let slot = self.attempts.remove(&attempt_name(request)?).ok_or("no such attempt")?;
                let abandoned = match slot {
                    Some((attempt, _)) => attempt.abandon().await.is_some(),
                    None => false,
                };
                Ok(json!({ "abandoned": abandoned }))
            }
            "digest" => {
                let key = parse_key(request["key"].as_str().ok_or("no `key`")?)?;
                let (account, password) = (request["account"].as_str().unwrap_or(""), password.unwrap_or(""));
                Ok(json!({
                    "digest": hex(&password_digest(&key, account, password)),
                    "tag": hex(&password_tag(&key, password)),
                }))
            }
            "bench" => self.bench(request, route, subject).await,
            other => Err(format!("unknown op {other:?}")),
        }
    }

    fn open(&mut self, request: &Value) -> Result<Value, String> {
        let socket = request["socket"].as_str().ok_or("no `socket`")?;
        let mut config = ClientConfig::new(socket);
        if let Some(ms) = request["timeout_ms"].as_u64() {
            config = config.timeout(Duration::from_millis(ms));
        }
        if let Some(ms) = request["busy_max_ms"].as_u64() {
            config = config.busy_max(Duration::from_millis(ms));
        }
        if let Some(version) = request["protocol_version"].as_u64() {
            config = config.protocol_version(version as u8);
        }
        for (route, policy) in request["fail_policies"].as_object().into_iter().flatten() {
            let policy = match policy.as_str() {
                Some("open") => FailPolicy::Open,
                Some("closed") => FailPolicy::Closed,
                _ => return Err(format!("fail policy of {route}: {policy}")),
            };
            config = config.fail_policy(route, policy);
        }
        for (route, budget) in request["static_budgets"].as_object().into_iter().flatten() {
            let number = |name: &str| budget[name].as_u64().ok_or(format!("static_budgets.{route}.{name}"));
            let period = Duration::from_millis(number("period_ms")?);
            config = config.static_budget(route, number("limit")? as u32, period, number("burst")? as u32);
        }
        self.key = match request["key"].as_str() {
            Some(key) => parse_key(key)?,
            None => [0; 32],
        };
        self.attempts.clear();
        self.client = Some(Arc::new(Client::new(config)));
        Ok(json!({ "ok": true }))
    }

    async fn bench(&self, request: &Value, route: &str, subject: OwnedSubject) -> Result<Value, String> {
        let client = self.client()?;
        let threads = request["threads"].as_u64().unwrap_or(1).max(1);
        let millis = Duration::from_millis(request["millis"].as_u64().unwrap_or(1000));
        let raw = request["raw"].as_bool().unwrap_or(false);
        let socket = client.config().socket.clone();
        let started = Instant::now();
        let mut loops = Vec::new();
        for _ in 0..threads {
            let (client, route, subject, socket) = (client.clone(), route.to_owned(), subject.clone(), socket.clone());
            loops.push(tokio::spawn(async move {
                let mut calls = 0u64;
                if raw {
                    let mut frame = Vec::new();
                    let check = Request::Check { route: &route, subject: subject.subject() };
                    codec::encode_request_versioned(PROTOCOL_VERSION, 1, &check, &mut frame);
                    let mut stream = tokio::net::UnixStream::connect(&socket).await.map_err(|e| e.to_string())?;
                    let mut reply = vec![0u8; 512];
                    while started.elapsed() < millis {
                        stream.write_all(&frame).await.map_err(|e| e.to_string())?;
                        let mut length = [0u8; 4];
                        stream.read_exact(&mut length).await.map_err(|e| e.to_string())?;
                        reply.resize(u32::from_le_bytes(length) as usize, 0);
                        stream.read_exact(&mut reply).await.map_err(|e| e.to_string())?;
                        calls += 1;
                    }
                } else {
                    while started.elapsed() < millis {
                        client.check(&route, &subject.subject()).await;
                        calls += 1;
                    }
                }
                Ok::<u64, String>(calls)
            }));
        }
        let mut calls = 0;
        for one in loops {
            calls += one.await.map_err(|e| e.to_string())??;
        }
        Ok(json!({ "calls": calls, "millis": started.elapsed().as_millis() as u64 }))
    }
}

fn account(subject: &OwnedSubject) -> &str {
    subject.fields[1].as_deref().unwrap_or("")
}

fn attempt_name(request: &Value) -> Result<String, String> {
    request["attempt"].as_str().map(str::to_owned).ok_or_else(|| "no `attempt`".to_string())
}

fn outcome(request: &Value) -> Result<Outcome, String> {
    match request["outcome"].as_str() {
        Some("success") => Ok(Outcome::Success),
        Some("failure") => Ok(Outcome::Failure),
        other => Err(format!("outcome {other:?}: success or failure")),
    }
}

fn parse_key(text: &str) -> Result<[u8; 32], String> {
    let bytes: Result<Vec<u8>, _> =
        (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2).unwrap_or("x"), 16)).collect();
    bytes.ok().and_then(|b| b.try_into().ok()).ok_or_else(|| format!("key {text:?}: 64 hex digits"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An answer as docs/clients.md writes it.
fn answer_json(answered: &Answered) -> Value {
    let answer = &answered.answer;
    let mut reply = match answer {
        Answer::Verdict(v) => json!({
            "answer": "verdict",
            "decision": v.decision,
            "retry_after_ms": v.retry_after_ms,
            "delay_ms": v.delay_ms,
            "limit": v.limit,
            "remaining": v.remaining,
            "reset_ms": v.reset_ms,
            "reason": v.reason,
            "rule": v.rule,
            "degraded": answered.degraded,
        }),
        Answer::Rejected(e) => json!({ "answer": "rejected", "code": e.code }),
        Answer::Unavailable { policy, error, within_static_budget } => json!({
            "answer": "unavailable",
            "policy": policy.name(),
            "error": match error {
                ClientError::Connect { .. } => "connect",
                ClientError::Timeout(_) => "timeout",
                ClientError::Busy(_) => "busy",
                ClientError::Io(_) => "io",
                ClientError::Protocol(_) | ClientError::Daemon(_) => "protocol",
            },
            "within_static_budget": within_static_budget,
        }),
    };
    reply["proceeds"] = json!(answer.proceeds());
    reply["retry_after_s"] = json!(answer.retry_after_secs());
    reply
}
