//! Micro-benchmarks of the request path's pieces: the GCRA and failure-window
//! tables at 1 thousand and 10 million live keys, key derivation, frame
//! encoding and decoding, and one whole `Limiter::check`; and off it, the
//! spray-detection thread's cost per event.
//!
//! `nice -n 10 cargo bench --bench tables` (a few minutes; the 10M tables
//! take ~0.5-1 GB and a few seconds each to fill, once per table). Filter
//! with criterion's usual argument, e.g. `cargo bench --bench tables -- gcra`.
//!
//! Table keys stand in for BLAKE2 digests: `mix64(n)` is a bijection, so N
//! indices give N distinct, uniformly spread keys. Lookups pick random
//! indices with a xorshift generator (~1 ns of each figure), so the 10M
//! figures include the cache and TLB misses of a table far larger than the
//! caches, as in the daemon.

use std::borrow::Cow;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

use tollgate::codec::{self, FRAME_HEADER_BYTES};
use tollgate::protocol::{Decision, Outcome, Reason, Request, Response, Subject, Verdict};
use tollgate::ClassTable;
use tollgate::Config;
use tollgate::Journal;
use tollgate::Limiter;
use tollgate::SourcePolicy;
use tollgate::{in_success_sample, Prefix, ReportEvent, SignalEvent, Signals};
use tollgate::{Component, Derivation, Key, KeyDeriver, Secret};
use tollgate::{FailureWindowTable, WindowSpec};
use tollgate::{GcraSpec, GcraTable};

const SECOND: u64 = 1_000_000;
/// An arbitrary instant (2023) for benches that keep time still.
const NOW_US: u64 = 1_700_000_000 * SECOND;
/// Live keys per table: `(label, count)`.
const SIZES: [(&str, u64); 2] = [("1k", 1_000), ("10M", 10_000_000)];

/// splitmix64's finaliser: a bijection on u64 that spreads every input bit
/// over the whole word, like the keyed digests the daemon uses as keys.
fn mix64(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn key(n: u64) -> Key {
    Key { account_tag: n, tuple: mix64(n) }
}

/// xorshift64: cheap random indices for the lookups.
struct Rng(u64);

impl Rng {
    /// Uniform in `0..n` (multiply-shift; no division on the hot path).
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 as u128 * n as u128) >> 64) as u64
    }
}

/// One request per hour sustained keeps every key live (its TAT an hour
/// ahead) while time stands still; the large burst keeps every check on the
/// allowed path however often the bench hits one of the 1k keys (it would
/// take a million checks of one key to exhaust it).
fn slow_spec() -> GcraSpec {
    GcraSpec::new(1, 3600 * SECOND, 1_000_000)
}

fn bench_gcra(c: &mut Criterion) {
    let spec = slow_spec();
    let mut group = c.benchmark_group("gcra");
    for (label, n) in SIZES {
        let mut table = GcraTable::new(2 * n as usize);
        for i in 0..n {
            table.check(spec, key(i), NOW_US, true);
        }
        assert_eq!(table.len() as u64, n, "every key is live");
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        group.bench_function(BenchmarkId::new("check", label), |b| {
            b.iter(|| table.check(spec, key(rng.below(n)), black_box(NOW_US), true))
        });
        group.bench_function(BenchmarkId::new("peek", label), |b| {
            b.iter(|| table.peek(spec, key(rng.below(n)), black_box(NOW_US)))
        });
        assert_eq!(table.len() as u64, n, "no key was added or dropped");
        assert!(table.peek(spec, key(rng.below(n)), NOW_US).allowed, "checks stayed on the allowed path");
    }
    group.finish();
}

fn bench_failure_window(c: &mut Criterion) {
    // An hour's window and the highest threshold a rule may have.
    let spec = WindowSpec { window_us: 3600 * SECOND, threshold: 1000 };
    let mut group = c.benchmark_group("failure_window");
    for (label, n) in SIZES {
        let mut table = FailureWindowTable::new(spec, 2 * n as usize);
        for i in 0..n {
            table.record_failure(key(i), NOW_US).expect("room for every key");
        }
        // What the snapshot writer does every second: empties the change log.
        drop(table.take_changes());
        assert_eq!(table.len() as u64, n, "every key is live");
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        group.bench_function(BenchmarkId::new("record_failure", label), |b| {
            b.iter(|| table.record_failure(key(rng.below(n)), black_box(NOW_US)))
        });
        group.bench_function(BenchmarkId::new("get", label), |b| {
            b.iter(|| table.get(key(rng.below(n)), black_box(NOW_US)))
        });
        assert_eq!(table.len() as u64, n, "no key was added or dropped");
    }
    group.finish();
}

