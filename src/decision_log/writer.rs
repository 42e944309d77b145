//! The decision log's writer: a bounded queue from the request path, one
//! thread (`tollgate-decisions`) that writes, flushes, rotates and deletes.
//!
//! The queue drops and counts when full (`DropQueue`). The thread sleeps
//! between rounds rather than blocking on the queue, for the pump's
//! reason: a blocked receiver costs every sender a wake-up call.
//!
//! Files are `decisions-<start_ms>-<n>.tglog` (`start_ms` on the daemon's
//! clock, zero-padded so names sort by time), each begun with a header. A
//! file is never appended to after it is closed or after a restart: a
//! crash leaves at most a torn tail, which replay reports and reads past.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::record::{encode_header, encode_record, Header, Record, HEADER_BYTES};
use super::DecisionLogStats;
use crate::audit::LogCap;
use crate::clock::Clock;
use crate::config::DecisionLogConfig;
use crate::drop_queue::{drop_queue, DropQueue};
use crate::unpoisoned::Unpoisoned;

/// How long the thread sleeps between draining rounds; the queue
/// (`queue_max`) must hold this long's decisions at peak.
pub const WRITER_POLL_MS: u64 = 10;
/// Buffered records reach the file at least this often: what a crash can
/// lose beyond the queue.
pub const FLUSH_INTERVAL_MS: u64 = 1_000;
/// The writer's buffer: at a million records a second (40 MB/s) the
/// default 8 KiB means ten thousand write calls a second, 1 MiB a few
/// dozen. (Measured: the thread's CPU per record barely moved, 0.18 to
/// 0.17 µs; its time is in the queue and the encoding.) A crash loses at
/// most this much or `FLUSH_INTERVAL_MS` of records, whichever is less.
const WRITE_BUFFER_BYTES: usize = 1 << 20;
/// Retention (`files_max`, `age_max_secs`) is enforced at every rotation
/// and at least this often, so a quiet daemon still deletes old files.
const RETENTION_INTERVAL_MS: u64 = 60_000;
/// After a failed write, the next file is tried this much later: a full
/// disk must not become a loop of failing opens.
const RETRY_AFTER_ERROR_MS: u64 = 1_000;
/// Write-error log lines per second, at most.
const ERROR_LINES_PER_SEC_MAX: u64 = 1;
/// Not every row needs its error text: the first ones are enough.
const LAST_ERROR_CHARS_MAX: usize = 256;
pub const FILE_EXTENSION: &str = "tglog";
const FILE_PREFIX: &str = "decisions-";

/// Files begun in one millisecond (of the manual clock, say), at most.
const FILES_PER_MS_MAX: u32 = 999_999;

/// The name of the file begun at `start_us`, the `n`-th of that
/// millisecond: names sort as the files were begun.
pub fn file_name(start_us: u64, n: u32) -> String {
    format!("{FILE_PREFIX}{:016}-{n:06}.{FILE_EXTENSION}", start_us / 1000)
}

/// A file's start (ms) and number from its name, if it is one of ours.
fn start_of(name: &str) -> Option<(u64, u32)> {
    let rest = name.strip_prefix(FILE_PREFIX)?.strip_suffix(FILE_EXTENSION)?.strip_suffix('.')?;
    let (ms, n) = rest.split_once('-')?;
    Some((ms.parse().ok()?, n.parse().ok()?))
}

/// The log as the daemon holds it: the queue's sending end and the counters.
pub struct DecisionLog {
    queue: DropQueue<Record>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct Shared {
    path: PathBuf,
    records_written: AtomicU64,
    /// Records lost after the queue (no file could be opened, a write or
    /// flush failed); the queue counts its own drops.
    records_dropped: AtomicU64,
    bytes_written: AtomicU64,
    files: AtomicU64,
    write_errors: AtomicU64,
    last_error: Mutex<Option<String>>,
    stop: AtomicBool,
}

impl DecisionLog {
    /// Creates the directory (mode 0700: digests are for this host's
    /// operators) and starts the writer thread. `fingerprint` names the
    /// secret the digests are made with (`Secret::fingerprint`).
    pub fn start(config: &DecisionLogConfig, clock: Clock, fingerprint: u64) -> io::Result<DecisionLog> {
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&config.path)?;
        let (log, rx) = DecisionLog::unstarted(config);
        let writer = Writer::new(config.clone(), clock, fingerprint, rx, log.shared.clone());
        let thread = std::thread::Builder::new().name("tollgate-decisions".into()).spawn(move || writer.run())?;
        *log.thread.locked() = Some(thread);
        Ok(log)
    }

