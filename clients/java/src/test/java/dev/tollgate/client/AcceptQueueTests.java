package dev.tollgate.client;

import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

/**
 * A daemon late to accept (its listen queue full of timed-out clients'
 * connections) makes connect fail with EAGAIN at once: that is a late
 * daemon, a timeout under the busy rule, never "cannot be reached" (which
 * would let login fail open on a locked account).
 */
final class AcceptQueueTests {
    private AcceptQueueTests() {
    }

    static void run() throws Exception {
        Expect.group("a full accept queue is a late daemon, not a down one");
        Path dir = Files.createTempDirectory("tollgate-queue");
        Path socket = dir.resolve("t.sock");
        List<SocketChannel> fillers = new ArrayList<>();
        ServerSocketChannel server = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
        try {
            server.bind(UnixDomainSocketAddress.of(socket), 1);
            classifies(socket);
            // Accepts one connection and answers its one check, then never accepts again.
            Thread once = new Thread(() -> answerOnce(server), "accept-once");
            once.setDaemon(true);
            once.start();
            Subject alice = FakeDaemonTests.subject("alice");
            try (Client never = new Client(ClientConfig.of(socket).timeout(Duration.ofSeconds(2)));
                    Client client = new Client(ClientConfig.of(socket).timeout(Duration.ofSeconds(2)))) {
                Expect.that(client.check("login", FakeDaemonTests.subject("warm")).verdict().isPresent(), "answered once");
                once.join();
                client.close(); // no pooled connection: every call connects
                boolean full = false;
                for (int i = 0; i < 16 && !full; i++) {
                    SocketChannel c = SocketChannel.open(StandardProtocolFamily.UNIX);
                    c.configureBlocking(false);
                    fillers.add(c);
                    try {
                        c.connect(UnixDomainSocketAddress.of(socket));
                    } catch (IOException e) {
                        full = true;
                    }
                }
                Expect.that(full, "the queue is full: a connect fails at once");

                Answer first = never.check("login", alice);
                Expect.that(FakeDaemonTests.kind(first) == ClientError.Kind.TIMEOUT,
                        "a daemon never heard from, queue full: timeout, not connect: " + first);

                // Both checks are counted as waiting before either connects:
                // the pool's lock (taken before connecting) holds them.
                Answer[] pair = new Answer[2];
                List<Thread> threads = new ArrayList<>();
                Object pool = poolOf(client);
                synchronized (pool) {
                    for (int i = 0; i < 2; i++) {
                        int at = i;
                        Thread t = new Thread(() -> pair[at] = client.check("login", alice));
                        t.start();
                        threads.add(t);
                    }
                    Thread.sleep(30);
                }
                for (Thread t : threads) t.join();
                for (Answer a : pair) {
                    Expect.that(FakeDaemonTests.kind(a) == ClientError.Kind.BUSY && !a.proceeds(),
                            "an overlapped pair on one account, queue full: busy, never proceeds: " + a);
                }
                Answer again = client.check("login", alice);
                Expect.that(FakeDaemonTests.kind(again) == ClientError.Kind.BUSY && !again.proceeds(),
                        "the next check within the burst gap: busy: " + again);
                Thread.sleep(Bursts.BURST_GAP_US / 1000 + 10);
                Answer lone = client.check("login", FakeDaemonTests.subject("erin"));
                Expect.that(FakeDaemonTests.kind(lone) == ClientError.Kind.TIMEOUT && lone.proceeds(),
                        "a lone user's check, queue full: a timeout (the policy applies): " + lone);
                Expect.that(lone instanceof Answer.Unavailable u && u.error().message().contains("connecting: "),
                        "the timeout names the failed connect: " + lone);
            }
            for (SocketChannel c : fillers) c.close();
            fillers.clear();
            server.close();
            try (Client client = new Client(ClientConfig.of(socket).timeout(Duration.ofSeconds(2)))) {
                Answer refused = client.check("login", alice);
                Expect.that(FakeDaemonTests.kind(refused) == ClientError.Kind.CONNECT && refused.proceeds(),
                        "a socket nobody listens on (ECONNREFUSED): connect: " + refused);
            }
        } finally {
            for (SocketChannel c : fillers) c.close();
            server.close();
            Files.deleteIfExists(socket);
            Files.deleteIfExists(dir);
        }
    }

    /** The errno shows only in strerror text, which a locale may translate: the class and the path decide then. */
    private static void classifies(Path existing) {
        Path missing = existing.resolveSibling("missing.sock");
        Expect.that(!Connection.unreachable(new java.net.SocketException("Resource temporarily unavailable"), missing),
                "EAGAIN's text: late, not unreachable");
        Expect.that(!Connection.unreachable(new java.net.SocketException("Ressource temporairement non disponible"), existing),
                "a translated plain SocketException on an existing socket: late");
        Expect.that(!Connection.unreachable(new java.net.SocketException("Too many open files"), existing),
                "EMFILE: late, not unreachable");
        Expect.that(!Connection.unreachable(new IOException("No buffer space available"), existing),
                "ENOBUFS (a plain IOException): late");
        Expect.that(Connection.unreachable(new java.net.SocketException("Aucun fichier ou dossier de ce type"), missing),
                "no socket there (ENOENT, translated): unreachable");
        Expect.that(Connection.unreachable(new java.net.SocketException("No such file or directory"), existing),
                "ENOENT's text: unreachable");
        Expect.that(Connection.unreachable(new java.net.ConnectException("Connection refused"), existing),
                "nobody listening (ECONNREFUSED): unreachable");
        Expect.that(Connection.unreachable(new java.net.BindException("Permission denied"), existing),
                "no permission (EACCES): unreachable");
        Expect.that(Connection.unreachable(new java.nio.file.AccessDeniedException(existing.toString()), existing),
                "no permission (AccessDeniedException): unreachable");
    }

    static Object poolOf(Client client) throws Exception {
        java.lang.reflect.Field field = Client.class.getDeclaredField("pool");
        field.setAccessible(true);
        return field.get(client);
    }

    static void answerOnce(ServerSocketChannel server) {
        try {
            SocketChannel conn = server.accept();
            ByteBuffer header = ByteBuffer.allocate(4).order(ByteOrder.LITTLE_ENDIAN);
            while (header.hasRemaining()) {
                if (conn.read(header) < 0) return;
            }
            ByteBuffer frame = ByteBuffer.allocate(header.getInt(0)).order(ByteOrder.LITTLE_ENDIAN);
            while (frame.hasRemaining()) {
                if (conn.read(frame) < 0) return;
            }
            int version = frame.get(0);
            long id = frame.getLong(1);
            ByteBuffer out = ByteBuffer.wrap(FakeDaemon.verdict(version, id, Decision.ALLOW, 0, 0, 0));
            while (out.hasRemaining()) conn.write(out);
            // Kept open (not closed) so the client's connection does not
            // free a place in the queue it does not hold anyway.
        } catch (IOException e) {
            // The test failed to warm the client: its check says so.
        }
    }
}
