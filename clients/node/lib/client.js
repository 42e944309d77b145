// The client an auth server shares (one per process): pooled connections,
// a per-call deadline, version step-down, and each route's fail policy when
// the daemon cannot answer in time, reported as such, never as a made-up
// verdict. Mirrors client/src/client.rs.

import { Attempt } from "./attempt.js";
import { Bursts, BusyWindows, KnownRequesters, burstKeys } from "./bursts.js";
import {
  encodeRequest, decodeResponse, refusalBeforeSending, DecodeError, FRAME_HEADER_BYTES, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN,
} from "./codec.js";
import { Connection, ClientError, LateListeners } from "./connection.js";
import { gcraSpec, gcraDecide } from "./gcra.js";
import { passwordDigest, passwordTag } from "./passwords.js";
import { BUILTIN_FAIL_POLICIES, forwardedTail } from "./policies.js";

/** Per call: a stalled daemon costs a login a few ms before the fail policy decides. */
export const CALL_TIMEOUT_DEFAULT_MS = 5;
/**
 * A run of timeouts from a daemon that has answered, younger than this (or
 * this soon after an answer in time, or after a late reply was heard), is a
 * busy daemon. Also how long a timed-out connection listens for its late reply.
 */
export const BUSY_MAX_DEFAULT_MS = 1000;
/** Idle connections kept for reuse. */
export const POOL_CONNECTIONS_MAX = 64;
export { LATE_LISTENERS_MAX } from "./connection.js";

const TIMED_OUT = Symbol("timed out");

/** What the auth server should do with an attempt. */
export class Answer {
  constructor(fields) {
    /** "verdict", "rejected" (the daemon refused the request) or "unavailable". */
    this.kind = fields.kind;
    /** The daemon's verdict, for "verdict". */
    this.verdict = fields.verdict ?? null;
    /** A version-2+ verdict's degraded flag. */
    this.degraded = fields.degraded ?? false;
    /** The protocol version the reply came in (null when none came). */
    this.version = fields.version ?? null;
    /** For "rejected": the daemon's error `{ code, message }`. */
    this.error = fields.error ?? null;
    /** For "unavailable": the route's fail policy, "open" or "closed". */
    this.policy = fields.policy ?? null;
    /** For "unavailable": whether the closed route's static budget let it through. */
    this.withinStaticBudget = fields.withinStaticBudget ?? false;
  }

  /** Whether the attempt may go ahead (after `delay()` ms for a delay). */
  proceeds() {
    switch (this.kind) {
      case "verdict":
        return this.verdict.decision === "allow" || this.verdict.decision === "delay";
      case "rejected":
        return false;
      default:
        // A busy daemon is never a pass, whatever the policy.
        if (this.error.kind === "busy") return false;
        return this.policy === "open" || this.withinStaticBudget;
    }
  }

  /** How long to hold the attempt before it proceeds (a `delay` verdict), in ms; null otherwise. */
  delay() {
    const v = this.verdict;
    return v && v.decision === "delay" && v.delayMs > 0 ? v.delayMs : null;
  }

  /** The `Retry-After` for a refusal, whole seconds rounded up, at least 1; 1 without a verdict. */
  retryAfterSecs() {
    if (!this.verdict) return 1;
    return Math.max(1, Math.ceil(Number(this.verdict.retryAfterMs) / 1000));
  }
}

function parseKey(key) {
  if (key === undefined || key === null) return null;
  const bytes = typeof key === "string" ? Buffer.from(key, "hex") : Buffer.from(key);
  if (bytes.length !== 32) throw new RangeError("passwordKey is 32 bytes (64 hex digits)");
  return bytes;
}

/** The subject as sent: of an X-Forwarded-For header, only the part the daemon reads. */
function bounded(subject = {}) {
  if (subject.forwardedFor == null) return subject;
  return { ...subject, forwardedFor: forwardedTail(subject.forwardedFor) };
}

