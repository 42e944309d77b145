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
  BUSY_REQUESTERS_MAX, Bursts, BusyWindows, KNOWN_FOR_US, KNOWN_PER_ACCOUNT_MAX, KNOWN_REQUESTERS_MAX, KnownRequesters,
  burstKeys,
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

test("bursts: behind a proxy, checks on one account from one peer with different X-Forwarded-For are not one's own", () => {
  const bursts = new Bursts();
  const proxy = "10.0.0.1";
  const hers = bursts.enter("login", { account: "alice", peer: proxy, forwardedFor: "198.51.100.7" });
  const his = bursts.enter("login", { account: "alice", peer: proxy, forwardedFor: "203.0.113.66" });
  for (const g of [hers, his]) assert.deepEqual([g.inBurst(), g.ownBurst()], [true, false], "one account, two users behind the proxy");
  const again = bursts.enter("login", { account: "alice", peer: proxy, forwardedFor: "203.0.113.66" });
  assert.deepEqual([again.inBurst(), again.ownBurst()], [true, true], "the same header again: his own burst");
  const tenant = bursts.enter("login", { account: "alice", peer: "198.51.100.7", tenant: "acme" });
  const other = bursts.enter("login", { account: "alice", peer: "198.51.100.7", tenant: "globex" });
  for (const g of [tenant, other]) assert.deepEqual([g.inBurst(), g.ownBurst()], [true, false], "the burst key has no tenant; the requester has");
  for (const g of [hers, his, again, tenant, other]) g.leave();
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

test("requester keys: a field boundary, a tenant or a forwarded header tells requesters apart", () => {
  const req = (s) => burstKeys("login", s).requester;
  // (a) Where a field boundary falls.
  assert.notEqual(req({ account: "bob", peer: "192.0.2.5" }), req({ account: "bob1", peer: "92.0.2.5" }), "account | peer");
  assert.notEqual(
    req({ tenant: "a", account: "bc", peer: "192.0.2.5" }), req({ tenant: "ab", account: "c", peer: "192.0.2.5" }), "tenant | account",
  );
  assert.notEqual(
    req({ account: "bob", peer: "192.0.2.5", forwardedFor: "1.2.3.4" }),
    req({ account: "bob", peer: "192.0.2.51", forwardedFor: ".2.3.4" }),
    "peer | forwarded",
  );
  assert.notEqual(req({ account: "bob", peer: "192.0.2.5" }), req({ account: "bob", forwardedFor: "192.0.2.5" }), "a peer is no header");
  // (b) The same account in two tenants, and in none vs an empty one.
  const bob = { account: "bob", peer: "192.0.2.5" };
  assert.notEqual(req({ ...bob, tenant: "acme" }), req({ ...bob, tenant: "globex" }), "two tenants");
  assert.notEqual(req(bob), req({ ...bob, tenant: "" }), "no tenant vs an empty one");
  assert.notEqual(burstKeys("login", { ...bob, tenant: "acme" }).accountKey, burstKeys("login", { ...bob, tenant: "globex" }).accountKey);
  // (c) The same account and peer with two forwarded headers, and with none vs an empty one.
  assert.notEqual(req({ ...bob, forwardedFor: "198.51.100.7" }), req({ ...bob, forwardedFor: "203.0.113.66" }), "two headers");
  assert.notEqual(req(bob), req({ ...bob, forwardedFor: "" }), "no header vs an empty one");
  assert.equal(req({ ...bob, forwardedFor: "198.51.100.7" }), req({ ...bob, forwardedFor: "198.51.100.7" }), "the same header, the same requester");
  // An account with a forwarded header but no peer still gets its own requester; with neither, the burst key.
  assert.notEqual(req({ account: "bob", forwardedFor: "198.51.100.7" }), burstKeys("login", { account: "bob" }).key);
  assert.equal(req({ account: "bob", tenant: "acme" }), burstKeys("login", { account: "bob", tenant: "acme" }).key);
  // The burst key stays the route and account: neither tenant nor header enters it.
  assert.equal(burstKeys("login", { ...bob, tenant: "acme", forwardedFor: "x" }).key, burstKeys("login", { account: "bob" }).key);
  // The account key is the route, tenant and account, whatever the address.
  assert.equal(burstKeys("login", bob).accountKey, burstKeys("login", { account: "bob", peer: "203.0.113.66" }).accountKey);
  assert.notEqual(burstKeys("login", { tenant: "a", account: "bc" }).accountKey, burstKeys("login", { tenant: "ab", account: "c" }).accountKey);
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
  known.succeeded("her", "alice", t0);
  assert.equal(known.known("her", t0), true, "after a success");
  assert.equal(known.known("him", t0), false, "only her");
  assert.equal(known.known("her", t0 + KNOWN_FOR_US - 1), true, "just before KNOWN_FOR");
  assert.equal(known.known("her", t0 + KNOWN_FOR_US), false, "KNOWN_FOR after the success");
  known.succeeded("her", "alice", t0 + KNOWN_FOR_US);
  assert.equal(known.known("her", t0 + 2 * KNOWN_FOR_US - 1), true, "a new success counts from itself");
  assert.equal(known.size, 1, "an update takes no room");
  assert.equal(KNOWN_FOR_US, 30 * 24 * 3600 * 1e6, "30 days");
});

test("known requesters: at most 16 per account, the account's least recent forgotten first", () => {
  const known = new KnownRequesters();
  const t0 = 1_000_000;
  assert.equal(KNOWN_PER_ACCOUNT_MAX, 16);
  known.succeeded("bob@home", "bob", t0);
  // 17 successes on alice's account from 17 addresses: the first is forgotten, bob's entry is not.
  for (let i = 0; i <= KNOWN_PER_ACCOUNT_MAX; i++) known.succeeded(`alice@${i}`, "alice", t0 + 1 + i);
  const now = t0 + 100;
  assert.equal(known.known("alice@0", now), false, "the account's first, forgotten");
  for (let i = 1; i <= KNOWN_PER_ACCOUNT_MAX; i++) assert.equal(known.known(`alice@${i}`, now), true, `alice@${i}`);
  assert.equal(known.known("bob@home", now), true, "another account's entry is kept, though older");
  assert.deepEqual([known.accountSize("alice"), known.accountSize("bob"), known.size], [16, 1, 17]);
  // An update makes an account's old entry its most recent: the next newcomer pushes out another.
  known.succeeded("alice@1", "alice", now);
  known.succeeded("alice@new", "alice", now + 1);
  assert.deepEqual(["alice@1", "alice@2", "alice@new"].map((r) => known.known(r, now + 1)), [true, false, true]);
  assert.equal(known.accountSize("alice"), 16);
});

test("known requesters: the global cap evicts the least recently succeeded; an update keeps an old one", () => {
  const known = new KnownRequesters();
  const t0 = 1_000_000;
  // One requester per account, so only the global cap applies.
  for (let i = 0; i < KNOWN_REQUESTERS_MAX; i++) known.succeeded(`r${i}`, `a${i}`, t0 + i);
  assert.equal(known.size, KNOWN_REQUESTERS_MAX);
  // An update of a kept requester evicts nobody, and makes it the most recent.
  known.succeeded("r0", "a0", t0 + KNOWN_REQUESTERS_MAX);
  assert.equal(known.size, KNOWN_REQUESTERS_MAX);
  // A new one when full: the least recently succeeded (r1; r0 was updated) goes.
  const now = t0 + KNOWN_REQUESTERS_MAX + 1;
  known.succeeded("new", "a-new", now);
  assert.equal(known.size, KNOWN_REQUESTERS_MAX);
  assert.deepEqual(["new", "r0", "r1", "r2"].map((r) => known.known(r, now)), [true, true, false, true]);
  assert.equal(known.accountSize("a1"), 0, "gone from its account too");
  known.succeeded("newer", "a-newer", now + 1);
  assert.deepEqual(["r0", "r2", "r3"].map((r) => known.known(r, now + 1)), [true, false, true]);
  // Expired entries stay until evicted; they just are not known.
  assert.equal(known.known("r3", t0 + 3 + KNOWN_FOR_US), false);
  assert.equal(known.size, KNOWN_REQUESTERS_MAX);
});
