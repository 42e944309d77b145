// The call path against stand-in daemons: version step-down, deadlines,
// the busy rule, bad replies, the pool, and the guard.

import assert from "node:assert/strict";
import net from "node:net";
import { test } from "node:test";
import { Client, LATE_LISTENERS_MAX, passwordTag } from "../index.js";
import {
  allowAll, errorMessage, fakeDaemon, fakeDaemonThread, frame, sleep, verdictMessage, versionOneOnly,
} from "./fake_daemon.mjs";

const alice = { peer: "198.51.100.7", account: "alice" };
const key = Buffer.alloc(32, 7);

test("a version-1 daemon: one step down at a time, kept per connection, tag dropped", async (t) => {
  const daemon = await fakeDaemon(versionOneOnly);
  t.after(() => daemon.close());
  const client = new Client({ socket: daemon.path, timeoutMs: 1000, passwordKey: key });
  const answer = await client.check("login", alice, { password: "hunter2" });
  assert.deepEqual([answer.kind, answer.version, answer.degraded], ["verdict", 1, false]);
  assert.deepEqual(daemon.requests.map((r) => r.version), [5, 4, 3, 2, 1]);
  assert.deepEqual(daemon.requests.map((r) => r.id), [1, 2, 3, 4, 5], "ids from 1 up, one per frame");
  const [v3, v2] = [daemon.requests[2], daemon.requests[3]];
  assert.equal(v3.payload.length - v2.payload.length, 17, "the tag goes out in version 3 only");
  await client.check("login", alice, { password: "hunter2" });
  assert.equal(daemon.requests.at(-1).version, 1);
  assert.equal(daemon.requests.length, 6, "the connection kept version 1");
  assert.equal(daemon.accepted, 1);
});

test("an abandon below version 5 goes out as the Rust client sends it and is rejected", async (t) => {
  const daemon = await fakeDaemon(versionOneOnly);
  t.after(() => daemon.close());
  const client = new Client({ socket: daemon.path, timeoutMs: 1000 });
  const attempt = await client.begin("login", alice);
  assert.equal(attempt.holdsPlaces, true);
  const abandoned = await attempt.end();
  assert.deepEqual([abandoned.kind, abandoned.error.code, abandoned.proceeds()], ["rejected", "malformed", false]);
  assert.deepEqual([daemon.requests.at(-1).version, daemon.requests.at(-1).tag], [1, 8]);
  assert.equal(await attempt.end(), null, "at most once");
});

test("a configured older version is sent from the first request", async (t) => {
  const daemon = await fakeDaemon(versionOneOnly);
  t.after(() => daemon.close());
  const client = new Client({ socket: daemon.path, timeoutMs: 1000, protocolVersion: 2 });
  await client.check("login", alice);
  assert.deepEqual(daemon.requests.map((r) => r.version), [2, 1]);
});

test("a silent daemon: the deadline ends the call, its connection is never reused; never answered is an outage", async (t) => {
  const daemon = await fakeDaemon(() => null);
  t.after(() => daemon.close());
  const client = new Client({ socket: daemon.path, busyMaxMs: 100 });
  const started = performance.now();
  const answers = await Promise.all([client.check("login", alice), client.check("login", alice)]);
  assert.ok(performance.now() - started < 2000, "the deadline ends the wait");
  for (const a of answers) assert.deepEqual([a.kind, a.error.kind, a.proceeds()], ["unavailable", "timeout", true]);
  await sleep(30);
  assert.equal(daemon.connections, 2, "a timed-out connection listens for a late reply for busy_max");
  await sleep(150);
  assert.equal(daemon.connections, 0, "then it is closed, not pooled");
  const reset = await client.check("password_reset", alice);
  assert.equal(reset.proceeds(), false);
  assert.equal(daemon.accepted, 3, "the next call connects afresh");
});

