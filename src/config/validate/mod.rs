//! Validation and building: lays a file over the built-in defaults and
//! checks every value, collecting every problem instead of stopping at the
//! first. Routes and rules here; the other sections in `sections.rs`,
//! `[shared]` in `shared.rs`.

use std::path::Path;

mod sections;
mod shared;

use super::*;
use crate::failure_window::{THRESHOLD_MAX, WINDOW_US_MIN};
use sections::build_responses;
use sections::{build_activity, build_decision_log, build_metrics, build_server, build_signals, build_source};
use shared::build_shared;

impl Config {
    /// Lays `raw` over the defaults and validates the result.
    pub fn build(raw: RawConfig) -> Result<Config, ConfigErrors> {
        let mut errors = Vec::new();
        let state = raw.state.unwrap_or_else(|| STATE_PATH_DEFAULT.into());
        let secret =
            raw.secret.unwrap_or_else(|| state.parent().unwrap_or_else(|| Path::new(".")).join(SECRET_FILE_NAME));
        let key_derivation = raw.key_derivation.and_then(|n| {
            let derivation = crate::keys::Derivation::from_number(n);
            if derivation.is_none() {
                errors.push("key_derivation: must be 1 (BLAKE2b) or 2 (SipHash-2-4)".to_string());
            }
            derivation
        });
        let snapshot_interval_ms = raw.snapshot_interval_ms.unwrap_or(SNAPSHOT_INTERVAL_MS_DEFAULT);
        if !(1..=SNAPSHOT_INTERVAL_MS_MAX).contains(&snapshot_interval_ms) {
            errors.push(format!("snapshot_interval_ms: must be 1..={SNAPSHOT_INTERVAL_MS_MAX}"));
        }
        let attempt_timeout_ms = raw.attempt_timeout_ms.unwrap_or(ATTEMPT_TIMEOUT_MS_DEFAULT);
        if !(1..=ATTEMPT_TIMEOUT_MS_MAX).contains(&attempt_timeout_ms) {
            errors.push(format!("attempt_timeout_ms: must be 1..={ATTEMPT_TIMEOUT_MS_MAX}"));
        }
        let class_file = raw.source.class_file.clone();
        let exemptions: Vec<(Option<String>, Option<String>)> =
            raw.source.exemptions.iter().flatten().map(|e| (e.prefix.clone(), e.reason.clone())).collect();
        let source = build_source(raw.source, &mut errors);
        let exemptions = crate::exemptions::validate(&exemptions, &source.trusted_proxies, &mut errors);
        let server = build_server(raw.server, &mut errors);
        let responses = build_responses(raw.responses, &mut errors);
        let shared = raw.shared.and_then(|shared| build_shared(shared, &mut errors));
        let signals = build_signals(raw.signals, &mut errors);
        let activity = build_activity(raw.activity, &mut errors);
        let decision_log = raw.decision_log.and_then(|log| build_decision_log(log, &mut errors));
        let metrics = raw.metrics.and_then(|metrics| build_metrics(metrics, &mut errors));

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
                key_derivation,
                snapshot_interval_ms,
                attempt_timeout_ms,
                source,
                class_file,
                exemptions,
                server,
                responses,
                routes,
                shared,
                signals,
                activity,
                decision_log,
                metrics,
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
