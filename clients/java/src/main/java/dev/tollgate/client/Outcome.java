package dev.tollgate.client;

/** How a credential check ended; the ordinal is the wire value. */
public enum Outcome {
    SUCCESS, FAILURE;

    public String wireName() {
        return name().toLowerCase(java.util.Locale.ROOT);
    }
}
