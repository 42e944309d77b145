//! Connecting to the store: the client (TLS, ACL user, password file),
//! the script loaded and the secret's fingerprint checked.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::script::{Op, SCRIPT};
use super::{
    CallError, Connection, ProbeError, SharedStore, CLUSTER_RETRY_WAIT_MAX_MS, CLUSTER_RETRY_WAIT_MIN_MS,
    LATE_REPLY_WAIT_MS, LOG_TARGET,
};
use crate::keys::Derivation;
use crate::unpoisoned::Unpoisoned;

impl SharedStore {
    /// Drops the connection and makes a new one, loads the script and
    /// checks the secret's fingerprint, joining as `host`; the store's
    /// time. Bounded by `connect_timeout_ms` per step. Off the request
    /// path (the supervisor).
    pub async fn connect(&self, fingerprint: &str, host: &str) -> Result<u64, ProbeError> {
        self.open_connection().await?;
        self.assert_fingerprint(fingerprint, host).await
    }

    /// The key derivation the store's hosts use, for a host whose state
    /// file is about to be made (the file takes it), read without writing:
    /// the store's record, or `None` when it holds none (a new deployment,
    /// or a flush the running hosts have not yet written back: read again
    /// after a heartbeat). A record of another secret is refused here,
    /// before this host writes a file or a secret. Bounded by
    /// `connect_timeout_ms` per step.
    pub async fn derivation_in_use(&self, secret_fingerprint: u64) -> Result<Option<Derivation>, ProbeError> {
        self.open_connection().await?;
        // Through the script, as every op: the documented ACL user may run
        // nothing else.
        let reply = self.call_meta(Op::read_fingerprint(self.meta_key())).await?;
        let recorded = reply.strings.first().cloned().unwrap_or_default();
        if recorded.is_empty() {
            return Ok(None);
        }
        let (secret, derivation) = split_fingerprint(&recorded);
        let ours = format!("{secret_fingerprint:016x}");
        if secret != ours {
            return Err(ProbeError::Refused(format!(
                "shared store {} was joined with another secret key (fingerprint {secret}, this host's is {ours}): \
                 copy the secret file from a host that is already in, or set [shared] key_prefix to another prefix",
                self.config.url
            )));
        }
        derivation.parse().ok().and_then(Derivation::from_number).map(Some).ok_or_else(|| {
            ProbeError::Refused(format!(
                "shared store {} names key derivation {derivation}, which this version does not know",
                self.config.url
            ))
        })
    }

    /// Drops the connection and makes a new one, and loads the script.
    async fn open_connection(&self) -> Result<(), ProbeError> {
        *self.connection.locked() = None;
        let connect_timeout = Duration::from_millis(self.config.connect_timeout_ms);
        let mut connection = if self.is_cluster() {
            let client = self.cluster_client().map_err(ProbeError::Unreachable)?;
            Connection::Cluster(
                tokio::time::timeout(connect_timeout, client.get_async_connection())
                    .await
                    .map_err(|_| ProbeError::Unreachable("connect timed out".into()))?
                    .map_err(|e| ProbeError::Unreachable(e.to_string()))?,
            )
        } else {
            let client = self.client(&self.config.url).map_err(ProbeError::Unreachable)?;
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(Duration::from_millis(LATE_REPLY_WAIT_MS)));
            Connection::Single(
                tokio::time::timeout(connect_timeout, client.get_multiplexed_async_connection_with_config(&config))
                    .await
                    .map_err(|_| ProbeError::Unreachable("connect timed out".into()))?
                    .map_err(|e| ProbeError::Unreachable(e.to_string()))?,
            )
        };
        // In a cluster the client sends SCRIPT LOAD to every primary. A
        // primary that is away must not keep the others from serving their
        // slots: its batches answer NOSCRIPT later and load it by EVAL.
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(SCRIPT);
        let loaded = tokio::time::timeout(connect_timeout, load.query_async::<String>(&mut connection))
            .await
            .map_err(|_| "SCRIPT LOAD timed out".to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        match loaded {
            Ok(_) => {}
            Err(e) if self.is_cluster() => {
                tracing::warn!(target: LOG_TARGET, error = %e, "SCRIPT LOAD did not reach every cluster primary; a node that lacks it loads it on first use");
            }
            Err(e) => return Err(ProbeError::Unreachable(e)),
        }
        *self.connection.locked() = Some(connection);
        Ok(())
    }

