//! The shared-store harness (tests/common/redis.rs) against real processes:
//! if a fault it claims to cause does not happen, the outage tests built on
//! it would pass for the wrong reason.

mod common;

use std::io::ErrorKind;
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::redis::{ping, require_redis, Cluster, Proxy, ProxyMode, RedisServer};

const SILENCE: Duration = Duration::from_millis(300);

fn connect(addr: std::net::SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("TCP connect");
    s.set_read_timeout(Some(SILENCE)).unwrap();
    s.set_write_timeout(Some(SILENCE)).unwrap();
    s
}

/// No answer within SILENCE, and no error either: the peer is just quiet.
fn assert_silent(stream: &mut TcpStream, what: &str) {
    match ping(stream) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("{what}: want a read timeout, got {other:?}"),
    }
}

/// The connection ends (FIN or RST), promptly rather than by a timeout.
fn assert_cut(stream: &mut TcpStream, what: &str) {
    let started = Instant::now();
    match ping(stream) {
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::ConnectionReset
                    | ErrorKind::UnexpectedEof
                    | ErrorKind::BrokenPipe
                    | ErrorKind::ConnectionAborted
            ) => {}
        other => panic!("{what}: want the connection closed or reset, got {other:?} after {:?}", started.elapsed()),
    }
}

#[test]
fn redis_is_installed() {
    require_redis();
}

#[test]
fn unix_server_answers_ping_and_commands() {
    let redis = RedisServer::unix();
    let path = redis.socket_path().to_path_buf();
    assert!(path.is_absolute());
    assert_eq!(redis.url(), format!("redis+unix://{}", path.display()));
    assert!(redis.url().starts_with("redis+unix:///"));
    let mut s = UnixStream::connect(&path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    assert_eq!(ping(&mut s).unwrap(), "+PONG");
    assert_eq!(redis.cmd(&["SET", "k", "v"]), "OK");
    assert_eq!(redis.cmd(&["GET", "k"]), "v");
    assert_eq!(redis.cmd(&["DBSIZE"]), "1");
}

#[test]
fn tcp_server_answers_ping_and_commands() {
    let redis = RedisServer::tcp();
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{}", redis.port()));
    let mut s = connect(redis.addr());
    assert_eq!(ping(&mut s).unwrap(), "+PONG");
    assert_eq!(redis.cmd(&["SET", "k", "v"]), "OK");
    assert_eq!(redis.cmd(&["GET", "k"]), "v");
}

#[test]
fn kill9_then_restart_is_empty_on_the_same_address() {
    for mut redis in [RedisServer::unix(), RedisServer::tcp()] {
        let url = redis.url();
        let pid = redis.pid();
        assert_eq!(redis.cmd(&["SET", "k", "v"]), "OK");
        redis.kill9();
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "{url}: redis-server {pid} still exists after kill9"
        );
        redis.restart();
        assert_eq!(redis.url(), url);
        assert_ne!(redis.pid(), pid);
        assert_eq!(redis.cmd(&["PING"]), "PONG");
        assert_eq!(redis.cmd(&["DBSIZE"]), "0", "{url}: data survived a kill -9 and restart");
    }
}

#[test]
fn pause_freezes_answers_but_not_connects() {
    let mut redis = RedisServer::tcp();
    redis.pause();
    let mut s = connect(redis.addr());
    assert_silent(&mut s, "paused server");
    redis.resume();
    let mut fresh = connect(redis.addr());
    assert_eq!(ping(&mut fresh).unwrap(), "+PONG");
    // The PING sent while frozen is answered late, not lost.
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut late = [0u8; 7];
    std::io::Read::read_exact(&mut s, &mut late).unwrap();
    assert_eq!(&late, b"+PONG\r\n");
}

#[test]
fn proxy_modes() {
    let redis = RedisServer::tcp();
    let proxy = Proxy::new(redis.addr());
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}", proxy.port()));

    let mut passing = connect(proxy.addr());
    assert_eq!(ping(&mut passing).unwrap(), "+PONG");

    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(200)));
    let started = Instant::now();
    assert_eq!(ping(&mut connect_slow(&proxy)).unwrap(), "+PONG");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(200), "Delay(200ms): answered in {took:?}");

    proxy.set_mode(ProxyMode::BlackHole);
    assert_silent(&mut passing, "an open connection, black-holed");
    let mut holed = connect(proxy.addr());
    assert_silent(&mut holed, "a new connection, black-holed");

    proxy.set_mode(ProxyMode::Pass);
    let mut before_drop = connect(proxy.addr());
    assert_eq!(ping(&mut before_drop).unwrap(), "+PONG", "a new connection after BlackHole");
    // Once black-holed, always: its lost PING would leave replies out of step.
    assert_silent(&mut passing, "a black-holed connection after the switch back");

    proxy.set_mode(ProxyMode::Drop);
    assert_cut(&mut before_drop, "an open connection, dropped");
    assert_cut(&mut passing, "a connection black-holed while open, then dropped");
    assert_cut(&mut holed, "a connection black-holed at accept, then dropped");
    // The RST can beat connect()'s own completion check: refused either way.
    match TcpStream::connect_timeout(&proxy.addr(), Duration::from_secs(2)) {
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Err(e) => panic!("a new connection, dropped: connect failed with {e}, want success or a reset"),
        Ok(mut s) => {
            s.set_read_timeout(Some(SILENCE)).unwrap();
            assert_cut(&mut s, "a new connection, dropped");
        }
    }

    proxy.set_mode(ProxyMode::Pass);
    assert_eq!(ping(&mut connect(proxy.addr())).unwrap(), "+PONG", "a new connection after Drop");
    assert_eq!(proxy.mode(), ProxyMode::Pass);
}

/// A connection with room for the proxy's delay.
fn connect_slow(proxy: &Proxy) -> TcpStream {
    let s = connect(proxy.addr());
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s
}

#[test]
fn cluster_of_three_serves_keys() {
    let started = Instant::now();
    let mut cluster = Cluster::three();
    println!("cluster up in {:?}", started.elapsed());
    let urls = cluster.urls();
    assert_eq!(urls.len(), 3);
    for (i, url) in urls.iter().enumerate() {
        let info = cluster.node_cmd(i, &["CLUSTER", "INFO"]);
        assert!(info.lines().any(|l| l.trim() == "cluster_state:ok"), "node {i}:\n{info}");
        assert!(info.lines().any(|l| l.trim() == "cluster_known_nodes:3"), "node {i}:\n{info}");
        assert_eq!(*url, format!("redis://127.0.0.1:{}", cluster.ports()[i]));
    }
    assert_eq!(cluster.cmd(&["SET", "{a}x", "1"]), "OK");
    assert_eq!(cluster.cmd(&["GET", "{a}x"]), "1");
    cluster.kill9(2);
    assert_eq!(cluster.node_cmd(0, &["PING"]), "PONG", "the others outlive a killed node");
}
