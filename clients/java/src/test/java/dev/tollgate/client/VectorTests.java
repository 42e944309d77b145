package dev.tollgate.client;

import dev.tollgate.client.conformance.Json;
import java.net.InetAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import java.util.Map;

/** tests/vectors/protocol.json and passwords.json, and RFC 7693's BLAKE2b test. */
final class VectorTests {
    private VectorTests() {
    }

    static void run(Path root) throws Exception {
        protocolVectors(root.resolve("tests/vectors/protocol.json"));
        passwordVectors(root.resolve("tests/vectors/passwords.json"));
        blake2b();
    }

    @SuppressWarnings("unchecked")
    private static List<Map<String, Object>> vectors(Path file) throws Exception {
        Map<String, Object> doc = (Map<String, Object>) Json.parse(Files.readString(file, StandardCharsets.UTF_8));
        return (List<Map<String, Object>>) doc.get("vectors");
    }

    /** One field's meaning: {@code <type> <field> = <value>}, the value still raw. */
    private record Meaning(String type, String field, String value) {
        static Meaning of(String text) {
            int space = text.indexOf(' ');
            int equals = text.indexOf(" = ");
            return new Meaning(text.substring(0, space), text.substring(space + 1, equals), text.substring(equals + 3));
        }

        /** The value without its note in parentheses. */
        String bare() {
            if (type.equals("utf8")) return (String) Json.parse(quoted());
            int note = value.indexOf(" (");
            return note < 0 ? value : value.substring(0, note);
        }

        /** The leading JSON string literal of a utf8 value. */
        private String quoted() {
            int i = 1;
            while (value.charAt(i) != '"') i += value.charAt(i) == '\\' ? 2 : 1;
            return value.substring(0, i + 1);
        }

        long number() {
            return Long.parseUnsignedLong(bare());
        }
    }

    @SuppressWarnings("unchecked")
    private static void protocolVectors(Path file) throws Exception {
        Expect.group("protocol vectors");
        int requests = 0;
        int responses = 0;
        for (Map<String, Object> v : vectors(file)) {
            String name = (String) v.get("name");
            byte[] frame = Expect.unhex((String) v.get("frame"));
            int version = v.get("version") == null ? 1 : ((Long) v.get("version")).intValue();
            long id = (Long) v.get("id");
            List<Meaning> fields = ((List<Map<String, Object>>) v.get("fields")).stream()
                    .map(f -> Meaning.of((String) f.get("meaning")))
                    .toList();
            if (v.get("kind").equals("request")) {
                Request request = request(fields);
                if (request == null) continue; // Status, Lockouts, admin: the tollgate CLI's.
                requests++;
                Expect.equal(Expect.hex(frame), Expect.hex(Codec.encode(version, id, request)), name + " encodes to its frame");
            } else if (version > Codec.PROTOCOL_VERSION) {
                // A newer version's reply (the daemon's admin requests): this
                // client never asks in it, and refuses such a frame.
                try {
                    Codec.decode(Arrays.copyOfRange(frame, 4, frame.length));
                    Expect.that(false, name + ": a version " + version + " reply is refused");
                } catch (Codec.MalformedReplyException expected) {
                    Expect.that(expected.getMessage().contains("version " + version), name + " is refused for its version: " + expected.getMessage());
                }
            } else {
                responses++;
                response(name, frame, version, id, fields);
            }
        }
        Expect.that(requests == 11, "every Check, Report and Abandon vector was encoded (" + requests + ")");
        Expect.that(responses > 30, "response vectors were read (" + responses + ")");
    }

    /** The request the vector's fields describe; null for one this client does not send. */
    private static Request request(List<Meaning> fields) throws Exception {
        Request.Kind kind = null;
        String route = null;
        InetAddress peer = null;
        String[] strings = new String[5];
        List<String> names = List.of("subject.forwarded_for", "subject.account", "subject.device", "subject.tenant", "subject.client_id");
        Outcome outcome = null;
        byte[] digest = null;
        byte[] tag = null;
        for (Meaning m : fields) {
            switch (m.field()) {
                case "Request variant" -> {
                    int variant = (int) m.number();
                    kind = Arrays.stream(Request.Kind.values()).filter(k -> k.discriminant == variant).findFirst().orElse(null);
                    if (kind == null) return null;
                }
                case "route" -> route = m.bare();
                case "subject.peer" -> peer = InetAddress.getByName(m.bare());
                case "outcome" -> outcome = Outcome.values()[(int) m.number()];
                case "password_digest" -> digest = m.type().equals("bytes") ? Expect.unhex(m.bare()) : digest;
                case "password_tag" -> tag = m.type().equals("bytes") ? Expect.unhex(m.bare()) : tag;
                default -> {
                    int at = names.indexOf(m.field());
                    if (at >= 0 && m.type().equals("utf8")) strings[at] = m.bare();
                }
            }
        }
        Subject subject = new Subject(peer, strings[0], strings[1], strings[2], strings[3], strings[4]);
        return new Request(kind, route, subject, outcome, digest, tag);
    }

