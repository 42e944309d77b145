package dev.tollgate.client;

import java.util.Optional;

/**
 * A checked login attempt until its outcome is reported. An allowed check
 * holds a place on the route's failure rules until its report; a handler
 * that never reports (an exception, a cancelled request) would leave it
 * held until attempt_timeout_ms, and a stranger aborting logins on purpose
 * could keep a real user out. So, used with try-with-resources:
 *
 * <pre>{@code
 * try (Attempt attempt = client.begin("login", subject, tag)) {
 *     if (attempt.proceeds()) {
 *         boolean ok = verify(password);
 *         attempt.report(ok ? Outcome.SUCCESS : Outcome.FAILURE);
 *     }
 * }
 * }</pre>
 *
 * {@link #close()} sends {@code Abandon} only when the check's verdict was
 * allow and nothing was reported: a delayed, refused, rejected or
 * unanswered check sends nothing (the daemon may not have seen an
 * unanswered one, and an abandon would then free another attempt's place).
 * Thread-safe; at most one report or abandon is ever sent.
 */
public final class Attempt implements AutoCloseable {
    private final Client client;
    private final String route;
    private final Subject subject;
    private final byte[] passwordTag;
    private final Answer answer;
    /** The daemon admitted the check and no outcome was sent yet. */
    private boolean holdsPlaces;
    private boolean ended;

    Attempt(Client client, String route, Subject subject, byte[] passwordTag, Answer answer) {
        this.client = client;
        this.route = route;
        this.subject = subject;
        this.passwordTag = passwordTag;
        this.answer = answer;
        // A delayed check gave its places back, though it proceeds.
        this.holdsPlaces = answer instanceof Answer.Decided d && d.value().decision() == Decision.ALLOW;
    }

    /** The check's answer. */
    public Answer answer() {
        return answer;
    }

    /** Whether the attempt may go ahead (see {@link Answer#proceeds()}); honour {@code answer().delay()}. */
    public boolean proceeds() {
        return answer.proceeds();
    }

    /** Reports the verified outcome, with the check's subject and password tag; the guard is spent. */
    public Answer report(Outcome outcome) {
        return reportAs(subject, outcome, null, null);
    }

    /**
     * {@link #report(Outcome)} with the password's digest (may be null) and
     * tag; a null tag is the tag the check was begun with.
     */
    public Answer report(Outcome outcome, byte[] passwordDigest, byte[] passwordTag) {
        return reportAs(subject, outcome, passwordDigest, passwordTag);
    }

    /**
     * The report with the subject as it stands after the verify, such as
     * the device id issued at a successful sign-in. The route is the check's.
     * A null {@code passwordTag} is the check's tag: a failure reported
     * without one is never counted by spray detection, and passing null
     * was the easy mistake.
     *
     * @throws IllegalStateException if the attempt was already reported or abandoned
     */
    public Answer reportAs(Subject after, Outcome outcome, byte[] passwordDigest, byte[] passwordTag) {
        synchronized (this) {
            if (ended) throw new IllegalStateException("the attempt was already reported or abandoned");
            ended = true;
            holdsPlaces = false;
        }
        byte[] tag = passwordTag != null ? passwordTag : this.passwordTag;
        return client.report(route, after, outcome, passwordDigest, tag);
    }

    /**
     * Gives the attempt up now and waits for the daemon's answer. Empty when
     * the attempt held no place (nothing was sent), or was already ended.
     */
    public Optional<Answer> abandon() {
        synchronized (this) {
            boolean send = holdsPlaces && !ended;
            ended = true;
            holdsPlaces = false;
            if (!send) return Optional.empty();
        }
        return Optional.of(client.abandon(route, subject));
    }

    /** Abandons the attempt if its check was allowed and nothing was reported. Never throws. */
    @Override
    public void close() {
        abandon();
    }
}
