// The logic that needs no daemon: forwarded_tail, the static budget's GCRA,
// fail policies against a socket nobody listens on, Answer, the guard,
// bursts, the busy window of requesters and the known requesters.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, test } from "node:test";
import { Answer, BUILTIN_FAIL_POLICIES, Client, ClientError, forwardedTail, gcraDecide, gcraSpec } from "../index.js";
import {
  BUSY_REQUESTERS_MAX, Bursts, BusyWindows, KNOWN_FOR_US, KNOWN_REQUESTERS_MAX, KnownRequesters, burstKeys,
} from "../lib/bursts.js";

const deadSocket = join(mkdtempSync(join(tmpdir(), "tollgate-node-")), "nobody.sock");
after(() => rmSync(dirname(deadSocket), { recursive: true, force: true }));
const subject = { peer: "198.51.100.7", account: "alice" };

test("forwarded_tail keeps whole entries of the last 4096 bytes", () => {
  assert.equal(forwardedTail("203.0.113.9, 10.0.0.1"), "203.0.113.9, 10.0.0.1");
  const exact = "a".repeat(4096);
  assert.equal(forwardedTail(exact), exact, "4096 bytes is read whole");
  assert.equal(forwardedTail("b".repeat(5000)), "", "one entry longer than the window");
  const tail = ", 10.0.0.1";
  const padded = "1.2.3.4, ".repeat(1000) + "203.0.113.9" + tail;
  const kept = forwardedTail(padded);
  assert.ok(Buffer.byteLength(kept) <= 4096 && kept.endsWith("203.0.113.9" + tail));
  assert.ok(padded.endsWith(kept) && padded[padded.length - kept.length - 1] === ",");
  // A comma just before the window: the window starts with a whole entry.
  const edge = "x".repeat(10) + "," + "y".repeat(4096);
  assert.equal(forwardedTail(edge), "y".repeat(4096));
  // Multi-byte characters are counted in bytes.
  const wide = "é".repeat(3000) + ",1.2.3.4";
  assert.equal(forwardedTail(wide), "1.2.3.4");
});

test("GCRA: a burst, then one per interval, and a read spends nothing", () => {
  const second = 1_000_000;
  const spec = gcraSpec(60, 60 * second, 3);
  let tat = null;
  const now = 1000 * second;
  for (const remaining of [2, 1, 0]) {
    const [d, after] = gcraDecide(spec, tat, now, true);
    assert.deepEqual([d.allowed, d.remaining], [true, remaining]);
    tat = after;
  }
  const [refused, after] = gcraDecide(spec, tat, now, true);
  assert.deepEqual([refused.allowed, refused.retryAfterUs], [false, second]);
  assert.equal(after, tat, "a refusal spends nothing");
  assert.equal(gcraDecide(spec, tat, now + second, true)[0].allowed, true);
  const [read, unchanged] = gcraDecide(gcraSpec(1, second, 1), null, now, false);
  assert.deepEqual([read.allowed, unchanged], [true, now]);
});

test("the built-in fail policies are the Rust client's", () => {
  assert.deepEqual(BUILTIN_FAIL_POLICIES, {
    login: "open", reauth: "open", request: "closed", mfa_verify: "closed",
    mfa_resend: "closed", password_reset: "closed", registration: "closed", token: "closed",
  });
});

test("a dead socket: login proceeds open, password_reset does not, unknown routes open", async () => {
  const client = new Client({ socket: deadSocket });
  const login = await client.check("login", subject);
  assert.deepEqual([login.kind, login.policy, login.error.kind, login.proceeds()], ["unavailable", "open", "connect", true]);
  const reset = await client.check("password_reset", subject);
  assert.deepEqual([reset.policy, reset.proceeds(), reset.withinStaticBudget], ["closed", false, false]);
  assert.equal((await client.check("somewhere_else", subject)).proceeds(), true);
  assert.equal(reset.retryAfterSecs(), 1);
  const overridden = new Client({ socket: deadSocket, failPolicies: { login: "closed", request: "open" } });
  assert.equal((await overridden.check("login", subject)).proceeds(), false);
  assert.equal((await overridden.check("request", subject)).proceeds(), true);
});

test("a static budget: checks spend it, reports and abandons only read it", async () => {
  const client = new Client({ socket: deadSocket, staticBudgets: { password_reset: { limit: 1, periodMs: 60_000, burst: 2 } } });
  const first = await client.check("password_reset", subject);
  assert.deepEqual([first.withinStaticBudget, first.proceeds()], [true, true]);
  for (let i = 0; i < 3; i++) assert.equal((await client.report("password_reset", subject, "failure")).withinStaticBudget, true);
  assert.equal((await client.check("password_reset", subject)).proceeds(), true);
  const spent = await client.check("password_reset", subject);
  assert.deepEqual([spent.withinStaticBudget, spent.proceeds()], [false, false]);
  // Open routes never consult a budget.
  const open = new Client({ socket: deadSocket, staticBudgets: { login: { limit: 1, periodMs: 60_000, burst: 1 } } });
  assert.equal((await open.check("login", subject)).withinStaticBudget, false);
});