    private static void response(String name, byte[] frame, int version, long id, List<Meaning> fields) throws Exception {
        long length = (frame[0] & 0xffL) | (frame[1] & 0xffL) << 8 | (frame[2] & 0xffL) << 16 | (frame[3] & 0xffL) << 24;
        Expect.equal((long) frame.length - 4, length, name + " length prefix");
        Codec.Reply reply = Codec.decode(Arrays.copyOfRange(frame, 4, frame.length));
        Expect.equal(id, reply.id(), name + " id");
        Expect.equal(version, reply.version(), name + " version");
        for (Meaning m : fields) {
            Verdict v = reply.verdict();
            ErrorReply e = reply.error();
            String what = name + " " + m.field();
            switch (m.field()) {
                case "Response variant" -> Expect.equal(m.number(), (long) reply.variant(), what);
                case "decision" -> Expect.equal(m.number(), (long) v.decision().ordinal(), what);
                case "retry_after_ms" -> Expect.equal(m.number(), v.retryAfterMs(), what);
                case "delay_ms" -> Expect.equal(m.number(), v.delayMs(), what);
                case "limit" -> Expect.equal(m.number(), v.limit(), what);
                case "remaining" -> Expect.equal(m.number(), v.remaining(), what);
                case "reset_ms" -> Expect.equal(m.number(), v.resetMs(), what);
                case "reason" -> Expect.equal(m.number(), (long) v.reason().ordinal(), what);
                case "rule" -> Expect.equal(m.bare(), v.rule(), what);
                case "flags" -> Expect.equal((m.number() & 1) != 0, v.degraded(), what);
                case "code" -> Expect.equal(m.number(), (long) e.code().ordinal(), what);
                case "message" -> Expect.equal(m.bare(), e.message(), what);
                default -> {
                    // Lengths, the envelope (checked above) and other responses' fields.
                }
            }
        }
        if (reply.verdict() != null) {
            // Reserved flag bits are ignored, not refused; a missing flags byte or a trailing one is refused.
            byte[] payload = Arrays.copyOfRange(frame, 4, frame.length);
            if (version >= 2) {
                payload[payload.length - 1] = (byte) 0xfe;
                Expect.that(!Codec.decode(payload).verdict().degraded(), name + ": bits 1 to 7 ignored");
                refused(Arrays.copyOf(payload, payload.length - 1), name + " without its flags");
            }
            refused(Arrays.copyOf(payload, payload.length + 1), name + " with a trailing byte");
        }
    }

    static void refused(byte[] payload, String what) {
        try {
            Codec.decode(payload);
            Expect.that(false, what + " is refused");
        } catch (Codec.MalformedReplyException e) {
            Expect.that(true, what);
        }
    }

    @SuppressWarnings("unchecked")
    private static void passwordVectors(Path file) throws Exception {
        Expect.group("password vectors");
        int n = 0;
        for (Map<String, Object> v : vectors(file)) {
            byte[] key = Expect.unhex((String) v.get("key"));
            String account = (String) v.get("account");
            String password = (String) v.get("password");
            String what = "account " + account.length() + " chars, password " + password.length() + " chars";
            Expect.equal(v.get("digest"), Expect.hex(Passwords.passwordDigest(key, account, password)), "digest of " + what);
            Expect.equal(v.get("tag"), Expect.hex(Passwords.passwordTag(key, password)), "tag of " + what);
            n++;
        }
        Expect.that(n >= 6, "password vectors read (" + n + ")");
    }

    private static void blake2b() {
        Expect.group("BLAKE2b (RFC 7693)");
        byte[] abc = "abc".getBytes(StandardCharsets.US_ASCII);
        Expect.equal("ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d1"
                        + "7d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923",
                Expect.hex(new Blake2b(64, null, null).update(abc).digest()), "BLAKE2b-512(\"abc\"), RFC 7693 appendix A");
        // Fed in pieces across block edges, the same as whole.
        byte[] data = new byte[300];
        for (int i = 0; i < data.length; i++) data[i] = (byte) i;
        byte[] key = new byte[32];
        for (int cut : new int[] {0, 1, 127, 128, 129, 256, 300}) {
            Blake2b pieces = new Blake2b(16, key, Passwords.TAG_PERSONAL);
            pieces.update(data, 0, cut).update(data, cut, data.length - cut);
            Expect.equal(Expect.hex(new Blake2b(16, key, Passwords.TAG_PERSONAL).update(data).digest()),
                    Expect.hex(pieces.digest()), "split at " + cut);
        }
    }
}
