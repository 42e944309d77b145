use super::*;
use crate::classes::SourceClass;

#[test]
fn defaults_have_login_reauth_and_request() {
    let config = Config::default();
    let names: Vec<_> = config.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        ["login", "mfa_resend", "mfa_verify", "password_reset", "reauth", "registration", "request", "token"]
    );
    let login = config.route("login").unwrap();
    assert_eq!(login.rules.len(), 4);
    assert_eq!(config.secret, PathBuf::from("/var/lib/tollgate/secret"));
}

#[test]
fn file_overrides_one_limit_and_keeps_the_rest() {
    let raw = Config::parse(
        "[routes.login.rules.source_failures]\nthreshold = 3\n[routes.api]\nfail_policy = \"closed\"\n[routes.api.rules.per_tenant]\nkind = \"rate\"\nkey = [\"tenant\"]\nlimit = 10\nburst = 2\n",
    )
    .unwrap();
    let config = Config::build(raw).unwrap();
    let login = config.route("login").unwrap();
    let rule = login.rules.iter().find(|r| r.name == "source_failures").unwrap();
    assert!(matches!(rule.kind, RuleKind::Failures { threshold: 3, window_us: 900_000_000, .. }));
    let api = config.route("api").unwrap();
    assert_eq!(api.fail_policy, FailPolicy::Closed);
    assert!(matches!(api.rules[0].kind, RuleKind::Rate { rate: RateLimit { limit: 10, burst: 2, .. }, .. }));
}

#[test]
fn unknown_keys_are_refused_with_their_name() {
    let err = Config::parse("[routes.login.rules.source_failures]\nthreshhold = 3\n").unwrap_err();
    assert!(err.contains("threshhold"), "{err}");
    let err = Config::parse("colour = 1\n").unwrap_err();
    assert!(err.contains("colour"), "{err}");
}

#[test]
fn every_invalid_value_is_reported_at_once() {
    let raw = Config::parse(
        "snapshot_interval_ms = 0\n[source]\nipv6_prefix_len = 128\n[routes.login.rules.source_failures]\nthreshold = 0\n[routes.token.rules.x]\nkind = \"rate\"\nkey = [\"client_id\"]\nlimit = 5\n",
    )
    .unwrap();
    let errors = Config::build(raw).unwrap_err().0;
    let joined = errors.join("\n");
    assert!(joined.contains("snapshot_interval_ms"), "{joined}");
    assert!(joined.contains("source.ipv6_prefix_len"), "{joined}");
    assert!(joined.contains("routes.login.rules.source_failures.threshold"), "{joined}");
    assert!(joined.contains("routes.token.rules.x.key: never key on client_id alone"), "{joined}");
}

#[test]
fn rule_names_that_could_carry_an_escape_or_a_separator_are_refused() {
    for name in ["\"evil\\u001b]0;x\\u0007\"", "\"a/b\"", "\"with space\"", "\"\""] {
        let text = format!("[routes.api.rules.{name}]\nkind = \"rate\"\nkey = [\"prefix\"]\nlimit = 5\n");
        let errors = Config::build(Config::parse(&text).unwrap()).unwrap_err().0.join("\n");
        assert!(errors.contains("rule names are 1-64 characters of [A-Za-z0-9_-]"), "{name}: {errors}");
    }
}

/// The one rule `routes.api.rules.r` of a file, as parsed.
fn parsed_rule(text: &str) -> RawRule {
    let mut raw = Config::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    raw.routes.remove("api").and_then(|mut route| route.rules.remove("r")).expect("routes.api.rules.r")
}