test("a reply that came by the deadline wins over the timer when the event loop was held past it", async (t) => {
  const daemon = await fakeDaemonThread(); // answers while this thread is held
  t.after(() => daemon.close());
  const client = new Client({ socket: daemon.path, timeoutMs: 5 });
  t.after(() => client.close());
  for (let i = 0; i < 50 && (await client.check("login", alice)).kind !== "verdict"; i++) await sleep(10);
  const write = net.Socket.prototype.write;
  let held = 0;
  // Synchronous work right after the request is written: the loop comes back
  // 30 ms later, past the deadline, with the reply waiting on the socket.
  net.Socket.prototype.write = function heldWrite(...args) {
    const wrote = write.apply(this, args);
    held++;
    for (const until = performance.now() + 30; performance.now() < until;);
    return wrote;
  };
  try {
    for (let i = 0; i < 5; i++) {
      // From the check phase: the loop's next turn runs its expired timers before its reads.
      await new Promise((resolve) => setImmediate(resolve));
      const answer = await client.check("login", alice);
      assert.equal(answer.kind, "verdict", `call ${i}: ${answer.error?.kind ?? answer.kind}`);
    }
  } finally {
    net.Socket.prototype.write = write;
  }
  assert.ok(held >= 5, "every call was held past its deadline");
});

test("the busy rule: a burst on one account after the daemon answered never proceeds", async (t) => {
  let silent = false;
  const daemon = await fakeDaemon((r) => (silent ? null : allowAll(r)));
  t.after(() => daemon.close());
  const staticBudgets = { password_reset: { limit: 100, periodMs: 1000, burst: 100 } };
  const client = new Client({ socket: daemon.path, timeoutMs: 20, busyMaxMs: 150, staticBudgets });
  assert.equal((await client.check("login", alice)).kind, "verdict");
  silent = true;
  const erin = { peer: "203.0.113.5", account: "erin" };
  const [a, b] = await Promise.all([client.check("login", alice), client.check("login", alice)]);
  for (const x of [a, b]) assert.deepEqual([x.error.kind, x.proceeds()], ["busy", false]);
  const [busyReset] = await Promise.all([client.check("password_reset", alice), client.check("password_reset", alice)]);
  assert.deepEqual([busyReset.error.kind, busyReset.withinStaticBudget], ["busy", false], "busy spends no budget");
  await sleep(60); // past the burst gap
  const lone = await client.check("login", erin);
  assert.deepEqual([lone.error.kind, lone.proceeds()], ["timeout", true], "a lone user's timeout is an outage");
  for (const x of [a, b]) assert.match(x.error.message, /busy/, "a busy error says so");
  const report = await client.report("login", alice, "failure");
  assert.equal(report.error.kind, "timeout", "only checks are in bursts");
  for (const x of [lone, report]) {
    // Taken for busy first, then downgraded: the message is a plain timeout's.
    assert.equal(x.error.message, "tollgate did not answer within 20 ms");
  }
  await sleep(200); // the run is now older than busy_max
  const [c, d] = await Promise.all([client.check("login", alice), client.check("login", alice)]);
  for (const x of [c, d]) assert.deepEqual([x.error.kind, x.proceeds()], ["timeout", true]);
});

/**
 * Checks on alice's account from her address and another (mallory's),
 * overlapping, while the daemon is late and has answered before; then again
 * once busy_max has passed since those refusals. With `herSuccess`, a
 * success for alice from her address is reported through the client first
 * ("refused": one refused before sending, so never sent). `her` and `him`
 * replace the two subjects (e.g. two users behind one proxy).
 */
