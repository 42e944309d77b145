//! The other hosts' lockouts and unlocks: the subscription, publishing,
//! and the log of unlocks a host replays when it subscribes.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{SharedStore, LOG_TARGET};
use crate::unpoisoned::Unpoisoned;

/// Unlock messages the store's log keeps at most (a host replays them
/// all when it subscribes).
const UNLOCK_LOG_MAX: usize = 10_000;

impl SharedStore {
    /// A subscription: on the store, or in a cluster on the first seed node
    /// that answers (a cluster's PUBLISH, a script's too, reaches the
    /// subscribers of every node).
    async fn subscribe(&self, channel: &str) -> Result<redis::aio::PubSub, String> {
        let connect_timeout = Duration::from_millis(self.config.connect_timeout_ms);
        let urls: Vec<&str> = if self.is_cluster() {
            self.config.nodes.iter().map(String::as_str).collect()
        } else {
            vec![self.config.url.as_str()]
        };
        let mut why = String::from("no node to subscribe on");
        for url in urls {
            let attempt = async {
                let client = self.client(url)?;
                let mut pubsub = tokio::time::timeout(connect_timeout, client.get_async_pubsub())
                    .await
                    .map_err(|_| "subscribing timed out".to_string())?
                    .map_err(|e| e.to_string())?;
                tokio::time::timeout(connect_timeout, pubsub.subscribe(channel))
                    .await
                    .map_err(|_| "subscribing timed out".to_string())?
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(pubsub)
            };
            match attempt.await {
                Ok(pubsub) => return Ok(pubsub),
                Err(e) => why = e,
            }
        }
        Err(why)
    }

    /// Listens for the lockouts and unlocks other hosts publish, calling
    /// `heard` with each message, until the connection ends. Once
    /// subscribed, first replays the unlocks logged in `unlock_log`: those
    /// published while this host was not listening (the store restarted,
    /// this host was down) among them, then calls `replayed`. Hearing an
    /// unlock again only forgets known lockouts, which the store still
    /// refuses if it knows.
    pub async fn listen(
        &self,
        channel: &str,
        unlock_log: &str,
        replayed: impl FnOnce(),
        mut heard: impl FnMut(&str, Option<u64>),
    ) -> Result<(), String> {
        use futures_util::StreamExt;
        let pubsub = self.subscribe(channel).await?;
        let connection = self.connection.locked().clone();
        if let Some(mut connection) = connection {
            let mut cmd = redis::cmd("ZRANGEBYSCORE");
            cmd.arg(unlock_log).arg("-inf").arg("+inf").arg("LIMIT").arg(0).arg(UNLOCK_LOG_MAX);
            let timeout = Duration::from_millis(self.config.connect_timeout_ms);
            match tokio::time::timeout(timeout, cmd.query_async::<Vec<String>>(&mut connection)).await {
                Ok(Ok(logged)) => {
                    for entry in logged {
                        // "<wall µs> <message>": the stamp keeps equal
                        // messages apart in the set.
                        let Some((at, message)) = entry.split_once(' ') else { continue };
                        let Ok(at) = at.parse::<u64>() else { continue };
                        self.stats.messages_heard.fetch_add(1, Ordering::Relaxed);
                        heard(message, Some(at));
                    }
                }
                // Not fatal: the live messages still come, as before there
                // was a log (a store user not allowed ZRANGEBYSCORE).
                Ok(Err(e)) => tracing::warn!(target: LOG_TARGET, error = %e, "the unlock log was not read"),
                Err(_) => tracing::warn!(target: LOG_TARGET, "reading the unlock log timed out"),
            }
        }
        replayed();
        let mut messages = pubsub.into_on_message();
        while let Some(message) = messages.next().await {
            if let Ok(text) = std::str::from_utf8(message.get_payload_bytes()) {
                self.stats.messages_heard.fetch_add(1, Ordering::Relaxed);
                heard(text, None);
            }
        }
        Ok(())
    }

    /// Publishes a message for the other hosts, not waited for.
    pub fn publish(self: &Arc<SharedStore>, channel: String, message: String) {
        let Some(mut connection) = self.connection.locked().clone() else { return };
        let timeout = Duration::from_millis(self.config.connect_timeout_ms);
        let store = self.clone();
        tokio::spawn(async move {
            let mut cmd = redis::cmd("PUBLISH");
            cmd.arg(channel).arg(message);
            if let Ok(Ok(_)) = tokio::time::timeout(timeout, cmd.query_async::<i64>(&mut connection)).await {
                store.stats.messages_published.fetch_add(1, Ordering::Relaxed);
            }
        });
    }

    /// Takes back `messages` logged at `now_us` (`log_unlocks`): an unlock
    /// that did not reach the store must not be replayed as made. Not
    /// waited for.
    pub fn unlog_unlocks(self: &Arc<SharedStore>, unlock_log: String, messages: Vec<String>, now_us: u64) {
        let Some(mut connection) = self.connection.locked().clone() else { return };
        let timeout = Duration::from_millis(self.config.connect_timeout_ms);
        tokio::spawn(async move {
            let mut cmd = redis::cmd("ZREM");
            cmd.arg(&unlock_log);
            for message in &messages {
                cmd.arg(format!("{now_us} {message}"));
            }
            let _ = tokio::time::timeout(timeout, cmd.query_async::<i64>(&mut connection)).await;
        });
    }

    /// Logs unlock messages in `log.0`, a sorted set by `now_us` holding
    /// `log.1` µs of them (and at most `UNLOCK_LOG_MAX`), for the hosts
    /// not listening when they are published: a host replays the log when
    /// it subscribes. Waited for (at most `connect_timeout_ms`): an unlock
    /// logs before it unlocks.
    pub async fn log_unlocks(&self, (unlock_log, keep_us): (String, u64), messages: &[String], now_us: u64) {
        let Some(mut connection) = self.connection.locked().clone() else { return };
        if messages.is_empty() {
            return;
        }
        let timeout = Duration::from_millis(self.config.connect_timeout_ms);
        {
            let mut pipe = redis::pipe();
            for message in messages {
                pipe.cmd("ZADD").arg(&unlock_log).arg(now_us).arg(format!("{now_us} {message}")).ignore();
            }
            pipe.cmd("ZREMRANGEBYSCORE").arg(&unlock_log).arg("-inf").arg(now_us.saturating_sub(keep_us)).ignore();
            pipe.cmd("ZREMRANGEBYRANK").arg(&unlock_log).arg(0).arg(-(UNLOCK_LOG_MAX as i64) - 1).ignore();
            pipe.cmd("PEXPIRE").arg(&unlock_log).arg(keep_us.div_ceil(1000).max(1)).ignore();
            if let Err(e) = tokio::time::timeout(timeout, pipe.query_async::<()>(&mut connection))
                .await
                .map_err(|_| "timed out".to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
            {
                tracing::warn!(target: LOG_TARGET, error = %e, "an unlock was not logged; hosts not listening now miss it");
            }
        }
    }
}
