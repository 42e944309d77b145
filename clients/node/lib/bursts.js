// Which checks of this client are in a burst, as client/src/burst.rs: a
// timeout from a busy daemon stops a login only when another check on the
// same account (or, without one, the same address) waited on this client at
// the same time, or started less than BURST_GAP_US before it. A lone user's
// timeout during a flood on other accounts is an outage for the fail policy.
//
// Each check is also counted on its requester (the route, the account and
// the address together). Parallel checks on one account AND address are a
// guesser's: their own burst, refused as busy for as long as it lasts. A
// check in a burst on her account that is not her own (others' checks, from
// other addresses) is refused as busy for at most busy_max in a window of
// 120 x busy_max (BusyWindows), so nobody can keep her out by checking her
// account; past that her timeout follows the fail policy. Only a requester
// this client has seen log in successfully (KnownRequesters: a success
// reported from that address on that account) may leave busy that way:
// anyone else in a burst on the account (a guesser's other addresses, a
// botnet) stays busy, since a late guess that failed open would be admitted
// with no check at all.

/** Checks on one key this close together are one burst, even if they do not overlap. */
export const BURST_GAP_US = 50_000;
/** Entries kept before the ended ones are swept. */
const SWEEP_AT = 1024;
/** A requester's busy window is this many times busy_max. */
export const BUSY_WINDOW_FACTOR = 120;
/** Requesters whose busy windows are kept; a new one finds no room while all of theirs are live. */
export const BUSY_REQUESTERS_MAX = 4096;
/** A requester's last reported success counts this long (µs, the client's clock): 30 days. */
export const KNOWN_FOR_US = 30 * 24 * 3600 * 1_000_000;
/** Requesters with a success kept; when full, the expired and then the oldest make room. */
export const KNOWN_REQUESTERS_MAX = 65536;

/**
 * A check's burst key (the route and the account, or without one the
 * address) and its requester key (the route, the account and the address;
 * without both of those, the burst key itself). The tags keep a requester
 * key from ever equalling a burst key.
 */
export function burstKeys(route, subject = {}) {
  const { account, peer } = subject;
  let key;
  if (account != null) key = JSON.stringify([1, route, String(account)]);
  else if (peer != null) key = JSON.stringify([2, route, String(peer)]);
  else key = JSON.stringify([0, route]);
  const requester = account != null && peer != null ? JSON.stringify([3, route, String(account), String(peer)]) : key;
  return { key, requester };
}

export class Bursts {
  #entries = new Map();
  #seq = 0;
  #epoch = performance.now();

  #nowUs() {
    return Math.floor((performance.now() - this.#epoch) * 1000) + BURST_GAP_US;
  }

  /** Counts `key` as waiting for check `seq`; whether another check on it waited or started just before. */
  #enterKey(key, seq, now) {
    let entry = this.#entries.get(key);
    if (!entry) {
      entry = { waiting: 0, newest: 0, startedUs: 0 };
      this.#entries.set(key, entry);
    }
    const company = entry.waiting > 0 || (entry.startedUs > 0 && now - entry.startedUs < BURST_GAP_US);
    entry.waiting += 1;
    entry.newest = seq;
    entry.startedUs = now;
    return company;
  }

  /**
   * Counts a check on `subject` as waiting until the guard's `leave()`, on
   * its burst key and on its requester key (once when they are the same).
   */
  enter(route, subject = {}) {
    const { key, requester } = burstKeys(route, subject ?? {});
    const own = requester !== key;
    const seq = ++this.#seq;
    const now = this.#nowUs();
    if (this.#entries.size >= SWEEP_AT && (!this.#entries.has(key) || !this.#entries.has(requester))) {
      for (const [k, e] of this.#entries) {
        if (e.waiting === 0 && now - e.startedUs >= BURST_GAP_US) this.#entries.delete(k);
      }
    }
    const company = this.#enterKey(key, seq, now);
    const ownCompany = own ? this.#enterKey(requester, seq, now) : company;
    const entries = this.#entries;
    const later = (k) => (entries.get(k)?.newest ?? 0) > seq;
    let left = false;
    return {
      /** The requester key, for the busy window of checks in others' bursts. */
      requester,
      /** Whether another check on its key waited while it did, or started just before it. */
      inBurst: () => company || later(key),
      /** `inBurst` on its requester key: another check on the same account and address (a guesser's own burst). */
      ownBurst: () => ownCompany || later(requester),
      leave: () => {
        if (left) return;
        left = true;
        for (const k of own ? [key, requester] : [key]) {
          const e = entries.get(k);
          if (e) e.waiting -= 1;
        }
      },
    };
  }

  get size() {
    return this.#entries.size;
  }
}

/**
 * Per requester key, when its busy window's first busy refusal came (a
 * monotonic time, in the caller's unit). A check in a burst that is not its
 * own is excused as busy for busy_max from that refusal; the window lasts
 * 120 x busy_max, after which the next such refusal opens a new one. At most
 * BUSY_REQUESTERS_MAX requesters are kept: ended windows are dropped to make
 * room, and while all are live a new requester is not excused (a flood of
 * distinct keys cannot make room). Calls are synchronous, so on one event
 * loop they need no lock, as the Bursts map.
 */
export class BusyWindows {
  #first = new Map();

  /** Whether `requester`'s timeout at `now` may stay busy, with busy_max `busyMax` (the unit of `now`). */
  excused(requester, now, busyMax) {
    const window = BUSY_WINDOW_FACTOR * busyMax;
    const first = this.#first.get(requester);
    if (first !== undefined) {
      if (now - first < window) return now - first < busyMax;
      this.#first.set(requester, now);
      return busyMax > 0;
    }
    if (this.#first.size >= BUSY_REQUESTERS_MAX) {
      for (const [k, f] of this.#first) {
        if (now - f >= window) this.#first.delete(k);
      }
      if (this.#first.size >= BUSY_REQUESTERS_MAX) return false;
    }
    this.#first.set(requester, now);
    return busyMax > 0;
  }

  get size() {
    return this.#first.size;
  }
}

/**
 * Per requester key, when this client last reported a success for it (a
 * monotonic time in the unit of KNOWN_FOR_US, as the busy window's). A user
 * who has logged in from this address through this client is refused as
 * busy in others' bursts on her account for at most busy_max a window, then
 * her timeout follows the fail policy; a requester never seen to succeed
 * stays busy in a burst, since its late guess failing open would be
 * admitted with no check at all. At most KNOWN_REQUESTERS_MAX are kept: a
 * new one first drops the expired, then, if still full, the oldest (one
 * scan, rarely). Synchronous calls on one event loop need no lock.
 */
export class KnownRequesters {
  #last = new Map();

  /** Records a success reported for `requester` at `now`. */
  succeeded(requester, now) {
    if (!this.#last.has(requester) && this.#last.size >= KNOWN_REQUESTERS_MAX) {
      for (const [k, t] of this.#last) {
        if (now - t >= KNOWN_FOR_US) this.#last.delete(k);
      }
      if (this.#last.size >= KNOWN_REQUESTERS_MAX) {
        let oldest = null;
        let oldestAt = Infinity;
        for (const [k, t] of this.#last) {
          if (t < oldestAt) {
            oldest = k;
            oldestAt = t;
          }
        }
        this.#last.delete(oldest);
      }
    }
    this.#last.set(requester, now);
  }

  /** Whether `requester` had a success reported less than KNOWN_FOR_US before `now`. */
  known(requester, now) {
    const last = this.#last.get(requester);
    return last !== undefined && now - last < KNOWN_FOR_US;
  }

  get size() {
    return this.#last.size;
  }
}
