//! Replays the checked-in fuzz corpus (`fuzz/corpus/frame_decode/`) through
//! the fuzz target's body on stable, so every seed and every input the fuzzer
//! kept stays a regression test. Crash files under `fuzz/artifacts/` are
//! gitignored and deliberately not replayed here.

use std::path::{Path, PathBuf};

use tollgate::codec::fuzz_request_frames;

/// Fewer files than this means the corpus went missing, not that it passed.
const CORPUS_FILES_MIN: usize = 10;

fn corpus_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/frame_decode");
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    let mut files: Vec<PathBuf> =
        entries.map(|entry| entry.expect("directory entry").path()).filter(|path| path.is_file()).collect();
    files.sort();
    files
}

#[test]
fn every_corpus_input_decodes_without_panicking_and_round_trips() {
    let files = corpus_files();
    assert!(
        files.len() >= CORPUS_FILES_MIN,
        "fuzz/corpus/frame_decode holds {} files; expected at least {CORPUS_FILES_MIN}",
        files.len()
    );
    for path in &files {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let outcome = std::panic::catch_unwind(|| fuzz_request_frames(&data));
        assert!(outcome.is_ok(), "fuzz_request_frames panicked on {}", path.display());
    }
    eprintln!("replayed {} corpus files", files.len());
}
