package dev.tollgate.client;

import java.io.IOException;
import java.util.ArrayDeque;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A client for one tollgate daemon: pooled connections, a per-call deadline
 * (5 ms by default), and each route's fail policy applied when the daemon
 * cannot answer in time, surfaced as such (never as a made-up verdict).
 * Thread-safe: share one per process (the busy rule reads its history).
 * No call throws: every outcome is an {@link Answer}.
 */
public final class Client implements AutoCloseable {
    /** Idle connections kept for reuse. */
    public static final int POOL_CONNECTIONS_MAX = 64;
    /**
     * Timed-out calls' connections listened on at once for a late reply.
     * Past this many, a timed-out call's connection is closed at once, so a
     * flood of late calls cannot run the auth server out of descriptors; a
     * few listeners are enough to hear that the daemon still answers.
     */
    public static final int LATE_LISTENERS_MAX = 16;

    private final ClientConfig config;
    private final ArrayDeque<Connection> pool = new ArrayDeque<>();
    private boolean closed;
    private final AtomicLong nextId = new AtomicLong(1);
    private final long startedNanos = System.nanoTime();
    /** Listens on timed-out calls' connections: a daemon that still answers, late, is busy, not down. */
    private final LateReplies lateReplies = new LateReplies(this::nowUs, LATE_LISTENERS_MAX);
    /** Per closed route with a static budget: its GCRA TAT. */
    private final Map<String, Long> budgetTats = new HashMap<>();
    /** When the daemon last answered a call in time (µs since start, plus one; 0 never): a daemon never heard from is not busy. */
    private volatile long lastAnsweredUs;
    /**
     * The current run of timeouts, when it began and its last one (0: none).
     * A daemon late at a stretch for longer than busy_max, with nothing
     * answered in time within it, is down or overloaded, not busy with a
     * burst: the fail policy applies again.
     */
    private long runStartUs;
    private long runLastUs;
    private final Object runLock = new Object();
    private final Bursts bursts = new Bursts();
    /** Per requester, its busy window: how long a burst made by others may keep it out. */
    private final Bursts.Windows busyWindows = new Bursts.Windows();
    /** Per requester, when a success was last reported for it: only such a requester may leave busy past its window's busy_max. */
    private final Bursts.Known knownRequesters = new Bursts.Known();

    public Client(ClientConfig config) {
        this.config = config.copy();
        Warmup.once();
    }

    public ClientConfig config() {
        return config.copy();
    }

    /** Asks before the expensive work: may this attempt proceed? */
    public Answer check(String route, Subject subject) {
        return check(route, subject, null);
    }

    /**
     * A check with the attempted password's tag ({@link Passwords#passwordTag}),
     * so that a password failing across many accounts can be refused. A
     * daemon older than version 3 never sees the tag.
     */
    public Answer check(String route, Subject subject, byte[] passwordTag) {
        return decide(subject, Request.check(route, subject.bounded(), passwordTag));
    }

    /** Tells the outcome after verifying the credential. */
    public Answer report(String route, Subject subject, Outcome outcome) {
        return report(route, subject, outcome, null, null);
    }

    /**
     * A report with the password's digest ({@link Passwords#passwordDigest}:
     * a failure repeating a recent wrong password is not counted again) and
     * tag (a failure's tag counts the password across accounts); either may be null.
     */
    public Answer report(String route, Subject subject, Outcome outcome, byte[] passwordDigest, byte[] passwordTag) {
        return decide(subject, Request.report(route, subject.bounded(), outcome, passwordDigest, passwordTag));
    }

    /**
     * The attempt an allowed check admitted ended without an outcome: its
     * places are given back and nothing is counted. Prefer {@link #begin},
     * whose guard sends this by itself. A daemon older than version 5
     * answers it with a malformed error (rejected), and the places lapse.
     */
    public Answer abandon(String route, Subject subject) {
        return decide(subject, Request.abandon(route, subject.bounded()));
    }

    /** Checks an attempt and returns it as a guard: report through it, or close it to abandon. */
    public Attempt begin(String route, Subject subject) {
        return begin(route, subject, null);
    }

    public Attempt begin(String route, Subject subject, byte[] passwordTag) {
        return new Attempt(this, route, subject, passwordTag, check(route, subject, passwordTag));
    }

