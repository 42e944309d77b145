// The attempt guard, as client/src/attempt.rs: a login attempt from its
// check to its outcome. An allowed check holds a place on each failure rule
// until its report; a handler that ends without one (an exception, a client
// that hung up) must give it back with `abandon`, or a stranger aborting
// logins on purpose could keep a real user out. In JavaScript the guard is
// ended from a `finally` (or `await using` where the runtime has it).

/**
 * A checked attempt. `answer` is the check's. Report the outcome with
 * `report()`; end it in a `finally` with `end()`, which abandons the
 * attempt only if the check was allowed and nothing was reported.
 */
export class Attempt {
  #client;
  #route;
  #subject;
  /** The daemon admitted the check and no outcome or abandon was sent yet. */
  #holdsPlaces;
  #spent = false;
  /** The check's password tag (null: none), for a report that gives none. */
  #tag;

  constructor(client, route, subject, answer, tag = null) {
    this.#client = client;
    this.#route = route;
    this.#subject = subject;
    this.#tag = tag;
    this.answer = answer;
    // Only an allowed verdict holds places: a delayed check gave them back,
    // and an unanswered one may never have reached the daemon (an abandon
    // would then free another attempt's place).
    this.#holdsPlaces = answer.kind === "verdict" && answer.verdict.decision === "allow";
  }

  /** Whether the attempt may go ahead (see `Answer.proceeds`). */
  proceeds() {
    return this.answer.proceeds();
  }

  /** Whether ending the guard now would send an abandon. */
  get holdsPlaces() {
    return this.#holdsPlaces;
  }

  /**
   * Reports the verified outcome ("success" or "failure"); the guard is
   * spent. Options as `Client.report`, plus `subject`: the subject after
   * the verify (such as a device id issued at sign-in); the route is the check's.
   * Without a `passwordTag` or `password`, the report carries the check's tag
   * (a failure without one is invisible to spray detection); a given one wins.
   */
  async report(outcome, options = {}) {
    if (this.#spent) throw new Error("this attempt was already reported or ended");
    this.#spent = true;
    this.#holdsPlaces = false;
    const { subject = this.#subject, ...rest } = options;
    if (rest.passwordTag == null && rest.password == null && this.#tag) rest.passwordTag = this.#tag;
    return this.#client.report(this.#route, subject, outcome, rest);
  }

  /**
   * Ends the attempt. Without a report, an allowed attempt is abandoned and
   * this resolves with the abandon's answer; otherwise it sends nothing and
   * resolves with null. Safe to call more than once.
   */
  async end() {
    this.#spent = true;
    if (!this.#holdsPlaces) return null;
    this.#holdsPlaces = false;
    return this.#client.abandon(this.#route, this.#subject);
  }
}

if (typeof Symbol.asyncDispose === "symbol") {
  Attempt.prototype[Symbol.asyncDispose] = function dispose() {
    return this.end();
  };
}
