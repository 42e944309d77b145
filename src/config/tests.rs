use super::*;

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