fn bench_keys(c: &mut Criterion) {
    let deriver = KeyDeriver::new(&Secret::from_bytes([7; 32]));
    let policy = SourcePolicy::default();
    let ip = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7));
    let account = deriver.component(Component::Account, b"alice@example.com");
    let prefix = deriver.prefix(&policy.prefix(ip).to_bytes());
    let mut group = c.benchmark_group("keys");
    group.bench_function("component_account", |b| {
        b.iter(|| deriver.component(Component::Account, black_box(b"alice@example.com")))
    });
    group.bench_function("component_prefix", |b| b.iter(|| deriver.prefix(&policy.prefix(black_box(ip)).to_bytes())));
    group.bench_function("tuple_account_prefix", |b| {
        b.iter(|| deriver.tuple(black_box(&[(Component::Account, account), (Component::Prefix, prefix)])))
    });
    // A state file from before key derivations: BLAKE2b, each input
    // distinct (a repeat would be recalled from memory).
    let blake2b = KeyDeriver::with_derivation(&Secret::from_bytes([7; 32]), Derivation::Blake2b);
    let mut n = 0u64;
    group.bench_function("component_account_blake2b", |b| {
        b.iter(|| {
            n += 1;
            blake2b.component(Component::Account, black_box(&n.to_le_bytes()))
        })
    });
    // What every report carrying the client's password tag pays.
    group.bench_function("password_tag", |b| b.iter(|| deriver.password_tag(black_box(&[9; 16]))));
    // What a (account, prefix) rule costs per request: two digests and the tuple's.
    group.bench_function("account_prefix_key", |b| {
        b.iter(|| {
            let account = deriver.component(Component::Account, black_box(b"alice@example.com"));
            let prefix = deriver.prefix(&policy.prefix(black_box(ip)).to_bytes());
            deriver.tuple(&[(Component::Account, account), (Component::Prefix, prefix)])
        })
    });
    group.finish();
}

fn bench_codec(c: &mut Criterion) {
    let request = Request::Check {
        route: "login",
        subject: Subject {
            peer: Some(IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7))),
            account: Some("alice@example.com"),
            device: Some("3f2a9c1e-device-cookie"),
            ..Subject::default()
        },
    };
    let response = Response::Verdict(Verdict {
        decision: Decision::Allow,
        retry_after_ms: 0,
        delay_ms: 0,
        limit: 600,
        remaining: 299,
        reset_ms: 100,
        reason: Reason::Allowed,
        rule: Cow::Borrowed("source_rate"),
    });
    let mut request_frame = Vec::new();
    codec::encode_request(42, &request, &mut request_frame);
    let mut response_frame = Vec::new();
    codec::encode_response(42, &response, &mut response_frame);
    assert_eq!(codec::decode_request(&request_frame[FRAME_HEADER_BYTES..]).unwrap(), (42, request.clone()));

    let mut group = c.benchmark_group("codec");
    let mut out = Vec::with_capacity(256);
    group.bench_function("encode_request_check", |b| {
        b.iter(|| {
            out.clear();
            codec::encode_request(black_box(42), black_box(&request), &mut out);
            out.len()
        })
    });
    group.bench_function("decode_request_check", |b| {
        b.iter(|| codec::decode_request(black_box(&request_frame[FRAME_HEADER_BYTES..])).unwrap().0)
    });
    group.bench_function("encode_response_verdict", |b| {
        b.iter(|| {
            out.clear();
            codec::encode_response(black_box(42), black_box(&response), &mut out);
            out.len()
        })
    });
    group.bench_function("decode_response_verdict", |b| {
        b.iter(|| codec::decode_response(black_box(&response_frame[FRAME_HEADER_BYTES..])).unwrap())
    });
    group.finish();
}