async function overlapTwice(t, { herSuccess, her = alice, him = { peer: "203.0.113.66", account: "alice" } }) {
  let silent = false;
  const daemon = await fakeDaemon((r) => (silent ? null : allowAll(r)));
  t.after(() => daemon.close());
  const client = new Client({ socket: daemon.path, timeoutMs: 20, busyMaxMs: 250 });
  t.after(() => client.close());
  // The daemon answers once, on another account (a check on alice now would make hers a straggler of it: her own burst).
  let answered;
  for (let i = 0; i < 50 && (answered = await client.check("login", { account: "bob" })).kind !== "verdict"; i++) await sleep(10);
  assert.equal(answered.kind, "verdict", "the daemon answered once (a cold start may miss 20 ms)");
  // A report is no check: it is in no burst, whatever it answers.
  if (herSuccess === "refused") {
    // The same requester (the client id is no part of it), refused before sending: it makes nobody known.
    const refused = await client.report("login", { ...her, clientId: "c".repeat(513) }, "success");
    assert.deepEqual([refused.kind, refused.error.code], ["rejected", "field_too_long"]);
  } else if (herSuccess) {
    assert.equal((await client.report("login", her, "success")).kind, "verdict");
  }
  silent = true;
  const first = await Promise.all([client.check("login", her), client.check("login", him)]);
  for (const x of first) assert.deepEqual([x.error.kind, x.proceeds()], ["busy", false], "busy the first time");
  await sleep(270); // busy_max past those refusals
  silent = false;
  // An answer in time: the daemon is busy, not down, so the late run would still say busy.
  assert.equal((await client.check("login", { account: "erin" })).kind, "verdict");
  silent = true;
  const again = await Promise.all([client.check("login", her), client.check("login", him)]);
  return { client, again };
}

test("the busy rule: a burst on her account from other addresses is busy for busy_max only once she has logged in", async (t) => {
  // She logged in from her address through this client: others' checks on her account, overlapping hers while
  // the daemon is late, keep her busy at first, but past busy_max from those refusals her timeout follows the
  // fail policy. The other address never logged in: it stays busy (a guesser's, as far as anyone knows).
  const { client, again } = await overlapTwice(t, { herSuccess: true });
  const [hers, his] = again;
  assert.deepEqual([hers.error.kind, hers.proceeds()], ["timeout", true], "past busy_max in her window");
  assert.equal(hers.error.message, "tollgate did not answer within 20 ms");
  assert.deepEqual([his.error.kind, his.proceeds()], ["busy", false], "an address never seen to log in stays busy");
  // Her own burst (one account and one address) is still busy: it is a guesser's.
  const own = await Promise.all([client.check("login", alice), client.check("login", alice)]);
  for (const x of own) assert.deepEqual([x.error.kind, x.proceeds()], ["busy", false], "an own burst, whatever the window");
});

test("the busy rule: without a success from her address, a burst on her account stays busy past busy_max", async (t) => {
  // A guesser's other address (or a botnet) gets no window: a late guess that failed open would be admitted unchecked.
  const { again } = await overlapTwice(t, { herSuccess: false });
  for (const x of again) assert.deepEqual([x.error.kind, x.proceeds()], ["busy", false], "unknown requesters stay busy");
  for (const x of again) assert.match(x.error.message, /busy/);
});

test("the busy rule: a success refused before sending makes nobody known", async (t) => {
  const { again } = await overlapTwice(t, { herSuccess: "refused" });
  for (const x of again) assert.deepEqual([x.error.kind, x.proceeds()], ["busy", false], "never sent, never known");
});

test("the busy rule behind a proxy: users of one account are told apart by X-Forwarded-For", async (t) => {
  // Both come from the proxy's address; only the header differs. His checks are not her own burst, so once
  // she has logged in her timeout leaves busy after busy_max, while his (never seen to log in) stays busy.
  const proxy = "10.0.0.1";
  const her = { peer: proxy, account: "alice", forwardedFor: "198.51.100.7" };
  const him = { peer: proxy, account: "alice", forwardedFor: "203.0.113.66" };
  const { again } = await overlapTwice(t, { herSuccess: true, her, him });
  const [hers, his] = again;
  assert.deepEqual([hers.error.kind, hers.proceeds()], ["timeout", true], "her window is spent: the fail policy");
  assert.deepEqual([his.error.kind, his.proceeds()], ["busy", false], "his header never logged in");
});

