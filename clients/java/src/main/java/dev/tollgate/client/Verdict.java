package dev.tollgate.client;

/**
 * The daemon's verdict, with what later versions add: {@code degraded}
 * (version 2's flags bit 0) and the version the reply came in.
 */
public record Verdict(
        Decision decision,
        long retryAfterMs,
        long delayMs,
        long limit,
        long remaining,
        long resetMs,
        Reason reason,
        String rule,
        boolean degraded,
        int version) {

    /** Whether the caller may go ahead (after {@code delayMs} for a delay). */
    public boolean proceeds() {
        return decision == Decision.ALLOW || decision == Decision.DELAY;
    }
}
