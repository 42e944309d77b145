package dev.tollgate.client;

import java.net.InetAddress;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;

/**
 * Loads and runs the call path once per JVM, on a private socket pair,
 * before the first real call: in a cold JVM, class loading alone takes
 * longer than the 5 ms deadline, and the first login would fail over to
 * the fail policy for nothing.
 */
final class Warmup {
    private static final int ROUNDS = 300;
    private static boolean done;

    private Warmup() {
    }

    static synchronized void once() {
        if (done) return;
        done = true;
        Path dir = null;
        try {
            dir = Files.createTempDirectory("tollgate-warmup");
            Path socket = dir.resolve("s");
            try (ServerSocketChannel server = ServerSocketChannel.open(StandardProtocolFamily.UNIX)) {
                server.bind(UnixDomainSocketAddress.of(socket));
                Subject subject = Subject.of(InetAddress.getByAddress(new byte[] {127, 0, 0, 1}), "warm-up");
                Request request = Request.check("login", subject.bounded(), Passwords.passwordTag(new byte[32], ""));
                long deadline = System.nanoTime() + 2_000_000_000L;
                try (Connection conn = Connection.open(socket, Codec.PROTOCOL_VERSION, deadline);
                        SocketChannel peer = server.accept();
                        Selector selector = Selector.open()) {
                    peer.configureBlocking(false);
                    peer.register(selector, SelectionKey.OP_READ);
                    byte[] frame = Codec.encode(Codec.PROTOCOL_VERSION, 1, request);
                    // An allow verdict for id 1 in version 5: the envelope, then zeros
                    // (variant, decision, numbers, reason, empty rule, flags).
                    byte[] reply = new byte[4 + 62];
                    reply[0] = 62;
                    reply[4] = 5;
                    reply[5] = 1;
                    ByteBuffer received = ByteBuffer.allocate(frame.length);
                    // Enough rounds for the JIT's first tier to compile the path.
                    for (int round = 0; round < ROUNDS; round++) {
                        peer.write(ByteBuffer.wrap(reply));
                        byte[] payload = conn.roundTrip(Codec.encode(Codec.PROTOCOL_VERSION, 1, request), deadline);
                        Codec.decode(payload);
                        selector.selectNow();
                        selector.selectedKeys().clear();
                        received.clear();
                        while (received.hasRemaining() && peer.read(received) > 0) {
                            // Drained: the peer's buffer never fills.
                        }
                    }
                }
            }
            new Answer.Unavailable(FailPolicy.OPEN, new ClientError(ClientError.Kind.TIMEOUT, ""), false).retryAfterSecs();
        } catch (Exception e) {
            // A warm-up that fails costs only the first call's speed.
        } finally {
            if (dir != null) {
                try {
                    Files.deleteIfExists(dir.resolve("s"));
                    Files.deleteIfExists(dir);
                } catch (Exception ignored) {
                    // A leftover empty temp directory is harmless.
                }
            }
        }
    }
}
