//! `tollgate bench`: a load generator that drives a running daemon (or the
//! bare echo server, for the transport floor) over its socket and reports
//! throughput and latency percentiles from an HDR histogram.
//!
//! Each connection sends `in_flight` requests in one write and waits for all
//! their replies before the next batch, like `redis-benchmark -P`, so the
//! figures compare directly with the Redis peer baseline.

mod echo;
mod paced;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::codec::{self, FRAME_HEADER_BYTES, RESPONSE_PAYLOAD_BYTES_MAX};
use crate::protocol::{Outcome, Request, Response, Subject};
pub use echo::{echo_server, EchoReply};
use paced::drive_paced;

/// Latencies above this are clamped into the histogram's top bucket.
const LATENCY_US_MAX: u64 = 60_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Distribution {
    /// Every key equally likely.
    Uniform,
    /// A few keys take most requests (cube of a uniform draw: ~50% of the
    /// traffic on the hottest ~12.5% of keys).
    Skewed,
    /// Each connection walks its own share of the keys in order, so no key
    /// is used twice until all have been (with `--repeat`, each N times in
    /// a row).
    Sequential,
}

/// What one operation sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mix {
    /// One `check` (source only; the `request` route's shape).
    Check,
    /// A login: `check`, then `report` of the outcome (source and account).
    CheckReport,
    /// A `report` alone (source and account).
    Report,
    /// A login's `check` alone (source and account): with a shared store,
    /// every one asks it, and no report waits behind it.
    LoginCheck,
}

#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    /// The daemon's socket (or an echo server's, with --raw).
    #[arg(long, env = "TOLLGATE_SOCKET", default_value = crate::config::SOCKET_PATH_DEFAULT)]
    pub socket: PathBuf,
    /// Connections to the daemon, each its own task.
    #[arg(long, default_value_t = 50)]
    pub connections: usize,
    /// Requests in flight per connection (sent in one batch).
    #[arg(long, default_value_t = 1)]
    pub in_flight: usize,
    /// How long to measure, e.g. 5s.
    #[arg(long, default_value = "5s", value_parser = |s: &str| humantime::parse_duration(s).map_err(|e| e.to_string()))]
    pub duration: Duration,
    /// Distinct keys (sources, and accounts when the mix reports).
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// How keys are drawn: every key alike, or a few keys most often.
    #[arg(long, value_enum, default_value_t = Distribution::Uniform)]
    pub distribution: Distribution,
    /// The route every request names.
    #[arg(long, default_value = "request")]
    pub route: String,
    /// What one operation sends [default: check-report on `login`, check
    /// elsewhere].
    #[arg(long, value_enum)]
    pub mix: Option<Mix>,
    /// Share of reports that are failures.
    #[arg(long, default_value_t = 0.1)]
    pub failure_ratio: f64,
    /// Use each chosen key for this many operations in a row: with `--mix
    /// report --failure-ratio 1` and a rule that locks at N failures,
    /// `--repeat N` makes exactly every Nth report trip a lockout.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Offer this many operations a second in total, paced evenly across
    /// the connections (one thread each), instead of sending as fast as
    /// replies return; for latency at a given load.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Before measuring, send one check for every key, so that `--keys N`
    /// means N live keys in the daemon's tables.
    #[arg(long)]
    pub prefill: bool,
    /// Stop after this many operations in total (shared evenly by the
    /// connections) instead of after `--duration`: to build a known state,
    /// e.g. exactly N lockouts with `--mix report --repeat`.
    #[arg(long)]
    pub operations: Option<u64>,
    /// Key numbers start here (sources and accounts differ from those of a
    /// run without it).
    #[arg(long, default_value_t = 0)]
    pub key_offset: u64,
    /// Do not decode replies, only count frames (against `tollgate echo-server`).
    #[arg(long)]
    pub raw: bool,
    /// With `--rate`: also time a `tollgate echo-server` on this socket in
    /// the same run, each connection alternating one operation to the
    /// daemon and the same bytes to the echo server, so the machine's
    /// stalls fall on both alike; its latencies are reported as `floor_*`.
    #[arg(long, requires = "rate")]
    pub floor_socket: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

impl BenchArgs {
    fn mix(&self) -> Mix {
        self.mix.unwrap_or(if self.route == "login" { Mix::CheckReport } else { Mix::Check })
    }
}

