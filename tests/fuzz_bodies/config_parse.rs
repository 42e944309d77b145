//! Body of the `config_parse` fuzz target, shared with `tests/fuzz_replay.rs`
//! (which replays `fuzz/corpus/config_parse/` on stable). Uses only
//! `tollgate`, std and `redis` (the daemon's store client, as the oracle
//! for the store URLs a config may hold).
//!
//! The input, decoded as lossy UTF-8, goes through `Config::parse` and
//! `Config::build` as a config file does. Neither may panic; a refusal must
//! say why; the same text must give the same answer twice; and a config that
//! builds must hold every invariant the README and `src/config.rs` promise,
//! including that the tables and the GCRA arithmetic accept its limits
//! (`fuzz/regressions/config_parse/` holds what this found).

use tollgate::Component;
use tollgate::{decide, GcraSpec};
use tollgate::{
    Config, DeviceScope, KnownDevicesConfig, RouteConfig, RuleConfig, RuleKind, Rung, Scope, SharedConfig,
    BURST_SPAN_US_MAX, ENTRIES_MAX_LIMIT, KNOWN_DEVICES_PER_ACCOUNT_MAX_LIMIT, PERIOD_SECS_MAX, RECENT_PASSWORDS_MAX,
    RULES_PER_ROUTE_MAX, SNAPSHOT_INTERVAL_MS_MAX,
};
use tollgate::{FailureWindowTable, WindowSpec, THRESHOLD_MAX, WINDOW_US_MIN};
use tollgate::{FORWARDED_HOPS_MAX, IPV4_PREFIX_LEN_MIN, IPV6_PREFIX_LEN_MAX, IPV6_PREFIX_LEN_MIN};

const SECOND_US: u64 = 1_000_000;
/// A plausible now for the GCRA arithmetic: 2030-01-01.
const NOW_US: u64 = 1_893_456_000 * SECOND_US;

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let raw = match Config::parse(&text) {
        Ok(raw) => raw,
        Err(message) => {
            assert!(!message.trim().is_empty(), "a parse error without a message");
            return;
        }
    };
    let first = Config::build(raw);
    match &first {
        Ok(config) => check_config(config),
        Err(errors) => {
            assert!(!errors.0.is_empty(), "refused without an error");
            assert!(errors.0.iter().all(|e| !e.trim().is_empty()), "an empty error in {errors:?}");
        }
    }
    let second = Config::build(Config::parse(&text).expect("parsed once"));
    assert_eq!(first, second, "the same text built twice differs");
}

fn check_config(config: &Config) {
    assert!((1..=SNAPSHOT_INTERVAL_MS_MAX).contains(&config.snapshot_interval_ms));

    let source = &config.source;
    assert!((IPV4_PREFIX_LEN_MIN..=32).contains(&source.ipv4_prefix_len), "{source:?}");
    assert!((IPV6_PREFIX_LEN_MIN..=IPV6_PREFIX_LEN_MAX).contains(&source.ipv6_prefix_len), "{source:?}");
    for (v4, v6) in source.class_prefix_lens.iter().flatten() {
        assert!((IPV4_PREFIX_LEN_MIN..=32).contains(v4), "{source:?}");
        assert!((IPV6_PREFIX_LEN_MIN..=IPV6_PREFIX_LEN_MAX).contains(v6), "{source:?}");
    }
    assert!(source.trusted_hops as usize <= FORWARDED_HOPS_MAX);
    assert!(source.trusted_hops == 0 || source.trusted_proxies.is_empty(), "both hops and proxies");
    for net in &source.trusted_proxies {
        assert_eq!(*net, net.trunc(), "trusted proxy {net} has host bits set");
    }

    let server = &config.server;
    assert!((1..=65_536).contains(&server.connections_max));
    assert!((1..=600_000).contains(&server.frame_read_timeout_ms));
    assert!(server.shutdown_grace_ms <= 600_000);

    let responses = &config.responses;
    assert!((1..=16).contains(&responses.retry_after_steps_us.len()), "{responses:?}");
    // configured in seconds and milliseconds: whole ones (a product that
    // wrapped around u64 would rarely be)
    assert!(
        responses.retry_after_steps_us.iter().all(|&s| s <= PERIOD_SECS_MAX * SECOND_US && s % SECOND_US == 0),
        "{responses:?}"
    );
    assert!(responses.jitter_percent <= 100);
    assert!(responses.delay_base_us <= responses.delay_max_us && responses.delay_max_us <= 60 * SECOND_US);
    assert!(
        responses.delay_base_us.is_multiple_of(1000) && responses.delay_max_us.is_multiple_of(1000),
        "{responses:?}"
    );

    assert!(config.routes.windows(2).all(|w| w[0].name < w[1].name), "routes unsorted or repeated");
    for route in &config.routes {
        check_route(route);
    }
    if let Some(shared) = &config.shared {
        check_shared(shared);
    }
}

