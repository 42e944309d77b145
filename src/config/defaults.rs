//! The built-in defaults: every default and every bound as a named
//! constant with why it is that value. The built-in routes made of them
//! are in `builtin_routes.rs`.

pub const SOCKET_PATH_DEFAULT: &str = "/run/tollgate/tollgate.sock";
pub const STATE_PATH_DEFAULT: &str = "/var/lib/tollgate/state.redb";
pub const CONFIG_PATH_DEFAULT: &str = "/etc/tollgate/tollgate.toml";
/// Name of the secret key file, next to the state file unless configured.
pub const SECRET_FILE_NAME: &str = "secret";

/// How often live failure counters are written to the state file. A crash
/// loses at most this much of sub-threshold counts (never a lockout, which is
/// written before its report is answered). One second keeps the loss to a
/// handful of failures per key at any attack rate the rate rules allow.
pub const SNAPSHOT_INTERVAL_MS_DEFAULT: u64 = 1000;
/// A minute: a crash may lose this much of sub-threshold counts, and more
/// than a minute's worth is more than the rate rules let a guesser forget.
pub const SNAPSHOT_INTERVAL_MS_MAX: u64 = 60_000;
/// How long an attempt admitted by `check` holds its place on failure rules
/// while no `report` settles it. A place that lapses before its attempt's
/// report frees room for another guess, so this must outlast the auth
/// server's own request deadline (an attacker who can slow the auth server's
/// password hashing past it would otherwise get a threshold's worth of
/// guesses in flight per lapse): 30 s covers the usual HTTP handler timeout.
/// A place whose report never comes (a crashed handler) holds its key for
/// this long.
pub const ATTEMPT_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Longer would let a crashed auth server's attempts hold their keys' places
/// for more than ten minutes.
pub const ATTEMPT_TIMEOUT_MS_MAX: u64 = 600_000;

/// The login window: long enough that 5 guesses per window is ~480 a day per
/// (account, source), short enough that a typo-locked owner waits minutes.
pub const LOGIN_WINDOW_SECS_DEFAULT: u64 = 15 * 60;
/// Failures per (account, source prefix) per window. Five covers a user's
/// typos and caps one source's guesses at 5 per window.
pub const SOURCE_FAILURES_THRESHOLD_DEFAULT: u32 = 5;
/// Failures per account from everywhere per window: ten sources' worth, so a
/// distributed guesser is stopped while one stranger cannot lock the owner.
pub const ACCOUNT_FAILURES_THRESHOLD_DEFAULT: u32 = 50;
/// Re-auth (UIA) failures per (account, device) per window.
pub const REAUTH_FAILURES_THRESHOLD_DEFAULT: u32 = 5;
/// Entries per failure table: ~60 bytes each, so ~6 MB per table at the cap.
pub const FAILURE_ENTRIES_MAX_DEFAULT: usize = 100_000;
/// Login attempts per source prefix: 600 a minute sustained with a burst of
/// 300. A 22,000-person office behind 4 addresses peaks near 165 logins a
/// minute per address; this leaves 3.6x headroom for it while a single
/// address still cannot exceed 10 attempts a second.
pub const LOGIN_RATE_LIMIT_DEFAULT: u32 = 600;
pub const LOGIN_RATE_BURST_DEFAULT: u32 = 300;
/// Generic API route groups: 100 a minute per prefix, burst 100.
pub const REQUEST_RATE_LIMIT_DEFAULT: u32 = 100;
pub const REQUEST_RATE_BURST_DEFAULT: u32 = 100;
pub const RATE_PERIOD_SECS_DEFAULT: u64 = 60;
/// Keys per rate table: 16 bytes plus hash-map overhead each.
pub const RATE_ENTRIES_MAX_DEFAULT: usize = 1_000_000;
/// Retry-After escalation per key: the n-th refusal of a key within a
/// cool-down says "retry after" at least this long (the last step repeats).
/// A client that honours it backs off; one that ignores it stands out.
pub const RETRY_AFTER_STEPS_SECS_DEFAULT: [u64; 4] = [1, 5, 30, 120];
/// Jitter added to each escalated Retry-After, as a percentage of the step
/// (never subtracted, so waiting it out is always enough), so refused
/// clients do not retry in lock-step.
pub const JITTER_PERCENT_DEFAULT: u8 = 10;
/// At most the whole step again, so a refused client never waits more than
/// twice the step it was told.
pub const JITTER_PERCENT_MAX: u8 = 100;
/// Steps of the Retry-After escalation: a client refused more than 16
/// times in one cool-down ignores Retry-After, and further steps say nothing.
pub const RETRY_AFTER_STEPS_MAX: usize = 16;
/// Rungs of a rule's response ladder, for the same reason as the steps.
pub const RUNGS_PER_RULE_MAX: usize = 16;
/// First `delay` of a key, doubling per refusal up to the cap: slow enough to
/// cost a guesser, short enough that a human barely notices the first.
pub const DELAY_BASE_MS_DEFAULT: u64 = 1000;
pub const DELAY_MAX_MS_DEFAULT: u64 = 10_000;
/// A delay holds the auth server's request open: past a minute its own
/// request deadline passes first, and the attempt is lost, not delayed.
pub const DELAY_MAX_MS_LIMIT: u64 = 60_000;
/// How long a device stays known after a successful login from it.
pub const KNOWN_DEVICE_TTL_SECS_DEFAULT: u64 = 30 * 86_400;
/// A (leap) year: a device not seen for longer is no longer known.
pub const KNOWN_DEVICE_TTL_SECS_MAX: u64 = 366 * 86_400;
pub const KNOWN_DEVICES_MAX_DEFAULT: usize = 1_000_000;
/// New devices one account may make known per TTL. Without a cap one
/// account's successes could flush the table (it evicts the entry expiring
/// soonest), putting victims' devices back under the account ceiling.
pub const KNOWN_DEVICES_PER_ACCOUNT_MAX_DEFAULT: u16 = 16;
/// A thousand new devices per account per TTL is no cap any more.
pub const KNOWN_DEVICES_PER_ACCOUNT_MAX_LIMIT: u16 = 1000;
/// Wrong-password digests remembered per (account, source prefix): a mail
/// client retrying a stale password repeats one of a few, not many.
pub const RECENT_PASSWORDS_DEFAULT: u8 = 4;
/// The limiter keeps each key's digests in a fixed array of four.
pub const RECENT_PASSWORDS_MAX: u8 = 4;
pub const RECENT_PASSWORD_ENTRIES_MAX_DEFAULT: usize = 100_000;

