//! docs/configuration.md and the config parser cannot drift apart: every key
//! the doc documents is one the parser accepts, every key the parser accepts
//! is documented, and the doc's complete example parses, validates and sets
//! every key.
//!
//! The parser's keys are not listed by hand: serde-reflection traces
//! `RawConfig`'s `Deserialize` impl (the same one `Config::parse` uses, with
//! `deny_unknown_fields`), so a field added to any `Raw*` struct shows up
//! here. A table whose keys are names the user chooses (routes, rules,
//! source classes) is a map; its entries are written `<name>` in the doc
//! and `<*>` below.

use std::collections::BTreeSet;

use serde_reflection::{ContainerFormat, Format, Registry, Tracer, TracerConfig};
use tollgate::{Config, FailPolicy, RawConfig};

const DOC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
/// The heading of the section holding the complete example file.
const EXAMPLE_HEADING: &str = "## A complete example";

fn doc() -> String {
    std::fs::read_to_string(DOC_PATH).unwrap_or_else(|e| panic!("cannot read {DOC_PATH}: {e}"))
}

/// The raw config's formats, as the parser's `Deserialize` impls see them.
fn registry() -> Registry {
    let mut tracer = Tracer::new(TracerConfig::default());
    // Enums inside the config must be traced on their own so every variant
    // is seen; a new one makes `registry()` name it as missing.
    tracer.trace_simple_type::<FailPolicy>().expect("trace FailPolicy");
    tracer.trace_simple_type::<RawConfig>().expect("trace RawConfig");
    tracer.registry().expect("every type in RawConfig traced (add a trace_simple_type for a new enum)")
}

/// The struct a format names, if it names one (an enum is a leaf value).
fn struct_fields<'a>(registry: &'a Registry, format: &Format) -> Option<&'a [serde_reflection::Named<Format>]> {
    match format {
        Format::TypeName(name) => match registry.get(name) {
            Some(ContainerFormat::Struct(fields)) => Some(fields),
            _ => None,
        },
        Format::Option(inner) => struct_fields(registry, inner),
        _ => None,
    }
}

/// A user-named table (`BTreeMap<String, _>`), with its value's format.
fn map_value(format: &Format) -> Option<&Format> {
    match format {
        Format::Map { value, .. } => Some(value),
        Format::Option(inner) => map_value(inner),
        _ => None,
    }
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// A list of tables (`[[source.exemptions]]`), with its entries' format.
fn table_list<'a>(registry: &Registry, format: &'a Format) -> Option<&'a Format> {
    match format {
        Format::Seq(inner) if struct_fields(registry, inner).is_some() => Some(inner),
        Format::Option(inner) => table_list(registry, inner),
        _ => None,
    }
}

/// Every key the parser accepts that holds a value (not a table), as a
/// dotted path with `<*>` for user-named entries and `[]` after a list of
/// tables.
fn parser_keys(registry: &Registry, format: &Format, prefix: &str, out: &mut BTreeSet<String>) {
    if let Some(fields) = struct_fields(registry, format) {
        for field in fields {
            parser_keys(registry, &field.value, &join(prefix, &field.name), out);
        }
    } else if let Some(entry) = table_list(registry, format) {
        parser_keys(registry, entry, &format!("{prefix}[]"), out);
    } else if let Some(value) = map_value(format) {
        parser_keys(registry, value, &join(prefix, "<*>"), out);
    } else {
        out.insert(prefix.to_string());
    }
}

/// The keys an example file sets, walked along the parser's formats so that
/// user-named entries become `<*>`.
fn example_keys(registry: &Registry, format: &Format, value: &toml::Value, prefix: &str, out: &mut BTreeSet<String>) {
    if let (Some(fields), toml::Value::Table(table)) = (struct_fields(registry, format), value) {
        for (name, value) in table {
            let field = fields
                .iter()
                .find(|f| f.name == *name)
                .unwrap_or_else(|| panic!("the example sets `{}`, which the parser refuses", join(prefix, name)));
            example_keys(registry, &field.value, value, &join(prefix, name), out);
        }
    } else if let (Some(entry), toml::Value::Array(entries)) = (table_list(registry, format), value) {
        for value in entries {
            example_keys(registry, entry, value, &format!("{prefix}[]"), out);
        }
    } else if let (Some(inner), toml::Value::Table(table)) = (map_value(format), value) {
        for value in table.values() {
            example_keys(registry, inner, value, &join(prefix, "<*>"), out);
        }
    } else {
        out.insert(prefix.to_string());
    }
}