#[test]
fn every_spelling_of_a_closed_set_parses_to_its_variant() {
    for (spelling, kind) in [("rate", RawRuleKind::Rate), ("failures", RawRuleKind::Failures)] {
        let rule = parsed_rule(&format!("[routes.api.rules.r]\nkind = \"{spelling}\"\n"));
        assert_eq!(rule.kind, Some(Word::Known(kind)), "{spelling}");
    }
    for component in Component::ALL {
        let rule = parsed_rule(&format!("[routes.api.rules.r]\nkey = [\"{}\"]\n", component.name()));
        assert_eq!(rule.key, Some(vec![Word::Known(component)]));
    }
    for rung in [Rung::Delay, Rung::Challenge, Rung::Deny] {
        let rule = parsed_rule(&format!("[routes.api.rules.r]\nresponses = [\"{}\"]\n", rung.name()));
        assert_eq!(rule.responses, Some(vec![Word::Known(rung)]));
    }
    for scope in [DeviceScope::All, DeviceScope::UnknownDevices, DeviceScope::KnownDevices] {
        let rule = parsed_rule(&format!("[routes.api.rules.r]\ndevices = \"{}\"\n", scope.name()));
        assert_eq!(rule.devices, Some(Word::Known(scope)));
    }
    for class in SourceClass::ALL {
        let rule = parsed_rule(&format!("[routes.api.rules.r.classes.{}]\nlimit = 1\n", class.name()));
        assert_eq!(rule.classes.unwrap().into_keys().collect::<Vec<_>>(), [Word::Known(class)]);
        let raw = Config::parse(&format!("[source.classes.{}]\nipv4_prefix_len = 20\n", class.name())).unwrap();
        assert_eq!(raw.source.classes.into_keys().collect::<Vec<_>>(), [Word::Known(class)]);
    }
}

#[test]
fn the_spellings_reach_the_built_rule() {
    let text = "[routes.api]\nknown_device_ttl_secs = 60\n[routes.api.rules.r]\nkind = \"rate\"\n\
                key = [\"client_id\", \"prefix\"]\nlimit = 5\nresponses = [\"delay\", \"deny\"]\ndevices = \"known\"\n\
                [routes.api.rules.r.classes.mobile]\nlimit = 7\n";
    let config = Config::build(Config::parse(text).unwrap()).unwrap();
    let rule = &config.route("api").unwrap().rules[0];
    assert_eq!(rule.key, [Component::ClientId, Component::Prefix]);
    assert_eq!(rule.responses, [Rung::Delay, Rung::Deny]);
    assert_eq!(rule.devices, DeviceScope::KnownDevices);
    let RuleKind::Rate { by_class, .. } = &rule.kind else { panic!("{rule:?}") };
    assert_eq!(by_class[SourceClass::Mobile].map(|r| r.limit), Some(7));
    assert_eq!(by_class.iter().flatten().count(), 1, "{by_class:?}");
}

#[test]
fn a_misspelling_of_a_closed_set_is_refused_naming_its_key_and_the_words_accepted() {
    let rule = "[routes.api.rules.r]\nkind = \"rate\"\nkey = [\"prefix\"]\nlimit = 5\n";
    for (text, expected) in [
        (
            "[routes.api.rules.r]\nkind = \"rat\"\n".to_string(),
            "routes.api.rules.r.kind: `rat` is not `rate` or `failures`",
        ),
        (
            "[routes.api.rules.r]\nkind = \"Rate\"\n".to_string(),
            "routes.api.rules.r.kind: `Rate` is not `rate` or `failures`",
        ),
        (
            "[routes.api.rules.r]\nkind = \"rate\"\nkey = [\"prefix\", \"acount\"]\nlimit = 5\n".to_string(),
            "routes.api.rules.r.key: unknown component `acount` (one of prefix, account, device, tenant, client_id)",
        ),
        (
            format!("{rule}responses = [\"dney\"]\n"),
            "routes.api.rules.r.responses: `dney` is not delay, challenge or deny",
        ),
        (
            format!("{rule}devices = \"unknown_devices\"\n"),
            "routes.api.rules.r.devices: `unknown_devices` is not all, unknown or known",
        ),
        (
            format!("{rule}[routes.api.rules.r.classes.hostin]\nlimit = 1\n"),
            "routes.api.rules.r.classes.hostin: unknown class (hosting, mobile, business, residential)",
        ),
        (
            "[source.classes.cloud]\nipv4_prefix_len = 20\n".to_string(),
            "source.classes.cloud: unknown class (hosting, mobile, business, residential)",
        ),
    ] {
        let errors = Config::build(Config::parse(&text).expect("a misspelling is not a parse error")).unwrap_err().0;
        assert!(errors.iter().any(|e| e == expected), "{expected} missing from {errors:#?}");
    }
}