test("a full accept queue (EAGAIN) is a late daemon: timeout or busy, never connect", async (t) => {
  const daemon = await fakeDaemonThread({ backlog: 1 });
  const fillers = [];
  t.after(async () => {
    for (const s of fillers) s.destroy();
    await daemon.close();
  });
  const client = new Client({ socket: daemon.path, timeoutMs: 20, busyMaxMs: 1000 });
  t.after(() => client.close());
  let first;
  for (let i = 0; i < 50 && (first = await client.check("login", alice)).kind !== "verdict"; i++) await sleep(10);
  assert.equal(first.kind, "verdict", "the daemon answered once");
  await daemon.hold(); // stalled: it accepts nothing more
  // Fill its queue (a backlog of 1 holds two) until connecting fails with EAGAIN.
  let code;
  while (code !== "EAGAIN" && fillers.length < 10) {
    const s = net.createConnection({ path: daemon.path });
    s.on("error", () => {});
    fillers.push(s);
    code = await new Promise((resolve) => s.once("connect", () => resolve("connected")).once("error", (e) => resolve(e.code)));
  }
  assert.equal(code, "EAGAIN", "the queue is full");

  // A client the daemon never answered: an outage, not "cannot be reached".
  const fresh = new Client({ socket: daemon.path, timeoutMs: 20 });
  const lone = await fresh.check("login", { account: "erin" });
  assert.deepEqual([lone.kind, lone.error.kind, lone.proceeds()], ["unavailable", "timeout", true]);
  assert.match(lone.error.message, /queue is full/);
  const reset = await fresh.check("password_reset", { account: "erin" });
  assert.deepEqual([reset.error.kind, reset.proceeds()], ["timeout", false]);

  // Overlapped checks on one account after the daemon answered: busy, none proceeds
  // (one may take the pooled connection and time out reading; the rest cannot connect).
  const answers = await Promise.all([1, 2, 3].map(() => client.check("login", alice)));
  for (const a of answers) assert.deepEqual([a.kind, a.error.kind, a.proceeds()], ["unavailable", "busy", false]);
  assert.ok(answers.filter((a) => /queue is full/.test(a.error.message)).length >= 2, "connecting failed with EAGAIN");
});

test("out of descriptors (EMFILE) connecting is a late daemon, not connect; EACCES is connect", async (t) => {
  const daemon = await fakeDaemon(allowAll);
  t.after(() => daemon.close());
  const client = new Client({ socket: daemon.path, timeoutMs: 20, busyMaxMs: 1000 });
  t.after(() => client.close());
  assert.equal((await client.check("login", alice)).kind, "verdict", "the daemon answered once");
  // The daemon closes the idle pooled connection: the next calls connect afresh.
  for (const r of daemon.requests) r.socket.destroy();
  while (daemon.connections > 0) await sleep(1);
  await sleep(5);
  // Connecting fails as libuv reports it when socket() finds no descriptor.
  const realCreate = net.createConnection;
  let code = "EMFILE";
  net.createConnection = (options) => {
    const socket = new net.Socket();
    const error = Object.assign(new Error(`connect ${code} ${options.path}`), { code, syscall: "connect" });
    process.nextTick(() => socket.destroy(error));
    return socket;
  };
  t.after(() => {
    net.createConnection = realCreate;
  });
  const answers = await Promise.all([1, 2].map(() => client.check("login", alice)));
  for (const a of answers) assert.deepEqual([a.kind, a.error.kind, a.proceeds()], ["unavailable", "busy", false]);
  for (const a of answers) assert.match(a.error.message, /EMFILE/);
  const fresh = new Client({ socket: daemon.path, timeoutMs: 20 });
  const lone = await fresh.check("login", { account: "erin" });
  assert.deepEqual([lone.error.kind, lone.proceeds()], ["timeout", true], "never answered: an outage");
  code = "EACCES";
  const denied = await fresh.check("login", { account: "erin" });
  assert.deepEqual([denied.error.kind, denied.proceeds()], ["connect", true], "not allowed is connect");
});

