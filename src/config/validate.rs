//! Validation and building: lays a file over the built-in defaults and
//! checks every value, collecting every problem instead of stopping at the
//! first.

use std::path::Path;

use super::*;
use crate::classes::SourceClass;
use crate::failure_window::{THRESHOLD_MAX, WINDOW_US_MIN};
use crate::source::{self, SourcePolicy};

impl Config {
    /// Lays `raw` over the defaults and validates the result.
    pub fn build(raw: RawConfig) -> Result<Config, ConfigErrors> {
        let mut errors = Vec::new();
        let state = raw.state.unwrap_or_else(|| STATE_PATH_DEFAULT.into());
        let secret =
            raw.secret.unwrap_or_else(|| state.parent().unwrap_or_else(|| Path::new(".")).join(SECRET_FILE_NAME));
        let snapshot_interval_ms = raw.snapshot_interval_ms.unwrap_or(SNAPSHOT_INTERVAL_MS_DEFAULT);
        if !(1..=SNAPSHOT_INTERVAL_MS_MAX).contains(&snapshot_interval_ms) {
            errors.push(format!("snapshot_interval_ms: must be 1..={SNAPSHOT_INTERVAL_MS_MAX}"));
        }
        let attempt_timeout_ms = raw.attempt_timeout_ms.unwrap_or(ATTEMPT_TIMEOUT_MS_DEFAULT);
        if !(1..=ATTEMPT_TIMEOUT_MS_MAX).contains(&attempt_timeout_ms) {
            errors.push(format!("attempt_timeout_ms: must be 1..={ATTEMPT_TIMEOUT_MS_MAX}"));
        }
        let class_file = raw.source.class_file.clone();
        let source = build_source(raw.source, &mut errors);
        let server = build_server(raw.server, &mut errors);
        let responses = build_responses(raw.responses, &mut errors);
        let shared = raw.shared.and_then(|shared| build_shared(shared, &mut errors));
        let signals = build_signals(raw.signals, &mut errors);
        let activity = build_activity(raw.activity, &mut errors);
        let decision_log = raw.decision_log.and_then(|log| build_decision_log(log, &mut errors));

        let mut merged = builtin_routes();
        for (name, user) in raw.routes {
            let route = merged.entry(name).or_default();
            route.fail_policy = user.fail_policy.or(route.fail_policy);
            route.known_device_ttl_secs = user.known_device_ttl_secs.or(route.known_device_ttl_secs);
            route.known_devices_max = user.known_devices_max.or(route.known_devices_max);
            route.known_devices_per_account_max =
                user.known_devices_per_account_max.or(route.known_devices_per_account_max);
            route.recent_passwords = user.recent_passwords.or(route.recent_passwords);
            route.recent_passwords_max = user.recent_passwords_max.or(route.recent_passwords_max);
            for (rule_name, rule) in user.rules {
                let base = route.rules.entry(rule_name).or_default();
                *base = overlay(base.clone(), rule);
            }
        }
        let routes: Vec<RouteConfig> =
            merged.into_iter().filter_map(|(name, raw)| build_route(&name, raw, &mut errors)).collect();

        if errors.is_empty() {
            Ok(Config {
                socket: raw.socket.unwrap_or_else(|| SOCKET_PATH_DEFAULT.into()),
                state,
                secret,
                snapshot_interval_ms,
                attempt_timeout_ms,
                source,
                class_file,
                server,
                responses,
                routes,
                shared,
                signals,
                activity,
                decision_log,
            })
        } else {
            Err(ConfigErrors(errors))
        }
    }
}

fn rate_fits(r: RateLimit) -> bool {
    let interval = r.period_us.div_ceil(r.limit.max(1) as u64);
    interval.checked_mul(r.burst as u64).is_some_and(|span| span <= BURST_SPAN_US_MAX)
}

fn overlay(base: RawRule, user: RawRule) -> RawRule {
    let classes = match (base.classes, user.classes) {
        (Some(mut base), Some(user)) => {
            for (class, limit) in user {
                let merged = base.get(&class).map_or(limit, |b| RawClassLimit {
                    limit: limit.limit.or(b.limit),
                    period_secs: limit.period_secs.or(b.period_secs),
                    burst: limit.burst.or(b.burst),
                });
                base.insert(class, merged);
            }
            Some(base)
        }
        (base, user) => user.or(base),
    };
    RawRule {
        classes,
        monitor: user.monitor.or(base.monitor),
        responses: user.responses.or(base.responses),
        required: user.required.or(base.required),
        devices: user.devices.or(base.devices),
        scope: user.scope.or(base.scope),
        kind: user.kind.or(base.kind),
        key: user.key.or(base.key),
        enabled: user.enabled.or(base.enabled),
        limit: user.limit.or(base.limit),
        period_secs: user.period_secs.or(base.period_secs),
        burst: user.burst.or(base.burst),
        threshold: user.threshold.or(base.threshold),
        window_secs: user.window_secs.or(base.window_secs),
        cleared_by_success: user.cleared_by_success.or(base.cleared_by_success),
        entries_max: user.entries_max.or(base.entries_max),
        detectors: user.detectors.or(base.detectors),
    }
}

fn build_source(raw: RawSource, errors: &mut Vec<String>) -> SourcePolicy {
    let mut policy = SourcePolicy::default();
    for (i, cidr) in raw.trusted_proxies.unwrap_or_default().iter().enumerate() {
        match source::parse_cidr(cidr) {
            Some(net) => policy.trusted_proxies.push(net.trunc()),
            None => errors.push(format!("source.trusted_proxies[{i}]: `{cidr}` is not a CIDR")),
        }
    }
    policy.trusted_hops = raw.trusted_hops.unwrap_or(0);
    if policy.trusted_hops as usize > source::FORWARDED_HOPS_MAX {
        errors.push(format!("source.trusted_hops: must be at most {}", source::FORWARDED_HOPS_MAX));
    }
    if policy.trusted_hops > 0 && !policy.trusted_proxies.is_empty() {
        errors.push("source.trusted_hops: set either trusted_hops or trusted_proxies, not both".into());
    }
    policy.ipv4_prefix_len = raw.ipv4_prefix_len.unwrap_or(source::IPV4_PREFIX_LEN_DEFAULT);
    if !(source::IPV4_PREFIX_LEN_MIN..=IPV4_PREFIX_LEN_MAX).contains(&policy.ipv4_prefix_len) {
        errors.push(format!("source.ipv4_prefix_len: must be {}..={IPV4_PREFIX_LEN_MAX}", source::IPV4_PREFIX_LEN_MIN));
    }
    policy.ipv6_prefix_len = raw.ipv6_prefix_len.unwrap_or(source::IPV6_PREFIX_LEN_DEFAULT);
    policy.class_prefix_lens[SourceClass::Hosting as usize] =
        Some((HOSTING_IPV4_PREFIX_LEN_DEFAULT, policy.ipv6_prefix_len));
    for (class, lens) in &raw.classes {
        let Some(class) = class.class("source.classes", errors) else { continue };
        let name = class.name();
        let v4 = lens.ipv4_prefix_len.unwrap_or(policy.ipv4_prefix_len);
        let v6 = lens.ipv6_prefix_len.unwrap_or(policy.ipv6_prefix_len);
        if !(source::IPV4_PREFIX_LEN_MIN..=IPV4_PREFIX_LEN_MAX).contains(&v4) {
            errors.push(format!(
                "source.classes.{name}.ipv4_prefix_len: must be {}..={IPV4_PREFIX_LEN_MAX}",
                source::IPV4_PREFIX_LEN_MIN
            ));
        }
        if !(source::IPV6_PREFIX_LEN_MIN..=source::IPV6_PREFIX_LEN_MAX).contains(&v6) {
            errors.push(format!(
                "source.classes.{name}.ipv6_prefix_len: must be {}..={}",
                source::IPV6_PREFIX_LEN_MIN,
                source::IPV6_PREFIX_LEN_MAX
            ));
        }
        policy.class_prefix_lens[class as usize] = Some((v4, v6));
    }
    if !(source::IPV6_PREFIX_LEN_MIN..=source::IPV6_PREFIX_LEN_MAX).contains(&policy.ipv6_prefix_len) {
        errors.push(format!(
            "source.ipv6_prefix_len: must be {}..={} (never /128: one line holds 2^64 addresses)",
            source::IPV6_PREFIX_LEN_MIN,
            source::IPV6_PREFIX_LEN_MAX
        ));
    }
    policy
}

