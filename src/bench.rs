//! `tollgate bench`: a load generator that drives a running daemon (or the
//! bare echo server, for the transport floor) over its socket and reports
//! throughput and latency percentiles from an HDR histogram.
//!
//! Each connection sends `in_flight` requests in one write and waits for all
//! their replies before the next batch, like `redis-benchmark -P`, so the
//! figures compare directly with the Redis peer baseline.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use crate::codec::{self, FRAME_HEADER_BYTES, RESPONSE_PAYLOAD_BYTES_MAX};
use crate::protocol::{Outcome, Request, Response, Subject};

/// Latencies above this are clamped into the histogram's top bucket.
const LATENCY_US_MAX: u64 = 60_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Distribution {
    /// Every key equally likely.
    Uniform,
    /// A few keys take most requests (cube of a uniform draw: ~50% of the
    /// traffic on the hottest ~12.5% of keys).
    Skewed,
}

#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    /// The daemon's socket (or an echo server's, with --raw).
    #[arg(long, env = "TOLLGATE_SOCKET", default_value = crate::config::SOCKET_PATH_DEFAULT)]
    pub socket: PathBuf,
    #[arg(long, default_value_t = 50)]
    pub connections: usize,
    /// Requests in flight per connection (sent in one batch).
    #[arg(long, default_value_t = 1)]
    pub in_flight: usize,
    /// How long to measure, e.g. 5s.
    #[arg(long, default_value = "5s", value_parser = |s: &str| humantime::parse_duration(s).map_err(|e| e.to_string()))]
    pub duration: Duration,
    /// Distinct keys (sources for `request`, accounts for `login`).
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    #[arg(long, value_enum, default_value_t = Distribution::Uniform)]
    pub distribution: Distribution,
    /// `request`: one check per operation; `login`: a check then a report.
    #[arg(long, default_value = "request")]
    pub route: String,
    /// With --route login: share of reports that are failures.
    #[arg(long, default_value_t = 0.1)]
    pub failure_ratio: f64,
    /// Do not decode replies, only count frames (against `tollgate echo-server`).
    #[arg(long)]
    pub raw: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Default, Serialize)]
pub struct BenchReport {
    pub route: String,
    pub connections: usize,
    pub in_flight: usize,
    pub duration_s: f64,
    pub requests: u64,
    pub ops_per_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// Replies that were refusals (not errors: the limiter working).
    pub refused: u64,
    pub errors: u64,
}

/// xorshift64*: a tiny seeded generator, so runs are repeatable (the load
/// generator's key choice, and tests' random sequences).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in 0..n.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn pick(rng: &mut Rng, keys: u64, distribution: Distribution) -> u64 {
    match distribution {
        Distribution::Uniform => rng.next_u64() % keys.max(1),
        Distribution::Skewed => ((rng.unit().powi(3)) * keys as f64) as u64 % keys.max(1),
    }
}

