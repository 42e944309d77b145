package dev.tollgate.client.conformance;

import dev.tollgate.client.Answer;
import dev.tollgate.client.Attempt;
import dev.tollgate.client.Client;
import dev.tollgate.client.ClientConfig;
import dev.tollgate.client.Codec;
import dev.tollgate.client.FailPolicy;
import dev.tollgate.client.Outcome;
import dev.tollgate.client.Passwords;
import dev.tollgate.client.Request;
import dev.tollgate.client.Subject;
import dev.tollgate.client.Verdict;
import java.io.BufferedReader;
import java.io.FileOutputStream;
import java.io.FileDescriptor;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.net.Inet4Address;
import java.net.Inet6Address;
import java.net.InetAddress;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The conformance runner of docs/clients.md ("The runner"): one JSON
 * request a line on stdin, one JSON reply a line on stdout, in order.
 */
public final class Runner {
    private Client client;
    private byte[] key = new byte[32];
    /** Begun attempts by name, with the subject they were checked for. */
    private final Map<String, Begun> attempts = new HashMap<>();

    private record Begun(Attempt attempt, Subject subject) {
    }

    /** A request the runner cannot carry out: answered {@code {"error": why}}. */
    static final class Refused extends RuntimeException {
        Refused(String why) {
            super(why);
        }
    }

    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
        // Whatever else prints goes to stderr: stdout carries replies only.
        System.setOut(System.err);
        Runner runner = new Runner();
        for (String line; (line = in.readLine()) != null; ) {
            if (line.isBlank()) continue;
            Object reply;
            try {
                Object request = Json.parse(line);
                if (!(request instanceof Map<?, ?> map)) throw new Refused("a request is a JSON object");
                @SuppressWarnings("unchecked")
                Map<String, Object> r = (Map<String, Object>) map;
                reply = runner.serve(r);
            } catch (Refused | IllegalArgumentException | IllegalStateException e) {
                reply = Map.of("error", String.valueOf(e.getMessage()));
            } catch (RuntimeException e) {
                reply = Map.of("error", e.toString());
            }
            out.println(Json.write(reply));
            out.flush();
        }
        out.flush();
        System.exit(0);
    }

    Object serve(Map<String, Object> request) {
        String op = text(request, "op");
        if (op == null) throw new Refused("no `op`");
        String route = text(request, "route") == null ? "" : text(request, "route");
        String password = text(request, "password");
        byte[] tag = password == null ? null : Passwords.passwordTag(key, password);
        switch (op) {
            case "open":
                return open(request);
            case "check":
                return answerJson(client().check(route, subject(request.get("subject")), tag));
            case "report": {
                Subject subject = subject(request.get("subject"));
                byte[] digest = password == null ? null : Passwords.passwordDigest(key, account(subject), password);
                return answerJson(client().report(route, subject, outcome(request), digest, tag));
            }
            case "abandon":
                return answerJson(client().abandon(route, subject(request.get("subject"))));
            case "checks":
                return checks(request, route);
            case "begin": {
                String name = attemptName(request);
                Subject subject = subject(request.get("subject"));
                Attempt attempt = client().begin(route, subject, tag);
                Begun old = attempts.put(name, new Begun(attempt, subject));
                if (old != null) old.attempt().close();
                return answerJson(attempt.answer());
            }
            case "finish": {
                // Kept under its name: a later `end` finds the spent guard and sends nothing.
                Begun begun = attempts.get(attemptName(request));
                if (begun == null) throw new Refused("no such attempt");
                Attempt attempt = begun.attempt();
                Outcome outcome = outcome(request);
                if (request.get("subject") instanceof Map) {
                    Subject after = subject(request.get("subject"));
                    byte[] digest = password == null ? null : Passwords.passwordDigest(key, account(after), password);
                    return answerJson(attempt.reportAs(after, outcome, digest, tag));
                }
                // The digest names the account the attempt was checked for.
                byte[] digest = password == null ? null : Passwords.passwordDigest(key, account(begun.subject()), password);
                return answerJson(attempt.report(outcome, digest, tag));
            }
            case "end": {
                Begun begun = attempts.remove(attemptName(request));
                if (begun == null) throw new Refused("no such attempt");
                return Map.of("abandoned", begun.attempt().abandon().isPresent());
            }
            case "digest": {
                String keyText = text(request, "key");
                if (keyText == null) throw new Refused("no `key`");
                byte[] digestKey = parseKey(keyText);
                String account = text(request, "account") == null ? "" : text(request, "account");
                String pw = password == null ? "" : password;
                Map<String, Object> reply = new LinkedHashMap<>();
                reply.put("digest", hex(Passwords.passwordDigest(digestKey, account, pw)));
                reply.put("tag", hex(Passwords.passwordTag(digestKey, pw)));
                return reply;
            }
            case "bench":
                return bench(request, route, subject(request.get("subject")));
            default:
                throw new Refused("unknown op \"" + op + "\"");
        }
    }

    private Client client() {
        if (client == null) throw new Refused("no client: send `open` first");
        return client;
    }

    private Object open(Map<String, Object> request) {
        String socket = text(request, "socket");
        if (socket == null) throw new Refused("no `socket`");
        ClientConfig config = ClientConfig.of(socket);
        Long timeout = number(request, "timeout_ms");
        if (timeout != null) config.timeout(Duration.ofMillis(timeout));
        Long busyMax = number(request, "busy_max_ms");
        if (busyMax != null) config.busyMax(Duration.ofMillis(busyMax));
        Long version = number(request, "protocol_version");
        if (version != null) config.protocolVersion(version.intValue());
        if (request.get("fail_policies") instanceof Map<?, ?> policies) {
            for (Map.Entry<?, ?> e : policies.entrySet()) {
                FailPolicy policy;
                if ("open".equals(e.getValue())) {
                    policy = FailPolicy.OPEN;
                } else if ("closed".equals(e.getValue())) {
                    policy = FailPolicy.CLOSED;
                } else {
                    throw new Refused("fail policy of " + e.getKey() + ": " + e.getValue());
                }
                config.failPolicy(String.valueOf(e.getKey()), policy);
            }
        }
        if (request.get("static_budgets") instanceof Map<?, ?> budgets) {
            for (Map.Entry<?, ?> e : budgets.entrySet()) {
                if (!(e.getValue() instanceof Map<?, ?> b)) throw new Refused("static_budgets." + e.getKey());
                String where = "static_budgets." + e.getKey() + ".";
                long limit = required(b.get("limit"), where + "limit");
                long period = required(b.get("period_ms"), where + "period_ms");
                long burst = required(b.get("burst"), where + "burst");
                config.staticBudget(String.valueOf(e.getKey()), limit, Duration.ofMillis(period), burst);
            }
        }
        byte[] newKey = text(request, "key") == null ? new byte[32] : parseKey(text(request, "key"));
        // The old client's guards end as a dropped one would: abandoned.
        for (Begun begun : attempts.values()) begun.attempt().close();
        attempts.clear();
        if (client != null) client.close();
        key = newKey;
        client = new Client(config);
        return Map.of("ok", true);
    }

    private Object checks(Map<String, Object> request, String route) {
        if (!(request.get("subjects") instanceof List<?> list)) throw new Refused("no `subjects`");
        List<Subject> subjects = new ArrayList<>();
        for (Object s : list) subjects.add(subject(s));
        Client c = client();
        Answer[] answers = new Answer[subjects.size()];
        // Released together, so that the checks overlap as tasks spawned at once would.
        CyclicBarrier start = new CyclicBarrier(Math.max(1, subjects.size()));
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < subjects.size(); i++) {
            int index = i;
            Thread t = new Thread(() -> {
                try {
                    start.await();
                } catch (Exception e) {
                    // A broken barrier only loses the overlap; the check still runs.
                }
                answers[index] = c.check(route, subjects.get(index));
            });
            t.start();
            threads.add(t);
        }
        join(threads);
        List<Object> replies = new ArrayList<>();
        for (Answer a : answers) replies.add(answerJson(a));
        return Map.of("answers", replies);
    }

    private Object bench(Map<String, Object> request, String route, Subject subject) {
        Client c = client();
        long threads = Math.max(1, number(request, "threads") == null ? 1 : number(request, "threads"));
        long millis = number(request, "millis") == null ? 1000 : number(request, "millis");
        boolean raw = Boolean.TRUE.equals(request.get("raw"));
        Path socket = c.config().socket();
        long started = System.nanoTime();
        long until = started + millis * 1_000_000;
        AtomicLong calls = new AtomicLong();
        List<String> failures = new ArrayList<>();
        List<Thread> loops = new ArrayList<>();
        for (long i = 0; i < threads; i++) {
            Thread t = new Thread(() -> {
                long n = 0;
                try {
                    if (raw) {
                        byte[] frame = Codec.encode(Codec.PROTOCOL_VERSION, 1, Request.check(route, subject, null));
                        try (SocketChannel channel = SocketChannel.open(StandardProtocolFamily.UNIX)) {
                            channel.connect(UnixDomainSocketAddress.of(socket));
                            ByteBuffer length = ByteBuffer.allocate(4).order(ByteOrder.LITTLE_ENDIAN);
                            ByteBuffer reply = ByteBuffer.allocate(512);
                            while (System.nanoTime() < until) {
                                ByteBuffer out = ByteBuffer.wrap(frame);
                                while (out.hasRemaining()) channel.write(out);
                                length.clear();
                                readFully(channel, length);
                                int size = length.getInt(0);
                                if (reply.capacity() < size) reply = ByteBuffer.allocate(size);
                                reply.clear().limit(size);
                                readFully(channel, reply);
                                n++;
                            }
                        }
                    } else {
                        while (System.nanoTime() < until) {
                            c.check(route, subject);
                            n++;
                        }
                    }
                } catch (IOException | RuntimeException e) {
                    synchronized (failures) {
                        failures.add(e.toString());
                    }
                }
                calls.addAndGet(n);
            });
            t.start();
            loops.add(t);
        }
        join(loops);
        if (!failures.isEmpty()) throw new Refused(failures.get(0));
        Map<String, Object> reply = new LinkedHashMap<>();
        reply.put("calls", calls.get());
        reply.put("millis", (System.nanoTime() - started) / 1_000_000);
        return reply;
    }

    private static void readFully(SocketChannel channel, ByteBuffer into) throws IOException {
        while (into.hasRemaining()) {
            if (channel.read(into) < 0) throw new IOException("tollgate closed the connection");
        }
    }

    private static void join(List<Thread> threads) {
        for (Thread t : threads) {
            try {
                t.join();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new Refused("interrupted");
            }
        }
    }

    /** An answer as docs/clients.md writes it. */
    static Map<String, Object> answerJson(Answer answer) {
        Map<String, Object> reply = new LinkedHashMap<>();
        if (answer instanceof Answer.Decided d) {
            Verdict v = d.value();
            reply.put("answer", "verdict");
            reply.put("proceeds", answer.proceeds());
            reply.put("decision", v.decision().wireName());
            reply.put("retry_after_ms", v.retryAfterMs());
            reply.put("delay_ms", v.delayMs());
            reply.put("limit", v.limit());
            reply.put("remaining", v.remaining());
            reply.put("reset_ms", v.resetMs());
            reply.put("reason", v.reason().wireName());
            reply.put("rule", v.rule());
            reply.put("degraded", v.degraded());
        } else if (answer instanceof Answer.Rejected r) {
            reply.put("answer", "rejected");
            reply.put("proceeds", answer.proceeds());
            reply.put("code", r.error().code().wireName());
        } else if (answer instanceof Answer.Unavailable u) {
            reply.put("answer", "unavailable");
            reply.put("proceeds", answer.proceeds());
            reply.put("policy", u.policy().wireName());
            reply.put("error", u.error().kind().wireName());
            reply.put("within_static_budget", u.withinStaticBudget());
        }
        reply.put("retry_after_s", answer.retryAfterSecs());
        if (answer instanceof Answer.Decided d) reply.put("version", (long) d.value().version());
        return reply;
    }

    /** A subject object; an absent or null field is None. */
    private Subject subject(Object value) {
        if (value == null) return Subject.EMPTY;
        if (!(value instanceof Map<?, ?> m)) throw new Refused("a subject is an object");
        String peerText = m.get("peer") instanceof String s ? s : null;
        return new Subject(peerText == null ? null : parseIp(peerText),
                str(m, "forwarded_for"), str(m, "account"), str(m, "device"), str(m, "tenant"), str(m, "client_id"));
    }

    private static String str(Map<?, ?> m, String name) {
        return m.get(name) instanceof String s ? s : null;
    }

    /** An IP literal, never a host name to look up; an IPv4-mapped IPv6 literal stays IPv6, as in Rust. */
    static InetAddress parseIp(String text) {
        if (text.isEmpty() || !text.chars().allMatch(c -> Character.digit(c, 16) >= 0 || c == '.' || c == ':')) {
            throw new Refused("subject.peer \"" + text + "\": not an IP address");
        }
        try {
            InetAddress address = InetAddress.getByName(text);
            if (text.indexOf(':') >= 0 && address instanceof Inet4Address) {
                byte[] mapped = new byte[16];
                mapped[10] = (byte) 0xff;
                mapped[11] = (byte) 0xff;
                System.arraycopy(address.getAddress(), 0, mapped, 12, 4);
                return Inet6Address.getByAddress(null, mapped, -1);
            }
            if (text.indexOf(':') < 0 && text.chars().filter(c -> c == '.').count() != 3) {
                throw new Refused("subject.peer \"" + text + "\": not an IP address");
            }
            return address;
        } catch (java.net.UnknownHostException e) {
            throw new Refused("subject.peer \"" + text + "\": " + e.getMessage());
        }
    }

    private static String account(Subject subject) {
        return subject.account() == null ? "" : subject.account();
    }

    private String attemptName(Map<String, Object> request) {
        String name = text(request, "attempt");
        if (name == null) throw new Refused("no `attempt`");
        return name;
    }

    private static Outcome outcome(Map<String, Object> request) {
        Object o = request.get("outcome");
        if ("success".equals(o)) return Outcome.SUCCESS;
        if ("failure".equals(o)) return Outcome.FAILURE;
        throw new Refused("outcome " + o + ": success or failure");
    }

    private static String text(Map<String, Object> request, String name) {
        return request.get(name) instanceof String s ? s : null;
    }

    private static Long number(Map<String, Object> request, String name) {
        Object v = request.get(name);
        if (v == null) return null;
        if (v instanceof Number n && n.doubleValue() >= 0) return n.longValue();
        throw new Refused("`" + name + "` is not a non-negative number");
    }

    private static long required(Object v, String what) {
        if (v instanceof Number n && n.doubleValue() >= 0) return n.longValue();
        throw new Refused(what);
    }

    static byte[] parseKey(String text) {
        if (text.length() != 64) throw new Refused("key \"" + text + "\": 64 hex digits");
        byte[] key = new byte[32];
        for (int i = 0; i < 32; i++) {
            int hi = Character.digit(text.charAt(2 * i), 16);
            int lo = Character.digit(text.charAt(2 * i + 1), 16);
            if (hi < 0 || lo < 0) throw new Refused("key \"" + text + "\": 64 hex digits");
            key[i] = (byte) (hi * 16 + lo);
        }
        return key;
    }

    static String hex(byte[] bytes) {
        StringBuilder out = new StringBuilder();
        for (byte b : bytes) out.append(String.format("%02x", b & 0xff));
        return out.toString();
    }
}
