package dev.tollgate.client;

import java.util.ArrayDeque;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Which checks of this client are in a burst, as the Rust client's
 * burst.rs: a timeout from a busy daemon stops a login only when another
 * check on the same account (or, without one, the same address) waited on
 * this client at the same time, or started less than {@link #BURST_GAP_US}
 * before it. A lone user's timeout during a flood on other accounts is an
 * outage for the fail policy, not a refusal.
 *
 * <p>Each check is also counted under its requester (the route, the tenant,
 * the account, the address and the X-Forwarded-For header together; without
 * an account, or with neither address nor header, the burst key itself), so
 * that a burst of one's own can be told from one made by others, also behind
 * a reverse proxy whose address all its users share. Parallel checks on
 * one account from one address are a guesser's: refused as busy for as long
 * as they last. A user who has logged in from her address through this
 * client ({@link Known}) is refused as busy in others' bursts on her account
 * (their checks come from other addresses) for at most busy_max in a window
 * of 120 x busy_max ({@link Windows}), so nobody can keep her out by checking
 * her account; past that her timeout follows the fail policy. Anyone else in
 * a burst on the account (a guesser's other addresses, a botnet) stays busy
 * however long it lasts: a late guess that failed open would be admitted
 * with no check at all. Known requesters are kept at most 16 per account, so
 * nobody logging in to his own accounts can push the users out.
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
     * The requester key: the route, the tenant, the account, the address
     * and the X-Forwarded-For header (as sent) when the subject has an
     * account and an address or a header (a tag of its own, so it never
     * equals a burst key); otherwise the burst key, which then names the
     * requester as well as anything can. Behind a reverse proxy the address
     * is the proxy's: the header tells its users apart, or an attacker's
     * checks on her account would be her own burst. The same account name
     * in another tenant is another requester. Each field is length-prefixed
     * (absent and empty told apart), so no two subjects share a key by
     * moving a boundary.
     */
    static String requesterKey(String route, Subject subject) {
        if (subject.account() != null && (subject.peer() != null || subject.forwardedFor() != null)) {
            StringBuilder key = new StringBuilder("3");
            field(key, route);
            field(key, subject.tenant());
            field(key, subject.account());
            field(key, subject.peer() == null ? null : subject.peer().getHostAddress());
            field(key, subject.forwardedFor());
            return key.toString();
        }
        return burstKey(route, subject);
    }

    /**
     * The account key of a known requester: the route, the tenant and the
     * account (tagged and length-prefixed like the requester key). Without
     * an account, the requester key itself: such a requester shares its
     * place with no other.
     */
    static String accountKey(String route, Subject subject) {
        if (subject.account() == null) return requesterKey(route, subject);
        StringBuilder key = new StringBuilder("4");
        field(key, route);
        field(key, subject.tenant());
        field(key, subject.account());
        return key.toString();
    }

    /** Appends one field: "|-" when absent, else "|", its length in chars, ":" and itself. */
    private static void field(StringBuilder key, String value) {
        if (value == null) {
            key.append("|-");
        } else {
            key.append('|').append(value.length()).append(':').append(value);
        }
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
         * requester (route, tenant, account, address and X-Forwarded-For) waited while it did, or
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
     * admitted with no check at all.
     *
     * <p>Bounded by {@link #KNOWN_PER_ACCOUNT_MAX} requesters per account
     * and {@link #KNOWN_REQUESTERS_MAX} in all, the least recently succeeded
     * going first. Were it evicted oldest-first over the whole map only, an
     * attacker logging in to his own account from fresh addresses could
     * push every user out with 65,536 logins, and each eviction scanned the
     * whole map under the lock; capped per account he needs 4,096 accounts
     * of his own, and eviction takes constant time (a recency-ordered map,
     * and per account a list of at most 16).
     */
    static final class Known {
        /** Requesters kept in all; past it the least recently succeeded goes. */
        static final int KNOWN_REQUESTERS_MAX = 65536;
        /** Requesters kept per account; past it the account's least recently succeeded goes. */
        static final int KNOWN_PER_ACCOUNT_MAX = 16;
        /** A success is remembered this long (30 days, in µs). */
        static final long KNOWN_FOR_US = 30L * 24 * 60 * 60 * 1_000_000;

        private record Last(String accountKey, long atUs) {
        }

        /** In insertion order, kept as recency order by removing before putting again: the first is the least recent. */
        private final LinkedHashMap<String, Last> lasts = new LinkedHashMap<>();
        /** Per account key, its requesters, least recent first (at most KNOWN_PER_ACCOUNT_MAX). */
        private final Map<String, ArrayDeque<String>> byAccount = new HashMap<>();

        /** Records a success reported for the requester, of the account {@code accountKey}, at {@code nowUs}. */
        void succeeded(String requester, String accountKey, long nowUs) {
            synchronized (lasts) {
                Last present = lasts.remove(requester);
                if (present != null) {
                    // An update needs no room: it becomes the most recent,
                    // in all and within its account.
                    lasts.put(requester, new Last(present.accountKey(), nowUs));
                    ArrayDeque<String> mine = byAccount.get(present.accountKey());
                    mine.remove(requester);
                    mine.addLast(requester);
                    return;
                }
                ArrayDeque<String> mine = byAccount.get(accountKey);
                if (mine != null && mine.size() >= KNOWN_PER_ACCOUNT_MAX) {
                    lasts.remove(mine.pollFirst());
                }
                if (lasts.size() >= KNOWN_REQUESTERS_MAX) {
                    Iterator<Map.Entry<String, Last>> first = lasts.entrySet().iterator();
                    Map.Entry<String, Last> oldest = first.next();
                    first.remove();
                    ArrayDeque<String> theirs = byAccount.get(oldest.getValue().accountKey());
                    theirs.remove(oldest.getKey());
                    if (theirs.isEmpty()) byAccount.remove(oldest.getValue().accountKey());
                }
                lasts.put(requester, new Last(accountKey, nowUs));
                byAccount.computeIfAbsent(accountKey, k -> new ArrayDeque<>()).addLast(requester);
            }
        }

        /** Whether a success was reported for the requester less than {@link #KNOWN_FOR_US} before {@code nowUs}. */
        boolean known(String requester, long nowUs) {
            synchronized (lasts) {
                Last last = lasts.get(requester);
                return last != null && nowUs - last.atUs() < KNOWN_FOR_US;
            }
        }

        int size() {
            synchronized (lasts) {
                return lasts.size();
            }
        }

        /** Accounts with a known requester now (for tests). */
        int accounts() {
            synchronized (lasts) {
                return byAccount.size();
            }
        }
    }
}