/// Longest a rate rule's burst may take to refill (burst × period / limit):
/// a year. Beyond it the numbers are a typo, and the GCRA tolerance would
/// approach the range of its microsecond arithmetic.
pub const BURST_SPAN_US_MAX: u64 = 366 * 86_400_000_000;

/// Rules one route may have: a request derives at most one key per rule,
/// kept on the stack, and no real route needs more.
pub const RULES_PER_ROUTE_MAX: usize = 16;
/// Upper bound on any table's entries, so a typo cannot exhaust memory.
pub const ENTRIES_MAX_LIMIT: usize = 100_000_000;
/// Longest rate period and failure window a rule may have (one day).
pub const PERIOD_SECS_MAX: u64 = 86_400;
/// A rate rule's `limit` and `burst`: a billion per period is past any real
/// login or API rate, so a larger number is a typo.
pub const RATE_LIMIT_MAX: u32 = 1_000_000_000;
pub const RATE_BURST_MAX: u32 = 1_000_000_000;
/// Route and rule names reach logs, `status`, metric labels and the state
/// file's rule ids: 64 bytes is plenty for a name and bounds them all.
pub const NAME_BYTES_MAX: usize = 64;

/// An IPv4 address has 32 bits: a /32 prefix is one address.
pub const IPV4_PREFIX_LEN_MAX: u8 = 32;
/// Hosting networks rent out neighbouring IPv4 addresses to one tenant, so
/// one hosting /24 is one source unless the file says otherwise.
pub const HOSTING_IPV4_PREFIX_LEN_DEFAULT: u8 = 24;

/// Open connections the daemon serves at once; more wait in the backlog.
/// An auth server pools a few dozen; 1024 leaves room for the CLI and bursts.
pub const CONNECTIONS_MAX_DEFAULT: usize = 1024;
/// Each connection holds a descriptor and a read buffer of up to 64 KiB:
/// 65536 of them is already 4 GiB of buffers.
pub const CONNECTIONS_MAX_LIMIT: usize = 65_536;
/// A client that has sent part of a frame must send the rest within this,
/// or it is dropped (it holds a buffer and a connection slot).
pub const FRAME_READ_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// Ten minutes: longer lets a client that stopped mid-frame hold its
/// buffer and slot for as long as an idle one.
pub const FRAME_READ_TIMEOUT_MS_MAX: u64 = 600_000;
/// A connection that sends nothing for this long is closed; the client
/// reconnects on its next call. Ten minutes keeps an auth server's pooled
/// connections while bounding what abandoned ones hold.
pub const IDLE_TIMEOUT_MS_DEFAULT: u64 = 600_000;
/// A second: shorter would close a pooled connection between the `check`
/// and the `report` of one login, costing a reconnect each.
pub const IDLE_TIMEOUT_MS_MIN: u64 = 1_000;
/// A day: longer lets abandoned connections hold their slots for days.
pub const IDLE_TIMEOUT_MS_MAX: u64 = 86_400_000;
/// A client must take its replies within this, or it is dropped: one that
/// pipelines requests and never reads would otherwise hold its connection,
/// and the replies buffered for it, for as long as it liked.
pub const REPLY_WRITE_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// Ten minutes, as for a frame: longer is holding a connection, not reading.
pub const REPLY_WRITE_TIMEOUT_MS_MAX: u64 = 600_000;
/// Requests answered per connection before its replies are written: a
/// client pipelining faster than it reads cannot make one batch grow
/// without bound.
pub const IN_FLIGHT_PER_CONNECTION_MAX_DEFAULT: usize = 1024;
/// A batch's replies are buffered before they are written: 65536 of them
/// is already megabytes held for one client.
pub const IN_FLIGHT_PER_CONNECTION_MAX_LIMIT: usize = 65_536;
/// Refusal and audit log lines per second; the rest are counted and the
/// count is logged with the next line, so an attack cannot flood the journal.
pub const LOG_LINES_PER_SEC_MAX_DEFAULT: u64 = 100;
/// A million lines a second is more than a journal takes: past it the cap
/// caps nothing.
pub const LOG_LINES_PER_SEC_MAX_LIMIT: u64 = 1_000_000;
/// Owner and group may connect: the auth server joins the socket's group.
pub const SOCKET_MODE_DEFAULT: u32 = 0o660;
/// A socket's mode is permission bits only: no setuid, setgid or sticky.
pub const SOCKET_MODE_PERMISSION_BITS: u32 = 0o777;
/// The owner (the daemon's user, which runs admin commands) must be able
/// to read and write, or it locks itself out of its own socket.
pub const SOCKET_MODE_OWNER_READ_WRITE: u32 = 0o600;
/// Graceful stop: in-flight requests get this long to be answered before
/// the final snapshot is written regardless.
pub const SHUTDOWN_GRACE_MS_DEFAULT: u64 = 5_000;
/// Ten minutes: a stop that waits longer for stragglers delays the final
/// snapshot past what a service manager waits before killing it.
pub const SHUTDOWN_GRACE_MS_MAX: u64 = 600_000;

