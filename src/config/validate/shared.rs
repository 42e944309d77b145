//! The `[shared]` section: the store's address (one URL or a cluster's
//! nodes), checked before anything connects, and its limits.

use super::*;

pub(super) fn build_shared(raw: RawShared, errors: &mut Vec<String>) -> Option<SharedConfig> {
    let before = errors.len();
    let (url, nodes) = match (raw.url, raw.nodes) {
        (Some(url), None) => {
            if let Err(why) = check_store_url(&url) {
                errors.push(format!("shared.url: {why}"));
            }
            (url, Vec::new())
        }
        (None, Some(nodes)) => {
            if nodes.is_empty() || nodes.len() > SHARED_NODES_MAX {
                errors.push(format!("shared.nodes: 1..={SHARED_NODES_MAX} cluster seed URLs (redis://host:port)"));
            }
            for (i, node) in nodes.iter().enumerate() {
                if let Err(why) = check_node_url(node) {
                    errors.push(format!("shared.nodes[{i}]: {why}"));
                }
            }
            (nodes.first().cloned().unwrap_or_default(), nodes)
        }
        (None, None) => {
            errors
                .push("shared: one of url (a single store) or nodes (a Redis Cluster's seed nodes) is required".into());
            (String::new(), Vec::new())
        }
        (Some(_), Some(_)) => {
            errors.push("shared: url and nodes exclude each other: url for a single store, nodes for a cluster".into());
            (String::new(), Vec::new())
        }
    };
    if let Some(name) = &raw.username {
        let chars = name.chars().count();
        if chars == 0 || chars > SHARED_USERNAME_CHARS_MAX || name.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            errors.push(format!(
                "shared.username: 1-{SHARED_USERNAME_CHARS_MAX} characters, no whitespace or control characters"
            ));
        }
    }
    let key_prefix = raw.key_prefix.unwrap_or_else(|| SHARED_KEY_PREFIX_DEFAULT.into());
    // Braces would end the hash tag that keeps one operation's keys in one
    // cluster slot, and a colon would read as the separator after the prefix.
    if key_prefix.is_empty()
        || key_prefix.len() > SHARED_KEY_PREFIX_BYTES_MAX
        || !key_prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        errors.push(format!("shared.key_prefix: 1-{SHARED_KEY_PREFIX_BYTES_MAX} characters of [A-Za-z0-9_-]"));
    }
    // The daemon authenticates as shared.username when it is set, so a
    // user in the URL as well would be shown and not used.
    let url_user = redis::IntoConnectionInfo::into_connection_info(url.as_str())
        .ok()
        .and_then(|info| info.redis_settings().username().map(str::to_string));
    if raw.username.is_some() && url_user.is_some() {
        errors.push("shared.username: the url names a user too; give it in one place, username".into());
    }
    // redis-rs authenticates only when it has a password: a user without
    // one would be dropped, the daemon logging in as the default user.
    // Said once the URL and the user are otherwise right: not beside an
    // error already given for either, which is fixed first.
    let said = |field: &str| errors.iter().any(|e| e.starts_with(field));
    if raw.password_file.is_none() && !said("shared.url") && !said("shared.nodes") && !said("shared.username") {
        let without = "there is no password_file: the store's client sends a user only with its password \
                       (for an ACL user without one, nopass, put any text in password_file)";
        if raw.username.is_some() {
            errors.push(format!("shared.username: {without}"));
        } else if url_user.is_some() {
            errors.push(format!("shared.url: names a user but {without}"));
        }
    }
    let tls = url.starts_with("rediss://");
    if let [first, rest @ ..] = nodes.as_slice() {
        if rest.iter().any(|node| node.starts_with("rediss://") != first.starts_with("rediss://")) {
            errors.push("shared.nodes: all rediss:// (TLS) or all redis://, not a mix".into());
        }
    }
    if raw.tls_ca_file.is_some() && !tls {
        errors.push(
            "shared.tls_ca_file: only for a TLS store; the url (or nodes) must be rediss://host:port to use tls_ca_file"
                .into(),
        );
    }
    match (&raw.tls_cert_file, &raw.tls_key_file) {
        (Some(_), None) | (None, Some(_)) => errors.push(
            "shared.tls_cert_file, shared.tls_key_file: both or neither (a client certificate and its key)".into(),
        ),
        (Some(_), Some(_)) if !tls => errors.push(
            "shared.tls_cert_file: only for a TLS store; the url (or nodes) must be rediss://host:port to present a client certificate"
                .into(),
        ),
        _ => {}
    }
    let shared = SharedConfig {
        url,
        nodes,
        username: raw.username,
        password_file: raw.password_file,
        tls_ca_file: raw.tls_ca_file,
        tls_cert_file: raw.tls_cert_file,
        tls_key_file: raw.tls_key_file,
        key_prefix,
        timeout_ms: raw.timeout_ms.unwrap_or(SHARED_TIMEOUT_MS_DEFAULT),
        busy_max_ms: raw.busy_max_ms.unwrap_or(SHARED_BUSY_MAX_MS_DEFAULT),
        connect_timeout_ms: raw.connect_timeout_ms.unwrap_or(SHARED_CONNECT_TIMEOUT_MS_DEFAULT),
        probe_interval_ms: raw.probe_interval_ms.unwrap_or(SHARED_PROBE_INTERVAL_MS_DEFAULT),
        probe_max_ms: raw.probe_max_ms.unwrap_or(SHARED_PROBE_MAX_MS_DEFAULT),
        breaker_failures: raw.breaker_failures.unwrap_or(SHARED_BREAKER_FAILURES_DEFAULT),
        batch_max: raw.batch_max.unwrap_or(SHARED_BATCH_MAX_DEFAULT),
        pending_max: raw.pending_max.unwrap_or(SHARED_PENDING_MAX_DEFAULT),
        hosts: raw.hosts.unwrap_or(SHARED_HOSTS_DEFAULT),
        hosts_when_unknown: raw.hosts_when_unknown.unwrap_or(SHARED_HOSTS_WHEN_UNKNOWN_DEFAULT),
        heartbeat_ms: raw.heartbeat_ms.unwrap_or(SHARED_HEARTBEAT_MS_DEFAULT),
        host_ttl_ms: raw.host_ttl_ms.unwrap_or(SHARED_HOST_TTL_MS_DEFAULT),
    };
    let mut in_range = |field: &str, value: u64, lo: u64, hi: u64| {
        if !(lo..=hi).contains(&value) {
            errors.push(format!("shared.{field}: must be {lo}..={hi}"));
        }
    };
    in_range("timeout_ms", shared.timeout_ms, 1, SHARED_TIMEOUT_MS_MAX);
    in_range("busy_max_ms", shared.busy_max_ms, 0, SHARED_BUSY_MAX_MS_MAX);
    in_range(
        "connect_timeout_ms",
        shared.connect_timeout_ms,
        SHARED_CONNECT_TIMEOUT_MS_MIN,
        SHARED_CONNECT_TIMEOUT_MS_MAX,
    );
    in_range("probe_interval_ms", shared.probe_interval_ms, SHARED_PROBE_INTERVAL_MS_MIN, SHARED_PROBE_INTERVAL_MS_MAX);
    in_range("breaker_failures", shared.breaker_failures.into(), 1, SHARED_BREAKER_FAILURES_MAX.into());
    in_range("batch_max", shared.batch_max as u64, 1, SHARED_BATCH_MAX_LIMIT as u64);
    in_range("pending_max", shared.pending_max as u64, 1, SHARED_PENDING_MAX_LIMIT as u64);
    in_range("hosts", shared.hosts.into(), 0, SHARED_HOSTS_MAX.into());
    in_range("hosts_when_unknown", shared.hosts_when_unknown.into(), 1, SHARED_HOSTS_WHEN_UNKNOWN_MAX.into());
    in_range("heartbeat_ms", shared.heartbeat_ms, SHARED_HEARTBEAT_MS_MIN, SHARED_HEARTBEAT_MS_MAX);
    if shared.probe_max_ms < shared.probe_interval_ms || shared.probe_max_ms > SHARED_PROBE_MAX_MS_LIMIT {
        errors.push(format!(
            "shared.probe_max_ms: must be at least probe_interval_ms and at most {SHARED_PROBE_MAX_MS_LIMIT}"
        ));
    }
    if shared.host_ttl_ms < shared.heartbeat_ms.saturating_mul(SHARED_HOST_TTL_HEARTBEATS_MIN)
        || shared.host_ttl_ms > SHARED_HOST_TTL_MS_MAX
    {
        errors.push(format!(
            "shared.host_ttl_ms: must be at least {SHARED_HOST_TTL_HEARTBEATS_MIN} x heartbeat_ms and at most {SHARED_HOST_TTL_MS_MAX}"
        ));
    }
    (errors.len() == before).then_some(shared)
}