/// A distinct source per key: IPv4 up to 2^24 keys, IPv6 /64s beyond.
fn source_of(key: u64) -> IpAddr {
    if key < 1 << 24 {
        IpAddr::V4(Ipv4Addr::from(0x0A00_0000u32 | key as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from((0x2001_0db8u128 << 96) | ((key as u128) << 64)))
    }
}

struct Worker {
    args: Arc<BenchArgs>,
    rng: Rng,
    account: String,
}

impl Worker {
    /// Appends one operation's frames; returns how many replies to expect.
    fn encode(&mut self, id: &mut u64, out: &mut Vec<u8>) -> usize {
        let key = pick(&mut self.rng, self.args.keys, self.args.distribution);
        let peer = Some(source_of(key));
        if self.args.route == "login" {
            use std::fmt::Write;
            self.account.clear();
            let _ = write!(self.account, "user{key}");
            let subject = Subject { peer, account: Some(&self.account), ..Subject::default() };
            let outcome = if self.rng.unit() < self.args.failure_ratio { Outcome::Failure } else { Outcome::Success };
            codec::encode_request(*id, &Request::Check { route: "login", subject: subject.clone() }, out);
            codec::encode_request(
                *id + 1,
                &Request::Report { route: "login", subject, outcome, password_digest: None },
                out,
            );
            *id += 2;
            2
        } else {
            let subject = Subject { peer, ..Subject::default() };
            codec::encode_request(*id, &Request::Check { route: &self.args.route, subject }, out);
            *id += 1;
            1
        }
    }
}

#[derive(Default)]
struct Tally {
    requests: u64,
    refused: u64,
    errors: u64,
}

async fn drive(
    args: Arc<BenchArgs>,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> Result<(Histogram<u64>, Tally), std::io::Error> {
    let mut stream = UnixStream::connect(&args.socket).await?;
    let mut histogram = Histogram::<u64>::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid bounds");
    let mut tally = Tally::default();
    let mut worker = Worker { args: args.clone(), rng: Rng(seed | 1), account: String::new() };
    let mut out = Vec::with_capacity(256 * args.in_flight);
    let mut inbuf = vec![0u8; 64 * 1024];
    let mut id = 1u64;
    while !stop.load(Ordering::Relaxed) {
        out.clear();
        let mut expected = 0;
        for _ in 0..args.in_flight {
            expected += worker.encode(&mut id, &mut out);
        }
        let sent = Instant::now();
        stream.write_all(&out).await?;
        let (mut filled, mut received) = (0usize, 0usize);
        while received < expected {
            if filled == inbuf.len() {
                inbuf.resize(inbuf.len() * 2, 0);
            }
            let n = stream.read(&mut inbuf[filled..]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            filled += n;
            let mut at = 0;
            while let Ok(Some(end)) = codec::frame_len(&inbuf[at..filled], RESPONSE_PAYLOAD_BYTES_MAX) {
                if !args.raw {
                    match codec::decode_response(&inbuf[at + FRAME_HEADER_BYTES..at + end]) {
                        Ok((_, Response::Verdict(v))) => tally.refused += (!v.proceeds()) as u64,
                        _ => tally.errors += 1,
                    }
                }
                received += 1;
                at += end;
            }
            inbuf.copy_within(at..filled, 0);
            filled -= at;
        }
        let latency = (sent.elapsed().as_micros() as u64).clamp(1, LATENCY_US_MAX);
        histogram.record_n(latency, expected as u64).expect("clamped");
        tally.requests += expected as u64;
    }
    Ok((histogram, tally))
}

/// Runs the benchmark and returns its report.
pub async fn run(args: BenchArgs) -> Result<BenchReport, std::io::Error> {
    let args = Arc::new(args);
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..args.connections {
        tasks.push(tokio::spawn(drive(args.clone(), 0x9E37_79B9_7F4A_7C15 ^ (c as u64 + 1), stop.clone())));
    }
    let started = Instant::now();
    tokio::time::sleep(args.duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut histogram = Histogram::<u64>::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid bounds");
    let mut total = Tally::default();
    for task in tasks {
        let (h, t) = task.await.map_err(std::io::Error::other)??;
        histogram.add(&h).expect("same bounds");
        total.requests += t.requests;
        total.refused += t.refused;
        total.errors += t.errors;
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok(BenchReport {
        route: if args.raw { "raw".into() } else { args.route.clone() },
        connections: args.connections,
        in_flight: args.in_flight,
        duration_s: elapsed,
        requests: total.requests,
        ops_per_s: total.requests as f64 / elapsed,
        p50_us: histogram.value_at_quantile(0.5),
        p99_us: histogram.value_at_quantile(0.99),
        p999_us: histogram.value_at_quantile(0.999),
        max_us: histogram.max(),
        refused: total.refused,
        errors: total.errors,
    })
}

/// The transport floor: a server that reads length-prefixed frames and
/// writes each back, with the daemon's read/batch/write loop and nothing
/// else. `tollgate bench --raw` against it measures the socket alone.
pub async fn echo_server(listener: UnixListener) -> std::io::Result<()> {
    loop {
        let (mut stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            let mut filled = 0;
            loop {
                let n = match stream.read(&mut buf[filled..]).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                filled += n;
                let mut at = 0;
                while let Ok(Some(end)) = codec::frame_len(&buf[at..filled], codec::REQUEST_PAYLOAD_BYTES_MAX) {
                    at += end;
                }
                if at > 0 && stream.write_all(&buf[..at]).await.is_err() {
                    return;
                }
                buf.copy_within(at..filled, 0);
                filled -= at;
            }
        });
    }
}
