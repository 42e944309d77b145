//! `status`: the daemon's counters and every named limit in force.

use std::sync::atomic::Ordering;

use super::listings::{
    ACTIVITY_LISTED_MAX, LOCKOUTS_LISTED_MAX, LOCKOUTS_MADE_CONCURRENTLY_MAX, LOCKOUTS_REPLY_BYTES_MAX,
};
use super::{Daemon, ERRORS};
use crate::codec::REQUEST_PAYLOAD_BYTES_MAX;
use crate::config::{
    Config, ACCEPT_ERROR_LINES_PER_SEC_MAX, ACCEPT_RETRY_DELAY_MS_MAX, FILES_RESERVED_COUNT, READ_BUFFER_BYTES,
    REPLY_BUFFER_RESTING_BYTES, REPLY_BYTES_BUFFERED_MAX,
};
use crate::limiter::Limiter;
use crate::protocol::{Decision, NamedLimit, PersistenceStatus, SharedStatus, SignalsStatus, Status, VerdictCounts};
use crate::unpoisoned::Unpoisoned;

impl Daemon {
    /// The shared store's state for a version-2 status (None without
    /// `[shared]`).
    pub(crate) fn shared_status(&self, limiter: &Limiter) -> Option<SharedStatus> {
        let store = self.shared.as_ref()?;
        let stats = &store.stats;
        let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let wall = crate::clock::Clock::System.now_us();
        let degraded_for_us = store.degraded_since_us().map_or(0, |s| wall.saturating_sub(s));
        let batches = get(&stats.batches);
        let hosts_source = match (store.config.hosts, store.hosts_live()) {
            (0, 0) if store.hosts_remembered().is_some() => "remembered",
            (0, 0) => "assumed",
            (0, _) => "learned",
            _ => "configured",
        };
        Some(SharedStatus {
            url: store.config.url.clone(),
            state: store.state().name().into(),
            degraded: !store.is_up(),
            degraded_for_ms: degraded_for_us / 1000,
            degraded_total_ms: (get(&stats.degraded_us_total) + degraded_for_us) / 1000,
            transitions: get(&stats.transitions),
            hosts_in_force: store.hosts_in_force(),
            hosts_live: store.hosts_live(),
            hosts_source: hosts_source.into(),
            calls: get(&stats.calls),
            timeouts: get(&stats.timeouts),
            errors: get(&stats.errors),
            bad_values: get(&stats.bad_values),
            not_asked: get(&stats.not_asked),
            degraded_answers: get(&stats.degraded_answers),
            noscript_reloads: get(&stats.noscript_reloads),
            late_replies: get(&stats.late_replies),
            releases_sent: get(&stats.releases_sent),
            batches,
            batched_ops: get(&stats.batched_ops),
            rtt_mean_us: get(&stats.rtt_us_sum).checked_div(batches).unwrap_or(0),
            rtt_max_us: get(&stats.rtt_us_max),
            known_lockouts: limiter.known_lockouts(self.clock.now_us()),
            known_lockout_refusals: get(&stats.known_lockout_refusals),
            written_back: get(&stats.written_back),
            clock_offset_us: store.clock_offset_us(),
            last_error: store.last_error(),
            global_rules: limiter.global_rules(),
        })
    }

