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
    assert_eq!(login.rules.len(), 5, "four counting rules and spray detection's signal rule");
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
        "snapshot_interval_ms = 0\nkey_derivation = 3\n[source]\nipv6_prefix_len = 128\n[routes.login.rules.source_failures]\nthreshold = 0\n[routes.token.rules.x]\nkind = \"rate\"\nkey = [\"client_id\"]\nlimit = 5\n",
    )
    .unwrap();
    let errors = Config::build(raw).unwrap_err().0;
    let joined = errors.join("\n");
    assert!(joined.contains("snapshot_interval_ms"), "{joined}");
    assert!(joined.contains("key_derivation: must be 1 (BLAKE2b) or 2 (SipHash-2-4)"), "{joined}");
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
    for scope in [Scope::Host, Scope::Global] {
        let rule = parsed_rule(&format!("[routes.api.rules.r]\nscope = \"{}\"\n", scope.name()));
        assert_eq!(rule.scope, Some(Word::Known(scope)));
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
            "routes.api.rules.r.kind: `rat` is not `rate`, `failures` or `signal`",
        ),
        (
            "[routes.api.rules.r]\nkind = \"Rate\"\n".to_string(),
            "routes.api.rules.r.kind: `Rate` is not `rate`, `failures` or `signal`",
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

#[test]
fn the_builtin_rules_resolve_to_their_scopes() {
    let global = [
        ("login", "source_failures"),
        ("login", "account_failures"),
        ("login", "known_device_failures"),
        ("reauth", "device_failures"),
        ("mfa_verify", "account_failures"),
        ("mfa_resend", "account_rate"),
        ("password_reset", "account_rate"),
        ("token", "client_failures"),
    ];
    let config = Config::default();
    let mut seen_global = Vec::new();
    for route in &config.routes {
        for rule in &route.rules {
            let pair = (route.name.as_str(), rule.name.as_str());
            let expected = if global.contains(&pair) { Scope::Global } else { Scope::Host };
            assert_eq!(rule.scope, expected, "{pair:?}");
            if rule.scope == Scope::Global {
                seen_global.push(pair);
            }
        }
    }
    seen_global.sort();
    let mut global = global.to_vec();
    global.sort();
    assert_eq!(seen_global, global, "a built-in rule named here is missing");
    assert_eq!(config.shared, None);
}

#[test]
fn a_rule_s_scope_is_the_file_s_when_given_and_a_misspelling_names_its_key() {
    let text = "[routes.login.rules.source_failures]\nscope = \"host\"\n\
                [routes.login.rules.source_rate]\nscope = \"global\"\n\
                [routes.api.rules.r]\nkind = \"rate\"\nkey = [\"tenant\"]\nlimit = 5\n\
                [routes.api.rules.a]\nkind = \"rate\"\nkey = [\"account\", \"prefix\"]\nlimit = 5\n";
    let config = Config::build(Config::parse(text).unwrap()).unwrap();
    let scope =
        |route: &str, rule: &str| config.route(route).unwrap().rules.iter().find(|r| r.name == rule).unwrap().scope;
    assert_eq!(scope("login", "source_failures"), Scope::Host);
    assert_eq!(scope("login", "source_rate"), Scope::Global);
    assert_eq!(scope("api", "r"), Scope::Host);
    assert_eq!(scope("api", "a"), Scope::Global);

    let text = "[routes.login.rules.source_failures]\nscope = \"globl\"\n";
    let errors = Config::build(Config::parse(text).expect("a misspelling is not a parse error")).unwrap_err().0;
    assert_eq!(errors, ["routes.login.rules.source_failures.scope: `globl` is not host or global"]);

    // A disabled rule is not judged, its scope included.
    let text = "[routes.login.rules.source_failures]\nenabled = false\nscope = \"globl\"\n";
    Config::build(Config::parse(text).unwrap()).unwrap();
}

/// A `[shared]` table holding `lines`.
fn shared(lines: &str) -> Result<Option<SharedConfig>, Vec<String>> {
    let text = format!("[shared]\n{lines}\n");
    Config::build(Config::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"))).map(|c| c.shared).map_err(|e| e.0)
}

#[test]
fn shared_takes_its_defaults_and_needs_only_a_url() {
    let built = shared("url = \"redis://10.0.0.5:6379/0\"").unwrap().unwrap();
    assert_eq!(
        built,
        SharedConfig {
            url: "redis://10.0.0.5:6379/0".into(),
            nodes: Vec::new(),
            username: None,
            password_file: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            key_prefix: "tg".into(),
            timeout_ms: 2,
            busy_max_ms: 500,
            connect_timeout_ms: 200,
            probe_interval_ms: 100,
            probe_max_ms: 2000,
            breaker_failures: 3,
            batch_max: 64,
            pending_max: 4096,
            hosts: 0,
            hosts_when_unknown: 2,
            heartbeat_ms: 1000,
            host_ttl_ms: 10_000,
        }
    );
    assert_eq!(
        shared("").unwrap_err(),
        ["shared: one of url (a single store) or nodes (a Redis Cluster's seed nodes) is required"]
    );
}

#[test]
fn shared_nodes_name_a_cluster() {
    let built = shared("nodes = [\"redis://10.0.0.5:7000\", \"redis://10.0.0.6:7000/0\"]").unwrap().unwrap();
    assert_eq!(built.nodes, ["redis://10.0.0.5:7000", "redis://10.0.0.6:7000/0"]);
    // The cluster client takes every seed's user and protocol from the
    // first, and refuses seeds that differ: a seed names neither.
    for (lines, expected) in [
        (
            "nodes = [\"redis://a:7000\", \"redis://user@b:7000/0\"]",
            "shared.nodes[1]: a cluster seed names no user (the cluster client would use the first seed's for all): \
             set shared.username",
        ),
        (
            "nodes = [\"redis://alice@a:7000\", \"redis://b:7000\"]",
            "shared.nodes[0]: a cluster seed names no user (the cluster client would use the first seed's for all): \
             set shared.username",
        ),
        (
            "nodes = [\"redis://a:7000?protocol=resp3\", \"redis://b:7000\"]",
            "shared.nodes[0]: a cluster seed takes no parameters: redis://host:port",
        ),
    ] {
        assert_eq!(shared(lines).unwrap_err(), [expected], "{lines}");
    }
    assert_eq!(built.url, "redis://10.0.0.5:7000", "the first node describes the store");
    for (lines, expected) in [
        (
            "url = \"redis://a\"\nnodes = [\"redis://b:7000\"]",
            vec!["shared: url and nodes exclude each other: url for a single store, nodes for a cluster".to_string()],
        ),
        ("nodes = []", vec!["shared.nodes: 1..=64 cluster seed URLs (redis://host:port)".to_string()]),
        (
            "nodes = [\"redis://ok:7000\", \"unix:///run/redis.sock\"]",
            vec![
                "shared.nodes[1]: a cluster node is redis://host:port or rediss://host:port (no Unix sockets in cluster mode)"
                    .to_string(),
            ],
        ),
        (
            "nodes = [\"redis://:hunter2@b:7000\"]",
            vec![
                "shared.nodes[0]: holds a password, which would be shown wherever the URL is; put it in password_file"
                    .to_string(),
            ],
        ),
        (
            "nodes = [\"redis://b:7000/2\"]",
            vec!["shared.nodes[0]: a cluster has only database 0: redis://host:port".to_string()],
        ),
        (
            "nodes = [\"rediss://b:7000\", \"redis://c:7000\"]",
            vec!["shared.nodes: all rediss:// (TLS) or all redis://, not a mix".to_string()],
        ),
        (
            "nodes = [\"redis://b:7000\"]\ntls_ca_file = \"/etc/tollgate/redis-ca.pem\"",
            vec![
                "shared.tls_ca_file: only for a TLS store; the url (or nodes) must be rediss://host:port to use tls_ca_file"
                    .to_string(),
            ],
        ),
    ] {
        assert_eq!(shared(lines).unwrap_err(), expected, "{lines}");
    }
    let tls =
        shared("nodes = [\"rediss://b:7000\", \"rediss://c:7000/0\"]\ntls_ca_file = \"/etc/tollgate/redis-ca.pem\"")
            .unwrap()
            .unwrap();
    assert_eq!(tls.nodes, ["rediss://b:7000", "rediss://c:7000/0"]);
    assert_eq!(tls.tls_ca_file, Some(PathBuf::from("/etc/tollgate/redis-ca.pem")));
    let many: Vec<String> = (0..65).map(|i| format!("\"redis://n{i}:7000\"")).collect();
    assert_eq!(
        shared(&format!("nodes = [{}]", many.join(", "))).unwrap_err(),
        ["shared.nodes: 1..=64 cluster seed URLs (redis://host:port)"]
    );
}

#[test]
fn shared_url_forms() {
    for url in [
        "redis://10.0.0.5:6379/0",
        "redis://store.internal",
        "rediss://store.internal:6380",
        "redis+unix:///run/redis/redis.sock",
        "unix:///run/redis/redis.sock?db=2",
    ] {
        assert!(shared(&format!("url = \"{url}\"")).is_ok(), "{url} refused");
    }
    // A user goes with a password: the client sends a user only with one.
    for url in ["redis://tollgate@store:6379", "rediss://tollgate@10.0.0.5:6380/1"] {
        let lines = format!("url = \"{url}\"\npassword_file = \"/run/credentials/redis\"");
        assert!(shared(&lines).is_ok(), "{url} refused");
    }
    let accepted = "redis://host:port[/db], rediss://host:port[/db], redis+unix:///path or unix:///path";
    let schemes = format!("shared.url: the scheme must be one of {accepted}");
    let required = format!("shared.url: required, one of {accepted}");
    let schemes = schemes.as_str();
    let required = required.as_str();
    for (url, expected) in [
        ("http://store:6379", schemes),
        ("valkey://store:6379", schemes),
        ("", required),
        ("store:6379", required),
        ("redis://", "shared.url: redis:// needs a host (redis://host:port[/db])"),
        ("rediss://", "shared.url: rediss:// needs a host (rediss://host:port[/db])"),
        ("unix://relative.sock", "shared.url: unix:// needs an absolute socket path (unix:///path/to.sock)"),
        ("redis://sto re:6379", "shared.url: must not contain whitespace or control characters"),
        (
            "rediss://store:6380/#insecure",
            "shared.url: must not have a #fragment (#insecure is not supported: it would turn off a TLS store's \
             certificate check; for a private CA, give its certificate in tls_ca_file)",
        ),
        (
            "rediss://store:6380#verify-later",
            "shared.url: must not have a #fragment (#insecure is not supported: it would turn off a TLS store's \
             certificate check; for a private CA, give its certificate in tls_ca_file)",
        ),
    ] {
        assert_eq!(shared(&format!("url = \"{url}\"")).unwrap_err(), [expected], "{url}");
    }
    // What the store's client cannot read is refused here, by its field,
    // not left to every start, degraded and retrying what never connects.
    let unusable = "not a URL the store client can use: the port must be 1-65535, the database a number from 0, \
                    the host not a wildcard address (0.0.0.0, ::, 0, 0x0, however spelled), protocol resp2 or resp3";
    for (field, lines) in [
        ("shared.url", "url = \"redis://store:notaport\""),
        ("shared.url", "url = \"redis://store:99999\""),
        ("shared.url", "url = \"redis://[::1:6379\""),
        ("shared.url", "url = \"redis://store:6379/notadb\""),
        ("shared.url", "url = \"unix:///run/redis.sock?db=two\""),
        ("shared.url", "url = \"redis://0.0.0.0:6379\""),
        // The wildcard however spelled: Linux connects to it as localhost,
        // so a bind address copied here would reach the wrong store.
        ("shared.url", "url = \"redis://0:6379\""),
        ("shared.url", "url = \"redis://0x0:6379\""),
        ("shared.url", "url = \"redis://0X0:6379\""),
        ("shared.url", "url = \"redis://00:6379\""),
        ("shared.url", "url = \"redis://0.0:6379\""),
        ("shared.url", "url = \"rediss://000.0.0x00.0:6380\""),
        ("shared.url", "url = \"redis://[::ffff:0.0.0.0]:6379\""),
        ("shared.url", "url = \"redis://[0:0::0]:6379\""),
        ("shared.nodes[0]", "nodes = [\"redis://0:7000\", \"redis://b:7000\"]"),
        ("shared.url", "url = \"redis://store:6379/-1\""),
        ("shared.url", "url = \"unix:///run/redis.sock?db=-5\""),
        ("shared.url", "url = \"redis://store:0\""),
        // redis-rs's error can hold the decoded text: never quoted.
        ("shared.url", "url = \"redis://store:6379?protocol=%1b%5b2J\""),
        ("shared.nodes[1]", "nodes = [\"redis://a:7000\", \"redis://b:70000\"]"),
    ] {
        assert_eq!(shared(lines).unwrap_err(), [format!("{field}: {unusable}")], "{lines}");
    }
    // A password however spelled, and parameters the client ignores.
    let password = "shared.url: holds a password, which would be shown wherever the URL is; put it in password_file";
    for (url, expected) in [
        (
            "unix:///run/redis.sock?p%61ss=hunter2",
            "shared.url: unix:// takes only these parameters: db, user, protocol",
        ),
        ("unix:///run/redis.sock?pass=hunter2", password),
        ("redis://:hunter2@store:6379", password),
        ("redis://store:6379?db=2", "shared.url: redis:// takes only these parameters: protocol"),
        ("rediss://store:6380?user=admin", "shared.url: rediss:// takes only these parameters: protocol"),
    ] {
        assert_eq!(shared(&format!("url = \"{url}\"")).unwrap_err(), [expected], "{url}");
    }
    for (lines, expected) in [
        (
            "url = \"unix:///run/redis.sock?user\"",
            "shared.url: names an empty user: leave the user out, or set shared.username",
        ),
        ("url = \"unix:///run/redis%00.sock\"", "shared.url: the socket path must not hold a NUL (%00)"),
        (
            "url = \"unix:///run/redis.sock?user=alice\"\nusername = \"bob\"\npassword_file = \"/p\"",
            "shared.username: the url names a user too; give it in one place, username",
        ),
        (
            "url = \"redis://alice@store:6379\"\nusername = \"bob\"\npassword_file = \"/p\"",
            "shared.username: the url names a user too; give it in one place, username",
        ),
        // Without a password the client would log in as the default user,
        // and status would show one it does not use.
        (
            "url = \"redis://alice@store:6379\"",
            "shared.url: names a user but there is no password_file: the store's client sends a user only with \
             its password (for an ACL user without one, nopass, put any text in password_file)",
        ),
        (
            "url = \"unix:///run/redis.sock?user=alice\"",
            "shared.url: names a user but there is no password_file: the store's client sends a user only with \
             its password (for an ACL user without one, nopass, put any text in password_file)",
        ),
        (
            "url = \"redis://store:6379\"\nusername = \"tollgate\"",
            "shared.username: there is no password_file: the store's client sends a user only with its \
             password (for an ACL user without one, nopass, put any text in password_file)",
        ),
    ] {
        assert_eq!(shared(lines).unwrap_err(), [expected], "{lines}");
    }
    for url in [
        "redis://store:6379?protocol=resp3",
        "unix:///run/redis.sock?db=2&user=tollgate",
        "redis://store:",
        "redis://0.store.internal:6379",
        "redis://0x.0:6379",
        "redis://10.0.0.0:6379",
        "redis://[::1]:6379",
    ] {
        assert!(shared(&format!("url = \"{url}\"\npassword_file = \"/p\"")).is_ok(), "{url} refused");
    }
    // A CA bundle goes with TLS only, and an error names both fields.
    let built = shared("url = \"rediss://store:6380\"\ntls_ca_file = \"/etc/tollgate/redis-ca.pem\"").unwrap().unwrap();
    assert_eq!(built.tls_ca_file, Some(PathBuf::from("/etc/tollgate/redis-ca.pem")));
    assert_eq!(shared("url = \"rediss://store:6380\"").unwrap().unwrap().tls_ca_file, None);
    for url in ["redis://store:6379", "unix:///run/redis.sock"] {
        assert_eq!(
            shared(&format!("url = \"{url}\"\ntls_ca_file = \"/etc/tollgate/redis-ca.pem\"")).unwrap_err(),
            ["shared.tls_ca_file: only for a TLS store; the url (or nodes) must be rediss://host:port to use tls_ca_file"],
            "{url}"
        );
    }
}

#[test]
fn a_password_in_the_url_is_refused_and_never_echoed() {
    for url in [
        "redis://:hunter2@store:6379",
        "redis://tollgate:hunter2@store:6379/0",
        "redis+unix:///run/redis.sock?pass=hunter2",
        "unix:///run/redis.sock?db=1&password=hunter2",
        "rediss://:hunter2@store",
        "valkey://:hunter2@store",
    ] {
        let errors = shared(&format!("url = \"{url}\"")).unwrap_err();
        assert!(errors.iter().all(|e| !e.contains("hunter2")), "{url}: {errors:?}");
        if url.starts_with("redis://") || url.contains("unix") {
            assert_eq!(
                errors,
                ["shared.url: holds a password, which would be shown wherever the URL is; put it in password_file"]
            );
        }
    }
}

#[test]
fn each_shared_bound_is_reported_with_its_number_and_all_at_once() {
    let url = "url = \"redis://store\"\n";
    let cases = [
        ("timeout_ms = 0", "shared.timeout_ms: must be 1..=1000"),
        ("timeout_ms = 1001", "shared.timeout_ms: must be 1..=1000"),
        ("busy_max_ms = 60001", "shared.busy_max_ms: must be 0..=60000"),
        ("connect_timeout_ms = 9", "shared.connect_timeout_ms: must be 10..=10000"),
        ("connect_timeout_ms = 10001", "shared.connect_timeout_ms: must be 10..=10000"),
        ("probe_interval_ms = 9", "shared.probe_interval_ms: must be 10..=10000"),
        ("probe_interval_ms = 10001\nprobe_max_ms = 20000", "shared.probe_interval_ms: must be 10..=10000"),
        (
            "probe_interval_ms = 500\nprobe_max_ms = 499",
            "shared.probe_max_ms: must be at least probe_interval_ms and at most 60000",
        ),
        ("probe_max_ms = 60001", "shared.probe_max_ms: must be at least probe_interval_ms and at most 60000"),
        ("breaker_failures = 0", "shared.breaker_failures: must be 1..=100"),
        ("breaker_failures = 101", "shared.breaker_failures: must be 1..=100"),
        ("batch_max = 0", "shared.batch_max: must be 1..=1024"),
        ("batch_max = 1025", "shared.batch_max: must be 1..=1024"),
        ("pending_max = 0", "shared.pending_max: must be 1..=1000000"),
        ("pending_max = 1000001", "shared.pending_max: must be 1..=1000000"),
        ("hosts = 1001", "shared.hosts: must be 0..=1000"),
        ("hosts_when_unknown = 0", "shared.hosts_when_unknown: must be 1..=1000"),
        ("hosts_when_unknown = 1001", "shared.hosts_when_unknown: must be 1..=1000"),
        ("heartbeat_ms = 99", "shared.heartbeat_ms: must be 100..=60000"),
        ("heartbeat_ms = 60001\nhost_ttl_ms = 600000", "shared.heartbeat_ms: must be 100..=60000"),
        (
            "heartbeat_ms = 5000\nhost_ttl_ms = 9999",
            "shared.host_ttl_ms: must be at least 2 x heartbeat_ms and at most 600000",
        ),
        ("host_ttl_ms = 600001", "shared.host_ttl_ms: must be at least 2 x heartbeat_ms and at most 600000"),
        ("key_prefix = \"\"", "shared.key_prefix: 1-32 characters of [A-Za-z0-9_-]"),
        ("key_prefix = \"{tg}\"", "shared.key_prefix: 1-32 characters of [A-Za-z0-9_-]"),
        ("key_prefix = \"tg:\"", "shared.key_prefix: 1-32 characters of [A-Za-z0-9_-]"),
        ("key_prefix = \"abcdefghijklmnopqrstuvwxyz0123456\"", "shared.key_prefix: 1-32 characters of [A-Za-z0-9_-]"),
        ("username = \"\"", "shared.username: 1-64 characters, no whitespace or control characters"),
        ("username = \"tolls gate\"", "shared.username: 1-64 characters, no whitespace or control characters"),
        (
            "username = \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"",
            "shared.username: 1-64 characters, no whitespace or control characters",
        ),
    ];
    for (lines, expected) in cases {
        assert_eq!(shared(&format!("{url}{lines}")).unwrap_err(), [expected], "{lines}");
    }
    // Each bound's edge is accepted.
    let edges =
        "timeout_ms = 1000\nbusy_max_ms = 60000\nconnect_timeout_ms = 10\nprobe_interval_ms = 10\nprobe_max_ms = 10\n\
                 breaker_failures = 100\nbatch_max = 1024\npending_max = 1000000\nhosts = 1000\n\
                 hosts_when_unknown = 1000\nheartbeat_ms = 100\nhost_ttl_ms = 200\n\
                 key_prefix = \"abcdefghijklmnopqrstuvwxyz012345\"\nusername = \"tollgate\"\n\
                 password_file = \"/run/credentials/redis\"";
    let built = shared(&format!("{url}{edges}")).unwrap().unwrap();
    assert_eq!((built.hosts, built.host_ttl_ms, built.probe_max_ms), (1000, 200, 10));
    assert_eq!(built.password_file, Some(PathBuf::from("/run/credentials/redis")));

    // Every problem at once, the rules' beside the store's.
    let text = "[shared]\nurl = \"valkey://store\"\ntimeout_ms = 0\nbatch_max = 0\n\
                [routes.login.rules.source_failures]\nscope = \"globl\"\nthreshold = 0\n";
    let errors = Config::build(Config::parse(text).unwrap()).unwrap_err().0;
    for expected in [
        "shared.url: the scheme must be one of redis://host:port[/db], rediss://host:port[/db], redis+unix:///path or unix:///path",
        "shared.timeout_ms: must be 1..=1000",
        "shared.batch_max: must be 1..=1024",
        "routes.login.rules.source_failures.scope: `globl` is not host or global",
        "routes.login.rules.source_failures.threshold: must be 1..=1000",
    ] {
        assert!(errors.iter().any(|e| e == expected), "{expected} missing from {errors:#?}");
    }
}

#[test]
fn shared_refuses_unknown_keys() {
    let err = Config::parse("[shared]\nurl = \"redis://store\"\nsentinels = []\n").unwrap_err();
    assert!(err.contains("sentinels"), "{err}");
}

#[test]
fn a_client_certificate_needs_its_key_and_a_tls_store() {
    let built = shared("url = \"rediss://store:6380\"\ntls_cert_file = \"/etc/tollgate/host.crt\"\ntls_key_file = \"/etc/tollgate/host.key\"")
        .unwrap()
        .unwrap();
    assert_eq!(built.tls_cert_file, Some(PathBuf::from("/etc/tollgate/host.crt")));
    assert_eq!(built.tls_key_file, Some(PathBuf::from("/etc/tollgate/host.key")));
    for half in ["tls_cert_file = \"/c\"", "tls_key_file = \"/k\""] {
        assert_eq!(
            shared(&format!("url = \"rediss://store:6380\"\n{half}")).unwrap_err(),
            ["shared.tls_cert_file, shared.tls_key_file: both or neither (a client certificate and its key)"]
        );
    }
    assert_eq!(
        shared("url = \"redis://store:6379\"\ntls_cert_file = \"/c\"\ntls_key_file = \"/k\"").unwrap_err(),
        ["shared.tls_cert_file: only for a TLS store; the url (or nodes) must be rediss://host:port to present a client certificate"]
    );
}
