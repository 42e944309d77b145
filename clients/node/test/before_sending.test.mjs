// What the daemon would refuse is refused before sending: identifiers over
// 512 bytes, payloads over 16 KiB, strings that are not well-formed UTF-16.
// Nothing is written, nothing proceeds, no static budget is spent.

import assert from "node:assert/strict";
import { test } from "node:test";
import { Client, IDENTIFIER_BYTES_MAX, REQUEST_PAYLOAD_BYTES_MAX } from "../index.js";
import { allowAll, fakeDaemon } from "./fake_daemon.mjs";

const alice = { peer: "198.51.100.7", account: "alice" };

async function setUp(t, config = {}) {
  const daemon = await fakeDaemon(allowAll);
  t.after(() => daemon.close());
  const client = new Client({ socket: daemon.path, timeoutMs: 1000, ...config });
  t.after(() => client.close());
  return { daemon, client };
}

function assertRefused(answer, code, pattern) {
  assert.deepEqual([answer.kind, answer.error?.code, answer.proceeds(), answer.retryAfterSecs()], ["rejected", code, false, 1]);
  if (pattern) assert.match(answer.error.message, pattern);
}

test("an identifier over 512 bytes is field_too_long, for check, report and abandon, with nothing sent", async (t) => {
  const { daemon, client } = await setUp(t);
  // The attack: a padded client_id on a locked account made the daemon close mid-write, failing open.
  const padded = await client.check("login", { ...alice, clientId: "x".repeat(250_000) });
  assertRefused(padded, "field_too_long", /field `subject\.client_id` is 250000 bytes; the maximum is 512 \(refused before sending\)/);
  for (const field of ["account", "device", "tenant", "clientId"]) {
    const subject = { ...alice, [field]: "é".repeat(257) }; // 257 characters, 514 bytes
    assertRefused(await client.check("login", subject), "field_too_long", /514 bytes/);
    assertRefused(await client.report("login", subject, "failure"), "field_too_long");
    assertRefused(await client.abandon("login", subject), "field_too_long");
  }
  assert.deepEqual([daemon.accepted, daemon.requests.length], [0, 0], "no connection, no byte");
  const longest = { ...alice, account: "a".repeat(IDENTIFIER_BYTES_MAX), clientId: "c".repeat(IDENTIFIER_BYTES_MAX) };
  assert.equal((await client.check("login", longest)).kind, "verdict", "512 bytes are sent");
  assert.equal(daemon.requests.length, 1);
});

test("a payload over 16 KiB is frame_too_large; a long X-Forwarded-For is cut to its tail and sent", async (t) => {
  const { daemon, client } = await setUp(t);
  const route = "r".repeat(REQUEST_PAYLOAD_BYTES_MAX);
  assertRefused(await client.check(route, alice), "frame_too_large", /the maximum is 16384 \(refused before sending\)/);
  assertRefused(await client.report(route, alice, "failure"), "frame_too_large");
  assertRefused(await client.abandon(route, alice), "frame_too_large");
  assert.deepEqual([daemon.accepted, daemon.requests.length], [0, 0]);
  const forwardedFor = Array.from({ length: 20_000 }, (_, i) => `10.0.${i % 256}.${i % 250}`).join(", ");
  assert.equal((await client.check("login", { ...alice, forwardedFor })).kind, "verdict");
  assert.ok(daemon.requests[0].payload.length <= REQUEST_PAYLOAD_BYTES_MAX);
});

test("a refused check spends no static budget, and its guard holds nothing", async (t) => {
  const { daemon, client } = await setUp(t, {
    socket: "/nonexistent/tollgate.sock",
    staticBudgets: { password_reset: { limit: 1, periodMs: 60_000, burst: 1 } },
  });
  const huge = { ...alice, device: "d".repeat(600) };
  for (let i = 0; i < 3; i++) assertRefused(await client.check("password_reset", huge), "field_too_long");
  const attempt = await client.begin("password_reset", huge);
  assertRefused(attempt.answer, "field_too_long");
  assert.deepEqual([attempt.proceeds(), attempt.holdsPlaces, await attempt.end()], [false, false, null]);
  const first = await client.check("password_reset", alice);
  assert.deepEqual([first.kind, first.error.kind, first.withinStaticBudget], ["unavailable", "connect", true], "the budget is whole");
  assert.equal((await client.check("password_reset", alice)).withinStaticBudget, false, "a budget of one");
  assert.equal(daemon.accepted, 0);
});

test("an unpaired surrogate in the route or subject is malformed, never sent as U+FFFD", async (t) => {
  const { daemon, client } = await setUp(t);
  for (const account of ["zed\uD800", "zed\uDBFF", "zed\uDC00", "\uDFFFzed"]) {
    assertRefused(await client.check("login", { ...alice, account }), "malformed", /`subject\.account` has an unpaired surrogate/);
    assertRefused(await client.report("login", { ...alice, account }, "failure"), "malformed");
    assertRefused(await client.abandon("login", { ...alice, account }), "malformed");
  }
  for (const field of ["forwardedFor", "device", "tenant", "clientId"]) {
    assertRefused(await client.check("login", { ...alice, [field]: "x\uD800" }), "malformed");
  }
  assertRefused(await client.check("login\uDBFF", alice), "malformed", /`route`/);
  const attempt = await client.begin("login", { ...alice, account: "zed\uD800" });
  assert.deepEqual([attempt.holdsPlaces, await attempt.end()], [false, null]);
  assert.equal(daemon.accepted, 0);
  // Well-formed text goes out as it is: U+FFFD itself, and a surrogate pair.
  for (const account of ["zed\uFFFD", "zed\uD83D\uDE00"]) assert.equal((await client.check("login", { ...alice, account })).kind, "verdict");
  const sent = daemon.requests.map((r) => r.payload.toString("utf8"));
  assert.ok(sent[0].includes("zed\uFFFD") && sent[1].includes("zed\uD83D\uDE00"));
});