export class Client {
  #config;
  #pool = [];
  #nextId = 1;
  #budgetTats = new Map();
  #started = performance.now();
  /** When the daemon last answered a call in time (µs + 1; 0 never). */
  #lastAnsweredUs = 0;
  /**
   * When a reply last came to a call that had timed out, on a connection kept
   * listening for it (µs + 1; 0 never). The next timeout after it starts the run anew.
   */
  #lastHeardUs = 0;
  /** The current run of timeouts: when it began and its last one (0: none). */
  #lateRun = { startUs: 0, lastUs: 0 };
  /** Timed-out connections still listening for their late reply. */
  #lateListeners = new LateListeners();
  #bursts = new Bursts();
  /** Per requester, its busy window for checks in others' bursts on its account. */
  #busyWindows = new BusyWindows();
  /** Per requester, its last success reported through this client: only these leave busy after their window. */
  #knownRequesters = new KnownRequesters();
  #closed = false;

  /**
   * `socket` is required; the rest default as in the Rust client:
   * `timeoutMs` 5, `busyMaxMs` 1000, `protocolVersion` 5, `failPolicies`
   * (merged over the built-in table), `defaultFailPolicy` "open",
   * `staticBudgets` `{ route: { limit, periodMs, burst } }`, `passwordKey`
   * (32 bytes or 64 hex digits) for the `password` option of calls.
   */
  constructor(config) {
    if (!config || typeof config.socket !== "string") throw new TypeError("Client needs { socket: path }");
    const version = config.protocolVersion ?? PROTOCOL_VERSION;
    if (!Number.isInteger(version) || version < PROTOCOL_VERSION_MIN || version > PROTOCOL_VERSION) {
      throw new RangeError(`protocol version ${version} is not one this client speaks (1 to 5)`);
    }
    const staticBudgets = new Map();
    for (const [route, b] of Object.entries(config.staticBudgets ?? {})) {
      const periodUs = Math.max(1, Math.round((b.periodMs ?? 0) * 1000));
      staticBudgets.set(route, gcraSpec(Math.max(1, b.limit ?? 1), periodUs, Math.max(1, b.burst ?? 1)));
    }
    this.#config = {
      socket: config.socket,
      timeoutMs: config.timeoutMs ?? CALL_TIMEOUT_DEFAULT_MS,
      busyMaxMs: config.busyMaxMs ?? BUSY_MAX_DEFAULT_MS,
      protocolVersion: version,
      failPolicies: { ...BUILTIN_FAIL_POLICIES, ...(config.failPolicies ?? {}) },
      defaultFailPolicy: config.defaultFailPolicy ?? "open",
      staticBudgets,
      passwordKey: parseKey(config.passwordKey),
    };
    for (const policy of [...Object.values(this.#config.failPolicies), this.#config.defaultFailPolicy]) {
      if (policy !== "open" && policy !== "closed") throw new RangeError(`fail policy is "open" or "closed", not ${policy}`);
    }
  }

  get config() {
    return this.#config;
  }

  /** The fail policy of `route`. */
  failPolicy(route) {
    return this.#config.failPolicies[route] ?? this.#config.defaultFailPolicy;
  }

  /**
   * May this attempt proceed? Ask before the expensive work. Options:
   * `passwordTag` (16 bytes), or `password` to compute it with `passwordKey`.
   */
  async check(route, subject, options = {}) {
    return this.#decide(route, { type: "check", route, subject, passwordTag: this.#checkTag(options) });
  }

  /**
   * Checks an attempt and returns it as a guard (options as `check`):
   * `await attempt.report(...)` inside `try`, `await attempt.end()` in `finally`.
   * A report through the guard without a tag (or password) carries the check's.
   */
  async begin(route, subject, options = {}) {
    const tag = this.#checkTag(options);
    return new Attempt(this, route, subject, await this.check(route, subject, { passwordTag: tag }), tag);
  }

  #checkTag(options) {
    return options.passwordTag ?? this.#derived(options.password, (key, p) => passwordTag(key, p));
  }

