package dev.tollgate.client;

/** An `Error` reply's code; the ordinal is the wire value. */
public enum ErrorCode {
    MALFORMED, UNSUPPORTED_VERSION, UNKNOWN_ROUTE, MISSING_FIELD, FIELD_TOO_LONG,
    PERMISSION_DENIED, NOT_MANUAL_CLOCK, FRAME_TOO_LARGE, INTERNAL;

    public String wireName() {
        return name().toLowerCase(java.util.Locale.ROOT);
    }
}
