package dev.tollgate.client;

import java.net.InetAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;

/** What needs no daemon: X-Forwarded-For, the GCRA, bursts, answers, fail policies against a dead socket. */
final class LogicTests {
    private LogicTests() {
    }

    static void run() throws Exception {
        forwardedTail();
        gcra();
        bursts();
        ownBursts();
        requesterKeys();
        busyWindows();
        knownRequesters();
        answers();
        deadSocket();
    }

    private static void forwardedTail() {
        Expect.group("forwarded_tail");
        Expect.equal("203.0.113.9, 10.0.0.1", ForwardedFor.tail("203.0.113.9, 10.0.0.1"), "a short header is whole");
        String exact = "1".repeat(4096);
        Expect.equal(exact, ForwardedFor.tail(exact), "4096 bytes is whole");
        // 5000 bytes: the window starts at byte 904; a comma at 903 (just before it) keeps the window whole.
        String entries = "x".repeat(903) + "," + "y".repeat(4096);
        Expect.equal("y".repeat(4096), ForwardedFor.tail(entries), "a comma right before the window");
        String later = "x".repeat(1000) + ",10.0.0.1, " + "z".repeat(4000);
        Expect.equal("10.0.0.1, " + "z".repeat(4000), ForwardedFor.tail(later), "the first comma inside the window");
        Expect.equal("", ForwardedFor.tail("w".repeat(5000)), "one entry longer than the window");
        // Counted in UTF-8 bytes, not characters: 2100 two-byte characters are 4200 bytes.
        String wide = "é".repeat(2100) + ",1.2.3.4";
        Expect.equal("1.2.3.4", ForwardedFor.tail(wide), "the window counts bytes");
        Expect.equal("é".repeat(2000) + ",1.2.3.4", ForwardedFor.tail("é".repeat(2000) + ",1.2.3.4"), "4008 bytes are whole");
        int tailBytes = ForwardedFor.tail(later + "," + "q".repeat(100)).getBytes(StandardCharsets.UTF_8).length;
        Expect.that(tailBytes <= ForwardedFor.BYTES_MAX, "the tail fits the window");
        Subject s = Subject.EMPTY.withForwardedFor("w".repeat(5000));
        Expect.equal("", s.bounded().forwardedFor(), "a subject sends only the tail");
    }

    private static void gcra() {
        Expect.group("GCRA static budget");
        long second = 1_000_000;
        Gcra.Spec spec = Gcra.Spec.of(60, 60 * second, 3);
        long tat = -1;
        long now = 1_000 * second;
        for (long remaining : new long[] {2, 1, 0}) {
            Gcra.Decision d = Gcra.decide(spec, tat, now, true);
            Expect.that(d.allowed(), "burst allowed");
            Expect.equal(remaining, d.remaining(), "remaining");
            tat = d.tatAfterUs();
        }
        Gcra.Decision refused = Gcra.decide(spec, tat, now, true);
        Expect.that(!refused.allowed(), "past the burst: refused");
        Expect.equal(second, refused.retryAfterUs(), "retry after one interval");
        Expect.equal(tat, refused.tatAfterUs(), "a refusal spends nothing");
        Expect.that(Gcra.decide(spec, tat, now + second, true).allowed(), "one interval later: allowed");
        Gcra.Decision peek = Gcra.decide(spec, -1, now, false);
        Expect.that(peek.allowed() && peek.tatAfterUs() == now, "not spending leaves the TAT");
        Gcra.Spec huge = Gcra.Spec.of(1, Long.MAX_VALUE / 2, Integer.MAX_VALUE);
        Expect.that(Gcra.decide(huge, -1, 1, true).allowed(), "a saturating tolerance still allows");
    }

