// Against a real daemon, when one is at $TOLLGATE_DAEMON (default
// /tmp/tollgate-daemon): lockouts, places held and given back, refusals.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { Client } from "../index.js";
import { sleep } from "./fake_daemon.mjs";

const binary = process.env.TOLLGATE_DAEMON ?? "/tmp/tollgate-daemon";
const skip = existsSync(binary) ? false : `no daemon at ${binary}`;

async function startDaemon(t) {
  const dir = mkdtempSync(join(tmpdir(), "tollgate-node-daemon-"));
  const socket = join(dir, "t.sock");
  const child = spawn(binary, ["serve", "--socket", socket, "--state", join(dir, "state.redb"), "--manual-clock"], {
    stdio: ["ignore", "ignore", "ignore"],
  });
  t.after(() => child.kill("SIGKILL"));
  for (let i = 0; i < 200 && !existsSync(socket); i++) await sleep(25);
  // The socket file may appear before the daemon accepts: wait for an answer.
  const probe = new Client({ socket, timeoutMs: 500 });
  for (let i = 0; i < 100; i++) {
    if ((await probe.check("nope", {})).kind === "rejected") break;
    await sleep(25);
  }
  probe.close();
  return socket;
}

test("a live daemon: lockout, places, the guard, refusals", { skip }, async (t) => {
  const socket = await startDaemon(t);
  const client = new Client({ socket, timeoutMs: 1000, passwordKey: Buffer.alloc(32, 7) });
  t.after(() => client.close());

  const mallory = { peer: "198.51.100.9", account: "mallory" };
  for (let i = 0; i < 5; i++) {
    const attempt = await client.begin("login", mallory, { password: `guess-${i}` });
    assert.equal(attempt.answer.verdict.decision, "allow");
    try {
      await attempt.report("failure", { password: `guess-${i}` });
    } finally {
      await attempt.end();
    }
  }
  const locked = await client.check("login", mallory);
  assert.deepEqual([locked.proceeds(), locked.verdict.reason, locked.version], [false, "too_many_failures", 5]);
  assert.ok(locked.retryAfterSecs() > 1);

  const bob = { peer: "198.51.100.10", account: "bob" };
  const held = [];
  for (let i = 0; i < 5; i++) held.push(await client.begin("login", bob));
  const full = await client.check("login", bob);
  assert.deepEqual([full.proceeds(), full.verdict.reason], [false, "attempts_in_flight"]);
  const abandoned = await held[0].end();
  assert.equal(abandoned.kind, "verdict");
  assert.equal((await client.begin("login", bob)).proceeds(), true, "the abandoned place is free again");

  const long = await client.check("login", { peer: "198.51.100.11", account: "a".repeat(513) });
  assert.deepEqual([long.kind, long.error.code, long.proceeds()], ["rejected", "field_too_long", false]);
  const missing = await client.check("login", { account: "carol" });
  assert.deepEqual([missing.kind, missing.error.code], ["rejected", "missing_field"]);

  const old = new Client({ socket, timeoutMs: 1000, protocolVersion: 4 });
  const v4 = await old.check("login", { peer: "198.51.100.12", account: "dave" });
  assert.equal(v4.version, 4);
  const refused = await old.abandon("login", { peer: "198.51.100.12", account: "dave" });
  assert.deepEqual([refused.kind, refused.error.code], ["rejected", "malformed"]);
  old.close();
});
