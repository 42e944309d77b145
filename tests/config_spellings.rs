//! The configuration file's closed sets (a rule's kind, key components,
//! rungs, device scopes, source classes): every spelling accepted before
//! they became types still parses to the same thing, only strings are
//! accepted, a misspelling is reported with its key path beside every other
//! problem, and a rule removed with `enabled = false` is not judged.

use tollgate::Config;

/// Parses and builds like `tollgate serve` does (file over the defaults).
fn load(text: &str) -> Result<Config, String> {
    let raw = Config::parse(text)?;
    Config::build(raw).map_err(|e| e.to_string())
}

/// A rule with `enabled = false` is dropped before any of its values are
/// judged: a file parked with a disabled rule holding a spelling this build
/// does not know still starts the daemon (and reloads).
#[test]
fn a_disabled_rule_s_other_values_are_not_read() {
    let cases = [
        // A built-in rule switched off, with a stale spelling left behind.
        "[routes.login.rules.source_rate]\nenabled = false\nkey = [\"ip\"]\n",
        "[routes.login.rules.account_failures]\nenabled = false\nresponses = [\"block\"]\n",
        "[routes.login.rules.known_device_failures]\nenabled = false\ndevices = \"trusted\"\n",
        // A user rule parked for later.
        "[routes.api.rules.per_tenant]\nenabled = false\nkind = \"Rate\"\nkey = [\"tenant\"]\nlimit = 10\n",
        "[routes.login.rules.source_rate]\nenabled = false\n[routes.login.rules.source_rate.classes.datacenter]\nlimit = 5\n",
    ];
    let mut refused = Vec::new();
    for text in cases {
        if let Err(e) = load(text) {
            refused.push(format!("--- {text}=> {e}"));
        }
    }
    assert!(refused.is_empty(), "a disabled rule was judged:\n{}", refused.join("\n"));
}

/// A misspelling is reported with its key path (`source.classes.{name}:
/// unknown class ...`), as every other invalid value is (`ConfigErrors`:
/// one `key: message` per line).
#[test]
fn spelling_errors_still_name_their_key_path() {
    let cases = [
        ("[source.classes.datacenter]\nipv4_prefix_len = 24\n", "source.classes.datacenter"),
        (
            "[routes.login.rules.source_rate.classes.datacenter]\nlimit = 5\n",
            "routes.login.rules.source_rate.classes.datacenter",
        ),
        ("[routes.login.rules.source_rate]\nkey = [\"ip\"]\n", "routes.login.rules.source_rate.key"),
        ("[routes.login.rules.source_rate]\nkind = \"ratee\"\n", "routes.login.rules.source_rate.kind"),
    ];
    let mut lost = Vec::new();
    for (text, path) in cases {
        match load(text) {
            Ok(_) => lost.push(format!("--- {text}=> accepted")),
            Err(e) if !e.contains(path) => lost.push(format!("--- {text}=> {e}\n(no `{path}`)")),
            Err(_) => {}
        }
    }
    assert!(lost.is_empty(), "errors without their key path:\n{}", lost.join("\n"));
}

/// Every problem is in one report (`ConfigErrors`), misspellings included:
/// a misspelling is not a parse error that would stop at the first one and
/// hide the rest.
#[test]
fn every_problem_is_reported_at_once() {
    let text =
        "[routes.login.rules.source_rate]\nkey = [\"ip\"]\n\n[routes.reauth.rules.device_failures]\nthreshold = 0\n";
    let e = load(text).expect_err("two problems");
    assert!(
        e.contains("source_rate") && e.contains("device_failures.threshold"),
        "only part of the problems reported:\n{e}"
    );
}

/// Every spelling of the closed sets parses to the right value: kinds, key
/// components (`client_id`), rungs, device scopes, class names in both
/// places.
#[test]
fn every_old_spelling_still_parses() {
    let text = r#"
[source.classes.hosting]
ipv4_prefix_len = 24
[source.classes.mobile]
ipv4_prefix_len = 24
[source.classes.business]
ipv4_prefix_len = 28
[source.classes.residential]
ipv4_prefix_len = 32

[routes.login]
known_device_ttl_secs = 86400
[routes.login.rules.r1]
kind = "rate"
key = ["prefix", "account", "device", "tenant", "client_id"]
limit = 10
responses = ["delay", "challenge", "deny"]
devices = "all"
[routes.login.rules.r1.classes.hosting]
limit = 1
[routes.login.rules.r1.classes.mobile]
limit = 2
[routes.login.rules.r1.classes.business]
limit = 3
[routes.login.rules.r1.classes.residential]
limit = 4
[routes.login.rules.f1]
kind = "failures"
key = ["account"]
threshold = 3
devices = "unknown"
[routes.login.rules.f2]
kind = "failures"
key = ["account", "device"]
threshold = 3
devices = "known"
"#;
    let config = load(text).expect("every old spelling parses");
    let login = config.routes.iter().find(|r| r.name == "login").unwrap();
    let r1 = login.rules.iter().find(|r| r.name == "r1").unwrap();
    let names: Vec<&str> = r1.key.iter().map(|c| c.name()).collect();
    assert_eq!(names, ["prefix", "account", "device", "tenant", "client_id"]);
    let rungs: Vec<&str> = r1.responses.iter().map(|r| r.name()).collect();
    assert_eq!(rungs, ["delay", "challenge", "deny"]);
    let scopes: Vec<&str> =
        ["r1", "f1", "f2"].iter().map(|n| login.rules.iter().find(|r| r.name == *n).unwrap().devices.name()).collect();
    assert_eq!(scopes, ["all", "unknown", "known"]);
}

/// The closed sets are spelled only as strings: serde's externally tagged
/// form for enums (an inline table naming the variant) is refused, as an
/// undocumented spelling that an older build would refuse.
#[test]
fn closed_sets_are_spelled_only_as_strings() {
    let cases = [
        "[routes.x.rules.y]\nkind = { rate = {} }\nkey = [\"prefix\"]\nlimit = 5\n",
        "[routes.x.rules.y]\nkind = \"rate\"\nkey = [{ prefix = {} }]\nlimit = 5\n",
        "[routes.x.rules.y]\nkind = \"rate\"\nkey = [\"prefix\"]\nlimit = 5\nresponses = [{ deny = {} }]\n",
    ];
    let accepted: Vec<&str> = cases.into_iter().filter(|text| load(text).is_ok()).collect();
    assert!(accepted.is_empty(), "accepted in a form other than a string:\n{}", accepted.join("---\n"));
}
