package dev.tollgate.client;

/**
 * Why a verdict is what it is; the ordinal is the wire value. For logs
 * only: the end user sees one refusal whatever the reason.
 */
public enum Reason {
    ALLOWED, RATE_LIMITED, TOO_MANY_FAILURES, MONITOR_RATE_LIMITED, MONITOR_TOO_MANY_FAILURES,
    SPRAY_SUSPECTED, DISTRIBUTED_ATTACK, TENANT_ANOMALY, MONITOR_SIGNAL, ATTEMPTS_IN_FLIGHT;

    public String wireName() {
        return name().toLowerCase(java.util.Locale.ROOT);
    }
}