/// `[shared]` as docs/configuration.md bounds it: the figures are the
/// documented ones, written out, so a changed bound has to change both.
fn check_shared(shared: &SharedConfig) {
    let at = format!("{shared:?}");
    let urls: Vec<&str> = if shared.nodes.is_empty() {
        vec![shared.url.as_str()]
    } else {
        assert_eq!(shared.url, shared.nodes[0], "the url of a cluster is its first seed: {at}");
        assert!(shared.nodes.len() <= 64, "{at}");
        shared.nodes.iter().map(String::as_str).collect()
    };
    let tls = shared.url.starts_with("rediss://");
    for url in &urls {
        let (scheme, rest) = url.split_once("://").unwrap_or_else(|| panic!("{url:?}: no scheme"));
        assert!(matches!(scheme, "redis" | "rediss" | "redis+unix" | "unix"), "{url:?}");
        assert!(shared.nodes.is_empty() || matches!(scheme, "redis" | "rediss"), "a cluster seed on a socket: {url:?}");
        assert_eq!(url.starts_with("rediss://"), tls, "TLS and plain seeds mixed: {at}");
        // The URL is shown in status and logs: never a password in it, and
        // no #insecure (a store anyone on the path could answer for).
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let authority = before_query.split('/').next().unwrap_or("");
        assert!(!authority.rsplit_once('@').is_some_and(|(userinfo, _)| userinfo.contains(':')), "{url:?}");
        assert!(!query.split('&').any(|p| matches!(p.split('=').next(), Some("pass" | "password"))), "{url:?}");
        assert!(!url.contains('#'), "{url:?}");
        assert!(!url.chars().any(|c| c.is_whitespace() || c.is_control()), "{url:?}");
        // And as the store's client reads it: usable, no password however
        // spelled, a real database and port; a cluster seed with no user
        // and the default protocol (the cluster client refuses seeds that
        // differ in either), on database 0.
        let info = redis::IntoConnectionInfo::into_connection_info(*url)
            .unwrap_or_else(|e| panic!("{url:?} built but the store client cannot read it: {e}"));
        let settings = info.redis_settings();
        assert!(settings.password().is_none(), "{url:?}: a password");
        assert!(settings.db() >= 0, "{url:?}");
        assert_ne!(settings.username(), Some(""), "{url:?}: an empty user");
        assert!(shared.username.is_none() || settings.username().is_none(), "{url:?}: a user shown, not used");
        // The client sends a user only with a password: without one the
        // daemon would log in as the default user.
        assert!(settings.username().is_none() || shared.password_file.is_some(), "{url:?}: a user, no password");
        match info.addr() {
            redis::ConnectionAddr::Tcp(_, port) => assert!(*port != 0, "{url:?}"),
            redis::ConnectionAddr::TcpTls { port, insecure, .. } => assert!(*port != 0 && !insecure, "{url:?}"),
            _ => {}
        }
        if !shared.nodes.is_empty() {
            assert!(settings.username().is_none() && settings.db() == 0, "{url:?}");
            assert_eq!(settings.protocol(), redis::ProtocolVersion::RESP2, "{url:?}");
        }
    }
    if let Some(name) = &shared.username {
        assert!(shared.password_file.is_some(), "{at}: username without password_file");
        assert!((1..=64).contains(&name.chars().count()), "{at}");
        assert!(!name.chars().any(|c| c.is_whitespace() || c.is_control()), "{at}");
    }
    let prefix = &shared.key_prefix;
    assert!(
        (1..=32).contains(&prefix.len()) && prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
        "key_prefix {prefix:?}"
    );
    assert!(tls || (shared.tls_ca_file.is_none() && shared.tls_cert_file.is_none()), "TLS files without TLS: {at}");
    assert_eq!(shared.tls_cert_file.is_some(), shared.tls_key_file.is_some(), "{at}");
    assert!((1..=1000).contains(&shared.timeout_ms), "{at}");
    assert!(shared.busy_max_ms <= 60_000, "{at}");
    assert!((10..=10_000).contains(&shared.connect_timeout_ms), "{at}");
    assert!((10..=10_000).contains(&shared.probe_interval_ms), "{at}");
    assert!((shared.probe_interval_ms..=60_000).contains(&shared.probe_max_ms), "{at}");
    assert!((1..=100).contains(&shared.breaker_failures), "{at}");
    assert!((1..=1024).contains(&shared.batch_max), "{at}");
    assert!((1..=1_000_000).contains(&shared.pending_max), "{at}");
    assert!(shared.hosts <= 1000, "{at}");
    assert!((1..=1000).contains(&shared.hosts_when_unknown), "{at}");
    assert!((100..=60_000).contains(&shared.heartbeat_ms), "{at}");
    assert!((2 * shared.heartbeat_ms..=600_000).contains(&shared.host_ttl_ms), "{at}");
}

