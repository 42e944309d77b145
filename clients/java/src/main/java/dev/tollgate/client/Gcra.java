package dev.tollgate.client;

/**
 * GCRA (generic cell rate algorithm), as the Rust client's gcra.rs: a rate
 * limit whose whole state is one theoretical arrival time (TAT), here for
 * the static budget of a closed route while the daemon is unreachable.
 */
public final class Gcra {
    private Gcra() {
    }

    /** {@code burst} requests at once, refilled at one per {@code intervalUs}. */
    public record Spec(long intervalUs, long burst) {
        /** {@code limit} requests per {@code periodUs} sustained, {@code burst} at once (each at least 1). */
        public static Spec of(long limit, long periodUs, long burst) {
            long l = Math.max(1, limit);
            long p = Math.max(1, periodUs);
            long interval = Math.max(1, (p + l - 1) / l);
            return new Spec(interval, Math.max(1, burst));
        }

        long toleranceUs() {
            // Saturating: a day-long interval times a huge burst would wrap.
            return intervalUs > Long.MAX_VALUE / burst ? Long.MAX_VALUE : intervalUs * burst;
        }
    }

    /** One step's answer and the TAT after it (unchanged when refused, or when not spending). */
    public record Decision(boolean allowed, long remaining, long retryAfterUs, long resetUs, long tatAfterUs) {
    }

    /** Decides one request against a TAT ({@code tatUs} < 0: none yet). */
    public static Decision decide(Spec spec, long tatUs, long nowUs, boolean spend) {
        long tat = Math.max(tatUs < 0 ? nowUs : tatUs, nowUs);
        long newTat = saturatingAdd(tat, spec.intervalUs());
        // May lie before the epoch when the burst spans more time than has passed.
        long allowAt = newTat - spec.toleranceUs();
        if (allowAt > nowUs) {
            return new Decision(false, 0, allowAt - nowUs, tat - nowUs, tat);
        }
        long after = spend ? newTat : tat;
        long room = nowUs - allowAt;
        long remaining = Math.min(room / spec.intervalUs(), 0xffffffffL);
        return new Decision(true, remaining, 0, after - nowUs, after);
    }

    private static long saturatingAdd(long a, long b) {
        long sum = a + b;
        return sum < a ? Long.MAX_VALUE : sum;
    }
}