test("the busy rule: a timely answer busy_max after the run's last timeout ends it", async (t) => {
  let silent = false;
  const daemon = await fakeDaemon((r) => (silent ? null : allowAll(r)));
  t.after(() => daemon.close());
  const client = new Client({ socket: daemon.path, timeoutMs: 20, busyMaxMs: 80 });
  await client.check("login", alice);
  silent = true;
  await Promise.all([client.check("login", alice), client.check("login", alice)]);
  silent = false;
  await sleep(100);
  await client.check("login", { account: "bob" });
  silent = true;
  const [a, b] = await Promise.all([client.check("login", alice), client.check("login", alice)]);
  assert.deepEqual([a.error.kind, b.error.kind], ["busy", "busy"], "a new run");
  const zero = new Client({ socket: daemon.path, timeoutMs: 20, busyMaxMs: 0 });
  silent = false;
  await zero.check("login", alice);
  silent = true;
  const [e] = await Promise.all([zero.check("login", alice), zero.check("login", alice)]);
  assert.equal(e.error.kind, "timeout", "busy_max 0: every timeout is an outage");
});

test("the busy rule: a daemon that answered in time within busy_max is busy in an old run", async (t) => {
  // Bursts closer together than busy_max: the answer between them comes too soon to end the run,
  // which grows older than busy_max; a late burst then must still not proceed.
  let silent = false;
  const daemon = await fakeDaemon((r) => (silent ? null : allowAll(r)));
  t.after(() => daemon.close());
  const client = new Client({ socket: daemon.path, timeoutMs: 30, busyMaxMs: 600 });
  await client.check("login", alice);
  silent = true;
  const first = await Promise.all([client.check("login", alice), client.check("login", alice)]);
  // The run began just before: timed from here, the late burst meets a run older than busy_max.
  const started = performance.now();
  assert.deepEqual(first.map((x) => x.error.kind), ["busy", "busy"]);
  silent = false;
  await sleep(200);
  assert.equal((await client.check("login", { account: "bob" })).kind, "verdict");
  await sleep(Math.max(0, 650 - (performance.now() - started)));
  silent = true;
  const late = await Promise.all([client.check("login", alice), client.check("login", alice)]);
  for (const x of late) assert.deepEqual([x.error.kind, x.proceeds()], ["busy", false], "answered in time within busy_max");
  await sleep(650);
  const gone = await Promise.all([client.check("login", alice), client.check("login", alice)]);
  for (const x of gone) assert.deepEqual([x.error.kind, x.proceeds()], ["timeout", true], "nothing in time for busy_max");
});

/**
 * A fake daemon that answers each request at once, `LATE_MS` after it came
 * while `mode.late` is set (just past a 20 ms client timeout), or never while
 * `mode.silent` is set.
 */
const LATE_MS = 150;
async function lateDaemon(t) {
  const mode = { late: false, silent: false };
  const pending = new Set();
  const daemon = await fakeDaemon((r) => {
    if (mode.silent) return null;
    if (!mode.late) return allowAll(r);
    const timer = setTimeout(() => {
      pending.delete(timer);
      if (!r.socket.destroyed) r.socket.write(allowAll(r));
    }, LATE_MS);
    pending.add(timer);
    return null;
  });
  // A reply still owed must not outlive its test: its timer would count
  // among the next test's active timers.
  t.after(() => {
    for (const timer of pending) clearTimeout(timer);
    return daemon.close();
  });
  return { daemon, mode };
}

/**
 * Lone checks on other accounts, one after another, until `since` is `forMs`
 * ago: the daemon answers each late, so each times out (a lone user's
 * timeout is an outage) and returns at its deadline, not when its reply comes.
 * Then waits for the last late reply to come.
 */
async function loneLateChecks(client, since, forMs) {
  for (let i = 0; performance.now() - since < forMs; i++) {
    const started = performance.now();
    const lone = await client.check("login", { peer: "203.0.113.5", account: `user${i}` });
    assert.deepEqual([lone.kind, lone.error?.kind], ["unavailable", "timeout"], `lone check ${i}: no answer in time`);
    assert.ok(performance.now() - started < LATE_MS, "the call returns at its deadline: its listener does not hold it");
    await sleep(40);
  }
  await sleep(LATE_MS + 20);
}