    private static void bursts() throws Exception {
        Expect.group("bursts");
        Bursts bursts = new Bursts();
        Subject alice = Subject.EMPTY.withAccount("alice");
        Subject erin = Subject.EMPTY.withAccount("erin");
        Bursts.Guard first = bursts.enter("login", alice);
        Expect.that(!first.inBurst(), "alone at first");
        Bursts.Guard lone = bursts.enter("login", erin);
        Bursts.Guard second = bursts.enter("login", alice);
        Expect.that(first.inBurst() && second.inBurst(), "overlapping on alice");
        Expect.that(!lone.inBurst(), "erin is alone on hers");
        first.close();
        second.close();
        lone.close();
        Bursts.Guard straggler = bursts.enter("login", alice);
        Expect.that(straggler.inBurst(), "started just after the burst");
        straggler.close();
        Thread.sleep(Bursts.BURST_GAP_US / 1000 + 10);
        Bursts.Guard later = bursts.enter("login", erin);
        Expect.that(!later.inBurst(), "erin's next try, a moment later, is alone");
        later.close();
        Subject byPeer = Subject.of(InetAddress.getByName("192.0.2.1"), null);
        Bursts.Guard p1 = bursts.enter("login", byPeer);
        Bursts.Guard p2 = bursts.enter("login", byPeer);
        Expect.that(p1.inBurst(), "without an account, the address is the key");
        p1.close();
        p2.close();
        Bursts.Guard other = bursts.enter("reauth", alice);
        Expect.that(!other.inBurst(), "another route is another key");
        other.close();
        Bursts many = new Bursts();
        for (int n = 0; n < Bursts.SWEEP_AT; n++) many.enter("login", Subject.EMPTY.withAccount("a" + n)).close();
        Thread.sleep(Bursts.BURST_GAP_US / 1000 + 10);
        many.enter("login", Subject.EMPTY.withAccount("new")).close();
        Expect.equal(1, many.size(), "ended entries are swept past the bound");
    }

    private static void ownBursts() throws Exception {
        Expect.group("own bursts");
        Bursts bursts = new Bursts();
        InetAddress a = InetAddress.getByName("192.0.2.1");
        InetAddress b = InetAddress.getByName("192.0.2.2");
        Bursts.Guard first = bursts.enter("login", Subject.of(a, "alice"));
        Expect.that(!first.inBurst() && !first.ownBurst(), "alone at first");
        Bursts.Guard second = bursts.enter("login", Subject.of(a, "alice"));
        Expect.that(first.inBurst() && second.inBurst(), "one account and address: a burst");
        Expect.that(first.ownBurst() && second.ownBurst(), "one account and address: each the other's own burst");
        Expect.equal(2, bursts.size(), "a burst key and a requester key");
        first.close();
        second.close();
        Thread.sleep(Bursts.BURST_GAP_US / 1000 + 10);
        Bursts.Guard mine = bursts.enter("login", Subject.of(a, "alice"));
        Bursts.Guard theirs = bursts.enter("login", Subject.of(b, "alice"));
        Expect.that(mine.inBurst() && theirs.inBurst(), "one account, two addresses: a burst");
        Expect.that(!mine.ownBurst() && !theirs.ownBurst(), "one account, two addresses: neither's own");
        mine.close();
        theirs.close();
        Thread.sleep(Bursts.BURST_GAP_US / 1000 + 10);
        Bursts.Guard p1 = bursts.enter("login", Subject.of(b, null));
        Bursts.Guard p2 = bursts.enter("login", Subject.of(b, null));
        Expect.that(p1.ownBurst() && p2.ownBurst(), "without an account, keyed on the address: own with another on it");
        Expect.equal(p1.requester(), Bursts.burstKey("login", Subject.of(b, null)), "without an account the requester is the burst key");
        p1.close();
        p2.close();
        Thread.sleep(Bursts.BURST_GAP_US / 1000 + 10);
        Bursts.Guard lone = bursts.enter("login", Subject.of(b, null));
        Expect.that(!lone.ownBurst() && !lone.inBurst(), "entered once, not counted twice: alone");
        lone.close();
        Bursts.Guard onlyAccount = bursts.enter("login", Subject.EMPTY.withAccount("erin"));
        Expect.that(!onlyAccount.ownBurst(), "an account without an address, alone");
        onlyAccount.close();
        Subject both = Subject.of(a, "alice");
        Expect.that(!Bursts.requesterKey("login", both).equals(Bursts.requesterKey("reauth", both)), "another route is another requester");
        Thread.sleep(Bursts.BURST_GAP_US / 1000 + 10);
        // Behind a proxy every user has its address: X-Forwarded-For tells them apart.
        Bursts.Guard herXff = bursts.enter("login", both.withForwardedFor("203.0.113.9"));
        Bursts.Guard hisXff = bursts.enter("login", both.withForwardedFor("198.51.100.20"));
        Expect.that(herXff.inBurst() && hisXff.inBurst(), "one account behind one proxy: a burst");
        Expect.that(!herXff.ownBurst() && !hisXff.ownBurst(), "two X-Forwarded-For values: neither's own");
        herXff.close();
        hisXff.close();
        Thread.sleep(Bursts.BURST_GAP_US / 1000 + 10);
        Subject onlyXff = Subject.EMPTY.withAccount("alice").withForwardedFor("203.0.113.9");
        Bursts.Guard x1 = bursts.enter("login", onlyXff);
        Bursts.Guard x2 = bursts.enter("login", onlyXff);
        Expect.that(x1.ownBurst() && x2.ownBurst(), "an account and X-Forwarded-For without an address: own with its twin");
        Expect.that(!x1.requester().equals(Bursts.burstKey("login", onlyXff)), "an account and X-Forwarded-For: a requester of its own");
        x1.close();
        x2.close();
        Bursts many = new Bursts();
        // Two entries a check: filled to the bound whatever a slow loop swept on the way.
        for (int n = 0; many.size() < Bursts.SWEEP_AT; n++) many.enter("login", Subject.of(a, "a" + n)).close();
        Thread.sleep(Bursts.BURST_GAP_US / 1000 + 10);
        many.enter("login", Subject.of(a, "new")).close();
        Expect.equal(2, many.size(), "ended requester entries are swept too");
    }

