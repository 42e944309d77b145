//! Replays the checked-in corpus of every fuzz target through the very body
//! the target runs, on stable, so every seed and every input the fuzzer
//! kept stays a regression test. The bodies live in `tests/fuzz_bodies/`,
//! but for two that read private decoders and so live beside them:
//! `frame_decode`'s (`tollgate::codec::fuzz_request_frames`) and
//! `decision_log`'s (`tollgate::fuzz_decision_log`). Crash files under
//! `fuzz/artifacts/` are gitignored and not replayed.
//!
//! Inputs that crashed a target because of a bug in `src/` live under
//! `fuzz/regressions/<target>/` (with a README each), outside the corpora so
//! the fuzzer never merges them away; `regressions_stay_fixed` replays them.

use std::path::{Path, PathBuf};

#[path = "fuzz_bodies/bytes.rs"]
mod bytes;
#[path = "fuzz_bodies/class_file.rs"]
mod class_file;
#[path = "fuzz_bodies/config_parse.rs"]
mod config_parse;
#[path = "fuzz_bodies/source_parse.rs"]
mod source_parse;
#[path = "fuzz_bodies/tables_model.rs"]
mod tables_model;
#[path = "fuzz_bodies/tat_table.rs"]
mod tat_table;

/// Fewer files than this means the corpus went missing, not that it passed.
const CORPUS_FILES_MIN: usize = 10;

fn files_in(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.is_file() && path.extension().is_none_or(|e| e != "md"))
        .collect();
    files.sort();
    files
}

/// Runs `body` on every file of `dir`; returns how many files there are and
/// the ones it panicked on.
fn replay(dir: &str, body: fn(&[u8])) -> (usize, Vec<String>) {
    let files = files_in(dir);
    let failed = files
        .iter()
        .filter(|path| {
            let data = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            std::panic::catch_unwind(|| body(&data)).is_err()
        })
        .map(|path| path.display().to_string())
        .collect();
    (files.len(), failed)
}

fn replay_corpus(target: &str, body: fn(&[u8])) {
    let dir = format!("fuzz/corpus/{target}");
    let (count, failed) = replay(&dir, body);
    assert!(failed.is_empty(), "{dir}: the body panicked on {failed:#?}");
    assert!(count >= CORPUS_FILES_MIN, "{dir} holds {count} files; expected at least {CORPUS_FILES_MIN}");
    eprintln!("replayed {count} {target} corpus files");
}

#[test]
fn source_parse_corpus() {
    replay_corpus("source_parse", source_parse::run);
}

#[test]
fn class_file_corpus() {
    replay_corpus("class_file", class_file::run);
}

#[test]
fn config_parse_corpus() {
    replay_corpus("config_parse", config_parse::run);
}

#[test]
fn tables_model_corpus() {
    replay_corpus("tables_model", tables_model::run);
}

#[test]
fn tat_table_corpus() {
    replay_corpus("tat_table", tat_table::run);
}

#[test]
fn decision_log_corpus() {
    replay_corpus("decision_log", tollgate::fuzz_decision_log);
}

#[test]
fn frame_decode_corpus() {
    replay_corpus("frame_decode", tollgate::codec::fuzz_request_frames);
}

#[test]
fn regressions_stay_fixed() {
    let (mut replayed, mut failed) = (0, Vec::new());
    for (target, body) in [
        ("source_parse", source_parse::run as fn(&[u8])),
        ("class_file", class_file::run),
        ("config_parse", config_parse::run),
        ("tables_model", tables_model::run),
        ("tat_table", tat_table::run),
        ("decision_log", tollgate::fuzz_decision_log),
        ("frame_decode", tollgate::codec::fuzz_request_frames),
    ] {
        let dir = format!("fuzz/regressions/{target}");
        if Path::new(env!("CARGO_MANIFEST_DIR")).join(&dir).is_dir() {
            let (count, mut panicked) = replay(&dir, body);
            replayed += count;
            failed.append(&mut panicked);
        }
    }
    assert!(failed.is_empty(), "regressions are back: {failed:#?}");
    assert!(replayed > 0, "fuzz/regressions went missing");
    eprintln!("replayed {replayed} regression files");
}