fn check_route(route: &RouteConfig) {
    let name = &route.name;
    assert!(
        (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
        "route name {name:?}"
    );
    assert!(route.rules.len() <= RULES_PER_ROUTE_MAX, "{name}: {} rules", route.rules.len());
    let mut rule_names: Vec<&str> = route.rules.iter().map(|r| r.name.as_str()).collect();
    rule_names.sort_unstable();
    rule_names.dedup();
    assert_eq!(rule_names.len(), route.rules.len(), "{name}: a rule name twice");
    if let Some(KnownDevicesConfig { ttl_us, entries_max, per_account_max }) = route.known_devices {
        assert!((SECOND_US..=366 * 86_400 * SECOND_US).contains(&ttl_us), "{name}: known device ttl {ttl_us}");
        assert!((1..=ENTRIES_MAX_LIMIT).contains(&entries_max), "{name}: known devices max {entries_max}");
        assert!(
            (1..=KNOWN_DEVICES_PER_ACCOUNT_MAX_LIMIT).contains(&per_account_max),
            "{name}: known devices per account {per_account_max}"
        );
    }
    if let Some((digests, entries_max)) = route.recent_passwords {
        assert!((1..=RECENT_PASSWORDS_MAX).contains(&digests), "{name}: recent passwords {digests}");
        assert!((1..=ENTRIES_MAX_LIMIT).contains(&entries_max), "{name}: recent passwords max {entries_max}");
    }
    for rule in &route.rules {
        check_rule(route, rule);
    }
}

fn check_rule(route: &RouteConfig, rule: &RuleConfig) {
    let at = format!("{}.{}", route.name, rule.name);
    assert!(!rule.key.is_empty(), "{at}: empty key");
    assert!(rule.key != [Component::ClientId], "{at}: keyed on client_id alone");
    for (i, component) in rule.key.iter().enumerate() {
        assert!(!rule.key[..i].contains(component), "{at}: {component:?} twice");
    }
    assert!((1..=16).contains(&rule.responses.len()), "{at}: {} rungs", rule.responses.len());
    if rule.devices != DeviceScope::All {
        assert!(route.known_devices.is_some(), "{at}: scoped by devices without known devices");
    }
    match &rule.kind {
        RuleKind::Signal { detectors, entries_max } => {
            assert!(*detectors != 0, "{at}: a signal rule with no detector");
            assert_eq!(rule.scope, Scope::Host, "{at}: a signal rule acts on this host's flags");
            assert!((1..=ENTRIES_MAX_LIMIT).contains(entries_max), "{at}: entries_max {entries_max}");
            if rule.responses.contains(&Rung::Deny) {
                assert_eq!(rule.devices, DeviceScope::UnknownDevices, "{at}: deny on a known device");
            }
        }
        RuleKind::Failures { threshold, window_us, entries_max, .. } => {
            assert!((1..=THRESHOLD_MAX).contains(threshold), "{at}: threshold {threshold}");
            assert!((1..=1000).contains(threshold), "{at}: threshold {threshold}");
            assert!(
                (WINDOW_US_MIN..=PERIOD_SECS_MAX * SECOND_US).contains(window_us) && window_us % SECOND_US == 0,
                "{at}: window {window_us}"
            );
            assert!((1..=ENTRIES_MAX_LIMIT).contains(entries_max), "{at}: entries_max {entries_max}");
            // the table's own asserts agree with the validation
            let spec = WindowSpec { window_us: *window_us, threshold: *threshold };
            let mut table = FailureWindowTable::new(spec, *entries_max);
            table.reconfigure(spec, *entries_max, NOW_US);
        }
        RuleKind::Rate { rate, by_class, entries_max } => {
            assert!((1..=ENTRIES_MAX_LIMIT).contains(entries_max), "{at}: entries_max {entries_max}");
            for limit in std::iter::once(rate).chain(by_class.iter().flatten()) {
                assert!((1..=1_000_000_000).contains(&limit.limit), "{at}: {limit:?}");
                assert!((1..=1_000_000_000).contains(&limit.burst), "{at}: {limit:?}");
                assert!(
                    (SECOND_US..=PERIOD_SECS_MAX * SECOND_US).contains(&limit.period_us)
                        && limit.period_us % SECOND_US == 0,
                    "{at}: {limit:?}"
                );
                let spec = GcraSpec::new(limit.limit, limit.period_us, limit.burst);
                assert!(spec.interval_us >= 1);
                // GCRA's tolerance is interval × burst in u64: a valid rule
                // keeps it within BURST_SPAN_US_MAX (so far from overflow).
                let span = spec.interval_us.checked_mul(spec.burst as u64);
                assert!(
                    span.is_some_and(|span| span <= BURST_SPAN_US_MAX),
                    "{at}: {limit:?} makes interval × burst ({} × {}) {span:?}",
                    spec.interval_us,
                    spec.burst
                );
                let (first, tat) = decide(spec, None, NOW_US, true);
                assert!(first.allowed, "{at}: {limit:?} refuses a fresh key");
                decide(spec, Some(tat), NOW_US, true);
            }
        }
    }
}
