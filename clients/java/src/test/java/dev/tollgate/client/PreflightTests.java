package dev.tollgate.client;

import java.time.Duration;
import java.util.List;
import java.util.function.UnaryOperator;

/**
 * What the client refuses before any I/O: oversized identifiers and
 * requests (sent, the daemon closes mid-write and an open route would fail
 * open), and unpaired surrogates (sent, they would become '?').
 */
final class PreflightTests {
    private PreflightTests() {
    }

    static void run() throws Exception {
        oversized();
        budgetAndBurstsUntouched();
        frameEdge();
        surrogates();
    }

    private static boolean rejected(Answer a, ErrorCode code) {
        return a instanceof Answer.Rejected r && r.error().code() == code && !a.proceeds();
    }

    private static void oversized() throws Exception {
        Expect.group("oversized requests are refused before sending");
        record Field(String name, UnaryOperator<Subject> set) {
        }
        List<Field> fields = List.of(
                new Field("subject.account", s -> s.withAccount("a".repeat(600))),
                new Field("subject.device", s -> s.withDevice("d".repeat(600))),
                new Field("subject.tenant", s -> s.withTenant("t".repeat(600))),
                new Field("subject.client_id", s -> s.withClientId("c".repeat(600))));
        try (FakeDaemon daemon = new FakeDaemon(FakeDaemon.speaking(5));
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofSeconds(2)))) {
            Subject base = FakeDaemonTests.subject("alice");
            for (Field f : fields) {
                Subject padded = f.set().apply(base);
                Answer check = client.check("login", padded);
                Expect.that(rejected(check, ErrorCode.FIELD_TOO_LONG), f.name() + ": check rejected field_too_long: " + check);
                String message = check instanceof Answer.Rejected r ? r.error().message() : "";
                Expect.that(message.contains("`" + f.name() + "`") && message.contains("600 bytes")
                        && message.contains("maximum is 512") && message.contains("refused before sending"),
                        f.name() + ": the message names the field: " + message);
                Expect.that(rejected(client.report("login", padded, Outcome.FAILURE), ErrorCode.FIELD_TOO_LONG), f.name() + ": report rejected");
                Expect.that(rejected(client.abandon("login", padded), ErrorCode.FIELD_TOO_LONG), f.name() + ": abandon rejected");
                try (Attempt attempt = client.begin("login", padded, new byte[16])) {
                    Expect.that(!attempt.proceeds(), f.name() + ": the guard does not proceed");
                }
            }
            // 257 two-byte characters: under 512 characters, over 512 bytes.
            Expect.that(rejected(client.check("login", base.withAccount("é".repeat(257))), ErrorCode.FIELD_TOO_LONG), "counted in UTF-8 bytes");
            Answer huge = client.check("r".repeat(20_000), base);
            Expect.that(rejected(huge, ErrorCode.FRAME_TOO_LARGE), "a huge route: frame_too_large: " + huge);
            Expect.that(rejected(client.report("r".repeat(20_000), base, Outcome.FAILURE), ErrorCode.FRAME_TOO_LARGE), "a huge route's report too");
            Expect.equal(0, daemon.connections.get(), "nothing reached the daemon, not even a connection");
            Expect.equal(0, daemon.frames.size(), "no frame sent");

            Expect.that(client.check("login", base.withClientId("c".repeat(512))).verdict().isPresent(), "512 bytes is sent");
            Expect.that(client.check("login", base.withAccount("é".repeat(256))).verdict().isPresent(), "256 two-byte characters are sent");
            Answer longHeader = client.check("login", base.withForwardedFor("10.0.0.1, ".repeat(10_000)));
            Expect.that(longHeader.verdict().isPresent(), "a 100 KB X-Forwarded-For is cut to its tail and sent: " + longHeader);
        }
    }

    private static void budgetAndBurstsUntouched() throws Exception {
        Expect.group("a refused request spends nothing");
        ClientConfig config = ClientConfig.of("/nonexistent/t.sock")
                .staticBudget("password_reset", 1, Duration.ofHours(1), 1);
        try (Client client = new Client(config)) {
            Subject padded = FakeDaemonTests.subject("alice").withClientId("c".repeat(600));
            for (int i = 0; i < 3; i++) {
                Answer a = client.check("password_reset", padded);
                Expect.that(rejected(a, ErrorCode.FIELD_TOO_LONG), "rejected, not unavailable (no connect tried): " + a);
            }
            Expect.equal(0, client.burstEntries(), "not entered in the burst table");
            Answer first = client.check("password_reset", FakeDaemonTests.subject("alice"));
            Expect.that(first instanceof Answer.Unavailable u && u.withinStaticBudget() && first.proceeds(),
                    "the budget of 1 is still whole after the refusals: " + first);
        }
    }

    private static void frameEdge() throws Exception {
        Expect.group("the request payload limit");
        // No peer, no fields, no tag: a v5 Check's payload is its route plus 28 bytes.
        String fits = "r".repeat(16_384 - 28);
        String over = fits + "r";
        Request atLimit = Request.check(fits, Subject.EMPTY, null);
        Expect.equal(16_384, Codec.encode(5, 1, atLimit).length - 4, "the edge request is 16384 bytes");
        Expect.equal(null, Preflight.refusal(Subject.EMPTY, atLimit, 5), "16384 bytes is sent");
        Answer.Rejected refused = Preflight.refusal(Subject.EMPTY, Request.check(over, Subject.EMPTY, null), 5);
        Expect.that(refused != null && refused.error().code() == ErrorCode.FRAME_TOO_LARGE, "16385 bytes is refused");
        Expect.that(refused != null && refused.error().message().contains("16385"), "the message gives the size: " + refused);
        // The tag goes out in version 3 and later only: the size is the configured version's.
        Request tagged = Request.check(fits.substring(16), Subject.EMPTY, new byte[16]);
        Expect.equal(null, Preflight.refusal(Subject.EMPTY, tagged, 5), "a tagged request at the limit is sent");
        Request taggedOver = Request.check(fits.substring(15), Subject.EMPTY, new byte[16]);
        Expect.that(Preflight.refusal(Subject.EMPTY, taggedOver, 5) != null, "the tag counts in version 5");
        Expect.equal(null, Preflight.refusal(Subject.EMPTY, taggedOver, 2), "and not in version 2");
    }

    private static void surrogates() throws Exception {
        Expect.group("unpaired surrogates are refused before sending");
        try (FakeDaemon daemon = new FakeDaemon(FakeDaemon.speaking(5));
                Client client = new Client(ClientConfig.of(daemon.socket).timeout(Duration.ofSeconds(2)))) {
            Subject base = FakeDaemonTests.subject("alice");
            for (String bad : new String[] {"zed\uD800", "zed\uDBFF", "zed\uDC00", "\uDE00\uD83Dzed"}) {
                String shown = bad.codePoints().mapToObj(c -> String.format("U+%04X", c)).toList().toString();
                Expect.that(rejected(client.check("login", base.withAccount(bad)), ErrorCode.MALFORMED), "account " + shown);
                Expect.that(rejected(client.report("login", base.withDevice(bad), Outcome.FAILURE), ErrorCode.MALFORMED), "device " + shown);
                Expect.that(rejected(client.abandon("login", base.withTenant(bad)), ErrorCode.MALFORMED), "tenant " + shown);
                Expect.that(rejected(client.check("login", base.withClientId(bad)), ErrorCode.MALFORMED), "client_id " + shown);
                Expect.that(rejected(client.check("login", base.withForwardedFor(bad)), ErrorCode.MALFORMED), "forwarded_for " + shown);
                Expect.that(rejected(client.check("login" + bad, base), ErrorCode.MALFORMED), "route " + shown);
            }
            Answer a = client.check("login", base.withAccount("zed\uD800"));
            Expect.that(a instanceof Answer.Rejected r && r.error().message().contains("`subject.account`"), "the message names the field: " + a);
            Expect.equal(0, daemon.frames.size(), "none was sent");
            Expect.that(client.check("login", base.withAccount("zed\uFFFD")).verdict().isPresent(), "U+FFFD itself is well-formed: sent");
            Expect.that(client.check("login", base.withAccount("zed\uD83D\uDE00")).verdict().isPresent(), "a surrogate pair is sent");
            Expect.equal(2, daemon.frames.size(), "two sent");
        }
    }
}