    /**
     * Closes the idle connections and those listened on for late replies;
     * calls still work but keep no connection afterwards.
     */
    @Override
    public void close() {
        synchronized (pool) {
            closed = true;
            for (Connection c : pool) c.close();
            pool.clear();
        }
        lateReplies.close();
    }

    /** {@code given}: the subject as the caller gave it, for the checks made before sending. */
    private Answer decide(Subject given, Request request) {
        // Refused here, it spends no budget, joins no burst and touches no
        // connection: see Preflight for why it must never reach the socket.
        Answer.Rejected refused = Preflight.refusal(given, request, config.protocolVersion);
        if (refused != null) return refused;
        String route = request.route();
        // An interrupted thread would close the channel on its first I/O
        // (NIO channels are interruptible): the call would fail before it
        // is sent, and a report or abandon of a cancelled handler is exactly
        // what must still go out. The flag is put back afterwards.
        boolean interrupted = Thread.interrupted();
        try {
            return decideUninterrupted(route, request);
        } finally {
            if (interrupted) Thread.currentThread().interrupt();
        }
    }

    private Answer decideUninterrupted(String route, Request request) {
        // Only a check is an attempt: a report of its outcome must not spend
        // a second unit of the static budget.
        boolean spend = request.kind() == Request.Kind.CHECK;
        if (request.kind() == Request.Kind.REPORT && request.outcome() == Outcome.SUCCESS) {
            // The auth server says the password was right: whatever the
            // daemon answers (or if it cannot), this requester is a user.
            // Keyed as a check's requester on the subject as sent (the
            // X-Forwarded-For tail the daemon reads), under its account.
            // A requester that is its burst key (no address) is never asked
            // about: its overlaps are all its own.
            String requester = Bursts.requesterKey(route, request.subject());
            if (!requester.equals(Bursts.burstKey(route, request.subject()))) {
                knownRequesters.succeeded(requester, Bursts.accountKey(route, request.subject()), nowUs());
            }
        }
        Bursts.Guard burst = spend ? bursts.enter(route, request.subject()) : null;
        Codec.Reply reply = null;
        ClientError error = null;
        try {
            reply = call(request);
        } catch (CallFailed failed) {
            error = failed.error;
            // Busy stops a login only in a burst on its account: a lone
            // user's timeout during a flood on others is an outage.
            // Parallel checks on one account from one address (and one
            // X-Forwarded-For, in one tenant) are a guesser's: refused for
            // as long as they last. A user who has logged in from this
            // address through this client (at most 16 remembered per
            // account, the least recent forgotten first) is refused
            // as busy in others' bursts on her account (their checks come
            // from other addresses) for at most busy_max in a window of
            // 120 x busy_max, so nobody can keep her out by checking her
            // account; past that her timeout follows the fail policy.
            // Anyone else in a burst on the account (a guesser's other
            // addresses, a botnet) stays busy: a late guess that failed
            // open would be admitted with no check at all. Own bursts and
            // unknown requesters start no window.
            // The call gives a busy timeout the plain timeout message: only
            // one that stays busy says so, a downgraded one is a timeout.
            if (error.kind() == ClientError.Kind.BUSY) {
                boolean busy = false;
                if (burst != null) {
                    if (burst.ownBurst()) {
                        busy = true;
                    } else if (burst.inBurst()) {
                        long now = nowUs();
                        busy = !knownRequesters.known(burst.requester(), now)
                                || busyWindows.excused(burst.requester(), now, config.busyMax.toNanos() / 1000);
                    }
                }
                error = busy
                        ? new ClientError(ClientError.Kind.BUSY, error.message() + " (busy)")
                        : new ClientError(ClientError.Kind.TIMEOUT, error.message());
            }
        } finally {
            if (burst != null) burst.close();
        }
        if (error != null) return unavailable(route, error, spend);
        if (reply.verdict() != null) return new Answer.Decided(reply.verdict());
        if (reply.error() != null) return new Answer.Rejected(reply.error());
        return unavailable(route, new ClientError(ClientError.Kind.PROTOCOL,
                "response variant " + reply.variant() + " to a " + request.kind()), spend);
    }

