package dev.tollgate.client;

import java.util.Map;

/** What a client does with an attempt when the daemon cannot answer in time. */
public enum FailPolicy {
    /** Let the attempt proceed: the rule protects users, and refusing every login while the limiter is down would be the bigger harm. */
    OPEN,
    /** Refuse the attempt (unless within the route's static budget): the rule protects the system. */
    CLOSED;

    /**
     * The built-in routes' policies, as the Rust client's BUILTIN_FAIL_POLICIES
     * and the daemon's built-in routes: login and reauth open, the rest closed.
     */
    public static final Map<String, FailPolicy> BUILTIN = Map.of(
            "login", OPEN,
            "reauth", OPEN,
            "request", CLOSED,
            "mfa_verify", CLOSED,
            "mfa_resend", CLOSED,
            "password_reset", CLOSED,
            "registration", CLOSED,
            "token", CLOSED);

    public String wireName() {
        return name().toLowerCase(java.util.Locale.ROOT);
    }
}
