package dev.tollgate.client;

import java.io.ByteArrayOutputStream;
import java.net.Inet4Address;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;

/**
 * Frames (PROTOCOL.md sections 2 to 6): a u32 LE length, then the version
 * byte, the u64 LE id and the bincode message (fixed-width little-endian
 * integers). Pure: no I/O.
 */
public final class Codec {
    public static final int PROTOCOL_VERSION = 5;
    public static final int PROTOCOL_VERSION_MIN = 1;
    /** The first version whose Check and Report carry a password tag. */
    public static final int SIGNALS_VERSION = 3;
    /** The first version with Abandon. */
    public static final int ABANDON_VERSION = 5;
    public static final int RESPONSE_PAYLOAD_BYTES_MAX = 8 * 1024 * 1024;
    static final int ENVELOPE_BYTES = 9;
    static final int VERDICT = 0;
    static final int ERROR = 5;

    private Codec() {
    }

    /** A reply that is not a well-formed response: the connection is not to be trusted. */
    public static final class MalformedReplyException extends Exception {
        public MalformedReplyException(String message) {
            super(message);
        }
    }

    /**
     * A decoded reply: a verdict or an error (the other variant, whose
     * discriminant {@code variant} is, answers no request this client sends).
     */
    public record Reply(long id, int version, int variant, Verdict verdict, ErrorReply error) {
    }

    /** The whole frame of {@code request} in {@code version}, length prefix included. */
    public static byte[] encode(int version, long id, Request request) {
        Writer out = new Writer();
        out.bytes.write(0);
        out.bytes.write(0);
        out.bytes.write(0);
        out.bytes.write(0);
        out.u8(version);
        out.u64(id);
        out.u32(request.kind().discriminant);
        out.string(request.route());
        Subject s = request.subject();
        if (s.peer() == null) {
            out.u8(0);
        } else {
            out.u8(1);
            byte[] address = s.peer().getAddress();
            out.u32(s.peer() instanceof Inet4Address ? 0 : 1);
            out.bytes.write(address, 0, address.length);
        }
        out.optionalString(s.forwardedFor());
        out.optionalString(s.account());
        out.optionalString(s.device());
        out.optionalString(s.tenant());
        out.optionalString(s.clientId());
        if (request.kind() == Request.Kind.REPORT) {
            out.u32(request.outcome().ordinal());
            out.optional16(request.passwordDigest());
        }
        if (version >= SIGNALS_VERSION && request.kind() != Request.Kind.ABANDON) {
            out.optional16(request.passwordTag());
        }
        byte[] frame = out.bytes.toByteArray();
        int length = frame.length - 4;
        for (int i = 0; i < 4; i++) frame[i] = (byte) (length >>> (8 * i));
        return frame;
    }

    /** Decodes one response payload (without its length prefix), using every byte. */
    public static Reply decode(byte[] payload) throws MalformedReplyException {
        if (payload.length < ENVELOPE_BYTES) {
            throw new MalformedReplyException("reply of " + payload.length + " bytes is shorter than the envelope");
        }
        Reader in = new Reader(payload);
        int version = in.u8();
        long id = in.u64();
        if (version < PROTOCOL_VERSION_MIN || version > PROTOCOL_VERSION) {
            throw new MalformedReplyException("reply in protocol version " + version);
        }
        long variant = in.u32();
        Verdict verdict = null;
        ErrorReply error = null;
        if (variant == VERDICT) {
            Decision decision = in.enumValue(Decision.values(), "decision");
            long retryAfterMs = in.u64();
            long delayMs = in.u64();
            long limit = in.u32();
            long remaining = in.u32();
            long resetMs = in.u64();
            Reason reason = in.enumValue(Reason.values(), "reason");
            String rule = in.string();
            boolean degraded = false;
            if (version >= 2) {
                // Bits 1 to 7 are reserved: ignored, not refused.
                degraded = (in.u8() & 1) != 0;
            }
            verdict = new Verdict(decision, retryAfterMs, delayMs, limit, remaining, resetMs, reason, rule, degraded, version);
        } else if (variant == ERROR) {
            error = new ErrorReply(in.enumValue(ErrorCode.values(), "error code"), in.string());
        } else if (variant > 7) {
            throw new MalformedReplyException("unknown response variant " + variant);
        } else {
            // Status, Lockouts and the like answer no request this client
            // sends; what they hold is not read.
            return new Reply(id, version, (int) variant, null, null);
        }
        if (in.at != payload.length) {
            throw new MalformedReplyException((payload.length - in.at) + " byte(s) left over after the reply");
        }
        return new Reply(id, version, (int) variant, verdict, error);
    }

    private static final class Writer {
        final ByteArrayOutputStream bytes = new ByteArrayOutputStream(128);

        void u8(int value) {
            bytes.write(value);
        }

        void u32(long value) {
            for (int i = 0; i < 4; i++) bytes.write((int) (value >>> (8 * i)));
        }

        void u64(long value) {
            for (int i = 0; i < 8; i++) bytes.write((int) (value >>> (8 * i)));
        }

        void string(String value) {
            byte[] utf8 = value.getBytes(StandardCharsets.UTF_8);
            u64(utf8.length);
            bytes.write(utf8, 0, utf8.length);
        }

        void optionalString(String value) {
            if (value == null) {
                u8(0);
            } else {
                u8(1);
                string(value);
            }
        }

        void optional16(byte[] value) {
            if (value == null) {
                u8(0);
            } else {
                if (value.length != 16) throw new IllegalArgumentException("a digest or tag is 16 bytes");
                u8(1);
                bytes.write(value, 0, 16);
            }
        }
    }

    private static final class Reader {
        final byte[] b;
        int at;

        Reader(byte[] b) {
            this.b = b;
        }

        private void need(int n) throws MalformedReplyException {
            if (b.length - at < n) throw new MalformedReplyException("reply ends inside a field");
        }

        int u8() throws MalformedReplyException {
            need(1);
            return b[at++] & 0xff;
        }

        long u32() throws MalformedReplyException {
            need(4);
            long value = 0;
            for (int i = 3; i >= 0; i--) value = (value << 8) | (b[at + i] & 0xffL);
            at += 4;
            return value;
        }

        long u64() throws MalformedReplyException {
            need(8);
            long value = 0;
            for (int i = 7; i >= 0; i--) value = (value << 8) | (b[at + i] & 0xffL);
            at += 8;
            return value;
        }

        String string() throws MalformedReplyException {
            long length = u64();
            if (length < 0 || length > b.length - at) throw new MalformedReplyException("string longer than the reply");
            try {
                String s = StandardCharsets.UTF_8.newDecoder()
                        .onMalformedInput(CodingErrorAction.REPORT)
                        .onUnmappableCharacter(CodingErrorAction.REPORT)
                        .decode(ByteBuffer.wrap(b, at, (int) length))
                        .toString();
                at += (int) length;
                return s;
            } catch (CharacterCodingException e) {
                throw new MalformedReplyException("string is not UTF-8");
            }
        }

        <E extends Enum<E>> E enumValue(E[] values, String what) throws MalformedReplyException {
            long value = u32();
            if (value >= values.length) throw new MalformedReplyException("unknown " + what + " " + value);
            return values[(int) value];
        }
    }
}