/// Why `url` cannot name the store, if it cannot. The message never quotes
/// the URL: it may hold a password, and errors reach logs and terminals.
fn check_store_url(url: &str) -> Result<(), String> {
    const ACCEPTED: &str = "redis://host:port[/db], rediss://host:port[/db], redis+unix:///path or unix:///path";
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!("required, one of {ACCEPTED}"));
    };
    match scheme {
        "redis" | "rediss" | "redis+unix" | "unix" => {}
        _ => return Err(format!("the scheme must be one of {ACCEPTED}")),
    }
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    let authority = before_query.split('/').next().unwrap_or("");
    let userinfo = authority.rsplit_once('@').map_or("", |(userinfo, _)| userinfo);
    // redis-rs also takes a password from a Unix URL's `pass` parameter.
    let password_param = query.split('&').any(|pair| matches!(pair.split('=').next(), Some("pass" | "password")));
    if userinfo.contains(':') || password_param {
        return Err("holds a password, which would be shown wherever the URL is; put it in password_file".into());
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain whitespace or control characters".into());
    }
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    if matches!(scheme, "redis" | "rediss") && host.is_empty() {
        return Err(format!("{scheme}:// needs a host ({scheme}://host:port[/db])"));
    }
    if !matches!(scheme, "redis" | "rediss") && (!authority.is_empty() || before_query.len() <= 1) {
        return Err(format!("{scheme}:// needs an absolute socket path ({scheme}:///path/to.sock)"));
    }
    // `#insecure` would ask redis-rs to skip the certificate check (this
    // build refuses it at every connect); no other fragment means anything.
    if url.contains('#') {
        return Err("must not have a #fragment (#insecure is not supported: it would turn off a TLS store's \
                    certificate check; for a private CA, give its certificate in tls_ca_file)"
            .into());
    }
    // Only the parameters the store client reads, spelled plainly: one it
    // ignores (`?db=2` on a TCP URL) would show a database the daemon does
    // not use, and an encoded one (`p%61ss=`) could smuggle a password.
    let known: &[&str] = if matches!(scheme, "redis" | "rediss") { &["protocol"] } else { &["db", "user", "protocol"] };
    if query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .any(|pair| !known.contains(&pair.split('=').next().unwrap_or("")))
    {
        return Err(format!("{scheme}:// takes only these parameters: {}", known.join(", ")));
    }
    // Last, the store client's own reading (redis-rs, as the daemon will
    // read it): a port or database that is not a number, or a wildcard
    // host, would otherwise pass here and leave every start degraded,
    // retrying a URL that can never connect. Its error is not quoted: it
    // can hold decoded URL text.
    const UNUSABLE: &str = "not a URL the store client can use: the port must be 1-65535, the database a number \
                            from 0, the host not a wildcard address (0.0.0.0, ::, 0, 0x0, however spelled), protocol resp2 or resp3";
    let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|_| UNUSABLE.to_string())?;
    let settings = info.redis_settings();
    if settings.password().is_some() {
        return Err("holds a password, which would be shown wherever the URL is; put it in password_file".into());
    }
    let (host, port) = match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) | redis::ConnectionAddr::TcpTls { host, port, .. } => {
            (Some(host.as_str()), Some(*port))
        }
        _ => (None, None),
    };
    if settings.db() < 0 || port == Some(0) || host.is_some_and(is_wildcard_host) {
        return Err(UNUSABLE.into());
    }
    // Decoded, what the raw-text checks above cannot see: an empty user
    // (AUTH "" never succeeds) and a NUL in a socket path (`%00`).
    if settings.username() == Some("") {
        return Err("names an empty user: leave the user out, or set shared.username".into());
    }
    if let redis::ConnectionAddr::Unix(path) = info.addr() {
        if path.as_os_str().as_encoded_bytes().contains(&0) {
            return Err("the socket path must not hold a NUL (%00)".into());
        }
    }
    Ok(())
}