    /// `[shared]`'s limits and the store client's own, when shared.
    fn shared_limits(config: &Config) -> Vec<NamedLimit> {
        let Some(c) = &config.shared else { return Vec::new() };
        [
            ("shared.timeout_ms", c.timeout_ms),
            ("shared.busy_max_ms", c.busy_max_ms),
            ("shared.connect_timeout_ms", c.connect_timeout_ms),
            ("shared.probe_interval_ms", c.probe_interval_ms),
            ("shared.probe_max_ms", c.probe_max_ms),
            ("shared.breaker_failures", u64::from(c.breaker_failures)),
            ("shared.batch_max", c.batch_max as u64),
            ("shared.pending_max", c.pending_max as u64),
            ("shared.hosts", u64::from(c.hosts)),
            ("shared.hosts_when_unknown", u64::from(c.hosts_when_unknown)),
            ("shared.heartbeat_ms", c.heartbeat_ms),
            ("shared.host_ttl_ms", c.host_ttl_ms),
            ("shared.late_reply_wait_ms", crate::shared::LATE_REPLY_WAIT_MS),
            ("shared.batches_in_flight_max", crate::shared::BATCHES_IN_FLIGHT_MAX as u64),
            ("shared.orphans_waiting_max", crate::shared::ORPHANS_WAITING_MAX as u64),
            ("shared.hosts_learned_memory_ms", crate::shared::HOSTS_LEARNED_MEMORY_MS),
            ("shared.busy_requesters_max", crate::shared::busy_runs::REQUESTERS_MAX as u64),
            ("shared.busy_window_ms", c.busy_max_ms.saturating_mul(crate::shared::busy_runs::BUSY_WINDOW_FACTOR)),
            ("shared.teach_pass_gap_ms", super::teach::TEACH_PASS_GAP_MS),
            ("shared.teach_chunk_pause_ms", super::teach::TEACH_CHUNK_PAUSE_MS),
        ]
        .into_iter()
        .map(|(name, value)| NamedLimit { name: name.into(), value })
        .collect()
    }

    /// Spray detection's status, when `[signals]` is on (a version-3
    /// status reply's trailing value).
    pub(crate) fn signals_status(&self) -> Option<SignalsStatus> {
        let spray = self.spray.as_ref()?;
        self.config.locked().signals.as_ref()?;
        let engine = spray.engine.locked();
        Some(engine.status(spray.link.dropped(), self.clock.now_us()))
    }

    /// `[activity]`'s limits: those of the structures in force (read at start).
    fn activity_limits(&self) -> Vec<NamedLimit> {
        let observer = self.activity.observer.locked();
        let c = observer.config();
        [
            ("activity.queue_max", c.queue_max as u64),
            ("activity.top_entries_max", c.top_entries_max as u64),
            ("activity.top_window_secs", c.top_window_ms / 1000),
            ("activity.recent_max", c.recent_max as u64),
            ("activity.accounts_sampled_max", c.accounts_sampled_max as u64),
            ("activity.samples_max", c.samples_max as u64),
            ("activity.latency_sample_every", u64::from(self.activity.link.latency.sample_every())),
            ("activity.listed_max", ACTIVITY_LISTED_MAX as u64),
        ]
        .into_iter()
        .map(|(name, value)| NamedLimit { name: name.into(), value })
        .collect()
    }

    /// `[signals]`' limits, when on.
    fn signals_limits(config: &Config) -> Vec<NamedLimit> {
        let Some(c) = &config.signals else { return Vec::new() };
        [
            ("signals.window_secs", c.window_us / 1_000_000),
            ("signals.sub_windows", crate::signals::sketch::SUB_WINDOWS as u64),
            ("signals.queue_max", c.queue_max as u64),
            ("signals.publish_interval_ms", c.publish_interval_ms),
            ("signals.flag_ttl_secs", c.flag_ttl_us / 1_000_000),
            ("signals.sketch_bytes_max", c.sketch_bytes_max as u64),
            ("signals.prefixes_max", c.prefixes_max as u64),
            ("signals.wide_prefixes_max", c.wide_prefixes_max as u64),
            ("signals.blocks_max", c.blocks_max as u64),
            ("signals.accounts_max", c.accounts_max as u64),
            ("signals.passwords_max", c.passwords_max as u64),
            ("signals.tenants_max", c.tenants_max as u64),
            ("signals.flags_max", c.flags_max as u64),
            ("signals.success_sample", u64::from(c.success_sample)),
            ("signals.success_sources_max", u64::from(c.success_sources_max)),
            ("signals.recent_flags_shown", crate::signals::RECENT_FLAGS_SHOWN as u64),
            ("signals.password_spray.threshold", u64::from(c.password_spray.threshold)),
            ("signals.narrow_spray.threshold", u64::from(c.narrow_spray.threshold)),
            ("signals.wide_spray.threshold", u64::from(c.wide_spray.threshold)),
            ("signals.wide_spray.accounts_per_source_max", u64::from(c.wide_spray.accounts_per_source_max)),
            ("signals.account_distributed.threshold", u64::from(c.account_distributed.threshold)),
            ("signals.tenant_anomaly.failures_min", u64::from(c.tenant_anomaly.failures_min)),
            ("signals.ipv6_widening.per_56", u64::from(c.ipv6_widening.per_56)),
            ("signals.ipv6_widening.per_48", u64::from(c.ipv6_widening.per_48)),
            ("signals.ipv6_widening.hold_secs", c.ipv6_widening.hold_us / 1_000_000),
        ]
        .into_iter()
        .map(|(name, value)| NamedLimit { name: name.into(), value })
        .collect()
    }

