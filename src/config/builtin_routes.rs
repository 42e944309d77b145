//! The built-in routes, written as if they came from a file, so that a
//! user's file is laid over them key by key and both go through the same
//! validation. Their numbers are the named defaults of `defaults.rs`.

use std::collections::BTreeMap;

use super::{
    Detector, DeviceScope, FailPolicy, RawClassLimit, RawRoute, RawRule, RawRuleKind, Rung,
    ACCOUNT_FAILURES_THRESHOLD_DEFAULT, FAILURE_ENTRIES_MAX_DEFAULT, KNOWN_DEVICE_TTL_SECS_DEFAULT,
    LOGIN_RATE_BURST_DEFAULT, LOGIN_RATE_LIMIT_DEFAULT, LOGIN_WINDOW_SECS_DEFAULT, RATE_ENTRIES_MAX_DEFAULT,
    RATE_PERIOD_SECS_DEFAULT, REAUTH_FAILURES_THRESHOLD_DEFAULT, RECENT_PASSWORDS_DEFAULT, REQUEST_RATE_BURST_DEFAULT,
    REQUEST_RATE_LIMIT_DEFAULT, SIGNAL_RULE_ENTRIES_MAX_DEFAULT, SOURCE_FAILURES_THRESHOLD_DEFAULT,
};
use crate::classes::SourceClass;
use crate::keys::Component::{self, Account, ClientId, Device, Prefix, Tenant};

fn rate(limit: u32, burst: u32) -> RawRule {
    RawRule {
        kind: Some(RawRuleKind::Rate.into()),
        key: Some(vec![Prefix.into()]),
        limit: Some(limit),
        period_secs: Some(RATE_PERIOD_SECS_DEFAULT),
        burst: Some(burst),
        entries_max: Some(RATE_ENTRIES_MAX_DEFAULT),
        ..RawRule::default()
    }
}

fn keyed(mut rule: RawRule, key: &[Component]) -> RawRule {
    rule.key = Some(key.iter().map(|&c| c.into()).collect());
    rule
}

fn per(mut rule: RawRule, period_secs: u64) -> RawRule {
    if rule.kind == Some(RawRuleKind::Rate.into()) {
        rule.period_secs = Some(period_secs);
    } else {
        rule.window_secs = Some(period_secs);
    }
    rule
}

fn failures(key: &[Component], threshold: u32, cleared_by_success: bool) -> RawRule {
    RawRule {
        kind: Some(RawRuleKind::Failures.into()),
        key: Some(key.iter().map(|&c| c.into()).collect()),
        threshold: Some(threshold),
        window_secs: Some(LOGIN_WINDOW_SECS_DEFAULT),
        cleared_by_success: Some(cleared_by_success),
        entries_max: Some(FAILURE_ENTRIES_MAX_DEFAULT),
        ..RawRule::default()
    }
}

/// The built-in routes, as if written in a file. A user file is laid over
/// these key by key. README.md's preset table describes them.
pub fn builtin_routes() -> BTreeMap<String, RawRoute> {
    let route = |policy, rules: Vec<(&str, RawRule)>| RawRoute {
        fail_policy: Some(policy),
        rules: rules.into_iter().map(|(n, r)| (n.to_string(), r)).collect(),
        ..RawRoute::default()
    };
    let class_limits = |pairs: &[(SourceClass, u32, u32)]| {
        Some(
            pairs
                .iter()
                .map(|&(class, limit, burst)| {
                    (class.into(), RawClassLimit { limit: Some(limit), period_secs: None, burst: Some(burst) })
                })
                .collect(),
        )
    };
    // Login per source prefix: tight for hosting networks (where bots live
    // and people rarely do), loose for carrier and office gateways that put
    // thousands of people behind one address.
    let login_rate = RawRule {
        classes: class_limits(&[
            (SourceClass::Hosting, 30, 10),
            (SourceClass::Mobile, 1200, 600),
            (SourceClass::Business, 1200, 600),
        ]),
        ..rate(LOGIN_RATE_LIMIT_DEFAULT, LOGIN_RATE_BURST_DEFAULT)
    };
    let mut login = route(
        FailPolicy::Open,
        vec![
            ("source_rate", login_rate),
            ("source_failures", failures(&[Account, Prefix], SOURCE_FAILURES_THRESHOLD_DEFAULT, true)),
            (
                "account_failures",
                RawRule {
                    devices: Some(DeviceScope::UnknownDevices.into()),
                    ..failures(&[Account], ACCOUNT_FAILURES_THRESHOLD_DEFAULT, false)
                },
            ),
            (
                "known_device_failures",
                RawRule {
                    devices: Some(DeviceScope::KnownDevices.into()),
                    ..failures(&[Account, Device], SOURCE_FAILURES_THRESHOLD_DEFAULT, true)
                },
            ),
            // Spray detection's flags (`[signals]`): a challenge for an
            // unknown device while its source, account or password is
            // flagged; never the owner on a known device. The ladder climbs
            // per (account, prefix).
            (
                "spray_signals",
                RawRule {
                    kind: Some(RawRuleKind::Signal.into()),
                    key: Some(vec![Account.into(), Prefix.into()]),
                    detectors: Some(Detector::ALL.iter().map(|&d| d.into()).collect()),
                    devices: Some(DeviceScope::UnknownDevices.into()),
                    responses: Some(vec![Rung::Challenge.into()]),
                    entries_max: Some(SIGNAL_RULE_ENTRIES_MAX_DEFAULT),
                    ..RawRule::default()
                },
            ),
        ],
    );
    login.known_device_ttl_secs = Some(KNOWN_DEVICE_TTL_SECS_DEFAULT);
    login.recent_passwords = Some(RECENT_PASSWORDS_DEFAULT);
    BTreeMap::from([
        ("login".to_string(), login),
        (
            "reauth".to_string(),
            route(
                FailPolicy::Open,
                vec![("device_failures", failures(&[Account, Device], REAUTH_FAILURES_THRESHOLD_DEFAULT, true))],
            ),
        ),
        (
            "request".to_string(),
            route(
                FailPolicy::Closed,
                vec![("source_rate", rate(REQUEST_RATE_LIMIT_DEFAULT, REQUEST_RATE_BURST_DEFAULT))],
            ),
        ),
        // Verification attempts per account per window, whatever code they
        // target: resending a code buys no fresh guesses.
        (
            "mfa_verify".to_string(),
            route(FailPolicy::Closed, vec![("account_failures", failures(&[Account], 5, true))]),
        ),
        (
            "mfa_resend".to_string(),
            route(FailPolicy::Closed, vec![("account_rate", per(keyed(rate(3, 3), &[Account]), 900))]),
        ),
        (
            "password_reset".to_string(),
            route(
                FailPolicy::Closed,
                vec![
                    ("account_rate", per(keyed(rate(3, 3), &[Account]), 3600)),
                    ("source_rate", per(rate(20, 10), 3600)),
                    ("tenant_rate", RawRule { required: Some(false), ..per(keyed(rate(300, 100), &[Tenant]), 3600) }),
                ],
            ),
        ),
        ("registration".to_string(), route(FailPolicy::Closed, vec![("source_rate", per(rate(10, 5), 3600))])),
        // Never keyed on client_id alone: anyone can name a victim's client.
        (
            "token".to_string(),
            route(
                FailPolicy::Closed,
                vec![
                    ("client_rate", keyed(rate(600, 100), &[ClientId, Prefix])),
                    ("client_failures", failures(&[ClientId, Prefix], 10, true)),
                ],
            ),
        ),
    ])
}
