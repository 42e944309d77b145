//! Replies that come after their call's deadline. A daemon an attacker's
//! bursts keep late for every call is busy, not down: it still answers,
//! a moment after the deadline. A timed-out call's connection was closed,
//! so the client never learned that, and once its run of late calls was
//! older than `busy_max` every late check on `login` failed open. Now a
//! timed-out call's connection is kept open in the background for up to
//! `busy_max`, and a reply arriving on it says the daemon answered.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;

/// Timed-out calls listened to at once, per client. Each holds its
/// connection open; past this many, a timed-out call's connection is
/// closed at once, so a flood of late calls cannot run the auth server
/// out of descriptors. A few are enough to hear a daemon that answers.
pub const LATE_LISTENERS_MAX: usize = 16;

/// When the daemon last answered a call after its deadline.
#[derive(Debug)]
pub(crate) struct LateReplies {
    started: Instant,
    /// µs since `started`, plus one; 0 never.
    heard_us: AtomicU64,
    listening: AtomicUsize,
}

impl LateReplies {
    pub(crate) fn new(started: Instant) -> Arc<LateReplies> {
        Arc::new(LateReplies { started, heard_us: AtomicU64::new(0), listening: AtomicUsize::new(0) })
    }

    /// When a late reply was last heard (µs as `Client`'s clock; 0 never).
    pub(crate) fn heard_us(&self) -> u64 {
        self.heard_us.load(Ordering::Relaxed)
    }

    /// Listens on `stream`, whose request was written and whose reply did
    /// not come in time (or whose caller gave up waiting: its reply is the
    /// daemon's all the same), for up to `horizon`: any byte from it is the
    /// daemon answering. The connection is then closed; its reply is
    /// not read, so it is never reused. Outside a tokio runtime, or with
    /// `LATE_LISTENERS_MAX` already listening, it is closed at once.
    pub(crate) fn listen(self: &Arc<Self>, mut stream: UnixStream, horizon: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if horizon.is_zero() {
            return;
        }
        let others = self.listening.fetch_add(1, Ordering::Relaxed);
        let replies = Listening(self.clone());
        if others >= LATE_LISTENERS_MAX {
            return;
        }
        // Timed from the hand-over, not from the task's first poll: a
        // runtime not driven meanwhile (a current-thread one between
        // `block_on`s) must not stretch the horizon. A reply read after
        // it is not counted.
        let until = tokio::time::Instant::now() + horizon;
        runtime.spawn(async move {
            let mut byte = [0u8; 1];
            if let Ok(Ok(1..)) = tokio::time::timeout_at(until, stream.read(&mut byte)).await {
                if tokio::time::Instant::now() <= until {
                    let now = replies.0.started.elapsed().as_micros() as u64 + 1;
                    replies.0.heard_us.fetch_max(now, Ordering::Relaxed);
                }
            }
        });
    }

    #[cfg(test)]
    pub(crate) fn listening(&self) -> usize {
        self.listening.load(Ordering::Relaxed)
    }
}

/// One listener's place in `LateReplies::listening`, given back however
/// its task ends (a runtime shut down drops it unfinished).
struct Listening(Arc<LateReplies>);

impl Drop for Listening {
    fn drop(&mut self) {
        self.0.listening.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_byte_on_a_listened_connection_is_a_late_reply_and_listeners_are_capped() {
        let replies = LateReplies::new(Instant::now());
        let mut daemons = Vec::new();
        for _ in 0..LATE_LISTENERS_MAX + 4 {
            let (client, daemon) = UnixStream::pair().unwrap();
            replies.listen(client, Duration::from_secs(10));
            daemons.push(daemon);
        }
        assert_eq!(replies.listening(), LATE_LISTENERS_MAX, "past the cap a connection is closed at once");
        // The ones past the cap were closed: their peers read end of file.
        let mut byte = [0u8; 1];
        let last = daemons.last_mut().unwrap();
        assert_eq!(last.read(&mut byte).await.unwrap(), 0, "a connection past the cap is closed");
        assert_eq!(replies.heard_us(), 0, "nothing heard yet");
        use tokio::io::AsyncWriteExt;
        daemons[0].write_all(&[0, 0, 0, 9]).await.unwrap();
        for _ in 0..200 {
            if replies.heard_us() > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(replies.heard_us() > 0, "the daemon's late reply was heard");
        drop(daemons);
        for _ in 0..200 {
            if replies.listening() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(replies.listening(), 0, "a listener ends with its connection");
    }

    #[tokio::test]
    async fn a_listener_gives_up_after_its_horizon() {
        let replies = LateReplies::new(Instant::now());
        let (client, _daemon) = UnixStream::pair().unwrap();
        replies.listen(client, Duration::from_millis(20));
        assert_eq!(replies.listening(), 1);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(replies.listening(), 0, "a silent daemon is listened to for the horizon only");
        assert_eq!(replies.heard_us(), 0);
    }
}