    /** The route's fail policy; for a closed route, whether its static budget has room (spent from only when {@code spend}). */
    Answer unavailable(String route, ClientError error, boolean spend) {
        FailPolicy policy = config.failPolicy(route);
        boolean within = false;
        Gcra.Spec spec = config.staticBudgets.get(route);
        // A busy daemon is not an outage: the budget is not spent on it.
        if (policy == FailPolicy.CLOSED && error.kind() != ClientError.Kind.BUSY && spec != null) {
            synchronized (budgetTats) {
                long tat = budgetTats.getOrDefault(route, -1L);
                Gcra.Decision d = Gcra.decide(spec, tat, nowUs(), spend);
                budgetTats.put(route, d.tatAfterUs());
                within = d.allowed();
            }
        }
        return new Answer.Unavailable(policy, error, within);
    }

    private long nowUs() {
        return (System.nanoTime() - startedNanos) / 1000 + 1;
    }

    private static class CallFailed extends Exception {
        final ClientError error;

        CallFailed(ClientError.Kind kind, String message) {
            super(message, null, false, false);
            this.error = new ClientError(kind, message);
        }
    }

    /** One request and its reply within the deadline, with the busy rule's bookkeeping. */
    private Codec.Reply call(Request request) throws CallFailed {
        long deadline = System.nanoTime() + config.timeout.toNanos();
        long busyMaxUs = config.busyMax.toNanos() / 1000;
        try {
            Codec.Reply reply = callUntimed(request, deadline);
            synchronized (runLock) {
                // A timely answer busy_max after the run's last timeout ends
                // the run (quiet gaps alone do not: a frozen daemon's sparse
                // calls are one run that grows old).
                long now = nowUs();
                lastAnsweredUs = now;
                if (runLastUs != 0 && now - runLastUs >= busyMaxUs) runLastUs = 0;
            }
            return reply;
        } catch (Connection.TimedOut e) {
            long last = lastAnsweredUs;
            boolean stillAnswering;
            synchronized (runLock) {
                // The time is read under the lock: read before it, another
                // thread could start the run after this one's instant. So is
                // the last late reply, or one heard meanwhile would be missed.
                long now = nowUs();
                long heard = lateReplies.heardUs();
                // A late reply heard after the run's last timeout shows the
                // daemon alive after that run, so this timeout begins a new
                // run, as it would with no run at all. Without this, load
                // from elsewhere can keep the daemon late while this client
                // makes no calls for longer than busyMax; its next burst
                // times out before any late reply of its own is heard, finds
                // the run, the answer in time and the last late reply all
                // older than busyMax, and fails open. A frozen daemon sends
                // no late reply, so its sparse calls still make one run that
                // grows old and becomes an outage.
                if (runLastUs == 0 || heard > runLastUs) runStartUs = now;
                runLastUs = Math.max(runLastUs, now);
                // A daemon that answered in time within busyMax is busy, not
                // down: bursts closer together than busyMax would otherwise
                // age one run past it and fail open. So is one that answered
                // a call late within busyMax: load can keep it late for every
                // call for longer than busyMax while it is alive. A late
                // answer neither ends the run nor counts as answered in time,
                // so a daemon never answered in time is still not busy.
                stillAnswering = now - runStartUs < busyMaxUs || now - last < busyMaxUs
                        || (heard != 0 && now - heard < busyMaxUs);
            }
            // A socket that could not be created or connected for any reason
            // but an unreachable daemon (see Connection.unreachable: a full
            // accept queue, EMFILE, ...) is late the same way, however early
            // it failed: one run, the same busy rule.
            String message = "tollgate did not answer within " + config.timeout.toMillis() + " ms"
                    + (e.getMessage().equals(Connection.NO_ANSWER) ? "" : " (connecting: " + e.getMessage() + ")");
            // Busy only if decide() finds the check in its own burst, or in
            // one on its account with its requester unknown or within its
            // busy window; it adds " (busy)" then.
            if (last > 0 && stillAnswering) throw new CallFailed(ClientError.Kind.BUSY, message);
            throw new CallFailed(ClientError.Kind.TIMEOUT, message);
        }
    }

    private Codec.Reply callUntimed(Request request, long deadline) throws CallFailed, Connection.TimedOut {
        Connection pooled;
        synchronized (pool) {
            pooled = pool.pollLast();
        }
        if (pooled == null) return callOn(connect(deadline), request, deadline);
        try {
            return callOn(pooled, request, deadline);
        } catch (ClosedWhileIdle e) {
            // A pooled connection the daemon closed while it sat idle (or a
            // restarted daemon): ask once more on a fresh connection.
            return callOn(connect(deadline), request, deadline);
        }
    }

