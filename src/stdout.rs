//! The CLI's standard output. A reader may stop early (`tollgate status |
//! head -1`); Rust ignores SIGPIPE, so every later write fails with EPIPE,
//! and `println!` would panic on it. The CLI's reports go through `outln!`
//! and `out!` instead: a closed pipe ends the process quietly and
//! successfully, as `cat` or ripgrep end; any other write error (a full
//! disk) ends it with one line. Putting SIGPIPE back to its default would
//! also do, but needs unsafe code, which this crate keeps out.

use std::fmt;
use std::io::{self, Write};

/// What `outln!` and `out!` call: `args`, then a newline if `newline`.
pub(crate) fn write(args: fmt::Arguments<'_>, newline: bool) {
    let mut stdout = io::stdout().lock();
    let written = stdout.write_fmt(args).and_then(|()| if newline { stdout.write_all(b"\n") } else { Ok(()) });
    if let Err(e) = written {
        drop(stdout);
        stop(&e);
    }
}

/// Writes `bytes` whole and flushes them, as `write`.
pub(crate) fn write_bytes(bytes: &[u8]) {
    if let Err(e) = try_write_bytes(bytes) {
        stop(&e);
    }
}

/// Writes `bytes` whole and flushes them, for a caller that has more to
/// say after a failed write (`tollgate replay`'s damage, on stderr and in
/// its exit status).
pub(crate) fn try_write_bytes(bytes: &[u8]) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    stdout.write_all(bytes).and_then(|()| stdout.flush())
}

/// The one line a write error other than a closed pipe ends with.
pub(crate) fn error_line(e: &io::Error) -> String {
    format!("cannot write to standard output: {e}")
}

/// Ends the process after a failed write to standard output.
pub(crate) fn stop(e: &io::Error) -> ! {
    if e.kind() == io::ErrorKind::BrokenPipe {
        // The reader has all it wanted.
        std::process::exit(0);
    }
    eprintln!("tollgate: error: {}", error_line(e));
    std::process::exit(1)
}

/// `println!` for the CLI's output: a reader that went away ends the
/// process quietly (see the module's comment).
macro_rules! outln {
    () => {
        crate::stdout::write(format_args!(""), true)
    };
    ($($arg:tt)*) => {
        crate::stdout::write(format_args!($($arg)*), true)
    };
}

/// `print!` for the CLI's output, as `outln!`.
macro_rules! out {
    ($($arg:tt)*) => {
        crate::stdout::write(format_args!($($arg)*), false)
    };
}

pub(crate) use {out, outln};