/// Peer `i`: 10.x.y.z below 2^24, then one IPv6 /64 each (the default
/// prefixes are /32 and /64, so every peer is its own key).
fn peer(i: u64) -> IpAddr {
    if i < 1 << 24 {
        IpAddr::V4(Ipv4Addr::from((10 << 24) | i as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from((0x2001_0db8_u128 << 96) | ((i as u128) << 64) | 1))
    }
}

fn limiter(n: u64) -> Limiter {
    let config = if n <= 1_000_000 {
        Config::default()
    } else {
        // The `request` route's table caps at 1M keys by default.
        let text = "[routes.request.rules.source_rate]\nentries_max = 20000000\n";
        Config::build(Config::parse(text).unwrap()).unwrap()
    };
    let keys = KeyDeriver::new(&Secret::from_bytes([7; 32]));
    Limiter::new(&config, Arc::new(ClassTable::default()), keys, Journal::discard())
}

fn bench_limiter(c: &mut Criterion) {
    // The `request` route: 100 a minute per source, burst 100, so one
    // request per 600 ms refills. Call `k` goes to peer `k mod n` at
    // `k × (600 ms − 100 µs) / n`: every peer comes back just under 600 ms
    // after its last request, so its TAT is still ahead (the key is live)
    // and its budget stays full, whether n is 1k or 10M. Every check is then
    // an allowed check of a live key, the common case in production; the
    // first pass (the fill) inserts every key.
    let step_us = 600_000 - 100;
    let mut group = c.benchmark_group("limiter");
    for (label, n) in SIZES {
        let limiter = limiter(n);
        let mut k = 0u64;
        let check = |k: &mut u64| {
            let subject = Subject { peer: Some(peer(*k % n)), ..Subject::default() };
            let now_us = NOW_US + *k * step_us / n;
            *k += 1;
            limiter.check("request", &subject, now_us).expect("valid request").decision
        };
        while k < n {
            check(&mut k);
        }
        group.bench_function(BenchmarkId::new("check_request", label), |b| b.iter(|| check(&mut k)));
        let refused = (0..1000).filter(|_| check(&mut k) != Decision::Allow).count();
        assert_eq!(refused, 0, "checks stayed on the allowed path");
    }
    group.finish();
}

/// What the spray thread receives for one report of `tollgate bench --mix
/// report --failure-ratio 0.1` on key `k`: a failure, a sampled success,
/// or nothing (the request path sends an unsampled success at most as a
/// tenant-only event, which probes no large table).
fn signal_event(k: u64, failure: bool, now_us: u64) -> Option<SignalEvent> {
    let account = mix64(k ^ 0xACC0);
    if !failure && !in_success_sample(account, 8) {
        return None;
    }
    let address = peer(k);
    let IpAddr::V4(v4) = address else { unreachable!("keys below 2^24 are IPv4") };
    let wide = IpAddr::V4(Ipv4Addr::from(u32::from(v4) & !0xFF));
    Some(SignalEvent::Report(ReportEvent {
        now_us,
        outcome: if failure { Outcome::Failure } else { Outcome::Success },
        repeated: false,
        known_device: false,
        class: None,
        account: Some(account),
        narrow: (mix64(k ^ 0x5EED), Prefix { network: address, len: 32 }),
        wide: (mix64((k >> 8) ^ 0x2424), Prefix { network: wide, len: 24 }),
        v6: None,
        tenant: 1,
        tenant_weight: u32::from(failure),
        password: None,
    }))
}

fn bench_signals(c: &mut Criterion) {
    // The daemon's A/B mix: 100,000 accounts, each from its own address
    // (391 /24s), one report in ten a failure. Every table is filled first,
    // so the measured events probe tables the size the daemon's are.
    const KEYS: u64 = 100_000;
    let mut group = c.benchmark_group("signals");
    let config = Config::default().signals.expect("on by default");
    let mut engine = Signals::new(&config);
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut now_us = NOW_US;
    let events = |n: usize, rng: &mut Rng, now_us: &mut u64| -> Vec<SignalEvent> {
        std::iter::from_fn(|| {
            *now_us += 2;
            Some(signal_event(rng.below(KEYS), rng.below(10) == 0, *now_us))
        })
        .flatten()
        .take(n)
        .collect()
    };
    for k in 0..KEYS {
        let fill = [signal_event(k, true, now_us), signal_event(k, false, now_us)];
        engine.ingest_all(&fill.into_iter().flatten().collect::<Vec<_>>());
    }
    // Batches as the thread drains them (`pump::BATCH_MAX`).
    group.throughput(criterion::Throughput::Elements(256));
    group.bench_function("ingest_all_100k", |b| {
        b.iter_batched(
            || events(256, &mut rng, &mut now_us),
            |batch| engine.ingest_all(&batch),
            criterion::BatchSize::SmallInput,
        )
    });
    group.bench_function("ingest_one_by_one_100k", |b| {
        b.iter_batched(
            || events(256, &mut rng, &mut now_us),
            |batch| batch.iter().for_each(|e| engine.ingest(e)),
            criterion::BatchSize::SmallInput,
        )
    });
    // A flood: every event a failure from a new source on a new account,
    // so the source and account tables are full and every event evicts
    // from both (`--mix report --failure-ratio 1 --keys 1000000`).
    let mut flood = Signals::new(&config);
    let mut next = KEYS;
    let mut new_failures = |n: u64, now_us: &mut u64| -> Vec<SignalEvent> {
        let batch = (next..next + n).filter_map(|k| signal_event(k % (1 << 24), true, *now_us)).collect();
        next += n;
        *now_us += 2 * n;
        batch
    };
    for _ in 0..1_000 {
        flood.ingest_all(&new_failures(256, &mut now_us));
    }
    group.bench_function("ingest_all_flood", |b| {
        b.iter_batched(
            || new_failures(256, &mut now_us),
            |batch| flood.ingest_all(&batch),
            criterion::BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_gcra, bench_failure_window, bench_keys, bench_codec, bench_limiter, bench_signals
}
criterion_main!(benches);