/** Waits until `done()` holds, or `ms` have passed. */
async function waitFor(done, ms) {
  for (const until = performance.now() + ms; !done() && performance.now() < until; ) await sleep(5);
}

/** The first call of a fresh process can take longer than 20 ms (a cold start): the daemon is asked until it answers in time. */
async function answeredOnceInTime(client) {
  let answer;
  for (let i = 0; i < 50 && (answer = await client.check("login", alice)).kind !== "verdict"; i++) await sleep(10);
  assert.equal(answer.kind, "verdict", "answered once in time");
}

/**
 * A client (busy_max 400 ms) of a fake daemon that answered it in time once,
 * then late for every call for longer than busy_max.
 */
async function lateForLongerThanBusyMax(t) {
  const { daemon, mode } = await lateDaemon(t);
  const busyMaxMs = 400;
  const client = new Client({ socket: daemon.path, timeoutMs: 20, busyMaxMs });
  t.after(() => client.close());
  await answeredOnceInTime(client);
  const answered = performance.now();
  mode.late = true;
  await loneLateChecks(client, answered, busyMaxMs + 100);
  return { client, mode, busyMaxMs };
}

test("the busy rule: a daemon that answers every call late for longer than busy_max is busy, not down", async (t) => {
  // A loaded host keeps the daemon late for every call while it answers
  // them all: the run and the last answer in time grow older than
  // busy_max, but the late replies heard on timed-out connections keep a
  // burst on one account busy.
  const { client } = await lateForLongerThanBusyMax(t);
  const burst = await Promise.all([client.check("login", alice), client.check("login", alice)]);
  for (const x of burst) assert.deepEqual([x.error.kind, x.proceeds()], ["busy", false], "answered late within busy_max");
});

test("the busy rule: a daemon that stops answering is down once its last late reply is older than busy_max", async (t) => {
  const { client, mode, busyMaxMs } = await lateForLongerThanBusyMax(t);
  mode.silent = true;
  const heard = await Promise.all([client.check("login", alice), client.check("login", alice)]);
  for (const x of heard) assert.deepEqual([x.error.kind, x.proceeds()], ["busy", false], "answered late within busy_max");
  // Nothing at all comes from here on, not even late.
  await sleep(busyMaxMs + 100);
  const gone = await Promise.all([client.check("login", alice), client.check("login", alice)]);
  for (const x of gone) assert.deepEqual([x.error.kind, x.proceeds()], ["timeout", true], "nothing heard for busy_max: an outage");
});

test("the busy rule: a burst after a quiet gap longer than busy_max is busy when a late reply was heard after the run", async (t) => {
  // Load from elsewhere keeps the daemon late while this client makes no
  // calls for longer than busy_max. The burst times out before any of its own
  // late replies come: the run, the last answer in time and the last late
  // reply are all older than busy_max, but the reply heard after the run's
  // last timeout starts a new run.
  const { daemon, mode } = await lateDaemon(t);
  const busyMaxMs = 400;
  const client = new Client({ socket: daemon.path, timeoutMs: 20, busyMaxMs });
  t.after(() => client.close());
  await answeredOnceInTime(client);
  mode.late = true;
  const lone = await client.check("login", { peer: "203.0.113.5", account: "lone" });
  assert.deepEqual([lone.kind, lone.error?.kind, lone.proceeds()], ["unavailable", "timeout", true], "a lone late check");
  await sleep(LATE_MS + 20); // its late reply is heard
  await sleep(busyMaxMs + 50); // no calls at all
  const burst = await Promise.all([client.check("login", alice), client.check("login", alice)]);
  for (const x of burst) assert.deepEqual([x.error?.kind, x.proceeds()], ["busy", false], "a late reply heard after the run");
});

