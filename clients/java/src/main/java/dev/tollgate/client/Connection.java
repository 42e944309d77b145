package dev.tollgate.client;

import java.io.Closeable;
import java.io.EOFException;
import java.io.IOException;
import java.net.SocketException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Locale;

/**
 * One connection to the daemon, used by one call at a time. Non-blocking
 * with its own Selector: a blocking channel's read cannot time out, and
 * the per-call deadline is the whole point of the client.
 */
final class Connection implements Closeable {
    /** The daemon did not answer by the deadline: the connection's state is unknown. */
    static final class TimedOut extends Exception {
        TimedOut() {
            this("no answer by the deadline");
        }

        TimedOut(String message) {
            super(message, null, false, false);
        }
    }

    /** The socket could not be reached at all. */
    static final class ConnectFailed extends IOException {
        ConnectFailed(String message, Throwable cause) {
            super(message, cause);
        }
    }

    /** A reply over RESPONSE_PAYLOAD_BYTES_MAX: the connection is broken. */
    static final class TooLarge extends IOException {
        TooLarge(long length) {
            super("reply of " + length + " bytes is over the maximum of " + Codec.RESPONSE_PAYLOAD_BYTES_MAX);
        }
    }

    private final SocketChannel channel;
    private final Selector selector;
    private final SelectionKey key;
    private final ByteBuffer header = ByteBuffer.allocate(4).order(ByteOrder.LITTLE_ENDIAN);
    /** The version this connection's requests go out in: lowered once for each newer version its daemon refused. */
    int version;

    private Connection(SocketChannel channel, Selector selector, SelectionKey key, int version) {
        this.channel = channel;
        this.selector = selector;
        this.key = key;
        this.version = version;
    }

    static Connection open(Path socket, int version, long deadlineNanos) throws IOException, TimedOut {
        SocketChannel channel = SocketChannel.open(StandardProtocolFamily.UNIX);
        Selector selector = null;
        try {
            channel.configureBlocking(false);
            boolean connected;
            try {
                connected = channel.connect(UnixDomainSocketAddress.of(socket));
            } catch (IOException e) {
                if (queueFull(e, socket)) throw new TimedOut(QUEUE_FULL);
                throw new ConnectFailed("cannot reach tollgate at " + socket + ": " + e.getMessage(), e);
            }
            selector = Selector.open();
            SelectionKey key = channel.register(selector, 0);
            Connection connection = new Connection(channel, selector, key, version);
            while (!connected) {
                connection.await(SelectionKey.OP_CONNECT, deadlineNanos);
                try {
                    connected = channel.finishConnect();
                } catch (IOException e) {
                    if (queueFull(e, socket)) throw new TimedOut(QUEUE_FULL);
                    throw new ConnectFailed("cannot reach tollgate at " + socket + ": " + e.getMessage(), e);
                }
            }
            return connection;
        } catch (IOException | TimedOut | RuntimeException e) {
            channel.close();
            if (selector != null) selector.close();
            throw e;
        }
    }

    /** The detail of a {@link TimedOut} for a connect refused by a full accept queue. */
    static final String QUEUE_FULL = "its accept queue is full";

    /**
     * Whether a failed connect met a full accept queue (EAGAIN): the daemon
     * is alive but late to accept (each timed-out client's connection waits
     * in its queue), which is a late daemon, not a down one. Taken for a
     * connect error, a stalled daemon's queue would let login fail open past
     * the busy rule. Only nobody listening (ECONNREFUSED: a
     * ConnectException), no socket there (ENOENT) or no permission (EACCES:
     * a BindException) is unreachable. The JDK reports EAGAIN as a plain
     * SocketException whose errno shows only in its strerror text, which
     * the locale may translate: a plain SocketException on a path that
     * exists is taken as EAGAIN too (ENOENT has no path).
     */
    static boolean queueFull(IOException e, Path socket) {
        if (e.getClass() != SocketException.class) return false;
        String message = String.valueOf(e.getMessage()).toLowerCase(Locale.ROOT);
        if (message.contains("temporarily unavailable") || message.contains("would block") || message.contains("try again")) return true;
        if (message.contains("no such file")) return false;
        return Files.exists(socket);
    }

    /** Writes one frame and reads one reply payload (without its length prefix), by the deadline. */
    byte[] roundTrip(byte[] frame, long deadlineNanos) throws IOException, TimedOut {
        ByteBuffer out = ByteBuffer.wrap(frame);
        while (true) {
            channel.write(out);
            if (!out.hasRemaining()) break;
            await(SelectionKey.OP_WRITE, deadlineNanos);
        }
        header.clear();
        readFully(header, deadlineNanos);
        long length = Integer.toUnsignedLong(header.getInt(0));
        if (length > Codec.RESPONSE_PAYLOAD_BYTES_MAX) throw new TooLarge(length);
        ByteBuffer payload = ByteBuffer.allocate((int) length);
        readFully(payload, deadlineNanos);
        return payload.array();
    }

    private void readFully(ByteBuffer into, long deadlineNanos) throws IOException, TimedOut {
        while (into.hasRemaining()) {
            int n = channel.read(into);
            if (n < 0) throw new EOFException("tollgate closed the connection");
            if (n == 0 && into.hasRemaining()) await(SelectionKey.OP_READ, deadlineNanos);
        }
    }

    private void await(int ops, long deadlineNanos) throws IOException, TimedOut {
        long left = deadlineNanos - System.nanoTime();
        if (left <= 0) throw new TimedOut();
        key.interestOps(ops);
        // select(0) would wait forever: at least 1 ms, and the deadline is
        // checked again on the next pass.
        selector.select(Math.max(1, (left + 999_999) / 1_000_000));
        selector.selectedKeys().clear();
    }

    @Override
    public void close() {
        try {
            channel.close();
        } catch (IOException ignored) {
            // Closing a broken connection: nothing left to do with it.
        }
        try {
            selector.close();
        } catch (IOException ignored) {
            // As above.
        }
    }
}
