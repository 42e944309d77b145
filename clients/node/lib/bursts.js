// Which checks of this client are in a burst, as client/src/burst.rs: a
// timeout from a busy daemon stops a login only when another check on the
// same account (or, without one, the same address) waited on this client at
// the same time, or started less than BURST_GAP_US before it. A lone user's
// timeout during a flood on other accounts is an outage for the fail policy.

/** Checks on one key this close together are one burst, even if they do not overlap. */
export const BURST_GAP_US = 50_000;
/** Entries kept before the ended ones are swept. */
const SWEEP_AT = 1024;

export class Bursts {
  #entries = new Map();
  #seq = 0;
  #epoch = performance.now();

  #nowUs() {
    return Math.floor((performance.now() - this.#epoch) * 1000) + BURST_GAP_US;
  }

  /** Counts a check on `subject` as waiting until the guard's `leave()`. */
  enter(route, subject = {}) {
    let key;
    if (subject.account != null) key = `${route}\u0000a${subject.account}`;
    else if (subject.peer != null) key = `${route}\u0000p${subject.peer}`;
    else key = `${route}\u0000-`;
    const seq = ++this.#seq;
    const now = this.#nowUs();
    if (this.#entries.size >= SWEEP_AT && !this.#entries.has(key)) {
      for (const [k, e] of this.#entries) {
        if (e.waiting === 0 && now - e.startedUs >= BURST_GAP_US) this.#entries.delete(k);
      }
    }
    let entry = this.#entries.get(key);
    if (!entry) {
      entry = { waiting: 0, newest: 0, startedUs: 0 };
      this.#entries.set(key, entry);
    }
    const company = entry.waiting > 0 || (entry.startedUs > 0 && now - entry.startedUs < BURST_GAP_US);
    entry.waiting += 1;
    entry.newest = seq;
    entry.startedUs = now;
    const entries = this.#entries;
    let left = false;
    return {
      /** Whether another check on its key waited while it did, or started just before it. */
      inBurst: () => company || (entries.get(key)?.newest ?? 0) > seq,
      leave: () => {
        if (left) return;
        left = true;
        const e = entries.get(key);
        if (e) e.waiting -= 1;
      },
    };
  }

  get size() {
    return this.#entries.size;
  }
}