    private static void busyWindows() {
        Expect.group("busy windows");
        long busyMax = 10_000;
        long window = 120 * busyMax;
        Bursts.Windows windows = new Bursts.Windows();
        long t0 = 5_000_000;
        Expect.that(windows.excused("r", t0, busyMax), "the first refusal is excused");
        Expect.that(windows.excused("r", t0 + busyMax - 1, busyMax), "excused just before busy_max");
        Expect.that(!windows.excused("r", t0 + busyMax, busyMax), "not excused at busy_max");
        Expect.that(!windows.excused("r", t0 + window - 1, busyMax), "nor later in the window");
        Expect.that(windows.excused("s", t0 + busyMax, busyMax), "another requester has its own window");
        Expect.that(windows.excused("r", t0 + window, busyMax), "excused again once the window has ended");
        Expect.that(windows.excused("r", t0 + window + busyMax - 1, busyMax), "the new window counts from then");
        Expect.that(!windows.excused("r", t0 + window + busyMax, busyMax), "and ends its busy_max the same way");
        Bursts.Windows none = new Bursts.Windows();
        Expect.that(!none.excused("r", t0, 0), "busy_max 0: never excused");
        Expect.that(!none.excused("r", t0, 0), "busy_max 0: nor again");
        Bursts.Windows full = new Bursts.Windows();
        for (int n = 0; n < Bursts.Windows.BUSY_REQUESTERS_MAX; n++) full.excused("r" + n, t0 + n, busyMax);
        Expect.equal(Bursts.Windows.BUSY_REQUESTERS_MAX, full.size(), "filled");
        long lastStart = t0 + Bursts.Windows.BUSY_REQUESTERS_MAX - 1;
        Expect.that(!full.excused("new", lastStart + busyMax, busyMax), "full of live windows: a new requester is not excused");
        Expect.equal(Bursts.Windows.BUSY_REQUESTERS_MAX, full.size(), "no live window evicted");
        Expect.that(full.excused("r0", t0 + busyMax - 1, busyMax), "a known requester still has its window");
        Expect.that(full.excused("new", lastStart + window, busyMax), "once they have ended: excused");
        Expect.equal(1, full.size(), "the ended windows dropped");
    }

