package dev.tollgate.client;

import java.io.File;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.stream.Stream;

/**
 * A few checks against a real daemon, when one is at hand ($TOLLGATE_DAEMON,
 * else /tmp/tollgate-daemon); skipped otherwise: everything else is daemon-free.
 */
final class LiveDaemonTests {
    private LiveDaemonTests() {
    }

    static void run() throws Exception {
        String binary = System.getenv().getOrDefault("TOLLGATE_DAEMON", "/tmp/tollgate-daemon");
        if (!new File(binary).canExecute()) {
            System.out.println("== live daemon: skipped (no " + binary + ")");
            return;
        }
        Expect.group("live daemon");
        Path dir = Files.createTempDirectory("tollgate-live");
        Path socket = dir.resolve("t.sock");
        Process daemon = new ProcessBuilder(binary, "serve", "--socket", socket.toString(),
                "--state", dir.resolve("state.redb").toString(), "--manual-clock")
                .redirectErrorStream(true)
                .redirectOutput(dir.resolve("log").toFile())
                .start();
        try {
            for (int i = 0; i < 200 && !Files.exists(socket); i++) Thread.sleep(25);
            Expect.that(Files.exists(socket), "the daemon started");
            try (Client client = new Client(ClientConfig.of(socket).timeout(Duration.ofSeconds(2)))) {
                scenarios(client, socket);
            }
        } finally {
            daemon.destroy();
            daemon.waitFor();
            try (Stream<Path> files = Files.walk(dir)) {
                files.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
            }
        }
    }

    private static void scenarios(Client client, Path socket) throws Exception {
        byte[] key = new byte[32];
        Subject alice = FakeDaemonTests.subject("alice");
        Answer first = client.check("login", alice, Passwords.passwordTag(key, "guess0"));
        Expect.that(first.verdict().map(v -> v.decision() == Decision.ALLOW && v.version() == 5).orElse(false), "allowed in version 5: " + first);
        client.report("login", alice, Outcome.FAILURE, Passwords.passwordDigest(key, "alice", "guess0"), Passwords.passwordTag(key, "guess0"));
        for (int i = 1; i < 5; i++) {
            try (Attempt attempt = client.begin("login", alice, Passwords.passwordTag(key, "guess" + i))) {
                Expect.that(attempt.proceeds(), "failure " + i + " may be tried");
                attempt.report(Outcome.FAILURE, Passwords.passwordDigest(key, "alice", "guess" + i), null);
            }
        }
        Answer locked = client.check("login", alice);
        Expect.that(!locked.proceeds() && locked.verdict().map(v -> v.reason() == Reason.TOO_MANY_FAILURES).orElse(false),
                "five failures lock the account here: " + locked);
        Expect.that(locked.retryAfterSecs() > 1, "with a Retry-After of minutes");

        Subject carol = FakeDaemonTests.subject("carol");
        List<Attempt> held = new ArrayList<>();
        for (int i = 0; i < 5; i++) held.add(client.begin("login", carol));
        Answer full = client.check("login", carol);
        Expect.that(full.verdict().map(v -> v.reason() == Reason.ATTEMPTS_IN_FLIGHT).orElse(false), "places held refuse: " + full);
        held.get(0).close();
        try (Attempt next = client.begin("login", carol)) {
            Expect.that(next.proceeds(), "an abandoned place is given back");
            next.report(Outcome.SUCCESS);
        }
        for (Attempt a : held) a.close();

        Answer tooLong = client.check("login", FakeDaemonTests.subject("x".repeat(513)));
        Expect.that(tooLong instanceof Answer.Rejected r && r.error().code() == ErrorCode.FIELD_TOO_LONG && !tooLong.proceeds(),
                "513 bytes: field_too_long, not truncated: " + tooLong);
        Answer missing = client.check("login", Subject.EMPTY.withAccount("dave"));
        Expect.that(missing instanceof Answer.Rejected r && r.error().code() == ErrorCode.MISSING_FIELD, "no peer: missing_field");

        try (Client old = new Client(ClientConfig.of(socket).timeout(Duration.ofSeconds(2)).protocolVersion(1))) {
            Answer v1 = old.check("login", alice);
            Expect.that(v1.verdict().map(v -> v.version() == 1 && !v.proceeds()).orElse(false), "version 1 spoken: " + v1);
            Answer abandon = old.abandon("login", alice);
            Expect.that(abandon instanceof Answer.Rejected r && r.error().code() == ErrorCode.MALFORMED, "abandon in version 1: malformed");
        }
    }
}
