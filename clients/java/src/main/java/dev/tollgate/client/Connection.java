package dev.tollgate.client;

import java.io.Closeable;
import java.io.EOFException;
import java.io.IOException;
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
            this(NO_ANSWER);
        }

        TimedOut(String message) {
            super(message, null, false, false);
        }
    }

    /** The detail of a {@link TimedOut} for a daemon silent until the deadline. */
    static final String NO_ANSWER = "no answer by the deadline";

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
    /**
     * Whether the last request was written whole: only then does the daemon
     * owe a reply, and a timed-out call's connection is worth listening on.
     */
    private boolean requestWritten;

    private Connection(SocketChannel channel, Selector selector, SelectionKey key, int version) {
        this.channel = channel;
        this.selector = selector;
        this.key = key;
        this.version = version;
    }

    static Connection open(Path socket, int version, long deadlineNanos) throws IOException, TimedOut {
        SocketChannel channel = null;
        Selector selector = null;
        try {
            // Created inside the try: running out of descriptors (EMFILE,
            // ENFILE, ENOBUFS, ENOMEM) is classified like any other failure.
            channel = SocketChannel.open(StandardProtocolFamily.UNIX);
            channel.configureBlocking(false);
            boolean connected = channel.connect(UnixDomainSocketAddress.of(socket));
            selector = Selector.open();
            SelectionKey key = channel.register(selector, 0);
            Connection connection = new Connection(channel, selector, key, version);
            while (!connected) {
                connection.await(SelectionKey.OP_CONNECT, deadlineNanos);
                connected = channel.finishConnect();
            }
            return connection;
        } catch (IOException | TimedOut | RuntimeException e) {
            if (channel != null) channel.close();
            if (selector != null) selector.close();
            if (e instanceof IOException io) {
                if (unreachable(io, socket)) {
                    throw new ConnectFailed("cannot reach tollgate at " + socket + ": " + io.getMessage(), io);
                }
                throw new TimedOut(String.valueOf(io.getMessage()));
            }
            throw e;
        }
    }

    /**
     * Whether a failure to create or connect the socket means nobody can be
     * reached: nobody listening (ECONNREFUSED: a ConnectException), no
     * socket there (ENOENT) or no permission (EACCES: a BindException).
     * Every other failure (a full accept queue's EAGAIN, EMFILE, ENFILE,
     * ENOBUFS, ENOMEM, ...) is a late daemon: taken for a connect error, an
     * attacker who exhausts the auth server's descriptors or the daemon's
     * queue would let login fail open past the busy rule. The JDK gives no
     * errno and its strerror text may be translated by the locale: a plain
     * SocketException is ENOENT only by its English text or a path that
     * does not exist (EAGAIN's English text is late even then).
     */
    static boolean unreachable(IOException e, Path socket) {
        if (e instanceof java.net.ConnectException || e instanceof java.net.BindException
                || e instanceof java.nio.file.AccessDeniedException || e instanceof java.nio.file.NoSuchFileException) {
            return true;
        }
        String message = String.valueOf(e.getMessage()).toLowerCase(Locale.ROOT);
        if (message.contains("temporarily unavailable") || message.contains("would block") || message.contains("try again")) return false;
        if (message.contains("no such file") || message.contains("permission denied")) return true;
        return !Files.exists(socket);
    }

    /** Writes one frame and reads one reply payload (without its length prefix), by the deadline. */
    byte[] roundTrip(byte[] frame, long deadlineNanos) throws IOException, TimedOut {
        requestWritten = false;
        header.clear();
        ByteBuffer out = ByteBuffer.wrap(frame);
        while (true) {
            channel.write(out);
            if (!out.hasRemaining()) break;
            await(SelectionKey.OP_WRITE, deadlineNanos);
        }
        requestWritten = true;
        readFully(header, deadlineNanos);
        long length = Integer.toUnsignedLong(header.getInt(0));
        if (length > Codec.RESPONSE_PAYLOAD_BYTES_MAX) throw new TooLarge(length);
        ByteBuffer payload = ByteBuffer.allocate((int) length);
        readFully(payload, deadlineNanos);
        return payload.array();
    }

    /** Whether the last request went out whole (after a {@link TimedOut}: the daemon has it and owes a reply). */
    boolean requestWritten() {
        return requestWritten;
    }

    /**
     * For a call that timed out after its request was written: whether any
     * byte of the reply comes by the deadline. Bytes are not parsed (only
     * the daemon writes on its socket), and part of the reply read before
     * the call gave up counts as well: the daemon was answering, only not
     * in time. False at the deadline, at the end of the stream, on an error,
     * or when the thread is interrupted (the client was closed).
     */
    boolean hearsReply(long deadlineNanos) {
        if (header.position() > 0) return true;
        ByteBuffer one = ByteBuffer.allocate(1);
        try {
            while (!Thread.currentThread().isInterrupted()) {
                int n = channel.read(one);
                if (n > 0) return true;
                if (n < 0) return false;
                await(SelectionKey.OP_READ, deadlineNanos);
            }
            return false;
        } catch (IOException | TimedOut e) {
            return false;
        }
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