    fn unstarted(config: &DecisionLogConfig) -> (DecisionLog, Receiver<Record>) {
        let (queue, rx) = drop_queue(config.queue_max);
        let shared = Arc::new(Shared { path: config.path.clone(), ..Shared::default() });
        (DecisionLog { queue, shared, thread: Mutex::new(None) }, rx)
    }

    /// Queues a record; never blocks (a full queue drops and counts it).
    pub fn send(&self, record: Record) {
        self.queue.send(record);
    }

    pub fn stats(&self) -> DecisionLogStats {
        let s = &self.shared;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DecisionLogStats {
            path: s.path.display().to_string(),
            records_written: get(&s.records_written),
            records_dropped: get(&s.records_dropped) + self.queue.dropped(),
            bytes_written: get(&s.bytes_written),
            files: get(&s.files),
            write_errors: get(&s.write_errors),
            last_error: s.last_error.locked().clone(),
        }
    }

    /// Writes what is queued, flushes, and stops the thread (at shutdown).
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.locked().take() {
            let _ = thread.join();
        }
    }
}

/// The file being written.
struct Current {
    out: BufWriter<File>,
    /// Bytes in the file, header included, flushed or not.
    bytes: u64,
    /// Records written to `out` since its last flush (lost if it fails).
    unflushed: u64,
}

struct Writer {
    config: DecisionLogConfig,
    clock: Clock,
    fingerprint: u64,
    rx: Receiver<Record>,
    shared: Arc<Shared>,
    current: Option<Current>,
    /// Encoding buffer, reused.
    scratch: Vec<u8>,
    last_flush: Instant,
    last_retention: Option<Instant>,
    /// No file is opened before this, after a write error.
    retry_at: Option<Instant>,
    errors: LogCap,
}

impl Writer {
    fn new(
        config: DecisionLogConfig,
        clock: Clock,
        fingerprint: u64,
        rx: Receiver<Record>,
        shared: Arc<Shared>,
    ) -> Self {
        Writer {
            config,
            clock,
            fingerprint,
            rx,
            shared,
            current: None,
            scratch: Vec::with_capacity(super::RECORD_BYTES_MAX),
            last_flush: Instant::now(),
            last_retention: None,
            retry_at: None,
            errors: LogCap::new(ERROR_LINES_PER_SEC_MAX),
        }
    }

