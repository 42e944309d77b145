package dev.tollgate.client;

/**
 * One of the requests an auth server sends: Check, Report or Abandon.
 * {@code passwordTag} goes out in version 3 and later only (Check, Report).
 */
public record Request(
        Kind kind,
        String route,
        Subject subject,
        Outcome outcome,
        byte[] passwordDigest,
        byte[] passwordTag) {

    /** The request variants this client sends, with their wire discriminants. */
    public enum Kind {
        CHECK(0), REPORT(1), ABANDON(8);

        final int discriminant;

        Kind(int discriminant) {
            this.discriminant = discriminant;
        }
    }

    public static Request check(String route, Subject subject, byte[] passwordTag) {
        return new Request(Kind.CHECK, route, subject, null, null, passwordTag);
    }

    public static Request report(String route, Subject subject, Outcome outcome, byte[] passwordDigest, byte[] passwordTag) {
        return new Request(Kind.REPORT, route, subject, outcome, passwordDigest, passwordTag);
    }

    public static Request abandon(String route, Subject subject) {
        return new Request(Kind.ABANDON, route, subject, null, null, null);
    }
}
