//! `tests/vectors/passwords.json`: `password_digest` and `password_tag`
//! for keys, accounts and passwords chosen to catch an implementation that
//! is right only for the easy case: empty and multi-byte UTF-8 strings,
//! inputs at BLAKE2b's 128-byte block edges (the digest's input is 8 + the
//! account + the password), the longest account the daemon accepts. Every
//! client's tests read this file; this test holds it to the Rust client.
//! `TOLLGATE_WRITE_VECTORS=1 cargo test --test password_vectors` rewrites it.

use serde_json::{json, Value};
use tollgate::client::{password_digest, password_tag};

const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/passwords.json");

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

/// (key, account, password) cases.
fn cases() -> Vec<([u8; 32], String, String)> {
    let sevens = [7u8; 32];
    let counting: [u8; 32] = std::array::from_fn(|i| i as u8);
    let mut cases = vec![
        (sevens, "alice".to_string(), "hunter2".to_string()),
        (sevens, "alice".to_string(), String::new()),
        (sevens, String::new(), "hunter2".to_string()),
        (counting, "alice".to_string(), "hunter2".to_string()),
        (counting, "Zoë@example.org".to_string(), "pässwörd-日本語-🔑".to_string()),
        (counting, "a".repeat(512), "correct horse battery staple".to_string()),
    ];
    // The digest's input is 8 + account + password bytes: around one and two
    // 128-byte blocks for a 5-byte account; the tag's is the password alone.
    for len in [1, 114, 115, 116, 127, 128, 129, 243, 256, 1000] {
        let password: String = (0..len).map(|i| (b'a' + (i % 26) as u8) as char).collect();
        cases.push((counting, "alice".to_string(), password));
    }
    cases
}

fn expected() -> Value {
    let vectors: Vec<Value> = cases()
        .into_iter()
        .map(|(key, account, password)| {
            json!({
                "key": hex(&key),
                "account": account,
                "password": password,
                "digest": hex(&password_digest(&key, &account, &password)),
                "tag": hex(&password_tag(&key, &password)),
            })
        })
        .collect();
    json!({
        "about": "password_digest and password_tag vectors; PROTOCOL.md section 5 (The password tag) specifies both. Checked against the Rust client by tests/password_vectors.rs.",
        "vectors": vectors,
    })
}

#[test]
fn the_password_vectors_file_matches_the_rust_client() {
    let want = expected();
    if std::env::var_os("TOLLGATE_WRITE_VECTORS").is_some() {
        std::fs::write(PATH, serde_json::to_string_pretty(&want).unwrap() + "\n").unwrap();
    }
    let file: Value = serde_json::from_str(&std::fs::read_to_string(PATH).unwrap()).unwrap();
    assert_eq!(file, want, "tests/vectors/passwords.json differs from the Rust client's values");
    // Read back as a client would: every entry recomputes from its fields.
    for v in file["vectors"].as_array().unwrap() {
        let key: [u8; 32] = unhex(v["key"].as_str().unwrap()).try_into().unwrap();
        let (account, password) = (v["account"].as_str().unwrap(), v["password"].as_str().unwrap());
        assert_eq!(hex(&password_digest(&key, account, password)), v["digest"].as_str().unwrap());
        assert_eq!(hex(&password_tag(&key, password)), v["tag"].as_str().unwrap());
    }
}

/// The worked value PROTOCOL.md prints is the file's first entry.
#[test]
fn the_worked_value_in_the_protocol_is_the_first_vector() {
    let protocol = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/PROTOCOL.md")).unwrap();
    let first = &expected()["vectors"][0];
    for field in ["digest", "tag"] {
        let value = first[field].as_str().unwrap();
        assert!(protocol.contains(&format!("`{value}`")), "PROTOCOL.md's worked {field} is not {value}");
    }
}