fn build_activity(raw: RawActivity, errors: &mut Vec<String>) -> ActivityConfig {
    let activity = ActivityConfig {
        queue_max: raw.queue_max.unwrap_or(ACTIVITY_QUEUE_MAX_DEFAULT),
        top_entries_max: raw.top_entries_max.unwrap_or(ACTIVITY_TOP_ENTRIES_MAX_DEFAULT),
        top_window_ms: raw.top_window_secs.unwrap_or(ACTIVITY_TOP_WINDOW_SECS_DEFAULT).saturating_mul(1000),
        recent_max: raw.recent_max.unwrap_or(ACTIVITY_RECENT_MAX_DEFAULT),
        accounts_sampled_max: raw.accounts_sampled_max.unwrap_or(ACTIVITY_ACCOUNTS_SAMPLED_MAX_DEFAULT),
        samples_max: raw.samples_max.unwrap_or(ACTIVITY_SAMPLES_MAX_DEFAULT),
    };
    let mut within = |field: &str, value: u64, min: u64, max: u64| {
        if !(min..=max).contains(&value) {
            errors.push(format!("activity.{field}: must be {min}..={max}"));
        }
    };
    within("queue_max", activity.queue_max as u64, 1, ACTIVITY_QUEUE_MAX_LIMIT as u64);
    within("top_entries_max", activity.top_entries_max as u64, 1, ACTIVITY_TOP_ENTRIES_MAX_LIMIT as u64);
    within(
        "top_window_secs",
        activity.top_window_ms / 1000,
        ACTIVITY_TOP_WINDOW_SECS_MIN,
        ACTIVITY_TOP_WINDOW_SECS_MAX,
    );
    within("recent_max", activity.recent_max as u64, 1, ACTIVITY_RECENT_MAX_LIMIT as u64);
    within(
        "accounts_sampled_max",
        activity.accounts_sampled_max as u64,
        ACTIVITY_ACCOUNTS_SAMPLED_MAX_MIN as u64,
        ACTIVITY_ACCOUNTS_SAMPLED_MAX_LIMIT as u64,
    );
    within("samples_max", activity.samples_max as u64, 1, ACTIVITY_SAMPLES_MAX_LIMIT as u64);
    activity
}

fn build_server(raw: RawServer, errors: &mut Vec<String>) -> ServerConfig {
    let server = ServerConfig {
        connections_max: raw.connections_max.unwrap_or(CONNECTIONS_MAX_DEFAULT),
        frame_read_timeout_ms: raw.frame_read_timeout_ms.unwrap_or(FRAME_READ_TIMEOUT_MS_DEFAULT),
        shutdown_grace_ms: raw.shutdown_grace_ms.unwrap_or(SHUTDOWN_GRACE_MS_DEFAULT),
        idle_timeout_ms: raw.idle_timeout_ms.unwrap_or(IDLE_TIMEOUT_MS_DEFAULT),
        reply_write_timeout_ms: raw.reply_write_timeout_ms.unwrap_or(REPLY_WRITE_TIMEOUT_MS_DEFAULT),
        in_flight_per_connection_max: raw.in_flight_per_connection_max.unwrap_or(IN_FLIGHT_PER_CONNECTION_MAX_DEFAULT),
        log_lines_per_sec_max: raw.log_lines_per_sec_max.unwrap_or(LOG_LINES_PER_SEC_MAX_DEFAULT),
        socket_mode: raw.socket_mode.unwrap_or(SOCKET_MODE_DEFAULT),
        socket_group: raw.socket_group,
        client_users: raw.client_users.unwrap_or_default(),
        client_groups: raw.client_groups.unwrap_or_default(),
        admin_users: raw.admin_users.unwrap_or_default(),
        admin_groups: raw.admin_groups.unwrap_or_default(),
    };
    if !(IDLE_TIMEOUT_MS_MIN..=IDLE_TIMEOUT_MS_MAX).contains(&server.idle_timeout_ms) {
        errors.push(format!("server.idle_timeout_ms: must be {IDLE_TIMEOUT_MS_MIN}..={IDLE_TIMEOUT_MS_MAX}"));
    }
    if !(1..=IN_FLIGHT_PER_CONNECTION_MAX_LIMIT).contains(&server.in_flight_per_connection_max) {
        errors.push(format!("server.in_flight_per_connection_max: must be 1..={IN_FLIGHT_PER_CONNECTION_MAX_LIMIT}"));
    }
    if server.log_lines_per_sec_max > LOG_LINES_PER_SEC_MAX_LIMIT {
        errors.push(format!("server.log_lines_per_sec_max: must be at most {LOG_LINES_PER_SEC_MAX_LIMIT}"));
    }
    if server.socket_mode & !SOCKET_MODE_PERMISSION_BITS != 0
        || server.socket_mode & SOCKET_MODE_OWNER_READ_WRITE != SOCKET_MODE_OWNER_READ_WRITE
    {
        errors.push("server.socket_mode: permission bits (e.g. 0o660) that let the owner read and write".into());
    }
    if !(1..=CONNECTIONS_MAX_LIMIT).contains(&server.connections_max) {
        errors.push(format!("server.connections_max: must be 1..={CONNECTIONS_MAX_LIMIT}"));
    }
    if !(1..=FRAME_READ_TIMEOUT_MS_MAX).contains(&server.frame_read_timeout_ms) {
        errors.push(format!("server.frame_read_timeout_ms: must be 1..={FRAME_READ_TIMEOUT_MS_MAX}"));
    }
    if !(1..=REPLY_WRITE_TIMEOUT_MS_MAX).contains(&server.reply_write_timeout_ms) {
        errors.push(format!("server.reply_write_timeout_ms: must be 1..={REPLY_WRITE_TIMEOUT_MS_MAX}"));
    }
    if server.shutdown_grace_ms > SHUTDOWN_GRACE_MS_MAX {
        errors.push(format!("server.shutdown_grace_ms: must be at most {SHUTDOWN_GRACE_MS_MAX}"));
    }
    server
}