test("at most LATE_LISTENERS_MAX timed-out connections listen at once, for busy_max, without keeping the process alive", async (t) => {
  let silent = false;
  const daemon = await fakeDaemon((r) => (silent ? null : allowAll(r)));
  t.after(() => daemon.close());
  // Long enough that a loaded host settles the closed connections while the listeners still listen.
  const busyMaxMs = 1000;
  // Only a call whose request was written whole is listened on: the
  // deadline leaves a loaded host time to connect and write all of them.
  const client = new Client({ socket: daemon.path, timeoutMs: 200, busyMaxMs });
  t.after(() => client.close());
  await answeredOnceInTime(client);
  await sleep(30); // any connection a slow first try left listening has closed
  // Both ends of each connection are in this process; the pooled one's are both kept alive.
  const pipes = () => process.getActiveResourcesInfo().filter((r) => r === "PipeWrap").length;
  const timers = () => process.getActiveResourcesInfo().filter((r) => r === "Timeout").length;
  const otherPipes = pipes() - 2 * daemon.connections;
  const timersBefore = timers();
  const sentBefore = daemon.requests.length;
  silent = true;
  const calls = LATE_LISTENERS_MAX + 8;
  const answers = await Promise.all(Array.from({ length: calls }, (_, i) => client.check("login", { account: `u${i}` })));
  for (const a of answers) assert.equal(a.kind, "unavailable");
  // The daemon reads, and both ends of a closed connection close, a turn or more later.
  await waitFor(
    () => daemon.requests.length - sentBefore === calls && daemon.connections <= LATE_LISTENERS_MAX && pipes() - otherPipes <= daemon.connections,
    500,
  );
  assert.equal(daemon.requests.length - sentBefore, calls, "every request went out whole");
  assert.equal(daemon.connections, LATE_LISTENERS_MAX, "the rest were closed at once");
  // Only the daemon's ends keep the process alive: the listeners' sockets and timers do not.
  assert.equal(pipes() - otherPipes, daemon.connections, "listening sockets are unref'd");
  assert.equal(timers(), timersBefore, "listening timers are unref'd");
  await waitFor(() => daemon.connections === 0, busyMaxMs + 2000);
  assert.equal(daemon.connections, 0, "each listens for busy_max, then closes");
});

test("bad replies break the connection: over 8 MiB, trailing bytes, another id", async (t) => {
  let mode = "big";
  const daemon = await fakeDaemon(({ version, id }) => {
    if (mode === "big") {
      const header = Buffer.alloc(4);
      header.writeUInt32LE(8 * 1024 * 1024 + 1);
      return header;
    }
    if (mode === "trailing") return frame(version, id, Buffer.concat([verdictMessage(version), Buffer.from([0])]));
    if (mode === "other-id") return frame(version, id + 1, verdictMessage(version));
    if (mode === "id-0") return frame(1, 0, errorMessage(7, "frame too large"));
    return allowAll({ version, id });
  });
  t.after(() => daemon.close());
  const client = new Client({ socket: daemon.path, timeoutMs: 1000 });
  for (const m of ["big", "trailing", "other-id"]) {
    mode = m;
    const answer = await client.check("login", alice);
    assert.deepEqual([answer.kind, answer.error.kind], ["unavailable", "protocol"], m);
  }
  mode = "id-0";
  const rejected = await client.check("login", alice);
  assert.deepEqual([rejected.kind, rejected.error.code], ["rejected", "frame_too_large"]);
  await sleep(20);
  assert.equal(daemon.connections, 1, "only the last, clean connection stays");
});

