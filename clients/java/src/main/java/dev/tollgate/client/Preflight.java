package dev.tollgate.client;

/**
 * What the client refuses itself, before any I/O. A request the daemon
 * would refuse for its size is not sent: the daemon answers an oversized
 * frame and closes while the client is still writing it, the write fails,
 * and an open route would then fail open, so padding an identifier would
 * buy unlimited guesses (and lose the failure reports). A lone surrogate
 * has no UTF-8 form: Java would send it as '?', so different strings would
 * share one counter.
 */
final class Preflight {
    /** PROTOCOL.md: account, device, tenant and client_id are at most this many UTF-8 bytes. */
    static final int IDENTIFIER_BYTES_MAX = 512;
    /** PROTOCOL.md REQUEST_PAYLOAD_BYTES_MAX: a longer request payload is refused. */
    static final int REQUEST_PAYLOAD_BYTES_MAX = 16 * 1024;
    /**
     * More than any request adds around its strings (envelope, variant,
     * string lengths, options, peer, outcome, digest and tag): below it,
     * the payload need not be encoded to know it fits.
     */
    private static final int OVERHEAD_BYTES_BOUND = 256;

    private Preflight() {
    }

    /**
     * The refusal of {@code request}, or null when it may be sent.
     * {@code given} is the subject as the caller gave it (the request holds
     * its X-Forwarded-For tail); {@code version} the newest version it could go out in.
     */
    static Answer.Rejected refusal(Subject given, Request request, int version) {
        String[][] texts = {
            {"route", request.route()},
            {"subject.forwarded_for", given.forwardedFor()},
            {"subject.account", given.account()},
            {"subject.device", given.device()},
            {"subject.tenant", given.tenant()},
            {"subject.client_id", given.clientId()},
        };
        for (String[] text : texts) {
            if (utf8Length(text[1]) < 0) {
                return rejected(ErrorCode.MALFORMED, "field `" + text[0]
                        + "` is not well-formed UTF-16 (an unpaired surrogate) (refused before sending)");
            }
        }
        // texts[2..5]: the identifiers.
        for (int i = 2; i < texts.length; i++) {
            int bytes = utf8Length(texts[i][1]);
            if (bytes > IDENTIFIER_BYTES_MAX) {
                return rejected(ErrorCode.FIELD_TOO_LONG, "field `" + texts[i][0] + "` is " + bytes
                        + " bytes; the maximum is " + IDENTIFIER_BYTES_MAX + " (refused before sending)");
            }
        }
        Subject sent = request.subject();
        long strings = (long) utf8Length(request.route()) + utf8Length(sent.forwardedFor()) + utf8Length(sent.account())
                + utf8Length(sent.device()) + utf8Length(sent.tenant()) + utf8Length(sent.clientId());
        if (strings + OVERHEAD_BYTES_BOUND > REQUEST_PAYLOAD_BYTES_MAX) {
            // Near the limit: the exact size. Lower versions only drop bytes.
            int payload = Codec.encode(version, 0, request).length - 4;
            if (payload > REQUEST_PAYLOAD_BYTES_MAX) {
                return rejected(ErrorCode.FRAME_TOO_LARGE, "request of " + payload + " bytes; the maximum is "
                        + REQUEST_PAYLOAD_BYTES_MAX + " (refused before sending)");
            }
        }
        return null;
    }

    private static Answer.Rejected rejected(ErrorCode code, String message) {
        return new Answer.Rejected(new ErrorReply(code, message));
    }

    /** The UTF-8 length of {@code text} (0 for null), or -1 if it holds an unpaired surrogate. */
    static int utf8Length(String text) {
        if (text == null) return 0;
        int bytes = 0;
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            if (c < 0x80) {
                bytes += 1;
            } else if (c < 0x800) {
                bytes += 2;
            } else if (Character.isHighSurrogate(c)) {
                if (i + 1 == text.length() || !Character.isLowSurrogate(text.charAt(i + 1))) return -1;
                i++;
                bytes += 4;
            } else if (Character.isLowSurrogate(c)) {
                return -1;
            } else {
                bytes += 3;
            }
        }
        return bytes;
    }
}