    fn run(mut self) {
        self.enforce_retention();
        loop {
            let stopping = self.shared.stop.load(Ordering::Relaxed);
            if !stopping {
                std::thread::sleep(Duration::from_millis(WRITER_POLL_MS));
            }
            // At most a queue's worth per round, then the timers.
            for _ in 0..self.config.queue_max {
                match self.rx.try_recv() {
                    Ok(record) => self.write(&record),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.flush();
                        return;
                    }
                }
            }
            if stopping {
                // The daemon has stopped answering: what is queued is all.
                while let Ok(record) = self.rx.try_recv() {
                    self.write(&record);
                }
                self.flush();
                return;
            }
            if self.last_flush.elapsed() >= Duration::from_millis(FLUSH_INTERVAL_MS) {
                self.flush();
            }
            if self.last_retention.is_none_or(|at| at.elapsed() >= Duration::from_millis(RETENTION_INTERVAL_MS)) {
                self.enforce_retention();
            }
        }
    }

    fn write(&mut self, record: &Record) {
        self.scratch.clear();
        encode_record(record, &mut self.scratch);
        let len = self.scratch.len() as u64;
        let full = self.current.as_ref().is_some_and(|c| c.bytes + len > self.config.file_bytes_max);
        if full {
            self.flush();
            self.current = None;
        }
        if self.current.is_none() && !self.open() {
            self.shared.records_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let current = self.current.as_mut().expect("opened");
        match current.out.write_all(&self.scratch) {
            Ok(()) => {
                current.bytes += len;
                current.unflushed += 1;
                self.shared.records_written.fetch_add(1, Ordering::Relaxed);
                self.shared.bytes_written.fetch_add(len, Ordering::Relaxed);
            }
            Err(e) => {
                self.shared.records_dropped.fetch_add(1, Ordering::Relaxed);
                self.failed("write", e);
            }
        }
    }

    /// Begins a new file; false (the error counted) if it cannot be.
    fn open(&mut self) -> bool {
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
            return false;
        }
        let start_us = self.clock.now_us();
        let mut header = Vec::with_capacity(HEADER_BYTES);
        encode_header(&Header { start_us, fingerprint: self.fingerprint }, &mut header);
        // After the newest file of this millisecond (a restart on the
        // manual clock begins at the same one), never in a gap retention
        // left, so that names keep sorting as the files were begun.
        let first = match log_files(&self.config.path) {
            Ok(files) => files.iter().filter(|(ms, _, _)| *ms == start_us / 1000).map(|(_, n, _)| n + 1).max(),
            Err(_) => None,
        };
        let opened = (first.unwrap_or(0)..=FILES_PER_MS_MAX)
            .map(|n| self.config.path.join(file_name(start_us, n)))
            .find_map(|path| match OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => None,
                other => Some(other),
            })
            .unwrap_or_else(|| Err(io::Error::other("too many files begun in one millisecond")));
        let written = opened.and_then(|file| {
            let mut out = BufWriter::with_capacity(WRITE_BUFFER_BYTES, file);
            out.write_all(&header)?;
            Ok(out)
        });
        match written {
            Ok(out) => {
                self.current = Some(Current { out, bytes: HEADER_BYTES as u64, unflushed: 0 });
                self.shared.files.fetch_add(1, Ordering::Relaxed);
                self.shared.bytes_written.fetch_add(HEADER_BYTES as u64, Ordering::Relaxed);
                self.retry_at = None;
                // The new file counts among `files_max`.
                self.enforce_retention();
                true
            }
            Err(e) => {
                self.failed("open", e);
                false
            }
        }
    }

    fn flush(&mut self) {
        self.last_flush = Instant::now();
        let Some(current) = &mut self.current else { return };
        let unflushed = current.unflushed;
        current.unflushed = 0;
        if let Err(e) = current.out.flush() {
            // What the buffer held is lost with the file.
            self.shared.records_dropped.fetch_add(unflushed, Ordering::Relaxed);
            self.failed("flush", e);
        }
    }

    /// Counts and logs a failed write; the file is given up and the next
    /// one tried after `RETRY_AFTER_ERROR_MS`.
    fn failed(&mut self, what: &str, e: io::Error) {
        self.count_error(what, e);
        // A BufWriter whose write failed may hold a partial record; the
        // file ends there (a torn tail replay reads past) and is dropped
        // without another flush attempt.
        if let Some(current) = self.current.take() {
            let (_file, _lost) = current.out.into_parts();
        }
        self.retry_at = Some(Instant::now() + Duration::from_millis(RETRY_AFTER_ERROR_MS));
    }

    /// Counts and logs (rate-capped) an error of the log's files.
    fn count_error(&mut self, what: &str, e: io::Error) {
        self.shared.write_errors.fetch_add(1, Ordering::Relaxed);
        let message: String = format!("{what}: {e}").chars().take(LAST_ERROR_CHARS_MAX).collect();
        if let Some(suppressed) = self.errors.admit(crate::clock::Clock::System.now_us()) {
            tracing::error!(target: crate::daemon::LOG_TARGET, error = %message, path = %self.config.path.display(), suppressed, "decision log write failed");
        }
        *self.shared.last_error.locked() = Some(message);
    }

    /// Deletes the oldest files past `files_max`, and every file whose
    /// records are all older than `age_max` (the next file began before
    /// the cut-off); never the file being written.
    fn enforce_retention(&mut self) {
        self.last_retention = Some(Instant::now());
        let mut files = match log_files(&self.config.path) {
            Ok(files) => files,
            // Retention waits for the next round; the file being written
            // is not the one at fault.
            Err(e) => {
                self.count_error("list", e);
                return;
            }
        };
        let cutoff_ms = self.clock.now_us().saturating_sub(self.config.age_max_us) / 1000;
        let count = files.len();
        // Sorted oldest first; the newest is (or will be) the current file.
        let mut keep = Vec::with_capacity(count);
        let excess = count.saturating_sub(self.config.files_max as usize);
        for (i, (start_ms, _, path)) in files.iter().enumerate() {
            let next_start_ms = files.get(i + 1).map(|(ms, _, _)| *ms);
            let is_newest = i + 1 == count;
            let too_many = i < excess && !is_newest;
            let too_old = next_start_ms.is_some_and(|next| next <= cutoff_ms);
            if too_many || too_old {
                if let Err(e) = fs::remove_file(path) {
                    if e.kind() != io::ErrorKind::NotFound {
                        self.count_error("delete", e);
                        keep.push(*start_ms);
                    }
                }
            } else {
                keep.push(*start_ms);
            }
        }
        files.clear();
        self.shared.files.store(keep.len() as u64, Ordering::Relaxed);
    }
}