// The server's fixed limits, listed in `status` with the configurable ones.
/// Bytes read per connection buffer: a whole maximal frame fits, and a
/// client pipelining small checks gets hundreds read in one syscall.
pub const READ_BUFFER_BYTES: usize = 64 * 1024;
const _: () = assert!(READ_BUFFER_BYTES >= crate::codec::FRAME_HEADER_BYTES + crate::codec::REQUEST_PAYLOAD_BYTES_MAX);
/// Reply bytes a connection holds before it writes them, even mid-batch: a
/// client pipelining hundreds of `lockouts` or `status` requests and not
/// reading would otherwise make one batch's replies hundreds of megabytes.
/// A pipelined check batch's replies (about 80 bytes each) stay far below.
pub const REPLY_BYTES_BUFFERED_MAX: usize = 256 * 1024;
/// A connection's reply buffer at rest, and what it returns to once its
/// replies are written: a batch of a couple of hundred pipelined checks
/// (about 80 bytes a reply) fits without growing it. A batch that grows it
/// past this gives the memory back when written, so connections that once
/// took a large reply and then idle hold no more than any other.
pub const REPLY_BUFFER_RESTING_BYTES: usize = 16 * 1024;
/// Open files the daemon needs besides its connections: standard streams,
/// the listener, the state file, the runtime's epoll and wakers, the signal
/// pipe, the notify socket, and a config or class file read by a reload,
/// with room to spare. The start-up check warns when `connections_max` plus
/// these does not fit under the open-file limit.
pub const FILES_RESERVED_COUNT: u64 = 64;
/// After a failed `accept` (EMFILE: the open-file limit is reached), the
/// listener waits this long before trying again, doubling on each failure
/// in a row up to `ACCEPT_RETRY_DELAY_MS_MAX`. 1 ms: a descriptor freed by a
/// closing connection is used almost at once.
pub const ACCEPT_RETRY_DELAY_MS_MIN: u64 = 1;
/// The longest wait between failed `accept`s: at most ten futile calls a
/// second while the table stays full, and a new connection waits at most
/// this long once a descriptor is free.
pub const ACCEPT_RETRY_DELAY_MS_MAX: u64 = 100;
/// "accept failed" lines a second (wall clock); the rest are counted, the
/// count is logged with the next line and added to `log_lines_suppressed`.
/// One line a second says the condition persists; more says nothing new.
pub const ACCEPT_ERROR_LINES_PER_SEC_MAX: u64 = 1;