    /// Records this host's secret fingerprint in the store if none is
    /// (a first join, or a store that lost its data), and refuses if
    /// another is. At every connection and every heartbeat: after a flush
    /// the running hosts write it back within a heartbeat, and should a
    /// host keyed otherwise reach the emptied store first, they take the
    /// record back from it when more of them claim the store than of it
    /// (the script's `join`). Bounded by `connect_timeout_ms`.
    pub async fn assert_fingerprint(&self, fingerprint: &str, host: &str) -> Result<u64, ProbeError> {
        let (recorded, store_now, since) = self.join(fingerprint, host).await?;
        self.refused_by_record.store(recorded != fingerprint, Ordering::Relaxed);
        let recorded = recorded.as_str();
        let (secret, derivation) = split_fingerprint(recorded);
        if recorded != fingerprint && secret == split_fingerprint(fingerprint).0 {
            return Err(ProbeError::Refused(format!(
                "shared store {} was joined by hosts whose state files use key derivation {derivation}, and this host's \
                 uses {}: set key_derivation = {derivation} in this host's configuration (a state file without rows takes it)",
                self.config.url,
                split_fingerprint(fingerprint).1
            )));
        }
        if recorded.is_empty() {
            return Err(ProbeError::Refused(format!(
                "shared store {} records no secret key yet; this host, refused before, waits for the hosts to write theirs",
                self.config.url
            )));
        }
        if recorded != fingerprint {
            return Err(ProbeError::Refused(format!(
                "shared store {} was joined with another secret key (fingerprint {recorded}, this host's is {fingerprint}): \
                 copy the secret file from a host that is already in, or set [shared] key_prefix to another prefix",
                self.config.url
            )));
        }
        self.note_record_since(since);
        Ok(store_now)
    }

    /// Records `fingerprint` in the store if none is; the one recorded,
    /// the store's time (for the clock offset before the first heartbeat)
    /// and since when the record is (the script adds it to a record an
    /// older build made; "" only from a reply without it).
    /// A host refused for another fingerprint never makes the record: it
    /// would claim an emptied store before the hosts it belongs to.
    async fn join(&self, fingerprint: &str, host: &str) -> Result<(String, u64, String), ProbeError> {
        let seen = self.record_since.locked().clone().unwrap_or_default();
        // A refused host claims once a probe (`probe_max_ms`): its claims
        // outlive the delay between two, or a majority would count as less.
        let ttl_us = self.config.host_ttl_ms.max(3 * self.config.probe_max_ms) * 1000;
        let create = !self.refused_by_record.load(Ordering::Relaxed);
        let op = Op::join(self.meta_key(), fingerprint, host, ttl_us, &seen, create);
        let reply = self.call_meta(op).await?;
        let recorded = reply.strings.first().cloned().unwrap_or_default();
        let since = reply.strings.get(2).cloned().unwrap_or_default();
        Ok((recorded, reply.ints.get(1).map_or(0, |&t| t.max(0) as u64), since))
    }

    /// A record made at another time than the one this host last read
    /// was made again: the store lost its data in between (FLUSHALL, a
    /// restart without persistence), and what this host knows of it is
    /// to be taught again (`take_store_forgot`).
    fn note_record_since(&self, since: String) {
        if since.is_empty() {
            return;
        }
        let mut seen = self.record_since.locked();
        if seen.as_ref().is_some_and(|s| *s != since) {
            self.store_forgot.store(true, std::sync::atomic::Ordering::Release);
        }
        *seen = Some(since);
    }

    /// Whether the store was seen to lose its data since the last call.
    pub fn take_store_forgot(&self) -> bool {
        self.store_forgot.swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    fn meta_key(&self) -> String {
        format!("{}:{{meta}}", self.config.key_prefix)
    }

    /// An op on the meta key, bounded by `connect_timeout_ms`; a value
    /// there that is not ours is refused.
    async fn call_meta(&self, op: Op) -> Result<super::Reply, ProbeError> {
        let connect_timeout = Duration::from_millis(self.config.connect_timeout_ms);
        self.call_unchecked(op, connect_timeout).await.map_err(|e| match e {
            CallError::BadValue(_) => ProbeError::Refused(format!(
                "the store holds a key {}:{{meta}} tollgate did not write; choose another key_prefix",
                self.config.key_prefix
            )),
            e => ProbeError::Unreachable(e.to_string()),
        })
    }

    /// A client for the configured store, with its credentials (read from
    /// the password file each time, so a rotated password is picked up by
    /// the next connection) and, for rediss://, the CA bundle to trust (read
    /// each time too, so a renewed CA is picked up the same way).
    pub(super) fn client(&self, url: &str) -> Result<redis::Client, String> {
        let mut info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| e.to_string())?;
        let mut settings = info.redis_settings().clone();
        if let Some(user) = &self.config.username {
            settings = settings.set_username(user);
        }
        if let Some(password) = self.password()? {
            settings = settings.set_password(password);
        }
        info = info.set_redis_settings(settings);
        match self.tls_files()? {
            // Without a CA file a rediss:// URL trusts the platform's roots
            // (rustls-native-certs), as redis-rs does by itself.
            None => redis::Client::open(info).map_err(|e| e.to_string()),
            Some(certs) => redis::Client::build_with_tls(info, certs).map_err(|e| self.tls_error(e)),
        }
    }

