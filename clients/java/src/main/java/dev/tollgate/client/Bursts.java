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
 *
 * <p>Each check is also counted under its requester (the route, the account
 * and the address together; without both, the burst key itself), so that a
 * burst of one's own can be told from one made by others. Parallel checks on
 * one account from one address are a guesser's: refused as busy for as long
 * as they last. A user who has logged in from her address through this
 * client ({@link Known}) is refused as busy in others' bursts on her account
 * (their checks come from other addresses) for at most busy_max in a window
 * of 120 x busy_max ({@link Windows}), so nobody can keep her out by checking
 * her account; past that her timeout follows the fail policy. Anyone else in
 * a burst on the account (a guesser's other addresses, a botnet) stays busy
 * however long it lasts: a late guess that failed open would be admitted
 * with no check at all.
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

    /** The burst key: the route and the account, or without one the address. Tagged so no key of one kind equals one of another. */
    static String burstKey(String route, Subject subject) {
        if (subject.account() != null) return "1\u0000" + route + "\u0000" + subject.account();
        if (subject.peer() != null) return "2\u0000" + route + "\u0000" + subject.peer().getHostAddress();
        return "0\u0000" + route;
    }

    /**
     * The requester key: the route, the account and the address when the
     * subject has both (a tag of its own, so it never equals a burst key);
     * otherwise the burst key, which then names the requester as well as
     * anything can.
     */
    static String requesterKey(String route, Subject subject) {
        if (subject.account() != null && subject.peer() != null) {
            return "3\u0000" + route + "\u0000" + subject.account() + "\u0000" + subject.peer().getHostAddress();
        }
        return burstKey(route, subject);
    }

    /** Counts a check on the subject as waiting, under its burst key and its requester key, until the guard closes. */
    Guard enter(String route, Subject subject) {
        String key = burstKey(route, subject);
        String requester = requesterKey(route, subject);
        boolean same = requester.equals(key);
        synchronized (entries) {
            long mySeq = ++seq;
            long now = (System.nanoTime() - epochNanos) / 1000 + BURST_GAP_US;
            if (entries.size() >= SWEEP_AT && (!entries.containsKey(key) || !entries.containsKey(requester))) {
                entries.values().removeIf(e -> e.waiting == 0 && now - e.startedUs >= BURST_GAP_US);
            }
            boolean company = join(key, mySeq, now);
            // The same key is entered once: counted twice, a lone check
            // would be its own company.
            boolean own = same ? company : join(requester, mySeq, now);
            return new Guard(key, requester, mySeq, company, own);
        }
    }

    /** Under the lock: joins the key's entry and tells whether it had company. */
    private boolean join(String key, long mySeq, long now) {
        Entry entry = entries.computeIfAbsent(key, k -> new Entry());
        boolean company = entry.waiting > 0 || (entry.startedUs > 0 && now - entry.startedUs < BURST_GAP_US);
        entry.waiting++;
        entry.newest = mySeq;
        entry.startedUs = now;
        return company;
    }

    int size() {
        synchronized (entries) {
            return entries.size();
        }
    }

    final class Guard implements AutoCloseable {
        private final String key;
        private final String requester;
        private final long seq;
        private final boolean company;
        private final boolean ownCompany;
        private boolean closed;

        private Guard(String key, String requester, long seq, boolean company, boolean ownCompany) {
            this.key = key;
            this.requester = requester;
            this.seq = seq;
            this.company = company;
            this.ownCompany = ownCompany;
        }

        /** Its requester key, for the busy windows. */
        String requester() {
            return requester;
        }

        /** Whether another check on its key waited while it did (before or after it came), or started within BURST_GAP_US before it. */
        boolean inBurst() {
            return had(key, company);
        }

        /**
         * {@link #inBurst} on its requester key: another check by the same
         * requester (route, account and address) waited while it did, or
         * started within BURST_GAP_US before it.
         */
        boolean ownBurst() {
            return had(requester, ownCompany);
        }

        private boolean had(String k, boolean before) {
            synchronized (entries) {
                Entry e = entries.get(k);
                return before || (e != null && e.newest > seq);
            }
        }

        @Override
        public void close() {
            synchronized (entries) {
                if (closed) return;
                closed = true;
                Entry e = entries.get(key);
                if (e != null) e.waiting--;
                if (!requester.equals(key)) {
                    Entry r = entries.get(requester);
                    if (r != null) r.waiting--;
                }
            }
        }
    }

    /**
     * Per requester key, when its window's first busy refusal came (µs,
     * the caller's monotonic clock). A known requester ({@link Known}) in
     * a burst on her account that is not her own is refused as busy for at
     * most busy_max in a window of 120 x busy_max: others trickling checks
     * on her account from other addresses cannot keep her out, past
     * busy_max her timeout follows the fail policy. Only known requesters
     * get a window. Bounded by {@link #BUSY_REQUESTERS_MAX}.
     */
    static final class Windows {
        /** Requesters kept; a flood of distinct keys past it is not excused. */
        static final int BUSY_REQUESTERS_MAX = 4096;
        /** A window is this many busy_max long. */
        static final long WINDOW_BUSY_MAXES = 120;

        private final Map<String, Long> firsts = new HashMap<>();

        /**
         * Whether the requester's timeout may stay busy at {@code nowUs}:
         * within busy_max of its window's first refusal. A window that has
         * ended starts again now.
         */
        boolean excused(String requester, long nowUs, long busyMaxUs) {
            long window = busyMaxUs > Long.MAX_VALUE / WINDOW_BUSY_MAXES ? Long.MAX_VALUE : busyMaxUs * WINDOW_BUSY_MAXES;
            synchronized (firsts) {
                Long first = firsts.get(requester);
                if (first != null) {
                    if (nowUs - first < window) return nowUs - first < busyMaxUs;
                    firsts.put(requester, nowUs);
                    return busyMaxUs > 0;
                }
                if (firsts.size() >= BUSY_REQUESTERS_MAX) {
                    firsts.values().removeIf(f -> nowUs - f >= window);
                    // Still full: every window is live, and a flood of
                    // distinct keys must not make room by evicting them.
                    if (firsts.size() >= BUSY_REQUESTERS_MAX) return false;
                }
                firsts.put(requester, nowUs);
                return busyMaxUs > 0;
            }
        }

        int size() {
            synchronized (firsts) {
                return firsts.size();
            }
        }
    }

    /**
     * Per requester key, when a success was last reported for it through
     * this client (µs, the same monotonic clock as {@link Windows}). Only a
     * requester known this way may leave busy once its window's busy_max is
     * spent: she has logged in from this address before, while a guesser's
     * other addresses have not, and a late guess that failed open would be
     * admitted with no check at all. Bounded by {@link #KNOWN_REQUESTERS_MAX}.
     */
    static final class Known {
        /** Requesters kept; past it the expired ones go, then the oldest. */
        static final int KNOWN_REQUESTERS_MAX = 65536;
        /** A success is remembered this long (30 days, in µs). */
        static final long KNOWN_FOR_US = 30L * 24 * 60 * 60 * 1_000_000;

        private final Map<String, Long> lasts = new HashMap<>();

        /** Records a success reported for the requester at {@code nowUs}. */
        void succeeded(String requester, long nowUs) {
            synchronized (lasts) {
                // An update needs no room.
                if (lasts.size() >= KNOWN_REQUESTERS_MAX && !lasts.containsKey(requester)) {
                    lasts.values().removeIf(t -> nowUs - t >= KNOWN_FOR_US);
                    if (lasts.size() >= KNOWN_REQUESTERS_MAX) {
                        // Still full: the least recent success makes room
                        // (one scan; rare, as it takes 65536 users a month).
                        String oldest = null;
                        long oldestAt = Long.MAX_VALUE;
                        for (Map.Entry<String, Long> e : lasts.entrySet()) {
                            if (oldest == null || e.getValue() < oldestAt) {
                                oldest = e.getKey();
                                oldestAt = e.getValue();
                            }
                        }
                        lasts.remove(oldest);
                    }
                }
                lasts.put(requester, nowUs);
            }
        }

        /** Whether a success was reported for the requester less than {@link #KNOWN_FOR_US} before {@code nowUs}. */
        boolean known(String requester, long nowUs) {
            synchronized (lasts) {
                Long last = lasts.get(requester);
                return last != null && nowUs - last < KNOWN_FOR_US;
            }
        }

        int size() {
            synchronized (lasts) {
                return lasts.size();
            }
        }
    }
}