/// Namespace of every key tollgate writes in the shared store, so two
/// deployments (or a test one) can share one server. Short, because it is
/// in every key.
pub const SHARED_KEY_PREFIX_DEFAULT: &str = "tg";
/// The prefix is in every key and every log line that names one: 32 bytes
/// is room for a deployment's name.
pub const SHARED_KEY_PREFIX_BYTES_MAX: usize = 32;
/// Redis ACL user names are free text; 64 characters is past any real one
/// and keeps the log line that names it short.
pub const SHARED_USERNAME_CHARS_MAX: usize = 64;
/// Cluster seed nodes (`[shared] nodes`): the client learns the whole
/// cluster from any one of them, so a few suffice; 64 is past any real
/// list and keeps a typo'd generated file from becoming a long config.
pub const SHARED_NODES_MAX: usize = 64;
/// How long a request waits for the store before it is answered from this
/// host's tables: a store on the local network answers in well under a
/// millisecond, and the client's own call timeout (5 ms) must not pass first.
pub const SHARED_TIMEOUT_MS_DEFAULT: u64 = 2;
/// A second per login spent waiting is an outage of its own; more is a typo.
pub const SHARED_TIMEOUT_MS_MAX: u64 = 1_000;
/// How long a run of late store calls is taken for a busy store, not a
/// lost or overloaded one: its late calls are refused, never admitted on
/// the host's share, so an attacker's own burst cannot add the shares to
/// the store's limit. Long enough to outlast a burst on a loaded host;
/// short enough that a frozen store is answered on the shares within half
/// a second, and that a flood keeping the store late cannot keep every
/// login refused.
pub const SHARED_BUSY_MAX_MS_DEFAULT: u64 = 500;
/// Past a minute of refusals a store is not busy, it is gone.
pub const SHARED_BUSY_MAX_MS_MAX: u64 = 60_000;
/// A (re)connect is done by the breaker's probe, off the request path, so
/// it may take far longer than a request's wait.
pub const SHARED_CONNECT_TIMEOUT_MS_DEFAULT: u64 = 200;
/// Shorter fails a TCP handshake that lost one packet.
pub const SHARED_CONNECT_TIMEOUT_MS_MIN: u64 = 10;
/// Longer holds a probe on a black-holed address past several probe rounds.
pub const SHARED_CONNECT_TIMEOUT_MS_MAX: u64 = 10_000;
/// First probe of a store the breaker gave up on; the delay doubles per
/// failed probe up to `probe_max_ms`, so a blip is over in a tenth of a
/// second and a dead store costs a probe every couple of seconds.
pub const SHARED_PROBE_INTERVAL_MS_DEFAULT: u64 = 100;
/// Shorter reconnects in a tight loop against a store that is down.
pub const SHARED_PROBE_INTERVAL_MS_MIN: u64 = 10;
pub const SHARED_PROBE_INTERVAL_MS_MAX: u64 = 10_000;
/// The doubling's cap: a store back up is used again within 2 s.
pub const SHARED_PROBE_MAX_MS_DEFAULT: u64 = 2_000;
/// A minute of a recovered store left unused, answering from local tables,
/// is the most the back-off may cost.
pub const SHARED_PROBE_MAX_MS_LIMIT: u64 = 60_000;
/// Consecutive failed store calls that open the breaker: one lost packet
/// does not put every host's global rules into degraded mode.
pub const SHARED_BREAKER_FAILURES_DEFAULT: u32 = 3;
/// Past a hundred, a dead store costs a hundred timed-out logins per host
/// before the breaker notices.
pub const SHARED_BREAKER_FAILURES_MAX: u32 = 100;
/// Operations sent in one script call: enough to carry a busy host's
/// logins in a round trip or two.
pub const SHARED_BATCH_MAX_DEFAULT: usize = 64;
/// A batch's keys and arguments go through Lua's `unpack` and the server's
/// ARGV, which stop well above this but not far above it.
pub const SHARED_BATCH_MAX_LIMIT: usize = 1024;
/// Operations queued for the store; when full, a request is answered from
/// this host's tables at once rather than waiting.
pub const SHARED_PENDING_MAX_DEFAULT: usize = 4096;
/// Each queued operation holds its key and a waiter: a million is already
/// hundreds of megabytes held for a store that is not answering.
pub const SHARED_PENDING_MAX_LIMIT: usize = 1_000_000;
/// Hosts sharing the store, which divide a global limit while the store is
/// down: 0 learns them from the store's heartbeats.
pub const SHARED_HOSTS_DEFAULT: u32 = 0;
/// A thousand hosts on one store is past any deployment this is built for,
/// so a larger number is a typo.
pub const SHARED_HOSTS_MAX: u32 = 1_000;
/// The divisor before any heartbeat was seen and `hosts` is 0: a shared
/// deployment has at least two hosts, and assuming more would lock out
/// real users in an outage.
pub const SHARED_HOSTS_WHEN_UNKNOWN_DEFAULT: u32 = 2;
pub const SHARED_HOSTS_WHEN_UNKNOWN_MAX: u32 = 1_000;
/// How often a host tells the store it is alive (how hosts are counted).
pub const SHARED_HEARTBEAT_MS_DEFAULT: u64 = 1_000;
/// Faster is a write per host ten times a second for a number that changes
/// when a host starts or stops.
pub const SHARED_HEARTBEAT_MS_MIN: u64 = 100;
/// Slower leaves a new host uncounted for over a minute.
pub const SHARED_HEARTBEAT_MS_MAX: u64 = 60_000;
/// A host not heard from for this long is no longer counted: ten missed
/// heartbeats, so a slow one is not dropped and re-added.
pub const SHARED_HOST_TTL_MS_DEFAULT: u64 = 10_000;
/// Ten minutes: the learned count is the maximum over that long anyway.
pub const SHARED_HOST_TTL_MS_MAX: u64 = 600_000;
/// `host_ttl_ms` is at least this many heartbeats, so one late heartbeat
/// does not drop a live host.
pub const SHARED_HOST_TTL_HEARTBEATS_MIN: u64 = 2;