test("Answer: proceeds, delay and Retry-After", () => {
  const verdict = (decision, retryAfterMs = 0, delayMs = 0) =>
    new Answer({ kind: "verdict", verdict: { decision, retryAfterMs, delayMs }, version: 5 });
  assert.equal(verdict("allow").proceeds(), true);
  assert.equal(verdict("allow").delay(), null);
  assert.deepEqual([verdict("delay", 500, 250).proceeds(), verdict("delay", 500, 250).delay()], [true, 250]);
  assert.equal(verdict("challenge", 1).proceeds(), false);
  assert.deepEqual([verdict("deny", 899251).proceeds(), verdict("deny", 899251).retryAfterSecs()], [false, 900]);
  assert.equal(verdict("deny", 0).retryAfterSecs(), 1);
  const rejected = new Answer({ kind: "rejected", error: { code: "field_too_long", message: "" } });
  assert.deepEqual([rejected.proceeds(), rejected.retryAfterSecs()], [false, 1]);
  const busy = new Answer({ kind: "unavailable", policy: "open", error: new ClientError("busy", "") });
  assert.equal(busy.proceeds(), false, "busy never proceeds, even open");
  const within = new Answer({ kind: "unavailable", policy: "closed", withinStaticBudget: true, error: new ClientError("timeout", "") });
  assert.equal(within.proceeds(), true);
});

test("the guard sends nothing for a check that was not answered", async () => {
  const client = new Client({ socket: deadSocket });
  const attempt = await client.begin("login", subject);
  assert.equal(attempt.proceeds(), true, "login fails open");
  assert.equal(attempt.holdsPlaces, false);
  assert.equal(await attempt.end(), null);
});

test("bad input is the caller's error, not an outage", async () => {
  const client = new Client({ socket: deadSocket });
  await assert.rejects(client.check("login", { peer: "not-an-ip" }), TypeError);
  await assert.rejects(client.report("login", subject, "maybe"), TypeError);
  await assert.rejects(client.check("login", subject, { password: "x" }), /passwordKey/);
  assert.throws(() => new Client({ socket: deadSocket, protocolVersion: 6 }), RangeError);
  assert.throws(() => new Client({ socket: deadSocket, failPolicies: { login: "shut" } }), RangeError);
});

test("bursts: overlapping checks on one account and address are each other's own burst; from other addresses, not", () => {
  const bursts = new Bursts();
  const mallory = { peer: "203.0.113.66", account: "alice" };
  const first = bursts.enter("login", subject);
  assert.deepEqual([first.inBurst(), first.ownBurst()], [false, false], "alone");
  const second = bursts.enter("login", subject);
  for (const g of [first, second]) assert.deepEqual([g.inBurst(), g.ownBurst()], [true, true], "same account and peer");
  first.leave();
  second.leave();

  const other = new Bursts();
  const hers = other.enter("login", subject);
  const his = other.enter("login", mallory);
  for (const g of [hers, his]) assert.deepEqual([g.inBurst(), g.ownBurst()], [true, false], "same account, other peers");
  assert.notEqual(hers.requester, his.requester);
  hers.leave();
  his.leave();
  assert.equal(other.size, 3, "one burst key and two requester keys");

  const peers = new Bursts();
  const anon = { peer: "198.51.100.9" };
  const a = peers.enter("login", anon);
  const b = peers.enter("login", anon);
  for (const g of [a, b]) assert.deepEqual([g.inBurst(), g.ownBurst()], [true, true], "no account: keyed on the peer");
  const c = peers.enter("login", { peer: "198.51.100.10" });
  assert.deepEqual([c.inBurst(), c.ownBurst()], [false, false], "another peer");
  for (const g of [a, b, c]) g.leave();
  assert.equal(peers.size, 2, "the requester is the burst key, entered once");
});

test("bursts: the keys of different accounts and addresses never collide", () => {
  const { key, requester } = burstKeys("login", subject);
  assert.equal(burstKeys("login", { account: "alice" }).key, key, "the burst key is the route and account");
  assert.equal(burstKeys("login", { account: "alice" }).requester, key, "without a peer, the burst key");
  assert.equal(burstKeys("login", { peer: "198.51.100.7" }).requester, burstKeys("login", { peer: "198.51.100.7" }).key);
  assert.equal(burstKeys("login", { ...subject }).requester, requester, "the same account and peer, the same requester");
  // An account or address holding a separator cannot pass for another account and address.
  for (const sep of ["|", "\u0000", '","', "\\", ","]) {
    const a = burstKeys("login", { account: `alice${sep}x`, peer: "y" }).requester;
    const b = burstKeys("login", { account: "alice", peer: `x${sep}y` }).requester;
    assert.notEqual(a, b, `separator ${JSON.stringify(sep)}`);
  }
  assert.notEqual(burstKeys("login", { account: "alice\u0000198.51.100.7" }).key, key, "an account is its own burst key");
  assert.notEqual(burstKeys("lo", { account: "gin|alice" }).key, key, "a route cannot spill into the account");
  assert.notEqual(burstKeys("login", { account: "bob", peer: "198.51.100.7" }).requester, requester, "another account, another requester");
  assert.notEqual(burstKeys("login", { account: "alice", peer: "203.0.113.66" }).requester, requester, "another peer, another requester");
  assert.notEqual(burstKeys("password_reset", subject).requester, requester, "another route, another requester");
});