    private static void requesterKeys() throws Exception {
        Expect.group("requester keys");
        InetAddress p5 = InetAddress.getByName("192.0.2.5");
        InetAddress p92 = InetAddress.getByName("92.0.2.5");
        InetAddress a = InetAddress.getByName("192.0.2.1");
        Expect.that(!Bursts.requesterKey("login", Subject.of(p5, "bob")).equals(Bursts.requesterKey("login", Subject.of(p92, "bob1"))),
                "account bob + peer 192.0.2.5 is not account bob1 + peer 92.0.2.5");
        Subject ab = Subject.of(a, "bc").withTenant("a");
        Subject abc = Subject.of(a, "c").withTenant("ab");
        Expect.that(!Bursts.requesterKey("login", ab).equals(Bursts.requesterKey("login", abc)),
                "tenant a + account bc is not tenant ab + account c");
        Expect.that(!Bursts.accountKey("login", ab).equals(Bursts.accountKey("login", abc)),
                "nor is its account key");
        Subject xffAcc = Subject.of(a, "x").withForwardedFor("y");
        Subject accXff = Subject.of(a, "x|y").withForwardedFor(null);
        Expect.that(!Bursts.requesterKey("login", xffAcc).equals(Bursts.requesterKey("login", accXff)),
                "a separator in the account moves no boundary");
        Subject t1 = Subject.of(a, "alice").withTenant("t1");
        Subject t2 = Subject.of(a, "alice").withTenant("t2");
        Subject untenanted = Subject.of(a, "alice");
        Subject emptyTenant = Subject.of(a, "alice").withTenant("");
        Expect.that(!Bursts.requesterKey("login", t1).equals(Bursts.requesterKey("login", t2)), "one account in two tenants: two requesters");
        Expect.that(!Bursts.requesterKey("login", untenanted).equals(Bursts.requesterKey("login", emptyTenant)),
                "no tenant and an empty tenant: two requesters");
        Expect.that(!Bursts.accountKey("login", t1).equals(Bursts.accountKey("login", t2)), "one account in two tenants: two accounts");
        Expect.equal(Bursts.burstKey("login", t1), Bursts.burstKey("login", t2), "the burst key has no tenant");
        Subject f1 = Subject.of(a, "alice").withForwardedFor("203.0.113.9");
        Subject f2 = Subject.of(a, "alice").withForwardedFor("203.0.113.10");
        Subject fEmpty = Subject.of(a, "alice").withForwardedFor("");
        Subject fNone = Subject.of(a, "alice");
        Expect.that(!Bursts.requesterKey("login", f1).equals(Bursts.requesterKey("login", f2)),
                "one account and address, two X-Forwarded-For values: two requesters");
        Expect.that(!Bursts.requesterKey("login", fNone).equals(Bursts.requesterKey("login", fEmpty)),
                "no X-Forwarded-For and an empty one: two requesters");
        Expect.equal(Bursts.accountKey("login", f1), Bursts.accountKey("login", f2), "one account whatever the addresses");
        Expect.equal(Bursts.burstKey("login", Subject.EMPTY.withAccount("alice")),
                Bursts.requesterKey("login", Subject.EMPTY.withAccount("alice").withTenant("t")),
                "an account with neither address nor X-Forwarded-For: the burst key");
        Subject xffOnly = Subject.EMPTY.withForwardedFor("203.0.113.9");
        Expect.equal(Bursts.burstKey("login", xffOnly), Bursts.requesterKey("login", xffOnly), "no account: the burst key");
    }