// Every default is within its bounds.
const _: () = {
    assert!(SNAPSHOT_INTERVAL_MS_DEFAULT <= SNAPSHOT_INTERVAL_MS_MAX);
    assert!(ATTEMPT_TIMEOUT_MS_DEFAULT <= ATTEMPT_TIMEOUT_MS_MAX);
    assert!(LOGIN_WINDOW_SECS_DEFAULT <= PERIOD_SECS_MAX && RATE_PERIOD_SECS_DEFAULT <= PERIOD_SECS_MAX);
    assert!(LOGIN_RATE_LIMIT_DEFAULT <= RATE_LIMIT_MAX && LOGIN_RATE_BURST_DEFAULT <= RATE_BURST_MAX);
    assert!(REQUEST_RATE_LIMIT_DEFAULT <= RATE_LIMIT_MAX && REQUEST_RATE_BURST_DEFAULT <= RATE_BURST_MAX);
    assert!(FAILURE_ENTRIES_MAX_DEFAULT <= ENTRIES_MAX_LIMIT && RATE_ENTRIES_MAX_DEFAULT <= ENTRIES_MAX_LIMIT);
    assert!(KNOWN_DEVICES_MAX_DEFAULT <= ENTRIES_MAX_LIMIT && RECENT_PASSWORD_ENTRIES_MAX_DEFAULT <= ENTRIES_MAX_LIMIT);
    assert!(RETRY_AFTER_STEPS_SECS_DEFAULT.len() <= RETRY_AFTER_STEPS_MAX);
    assert!(JITTER_PERCENT_DEFAULT <= JITTER_PERCENT_MAX);
    assert!(DELAY_BASE_MS_DEFAULT <= DELAY_MAX_MS_DEFAULT && DELAY_MAX_MS_DEFAULT <= DELAY_MAX_MS_LIMIT);
    assert!(KNOWN_DEVICE_TTL_SECS_DEFAULT <= KNOWN_DEVICE_TTL_SECS_MAX);
    assert!(KNOWN_DEVICES_PER_ACCOUNT_MAX_DEFAULT <= KNOWN_DEVICES_PER_ACCOUNT_MAX_LIMIT);
    assert!(RECENT_PASSWORDS_DEFAULT <= RECENT_PASSWORDS_MAX);
    assert!(HOSTING_IPV4_PREFIX_LEN_DEFAULT <= IPV4_PREFIX_LEN_MAX);
    assert!(CONNECTIONS_MAX_DEFAULT <= CONNECTIONS_MAX_LIMIT);
    assert!(FRAME_READ_TIMEOUT_MS_DEFAULT <= FRAME_READ_TIMEOUT_MS_MAX);
    assert!(IDLE_TIMEOUT_MS_MIN <= IDLE_TIMEOUT_MS_DEFAULT && IDLE_TIMEOUT_MS_DEFAULT <= IDLE_TIMEOUT_MS_MAX);
    assert!(REPLY_WRITE_TIMEOUT_MS_DEFAULT <= REPLY_WRITE_TIMEOUT_MS_MAX);
    assert!(IN_FLIGHT_PER_CONNECTION_MAX_DEFAULT <= IN_FLIGHT_PER_CONNECTION_MAX_LIMIT);
    assert!(LOG_LINES_PER_SEC_MAX_DEFAULT <= LOG_LINES_PER_SEC_MAX_LIMIT);
    assert!(SOCKET_MODE_DEFAULT & !SOCKET_MODE_PERMISSION_BITS == 0);
    assert!(SOCKET_MODE_DEFAULT & SOCKET_MODE_OWNER_READ_WRITE == SOCKET_MODE_OWNER_READ_WRITE);
    assert!(SHUTDOWN_GRACE_MS_DEFAULT <= SHUTDOWN_GRACE_MS_MAX);
    assert!(!SHARED_KEY_PREFIX_DEFAULT.is_empty() && SHARED_KEY_PREFIX_DEFAULT.len() <= SHARED_KEY_PREFIX_BYTES_MAX);
    assert!(1 <= SHARED_TIMEOUT_MS_DEFAULT && SHARED_TIMEOUT_MS_DEFAULT <= SHARED_TIMEOUT_MS_MAX);
    assert!(
        SHARED_CONNECT_TIMEOUT_MS_MIN <= SHARED_CONNECT_TIMEOUT_MS_DEFAULT
            && SHARED_CONNECT_TIMEOUT_MS_DEFAULT <= SHARED_CONNECT_TIMEOUT_MS_MAX
    );
    assert!(
        SHARED_PROBE_INTERVAL_MS_MIN <= SHARED_PROBE_INTERVAL_MS_DEFAULT
            && SHARED_PROBE_INTERVAL_MS_DEFAULT <= SHARED_PROBE_INTERVAL_MS_MAX
    );
    assert!(
        SHARED_PROBE_INTERVAL_MS_DEFAULT <= SHARED_PROBE_MAX_MS_DEFAULT
            && SHARED_PROBE_MAX_MS_DEFAULT <= SHARED_PROBE_MAX_MS_LIMIT
    );
    assert!(SHARED_PROBE_INTERVAL_MS_MAX <= SHARED_PROBE_MAX_MS_LIMIT);
    assert!(1 <= SHARED_BREAKER_FAILURES_DEFAULT && SHARED_BREAKER_FAILURES_DEFAULT <= SHARED_BREAKER_FAILURES_MAX);
    assert!(1 <= SHARED_BATCH_MAX_DEFAULT && SHARED_BATCH_MAX_DEFAULT <= SHARED_BATCH_MAX_LIMIT);
    assert!(1 <= SHARED_PENDING_MAX_DEFAULT && SHARED_PENDING_MAX_DEFAULT <= SHARED_PENDING_MAX_LIMIT);
    assert!(matches!(SHARED_HOSTS_DEFAULT, 0..=SHARED_HOSTS_MAX));
    assert!(
        1 <= SHARED_HOSTS_WHEN_UNKNOWN_DEFAULT && SHARED_HOSTS_WHEN_UNKNOWN_DEFAULT <= SHARED_HOSTS_WHEN_UNKNOWN_MAX
    );
    assert!(
        SHARED_HEARTBEAT_MS_MIN <= SHARED_HEARTBEAT_MS_DEFAULT
            && SHARED_HEARTBEAT_MS_DEFAULT <= SHARED_HEARTBEAT_MS_MAX
    );
    assert!(
        SHARED_HOST_TTL_HEARTBEATS_MIN * SHARED_HEARTBEAT_MS_DEFAULT <= SHARED_HOST_TTL_MS_DEFAULT
            && SHARED_HOST_TTL_MS_DEFAULT <= SHARED_HOST_TTL_MS_MAX
    );
    assert!(SHARED_HOST_TTL_HEARTBEATS_MIN * SHARED_HEARTBEAT_MS_MIN <= SHARED_HOST_TTL_MS_MAX);
};

