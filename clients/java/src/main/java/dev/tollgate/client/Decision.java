package dev.tollgate.client;

/** A verdict's decision (PROTOCOL.md section 7); the ordinal is the wire value. */
public enum Decision {
    ALLOW, DELAY, CHALLENGE, DENY;

    /** The name `--json` output and the conformance kit use. */
    public String wireName() {
        return name().toLowerCase(java.util.Locale.ROOT);
    }
}