fn build_responses(raw: RawResponses, errors: &mut Vec<String>) -> ResponsePolicy {
    let steps = raw.retry_after_steps_secs.unwrap_or_else(|| RETRY_AFTER_STEPS_SECS_DEFAULT.to_vec());
    if steps.is_empty() || steps.len() > RETRY_AFTER_STEPS_MAX || steps.iter().any(|s| *s > PERIOD_SECS_MAX) {
        errors.push(format!(
            "responses.retry_after_steps_secs: 1 to {RETRY_AFTER_STEPS_MAX} steps, each 0..={PERIOD_SECS_MAX}"
        ));
    }
    let policy = ResponsePolicy {
        retry_after_steps_us: steps.iter().map(|s| s.saturating_mul(1_000_000)).collect(),
        jitter_percent: raw.jitter_percent.unwrap_or(JITTER_PERCENT_DEFAULT),
        delay_base_us: raw.delay_base_ms.unwrap_or(DELAY_BASE_MS_DEFAULT).saturating_mul(1000),
        delay_max_us: raw.delay_max_ms.unwrap_or(DELAY_MAX_MS_DEFAULT).saturating_mul(1000),
    };
    if policy.jitter_percent > JITTER_PERCENT_MAX {
        errors.push(format!("responses.jitter_percent: must be 0..={JITTER_PERCENT_MAX}"));
    }
    if policy.delay_max_us > DELAY_MAX_MS_LIMIT * 1000 || policy.delay_base_us > policy.delay_max_us {
        errors.push(format!("responses.delay_max_ms: must be at most {DELAY_MAX_MS_LIMIT} and at least delay_base_ms"));
    }
    policy
}

fn build_shared(raw: RawShared, errors: &mut Vec<String>) -> Option<SharedConfig> {
    let before = errors.len();
    let (url, nodes) = match (raw.url, raw.nodes) {
        (Some(url), None) => {
            if let Err(why) = check_store_url(&url) {
                errors.push(format!("shared.url: {why}"));
            }
            (url, Vec::new())
        }
        (None, Some(nodes)) => {
            if nodes.is_empty() || nodes.len() > SHARED_NODES_MAX {
                errors.push(format!("shared.nodes: 1..={SHARED_NODES_MAX} cluster seed URLs (redis://host:port)"));
            }
            for (i, node) in nodes.iter().enumerate() {
                if let Err(why) = check_node_url(node) {
                    errors.push(format!("shared.nodes[{i}]: {why}"));
                }
            }
            (nodes.first().cloned().unwrap_or_default(), nodes)
        }
        (None, None) => {
            errors
                .push("shared: one of url (a single store) or nodes (a Redis Cluster's seed nodes) is required".into());
            (String::new(), Vec::new())
        }
        (Some(_), Some(_)) => {
            errors.push("shared: url and nodes exclude each other: url for a single store, nodes for a cluster".into());
            (String::new(), Vec::new())
        }
    };
    if let Some(name) = &raw.username {
        let chars = name.chars().count();
        if chars == 0 || chars > SHARED_USERNAME_CHARS_MAX || name.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            errors.push(format!(
                "shared.username: 1-{SHARED_USERNAME_CHARS_MAX} characters, no whitespace or control characters"
            ));
        }
    }
    let key_prefix = raw.key_prefix.unwrap_or_else(|| SHARED_KEY_PREFIX_DEFAULT.into());
    // Braces would end the hash tag that keeps one operation's keys in one
    // cluster slot, and a colon would read as the separator after the prefix.
    if key_prefix.is_empty()
        || key_prefix.len() > SHARED_KEY_PREFIX_BYTES_MAX
        || !key_prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        errors.push(format!("shared.key_prefix: 1-{SHARED_KEY_PREFIX_BYTES_MAX} characters of [A-Za-z0-9_-]"));
    }
    // The daemon authenticates as shared.username when it is set, so a
    // user in the URL as well would be shown and not used.
    let url_user = redis::IntoConnectionInfo::into_connection_info(url.as_str())
        .ok()
        .and_then(|info| info.redis_settings().username().map(str::to_string));
    if raw.username.is_some() && url_user.is_some() {
        errors.push("shared.username: the url names a user too; give it in one place, username".into());
    }
    // redis-rs authenticates only when it has a password: a user without
    // one would be dropped, the daemon logging in as the default user.
    // Said once the URL and the user are otherwise right: not beside an
    // error already given for either, which is fixed first.
    let said = |field: &str| errors.iter().any(|e| e.starts_with(field));
    if raw.password_file.is_none() && !said("shared.url") && !said("shared.nodes") && !said("shared.username") {
        let without = "there is no password_file: the store's client sends a user only with its password \
                       (for an ACL user without one, nopass, put any text in password_file)";
        if raw.username.is_some() {
            errors.push(format!("shared.username: {without}"));
        } else if url_user.is_some() {
            errors.push(format!("shared.url: names a user but {without}"));
        }
    }
    let tls = url.starts_with("rediss://");
    if let [first, rest @ ..] = nodes.as_slice() {
        if rest.iter().any(|node| node.starts_with("rediss://") != first.starts_with("rediss://")) {
            errors.push("shared.nodes: all rediss:// (TLS) or all redis://, not a mix".into());
        }
    }
    if raw.tls_ca_file.is_some() && !tls {
        errors.push(
            "shared.tls_ca_file: only for a TLS store; the url (or nodes) must be rediss://host:port to use tls_ca_file"
                .into(),
        );
    }
    match (&raw.tls_cert_file, &raw.tls_key_file) {
        (Some(_), None) | (None, Some(_)) => errors.push(
            "shared.tls_cert_file, shared.tls_key_file: both or neither (a client certificate and its key)".into(),
        ),
        (Some(_), Some(_)) if !tls => errors.push(
            "shared.tls_cert_file: only for a TLS store; the url (or nodes) must be rediss://host:port to present a client certificate"
                .into(),
        ),
        _ => {}
    }
    let shared = SharedConfig {
        url,
        nodes,
        username: raw.username,
        password_file: raw.password_file,
        tls_ca_file: raw.tls_ca_file,
        tls_cert_file: raw.tls_cert_file,
        tls_key_file: raw.tls_key_file,
        key_prefix,
        timeout_ms: raw.timeout_ms.unwrap_or(SHARED_TIMEOUT_MS_DEFAULT),
        busy_max_ms: raw.busy_max_ms.unwrap_or(SHARED_BUSY_MAX_MS_DEFAULT),
        connect_timeout_ms: raw.connect_timeout_ms.unwrap_or(SHARED_CONNECT_TIMEOUT_MS_DEFAULT),
        probe_interval_ms: raw.probe_interval_ms.unwrap_or(SHARED_PROBE_INTERVAL_MS_DEFAULT),
        probe_max_ms: raw.probe_max_ms.unwrap_or(SHARED_PROBE_MAX_MS_DEFAULT),
        breaker_failures: raw.breaker_failures.unwrap_or(SHARED_BREAKER_FAILURES_DEFAULT),
        batch_max: raw.batch_max.unwrap_or(SHARED_BATCH_MAX_DEFAULT),
        pending_max: raw.pending_max.unwrap_or(SHARED_PENDING_MAX_DEFAULT),
        hosts: raw.hosts.unwrap_or(SHARED_HOSTS_DEFAULT),
        hosts_when_unknown: raw.hosts_when_unknown.unwrap_or(SHARED_HOSTS_WHEN_UNKNOWN_DEFAULT),
        heartbeat_ms: raw.heartbeat_ms.unwrap_or(SHARED_HEARTBEAT_MS_DEFAULT),
        host_ttl_ms: raw.host_ttl_ms.unwrap_or(SHARED_HOST_TTL_MS_DEFAULT),
    };
    let mut in_range = |field: &str, value: u64, lo: u64, hi: u64| {
        if !(lo..=hi).contains(&value) {
            errors.push(format!("shared.{field}: must be {lo}..={hi}"));
        }
    };
    in_range("timeout_ms", shared.timeout_ms, 1, SHARED_TIMEOUT_MS_MAX);
    in_range("busy_max_ms", shared.busy_max_ms, 0, SHARED_BUSY_MAX_MS_MAX);
    in_range(
        "connect_timeout_ms",
        shared.connect_timeout_ms,
        SHARED_CONNECT_TIMEOUT_MS_MIN,
        SHARED_CONNECT_TIMEOUT_MS_MAX,
    );
    in_range("probe_interval_ms", shared.probe_interval_ms, SHARED_PROBE_INTERVAL_MS_MIN, SHARED_PROBE_INTERVAL_MS_MAX);
    in_range("breaker_failures", shared.breaker_failures.into(), 1, SHARED_BREAKER_FAILURES_MAX.into());
    in_range("batch_max", shared.batch_max as u64, 1, SHARED_BATCH_MAX_LIMIT as u64);
    in_range("pending_max", shared.pending_max as u64, 1, SHARED_PENDING_MAX_LIMIT as u64);
    in_range("hosts", shared.hosts.into(), 0, SHARED_HOSTS_MAX.into());
    in_range("hosts_when_unknown", shared.hosts_when_unknown.into(), 1, SHARED_HOSTS_WHEN_UNKNOWN_MAX.into());
    in_range("heartbeat_ms", shared.heartbeat_ms, SHARED_HEARTBEAT_MS_MIN, SHARED_HEARTBEAT_MS_MAX);
    if shared.probe_max_ms < shared.probe_interval_ms || shared.probe_max_ms > SHARED_PROBE_MAX_MS_LIMIT {
        errors.push(format!(
            "shared.probe_max_ms: must be at least probe_interval_ms and at most {SHARED_PROBE_MAX_MS_LIMIT}"
        ));
    }
    if shared.host_ttl_ms < shared.heartbeat_ms.saturating_mul(SHARED_HOST_TTL_HEARTBEATS_MIN)
        || shared.host_ttl_ms > SHARED_HOST_TTL_MS_MAX
    {
        errors.push(format!(
            "shared.host_ttl_ms: must be at least {SHARED_HOST_TTL_HEARTBEATS_MIN} x heartbeat_ms and at most {SHARED_HOST_TTL_MS_MAX}"
        ));
    }
    (errors.len() == before).then_some(shared)
}