    private static void knownRequesters() {
        Expect.group("known requesters");
        long day = 24L * 60 * 60 * 1_000_000;
        long forUs = Bursts.Known.KNOWN_FOR_US;
        Expect.equal(30 * day, forUs, "known for 30 days");
        Bursts.Known known = new Bursts.Known();
        long t0 = 7_000_000;
        Expect.that(!known.known("r", t0), "unknown: not known");
        known.succeeded("r", "A", t0);
        Expect.that(known.known("r", t0), "after a success: known");
        Expect.that(known.known("r", t0 + forUs - 1), "known just before KNOWN_FOR");
        Expect.that(!known.known("r", t0 + forUs), "not known at KNOWN_FOR");
        Expect.that(!known.known("s", t0), "another requester is not known by it");
        known.succeeded("r", "A", t0 + forUs);
        Expect.that(known.known("r", t0 + 2 * forUs - 1), "a new success counts from then");
        int max = Bursts.Known.KNOWN_REQUESTERS_MAX;
        Bursts.Known full = new Bursts.Known();
        // One account each: only the global cap applies.
        for (int n = 0; n < max; n++) full.succeeded("r" + n, "a" + n, t0 + n);
        Expect.equal(max, full.size(), "filled");
        long last = t0 + max - 1;
        full.succeeded("r5", "a5", last + 1);
        Expect.equal(max, full.size(), "an update of an existing entry needs no room");
        Expect.that(full.known("r0", last + 1), "and evicts nothing");
        full.succeeded("new", "anew", last + 2);
        Expect.equal(max, full.size(), "still bounded");
        Expect.that(full.known("new", last + 2), "a new success is known");
        Expect.that(!full.known("r0", last + 2), "it evicted the least recent");
        Expect.that(full.known("r1", last + 2) && full.known("r5", last + 2), "and only it");
        Expect.equal(max, full.accounts(), "its account went with it");
        full.succeeded("newer", "anewer", last + 3);
        Expect.that(!full.known("r1", last + 3) && full.known("r2", last + 3), "the next least recent goes next");
        full.succeeded("r2", "a2", last + 4);
        full.succeeded("newest", "anewest", last + 5);
        Expect.that(full.known("r2", last + 5), "an update made r2 recent again: it survives");
        Expect.that(!full.known("r3", last + 5) && full.known("r4", last + 5), "the least recent after it goes instead");
        Expect.that(full.known("r5", last + 5), "an updated entry is not the least recent any more");
        Bursts.Known expiring = new Bursts.Known();
        for (int n = 0; n < max; n++) expiring.succeeded("r" + n, "a" + n, n < 3 ? t0 : t0 + forUs);
        expiring.succeeded("new", "anew", t0 + forUs + 10);
        Expect.equal(max, expiring.size(), "full: one entry makes room");
        Expect.that(!expiring.known("r0", t0 + forUs + 10) && expiring.known("r3", t0 + forUs + 10)
                && expiring.known("new", t0 + forUs + 10), "the least recent (here expired) goes, nothing live");

        Expect.group("known requesters: per account");
        int perAccount = Bursts.Known.KNOWN_PER_ACCOUNT_MAX;
        Expect.equal(16, perAccount, "16 requesters per account");
        Bursts.Known accounts = new Bursts.Known();
        accounts.succeeded("erin@1", "erin", t0);
        for (int n = 0; n <= perAccount; n++) accounts.succeeded("alice@" + n, "alice", t0 + 1 + n);
        Expect.that(!accounts.known("alice@0", t0 + 100), "17 addresses on one account: the first is forgotten");
        Expect.that(accounts.known("alice@1", t0 + 100) && accounts.known("alice@" + perAccount, t0 + 100), "the other 16 are kept");
        Expect.that(accounts.known("erin@1", t0 + 100), "another account's older entry is not evicted");
        Expect.equal(perAccount + 1, accounts.size(), "16 of alice's and erin's");
        accounts.succeeded("alice@1", "alice", t0 + 200);
        accounts.succeeded("alice@new", "alice", t0 + 201);
        Expect.that(accounts.known("alice@1", t0 + 300), "an update made alice@1 her most recent: it survives");
        Expect.that(!accounts.known("alice@2", t0 + 300), "her least recent goes instead");
        Expect.equal(perAccount + 1, accounts.size(), "still 16 of alice's");
    }

    private static Verdict verdict(Decision decision, long retryAfterMs, long delayMs) {
        return new Verdict(decision, retryAfterMs, delayMs, 5, 0, 0, Reason.ALLOWED, "r", false, 5);
    }