    /// The metrics listener's limits, when `[metrics]` is on.
    fn metrics_limits(config: &Config) -> Vec<NamedLimit> {
        if config.metrics.is_none() {
            return Vec::new();
        }
        [
            ("metrics.scrapes_concurrently_max", super::scrape::SCRAPES_CONCURRENTLY_MAX as u64),
            ("metrics.request_bytes_max", super::scrape::SCRAPE_REQUEST_BYTES_MAX as u64),
            ("metrics.read_timeout_ms", super::scrape::SCRAPE_READ_TIMEOUT_MS),
        ]
        .into_iter()
        .map(|(name, value)| NamedLimit { name: name.into(), value })
        .collect()
    }

    /// `[decision_log]`'s limits, when on.
    fn decision_log_limits(config: &Config) -> Vec<NamedLimit> {
        let Some(c) = &config.decision_log else { return Vec::new() };
        [
            ("decision_log.file_bytes_max", c.file_bytes_max),
            ("decision_log.files_max", u64::from(c.files_max)),
            ("decision_log.age_max_secs", c.age_max_us / 1_000_000),
            ("decision_log.queue_max", c.queue_max as u64),
            ("decision_log.record_bytes_max", crate::decision_log::RECORD_BYTES_MAX as u64),
            ("decision_log.flush_interval_ms", crate::decision_log::FLUSH_INTERVAL_MS),
        ]
        .into_iter()
        .map(|(name, value)| NamedLimit { name: name.into(), value })
        .collect()
    }