/// The keys the doc documents: the first cell of every row of a table whose
/// first column is headed `key`, with each `<name>` segment read as `<*>`.
fn documented_keys(doc: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut in_key_table = false;
    for line in doc.lines() {
        let line = line.trim();
        if !line.starts_with('|') {
            in_key_table = false;
            continue;
        }
        let first = line.trim_matches('|').split('|').next().unwrap_or("").trim();
        if first == "key" {
            in_key_table = true;
            continue;
        }
        if !in_key_table || first.starts_with("---") {
            continue;
        }
        let key = first.trim_matches('`');
        assert!(
            first.starts_with('`') && first.ends_with('`') && !key.contains('`'),
            "a key table row whose first cell is not one `key`: {line}"
        );
        let normalised: Vec<&str> = key
            .split('.')
            .map(|segment| if segment.starts_with('<') && segment.ends_with('>') { "<*>" } else { segment })
            .collect();
        assert!(keys.insert(normalised.join(".")), "`{key}` is documented twice");
    }
    keys
}

/// The TOML block under `EXAMPLE_HEADING`.
fn example(doc: &str) -> String {
    let section = doc.split(EXAMPLE_HEADING).nth(1).unwrap_or_else(|| panic!("no `{EXAMPLE_HEADING}` section"));
    let block = section.split("```toml\n").nth(1).expect("a ```toml block in the example section");
    block.split("\n```").next().expect("the block is closed").to_string()
}

fn root() -> Format {
    Format::TypeName("RawConfig".into())
}

#[test]
fn every_documented_key_is_accepted_by_the_parser() {
    let registry = registry();
    let mut accepted = BTreeSet::new();
    parser_keys(&registry, &root(), "", &mut accepted);
    let documented = documented_keys(&doc());
    let unknown: Vec<_> = documented.difference(&accepted).collect();
    assert!(unknown.is_empty(), "docs/configuration.md documents keys the parser refuses: {unknown:?}");
}

#[test]
fn every_key_the_parser_accepts_is_documented() {
    let registry = registry();
    let mut accepted = BTreeSet::new();
    parser_keys(&registry, &root(), "", &mut accepted);
    assert!(accepted.len() >= 40, "the trace found too few keys to be real: {accepted:?}");
    let documented = documented_keys(&doc());
    let undocumented: Vec<_> = accepted.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "keys the parser accepts but docs/configuration.md does not document: {undocumented:?}"
    );
}

#[test]
fn the_complete_example_parses_validates_and_sets_every_key() {
    let text = example(&doc());
    let raw = Config::parse(&text).unwrap_or_else(|e| panic!("the example does not parse: {e}\n{text}"));
    if let Err(errors) = Config::build(raw) {
        panic!("the example does not validate:\n{errors}\n{text}");
    }
    let registry = registry();
    let mut accepted = BTreeSet::new();
    parser_keys(&registry, &root(), "", &mut accepted);
    let value: toml::Value = toml::from_str(&text).expect("the example is TOML");
    let mut set = BTreeSet::new();
    example_keys(&registry, &root(), &value, "", &mut set);
    // `shared.nodes` excludes `shared.url`: the example shows it commented
    // out, and with it in place of `url` the example must validate too.
    // `key_derivation` is commented out too: copied onto a host whose state
    // file holds rows of the other derivation, it would stop the start.
    let unset: Vec<_> =
        accepted.difference(&set).filter(|k| !["shared.nodes", "key_derivation"].contains(&k.as_str())).collect();
    assert!(unset.is_empty(), "the complete example leaves out: {unset:?}");
    assert!(text.lines().any(|l| l.starts_with("# key_derivation = ")), "the example shows key_derivation");
    let nodes = text
        .lines()
        .find_map(|l| l.strip_prefix("# nodes = "))
        .expect("the example shows `# nodes = [...]` beside url")
        .split("   #")
        .next()
        .unwrap();
    let cluster: String = text
        .lines()
        .filter(|l| !l.starts_with("# nodes = "))
        .map(|l| if l.starts_with("url = ") { format!("nodes = {nodes}\n") } else { format!("{l}\n") })
        .collect();
    let raw = Config::parse(&cluster).unwrap_or_else(|e| panic!("the cluster example does not parse: {e}"));
    let built = Config::build(raw).unwrap_or_else(|e| panic!("the cluster example does not validate:\n{e}"));
    assert_eq!(built.shared.expect("shared").nodes.len(), 2);
}