#[derive(Debug, Default, Serialize)]
pub struct BenchReport {
    pub route: String,
    pub connections: usize,
    pub in_flight: usize,
    /// The offered load with `--rate`; 0 when unpaced.
    pub offered_ops_per_s: f64,
    pub duration_s: f64,
    pub requests: u64,
    pub ops_per_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// Replies that were refusals (not errors: the limiter working).
    pub refused: u64,
    /// Latency of the refusals alone; with `--mix report`, the replies to
    /// the reports that tripped a lockout (each waited for its fsync).
    pub refused_p50_us: u64,
    pub refused_p99_us: u64,
    pub errors: u64,
    /// With `--floor-socket`: the echo server's replies and latencies,
    /// timed alongside the daemon's (0 without it).
    pub floor_requests: u64,
    pub floor_p50_us: u64,
    pub floor_p99_us: u64,
    pub floor_p999_us: u64,
    pub floor_max_us: u64,
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

/// A distinct source per key: IPv4 up to 2^24 keys, IPv6 /64s beyond.
fn source_of(key: u64) -> IpAddr {
    if key < 1 << 24 {
        IpAddr::V4(Ipv4Addr::from(0x0A00_0000u32 | key as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from((0x2001_0db8u128 << 96) | ((key as u128) << 64)))
    }
}

/// One connection's request maker: which key next, and its frames.
struct Worker {
    args: Arc<BenchArgs>,
    mix: Mix,
    rng: Rng,
    account: String,
    /// This connection's index, and how many operations it has made.
    connection: u64,
    made: u64,
    key: u64,
    uses_left: u32,
}

impl Worker {
    fn new(args: Arc<BenchArgs>, connection: usize) -> Worker {
        let seed = 0x9E37_79B9_7F4A_7C15 ^ (connection as u64 + 1);
        Worker {
            mix: args.mix(),
            args,
            rng: Rng(seed | 1),
            account: String::new(),
            connection: connection as u64,
            made: 0,
            key: 0,
            uses_left: 0,
        }
    }

    fn next_key(&mut self) -> u64 {
        if self.uses_left == 0 {
            let keys = self.args.keys.max(1);
            self.key = match self.args.distribution {
                Distribution::Uniform => self.rng.below(keys),
                Distribution::Skewed => ((self.rng.unit().powi(3)) * keys as f64) as u64 % keys,
                Distribution::Sequential => (self.connection + self.made * self.args.connections as u64) % keys,
            };
            self.made += 1;
            self.uses_left = self.args.repeat.max(1);
        }
        self.uses_left -= 1;
        self.key + self.args.key_offset
    }

    /// Appends one operation's frames; returns how many replies to expect.
    fn encode(&mut self, id: &mut u64, out: &mut Vec<u8>) -> usize {
        let key = self.next_key();
        let peer = Some(source_of(key));
        let route = self.args.route.as_str();
        if self.mix == Mix::Check {
            let subject = Subject { peer, ..Subject::default() };
            codec::encode_request(*id, &Request::Check { route, subject }, out);
            *id += 1;
            return 1;
        }
        use std::fmt::Write;
        self.account.clear();
        let _ = write!(self.account, "user{key}");
        let subject = Subject { peer, account: Some(&self.account), ..Subject::default() };
        let outcome = if self.rng.unit() < self.args.failure_ratio { Outcome::Failure } else { Outcome::Success };
        if self.mix == Mix::LoginCheck {
            codec::encode_request(*id, &Request::Check { route, subject }, out);
            *id += 1;
            return 1;
        }
        let mut frames = 0;
        if self.mix == Mix::CheckReport {
            codec::encode_request(*id, &Request::Check { route, subject: subject.clone() }, out);
            *id += 1;
            frames += 1;
        }
        codec::encode_request(*id, &Request::Report { route, subject, outcome, password_digest: None }, out);
        *id += 1;
        frames + 1
    }
}

/// Latencies and counts of one connection, merged at the end.
struct Tally {
    all: Histogram<u64>,
    refused: Histogram<u64>,
    requests: u64,
    errors: u64,
}

impl Tally {
    fn new() -> Tally {
        let histogram = || Histogram::<u64>::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid bounds");
        Tally { all: histogram(), refused: histogram(), requests: 0, errors: 0 }
    }

    fn merge(&mut self, other: &Tally) {
        self.all.add(&other.all).expect("same bounds");
        self.refused.add(&other.refused).expect("same bounds");
        self.requests += other.requests;
        self.errors += other.errors;
    }

    /// Counts the whole replies at the front of `buf`, each answered
    /// `latency_us` after it was sent; returns (bytes, replies) consumed.
    fn take_replies(&mut self, buf: &[u8], raw: bool, latency_us: u64) -> (usize, usize) {
        let latency = latency_us.clamp(1, LATENCY_US_MAX);
        let (mut at, mut replies) = (0, 0);
        while let Ok(Some(end)) = codec::frame_len(&buf[at..], RESPONSE_PAYLOAD_BYTES_MAX) {
            if !raw {
                match codec::decode_response_borrowed(&buf[at + FRAME_HEADER_BYTES..at + end]) {
                    Ok((_, Response::Verdict(v))) if !v.proceeds() => {
                        self.refused.record(latency).expect("clamped");
                    }
                    Ok((_, Response::Verdict(_))) => {}
                    _ => self.errors += 1,
                }
            }
            self.all.record(latency).expect("clamped");
            replies += 1;
            at += end;
        }
        self.requests += replies as u64;
        (at, replies)
    }
}

/// A connection as fast as replies return: `in_flight` operations per write,
/// the next batch once every reply is back (like `redis-benchmark -P`).
async fn drive(args: Arc<BenchArgs>, connection: usize, stop: Arc<AtomicBool>) -> Result<Tally, std::io::Error> {
    let mut stream = UnixStream::connect(&args.socket).await?;
    let mut tally = Tally::new();
    let mut worker = Worker::new(args.clone(), connection);
    let mut out = Vec::with_capacity(256 * args.in_flight);
    let mut inbuf = vec![0u8; 64 * 1024];
    let mut id = 1u64;
    // This connection's share of `--operations`, if given.
    let mut operations_left = args.operations.map(|total| {
        let connections = args.connections as u64;
        total / connections + u64::from((connection as u64) < total % connections)
    });
    while !stop.load(Ordering::Relaxed) && operations_left != Some(0) {
        out.clear();
        let mut expected = 0;
        let batch = operations_left.map_or(args.in_flight, |left| left.min(args.in_flight as u64) as usize);
        for _ in 0..batch {
            expected += worker.encode(&mut id, &mut out);
        }
        operations_left = operations_left.map(|left| left - batch as u64);
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
            let (used, replies) = tally.take_replies(&inbuf[..filled], args.raw, sent.elapsed().as_micros() as u64);
            received += replies;
            inbuf.copy_within(used..filled, 0);
            filled -= used;
        }
    }
    Ok(tally)
}

/// Sends one check for every key (each connection its share), unmeasured.
async fn prefill(args: Arc<BenchArgs>, connection: usize) -> Result<(), std::io::Error> {
    const BATCH: u64 = 64;
    let mut stream = UnixStream::connect(&args.socket).await?;
    let mut out = Vec::with_capacity(64 * BATCH as usize);
    let mut inbuf = vec![0u8; 64 * 1024];
    let stride = args.connections as u64;
    let mut key = connection as u64;
    let mut id = 1u64;
    while key < args.keys {
        out.clear();
        let mut expected = 0;
        while expected < BATCH && key < args.keys {
            let subject = Subject { peer: Some(source_of(key)), ..Subject::default() };
            codec::encode_request(id, &Request::Check { route: &args.route, subject }, &mut out);
            id += 1;
            expected += 1;
            key += stride;
        }
        stream.write_all(&out).await?;
        let mut tally = Tally::new();
        let mut filled = 0;
        while tally.requests < expected {
            let n = stream.read(&mut inbuf[filled..]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            filled += n;
            let (used, _) = tally.take_replies(&inbuf[..filled], true, 1);
            inbuf.copy_within(used..filled, 0);
            filled -= used;
        }
    }
    Ok(())
}

/// Runs the benchmark and returns its report.
pub async fn run(args: BenchArgs) -> Result<BenchReport, std::io::Error> {
    let args = Arc::new(args);
    if args.prefill {
        let mut fills = Vec::new();
        for c in 0..args.connections {
            fills.push(tokio::spawn(prefill(args.clone(), c)));
        }
        for fill in fills {
            fill.await.map_err(std::io::Error::other)??;
        }
    }
    let mut total = Tally::new();
    let mut floor = Tally::new();
    let started = Instant::now();
    if let Some(rate) = args.rate.filter(|r| *r > 0.0) {
        let per_connection = rate / (args.connections * args.in_flight) as f64;
        let interval = Duration::from_secs_f64(1.0 / per_connection);
        let until = started + args.duration;
        let threads: Vec<_> = (0..args.connections)
            .map(|c| {
                let args = args.clone();
                std::thread::spawn(move || drive_paced(&args, c, interval, until))
            })
            .collect();
        for thread in threads {
            let (tally, floor_tally) =
                thread.join().map_err(|_| std::io::Error::other("a bench thread panicked"))??;
            total.merge(&tally);
            if let Some(floor_tally) = floor_tally {
                floor.merge(&floor_tally);
            }
        }
    } else {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..args.connections).map(|c| tokio::spawn(drive(args.clone(), c, stop.clone()))).collect();
        if args.operations.is_none() {
            tokio::time::sleep(args.duration).await;
            stop.store(true, Ordering::Relaxed);
        }
        for task in tasks {
            total.merge(&task.await.map_err(std::io::Error::other)??);
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok(BenchReport {
        route: if args.raw { "raw".into() } else { args.route.clone() },
        connections: args.connections,
        in_flight: args.in_flight,
        offered_ops_per_s: args.rate.unwrap_or(0.0),
        duration_s: elapsed,
        requests: total.requests,
        ops_per_s: total.requests as f64 / elapsed,
        p50_us: total.all.value_at_quantile(0.5),
        p99_us: total.all.value_at_quantile(0.99),
        p999_us: total.all.value_at_quantile(0.999),
        max_us: total.all.max(),
        refused: total.refused.len(),
        refused_p50_us: total.refused.value_at_quantile(0.5),
        refused_p99_us: total.refused.value_at_quantile(0.99),
        errors: total.errors,
        floor_requests: floor.requests,
        floor_p50_us: floor.all.value_at_quantile(0.5),
        floor_p99_us: floor.all.value_at_quantile(0.99),
        floor_p999_us: floor.all.value_at_quantile(0.999),
        floor_max_us: floor.all.max(),
    })
}