// The operator's view (`[activity]`): what `tollgate top` and
// `tollgate sample` read. Each structure is fixed-size; the defaults keep
// the whole under ~4 MB.
/// Events (refusals, failures, sampled attempts, lockouts) waiting for the
/// activity thread; a full queue drops (and counts) rather than block.
pub const ACTIVITY_QUEUE_MAX_DEFAULT: usize = 65_536;
/// The queue's slots are allocated at start (~48 bytes each).
pub const ACTIVITY_QUEUE_MAX_LIMIT: usize = 1 << 20;
/// Entries of each top-K summary: a space-saving summary of K entries
/// finds every item above 1/K of the window's total, so 256 finds any
/// prefix drawing 0.4% of the refusals.
pub const ACTIVITY_TOP_ENTRIES_MAX_DEFAULT: usize = 256;
/// Each new item scans the summary for its least entry: kept small.
pub const ACTIVITY_TOP_ENTRIES_MAX_LIMIT: usize = 4_096;
/// The top lists cover this window and the one before: five to ten
/// minutes, recent enough to be "now" and long enough to rank.
pub const ACTIVITY_TOP_WINDOW_SECS_DEFAULT: u64 = 300;
pub const ACTIVITY_TOP_WINDOW_SECS_MIN: u64 = 10;
pub const ACTIVITY_TOP_WINDOW_SECS_MAX: u64 = 86_400;
/// Recent refusals and lockouts kept, each: more than a screen.
pub const ACTIVITY_RECENT_MAX_DEFAULT: usize = 256;
pub const ACTIVITY_RECENT_MAX_LIMIT: usize = 65_536;
/// Accounts counted exactly per day. Past this, the sample halves (an
/// account is kept when its keyed hash has one more leading zero), so
/// the sample stays between half and all of this: p99.9 of 8,192 or more
/// accounts is the 9th largest or beyond, not a lone outlier. ~40 bytes each.
pub const ACTIVITY_ACCOUNTS_SAMPLED_MAX_DEFAULT: usize = 16_384;
pub const ACTIVITY_ACCOUNTS_SAMPLED_MAX_MIN: usize = 1_024;
pub const ACTIVITY_ACCOUNTS_SAMPLED_MAX_LIMIT: usize = 1 << 22;
/// Would-be refusals kept for `tollgate sample`: "walk a hundred would-be
/// blocks to their causes", ten times over.
pub const ACTIVITY_SAMPLES_MAX_DEFAULT: usize = 1_000;
pub const ACTIVITY_SAMPLES_MAX_LIMIT: usize = 100_000;
/// One batch of requests in this many has its latency measured (two clock
/// reads per batch measured): the percentiles need a sample, not every request.
pub const ACTIVITY_LATENCY_SAMPLE_EVERY: u32 = 8;
// The decision log (`[decision_log]`): the what-if replay's
// input. A record is 62 bytes on disk for a check with an account and an
// IPv4 address, 262 at most (see `decision_log/record.rs`).
/// A file is one unit of deletion: 64 MiB holds about a million
/// decisions, small enough that retention trims in fine steps, large
/// enough that a busy day is a few files, not thousands.
pub const DECISION_LOG_FILE_BYTES_MAX_DEFAULT: u64 = 64 << 20;
/// A file must hold its header and a few of the largest records.
pub const DECISION_LOG_FILE_BYTES_MIN: u64 = 4096;
/// Beyond 4 GiB one file is a typo; rotate instead.
pub const DECISION_LOG_FILE_BYTES_MAX_LIMIT: u64 = 1 << 32;
/// 16 files of 64 MiB: at most 1 GiB of disk whatever the traffic.
pub const DECISION_LOG_FILES_MAX_DEFAULT: u32 = 16;
pub const DECISION_LOG_FILES_MAX_LIMIT: u32 = 100_000;
/// Two weekly cycles: the seed's "two weeks of monitor mode" is what a
/// replay stands in for, and both of a week's Mondays are in it.
pub const DECISION_LOG_AGE_MAX_SECS_DEFAULT: u64 = 14 * 86_400;
pub const DECISION_LOG_AGE_MAX_SECS_MIN: u64 = 60;
/// A year: past it a decision log is an archive, not a replay's input.
pub const DECISION_LOG_AGE_MAX_SECS_LIMIT: u64 = 366 * 86_400;
/// Records waiting for the writer thread, which drains every
/// `decision_log::WRITER_POLL_MS` (10 ms): 16,384 absorbs 1.6 million
/// decisions a second, past the daemon's measured peak, and the slots
/// (a `Record` is at most 216 bytes, held to it by a unit test; allocated
/// at start) cost about 3.7 MiB.
pub const DECISION_LOG_QUEUE_MAX_DEFAULT: usize = 16_384;
pub const DECISION_LOG_QUEUE_MAX_LIMIT: usize = 1 << 20;