/// Why `url` cannot name the store, if it cannot. The message never quotes
/// the URL: it may hold a password, and errors reach logs and terminals.
fn check_store_url(url: &str) -> Result<(), String> {
    const ACCEPTED: &str = "redis://host:port[/db], rediss://host:port[/db], redis+unix:///path or unix:///path";
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!("required, one of {ACCEPTED}"));
    };
    match scheme {
        "redis" | "rediss" | "redis+unix" | "unix" => {}
        _ => return Err(format!("the scheme must be one of {ACCEPTED}")),
    }
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    let authority = before_query.split('/').next().unwrap_or("");
    let userinfo = authority.rsplit_once('@').map_or("", |(userinfo, _)| userinfo);
    // redis-rs also takes a password from a Unix URL's `pass` parameter.
    let password_param = query.split('&').any(|pair| matches!(pair.split('=').next(), Some("pass" | "password")));
    if userinfo.contains(':') || password_param {
        return Err("holds a password, which would be shown wherever the URL is; put it in password_file".into());
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain whitespace or control characters".into());
    }
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    if matches!(scheme, "redis" | "rediss") && host.is_empty() {
        return Err(format!("{scheme}:// needs a host ({scheme}://host:port[/db])"));
    }
    if !matches!(scheme, "redis" | "rediss") && (!authority.is_empty() || before_query.len() <= 1) {
        return Err(format!("{scheme}:// needs an absolute socket path ({scheme}:///path/to.sock)"));
    }
    // `#insecure` would ask redis-rs to skip the certificate check (this
    // build refuses it at every connect); no other fragment means anything.
    if url.contains('#') {
        return Err("must not have a #fragment (#insecure is not supported: it would turn off a TLS store's \
                    certificate check; for a private CA, give its certificate in tls_ca_file)"
            .into());
    }
    // Only the parameters the store client reads, spelled plainly: one it
    // ignores (`?db=2` on a TCP URL) would show a database the daemon does
    // not use, and an encoded one (`p%61ss=`) could smuggle a password.
    let known: &[&str] = if matches!(scheme, "redis" | "rediss") { &["protocol"] } else { &["db", "user", "protocol"] };
    if query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .any(|pair| !known.contains(&pair.split('=').next().unwrap_or("")))
    {
        return Err(format!("{scheme}:// takes only these parameters: {}", known.join(", ")));
    }
    // Last, the store client's own reading (redis-rs, as the daemon will
    // read it): a port or database that is not a number, or a wildcard
    // host, would otherwise pass here and leave every start degraded,
    // retrying a URL that can never connect. Its error is not quoted: it
    // can hold decoded URL text.
    const UNUSABLE: &str = "not a URL the store client can use: the port must be 1-65535, the database a number \
                            from 0, the host not a wildcard address (0.0.0.0, ::, 0, 0x0, however spelled), protocol resp2 or resp3";
    let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|_| UNUSABLE.to_string())?;
    let settings = info.redis_settings();
    if settings.password().is_some() {
        return Err("holds a password, which would be shown wherever the URL is; put it in password_file".into());
    }
    let (host, port) = match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) | redis::ConnectionAddr::TcpTls { host, port, .. } => {
            (Some(host.as_str()), Some(*port))
        }
        _ => (None, None),
    };
    if settings.db() < 0 || port == Some(0) || host.is_some_and(is_wildcard_host) {
        return Err(UNUSABLE.into());
    }
    // Decoded, what the raw-text checks above cannot see: an empty user
    // (AUTH "" never succeeds) and a NUL in a socket path (`%00`).
    if settings.username() == Some("") {
        return Err("names an empty user: leave the user out, or set shared.username".into());
    }
    if let redis::ConnectionAddr::Unix(path) = info.addr() {
        if path.as_os_str().as_encoded_bytes().contains(&0) {
            return Err("the socket path must not hold a NUL (%00)".into());
        }
    }
    Ok(())
}

