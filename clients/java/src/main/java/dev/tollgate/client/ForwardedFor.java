package dev.tollgate.client;

import java.nio.charset.StandardCharsets;

/** The part of an X-Forwarded-For header the daemon reads, as the Rust client's forwarded_tail. */
public final class ForwardedFor {
    /**
     * Bytes of X-Forwarded-For the daemon reads, from the right: the work
     * per request is bounded however long a header the end user sends.
     */
    public static final int BYTES_MAX = 4096;

    private ForwardedFor() {
    }

    /**
     * All of the header, or for a longer one the whole entries within its
     * last {@link #BYTES_MAX} UTF-8 bytes (after the first comma at or after
     * byte {@code len - 4096 - 1}); empty when there is no such comma. Sent
     * whole, a header the end user made huge would overflow the frame and
     * get the attempt refused as malformed.
     */
    public static String tail(String header) {
        byte[] bytes = header.getBytes(StandardCharsets.UTF_8);
        int start = bytes.length - BYTES_MAX;
        if (start <= 0) return header;
        for (int i = start - 1; i < bytes.length; i++) {
            // An ASCII comma is never inside a multi-byte character.
            if (bytes[i] == ',') return new String(bytes, i + 1, bytes.length - i - 1, StandardCharsets.UTF_8);
        }
        return "";
    }
}