test("the busy window: busy_max excused from the first refusal, again after 120 x busy_max", () => {
  const windows = new BusyWindows();
  const busyMax = 10_000; // µs
  const t0 = 5_000_000;
  assert.equal(windows.excused("her", t0, busyMax), true, "the first refusal");
  assert.equal(windows.excused("her", t0 + busyMax - 1, busyMax), true, "just before busy_max");
  assert.equal(windows.excused("her", t0 + busyMax, busyMax), false, "busy_max after the first");
  assert.equal(windows.excused("her", t0 + 120 * busyMax - 1, busyMax), false, "still in the window");
  assert.equal(windows.excused("other", t0 + busyMax, busyMax), true, "each requester has its own window");
  assert.equal(windows.excused("her", t0 + 120 * busyMax, busyMax), true, "a new window");
  assert.equal(windows.excused("her", t0 + 121 * busyMax - 1, busyMax), true);
  assert.equal(windows.excused("her", t0 + 121 * busyMax, busyMax), false);
  assert.equal(new BusyWindows().excused("her", t0, 0), false, "busy_max 0 excuses nothing");
});

test("the busy window is bounded: a new requester finds no room while every window is live", () => {
  const windows = new BusyWindows();
  const busyMax = 10_000;
  const t0 = 1_000_000;
  for (let i = 0; i < BUSY_REQUESTERS_MAX; i++) assert.equal(windows.excused(`r${i}`, t0 + i, busyMax), true);
  assert.equal(windows.size, BUSY_REQUESTERS_MAX);
  assert.equal(windows.excused("new", t0 + BUSY_REQUESTERS_MAX, busyMax), false, "full of live windows");
  assert.equal(windows.excused("r0", t0 + 1, busyMax), true, "a kept requester still has its window");
  const ended = t0 + 120 * busyMax + BUSY_REQUESTERS_MAX;
  assert.equal(windows.excused("new", ended, busyMax), true, "the ended windows dropped");
  assert.equal(windows.size, 1);
});

test("known requesters: known after a success, for KNOWN_FOR only", () => {
  const known = new KnownRequesters();
  const t0 = 7_000_000;
  assert.equal(known.known("her", t0), false, "unknown");
  known.succeeded("her", t0);
  assert.equal(known.known("her", t0), true, "after a success");
  assert.equal(known.known("him", t0), false, "only her");
  assert.equal(known.known("her", t0 + KNOWN_FOR_US - 1), true, "just before KNOWN_FOR");
  assert.equal(known.known("her", t0 + KNOWN_FOR_US), false, "KNOWN_FOR after the success");
  known.succeeded("her", t0 + KNOWN_FOR_US);
  assert.equal(known.known("her", t0 + 2 * KNOWN_FOR_US - 1), true, "a new success counts from itself");
  assert.equal(KNOWN_FOR_US, 30 * 24 * 3600 * 1e6, "30 days");
});

test("known requesters are bounded: the oldest or an expired one makes room, an update takes none", () => {
  const known = new KnownRequesters();
  const t0 = 1_000_000;
  for (let i = 0; i < KNOWN_REQUESTERS_MAX; i++) known.succeeded(`r${i}`, t0 + i);
  assert.equal(known.size, KNOWN_REQUESTERS_MAX);
  // An update of a kept requester evicts nobody, and makes it the newest.
  known.succeeded("r0", t0 + KNOWN_REQUESTERS_MAX);
  assert.equal(known.size, KNOWN_REQUESTERS_MAX);
  for (const r of ["r0", "r1", `r${KNOWN_REQUESTERS_MAX - 1}`]) assert.equal(known.known(r, t0 + KNOWN_REQUESTERS_MAX), true, r);
  // A new one when full and none expired: the oldest (r1; r0 was updated) goes.
  const now = t0 + KNOWN_REQUESTERS_MAX + 1;
  known.succeeded("new", now);
  assert.equal(known.size, KNOWN_REQUESTERS_MAX);
  assert.deepEqual(["new", "r0", "r1", "r2"].map((r) => known.known(r, now)), [true, true, false, true]);
  // Expired entries make room first: all but r0 (updated) and the newcomer are KNOWN_FOR old here.
  const later = t0 + KNOWN_REQUESTERS_MAX - 1 + KNOWN_FOR_US;
  known.succeeded("newer", later);
  assert.equal(known.size, 3, "the expired dropped, no live one");
  assert.deepEqual(["r0", "new", "newer", "r2"].map((r) => known.known(r, later)), [true, true, true, false]);
});