/// Whether a host names the wildcard address in any spelling the resolver
/// reads as one: redis-rs refuses only `0.0.0.0` and `::` as written, and
/// Linux connects to the wildcard as to localhost, so a bind address
/// copied into the URL would reach whatever store runs here. IPv4 in the
/// forms inet_aton reads (`0`, `0.0`, `0x0`, `000.0.0.0`: one to four
/// parts, each zero in decimal, octal or hex), and IPv6 unspecified or
/// mapped from it (`[::ffff:0.0.0.0]`).
fn is_wildcard_host(host: &str) -> bool {
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if let Ok(v6) = bare.parse::<std::net::Ipv6Addr>() {
        return v6.is_unspecified() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_unspecified());
    }
    // A hex part needs a digit after its 0x: glibc reads `0x` as a name.
    let zero = |part: &str| {
        let digits = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")).unwrap_or(part);
        !digits.is_empty() && digits.bytes().all(|b| b == b'0')
    };
    let parts: Vec<&str> = host.split('.').collect();
    parts.len() <= 4 && parts.iter().all(|p| zero(p))
}

/// Why a cluster seed URL cannot name a node: the checks of `url`, and
/// TCP only (a cluster's nodes announce host:port to each other, and the
/// client follows MOVED to those addresses, so a socket path is no use).
/// The cluster client takes the user and protocol of every seed from the
/// first and refuses seeds that differ, so a seed names none: the user is
/// `shared.username`.
fn check_node_url(url: &str) -> Result<(), String> {
    check_store_url(url)?;
    let Some(rest) = url.strip_prefix("redis://").or_else(|| url.strip_prefix("rediss://")) else {
        return Err(
            "a cluster node is redis://host:port or rediss://host:port (no Unix sockets in cluster mode)".into()
        );
    };
    if rest.contains('?') {
        return Err("a cluster seed takes no parameters: redis://host:port".into());
    }
    let authority = rest.split('/').next().unwrap_or("");
    if authority.contains('@') {
        return Err("a cluster seed names no user (the cluster client would use the first seed's for all): \
                    set shared.username"
            .into());
    }
    let path = rest.find('/').map_or("", |at| &rest[at..]);
    if !matches!(path, "" | "/" | "/0") {
        return Err("a cluster has only database 0: redis://host:port".into());
    }
    Ok(())
}

fn build_route(name: &str, raw: RawRoute, errors: &mut Vec<String>) -> Option<RouteConfig> {
    let path = format!("routes.{name}");
    if !is_plain_name(name) {
        errors.push(format!("{path}: route names are 1-{NAME_BYTES_MAX} characters of [A-Za-z0-9_-]"));
        return None;
    }
    let rules: Vec<RuleConfig> = raw
        .rules
        .into_iter()
        .filter(|(_, rule)| rule.enabled != Some(false))
        .filter_map(|(rule_name, rule)| build_rule(&format!("{path}.rules.{rule_name}"), &rule_name, rule, errors))
        .collect();
    if rules.len() > RULES_PER_ROUTE_MAX {
        errors.push(format!("{path}.rules: at most {RULES_PER_ROUTE_MAX} rules per route"));
    }
    let known_devices = match raw.known_device_ttl_secs.unwrap_or(0) {
        0 => None,
        ttl if ttl > KNOWN_DEVICE_TTL_SECS_MAX => {
            errors.push(format!("{path}.known_device_ttl_secs: at most a year ({KNOWN_DEVICE_TTL_SECS_MAX})"));
            None
        }
        ttl => Some(KnownDevicesConfig {
            ttl_us: ttl.saturating_mul(1_000_000),
            entries_max: raw.known_devices_max.unwrap_or(KNOWN_DEVICES_MAX_DEFAULT),
            per_account_max: raw.known_devices_per_account_max.unwrap_or(KNOWN_DEVICES_PER_ACCOUNT_MAX_DEFAULT),
        }),
    };
    if raw.known_devices_per_account_max.is_some_and(|m| m == 0 || m > KNOWN_DEVICES_PER_ACCOUNT_MAX_LIMIT) {
        errors.push(format!("{path}.known_devices_per_account_max: must be 1..={KNOWN_DEVICES_PER_ACCOUNT_MAX_LIMIT}"));
    }
    let recent_passwords = match raw.recent_passwords.unwrap_or(0) {
        0 => None,
        n if n > RECENT_PASSWORDS_MAX => {
            errors.push(format!("{path}.recent_passwords: at most {RECENT_PASSWORDS_MAX}"));
            None
        }
        n => Some((n, raw.recent_passwords_max.unwrap_or(RECENT_PASSWORD_ENTRIES_MAX_DEFAULT))),
    };
    for (field, max) in
        [("known_devices_max", raw.known_devices_max), ("recent_passwords_max", raw.recent_passwords_max)]
    {
        if max.is_some_and(|m| m == 0 || m > ENTRIES_MAX_LIMIT) {
            errors.push(format!("{path}.{field}: must be 1..={ENTRIES_MAX_LIMIT}"));
        }
    }
    if known_devices.is_none() && rules.iter().any(|r| r.devices != DeviceScope::All) {
        errors.push(format!("{path}: rules scoped by `devices` need known_device_ttl_secs > 0"));
    }
    Some(RouteConfig {
        name: name.to_string(),
        fail_policy: raw.fail_policy.unwrap_or(FailPolicy::Open),
        rules,
        known_devices,
        recent_passwords,
    })
}

