package dev.tollgate.client;

import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A scripted daemon on a temporary Unix socket, for what a real one will
 * not do on demand: speak version 1 only, stay silent, send a bad reply.
 */
final class FakeDaemon implements AutoCloseable {
    /** One request frame as received. */
    record Frame(int version, long id, int variant, byte[] whole, String account) {
    }

    /** The reply frame to send (whole, length included), or null to stay silent. */
    interface Handler {
        byte[] reply(Frame frame);
    }

    final Path dir;
    final Path socket;
    private final ServerSocketChannel server;
    final List<Frame> frames = Collections.synchronizedList(new ArrayList<>());
    final AtomicInteger connections = new AtomicInteger();
    /** Connections accepted and not yet closed by the client (nor by this daemon). */
    final AtomicInteger live = new AtomicInteger();
    volatile Handler handler;
    volatile boolean closeAfterReply;
    private final List<SocketChannel> open = Collections.synchronizedList(new ArrayList<>());

    FakeDaemon(Handler handler) throws IOException {
        this.handler = handler;
        dir = Files.createTempDirectory("tollgate-fake");
        socket = dir.resolve("t.sock");
        server = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
        server.bind(UnixDomainSocketAddress.of(socket));
        Thread acceptor = new Thread(this::accept, "fake-daemon");
        acceptor.setDaemon(true);
        acceptor.start();
    }

    private void accept() {
        while (server.isOpen()) {
            try {
                SocketChannel conn = server.accept();
                connections.incrementAndGet();
                live.incrementAndGet();
                open.add(conn);
                Thread t = new Thread(() -> serve(conn), "fake-conn");
                t.setDaemon(true);
                t.start();
            } catch (IOException e) {
                return;
            }
        }
    }

    private void serve(SocketChannel conn) {
        try (conn) {
            while (true) {
                ByteBuffer header = ByteBuffer.allocate(4).order(ByteOrder.LITTLE_ENDIAN);
                if (!readFully(conn, header)) return;
                int length = header.getInt(0);
                ByteBuffer payload = ByteBuffer.allocate(length);
                if (!readFully(conn, payload)) return;
                ByteBuffer p = payload.flip().order(ByteOrder.LITTLE_ENDIAN);
                byte[] whole = new byte[4 + length];
                header.flip();
                header.get(whole, 0, 4);
                p.get(whole, 4, length);
                ByteBuffer b = ByteBuffer.wrap(whole).order(ByteOrder.LITTLE_ENDIAN);
                Frame frame = new Frame(whole[4], b.getLong(5), b.getInt(13), whole, accountOf(whole));
                frames.add(frame);
                byte[] reply = handler.reply(frame);
                if (reply != null) {
                    ByteBuffer out = ByteBuffer.wrap(reply);
                    while (out.hasRemaining()) conn.write(out);
                    if (closeAfterReply) return;
                }
            }
        } catch (IOException e) {
            // The client closed the connection: fine.
        } finally {
            live.decrementAndGet();
        }
    }

    /** The account of a Check, Report or Abandon frame (for scripting by account). */
    private static String accountOf(byte[] whole) {
        ByteBuffer b = ByteBuffer.wrap(whole).order(ByteOrder.LITTLE_ENDIAN);
        b.position(17);
        skip(b, (int) b.getLong()); // route
        if (b.get() == 1) skip(b, b.getInt() == 0 ? 4 : 16);
        if (b.get() == 1) skip(b, (int) b.getLong()); // forwarded_for
        if (b.get() != 1) return null;
        byte[] account = new byte[(int) b.getLong()];
        b.get(account);
        return new String(account, StandardCharsets.UTF_8);
    }

    private static void skip(ByteBuffer b, int n) {
        b.position(b.position() + n);
    }

    private static boolean readFully(SocketChannel conn, ByteBuffer into) throws IOException {
        while (into.hasRemaining()) {
            if (conn.read(into) < 0) return false;
        }
        return true;
    }

    long count(int variant) {
        synchronized (frames) {
            return frames.stream().filter(f -> f.variant() == variant).count();
        }
    }

    @Override
    public void close() throws IOException {
        server.close();
        synchronized (open) {
            for (SocketChannel c : open) c.close();
        }
        Files.deleteIfExists(socket);
        Files.deleteIfExists(dir);
    }

    static byte[] verdict(int version, long id, Decision decision, long retryAfterMs, long delayMs, int flags) {
        ByteBuffer b = ByteBuffer.allocate(200).order(ByteOrder.LITTLE_ENDIAN);
        b.putInt(0).put((byte) version).putLong(id).putInt(0);
        b.putInt(decision.ordinal()).putLong(retryAfterMs).putLong(delayMs).putInt(5).putInt(4).putLong(0);
        b.putInt(decision == Decision.ALLOW ? 0 : 2);
        byte[] rule = "source_failures".getBytes(StandardCharsets.UTF_8);
        b.putLong(rule.length).put(rule);
        if (version >= 2) b.put((byte) flags);
        b.putInt(0, b.position() - 4);
        byte[] out = new byte[b.position()];
        b.flip().get(out);
        return out;
    }

    static byte[] error(int version, long id, ErrorCode code, String message) {
        ByteBuffer b = ByteBuffer.allocate(200).order(ByteOrder.LITTLE_ENDIAN);
        byte[] text = message.getBytes(StandardCharsets.UTF_8);
        b.putInt(0).put((byte) version).putLong(id).putInt(5).putInt(code.ordinal()).putLong(text.length).put(text);
        b.putInt(0, b.position() - 4);
        byte[] out = new byte[b.position()];
        b.flip().get(out);
        return out;
    }

    /**
     * Answers as {@code answering} does, but {@code delayMs} after each
     * request: past a shorter client timeout, a daemon alive but late. Each
     * connection has its own thread here, so the delays do not add up.
     * {@code repliedNanos} gets the instant of each reply.
     */
    static Handler lateBy(long delayMs, Handler answering, java.util.concurrent.atomic.AtomicLong repliedNanos) {
        return f -> {
            try {
                Thread.sleep(delayMs);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return null;
            }
            byte[] reply = answering.reply(f);
            repliedNanos.set(System.nanoTime());
            return reply;
        };
    }

    /**
     * A daemon speaking versions 1 to {@code newest}: a newer frame gets
     * version 1's unsupported_version, an Abandon before version 5 gets
     * malformed, anything else a verdict whose decision is named by the
     * account ("deny", "delay", "challenge"; else allow).
     */
    static Handler speaking(int newest) {
        return f -> {
            if (f.version() > newest) return error(1, f.id(), ErrorCode.UNSUPPORTED_VERSION, "unsupported");
            if (f.variant() == 8 && f.version() < 5) return error(f.version(), f.id(), ErrorCode.MALFORMED, "needs 5");
            Decision d = Decision.ALLOW;
            for (Decision each : Decision.values()) {
                if (each.wireName().equals(f.account())) d = each;
            }
            return verdict(f.version(), f.id(), d, d == Decision.ALLOW ? 0 : 1500, d == Decision.DELAY ? 20 : 0, 0);
        };
    }
}
