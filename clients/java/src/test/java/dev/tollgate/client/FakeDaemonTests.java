package dev.tollgate.client;

import java.net.InetAddress;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.atomic.AtomicLong;

/** The call path against a scripted daemon: versions, deadlines, the busy rule, bad replies, the pool, the guard. */
final class FakeDaemonTests {
    private FakeDaemonTests() {
    }

    static Subject subject(String account) throws Exception {
        return Subject.of(InetAddress.getByName("198.51.100.7"), account);
    }

    static void run() throws Exception {
        stepDown();
        timeouts();
        busy();
        busyWhileAnsweringLate();
        silentAfterAnsweringLate();
        busyAfterAQuietGapWhileAnsweringLate();
        lateListenersCapped();
        busyFromOtherAddresses();
        busyBehindAProxy();
        knownThroughTheClient();
        badReplies();
        pool();
        guard();
        guardKeepsTheTag();
        replyPastTheDeadline();
    }

    private static void stepDown() throws Exception {
        Expect.group("version step-down");
        try (FakeDaemon daemon = new FakeDaemon(FakeDaemon.speaking(1));
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofSeconds(2)))) {
            byte[] tag = new byte[16];
            Answer first = client.check("login", subject("alice"), tag);
            Expect.equal(1, first.verdict().map(Verdict::version).orElse(-1), "answered in version 1: " + first);
            List<Integer> versions = daemon.frames.stream().map(FakeDaemon.Frame::version).toList();
            Expect.equal(List.of(5, 4, 3, 2, 1), versions, "one step at a time");
            byte[] v1 = Codec.encode(1, daemon.frames.get(4).id(), Request.check("login", subject("alice"), null));
            Expect.equal(v1, daemon.frames.get(4).whole(), "the tag is dropped below version 3");
            daemon.frames.clear();
            client.check("login", subject("alice"), tag);
            Expect.equal(List.of(1), daemon.frames.stream().map(FakeDaemon.Frame::version).toList(), "the connection keeps version 1");
            Answer abandon = client.abandon("login", subject("alice"));
            Expect.that(abandon instanceof Answer.Rejected r && r.error().code() == ErrorCode.MALFORMED,
                    "an abandon below version 5 goes out and is refused malformed: " + abandon);
            Expect.equal(1, daemon.connections.get(), "all on one connection");
        }
        try (FakeDaemon daemon = new FakeDaemon(FakeDaemon.speaking(4));
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofSeconds(2)).protocolVersion(3))) {
            Answer a = client.check("login", subject("alice"), new byte[16]);
            Expect.equal(3, a.verdict().map(Verdict::version).orElse(-1), "a configured version is the first sent");
            Expect.equal(List.of(3), daemon.frames.stream().map(FakeDaemon.Frame::version).toList(), "no step needed");
            Answer abandon = client.abandon("login", subject("alice"));
            Expect.that(abandon instanceof Answer.Rejected r && r.error().code() == ErrorCode.MALFORMED, "version 3 abandon: malformed");
        }
        try {
            ClientConfig.of("/x").protocolVersion(6);
            Expect.that(false, "version 6 is refused");
        } catch (IllegalArgumentException e) {
            Expect.that(true, "version 6 is refused");
        }
    }

    private static void timeouts() throws Exception {
        Expect.group("deadline");
        try (FakeDaemon daemon = new FakeDaemon(f -> null);
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofMillis(30)))) {
            long started = System.nanoTime();
            Answer login = client.check("login", subject("alice"));
            long tookMs = (System.nanoTime() - started) / 1_000_000;
            Expect.that(login instanceof Answer.Unavailable u && u.error().kind() == ClientError.Kind.TIMEOUT, "a silent daemon: timeout " + login);
            Expect.that(tookMs >= 29 && tookMs < 2000, "within the deadline (" + tookMs + " ms)");
            Expect.that(login.proceeds(), "login fails open");
            Expect.that(!client.check("password_reset", subject("alice")).proceeds(), "password_reset fails closed");
            Expect.equal(0, client.pooled(), "a timed-out connection is closed, not pooled");
            Expect.equal(2, daemon.connections.get(), "each call opened its own");
        }
        try (Client client = new Client(ClientConfig.of("/nonexistent/t.sock"))) {
            Answer a = client.check("login", subject("alice"));
            Expect.that(a instanceof Answer.Unavailable u && u.error().kind() == ClientError.Kind.CONNECT, "no socket: connect");
        }
    }

    private static List<Answer> together(Client client, List<Subject> subjects) throws Exception {
        Answer[] answers = new Answer[subjects.size()];
        CyclicBarrier start = new CyclicBarrier(subjects.size());
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < subjects.size(); i++) {
            int at = i;
            Thread t = new Thread(() -> {
                try {
                    start.await();
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
                answers[at] = client.check("login", subjects.get(at));
            });
            t.start();
            threads.add(t);
        }
        for (Thread t : threads) t.join();
        return List.of(answers);
    }

    static ClientError.Kind kind(Answer a) {
        return a instanceof Answer.Unavailable u ? u.error().kind() : null;
    }

    private static void busy() throws Exception {
        Expect.group("the busy rule");
        FakeDaemon.Handler answering = FakeDaemon.speaking(5);
        try (FakeDaemon daemon = new FakeDaemon(f -> null);
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofMillis(60)))) {
            List<Answer> never = together(client, List.of(subject("alice"), subject("alice")));
            Expect.that(never.stream().allMatch(a -> kind(a) == ClientError.Kind.TIMEOUT && a.proceeds()),
                    "a daemon never heard from is not busy: " + never);
        }
        try (FakeDaemon daemon = new FakeDaemon(answering);
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofMillis(60)).busyMax(Duration.ofMillis(400)))) {
            Expect.that(client.check("login", subject("warm")).verdict().isPresent(), "answered once");
            daemon.handler = f -> null;
            List<Answer> burst = together(client, List.of(subject("alice"), subject("alice")));
            Expect.that(burst.stream().allMatch(a -> kind(a) == ClientError.Kind.BUSY && !a.proceeds()),
                    "overlapping checks on one account, late: busy, refused even open: " + burst);
            Thread.sleep(Bursts.BURST_GAP_US / 1000 + 10);
            Answer lone = client.check("login", subject("erin"));
            Expect.that(kind(lone) == ClientError.Kind.TIMEOUT && lone.proceeds(), "a lone user's timeout is an outage: " + lone);
            Expect.that(burst.stream().allMatch(a -> ((Answer.Unavailable) a).error().message().endsWith(" (busy)")),
                    "a busy timeout says so: " + burst);
            Expect.that(lone instanceof Answer.Unavailable u && !u.error().message().contains("busy")
                            && u.error().message().equals("tollgate did not answer within 60 ms"),
                    "a timeout downgraded from busy has the plain timeout message: " + lone);
            Thread.sleep(400);
            List<Answer> old = together(client, List.of(subject("bob"), subject("bob")));
            Expect.that(old.stream().allMatch(a -> kind(a) == ClientError.Kind.TIMEOUT && a.proceeds()),
                    "late for longer than busy_max: the policy applies again: " + old);
        }
        // Bursts closer together than busy_max: the answer between them comes
        // too soon to end the run, which grows older than busy_max; a late
        // burst then must still not proceed.
        try (FakeDaemon daemon = new FakeDaemon(answering);
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofMillis(30)).busyMax(Duration.ofMillis(600)))) {
            client.check("login", subject("warm"));
            daemon.handler = f -> null;
            List<Answer> first = together(client, List.of(subject("alice"), subject("alice")));
            // The run began just before: timed from here, the late burst
            // meets a run older than busy_max however slow the start was.
            long started = System.nanoTime();
            Expect.that(first.stream().allMatch(a -> kind(a) == ClientError.Kind.BUSY), "a first burst: " + first);
            daemon.handler = answering;
            Thread.sleep(200);
            Expect.that(client.check("login", subject("bob")).verdict().isPresent(), "answered in time");
            Thread.sleep(Math.max(0, 650 - (System.nanoTime() - started) / 1_000_000));
            daemon.handler = f -> null;
            List<Answer> late = together(client, List.of(subject("alice"), subject("alice")));
            Expect.that(late.stream().allMatch(a -> kind(a) == ClientError.Kind.BUSY && !a.proceeds()),
                    "answered in time within busy_max, the run older: busy: " + late);
            Thread.sleep(650);
            List<Answer> gone = together(client, List.of(subject("alice"), subject("alice")));
            Expect.that(gone.stream().allMatch(a -> kind(a) == ClientError.Kind.TIMEOUT && a.proceeds()),
                    "nothing in time for busy_max: an outage: " + gone);
        }
        try (FakeDaemon daemon = new FakeDaemon(answering);
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofMillis(60)).busyMax(Duration.ZERO)
                        .staticBudget("registration", 10, Duration.ofHours(1), 10)
                        .failPolicy("registration", FailPolicy.CLOSED))) {
            client.check("login", subject("warm"));
            daemon.handler = f -> null;
            List<Answer> burst = together(client, List.of(subject("alice"), subject("alice")));
            Expect.that(burst.stream().allMatch(a -> kind(a) == ClientError.Kind.TIMEOUT), "busy_max 0: every timeout is an outage");
        }
    }

    private static long millisSince(long nanos) {
        return (System.nanoTime() - nanos) / 1_000_000;
    }

    /** Polls {@code condition} every 10 ms until it holds or {@code ms} have passed; whether it held. */
    private static boolean within(long ms, java.util.function.BooleanSupplier condition) throws InterruptedException {
        long started = System.nanoTime();
        while (!condition.getAsBoolean()) {
            if (millisSince(started) >= ms) return false;
            Thread.sleep(10);
        }
        return true;
    }

    /**
     * A daemon kept late for every call for longer than busy_max is alive:
     * it answers each call, just after the client's deadline. The client
     * hears those replies on the timed-out calls' connections, so a burst
     * then is busy, where the old rule (only answers in time counted) took
     * the old run for an outage and let the burst's logins proceed.
     */
    private static void busyWhileAnsweringLate() throws Exception {
        Expect.group("the busy rule: a daemon late for every call is busy");
        FakeDaemon.Handler answering = FakeDaemon.speaking(5);
        AtomicLong replied = new AtomicLong();
        FakeDaemon.Handler late = FakeDaemon.lateBy(80, answering, replied);
        long busyMaxMs = 400;
        // A late answer is not an answer in time: a daemon never answered
        // in time is not busy, however many late replies come.
        try (FakeDaemon daemon = new FakeDaemon(late);
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofMillis(30)).busyMax(Duration.ofMillis(busyMaxMs)))) {
            Answer first = client.check("login", subject("warm"));
            Expect.that(kind(first) == ClientError.Kind.TIMEOUT, "only ever late: a timeout: " + first);
            Expect.that(within(1000, () -> client.lateReplyHeardUs() != 0), "its late reply is heard");
            List<Answer> burst = together(client, List.of(subject("alice"), subject("alice")));
            Expect.that(burst.stream().allMatch(a -> kind(a) == ClientError.Kind.TIMEOUT && a.proceeds()),
                    "answered late but never in time: not busy, login proceeds: " + burst);
        }
        try (FakeDaemon daemon = new FakeDaemon(answering);
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofMillis(30)).busyMax(Duration.ofMillis(busyMaxMs)))) {
            Expect.that(client.check("login", subject("warm")).verdict().isPresent(), "answered once in time");
            daemon.handler = late;
            // Lone checks on other accounts, in turn, until the run of late
            // calls (begun at the first) is well past busy_max old and the
            // answer in time further still.
            long started = System.nanoTime();
            List<Answer> lone = new ArrayList<>();
            for (int n = 0; millisSince(started) < busyMaxMs + 150; n++) {
                lone.add(client.check("login", subject("user" + n)));
                Thread.sleep(Bursts.BURST_GAP_US / 1000 + 10);
            }
            Expect.that(lone.size() >= 3 && lone.stream().allMatch(a -> kind(a) == ClientError.Kind.TIMEOUT && a.proceeds()),
                    "each alone: a timeout, the policy applies: " + lone);
            Expect.that(client.lateReplyHeardUs() != 0, "their late replies were heard");
            List<Answer> burst = together(client, List.of(subject("alice"), subject("alice")));
            Expect.that(burst.stream().allMatch(a -> kind(a) == ClientError.Kind.BUSY && !a.proceeds()),
                    "late for every call for longer than busy_max, but answering: a burst is busy, refused even open: " + burst);
        }
    }

    /**
     * A late reply keeps the daemon busy for busy_max: a burst just after
     * the daemon stops answering at all is busy while its last late reply is
     * younger than busy_max, with the answer in time older (the run is young
     * again: the reply was heard after its last timeout). One silent for
     * longer than busy_max is down, and login fails open again.
     */
    private static void silentAfterAnsweringLate() throws Exception {
        Expect.group("the busy rule: silent after answering late");
        FakeDaemon.Handler answering = FakeDaemon.speaking(5);
        AtomicLong replied = new AtomicLong();
        long lateMs = 80;
        long busyMaxMs = 400;
        try (FakeDaemon daemon = new FakeDaemon(answering);
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofMillis(30)).busyMax(Duration.ofMillis(busyMaxMs)))) {
            Expect.that(client.check("login", subject("warm")).verdict().isPresent(), "answered once in time");
            daemon.handler = FakeDaemon.lateBy(lateMs, answering, replied);
            // Lone checks on other accounts, in turn, until the run of late
            // calls (begun at the first) and the answer in time are older
            // than busy_max: only the late replies heard can make the burst
            // below busy.
            long started = System.nanoTime();
            for (int n = 0; millisSince(started) < busyMaxMs + 50; n++) {
                client.check("login", subject("user" + n));
                Thread.sleep(Bursts.BURST_GAP_US / 1000 + 10);
            }
            Expect.that(client.lateReplyHeardUs() != 0, "late replies heard");
            daemon.handler = f -> null;
            List<Answer> justSilent = together(client, List.of(subject("alice"), subject("alice")));
            Expect.that(justSilent.stream().allMatch(a -> kind(a) == ClientError.Kind.BUSY && !a.proceeds()),
                    "silent, a late reply heard within busy_max: a burst is busy, refused even open: " + justSilent);
            // The replies still owed when it fell silent come within lateMs:
            // after that the last one's instant is final.
            Thread.sleep(lateMs + 50);
            long lastHeard = client.lateReplyHeardUs();
            // Silent calls for longer than busy_max: a daemon that answers
            // nothing makes one run of them, which grows old.
            long silentFrom = System.nanoTime();
            for (int n = 0; millisSince(silentFrom) < busyMaxMs + 150; n++) {
                client.check("login", subject("other" + n));
                Thread.sleep(Bursts.BURST_GAP_US / 1000 + 10);
            }
            Expect.equal(lastHeard, client.lateReplyHeardUs(), "a silent daemon's connections hear nothing");
            List<Answer> burst = together(client, List.of(subject("alice"), subject("alice")));
            Expect.that(burst.stream().allMatch(a -> kind(a) == ClientError.Kind.TIMEOUT && a.proceeds()),
                    "silent for longer than busy_max after late answers: an outage, login proceeds: " + burst);
        }
    }

    /**
     * Load that does not go through this client can keep the daemon late
     * while this client makes no calls for longer than busy_max. A burst then
     * times out before any late reply of its own is heard, with the run of
     * late calls, the answer in time and the last late reply all older than
     * busy_max. That late reply came after the run's last timeout, though:
     * the daemon was alive after that run, so the burst begins a new run and
     * is busy. Before, it was an outage and every guess in it proceeded.
     */
    private static void busyAfterAQuietGapWhileAnsweringLate() throws Exception {
        Expect.group("the busy rule: a burst after a quiet gap, the daemon late for every call");
        FakeDaemon.Handler answering = FakeDaemon.speaking(5);
        AtomicLong replied = new AtomicLong();
        long busyMaxMs = 400;
        try (FakeDaemon daemon = new FakeDaemon(answering);
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofMillis(30)).busyMax(Duration.ofMillis(busyMaxMs)))) {
            Expect.that(client.check("login", subject("warm")).verdict().isPresent(), "answered once in time");
            daemon.handler = FakeDaemon.lateBy(80, answering, replied);
            Answer lone = client.check("login", subject("lone"));
            Expect.that(kind(lone) == ClientError.Kind.TIMEOUT && lone.proceeds(), "a lone late check: a timeout, the policy applies: " + lone);
            Expect.that(within(1000, () -> client.lateReplyHeardUs() != 0), "its late reply is heard");
            // No calls at all until that reply is older than busy_max.
            Thread.sleep(busyMaxMs + 100);
            List<Answer> burst = together(client, List.of(subject("alice"), subject("alice")));
            Expect.that(burst.stream().allMatch(a -> kind(a) == ClientError.Kind.BUSY && !a.proceeds()),
                    "a late reply heard after the run's last timeout: a burst after a quiet gap is busy, refused even open: " + burst);
        }
    }

    /**
     * Each timed-out call's connection is listened on, but at most
     * LATE_LISTENERS_MAX at once (the rest are closed at once), without
     * delaying the calls; closing the client closes the listened ones.
     */
    private static void lateListenersCapped() throws Exception {
        Expect.group("late listeners: at most " + Client.LATE_LISTENERS_MAX + " at once");
        int calls = Client.LATE_LISTENERS_MAX + 8;
        try (FakeDaemon daemon = new FakeDaemon(f -> null);
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofMillis(30)).busyMax(Duration.ofSeconds(5)))) {
            List<Subject> subjects = new ArrayList<>();
            for (int n = 0; n < calls; n++) subjects.add(subject("user" + n));
            long started = System.nanoTime();
            List<Answer> answers = together(client, subjects);
            long tookMs = millisSince(started);
            Expect.that(answers.stream().allMatch(a -> kind(a) == ClientError.Kind.TIMEOUT),
                    "a silent daemon: every call a timeout: " + answers);
            Expect.that(tookMs < 2000, "listening for busy_max (5 s) delays no call: all returned in " + tookMs + " ms");
            // A loaded host may hand the last ones over a moment after their calls return.
            within(3000, () -> client.lateListeners() == Client.LATE_LISTENERS_MAX);
            Expect.equal(Client.LATE_LISTENERS_MAX, client.lateListeners(), "listeners at the cap");
            boolean settled = within(3000, () -> daemon.connections.get() == calls && daemon.live.get() <= Client.LATE_LISTENERS_MAX);
            Expect.that(settled, "the connections past the cap were closed at once: "
                    + daemon.connections.get() + " accepted, " + daemon.live.get() + " open");
            Thread.sleep(200);
            Expect.equal(Client.LATE_LISTENERS_MAX, daemon.live.get(), "and the cap's connections stay open, listened on");
            client.close();
            Expect.that(within(3000, () -> daemon.live.get() == 0 && client.lateListeners() == 0),
                    "closing the client closes them: " + daemon.live.get() + " open, " + client.lateListeners() + " listeners");
        }
    }

    /**
     * Checks on one account from other addresses are a burst on it, but
     * not the requester's own: a requester with a success reported through
     * the client is busy for at most busy_max of a window, then has plain
     * timeouts, so nobody can keep her out by checking her account; an
     * unknown one (a guesser's other address) stays busy.
     */
    private static void busyFromOtherAddresses() throws Exception {
        Expect.group("the busy rule: others' bursts");
        FakeDaemon.Handler answering = FakeDaemon.speaking(5);
        Subject victim = Subject.of(InetAddress.getByName("198.51.100.7"), "alice");
        Subject other = Subject.of(InetAddress.getByName("203.0.113.66"), "alice");
        Subject fresh = Subject.of(InetAddress.getByName("192.0.2.44"), "alice");
        long busyMaxMs = 400;
        try (FakeDaemon daemon = new FakeDaemon(answering);
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofMillis(60)).busyMax(Duration.ofMillis(busyMaxMs)))) {
            Expect.that(client.check("login", subject("warm")).verdict().isPresent(), "answered once");
            Expect.that(client.report("login", victim, Outcome.SUCCESS).verdict().isPresent(), "her success reported");
            Expect.that(client.report("login", fresh, Outcome.SUCCESS).verdict().isPresent(), "the fresh address's success reported");
            Expect.that(client.report("login", other, Outcome.FAILURE).verdict().isPresent(), "a failure reported");
            Expect.equal(2, client.knownRequesters(), "only successes make a requester known");
            daemon.handler = f -> null;
            List<Answer> first = together(client, List.of(victim, other));
            // Both refusals came by now: busy_max is timed from here.
            long refused = System.nanoTime();
            Expect.that(first.stream().allMatch(a -> kind(a) == ClientError.Kind.BUSY && !a.proceeds()),
                    "one account from two addresses, late: busy the first time: " + first);
            Expect.equal(1, client.busyWindows(), "a window for the known requester only");
            Thread.sleep(Bursts.BURST_GAP_US / 1000 + 10);
            // A known address with no window yet: were its own burst to
            // start one, the count would show it.
            List<Answer> own = together(client, List.of(fresh, fresh));
            Expect.that(own.stream().allMatch(a -> kind(a) == ClientError.Kind.BUSY && !a.proceeds()),
                    "one account from one address: its own burst, busy: " + own);
            Expect.equal(1, client.busyWindows(), "an own burst starts no window");
            // A timely answer busy_max after the refusals: the daemon is
            // busy, not down, so only the windows can make these timeouts.
            daemon.handler = answering;
            Thread.sleep(Math.max(0, busyMaxMs + 50 - (System.nanoTime() - refused) / 1_000_000));
            Expect.that(client.check("login", subject("warm")).verdict().isPresent(), "answered in time");
            daemon.handler = f -> null;
            List<Answer> again = together(client, List.of(victim, other));
            Answer hers = again.get(0);
            Answer theirs = again.get(1);
            Expect.that(kind(hers) == ClientError.Kind.TIMEOUT && hers.proceeds(),
                    "past busy_max of her window: a plain timeout, her login proceeds: " + hers);
            Expect.that(hers instanceof Answer.Unavailable u && u.error().message().equals("tollgate did not answer within 60 ms"),
                    "with the plain timeout message: " + hers);
            Expect.that(kind(theirs) == ClientError.Kind.BUSY && !theirs.proceeds(),
                    "the address with no success stays busy: " + theirs);
            Thread.sleep(Bursts.BURST_GAP_US / 1000 + 10);
            List<Answer> ownAgain = together(client, List.of(victim, victim));
            Expect.that(ownAgain.stream().allMatch(a -> kind(a) == ClientError.Kind.BUSY && !a.proceeds()),
                    "her own burst is still busy past the window's busy_max: " + ownAgain);
        }
        // The same sequence with no success reported: a guesser's other
        // addresses are never let through late, however long it lasts.
        try (FakeDaemon daemon = new FakeDaemon(answering);
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofMillis(60)).busyMax(Duration.ofMillis(busyMaxMs)))) {
            Expect.that(client.check("login", subject("warm")).verdict().isPresent(), "answered once");
            daemon.handler = f -> null;
            List<Answer> first = together(client, List.of(victim, other));
            long refused = System.nanoTime();
            Expect.that(first.stream().allMatch(a -> kind(a) == ClientError.Kind.BUSY && !a.proceeds()),
                    "unknown, one account from two addresses: busy: " + first);
            Expect.equal(0, client.busyWindows(), "unknown requesters start no window");
            daemon.handler = answering;
            Thread.sleep(Math.max(0, busyMaxMs + 50 - (System.nanoTime() - refused) / 1_000_000));
            Expect.that(client.check("login", subject("warm")).verdict().isPresent(), "answered in time");
            daemon.handler = f -> null;
            List<Answer> again = together(client, List.of(victim, other));
            Expect.that(again.stream().allMatch(a -> kind(a) == ClientError.Kind.BUSY && !a.proceeds()),
                    "no success reported: still busy past busy_max: " + again);
            Expect.equal(0, client.busyWindows(), "still no window");
        }
    }

    /**
     * Behind a reverse proxy every check comes from the proxy's address:
     * X-Forwarded-For tells its users apart, so an attacker's checks on her
     * account are a burst on it but not her own (which would keep her busy
     * for as long as he kept it up, and start no window).
     */
    private static void busyBehindAProxy() throws Exception {
        Expect.group("the busy rule: behind a proxy");
        FakeDaemon.Handler answering = FakeDaemon.speaking(5);
        InetAddress proxy = InetAddress.getByName("10.0.0.2");
        Subject victim = Subject.of(proxy, "alice").withForwardedFor("198.51.100.7");
        Subject attacker = Subject.of(proxy, "alice").withForwardedFor("203.0.113.66");
        try (FakeDaemon daemon = new FakeDaemon(answering);
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofMillis(60)).busyMax(Duration.ofMillis(400)))) {
            Expect.that(client.check("login", subject("warm")).verdict().isPresent(), "answered once");
            Expect.that(client.report("login", victim, Outcome.SUCCESS).verdict().isPresent(), "her success reported");
            daemon.handler = f -> null;
            List<Answer> first = together(client, List.of(victim, attacker));
            Expect.that(first.stream().allMatch(a -> kind(a) == ClientError.Kind.BUSY && !a.proceeds()),
                    "one account through one proxy for two users, late: busy the first time: " + first);
            Expect.equal(1, client.busyWindows(), "not her own burst: her window started");
            Thread.sleep(Bursts.BURST_GAP_US / 1000 + 10);
            List<Answer> own = together(client, List.of(attacker, attacker));
            Expect.that(own.stream().allMatch(a -> kind(a) == ClientError.Kind.BUSY && !a.proceeds()),
                    "one X-Forwarded-For twice: its own burst, busy: " + own);
        }
    }

    /** Which reported successes make a requester known, as the client counts them. */
    private static void knownThroughTheClient() throws Exception {
        Expect.group("known requesters through the client");
        InetAddress proxy = InetAddress.getByName("10.0.0.2");
        try (FakeDaemon daemon = new FakeDaemon(FakeDaemon.speaking(5));
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofSeconds(2)))) {
            Subject refused = Subject.of(proxy, "a".repeat(600));
            Expect.that(client.report("login", refused, Outcome.SUCCESS) instanceof Answer.Rejected, "a report refused before sending");
            Expect.equal(0, client.knownRequesters(), "a report not sent records no success");
            client.report("login", Subject.of(proxy, "alice").withForwardedFor("198.51.100.7"), Outcome.SUCCESS);
            client.report("login", Subject.of(proxy, "alice").withForwardedFor("198.51.100.8"), Outcome.SUCCESS);
            client.report("login", Subject.of(proxy, "alice").withForwardedFor("198.51.100.8"), Outcome.SUCCESS);
            Expect.equal(2, client.knownRequesters(), "one proxy, two X-Forwarded-For values: two requesters");
            client.report("login", Subject.of(proxy, "alice").withForwardedFor("198.51.100.7").withTenant("t2"), Outcome.SUCCESS);
            Expect.equal(3, client.knownRequesters(), "the same account in another tenant: another requester");
            for (int n = 0; n <= Bursts.Known.KNOWN_PER_ACCOUNT_MAX; n++) {
                client.report("login", Subject.of(InetAddress.getByName("192.0.2." + (n + 1)), "mallory"), Outcome.SUCCESS);
            }
            Expect.equal(3 + Bursts.Known.KNOWN_PER_ACCOUNT_MAX, client.knownRequesters(),
                    "17 addresses on one account: 16 kept, the others' untouched");
        }
    }

    private static void badReplies() throws Exception {
        Expect.group("bad replies");
        record Case(String what, FakeDaemon.Handler handler) {
        }
        List<Case> cases = List.of(
                new Case("a trailing byte", f -> {
                    byte[] v = FakeDaemon.verdict(f.version(), f.id(), Decision.ALLOW, 0, 0, 0);
                    byte[] longer = java.util.Arrays.copyOf(v, v.length + 1);
                    longer[0]++;
                    return longer;
                }),
                new Case("a reply over 8 MiB", f -> new byte[] {1, 0, (byte) 0x80, 0}),
                new Case("another request's id", f -> FakeDaemon.verdict(f.version(), f.id() + 1, Decision.ALLOW, 0, 0, 0)),
                new Case("an unknown decision", f -> {
                    byte[] v = FakeDaemon.verdict(f.version(), f.id(), Decision.ALLOW, 0, 0, 0);
                    v[17] = 4;
                    return v;
                }),
                new Case("a version-6 reply", f -> FakeDaemon.verdict(6, f.id(), Decision.ALLOW, 0, 0, 0)));
        for (Case c : cases) {
            try (FakeDaemon daemon = new FakeDaemon(c.handler());
                    Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofSeconds(2)))) {
                Answer a = client.check("password_reset", subject("alice"));
                Expect.that(kind(a) == ClientError.Kind.PROTOCOL && !a.proceeds(), c.what() + ": protocol, closed refuses: " + a);
                Expect.equal(0, client.pooled(), c.what() + ": the connection is closed");
            }
        }
        try (FakeDaemon daemon = new FakeDaemon(f -> FakeDaemon.error(1, 0, ErrorCode.MALFORMED, "short"));
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofSeconds(2)))) {
            Answer a = client.check("login", subject("alice"));
            Expect.that(a instanceof Answer.Rejected r && r.error().code() == ErrorCode.MALFORMED, "an id-0 error answers the request");
        }
        try (FakeDaemon daemon = new FakeDaemon(f -> FakeDaemon.verdict(f.version(), f.id(), Decision.ALLOW, 0, 0, 0xff));
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofSeconds(2)))) {
            Answer a = client.check("login", subject("alice"));
            Expect.that(a.verdict().map(Verdict::degraded).orElse(false), "flags bit 0: degraded, other bits ignored");
        }
    }

    private static void pool() throws Exception {
        Expect.group("connection pool");
        try (FakeDaemon daemon = new FakeDaemon(FakeDaemon.speaking(5));
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofSeconds(2)))) {
            for (int i = 0; i < 5; i++) client.check("login", subject("alice"));
            Expect.equal(1, daemon.connections.get(), "calls in turn share one connection");
            Expect.equal(1, client.pooled(), "kept idle");
            List<Long> ids = daemon.frames.stream().map(FakeDaemon.Frame::id).toList();
            Expect.equal(List.of(1L, 2L, 3L, 4L, 5L), ids, "ids from 1 up");
            List<Subject> many = new ArrayList<>();
            for (int i = 0; i < 16; i++) many.add(subject("user" + i));
            List<Answer> answers = together(client, many);
            Expect.that(answers.stream().allMatch(a -> a.verdict().isPresent()), "concurrent calls all answered");
            Expect.that(client.pooled() <= 16 && daemon.connections.get() <= 17, "at most one connection per concurrent call");
        }
        try (FakeDaemon daemon = new FakeDaemon(FakeDaemon.speaking(5));
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofSeconds(2)))) {
            daemon.closeAfterReply = true;
            Answer first = client.check("login", subject("alice"));
            Thread.sleep(50);
            Answer second = client.check("login", subject("alice"));
            Expect.that(first.verdict().isPresent() && second.verdict().isPresent(),
                    "a pooled connection closed while idle: asked again on a fresh one: " + second);
            Expect.equal(2, daemon.connections.get(), "two connections");
        }
    }

    private static void guard() throws Exception {
        Expect.group("the attempt guard");
        try (FakeDaemon daemon = new FakeDaemon(FakeDaemon.speaking(5));
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofSeconds(2)))) {
            try (Attempt attempt = client.begin("login", subject("alice"))) {
                Expect.that(attempt.proceeds(), "allowed");
            }
            Expect.equal(1L, daemon.count(8), "closed without a report: abandoned");
            try (Attempt attempt = client.begin("login", subject("alice"))) {
                Expect.that(attempt.report(Outcome.FAILURE).verdict().isPresent(), "reported");
            }
            Expect.equal(1L, daemon.count(8), "reported: not abandoned");
            Expect.equal(1L, daemon.count(1), "one report");
            for (String refusal : new String[] {"deny", "delay", "challenge"}) {
                try (Attempt attempt = client.begin("login", subject(refusal))) {
                    Expect.equal(!refusal.equals("delay") ? false : true, attempt.proceeds(), refusal + " proceeds only if delay");
                    if (refusal.equals("delay")) {
                        Expect.equal(Duration.ofMillis(20), attempt.answer().delay().orElse(null), "delay's delay");
                    }
                }
                Expect.equal(1L, daemon.count(8), refusal + ": nothing abandoned");
            }
            Attempt twice = client.begin("login", subject("alice"));
            Expect.that(twice.abandon().isPresent(), "abandon() sends");
            Expect.that(twice.abandon().isEmpty(), "at most once");
            twice.close();
            Expect.equal(2L, daemon.count(8), "one abandon for it");
            try {
                twice.report(Outcome.FAILURE);
                Expect.that(false, "a report after the abandon is refused");
            } catch (IllegalStateException e) {
                Expect.that(true, "a report after the abandon is refused");
            }
            try (Attempt attempt = client.begin("login", subject("alice"))) {
                Expect.that(attempt.proceeds(), "allowed");
                throw new IllegalStateException("the verify failed");
            } catch (IllegalStateException e) {
                Expect.equal(3L, daemon.count(8), "an exception leaving the block abandons");
            }
            Attempt interrupted = client.begin("login", subject("alice"));
            Thread.currentThread().interrupt();
            interrupted.close();
            Expect.that(Thread.interrupted(), "the interrupt flag is kept");
            Expect.equal(4L, daemon.count(8), "an interrupted thread still abandons");
            Answer reported = null;
            try (Attempt attempt = client.begin("login", subject("alice"))) {
                reported = attempt.reportAs(subject("alice").withDevice("d1"), Outcome.SUCCESS, null, null);
            }
            Expect.that(reported != null && reported.verdict().isPresent(), "reportAs answers");
            Expect.equal(4L, daemon.count(8), "reportAs spends the guard");
            daemon.handler = f -> null;
            Client quick = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofMillis(30)));
            try (Attempt attempt = quick.begin("login", subject("alice"))) {
                Expect.that(attempt.proceeds(), "unanswered: open");
            }
            Expect.equal(4L, daemon.count(8), "an unanswered check is never abandoned");
            quick.close();
        }
        try (FakeDaemon daemon = new FakeDaemon(f -> FakeDaemon.error(f.version(), f.id(), ErrorCode.FIELD_TOO_LONG, "long"));
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofSeconds(2)))) {
            try (Attempt attempt = client.begin("login", subject("a".repeat(600)))) {
                Expect.that(!attempt.proceeds(), "rejected: does not proceed");
            }
            Expect.equal(0L, daemon.count(8), "a rejected check is never abandoned");
        }
    }

    /** A version-5 Report frame's last 17 bytes: its tag option (1 and the tag), or, untagged, the digest's 16 bytes and 0. */
    private static byte[] reportEnd(FakeDaemon.Frame frame) {
        byte[] whole = frame.whole();
        return java.util.Arrays.copyOfRange(whole, whole.length - 17, whole.length);
    }

    private static byte[] concat(byte[] a, byte[] b) {
        byte[] out = java.util.Arrays.copyOf(a, a.length + b.length);
        System.arraycopy(b, 0, out, a.length, b.length);
        return out;
    }

    private static void guardKeepsTheTag() throws Exception {
        Expect.group("the guard's report keeps the spray tag");
        byte[] tag = Passwords.passwordTag(new byte[32], "hunter2");
        byte[] other = Passwords.passwordTag(new byte[32], "other");
        byte[] digest = Passwords.passwordDigest(new byte[32], "alice", "hunter2");
        try (FakeDaemon daemon = new FakeDaemon(FakeDaemon.speaking(5));
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofSeconds(2)))) {
            try (Attempt attempt = client.begin("login", subject("alice"), tag)) {
                attempt.report(Outcome.FAILURE, digest, null);
            }
            try (Attempt attempt = client.begin("login", subject("alice"), tag)) {
                attempt.report(Outcome.FAILURE);
            }
            try (Attempt attempt = client.begin("login", subject("alice"), tag)) {
                attempt.reportAs(subject("alice").withDevice("d1"), Outcome.FAILURE, digest, null);
            }
            try (Attempt attempt = client.begin("login", subject("alice"), tag)) {
                attempt.report(Outcome.FAILURE, digest, other);
            }
            try (Attempt attempt = client.begin("login", subject("alice"))) {
                attempt.report(Outcome.FAILURE, digest, null);
            }
            List<byte[]> tags = daemon.frames.stream().filter(f -> f.variant() == 1).map(FakeDaemonTests::reportEnd).toList();
            Expect.equal(5, tags.size(), "five reports");
            Expect.equal(concat(new byte[] {1}, tag), tags.get(0), "report(outcome, digest, null) sends the check's tag");
            Expect.equal(concat(new byte[] {1}, tag), tags.get(1), "report(outcome) sends the check's tag");
            Expect.equal(concat(new byte[] {1}, tag), tags.get(2), "reportAs(.., null) sends the check's tag");
            Expect.equal(concat(new byte[] {1}, other), tags.get(3), "a tag given is the one sent");
            Expect.equal(concat(digest, new byte[] {0}), tags.get(4), "a check begun without a tag reports none");
        }
    }

    /**
     * A reply already there when the deadline has passed wins over the
     * timer (as tokio polls the call before its timer): the Connection reads
     * before it looks at the clock. The client is held past its deadline by
     * holding its pool's lock, taken after the deadline is set; the daemon
     * sent the reply to request 2 with its reply to request 1.
     */
    private static void replyPastTheDeadline() throws Exception {
        Expect.group("a reply there by the deadline wins over the timer");
        FakeDaemon.Handler ahead = f -> {
            if (f.id() != 1) return null;
            byte[] first = FakeDaemon.verdict(f.version(), 1, Decision.ALLOW, 0, 0, 0);
            byte[] second = FakeDaemon.verdict(f.version(), 2, Decision.DENY, 1500, 0, 0);
            return concat(first, second);
        };
        try (FakeDaemon daemon = new FakeDaemon(ahead);
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofMillis(40)))) {
            Expect.that(client.check("login", subject("alice")).verdict().isPresent(), "the first call is answered");
            Thread.sleep(50);
            java.lang.reflect.Field poolField = Client.class.getDeclaredField("pool");
            poolField.setAccessible(true);
            Object pool = poolField.get(client);
            Answer[] late = new Answer[1];
            Subject alice = subject("alice");
            Thread caller;
            synchronized (pool) {
                caller = new Thread(() -> late[0] = client.check("login", alice));
                caller.start();
                Thread.sleep(150);
            }
            caller.join();
            Expect.that(late[0] != null && late[0].verdict().map(v -> v.decision() == Decision.DENY).orElse(false) && !late[0].proceeds(),
                    "held 150 ms past a 40 ms deadline, the buffered deny is the answer, not a timeout: " + late[0]);
            Answer silent = client.check("login", subject("alice"));
            Expect.that(silent instanceof Answer.Unavailable u && u.error().kind() == ClientError.Kind.TIMEOUT,
                    "a silent daemon still times out: " + silent);
        }
    }
}