/// Route and rule names reach logs, `status`, metric labels and the state
/// file's rule ids: plain characters only, so none can carry a terminal
/// escape or a separator.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn build_rule(path: &str, name: &str, raw: RawRule, errors: &mut Vec<String>) -> Option<RuleConfig> {
    if !is_plain_name(name) {
        errors.push(format!("{path}: rule names are 1-{NAME_BYTES_MAX} characters of [A-Za-z0-9_-]"));
        return None;
    }
    let before = errors.len();
    let mut missing = |field: &str| errors.push(format!("{path}.{field}: required"));
    let key: Vec<Component> = match raw.key {
        None => {
            missing("key");
            Vec::new()
        }
        Some(words) => {
            let mut key = Vec::new();
            for word in words {
                let c = match word {
                    Word::Known(c) => c,
                    Word::Unknown(n) => match Component::parse(&n) {
                        Some(c) => c,
                        None => {
                            errors.push(format!(
                                "{path}.key: unknown component `{n}` (one of prefix, account, device, tenant, client_id)"
                            ));
                            continue;
                        }
                    },
                };
                if key.contains(&c) {
                    errors.push(format!("{path}.key: `{}` appears twice", c.name()));
                } else {
                    key.push(c);
                }
            }
            if key.is_empty() {
                errors.push(format!("{path}.key: must name at least one component"));
            }
            key
        }
    };
    let in_range = |errors: &mut Vec<String>, field: &str, value: u64, lo: u64, hi: u64| {
        if !(lo..=hi).contains(&value) {
            errors.push(format!("{path}.{field}: must be {lo}..={hi}"));
        }
    };
    let kind = match &raw.kind {
        Some(word) => word.known(&format!("{path}.kind"), errors)?,
        None => {
            errors.push(format!("{path}.kind: required (`rate`, `failures` or `signal`)"));
            return None;
        }
    };
    if kind != RawRuleKind::Signal && raw.detectors.is_some() {
        errors.push(format!("{path}.detectors: only a setting of a signal rule"));
    }
    let kind = match kind {
        RawRuleKind::Signal => {
            for (field, set) in [
                ("limit", raw.limit.is_some()),
                ("period_secs", raw.period_secs.is_some()),
                ("burst", raw.burst.is_some()),
                ("classes", raw.classes.is_some()),
                ("threshold", raw.threshold.is_some()),
                ("window_secs", raw.window_secs.is_some()),
                ("cleared_by_success", raw.cleared_by_success.is_some()),
            ] {
                if set {
                    errors.push(format!(
                        "{path}.{field}: not a setting of a signal rule (the detectors' are in [signals])"
                    ));
                }
            }
            let mut detectors: DetectorSet = 0;
            for word in raw.detectors.iter().flatten() {
                if let Some(d) = word.known(&format!("{path}.detectors"), errors) {
                    detectors |= d.bit();
                }
            }
            if detectors == 0 {
                errors.push(format!("{path}.detectors: name at least one detector"));
            }
            let entries_max = raw.entries_max.unwrap_or(SIGNAL_RULE_ENTRIES_MAX_DEFAULT);
            in_range(errors, "entries_max", entries_max as u64, 1, ENTRIES_MAX_LIMIT as u64);
            RuleKind::Signal { detectors, entries_max }
        }
        RawRuleKind::Rate => {
            for (field, set) in [
                ("threshold", raw.threshold.is_some()),
                ("window_secs", raw.window_secs.is_some()),
                ("cleared_by_success", raw.cleared_by_success.is_some()),
            ] {
                if set {
                    errors.push(format!("{path}.{field}: not a setting of a rate rule"));
                }
            }
            let limit = raw.limit.unwrap_or(0);
            let period_secs = raw.period_secs.unwrap_or(RATE_PERIOD_SECS_DEFAULT);
            let burst = raw.burst.unwrap_or(limit);
            let entries_max = raw.entries_max.unwrap_or(RATE_ENTRIES_MAX_DEFAULT);
            in_range(errors, "limit", limit as u64, 1, RATE_LIMIT_MAX as u64);
            in_range(errors, "period_secs", period_secs, 1, PERIOD_SECS_MAX);
            in_range(errors, "burst", burst as u64, 1, RATE_BURST_MAX as u64);
            in_range(errors, "entries_max", entries_max as u64, 1, ENTRIES_MAX_LIMIT as u64);
            let mut by_class = ByClass::default();
            for (class, c) in raw.classes.clone().unwrap_or_default() {
                let Some(class) = class.class(&format!("{path}.classes"), errors) else { continue };
                let class_name = class.name();
                let limit = c.limit.unwrap_or(limit);
                let period_secs = c.period_secs.unwrap_or(period_secs);
                let burst = c.burst.unwrap_or(burst);
                in_range(errors, &format!("classes.{class_name}.limit"), limit as u64, 1, RATE_LIMIT_MAX as u64);
                in_range(errors, &format!("classes.{class_name}.period_secs"), period_secs, 1, PERIOD_SECS_MAX);
                in_range(errors, &format!("classes.{class_name}.burst"), burst as u64, 1, RATE_BURST_MAX as u64);
                by_class[class] = Some(RateLimit { limit, period_us: period_secs.saturating_mul(1_000_000), burst });
            }
            let rate = RateLimit { limit, period_us: period_secs.saturating_mul(1_000_000), burst };
            let all =
                std::iter::once(("", rate)).chain(by_class.entries().filter_map(|(c, r)| r.map(|r| (c.name(), r))));
            for (class, r) in all {
                if !rate_fits(r) {
                    let at = if class.is_empty() { String::new() } else { format!(".classes.{class}") };
                    errors.push(format!(
                        "{path}{at}: burst x period_secs / limit is over {} days; a key would never refill",
                        BURST_SPAN_US_MAX / 86_400_000_000
                    ));
                }
            }
            RuleKind::Rate { rate, by_class, entries_max }
        }
        RawRuleKind::Failures => {
            for (field, set) in [
                ("limit", raw.limit.is_some()),
                ("period_secs", raw.period_secs.is_some()),
                ("burst", raw.burst.is_some()),
                ("classes", raw.classes.is_some()),
            ] {
                if set {
                    errors.push(format!("{path}.{field}: not a setting of a failures rule"));
                }
            }
            let threshold = raw.threshold.unwrap_or(0);
            let window_secs = raw.window_secs.unwrap_or(LOGIN_WINDOW_SECS_DEFAULT);
            let entries_max = raw.entries_max.unwrap_or(FAILURE_ENTRIES_MAX_DEFAULT);
            in_range(errors, "threshold", threshold as u64, 1, THRESHOLD_MAX as u64);
            in_range(errors, "window_secs", window_secs, WINDOW_US_MIN / 1_000_000, PERIOD_SECS_MAX);
            in_range(errors, "entries_max", entries_max as u64, 1, ENTRIES_MAX_LIMIT as u64);
            RuleKind::Failures {
                threshold,
                window_us: window_secs.saturating_mul(1_000_000),
                cleared_by_success: raw.cleared_by_success.unwrap_or(false),
                entries_max,
            }
        }
    };
    if key.len() == 1 && key[0] == Component::ClientId {
        errors.push(format!(
            "{path}.key: never key on client_id alone (anyone can name a victim's client); add `prefix`"
        ));
    }
    let responses = match &raw.responses {
        None => vec![Rung::Deny],
        Some(words) => words.iter().filter_map(|w| w.known(&format!("{path}.responses"), errors)).collect(),
    };
    if responses.is_empty() || responses.len() > RUNGS_PER_RULE_MAX {
        errors.push(format!("{path}.responses: 1 to {RUNGS_PER_RULE_MAX} rungs"));
    }
    let devices = match &raw.devices {
        None => DeviceScope::All,
        Some(word) => word.known(&format!("{path}.devices"), errors).unwrap_or(DeviceScope::All),
    };
    let scope = match &raw.scope {
        None => Scope::default_for(&kind, &key),
        Some(word) => word.known(&format!("{path}.scope"), errors).unwrap_or(Scope::Host),
    };
    if matches!(kind, RuleKind::Signal { .. }) {
        if scope == Scope::Global {
            errors.push(format!("{path}.scope: a signal rule acts on this host's flags; only `host`"));
        }
        // A detector flags a subject, not a person: its precision does not
        // justify refusing an account's owner on the device they use.
        if responses.contains(&Rung::Deny) && devices != DeviceScope::UnknownDevices {
            errors.push(format!(
                "{path}.responses: `deny` on a signal rule needs devices = \"unknown\": a detector's precision \
                 does not justify refusing an account's owner on a known device"
            ));
        }
    }
    (errors.len() == before).then(|| RuleConfig {
        name: name.to_string(),
        key,
        kind,
        monitor: raw.monitor.unwrap_or(false),
        responses,
        required: raw.required.unwrap_or(true),
        devices,
        scope,
    })
}

