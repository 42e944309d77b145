package dev.tollgate.client;

import java.time.Duration;
import java.util.Optional;

/** What the auth server should do with an attempt: a verdict, a rejected request, or the fail policy. */
public sealed interface Answer {

    /** Whether the attempt may go ahead (after {@link #delay()} for a delay verdict). */
    boolean proceeds();

    /** The daemon's verdict: allow and delay proceed, challenge and deny do not. */
    record Decided(Verdict value) implements Answer {
        @Override
        public boolean proceeds() {
            return value.proceeds();
        }
    }

    /**
     * The request itself was refused (an unknown route by the daemon; an
     * identifier over 512 bytes, a request over 16384 bytes or an unpaired
     * surrogate by this client, before sending): treat the attempt as
     * refused, and fix the caller.
     */
    record Rejected(ErrorReply error) implements Answer {
        @Override
        public boolean proceeds() {
            return false;
        }
    }

    /**
     * The daemon could not answer in time; the route's fail policy decides.
     * A closed route may still let the attempt through within its static
     * budget. A busy daemon never lets it through.
     */
    record Unavailable(FailPolicy policy, ClientError error, boolean withinStaticBudget) implements Answer {
        @Override
        public boolean proceeds() {
            if (error.kind() == ClientError.Kind.BUSY) return false;
            return policy == FailPolicy.OPEN || withinStaticBudget;
        }
    }

    /** The verdict, if the daemon gave one. */
    default Optional<Verdict> verdict() {
        return this instanceof Decided d ? Optional.of(d.value()) : Optional.empty();
    }

    /** How long to hold the attempt before it proceeds (a delay verdict with delay_ms above 0). */
    default Optional<Duration> delay() {
        return verdict()
                .filter(v -> v.decision() == Decision.DELAY && v.delayMs() > 0)
                .map(v -> Duration.ofMillis(v.delayMs()));
    }

    /** The Retry-After to send with a refusal, in whole seconds (rounded up, at least 1); 1 without a verdict. */
    default long retryAfterSecs() {
        return verdict().map(v -> Math.max(1, Long.divideUnsigned(v.retryAfterMs(), 1000)
                + (Long.remainderUnsigned(v.retryAfterMs(), 1000) == 0 ? 0 : 1))).orElse(1L);
    }
}
