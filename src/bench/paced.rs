//! Paced load (`--rate`): each connection on a thread of its own, its
//! operations due at a fixed interval, so latency is measured at a chosen
//! load instead of at whatever rate replies return, and a stall shows in
//! the percentiles instead of lowering the load. With `--floor-socket` the
//! echo server is timed alongside, under the same stalls.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{BenchArgs, Tally, Worker};

/// A paced connection on its own thread (tokio's timer ticks in whole
/// milliseconds; a thread's sleep is accurate to a few microseconds with
/// the timer slack lowered). Operations are due at a fixed interval, the
/// connections' schedules staggered across it. A request sent late because
/// the previous reply was late is timed from when it was due, so a stall
/// shows in the percentiles instead of silently lowering the load.
///
/// With a floor socket, every due operation also goes, as the same bytes,
/// to the echo server, the two taking turns at going first.
pub(super) fn drive_paced(
    args: &BenchArgs,
    connection: usize,
    interval: Duration,
    until: Instant,
) -> std::io::Result<(Tally, Option<Tally>)> {
    let _ = nix::sys::prctl::set_timerslack(1_000);
    let mut daemon = PacedPeer::connect(&args.socket, args.raw)?;
    let mut floor = args.floor_socket.as_deref().map(|path| PacedPeer::connect(path, true)).transpose()?;
    let mut worker = Worker::new(Arc::new(args.clone()), connection);
    let mut out = Vec::with_capacity(256 * args.in_flight);
    let mut id = 1u64;
    let mut due = Instant::now() + interval.mul_f64(connection as f64 / args.connections as f64);
    let mut floor_first = false;
    while due < until && Instant::now() < until {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        out.clear();
        let mut expected = 0;
        for _ in 0..args.in_flight {
            expected += worker.encode(&mut id, &mut out);
        }
        match floor.as_mut() {
            None => daemon.exchange(&out, expected, due)?,
            Some(floor) => {
                let (first, second) = if floor_first { (floor, &mut daemon) } else { (&mut daemon, floor) };
                first.exchange(&out, expected, due)?;
                second.exchange(&out, expected, due)?;
                floor_first = !floor_first;
            }
        }
        due += interval;
    }
    Ok((daemon.tally, floor.map(|f| f.tally)))
}

/// One paced connection's socket, its replies' tally, and when its last
/// reply came.
struct PacedPeer {
    stream: std::os::unix::net::UnixStream,
    raw: bool,
    tally: Tally,
    inbuf: Vec<u8>,
    replied: Instant,
}

impl PacedPeer {
    fn connect(path: &std::path::Path, raw: bool) -> std::io::Result<PacedPeer> {
        let stream = std::os::unix::net::UnixStream::connect(path)?;
        Ok(PacedPeer { stream, raw, tally: Tally::new(), inbuf: vec![0u8; 64 * 1024], replied: Instant::now() })
    }

    /// Sends `frames` and reads `expected` replies, timed from `due` when
    /// this peer's previous reply came after it, else from the send.
    fn exchange(&mut self, frames: &[u8], expected: usize, due: Instant) -> std::io::Result<()> {
        use std::io::{Read, Write};
        let sent = Instant::now();
        let start = if self.replied > due { due } else { sent };
        self.stream.write_all(frames)?;
        let (mut filled, mut received) = (0usize, 0usize);
        while received < expected {
            if filled == self.inbuf.len() {
                self.inbuf.resize(self.inbuf.len() * 2, 0);
            }
            let n = self.stream.read(&mut self.inbuf[filled..])?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            filled += n;
            let (used, replies) =
                self.tally.take_replies(&self.inbuf[..filled], self.raw, start.elapsed().as_micros() as u64);
            received += replies;
            self.inbuf.copy_within(used..filled, 0);
            filled -= used;
        }
        self.replied = Instant::now();
        Ok(())
    }
}