// Spray detection (`[signals]`). The arithmetic behind each
// threshold is in docs/design/spray-detection.md §6: an office's 605
// distinct failed accounts an hour per address come with thousands of
// successes (share ≈ 0.1), a spray's do not (share ≈ 1).
/// The sliding window every signal counts over.
pub const SIGNALS_WINDOW_SECS_DEFAULT: u64 = 3_600;
pub const SIGNALS_WINDOW_SECS_MIN: u64 = 60;
pub const SIGNALS_WINDOW_SECS_MAX: u64 = 86_400;
/// Report events waiting for the signals thread; a full queue drops (and
/// counts) an event rather than block a report.
pub const SIGNALS_QUEUE_MAX_DEFAULT: usize = 65_536;
/// The queue's slots are allocated at start (64 bytes each).
pub const SIGNALS_QUEUE_MAX_LIMIT: usize = 1 << 20;
/// How often the signals thread publishes new flags, at most.
pub const SIGNALS_PUBLISH_INTERVAL_MS_DEFAULT: u64 = 5;
pub const SIGNALS_PUBLISH_INTERVAL_MS_MAX: u64 = 10_000;
/// How long a flag lasts after its detector last fired.
pub const SIGNALS_FLAG_TTL_SECS_DEFAULT: u64 = 3_600;
/// Heap of all sketches together: a dense sketch is ~780 bytes, so this
/// holds ~40,000 sketches past the exact range.
pub const SIGNALS_SKETCH_BYTES_MAX_DEFAULT: usize = 32 << 20;
pub const SIGNALS_SKETCH_BYTES_MIN: u64 = 1 << 16;
pub const SIGNALS_SKETCH_BYTES_MAX_LIMIT: u64 = 1 << 32;
pub const SIGNALS_PREFIXES_MAX_DEFAULT: usize = 131_072;
pub const SIGNALS_WIDE_PREFIXES_MAX_DEFAULT: usize = 65_536;
pub const SIGNALS_BLOCKS_MAX_DEFAULT: usize = 65_536;
pub const SIGNALS_ACCOUNTS_MAX_DEFAULT: usize = 131_072;
pub const SIGNALS_PASSWORDS_MAX_DEFAULT: usize = 65_536;
pub const SIGNALS_TENANTS_MAX_DEFAULT: usize = 16_384;
pub const SIGNALS_FLAGS_MAX_DEFAULT: usize = 65_536;
/// Successes are what a failure share is diluted by, and nine reports in
/// ten are successes: counting every one cost the signals thread a hash
/// probe into two 100,000-entry tables per login, most of spray detection's
/// cost on the report path. One account in 8, each weighing 8, estimates
/// an office's thousands of successes within a few percent; a share only
/// gates a source that has already failed `threshold` distinct accounts.
/// 1 counts every success.
pub const SIGNALS_SUCCESS_SAMPLE_DEFAULT: u32 = 8;
pub const SIGNALS_SUCCESS_SAMPLE_LIMIT: u32 = 1_024;
/// An account's successes dilute the failure shares of at most this many
/// sources a window. A person's laptop, phone, home and an office NAT's 4
/// addresses stay under it; an attacker's own accounts, logged into from
/// each of 2,000 addresses to hide the failures there, dilute 8 of them
/// each, so hiding 30 failures at every address takes 7,500 accounts, not 30.
pub const SIGNALS_SUCCESS_SOURCES_MAX_DEFAULT: u32 = 8;
/// Thresholds stay in the sketches' exact range (below 128).
pub const SIGNALS_THRESHOLD_MAX: u32 = 127;
pub const SIGNALS_PASSWORD_SPRAY_THRESHOLD_DEFAULT: u32 = 20;
pub const SIGNALS_NARROW_SPRAY_THRESHOLD_DEFAULT: u32 = 10;
pub const SIGNALS_WIDE_SPRAY_THRESHOLD_DEFAULT: u32 = 50;
/// The failed accounts one source (an IPv4 address, an IPv6 /56) failing
/// in the window counts as at most in its /24's or /48's capped sum, which
/// must reach `wide_spray`'s threshold and failure share as well as its
/// accounts, so the wide flag, which falls on every address of the
/// prefix, needs failures from 13 sources or more:
/// six addresses of a /24 failing ten accounts each (one customer, whose
/// own addresses `narrow_spray` flags) add 24, and with 15 neighbours'
/// typos still stay below 50. The price: 12 addresses of a /24 can fail 9
/// accounts each, 108 an hour, below every source flag; 12 /56s of a /48
/// (two /64s failing 9 each and a third failing 1, below the /56's own
/// flag) 229.
pub const SIGNALS_WIDE_SPRAY_ACCOUNTS_PER_SOURCE_MAX_DEFAULT: u32 = 4;
pub const SIGNALS_ACCOUNT_DISTRIBUTED_THRESHOLD_DEFAULT: u32 = 8;
pub const SIGNALS_FAILURE_SHARE_MIN_DEFAULT: f64 = 0.5;
pub const SIGNALS_TENANT_RATIO_FACTOR_DEFAULT: f64 = 3.0;
pub const SIGNALS_TENANT_RATIO_MARGIN_DEFAULT: f64 = 0.15;
pub const SIGNALS_TENANT_FAILURES_MIN_DEFAULT: u32 = 100;
pub const SIGNALS_TENANT_WARMUP_HOURS_DEFAULT: u32 = 24;
pub const SIGNALS_TENANT_BASELINE_HOURS_DEFAULT: u32 = 168;
pub const SIGNALS_TENANT_BASELINE_HOURS_MAX: u32 = 24 * 365;
pub const SIGNALS_WIDEN_PER_56_DEFAULT: u32 = 8;
pub const SIGNALS_WIDEN_PER_48_DEFAULT: u32 = 16;
pub const SIGNALS_WIDEN_HOLD_SECS_DEFAULT: u64 = 3_600;
/// Keys on a signal rule's ladder (refused keys only).
pub const SIGNAL_RULE_ENTRIES_MAX_DEFAULT: usize = 65_536;

