// GCRA, as client/src/gcra.rs: a rate limit whose whole state is one
// theoretical arrival time (TAT). The client keeps one per closed route with
// a static budget, spent only while the daemon cannot answer. Times are
// integral microseconds (exact in a double for centuries).

/** `limit` per `periodUs` sustained, `burst` at once (each at least 1). */
export function gcraSpec(limit, periodUs, burst) {
  if (!(limit > 0 && periodUs > 0 && burst > 0)) throw new RangeError("limit, period and burst must be positive");
  return { intervalUs: Math.max(1, Math.ceil(periodUs / limit)), burst };
}

/**
 * One GCRA step: `{ allowed, remaining, retryAfterUs, resetUs }` and the new
 * TAT (unchanged when refused, or when `spend` is false). `tatUs` is null
 * for a route never decided.
 */
export function gcraDecide(spec, tatUs, nowUs, spend) {
  const tolerance = spec.intervalUs * spec.burst;
  const tat = Math.max(tatUs ?? nowUs, nowUs);
  const allowAt = tat + spec.intervalUs - tolerance;
  if (allowAt > nowUs) {
    return [{ allowed: false, remaining: 0, retryAfterUs: allowAt - nowUs, resetUs: tat - nowUs }, tat];
  }
  const after = spend ? tat + spec.intervalUs : tat;
  const remaining = Math.floor((nowUs - allowAt) / spec.intervalUs);
  return [{ allowed: true, remaining, retryAfterUs: 0, resetUs: after - nowUs }, after];
}