/// The log files in `dir` (start ms, number, path), oldest first.
pub(crate) fn log_files(dir: &Path) -> io::Result<Vec<(u64, u32, PathBuf)>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if let Some((start_ms, n)) = name.to_str().and_then(start_of) {
            files.push((start_ms, n, entry.path()));
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision_log::{read_file_bytes, Name, Op};
    use crate::protocol::{Decision, Reason};

    fn config(dir: &Path, queue_max: usize) -> DecisionLogConfig {
        DecisionLogConfig {
            path: dir.to_path_buf(),
            file_bytes_max: 4096,
            files_max: 3,
            age_max_us: 3_600_000_000,
            queue_max,
        }
    }

    fn record(time_us: u64) -> Record {
        Record {
            time_us,
            op: Op::Check,
            decision: Decision::Allow,
            reason: Reason::Allowed,
            route: Name::from_slice(b"login"),
            rule: Name::from_slice(b"source_rate"),
            address: Some("192.0.2.1".parse().unwrap()),
            account: Some([1; 16]),
            device: None,
            tenant: None,
            client_id: None,
            password_digest: None,
            password_tag: None,
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        // No thread drains it: the third record finds the queue full.
        let (log, _rx) = DecisionLog::unstarted(&config(dir.path(), 2));
        for t in 0..3 {
            log.send(record(t));
        }
        assert_eq!(log.stats().records_dropped, 1);
    }

    #[test]
    fn a_file_that_cannot_be_written_is_counted_and_logged_and_nothing_blocks() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("decisions");
        std::fs::create_dir(&dir).unwrap();
        let log = DecisionLog::start(&config(&dir, 1024), Clock::manual(), 5).unwrap();
        log.send(record(0));
        std::thread::sleep(Duration::from_millis(5 * WRITER_POLL_MS));
        // The directory replaced by a file: the next file cannot be begun.
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::write(&dir, b"in the way").unwrap();
        // About 80 bytes a record: 100 fill the first file and need another.
        for t in 1..=100 {
            log.send(record(t));
        }
        log.stop();
        let stats = log.stats();
        assert!(stats.write_errors >= 1, "{stats:?}");
        assert!(stats.last_error.as_deref().is_some_and(|e| e.starts_with("open: ")), "{stats:?}");
        assert_eq!(stats.records_written + stats.records_dropped, 101, "{stats:?}");
        assert!(stats.records_dropped > 0, "{stats:?}");
    }

    #[test]
    fn files_rotate_at_their_size_and_the_oldest_go_past_files_max() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Clock::manual();
        let log = DecisionLog::start(&config(dir.path(), 1024), clock.clone(), 5).unwrap();
        // About 80 bytes a record: 300 records fill 6 files of 4 KiB.
        for i in 0..300 {
            log.send(record(i));
            if i % 50 == 0 {
                clock.advance(1000);
                std::thread::sleep(Duration::from_millis(2 * WRITER_POLL_MS));
            }
        }
        log.stop();
        let stats = log.stats();
        assert_eq!((stats.records_written, stats.records_dropped, stats.write_errors), (300, 0, 0));
        let files = log_files(dir.path()).unwrap();
        assert_eq!(files.len(), 3, "{files:?}");
        assert_eq!(stats.files, 3);
        let mut records = 0;
        for (_, _, path) in &files {
            let bytes = fs::read(path).unwrap();
            assert!(bytes.len() as u64 <= 4096);
            let contents = read_file_bytes(&bytes);
            assert!(contents.problems.is_empty());
            records += contents.records.len();
        }
        // The newest three files hold the last records, in order.
        assert!(records < 300 && records > 100, "{records}");
    }
}
