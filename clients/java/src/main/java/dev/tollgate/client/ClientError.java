package dev.tollgate.client;

/** Why the daemon gave no answer: the {@code error} of an unavailable answer. */
public record ClientError(Kind kind, String message) {

    public enum Kind {
        /** The socket cannot be reached. */
        CONNECT,
        /** The connection failed. */
        IO,
        /** No reply within the deadline. */
        TIMEOUT,
        /**
         * A timeout the client takes for a busy daemon: from a daemon that has
         * answered this client, in a run of timeouts younger than busy_max
         * or within busy_max of an answer in time, for a check another check
         * on the same account (or address) overlapped. Never proceeds: a guess let through because the limiter
         * was slow is a guess with no limit at all.
         */
        BUSY,
        /** A reply that does not decode, or does not answer the request. */
        PROTOCOL;

        public String wireName() {
            return name().toLowerCase(java.util.Locale.ROOT);
        }
    }

    @Override
    public String toString() {
        return kind.wireName() + ": " + message;
    }
}
