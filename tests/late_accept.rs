//! A daemon late to accept is late, not gone. A stalled daemon leaves each
//! timed-out client's connection in its listen queue; once the queue is
//! full, connecting fails with EAGAIN. Taken for "cannot reach", that let
//! `login` fail open past the busy rule on a locked account (a red team's
//! finding): it is a timeout, and only a missing socket or nobody
//! listening is a connect error.

use std::os::fd::OwnedFd;
use std::time::Duration;

use nix::sys::socket::{bind, connect, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr};
use tollgate::client::{Answer, Client, ClientConfig, ClientError};

mod common;
use common::subject;

fn unix_socket() -> OwnedFd {
    socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_NONBLOCK, None).unwrap()
}

#[tokio::test]
async fn a_full_accept_queue_is_a_timeout_not_an_unreachable_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stalled.sock");
    let address = UnixAddr::new(&path).unwrap();
    // A listener that never accepts, with the smallest queue, filled.
    let listener = unix_socket();
    bind(std::os::fd::AsRawFd::as_raw_fd(&listener), &address).unwrap();
    listen(&listener, Backlog::new(1).unwrap()).unwrap();
    let mut queued = Vec::new();
    loop {
        let fd = unix_socket();
        match connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &address) {
            Ok(()) => queued.push(fd),
            Err(nix::errno::Errno::EAGAIN) => break,
            Err(e) => panic!("filling the queue: {e}"),
        }
        assert!(queued.len() < 64, "the queue never filled");
    }
    let client = Client::new(ClientConfig::new(&path).timeout(Duration::from_millis(200)));
    let answer = client.check("login", &subject("198.51.100.7", "victim")).await;
    assert!(
        matches!(answer, Answer::Unavailable { error: ClientError::Timeout(_) | ClientError::Busy(_), .. }),
        "a full queue is a late daemon: {answer:?}"
    );
    // Nobody listening at all is still "cannot reach".
    drop((queued, listener));
    let answer = client.check("login", &subject("198.51.100.7", "victim")).await;
    assert!(matches!(answer, Answer::Unavailable { error: ClientError::Connect { .. }, .. }), "{answer:?}");
}