#[test]
fn a_closed_set_is_spelled_as_a_string_and_a_file_error_names_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.toml");
    std::fs::write(&path, "[routes.api.rules.r]\nkind = { rate = {} }\nkey = [\"prefix\"]\n").unwrap();
    let err = Config::read_raw(&path, true).unwrap_err();
    assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
    let text = err.to_string();
    for part in [&path.display().to_string(), "line 2", "kind = { rate = {} }", "expected a string"] {
        assert!(text.contains(part), "{part} missing from: {text}");
    }
}

#[test]
fn each_bound_is_reported_with_its_number() {
    let text = "[server]\nidle_timeout_ms = 999\nin_flight_per_connection_max = 65537\nlog_lines_per_sec_max = 1000001\n\
                socket_mode = 0o1660\nconnections_max = 0\nframe_read_timeout_ms = 600001\n\
                reply_write_timeout_ms = 600001\nshutdown_grace_ms = 600001\n\
                [responses]\nretry_after_steps_secs = [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]\njitter_percent = 101\n\
                delay_max_ms = 60001\n[source]\nipv4_prefix_len = 33\n\
                [routes.api]\nknown_device_ttl_secs = 31622401\n[routes.api.rules.r]\nkind = \"rate\"\n\
                key = [\"prefix\"]\nlimit = 1000000001\nburst = 1000000001\n\
                responses = [\"deny\",\"deny\",\"deny\",\"deny\",\"deny\",\"deny\",\"deny\",\"deny\",\"deny\",\"deny\",\"deny\",\"deny\",\"deny\",\"deny\",\"deny\",\"deny\",\"deny\"]\n";
    let errors = Config::build(Config::parse(text).unwrap()).unwrap_err().0;
    for expected in [
        "server.idle_timeout_ms: must be 1000..=86400000",
        "server.in_flight_per_connection_max: must be 1..=65536",
        "server.log_lines_per_sec_max: must be at most 1000000",
        "server.socket_mode: permission bits (e.g. 0o660) that let the owner read and write",
        "server.connections_max: must be 1..=65536",
        "server.frame_read_timeout_ms: must be 1..=600000",
        "server.reply_write_timeout_ms: must be 1..=600000",
        "server.shutdown_grace_ms: must be at most 600000",
        "responses.retry_after_steps_secs: 1 to 16 steps, each 0..=86400",
        "responses.jitter_percent: must be 0..=100",
        "responses.delay_max_ms: must be at most 60000 and at least delay_base_ms",
        "source.ipv4_prefix_len: must be 16..=32",
        "routes.api.known_device_ttl_secs: at most a year (31622400)",
        "routes.api.rules.r.limit: must be 1..=1000000000",
        "routes.api.rules.r.burst: must be 1..=1000000000",
        "routes.api.rules.r.responses: 1 to 16 rungs",
    ] {
        assert!(errors.iter().any(|e| e == expected), "{expected} missing from {errors:#?}");
    }
}

#[test]
fn the_client_knows_every_builtin_routes_fail_policy() {
    // The client crate cannot depend on the daemon's config, so it keeps the
    // built-in policies as a table of its own: held to the routes here.
    let builtin: Vec<_> = builtin_routes().into_iter().map(|(name, route)| (name, route.fail_policy)).collect();
    let mut client: Vec<_> =
        tollgate_client::BUILTIN_FAIL_POLICIES.iter().map(|&(name, policy)| (name.to_string(), Some(policy))).collect();
    client.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(builtin, client);
}
