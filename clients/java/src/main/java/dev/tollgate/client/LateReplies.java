package dev.tollgate.client;

import java.time.Duration;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.SynchronousQueue;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.LongSupplier;

/**
 * Replies that come after their call's deadline. A daemon that an
 * attacker's bursts keep late for every call is busy, not down: it still
 * answers, a moment after the deadline. A client that closed each timed-out
 * call's connection never learned that, and once its run of late calls was
 * older than busy_max every late check on {@code login} failed open. So a
 * timed-out call whose request went out whole hands its connection to a
 * listener here, which waits up to busy_max for any byte of the reply: one
 * arriving is the daemon answering, late. The connection is closed after
 * either way and never reused (its state is unknown).
 *
 * <p>Listeners run on daemon threads, so they never keep a JVM alive, and
 * the caller only hands the connection over: its call returns when it
 * would have without them.
 */
final class LateReplies implements AutoCloseable {
    /** Idle listener threads end after this long, so an idle client keeps none. */
    private static final long IDLE_THREAD_SECONDS = 10;

    private final LongSupplier nowUs;
    private final int listenersMax;
    /** When a reply was last heard after its call's deadline (the client's µs clock; 0 never). */
    private final AtomicLong heardUs = new AtomicLong();
    /** Connections held by listeners now: never more than {@code listenersMax}. */
    private final AtomicInteger listening = new AtomicInteger();
    /**
     * Threads are made as needed and reused while work comes: under a long
     * flood of late calls no thread is started per call. The count of
     * listeners, not the pool, bounds them: a pool bounded at the cap would
     * refuse a new listener while a finished one's thread had not yet gone
     * back to waiting.
     */
    private final ThreadPoolExecutor threads;

    /** {@code nowUs}: the client's clock, so that a heard reply compares with its other instants. */
    LateReplies(LongSupplier nowUs, int listenersMax) {
        this.nowUs = nowUs;
        this.listenersMax = listenersMax;
        ThreadFactory daemonThreads = task -> {
            Thread t = new Thread(task, "tollgate-late-reply");
            t.setDaemon(true);
            return t;
        };
        threads = new ThreadPoolExecutor(0, Integer.MAX_VALUE, IDLE_THREAD_SECONDS, TimeUnit.SECONDS,
                new SynchronousQueue<>(), daemonThreads);
    }

    /** When a late reply was last heard (the client's µs clock; 0 never). */
    long heardUs() {
        return heardUs.get();
    }

    /** Connections held by listeners now. */
    int listening() {
        return listening.get();
    }

    /**
     * Takes the connection of a call that timed out after its request was
     * completely written, and listens on it for up to {@code horizon}. It is
     * closed at once instead when the horizon is zero (busy_max 0: every
     * timeout is an outage, there is nothing to learn), when the cap of
     * listeners is reached (an attacker must not be able to run the auth
     * server out of descriptors by making calls late), or once this is closed.
     */
    void listen(Connection connection, Duration horizon) {
        if (horizon.isZero() || horizon.isNegative()) {
            connection.close();
            return;
        }
        if (listening.incrementAndGet() > listenersMax) {
            listening.decrementAndGet();
            connection.close();
            return;
        }
        // At most busy_max from the handover: a daemon slower than that to
        // answer is taken for down, as a run of timeouts older than busy_max
        // is, and the connection is not held open any longer.
        long deadlineNanos = System.nanoTime() + horizon.toNanos();
        try {
            threads.execute(() -> {
                try {
                    if (connection.hearsReply(deadlineNanos)) heardUs.accumulateAndGet(nowUs.getAsLong(), Math::max);
                } finally {
                    // Closed before the place is given back, so the count
                    // never undercounts the connections actually open.
                    connection.close();
                    listening.decrementAndGet();
                }
            });
        } catch (RejectedExecutionException | OutOfMemoryError e) {
            // Closed, or no thread could be started (Thread.start throws an
            // OutOfMemoryError for that): the connection is closed at once,
            // as a timed-out call's always was, and the call still returns
            // its timeout rather than throwing.
            connection.close();
            listening.decrementAndGet();
        }
    }

    /**
     * Stops listening: each listener is interrupted and closes its
     * connection, and connections handed over from now on are closed at once.
     */
    @Override
    public void close() {
        threads.shutdownNow();
    }
}
