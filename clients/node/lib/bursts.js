// Which checks of this client are in a burst, as client/src/burst.rs: a
// timeout from a busy daemon stops a login only when another check on the
// same account (or, without one, the same address) waited on this client at
// the same time, or started less than BURST_GAP_US before it. A lone user's
// timeout during a flood on other accounts is an outage for the fail policy.
//
// Each check is also counted on its requester (the route, the tenant, the
// account and the address: the TCP peer and the X-Forwarded-For header as
// sent, since behind a reverse proxy the peer is the proxy and only the
// header tells its users apart). Parallel checks on one account AND address
// are a guesser's: their own burst, refused as busy for as long as it lasts. A
// check in a burst on her account that is not her own (others' checks, from
// other addresses) is refused as busy for at most busy_max in a window of
// 120 x busy_max (BusyWindows), so nobody can keep her out by checking her
// account; past that her timeout follows the fail policy. Only a requester
// this client has seen log in successfully (KnownRequesters: a success
// reported from that address on that account) may leave busy that way:
// anyone else in a burst on the account (a guesser's other addresses, a
// botnet) stays busy, since a late guess that failed open would be admitted
// with no check at all. At most KNOWN_PER_ACCOUNT_MAX requesters are known
// per account, and eviction is constant time: a user who logs in to his own
// account from fresh addresses cannot push everyone else out.

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
/** Requesters with a success kept; when full, the least recently succeeded makes room. */
export const KNOWN_REQUESTERS_MAX = 65536;
/** Requesters with a success kept per account (route, tenant and account); the account's least recent makes room. */
export const KNOWN_PER_ACCOUNT_MAX = 16;

/** An optional string field as a key part: absent (null) and empty ("") stay apart. */
function part(value) {
  return value == null ? null : String(value);
}

/**
 * A check's burst key (the route and the account, or without one the
 * address), its requester key and its account key. The requester is the
 * route, tenant, account, peer and X-Forwarded-For together (as sent: the
 * caller passes the bounded subject), formed when there is an account and
 * a peer or a forwarded header; otherwise it is the burst key itself. The
 * account key (route, tenant, account) groups the known requesters of one
 * account. Each key is a JSON array with its own tag, so no field can spill
 * into the next and an absent field never equals an empty one.
 */
export function burstKeys(route, subject = {}) {
  const { account, peer, forwardedFor, tenant } = subject ?? {};
  let key;
  if (account != null) key = JSON.stringify([1, route, String(account)]);
  else if (peer != null) key = JSON.stringify([2, route, String(peer)]);
  else key = JSON.stringify([0, route]);
  const requester =
    account != null && (peer != null || forwardedFor != null)
      ? JSON.stringify([3, route, part(tenant), String(account), part(peer), part(forwardedFor)])
      : key;
  const accountKey = JSON.stringify([4, route, part(tenant), part(account)]);
  return { key, requester, accountKey };
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
 * admitted with no check at all.
 *
 * At most KNOWN_PER_ACCOUNT_MAX requesters are kept per account and
 * KNOWN_REQUESTERS_MAX in all, the least recently succeeded making room.
 * Evicted oldest-first across the whole map, an attacker logging in to his
 * own account from fresh addresses could push every user out with 65,536
 * logins, and each eviction scanned the whole map; capped per account he
 * needs 4,096 accounts of his own, and eviction is constant time: the Maps
 * keep recency order (delete then set moves an entry to the end, the least
 * recent is the first). Expired entries stay until evicted. Synchronous
 * calls on one event loop need no lock.
 */
export class KnownRequesters {
  /** requester -> { last, account }, least recently succeeded first. */
  #entries = new Map();
  /** account key -> Set of its requesters, least recently succeeded first (at most KNOWN_PER_ACCOUNT_MAX). */
  #accounts = new Map();

  /** Records a success reported for `requester` (of account key `accountKey`) at `now`. */
  succeeded(requester, accountKey, now) {
    const entry = this.#entries.get(requester);
    if (entry !== undefined) {
      // An update takes no room: it becomes the most recent, globally and in its account.
      if (entry.account === accountKey) {
        this.#entries.delete(requester);
        this.#entries.set(requester, { last: now, account: accountKey });
        const mine = this.#accounts.get(accountKey);
        mine.delete(requester);
        mine.add(requester);
        return;
      }
      // The same requester under another account key (one without an address, whose
      // requester is its burst key, in another tenant): it moves, as a new one.
      this.#remove(requester);
    }
    let mine = this.#accounts.get(accountKey);
    if (mine !== undefined && mine.size >= KNOWN_PER_ACCOUNT_MAX) this.#remove(mine.values().next().value);
    if (this.#entries.size >= KNOWN_REQUESTERS_MAX) this.#remove(this.#entries.keys().next().value);
    mine = this.#accounts.get(accountKey);
    if (mine === undefined) {
      mine = new Set();
      this.#accounts.set(accountKey, mine);
    }
    mine.add(requester);
    this.#entries.set(requester, { last: now, account: accountKey });
  }

  #remove(requester) {
    const entry = this.#entries.get(requester);
    if (entry === undefined) return;
    this.#entries.delete(requester);
    const mine = this.#accounts.get(entry.account);
    mine.delete(requester);
    if (mine.size === 0) this.#accounts.delete(entry.account);
  }

  /** Whether `requester` had a success reported less than KNOWN_FOR_US before `now`. */
  known(requester, now) {
    const entry = this.#entries.get(requester);
    return entry !== undefined && now - entry.last < KNOWN_FOR_US;
  }

  get size() {
    return this.#entries.size;
  }

  /** How many requesters of `accountKey` are kept. */
  accountSize(accountKey) {
    return this.#accounts.get(accountKey)?.size ?? 0;
  }
}