const _: () = {
    assert!(
        SIGNALS_WINDOW_SECS_MIN <= SIGNALS_WINDOW_SECS_DEFAULT
            && SIGNALS_WINDOW_SECS_DEFAULT <= SIGNALS_WINDOW_SECS_MAX
    );
    assert!(SIGNALS_FLAG_TTL_SECS_DEFAULT <= SIGNALS_WINDOW_SECS_MAX);
    assert!(SIGNALS_PUBLISH_INTERVAL_MS_DEFAULT <= SIGNALS_PUBLISH_INTERVAL_MS_MAX);
    assert!(SIGNALS_QUEUE_MAX_DEFAULT <= SIGNALS_QUEUE_MAX_LIMIT);
    assert!(SIGNALS_SKETCH_BYTES_MIN <= SIGNALS_SKETCH_BYTES_MAX_DEFAULT as u64);
    assert!(SIGNALS_SKETCH_BYTES_MAX_DEFAULT as u64 <= SIGNALS_SKETCH_BYTES_MAX_LIMIT);
    assert!(SIGNALS_PASSWORD_SPRAY_THRESHOLD_DEFAULT <= SIGNALS_THRESHOLD_MAX);
    assert!(SIGNALS_NARROW_SPRAY_THRESHOLD_DEFAULT <= SIGNALS_THRESHOLD_MAX);
    assert!(SIGNALS_WIDE_SPRAY_THRESHOLD_DEFAULT <= SIGNALS_THRESHOLD_MAX);
    assert!(SIGNALS_ACCOUNT_DISTRIBUTED_THRESHOLD_DEFAULT <= SIGNALS_THRESHOLD_MAX);
    assert!(
        SIGNALS_WIDEN_PER_56_DEFAULT <= SIGNALS_THRESHOLD_MAX && SIGNALS_WIDEN_PER_48_DEFAULT <= SIGNALS_THRESHOLD_MAX
    );
    assert!(SIGNALS_TENANT_BASELINE_HOURS_DEFAULT <= SIGNALS_TENANT_BASELINE_HOURS_MAX);
    assert!(SIGNALS_TENANT_WARMUP_HOURS_DEFAULT <= SIGNALS_TENANT_BASELINE_HOURS_MAX);
    assert!(SIGNALS_WIDEN_HOLD_SECS_DEFAULT <= SIGNALS_WINDOW_SECS_MAX);
};
