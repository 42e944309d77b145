package dev.tollgate.client;

import java.util.HashMap;
import java.util.Map;

/**
 * Which checks of this client are in a burst, as the Rust client's
 * burst.rs: a timeout from a busy daemon stops a login only when another
 * check on the same account (or, without one, the same address) waited on
 * this client at the same time, or started less than {@link #BURST_GAP_US}
 * before it. A lone user's timeout during a flood on other accounts is an
 * outage for the fail policy, not a refusal.
 */
final class Bursts {
    /** Checks on one key this close together are one burst: shorter than a person's next try, longer than a loaded host's scheduling delay. */
    static final long BURST_GAP_US = 50_000;
    /** Entries kept before the ended ones are swept. */
    static final int SWEEP_AT = 1024;

    private static final class Entry {
        int waiting;
        long newest;
        /** µs since epoch plus BURST_GAP_US, so 0 is never a start. */
        long startedUs;
    }

    private final Map<String, Entry> entries = new HashMap<>();
    private final long epochNanos = System.nanoTime();
    private long seq;

    /** Counts a check on the subject as waiting until the guard closes. */
    Guard enter(String route, Subject subject) {
        String key;
        if (subject.account() != null) {
            key = route + "\u0000a" + subject.account();
        } else if (subject.peer() != null) {
            key = route + "\u0000p" + subject.peer().getHostAddress();
        } else {
            key = route + "\u0000";
        }
        synchronized (entries) {
            long mySeq = ++seq;
            long now = (System.nanoTime() - epochNanos) / 1000 + BURST_GAP_US;
            if (entries.size() >= SWEEP_AT && !entries.containsKey(key)) {
                entries.values().removeIf(e -> e.waiting == 0 && now - e.startedUs >= BURST_GAP_US);
            }
            Entry entry = entries.computeIfAbsent(key, k -> new Entry());
            boolean company = entry.waiting > 0 || (entry.startedUs > 0 && now - entry.startedUs < BURST_GAP_US);
            entry.waiting++;
            entry.newest = mySeq;
            entry.startedUs = now;
            return new Guard(key, mySeq, company);
        }
    }

    int size() {
        synchronized (entries) {
            return entries.size();
        }
    }

    final class Guard implements AutoCloseable {
        private final String key;
        private final long seq;
        private final boolean company;
        private boolean closed;

        private Guard(String key, long seq, boolean company) {
            this.key = key;
            this.seq = seq;
            this.company = company;
        }

        /** Whether another check on its key waited while it did (before or after it came), or started within BURST_GAP_US before it. */
        boolean inBurst() {
            synchronized (entries) {
                Entry e = entries.get(key);
                return company || (e != null && e.newest > seq);
            }
        }

        @Override
        public void close() {
            synchronized (entries) {
                if (closed) return;
                closed = true;
                Entry e = entries.get(key);
                if (e != null) e.waiting--;
            }
        }
    }
}