    private static void answers() {
        Expect.group("answers");
        Answer allow = new Answer.Decided(verdict(Decision.ALLOW, 0, 0));
        Answer delay = new Answer.Decided(verdict(Decision.DELAY, 2000, 1500));
        Answer challenge = new Answer.Decided(verdict(Decision.CHALLENGE, 1, 0));
        Answer deny = new Answer.Decided(verdict(Decision.DENY, 899251, 0));
        Expect.that(allow.proceeds() && delay.proceeds(), "allow and delay proceed");
        Expect.that(!challenge.proceeds() && !deny.proceeds(), "challenge and deny do not");
        Expect.equal(Duration.ofMillis(1500), delay.delay().orElse(null), "delay() of a delay");
        Expect.that(allow.delay().isEmpty(), "no delay for an allow");
        Expect.equal(900L, deny.retryAfterSecs(), "retry_after rounded up");
        Expect.equal(1L, challenge.retryAfterSecs(), "at least 1");
        Expect.equal(1L, allow.retryAfterSecs(), "1 for 0 ms");
        Expect.equal(2L, delay.retryAfterSecs(), "2000 ms is 2 s");
        Answer rejected = new Answer.Rejected(new ErrorReply(ErrorCode.FIELD_TOO_LONG, "too long"));
        Expect.that(!rejected.proceeds(), "a rejected request never proceeds");
        Expect.equal(1L, rejected.retryAfterSecs(), "1 without a verdict");
        ClientError busy = new ClientError(ClientError.Kind.BUSY, "");
        Expect.that(!new Answer.Unavailable(FailPolicy.OPEN, busy, false).proceeds(), "busy never proceeds, even open");
        ClientError timeout = new ClientError(ClientError.Kind.TIMEOUT, "");
        Expect.that(new Answer.Unavailable(FailPolicy.OPEN, timeout, false).proceeds(), "open proceeds");
        Expect.that(!new Answer.Unavailable(FailPolicy.CLOSED, timeout, false).proceeds(), "closed refuses");
        Expect.that(new Answer.Unavailable(FailPolicy.CLOSED, timeout, true).proceeds(), "closed within budget proceeds");
    }

    private static void deadSocket() throws Exception {
        Expect.group("fail policies against a dead socket");
        Path dir = Files.createTempDirectory("tollgate-dead");
        try {
            Subject subject = Subject.of(InetAddress.getByName("198.51.100.7"), "alice");
            ClientConfig config = ClientConfig.of(dir.resolve("none.sock"))
                    .failPolicy("reauth", FailPolicy.CLOSED)
                    .failPolicy("token", FailPolicy.OPEN)
                    .staticBudget("registration", 2, Duration.ofHours(1), 2);
            try (Client client = new Client(config)) {
                Answer login = client.check("login", subject);
                Expect.that(login instanceof Answer.Unavailable u && u.policy() == FailPolicy.OPEN
                        && u.error().kind() == ClientError.Kind.CONNECT && !u.withinStaticBudget(), "login: open, connect: " + login);
                Expect.that(login.proceeds(), "login proceeds");
                Expect.that(!client.check("password_reset", subject).proceeds(), "password_reset does not");
                for (String route : new String[] {"request", "mfa_verify", "mfa_resend", "registration"}) {
                    Expect.equal(FailPolicy.OPEN, ((Answer.Unavailable) client.check(route + "x", subject)).policy(),
                            "an unknown route is open");
                    Expect.equal(FailPolicy.CLOSED, client.config().failPolicy(route), route + " is closed");
                }
                Expect.that(!client.check("reauth", subject).proceeds(), "reauth overridden closed");
                Expect.that(client.check("token", subject).proceeds(), "token overridden open");
                // The static budget: reports read it, only checks spend it.
                Expect.that(client.report("registration", subject, Outcome.FAILURE).proceeds(), "a report reads the budget");
                Expect.that(client.check("registration", subject).proceeds(), "first check within the budget");
                Expect.that(client.report("registration", subject, Outcome.SUCCESS).proceeds(), "a report does not spend");
                Expect.that(client.check("registration", subject).proceeds(), "second check within the budget");
                Answer third = client.check("registration", subject);
                Expect.that(!third.proceeds() && !((Answer.Unavailable) third).withinStaticBudget(), "the budget is spent");
                // The guard: nothing to abandon without an answer.
                try (Attempt attempt = client.begin("login", subject)) {
                    Expect.that(attempt.proceeds(), "the guard proceeds open");
                    Expect.that(attempt.abandon().isEmpty(), "an unanswered check is never abandoned");
                }
                Attempt closed = client.begin("password_reset", subject);
                Expect.that(!closed.proceeds(), "the guard refuses closed");
                closed.close();
                Expect.equal(0, client.pooled(), "no connection kept");
            }
        } finally {
            Files.deleteIfExists(dir);
        }
    }
}