    private Connection connect(long deadline) throws CallFailed, Connection.TimedOut {
        try {
            return Connection.open(config.socket, config.protocolVersion, deadline);
        } catch (Connection.ConnectFailed e) {
            throw new CallFailed(ClientError.Kind.CONNECT, e.getMessage());
        } catch (IOException e) {
            throw new CallFailed(ClientError.Kind.IO, "connecting: " + e);
        }
    }

    /** The connection failed with an I/O error: on a pooled one, the daemon may have closed it while idle. */
    private static final class ClosedWhileIdle extends CallFailed {
        ClosedWhileIdle(String message) {
            super(ClientError.Kind.IO, message);
        }
    }

    /**
     * One exchange, with the version step-down; the connection goes back to
     * the pool only if it ended cleanly (after an error or a timeout its
     * state is unknown: closed, or after a timeout listened on for a late
     * reply and then closed).
     */
    private Codec.Reply callOn(Connection conn, Request request, long deadline) throws CallFailed, Connection.TimedOut {
        boolean pooled = false;
        boolean handedOver = false;
        try {
            Codec.Reply reply = exchange(conn, request, deadline);
            // A daemon older than the connection's version refuses it in
            // version 1's bytes: ask again one version lower, each step once
            // per connection, and keep the version on it.
            while (conn.version > Codec.PROTOCOL_VERSION_MIN && refusesVersion(reply)) {
                conn.version--;
                reply = exchange(conn, request, deadline);
            }
            synchronized (pool) {
                if (!closed && pool.size() < POOL_CONNECTIONS_MAX) {
                    pool.addLast(conn);
                    pooled = true;
                }
            }
            return reply;
        } catch (Connection.TimedOut e) {
            // The daemon has the whole request and owes a reply: whether it
            // comes late tells a busy daemon from a down one. The listener
            // takes the connection (closing it at once if it cannot listen)
            // and the call returns its timeout now.
            if (conn.requestWritten()) {
                handedOver = true;
                lateReplies.listen(conn, config.busyMax);
            }
            throw e;
        } finally {
            if (!pooled && !handedOver) conn.close();
        }
    }

    private static boolean refusesVersion(Codec.Reply reply) {
        return reply.version() == 1 && reply.error() != null && reply.error().code() == ErrorCode.UNSUPPORTED_VERSION;
    }

    private Codec.Reply exchange(Connection conn, Request request, long deadline) throws CallFailed, Connection.TimedOut {
        long id = nextId.getAndIncrement();
        byte[] frame = Codec.encode(conn.version, id, request);
        byte[] payload;
        try {
            payload = conn.roundTrip(frame, deadline);
        } catch (Connection.TooLarge e) {
            throw new CallFailed(ClientError.Kind.PROTOCOL, e.getMessage());
        } catch (IOException e) {
            throw new ClosedWhileIdle("connection to tollgate failed: " + e);
        }
        Codec.Reply reply;
        try {
            reply = Codec.decode(payload);
        } catch (Codec.MalformedReplyException e) {
            throw new CallFailed(ClientError.Kind.PROTOCOL, e.getMessage());
        }
        // Id 0 is the daemon's reply to a frame it could not read at all.
        if (reply.id() != id && !(reply.id() == 0 && reply.error() != null)) {
            throw new CallFailed(ClientError.Kind.PROTOCOL, "reply id " + Long.toUnsignedString(reply.id()) + " for request " + id);
        }
        return reply;
    }

    /** Requesters with a busy window now (for tests). */
    int busyWindows() {
        return busyWindows.size();
    }

    /** Requesters known by a reported success now (for tests). */
    int knownRequesters() {
        return knownRequesters.size();
    }

    /** Keys in the burst table now (for tests). */
    int burstEntries() {
        return bursts.size();
    }

    /** When a late reply was last heard (µs as nowUs; 0 never; for tests). */
    long lateReplyHeardUs() {
        return lateReplies.heardUs();
    }

    /** Connections listened on for a late reply now (for tests). */
    int lateListeners() {
        return lateReplies.listening();
    }

    /** Idle connections now (for tests). */
    int pooled() {
        synchronized (pool) {
            return pool.size();
        }
    }
}