    /// The CA bundle of a TLS store (`tls_ca_file`) and this host's client
    /// certificate and key (`tls_cert_file`, `tls_key_file`), if any is
    /// configured.
    fn tls_files(&self) -> Result<Option<redis::TlsCertificates>, String> {
        let read = |key: &str, path: &Path| {
            std::fs::read(path).map_err(|e| format!("cannot read {key} {}: {e}", path.display()))
        };
        let c = &self.config;
        let root_cert = c.tls_ca_file.as_deref().map(|path| read("tls_ca_file", path)).transpose()?;
        let client_tls = match (&c.tls_cert_file, &c.tls_key_file) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read("tls_cert_file", cert)?,
                client_key: read("tls_key_file", key)?,
            }),
            _ => None,
        };
        if root_cert.is_none() && client_tls.is_none() {
            return Ok(None);
        }
        Ok(Some(redis::TlsCertificates { client_tls, root_cert }))
    }

    /// A client that cannot be built from the TLS files says which ones.
    fn tls_error(&self, e: redis::RedisError) -> String {
        let c = &self.config;
        let files: Vec<String> =
            [("tls_ca_file", &c.tls_ca_file), ("tls_cert_file", &c.tls_cert_file), ("tls_key_file", &c.tls_key_file)]
                .into_iter()
                .filter_map(|(key, path)| path.as_ref().map(|p| format!("{key} {}", p.display())))
                .collect();
        if files.is_empty() {
            e.to_string()
        } else {
            format!("{}: {e}", files.join(", "))
        }
    }

    fn password(&self) -> Result<Option<String>, String> {
        let Some(path) = &self.config.password_file else { return Ok(None) };
        let password = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Ok(Some(password.trim_end_matches(['\n', '\r']).to_string()))
    }

    /// The cluster client for the seed nodes, with the same credentials on
    /// every node. It retries once (after refreshing its slot map, which
    /// follows a failover), with short waits: tollgate's own deadline and
    /// breaker decide how long a caller waits, not the driver.
    fn cluster_client(&self) -> Result<redis::cluster::ClusterClient, String> {
        let mut builder = redis::cluster::ClusterClientBuilder::new(self.config.nodes.iter().map(String::as_str))
            .connection_timeout(Duration::from_millis(self.config.connect_timeout_ms))
            .response_timeout(Duration::from_millis(LATE_REPLY_WAIT_MS))
            .overall_response_timeout(Some(Duration::from_millis(LATE_REPLY_WAIT_MS)))
            .retries(1)
            .min_retry_wait(CLUSTER_RETRY_WAIT_MIN_MS)
            .max_retry_wait(CLUSTER_RETRY_WAIT_MAX_MS);
        if let Some(user) = &self.config.username {
            builder = builder.username(user);
        }
        if let Some(password) = self.password()? {
            builder = builder.password(password);
        }
        // rediss:// seed nodes make every node's connection TLS; the CA
        // bundle, if any, is what their certificates must chain to.
        if let Some(certs) = self.tls_files()? {
            builder = builder.certs(certs);
        }
        builder.build().map_err(|e| self.tls_error(e))
    }
}

/// rustls needs one process-wide crypto provider; tollgate builds rustls
/// with ring only. Installing it twice (another store, a test's second
/// daemon in the same process) is not an error.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// What a host records in the store (and checks there): its secret's
/// fingerprint, then `/k` and the key derivation unless it is BLAKE2b's,
/// so hosts that would name one account's keys differently never share a
/// store, and a BLAKE2b host's record is the bare fingerprint that hosts
/// from before derivations write and check.
pub fn store_fingerprint(secret_fingerprint: u64, derivation: Derivation) -> String {
    match derivation {
        Derivation::Blake2b => format!("{secret_fingerprint:016x}"),
        other => format!("{secret_fingerprint:016x}/k{}", other.number()),
    }
}

/// A recorded fingerprint's secret part and key derivation number.
fn split_fingerprint(recorded: &str) -> (&str, &str) {
    recorded.split_once("/k").unwrap_or((recorded, "1"))
}
