import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import dev.tollgate.client.Answer;
import dev.tollgate.client.Attempt;
import dev.tollgate.client.Client;
import dev.tollgate.client.ClientConfig;
import dev.tollgate.client.Outcome;
import dev.tollgate.client.Passwords;
import dev.tollgate.client.Subject;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executors;
import javax.crypto.SecretKeyFactory;
import javax.crypto.spec.PBEKeySpec;

/**
 * A small login endpoint using tollgate as examples/login_server.rs does:
 * check before the (slow) password hash, report after, one 429 with
 * Retry-After for every refusal, a floor so refusals are never faster than
 * a wrong password, fail-open on login when the daemon is down.
 *
 * <pre>
 * clients/java/example/run.sh --socket /tmp/tollgate/tollgate.sock --listen 127.0.0.1:8080
 * curl -si -d 'account=alice&amp;password=correct+horse+battery+staple' http://127.0.0.1:8080/login
 * </pre>
 */
public final class LoginServer {
    private static final String REFUSED = "{\"error\":\"too many attempts, try again later\"}";
    private static final String FAILED = "{\"error\":\"invalid account or password\"}";
    private static final long FLOOR_MS = 100;

    private final Client limiter;
    private final Map<String, byte[]> users = new HashMap<>();
    private final byte[] salt = new byte[16];
    /** This server's own secret for password digests: stable across restarts and processes, so loaded. */
    private final byte[] serverKey;

    LoginServer(Client limiter, Map<String, String> accounts) throws Exception {
        this.limiter = limiter;
        SecureRandom random = new SecureRandom();
        random.nextBytes(salt);
        String keyHex = System.getenv("TOLLGATE_PASSWORD_KEY"); // 64 hex digits
        if (keyHex != null) {
            serverKey = HexFormat.of().parseHex(keyHex);
            if (serverKey.length != 32) throw new IllegalArgumentException("TOLLGATE_PASSWORD_KEY: 64 hex digits");
        } else {
            System.err.println("TOLLGATE_PASSWORD_KEY unset: a throwaway key, for this demo only");
            serverKey = new byte[32];
            random.nextBytes(serverKey);
        }
        for (Map.Entry<String, String> e : accounts.entrySet()) users.put(e.getKey(), hash(e.getValue()));
    }

    /** The slow verify the limiter protects: PBKDF2 from the JDK. */
    private byte[] hash(String password) throws Exception {
        PBEKeySpec spec = new PBEKeySpec(password.toCharArray(), salt, 100_000, 256);
        return SecretKeyFactory.getInstance("PBKDF2WithHmacSHA256").generateSecret(spec).getEncoded();
    }

    private void login(HttpExchange exchange) throws IOException {
        long arrived = System.nanoTime();
        int status;
        String body;
        String retryAfter = null;
        try {
            Map<String, String> form = form(new String(exchange.getRequestBody().readAllBytes(), StandardCharsets.UTF_8));
            String account = form.getOrDefault("account", "");
            String password = form.getOrDefault("password", "");
            List<String> forwarded = exchange.getRequestHeaders().get("X-Forwarded-For");
            Subject subject = new Subject(exchange.getRemoteAddress().getAddress(),
                    forwarded == null ? null : String.join(", ", forwarded), account, null, null, null);
            // The tag lets the daemon see one password tried across many accounts (a spray).
            byte[] tag = Passwords.passwordTag(serverKey, password);
            try (Attempt attempt = limiter.begin("login", subject, tag)) {
                Answer answer = attempt.answer();
                if (!attempt.proceeds()) {
                    // One answer for every refusal; the reason is for the logs only.
                    System.err.println("login refused: " + answer);
                    status = 429;
                    body = REFUSED;
                    retryAfter = Long.toString(answer.retryAfterSecs());
                } else {
                    if (answer.delay().isPresent()) Thread.sleep(answer.delay().get().toMillis());
                    byte[] stored = users.get(account);
                    byte[] tried = hash(password);
                    boolean ok = stored != null && MessageDigest.isEqual(stored, tried);
                    byte[] digest = ok ? null : Passwords.passwordDigest(serverKey, account, password);
                    attempt.report(ok ? Outcome.SUCCESS : Outcome.FAILURE, digest, tag);
                    status = ok ? 200 : 401;
                    body = ok ? "{\"status\":\"ok\"}" : FAILED;
                }
            }
        } catch (Exception e) {
            // The guard has abandoned the attempt (if its check was allowed).
            System.err.println("login failed: " + e);
            status = 500;
            body = "{\"error\":\"internal error\"}";
        }
        if (status != 200) {
            // Refusals and unknown accounts are never faster than a real wrong password.
            long waitMs = FLOOR_MS - (System.nanoTime() - arrived) / 1_000_000;
            if (waitMs > 0) sleep(waitMs);
        }
        if (retryAfter != null) exchange.getResponseHeaders().set("Retry-After", retryAfter);
        send(exchange, status, body);
    }

    private void ping(HttpExchange exchange) throws IOException {
        Subject subject = Subject.of(exchange.getRemoteAddress().getAddress(), null);
        Answer answer = limiter.check("request", subject);
        if (answer.proceeds()) {
            send(exchange, 200, "{\"pong\":true}");
            return;
        }
        // "request" fails closed: an unreachable daemon is a 503, a refusal a 429.
        exchange.getResponseHeaders().set("Retry-After", Long.toString(answer.retryAfterSecs()));
        if (answer instanceof Answer.Unavailable) {
            send(exchange, 503, "{\"error\":\"service unavailable, try again later\"}");
        } else {
            send(exchange, 429, REFUSED);
        }
    }

    private static void send(HttpExchange exchange, int status, String body) throws IOException {
        byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
        exchange.getResponseHeaders().set("Content-Type", "application/json");
        exchange.getResponseHeaders().set("Cache-Control", "no-store");
        exchange.sendResponseHeaders(status, bytes.length);
        exchange.getResponseBody().write(bytes);
        exchange.close();
    }

    private static Map<String, String> form(String body) {
        Map<String, String> fields = new HashMap<>();
        for (String pair : body.split("&")) {
            int eq = pair.indexOf('=');
            if (eq > 0) {
                fields.put(URLDecoder.decode(pair.substring(0, eq), StandardCharsets.UTF_8),
                        URLDecoder.decode(pair.substring(eq + 1), StandardCharsets.UTF_8));
            }
        }
        return fields;
    }

    private static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    public static void main(String[] args) throws Exception {
        String socket = "/run/tollgate/tollgate.sock";
        String listen = "127.0.0.1:8080";
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (args[i].equals("--socket")) socket = args[i + 1];
            if (args[i].equals("--listen")) listen = args[i + 1];
        }
        int colon = listen.lastIndexOf(':');
        Client limiter = new Client(ClientConfig.of(socket));
        LoginServer app = new LoginServer(limiter, Map.of("alice", "correct horse battery staple"));
        HttpServer server = HttpServer.create(
                new InetSocketAddress(listen.substring(0, colon), Integer.parseInt(listen.substring(colon + 1))), 64);
        server.createContext("/login", exchange -> {
            if (!exchange.getRequestMethod().equals("POST")) {
                send(exchange, 405, "{\"error\":\"POST only\"}");
            } else {
                app.login(exchange);
            }
        });
        server.createContext("/api/ping", app::ping);
        server.setExecutor(Executors.newFixedThreadPool(16));
        server.start();
        System.err.println("listening on http://" + listen + " (tollgate at " + socket + ")");
    }
}