fn build_decision_log(raw: RawDecisionLog, errors: &mut Vec<String>) -> Option<DecisionLogConfig> {
    let before = errors.len();
    let mut in_range = |field: &str, value: u64, lo: u64, hi: u64| {
        if !(lo..=hi).contains(&value) {
            errors.push(format!("decision_log.{field}: must be {lo}..={hi}"));
        }
    };
    let file_bytes_max = raw.file_bytes_max.unwrap_or(DECISION_LOG_FILE_BYTES_MAX_DEFAULT);
    in_range("file_bytes_max", file_bytes_max, DECISION_LOG_FILE_BYTES_MIN, DECISION_LOG_FILE_BYTES_MAX_LIMIT);
    let files_max = raw.files_max.unwrap_or(DECISION_LOG_FILES_MAX_DEFAULT);
    in_range("files_max", u64::from(files_max), 1, u64::from(DECISION_LOG_FILES_MAX_LIMIT));
    let age_max_secs = raw.age_max_secs.unwrap_or(DECISION_LOG_AGE_MAX_SECS_DEFAULT);
    in_range("age_max_secs", age_max_secs, DECISION_LOG_AGE_MAX_SECS_MIN, DECISION_LOG_AGE_MAX_SECS_LIMIT);
    let queue_max = raw.queue_max.unwrap_or(DECISION_LOG_QUEUE_MAX_DEFAULT);
    in_range("queue_max", queue_max as u64, 1, DECISION_LOG_QUEUE_MAX_LIMIT as u64);
    let path = raw.path.unwrap_or_default();
    if path.as_os_str().is_empty() {
        errors.push("decision_log.path: required: the directory the log files go in".into());
    }
    (errors.len() == before).then_some(DecisionLogConfig {
        path,
        file_bytes_max,
        files_max,
        age_max_us: age_max_secs * 1_000_000,
        queue_max,
    })
}