/// Whether a host names the wildcard address in any spelling the resolver
/// reads as one: redis-rs refuses only `0.0.0.0` and `::` as written, and
/// Linux connects to the wildcard as to localhost, so a bind address
/// copied into the URL would reach whatever store runs here. IPv4 in the
/// forms inet_aton reads (`0`, `0.0`, `0x0`, `000.0.0.0`: one to four
/// parts, each zero in decimal, octal or hex), and IPv6 unspecified or
/// mapped from it (`[::ffff:0.0.0.0]`).
fn is_wildcard_host(host: &str) -> bool {
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if let Ok(v6) = bare.parse::<std::net::Ipv6Addr>() {
        return v6.is_unspecified() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_unspecified());
    }
    // A hex part needs a digit after its 0x: glibc reads `0x` as a name.
    let zero = |part: &str| {
        let digits = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")).unwrap_or(part);
        !digits.is_empty() && digits.bytes().all(|b| b == b'0')
    };
    let parts: Vec<&str> = host.split('.').collect();
    parts.len() <= 4 && parts.iter().all(|p| zero(p))
}

/// Why a cluster seed URL cannot name a node: the checks of `url`, and
/// TCP only (a cluster's nodes announce host:port to each other, and the
/// client follows MOVED to those addresses, so a socket path is no use).
/// The cluster client takes the user and protocol of every seed from the
/// first and refuses seeds that differ, so a seed names none: the user is
/// `shared.username`.
fn check_node_url(url: &str) -> Result<(), String> {
    check_store_url(url)?;
    let Some(rest) = url.strip_prefix("redis://").or_else(|| url.strip_prefix("rediss://")) else {
        return Err(
            "a cluster node is redis://host:port or rediss://host:port (no Unix sockets in cluster mode)".into()
        );
    };
    if rest.contains('?') {
        return Err("a cluster seed takes no parameters: redis://host:port".into());
    }
    let authority = rest.split('/').next().unwrap_or("");
    if authority.contains('@') {
        return Err("a cluster seed names no user (the cluster client would use the first seed's for all): \
                    set shared.username"
            .into());
    }
    let path = rest.find('/').map_or("", |at| &rest[at..]);
    if !matches!(path, "" | "/" | "/0") {
        return Err("a cluster has only database 0: redis://host:port".into());
    }
    Ok(())
}