    /// The daemon's status; with `exemptions`, the source exemptions too
    /// (an admin's view: they say which networks skip per-source rules).
    pub(crate) fn status(&self, limiter: &Limiter, exemptions: bool) -> Status {
        let now = self.clock.now_us();
        let count = |i: usize| self.verdicts[i].load(Ordering::Relaxed);
        let config = self.config.locked().clone();
        let server = &config.server;
        let limit = |name: &str, value: u64| NamedLimit { name: name.into(), value };
        let stats = &self.store_stats;
        Status {
            version: env!("CARGO_PKG_VERSION").into(),
            uptime_ms: (now.saturating_sub(self.started_us)) / 1000,
            now_ms: now / 1000,
            manual_clock: self.clock.is_manual(),
            connections: self.connections.load(Ordering::Relaxed),
            verdicts: VerdictCounts {
                allow: count(Decision::Allow as usize),
                delay: count(Decision::Delay as usize),
                challenge: count(Decision::Challenge as usize),
                deny: count(Decision::Deny as usize),
                errors: count(ERRORS),
            },
            routes: limiter.route_status(),
            limits: [
                limit("connections_max", server.connections_max as u64),
                limit("frame_read_timeout_ms", server.frame_read_timeout_ms),
                limit("idle_timeout_ms", server.idle_timeout_ms),
                limit("reply_write_timeout_ms", server.reply_write_timeout_ms),
                limit("reply_bytes_buffered_max", REPLY_BYTES_BUFFERED_MAX as u64),
                limit("in_flight_per_connection_max", server.in_flight_per_connection_max as u64),
                limit("log_lines_per_sec_max", server.log_lines_per_sec_max),
                limit("socket_mode", server.socket_mode as u64),
                limit("shutdown_grace_ms", server.shutdown_grace_ms),
                limit("request_payload_bytes_max", REQUEST_PAYLOAD_BYTES_MAX as u64),
                limit("read_buffer_bytes", READ_BUFFER_BYTES as u64),
                limit("reply_buffer_resting_bytes", REPLY_BUFFER_RESTING_BYTES as u64),
                limit("identifier_bytes_max", crate::limiter::IDENTIFIER_BYTES_MAX as u64),
                limit("forwarded_for_bytes_max", crate::limiter::FORWARDED_FOR_BYTES_MAX as u64),
                limit("lockouts_listed_max", LOCKOUTS_LISTED_MAX as u64),
                limit("lockouts_reply_bytes_max", LOCKOUTS_REPLY_BYTES_MAX as u64),
                limit("lockouts_made_concurrently_max", LOCKOUTS_MADE_CONCURRENTLY_MAX as u64),
                limit("open_files_max", self.open_files_max),
                limit("files_reserved_count", FILES_RESERVED_COUNT),
                limit("accept_retry_delay_ms_max", ACCEPT_RETRY_DELAY_MS_MAX),
                limit("accept_error_lines_per_sec_max", ACCEPT_ERROR_LINES_PER_SEC_MAX),
                limit("snapshot_interval_ms", config.snapshot_interval_ms),
                limit("attempt_timeout_ms", config.attempt_timeout_ms),
                limit("bans_max", crate::bans::BANS_MAX as u64),
                limit("bans_held", limiter.bans_held() as u64),
                limit("ban_for_ms_max", crate::bans::BAN_FOR_MS_MAX),
                limit("ban_reason_bytes_max", crate::bans::BAN_REASON_BYTES_MAX as u64),
                limit("key_derivation", limiter.key_derivation().number()),
                // Only BLAKE2b's digests are remembered.
                limit(
                    "recent_digests_slots",
                    match limiter.key_derivation() {
                        crate::keys::Derivation::Blake2b => crate::keys::RECENT_DIGESTS_SLOTS as u64,
                        crate::keys::Derivation::SipHash => 0,
                    },
                ),
            ]
            .into_iter()
            .chain(Self::shared_limits(&config))
            .chain(Self::signals_limits(&config))
            .chain(self.activity_limits())
            .chain(Self::decision_log_limits(&config))
            .chain(Self::metrics_limits(&config))
            .chain(limiter.route_limits().into_iter().map(|(name, value)| NamedLimit { name, value }))
            .chain(
                limiter
                    .exemption_values()
                    .into_iter()
                    .filter(|_| exemptions)
                    .map(|(name, value)| NamedLimit { name, value }),
            )
            .collect(),
            persistence: PersistenceStatus {
                state_path: config.state.display().to_string(),
                snapshot_interval_ms: config.snapshot_interval_ms,
                commits: stats.commits.load(Ordering::Relaxed),
                write_failures: stats.write_failures.load(Ordering::Relaxed),
                last_error: stats.last_error.locked().clone(),
                changes_unwritten: stats.changes_unwritten.load(Ordering::Relaxed),
                changes_dropped: stats.changes_dropped.load(Ordering::Relaxed),
            },
            class_prefixes: limiter.class_prefixes() as u64,
            reloads: self.reloads.load(Ordering::Relaxed),
            reload_failures: self.reload_failures.load(Ordering::Relaxed),
            last_reload_error: self.last_reload_error.locked().clone(),
            log_lines_suppressed: self.audit.suppressed_total()
                + self.refusals.suppressed_total()
                + self.accept_errors.suppressed_total(),
        }
    }
}