fn build_signals(raw: RawSignals, errors: &mut Vec<String>) -> Option<SignalsConfig> {
    let mut in_range = |field: &str, value: u64, lo: u64, hi: u64| {
        if !(lo..=hi).contains(&value) {
            errors.push(format!("signals.{field}: must be {lo}..={hi}"));
        }
    };
    let window_secs = raw.window_secs.unwrap_or(SIGNALS_WINDOW_SECS_DEFAULT);
    in_range("window_secs", window_secs, SIGNALS_WINDOW_SECS_MIN, SIGNALS_WINDOW_SECS_MAX);
    let publish_interval_ms = raw.publish_interval_ms.unwrap_or(SIGNALS_PUBLISH_INTERVAL_MS_DEFAULT);
    in_range("publish_interval_ms", publish_interval_ms, 1, SIGNALS_PUBLISH_INTERVAL_MS_MAX);
    let flag_ttl_secs = raw.flag_ttl_secs.unwrap_or(SIGNALS_FLAG_TTL_SECS_DEFAULT);
    in_range("flag_ttl_secs", flag_ttl_secs, 1, SIGNALS_WINDOW_SECS_MAX);
    let queue_max = raw.queue_max.unwrap_or(SIGNALS_QUEUE_MAX_DEFAULT);
    in_range("queue_max", queue_max as u64, 1, SIGNALS_QUEUE_MAX_LIMIT as u64);
    let mut cap = |field: &str, value: Option<usize>, default: usize| {
        let value = value.unwrap_or(default);
        in_range(field, value as u64, 1, ENTRIES_MAX_LIMIT as u64);
        value
    };
    let prefixes_max = cap("prefixes_max", raw.prefixes_max, SIGNALS_PREFIXES_MAX_DEFAULT);
    let wide_prefixes_max = cap("wide_prefixes_max", raw.wide_prefixes_max, SIGNALS_WIDE_PREFIXES_MAX_DEFAULT);
    let blocks_max = cap("blocks_max", raw.blocks_max, SIGNALS_BLOCKS_MAX_DEFAULT);
    let accounts_max = cap("accounts_max", raw.accounts_max, SIGNALS_ACCOUNTS_MAX_DEFAULT);
    let passwords_max = cap("passwords_max", raw.passwords_max, SIGNALS_PASSWORDS_MAX_DEFAULT);
    let tenants_max = cap("tenants_max", raw.tenants_max, SIGNALS_TENANTS_MAX_DEFAULT);
    let flags_max = cap("flags_max", raw.flags_max, SIGNALS_FLAGS_MAX_DEFAULT);
    let success_sample = raw.success_sample.unwrap_or(SIGNALS_SUCCESS_SAMPLE_DEFAULT);
    in_range("success_sample", u64::from(success_sample), 1, u64::from(SIGNALS_SUCCESS_SAMPLE_LIMIT));
    let success_sources_max = raw.success_sources_max.unwrap_or(SIGNALS_SUCCESS_SOURCES_MAX_DEFAULT);
    in_range("success_sources_max", u64::from(success_sources_max), 1, u64::from(SIGNALS_THRESHOLD_MAX));
    let sketch_bytes_max = raw.sketch_bytes_max.unwrap_or(SIGNALS_SKETCH_BYTES_MAX_DEFAULT);
    in_range("sketch_bytes_max", sketch_bytes_max as u64, SIGNALS_SKETCH_BYTES_MIN, SIGNALS_SKETCH_BYTES_MAX_LIMIT);
    let mode = |word: &Option<Word<DetectorMode>>, at: &str, default, errors: &mut Vec<String>| match word {
        None => default,
        Some(w) => w.known(&format!("signals.{at}.mode"), errors).unwrap_or(default),
    };
    let share = |value: Option<f64>, at: &str, errors: &mut Vec<String>| {
        let value = value.unwrap_or(SIGNALS_FAILURE_SHARE_MIN_DEFAULT);
        if !(0.0..=1.0).contains(&value) {
            errors.push(format!("signals.{at}.failure_share_min: must be 0.0..=1.0"));
        }
        value
    };
    let threshold = |value: Option<u32>, at: &str, default: u32, errors: &mut Vec<String>| {
        let value = value.unwrap_or(default);
        // The sketches count exactly below 128 (see signals/sketch.rs).
        if !(2..=SIGNALS_THRESHOLD_MAX).contains(&value) {
            errors.push(format!("signals.{at}.threshold: must be 2..={SIGNALS_THRESHOLD_MAX}"));
        }
        value
    };
    let detector = |raw: &RawDetector, at: &str, default_threshold: u32, errors: &mut Vec<String>| DetectorConfig {
        mode: mode(&raw.mode, at, DetectorMode::Enforce, errors),
        threshold: threshold(raw.threshold, at, default_threshold, errors),
        failure_share_min: share(raw.failure_share_min, at, errors),
        accounts_per_source_max: u32::MAX,
    };
    let counting = |raw: &RawCountDetector, at: &str, default_threshold: u32, errors: &mut Vec<String>| {
        let gated = RawDetector { mode: raw.mode.clone(), threshold: raw.threshold, failure_share_min: None };
        DetectorConfig { failure_share_min: 0.0, ..detector(&gated, at, default_threshold, errors) }
    };
    let password_spray =
        counting(&raw.password_spray, "password_spray", SIGNALS_PASSWORD_SPRAY_THRESHOLD_DEFAULT, errors);
    let narrow_spray = detector(&raw.narrow_spray, "narrow_spray", SIGNALS_NARROW_SPRAY_THRESHOLD_DEFAULT, errors);
    let w = &raw.wide_spray;
    let gated = RawDetector { mode: w.mode.clone(), threshold: w.threshold, failure_share_min: w.failure_share_min };
    let mut wide_spray = detector(&gated, "wide_spray", SIGNALS_WIDE_SPRAY_THRESHOLD_DEFAULT, errors);
    wide_spray.accounts_per_source_max =
        w.accounts_per_source_max.unwrap_or(SIGNALS_WIDE_SPRAY_ACCOUNTS_PER_SOURCE_MAX_DEFAULT);
    if !(1..=SIGNALS_THRESHOLD_MAX).contains(&wide_spray.accounts_per_source_max) {
        errors.push(format!("signals.wide_spray.accounts_per_source_max: must be 1..={SIGNALS_THRESHOLD_MAX}"));
    }
    let account_distributed = counting(
        &raw.account_distributed,
        "account_distributed",
        SIGNALS_ACCOUNT_DISTRIBUTED_THRESHOLD_DEFAULT,
        errors,
    );
    let t = &raw.tenant_anomaly;
    let tenant_anomaly = TenantAnomalyConfig {
        mode: mode(&t.mode, "tenant_anomaly", DetectorMode::Monitor, errors),
        ratio_factor: t.ratio_factor.unwrap_or(SIGNALS_TENANT_RATIO_FACTOR_DEFAULT),
        ratio_margin: t.ratio_margin.unwrap_or(SIGNALS_TENANT_RATIO_MARGIN_DEFAULT),
        failures_min: t.failures_min.unwrap_or(SIGNALS_TENANT_FAILURES_MIN_DEFAULT),
        warmup_hours: t.warmup_hours.unwrap_or(SIGNALS_TENANT_WARMUP_HOURS_DEFAULT),
        baseline_hours: t.baseline_hours.unwrap_or(SIGNALS_TENANT_BASELINE_HOURS_DEFAULT),
    };
    if !(1.0..=100.0).contains(&tenant_anomaly.ratio_factor) {
        errors.push("signals.tenant_anomaly.ratio_factor: must be 1.0..=100.0".into());
    }
    if !(0.0..=1.0).contains(&tenant_anomaly.ratio_margin) {
        errors.push("signals.tenant_anomaly.ratio_margin: must be 0.0..=1.0".into());
    }
    if tenant_anomaly.failures_min == 0 {
        errors.push("signals.tenant_anomaly.failures_min: must be at least 1".into());
    }
    if !(1..=SIGNALS_TENANT_BASELINE_HOURS_MAX).contains(&tenant_anomaly.baseline_hours) {
        errors.push(format!("signals.tenant_anomaly.baseline_hours: must be 1..={SIGNALS_TENANT_BASELINE_HOURS_MAX}"));
    }
    if tenant_anomaly.warmup_hours > SIGNALS_TENANT_BASELINE_HOURS_MAX {
        errors.push(format!("signals.tenant_anomaly.warmup_hours: at most {SIGNALS_TENANT_BASELINE_HOURS_MAX}"));
    }
    let w = &raw.ipv6_widening;
    let mut never_classes = Vec::new();
    match &w.never_classes {
        None => never_classes.push(SourceClass::Mobile),
        Some(words) => {
            for word in words {
                if let Some(c) = word.known("signals.ipv6_widening.never_classes", errors) {
                    never_classes.push(c);
                }
            }
        }
    }
    let ipv6_widening = WideningConfig {
        mode: mode(&w.mode, "ipv6_widening", DetectorMode::Enforce, errors),
        per_56: threshold(w.per_56, "ipv6_widening.per_56", SIGNALS_WIDEN_PER_56_DEFAULT, errors),
        per_48: threshold(w.per_48, "ipv6_widening.per_48", SIGNALS_WIDEN_PER_48_DEFAULT, errors),
        failure_share_min: share(w.failure_share_min, "ipv6_widening", errors),
        hold_us: w.hold_secs.unwrap_or(SIGNALS_WIDEN_HOLD_SECS_DEFAULT).saturating_mul(1_000_000),
        never_classes,
    };
    if !(1..=SIGNALS_WINDOW_SECS_MAX).contains(&w.hold_secs.unwrap_or(SIGNALS_WIDEN_HOLD_SECS_DEFAULT)) {
        errors.push(format!("signals.ipv6_widening.hold_secs: must be 1..={SIGNALS_WINDOW_SECS_MAX}"));
    }
    if !raw.enabled.unwrap_or(true) {
        return None;
    }
    Some(SignalsConfig {
        window_us: window_secs.saturating_mul(1_000_000),
        queue_max,
        publish_interval_ms,
        flag_ttl_us: flag_ttl_secs.saturating_mul(1_000_000),
        sketch_bytes_max,
        prefixes_max,
        wide_prefixes_max,
        blocks_max,
        accounts_max,
        passwords_max,
        tenants_max,
        flags_max,
        success_sample,
        success_sources_max,
        password_spray,
        narrow_spray,
        wide_spray,
        account_distributed,
        tenant_anomaly,
        ipv6_widening,
    })
}