  /**
   * Tells the outcome ("success" or "failure") after verifying. Options:
   * `passwordDigest` and `passwordTag` (16 bytes each), or `password` to
   * compute both with `passwordKey` and the subject's account.
   */
  async report(route, subject, outcome, options = {}) {
    const account = subject?.account ?? "";
    const digest = options.passwordDigest ?? this.#derived(options.password, (key, p) => passwordDigest(key, account, p));
    const tag = options.passwordTag ?? this.#derived(options.password, (key, p) => passwordTag(key, p));
    const request = { type: "report", route, subject, outcome, passwordDigest: digest, passwordTag: tag };
    return this.#decide(route, request);
  }

  /**
   * The attempt an allowed check admitted ended without an outcome: its
   * places are given back. Prefer `begin`, whose guard sends this itself.
   * A daemon older than version 5 rejects it (`malformed`); the places lapse.
   */
  async abandon(route, subject) {
    return this.#decide(route, { type: "abandon", route, subject });
  }

  #derived(password, compute) {
    if (password === undefined || password === null) return null;
    if (!this.#config.passwordKey) throw new TypeError("a password option needs the client's passwordKey");
    return compute(this.#config.passwordKey, password);
  }

  /** `given` is the request with the caller's subject; what goes out has the X-Forwarded-For bounded. */
  async #decide(route, given) {
    const request = { ...given, subject: bounded(given.subject) };
    // A bad subject or outcome is the caller's mistake, thrown here, not an outage.
    const frame = encodeRequest(this.#config.protocolVersion, 0, request);
    // What the daemon would refuse is refused here, before any I/O: sent, an
    // oversized frame breaks the connection mid-write, which would pass for
    // an outage (and fail open). Nothing proceeds, is spent or is held.
    const refusal = refusalBeforeSending(given, frame.length - FRAME_HEADER_BYTES);
    if (refusal) return new Answer({ kind: "rejected", error: refusal });
    // A success the auth server reports (and this client sends) makes its
    // requester (this route, tenant, account and address, with the
    // X-Forwarded-For as sent) known, whatever the daemon answers or even if
    // the call fails: the password was right. Keyed as a check's requester;
    // a report refused above was never sent and makes nobody known.
    if (request.type === "report" && request.outcome === "success") {
      const { key, requester, accountKey } = burstKeys(route, request.subject ?? {});
      // A requester that is its burst key (no address) is never asked
      // about: its overlaps are all its own.
      if (requester !== key) this.#knownRequesters.succeeded(requester, accountKey, this.#nowUs());
    }
    // Only a check is an attempt: its report must not spend the static budget twice.
    const spend = request.type === "check";
    const burst = spend ? this.#bursts.enter(route, request.subject) : null;
    let result;
    try {
      result = await this.#call(request);
      // Busy stops a login only in a burst on its account: a lone user's
      // timeout during a flood on others is an outage for the fail policy.
      // Parallel checks on one account and address (in one tenant; the peer
      // and X-Forwarded-For together, so users behind one proxy are told
      // apart) are a guesser's: busy for as long as they last. A burst on her
      // account that is not her own (others' checks, from other addresses)
      // keeps her timeout busy for at
      // most busy_max in a window of 120 x busy_max, so nobody can keep her
      // out by checking her account; past that it follows the fail policy.
      // That leave is only for a requester this client has seen log in
      // (a success reported from this address on this account): anyone
      // else in a burst on the account (a guesser's other addresses, a
      // botnet) stays busy, since a late guess that failed open would be
      // admitted with no check at all. Only a known requester's check in a
      // burst not its own asks the window: unknown requesters and own
      // bursts never start one.
      // #call gives a busy timeout the plain message: only one that stays busy says so.
      if (result.error?.kind === "busy") {
        const now = this.#nowUs();
        const busy =
          burst !== null &&
          (burst.ownBurst() ||
            (burst.inBurst() &&
              (!this.#knownRequesters.known(burst.requester, now) ||
                this.#busyWindows.excused(burst.requester, now, this.#config.busyMaxMs * 1000))));
        result = busy
          ? { error: new ClientError("busy", `tollgate is busy: ${result.error.message}`) }
          : { error: new ClientError("timeout", result.error.message) };
      }
    } finally {
      burst?.leave();
    }
    if (result.error) return this.unavailable(route, result.error, spend);
    const reply = result.reply;
    if (reply.kind === "verdict") {
      return new Answer({ kind: "verdict", verdict: reply.verdict, degraded: reply.degraded, version: reply.version });
    }
    return new Answer({ kind: "rejected", error: { code: reply.code, message: reply.message }, version: reply.version });
  }

  /** The route's fail policy; for a closed route, whether its static budget has room (spent only when `spend`). */
  unavailable(route, error, spend) {
    const policy = this.failPolicy(route);
    let withinStaticBudget = false;
    const spec = this.#config.staticBudgets.get(route);
    if (policy === "closed" && error.kind !== "busy" && spec) {
      const [decision, after] = gcraDecide(spec, this.#budgetTats.get(route) ?? null, this.#nowUs(), spend);
      this.#budgetTats.set(route, after);
      withinStaticBudget = decision.allowed;
    }
    return new Answer({ kind: "unavailable", policy, error, withinStaticBudget });
  }

  #nowUs() {
    return Math.floor((performance.now() - this.#started) * 1000) + 1;
  }

  /** One request and its reply within the deadline: `{ reply }` or `{ error }`, never a rejection. */
  async #call(request) {
    const call = { conn: null, expired: false, done: false };
    const busyMaxMs = this.#config.busyMaxMs;
    let timer;
    let decide;
    const deadline = new Promise((resolve) => {
      timer = setTimeout(() => {
        // A loop held past the deadline (synchronous work) runs this timer
        // before it reads the socket: a reply that came in time would lose.
        // As tokio polls the call before its timer, decide after this turn's
        // reads (setImmediate runs after the poll phase), and only if no reply is complete.
        decide = setImmediate(() => {
          if (call.done) return;
          call.expired = true;
          // Its state is unknown: it never goes back to the pool. But a
          // daemon kept late by load is still answering, just after the
          // deadline: a connection whose request went out whole listens a
          // while for its reply (in the background: this call returns now),
          // so that such a daemon is told apart from a down one.
          const error = new ClientError("timeout", "the deadline passed");
          const conn = call.conn;
          const heard = () => {
            this.#lastHeardUs = this.#nowUs();
          };
          // With busy_max 0 every timeout is an outage: there is nothing to listen for.
          const listening = conn !== null && busyMaxMs > 0 && this.#lateListeners.listen(conn, error, busyMaxMs, heard);
          if (!listening) conn?.destroy(error);
          resolve(TIMED_OUT);
        });
      }, this.#config.timeoutMs);
    });
    const untimed = this.#callUntimed(request, call).then((result) => {
      call.done = true;
      return result;
    });
    const result = await Promise.race([untimed, deadline]);
    clearTimeout(timer);
    clearImmediate(decide);
    const busyMaxUs = busyMaxMs * 1000;
    const run = this.#lateRun;
    // A timeout before the deadline (connecting failed, not for want of a socket: see Connection) is
    // a late daemon as much as the deadline is: the same run, the same busy rule.
    if (result !== TIMED_OUT && result.error?.kind !== "timeout") {
      if (result.reply) {
        // A timely answer busy_max after the run's last timeout ends the run.
        const now = this.#nowUs();
        this.#lastAnsweredUs = now;
        if (run.lastUs !== 0 && now - run.lastUs >= busyMaxUs) run.lastUs = 0;
      }
      return result;
    }
    const now = this.#nowUs();
    // A late reply heard after the run's last timeout shows the daemon was
    // alive and answering after that run, so this timeout starts a new run.
    // Without this, load from elsewhere can keep the daemon late while this
    // client makes no calls for longer than busy_max. Then the run, the last
    // answer in time and the last late reply are all older than busy_max, and
    // a burst that times out before any of its own late replies come would be
    // taken for an outage and proceed. A frozen or dead daemon is never heard
    // late, so its sparse timeouts stay one run that grows old and becomes an outage.
    if (run.lastUs === 0 || this.#lastHeardUs > run.lastUs) run.startUs = now;
    run.lastUs = Math.max(run.lastUs, now);
    // A daemon that answered in time within busy_max is busy, not down: bursts closer together
    // than busy_max would otherwise age one run past it and fail open.
    const runYoung = now - run.startUs < busyMaxUs;
    const answeredInTimeRecently = now - this.#lastAnsweredUs < busyMaxUs;
    // So is one whose reply to a timed-out call came late within busy_max:
    // load can keep every call late for longer than busy_max while the daemon
    // answers them all just after the deadline. A late reply does not end the
    // run, nor count as an answer in time: a daemon never answered in time is not busy.
    const heardLateRecently = this.#lastHeardUs !== 0 && now - this.#lastHeardUs < busyMaxUs;
    const message = result === TIMED_OUT ? `tollgate did not answer within ${this.#config.timeoutMs} ms` : result.error.message;
    const busy = this.#lastAnsweredUs > 0 && (runYoung || answeredInTimeRecently || heardLateRecently);
    const kind = busy ? "busy" : "timeout";
    return { error: new ClientError(kind, message) };
  }

  async #callUntimed(request, call) {
    let pooled;
    while ((pooled = this.#pool.pop()) && pooled.dead);
    if (pooled) {
      const result = await this.#callOn(pooled, request, call);
      // A pooled connection the daemon closed while idle: nothing was read, so once more on a fresh one.
      if (!(result.error?.closed && !call.expired)) return result;
    }
    if (call.expired) return { error: new ClientError("timeout", "the deadline passed") };
    return this.#callOn(new Connection(this.#config.socket, this.#config.protocolVersion), request, call);
  }

  /** One exchange, stepping the connection's version down as its daemon asks; pooled again only if clean. */
  async #callOn(conn, request, call) {
    call.conn = conn;
    if (call.expired) conn.destroy();
    try {
      let reply = await this.#exchange(conn, request);
      // An older daemon refuses a newer version in version 1's bytes: one version lower, once per step.
      while (conn.version > PROTOCOL_VERSION_MIN && reply.version === 1 && reply.kind === "error" && reply.code === "unsupported_version") {
        conn.version -= 1;
        reply = await this.#exchange(conn, request);
      }
      if (!call.expired && !this.#closed && this.#pool.length < POOL_CONNECTIONS_MAX) this.#pool.push(conn);
      else conn.destroy();
      return { reply };
    } catch (error) {
      conn.destroy();
      if (error instanceof ClientError) return { error };
      if (error instanceof DecodeError) return { error: new ClientError("protocol", `unexpected reply from tollgate: ${error.message}`) };
      return { error: new ClientError("io", String(error?.message ?? error)) };
    }
  }

  async #exchange(conn, request) {
    const id = this.#nextId++;
    const payload = await conn.exchange(encodeRequest(conn.version, id, request));
    const reply = decodeResponse(payload);
    // Id 0 is the daemon's reply to a frame it could not read at all.
    if (reply.id !== id && !(reply.id === 0 && reply.kind === "error")) {
      throw new ClientError("protocol", `reply id ${reply.id} for request ${id}`);
    }
    return reply;
  }

  /** Closes the idle connections and those listening for a late reply; calls in flight finish on theirs, which then close. */
  close() {
    this.#closed = true;
    for (const conn of this.#pool.splice(0)) conn.destroy();
    this.#lateListeners.closeAll();
  }
}
