//! A daemon late to accept is late, not gone. A stalled daemon leaves each
//! timed-out client's connection in its listen queue; once the queue is
//! full, connecting fails with EAGAIN. Taken for "cannot reach", that let
//! `login` fail open past the busy rule on a locked account (a red team's
//! finding): it is a timeout, and only a missing socket, nobody listening
//! or no permission is a connect error. The same holds for this process
//! out of descriptors (EMFILE), which an attacker can cause.

use std::os::fd::OwnedFd;
use std::time::Duration;

use nix::sys::socket::{bind, connect, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr};
use tollgate::client::{Answer, Client, ClientConfig, ClientError};

mod common;
use common::subject;

/// Close-on-exec, so a child another test forks keeps none of these once
/// it has exec'd.
fn unix_socket() -> OwnedFd {
    socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None).unwrap()
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
    // Nobody listening (a socket bound, never listening) and no socket at
    // all are still "cannot reach". (Not by closing the listener above: a
    // child another test forks holds its copy until the child's exec.)
    let idle_path = dir.path().join("bound-only.sock");
    let bound_only = unix_socket();
    bind(std::os::fd::AsRawFd::as_raw_fd(&bound_only), &UnixAddr::new(&idle_path).unwrap()).unwrap();
    for path in [idle_path, dir.path().join("absent.sock")] {
        let client = Client::new(ClientConfig::new(&path).timeout(Duration::from_millis(200)));
        let answer = client.check("login", &subject("198.51.100.7", "victim")).await;
        assert!(matches!(answer, Answer::Unavailable { error: ClientError::Connect { .. }, .. }), "{answer:?}");
    }
    drop((queued, listener, bound_only));
}

/// Out of descriptors (EMFILE) is not "cannot reach": it joins the late run.
/// Run in a child process, whose descriptor limit the test lowers.
#[test]
fn out_of_descriptors_is_late_not_unreachable() {
    const CHILD: &str = "TOLLGATE_LATE_ACCEPT_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "out_of_descriptors_is_late_not_unreachable", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("late, not unreachable"), "{text}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("daemon.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = Client::new(ClientConfig::new(&path).timeout(Duration::from_millis(200)));
    // Use up every descriptor below a low limit.
    let mut held = Vec::new();
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 64, 64).unwrap();
    while let Ok(file) = std::fs::File::open("/dev/null") {
        held.push(file);
    }
    let answer = runtime.block_on(client.check("login", &subject("198.51.100.7", "victim")));
    drop(held);
    assert!(
        matches!(answer, Answer::Unavailable { error: ClientError::Timeout(_) | ClientError::Busy(_), .. }),
        "out of descriptors is late: {answer:?}"
    );
    println!("late, not unreachable");
}
