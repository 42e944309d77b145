//! The sections besides routes and `[shared]`: `[source]`, `[server]`,
//! `[responses]`, `[activity]`, `[decision_log]`, `[metrics]` and `[signals]`, each laid
//! over its defaults and checked, every problem collected.

use super::*;
use crate::classes::SourceClass;
use crate::source::{self, SourcePolicy};

pub(super) fn build_source(raw: RawSource, errors: &mut Vec<String>) -> SourcePolicy {
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

pub(super) fn build_activity(raw: RawActivity, errors: &mut Vec<String>) -> ActivityConfig {
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

pub(super) fn build_server(raw: RawServer, errors: &mut Vec<String>) -> ServerConfig {
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

pub(super) fn build_responses(raw: RawResponses, errors: &mut Vec<String>) -> ResponsePolicy {
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

pub(super) fn build_metrics(raw: RawMetrics, errors: &mut Vec<String>) -> Option<MetricsListen> {
    let Some(listen) = raw.listen else {
        errors.push("metrics.listen: required: a loopback address and port, or a socket path".into());
        return None;
    };
    if listen.starts_with('/') {
        return Some(MetricsListen::Unix(listen.into()));
    }
    match listen.parse::<std::net::SocketAddr>() {
        // Loopback only: metrics name rules, routes and the load, which
        // are for this host's scraper (or a proxy that authenticates).
        Ok(addr) if addr.ip().is_loopback() && addr.port() != 0 => Some(MetricsListen::Tcp(addr)),
        _ => {
            errors.push(format!(
                "metrics.listen: `{listen}` is not a loopback address with a port (127.0.0.1:9464, [::1]:9464) or an \
                 absolute socket path"
            ));
            None
        }
    }
}

pub(super) fn build_decision_log(raw: RawDecisionLog, errors: &mut Vec<String>) -> Option<DecisionLogConfig> {
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

pub(super) fn build_signals(raw: RawSignals, errors: &mut Vec<String>) -> Option<SignalsConfig> {
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