test("the pool: connections reused, at most 64 kept, daemon-closed ones replaced", async (t) => {
  let closeAfterReply = false;
  const daemon = await fakeDaemon((r) => {
    const reply = allowAll(r);
    if (closeAfterReply) {
      r.socket.end(reply);
      return null;
    }
    return reply;
  });
  t.after(() => daemon.close());
  const client = new Client({ socket: daemon.path, timeoutMs: 2000 });
  for (let i = 0; i < 5; i++) await client.check("login", alice);
  assert.equal(daemon.accepted, 1);
  await Promise.all(Array.from({ length: 100 }, () => client.check("login", { account: `u${Math.random()}` })));
  await sleep(50);
  assert.ok(daemon.connections <= 64, `${daemon.connections} connections kept`);
  closeAfterReply = true;
  for (let i = 0; i < 3; i++) {
    await sleep(10);
    assert.equal((await client.check("login", alice)).kind, "verdict");
  }
  client.close();
});

test("the guard: abandons an allowed check once, never after a report or a refusal", async (t) => {
  let decision = 0;
  const daemon = await fakeDaemon(({ version, id }) => frame(version, id, verdictMessage(version, { decision, retryAfterMs: 1500, delayMs: decision === 1 ? 20 : 0 })));
  t.after(() => daemon.close());
  const client = new Client({ socket: daemon.path, timeoutMs: 1000, passwordKey: key });
  const tags = () => daemon.requests.map((r) => r.tag);

  const thrown = async () => {
    const attempt = await client.begin("login", alice, { password: "hunter2" });
    try {
      throw new Error("the handler failed");
    } finally {
      await attempt.end();
    }
  };
  await assert.rejects(thrown, /handler failed/);
  assert.deepEqual(tags(), [0, 8]);

  const attempt = await client.begin("login", alice);
  const report = await attempt.report("failure", { password: "nope" });
  assert.equal(report.kind, "verdict");
  assert.equal(await attempt.end(), null);
  await assert.rejects(attempt.report("success"), /already/);
  assert.deepEqual(tags(), [0, 8, 0, 1]);
  assert.equal(daemon.requests.at(-1).payload.length, 9 + 4 + 13 + 1 + 4 + 1 + 4 + 1 + 8 + 5 + 3 + 4 + 17 + 17);

  for (decision of [1, 2, 3]) {
    const refused = await client.begin("login", alice);
    assert.equal(refused.proceeds(), decision === 1);
    assert.equal(await refused.end(), null);
  }
  assert.deepEqual(tags(), [0, 8, 0, 1, 0, 0, 0]);
});

test("the guard's report without a tag carries the check's; a given tag or password wins", async (t) => {
  const daemon = await fakeDaemon(allowAll);
  t.after(() => daemon.close());
  const client = new Client({ socket: daemon.path, timeoutMs: 1000, passwordKey: key });
  t.after(() => client.close());
  // A version-5 Report ends with its tag option: 1 and 16 bytes, or 0 for none.
  const sentTag = () => {
    const r = daemon.requests.at(-1);
    assert.equal(r.tag, 1, "a Report");
    return r.payload[r.payload.length - 17] === 1 ? Buffer.from(r.payload.subarray(-16)) : null;
  };
  const checked = passwordTag(key, "hunter2");
  const other = Buffer.alloc(16, 9);
  const cases = [
    [{ password: "hunter2" }, {}, checked],
    [{ password: "hunter2" }, { passwordDigest: Buffer.alloc(16, 1) }, checked],
    [{ password: "hunter2" }, { subject: { ...alice, device: "d1" } }, checked],
    [{ passwordTag: other }, {}, other],
    [{ password: "hunter2" }, { passwordTag: other }, other],
    [{ password: "hunter2" }, { password: "letmein" }, passwordTag(key, "letmein")],
  ];
  for (const [i, [begun, reported, expected]] of cases.entries()) {
    const attempt = await client.begin("login", alice, begun);
    assert.deepEqual(daemon.requests.at(-1).payload.subarray(-16), Buffer.from(begun.passwordTag ?? checked), `case ${i}: the check's tag`);
    await attempt.report("failure", reported);
    assert.deepEqual(sentTag(), Buffer.from(expected), `case ${i}`);
    await attempt.end();
  }
  const untagged = await client.begin("login", alice);
  await untagged.report("failure");
  assert.equal(sentTag(), null, "no tag at the check, none at the report");
});
