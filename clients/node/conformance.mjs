// The conformance runner of docs/clients.md ("The conformance kit"): one
// JSON request a line on stdin, one JSON reply a line on stdout, in order.
// Logs go to stderr only.

import net from "node:net";
import readline from "node:readline";
import { Client, encodeRequest, passwordDigest, passwordTag } from "./index.js";

const ZERO_KEY = "00".repeat(32);

let client = null;
let key = Buffer.from(ZERO_KEY, "hex");
let settings = null;
const attempts = new Map();

/** A runner subject (snake_case, null for None) as the library's. */
function subjectOf(json) {
  const s = json ?? {};
  const field = (name) => (s[name] === undefined || s[name] === null ? null : s[name]);
  return {
    peer: field("peer"),
    forwardedFor: field("forwarded_for"),
    account: field("account"),
    device: field("device"),
    tenant: field("tenant"),
    clientId: field("client_id"),
  };
}

function answerJson(answer) {
  const retry_after_s = answer.retryAfterSecs();
  const proceeds = answer.proceeds();
  if (answer.kind === "verdict") {
    const v = answer.verdict;
    return {
      answer: "verdict", proceeds, decision: v.decision, retry_after_ms: Number(v.retryAfterMs),
      delay_ms: Number(v.delayMs), limit: v.limit, remaining: v.remaining, reset_ms: Number(v.resetMs),
      reason: v.reason, rule: v.rule, degraded: answer.degraded, retry_after_s, version: answer.version,
    };
  }
  if (answer.kind === "rejected") return { answer: "rejected", proceeds, code: answer.error.code, retry_after_s };
  return {
    answer: "unavailable", proceeds, policy: answer.policy, error: answer.error.kind,
    within_static_budget: answer.withinStaticBudget, retry_after_s,
  };
}

function needClient() {
  if (!client) throw new Error("no client: send an open first");
  return client;
}

function parseKey(hex) {
  if (typeof hex !== "string" || !/^[0-9a-fA-F]{64}$/.test(hex)) throw new Error("key must be 64 hex digits");
  return Buffer.from(hex, "hex");
}

async function open(req) {
  client?.close();
  const staticBudgets = {};
  for (const [route, b] of Object.entries(req.static_budgets ?? {})) {
    staticBudgets[route] = { limit: b.limit, periodMs: b.period_ms, burst: b.burst };
  }
  key = req.key != null ? parseKey(req.key) : Buffer.from(ZERO_KEY, "hex");
  settings = { socket: req.socket, version: req.protocol_version ?? 5 };
  client = new Client({
    socket: req.socket,
    timeoutMs: req.timeout_ms ?? undefined,
    busyMaxMs: req.busy_max_ms ?? undefined,
    protocolVersion: req.protocol_version ?? undefined,
    failPolicies: req.fail_policies ?? {},
    staticBudgets,
    passwordKey: key,
  });
  attempts.clear();
  return { ok: true };
}

function passwordOption(req) {
  return req.password === undefined || req.password === null ? {} : { password: req.password };
}

/** `threads` loops of checks for `millis` ms, through the client or on raw sockets. */
async function bench(req) {
  const threads = Math.max(1, req.threads ?? 1);
  const millis = req.millis ?? 1000;
  const subject = subjectOf(req.subject);
  const started = performance.now();
  const until = started + millis;
  let calls = 0;
  const viaClient = async () => {
    const c = needClient();
    while (performance.now() < until) {
      await c.check(req.route, subject);
      calls++;
    }
  };
  const raw = async () => {
    const frame = encodeRequest(5, 1, { type: "check", route: req.route, subject });
    const socket = net.createConnection({ path: settings.socket });
    await new Promise((resolve, reject) => socket.once("connect", resolve).once("error", reject));
    let buffered = Buffer.alloc(0);
    let wake = null;
    socket.on("data", (chunk) => {
      buffered = Buffer.concat([buffered, chunk]);
      wake?.();
    });
    const closed = new Promise((resolve) => socket.once("close", resolve));
    socket.on("error", () => wake?.());
    try {
      while (performance.now() < until && !socket.destroyed) {
        socket.write(frame);
        for (;;) {
          if (buffered.length >= 4 && buffered.length >= 4 + buffered.readUInt32LE(0)) break;
          await Promise.race([new Promise((resolve) => (wake = resolve)), closed]);
          if (socket.destroyed) throw new Error("the daemon closed the raw connection");
        }
        buffered = buffered.subarray(4 + buffered.readUInt32LE(0));
        calls++;
      }
    } finally {
      socket.destroy();
    }
  };
  await Promise.all(Array.from({ length: threads }, () => (req.raw ? raw() : viaClient())));
  return { calls, millis: Math.round(performance.now() - started) };
}

async function handle(req) {
  switch (req.op) {
    case "open":
      return open(req);
    case "check":
      return answerJson(await needClient().check(req.route, subjectOf(req.subject), passwordOption(req)));
    case "report":
      return answerJson(await needClient().report(req.route, subjectOf(req.subject), req.outcome, passwordOption(req)));
    case "abandon":
      return answerJson(await needClient().abandon(req.route, subjectOf(req.subject)));
    case "checks": {
      const c = needClient();
      const answers = await Promise.all((req.subjects ?? []).map((s) => c.check(req.route, subjectOf(s))));
      return { answers: answers.map(answerJson) };
    }
    case "begin": {
      if (typeof req.attempt !== "string") throw new Error("begin needs an attempt name");
      const attempt = await needClient().begin(req.route, subjectOf(req.subject), passwordOption(req));
      attempts.set(req.attempt, attempt);
      return answerJson(attempt.answer);
    }
    case "finish": {
      const attempt = attempts.get(req.attempt);
      if (!attempt) throw new Error(`no attempt named ${JSON.stringify(req.attempt)}`);
      const options = passwordOption(req);
      if (req.subject !== undefined && req.subject !== null) options.subject = subjectOf(req.subject);
      // Kept under its name: a later `end` finds it spent and sends nothing.
      return answerJson(await attempt.report(req.outcome, options));
    }
    case "end": {
      const attempt = attempts.get(req.attempt);
      if (!attempt) throw new Error(`no attempt named ${JSON.stringify(req.attempt)}`);
      return { abandoned: (await attempt.end()) !== null };
    }
    case "digest": {
      const k = req.key != null ? parseKey(req.key) : key;
      return {
        digest: passwordDigest(k, req.account ?? "", req.password ?? "").toString("hex"),
        tag: passwordTag(k, req.password ?? "").toString("hex"),
      };
    }
    case "bench":
      return bench(req);
    default:
      throw new Error(`unknown op ${JSON.stringify(req.op)}`);
  }
}

function write(line) {
  return new Promise((resolve) => process.stdout.write(`${line}\n`, resolve));
}

const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of lines) {
  if (line.trim() === "") continue;
  let reply;
  try {
    reply = await handle(JSON.parse(line));
  } catch (error) {
    console.error(`tollgate conformance runner: ${error?.stack ?? error}`);
    reply = { error: String(error?.message ?? error) };
  }
  await write(JSON.stringify(reply));
}
client?.close();
process.exit(0);
