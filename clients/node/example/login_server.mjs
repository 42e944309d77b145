// A small login endpoint using tollgate as an auth server should (the
// Node.js counterpart of examples/login_server.rs): check before the slow
// password hash, report after, through the guard; one 429 with Retry-After
// for every refusal; a floor so refusals and unknown accounts are never
// faster than a real wrong password.
//
//   node example/login_server.mjs /tmp/tollgate/tollgate.sock 8080
//   curl -si -H 'content-type: application/json' -d '{"account":"alice","password":"nope"}' http://127.0.0.1:8080/login

import { pbkdf2, randomBytes, timingSafeEqual } from "node:crypto";
import http from "node:http";
import { promisify } from "node:util";
import { Client } from "../index.js";

const [socket = "/run/tollgate/tollgate.sock", port = "8080"] = process.argv.slice(2);
// Keep the key stable (restarts, every process sharing the daemon): load it.
const passwordKey = process.env.TOLLGATE_PASSWORD_KEY ?? randomBytes(32); // 64 hex digits
if (!process.env.TOLLGATE_PASSWORD_KEY) console.error("TOLLGATE_PASSWORD_KEY unset: a throwaway key, for this demo only");
const limiter = new Client({ socket, passwordKey });
const hash = promisify(pbkdf2);
const FLOOR_MS = 150;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

const saltOf = randomBytes(16);
const stretch = (password) => hash(password, saltOf, 200_000, 32, "sha256");
// One demo user; an unknown account is verified against a dummy hash, the same work.
const users = new Map([["alice", await stretch("correct horse battery staple")]]);
const dummy = await stretch(randomBytes(16).toString("hex"));

function send(res, status, body, headers = {}) {
  res.writeHead(status, { "content-type": "application/json", "cache-control": "no-store", ...headers });
  res.end(JSON.stringify(body));
}

async function readFields(req) {
  let body = "";
  for await (const chunk of req) {
    body += chunk;
    if (body.length > 16384) return null;
  }
  try {
    if ((req.headers["content-type"] ?? "").startsWith("application/json")) return JSON.parse(body);
    return Object.fromEntries(new URLSearchParams(body));
  } catch {
    return null;
  }
}

async function login(req) {
  const fields = await readFields(req);
  if (typeof fields?.account !== "string" || typeof fields?.password !== "string") return [400, { error: "bad request" }];
  const forwarded = req.headers["x-forwarded-for"];
  const subject = {
    peer: req.socket.remoteAddress,
    forwardedFor: Array.isArray(forwarded) ? forwarded.join(", ") : forwarded,
    account: fields.account,
  };

  // 1. Before the expensive work. The guard abandons the attempt if this
  //    handler throws before its report, so no place is left held.
  const attempt = await limiter.begin("login", subject, { password: fields.password });
  try {
    const answer = attempt.answer;
    if (!answer.proceeds()) {
      // One refusal whatever the reason: the reason goes to the log only.
      console.error("login refused:", answer.verdict?.reason ?? answer.error?.code ?? answer.error?.kind);
      return [429, { error: "too many attempts, try again later" }, { "retry-after": String(answer.retryAfterSecs()) }];
    }
    if (answer.delay()) await sleep(answer.delay());
    if (answer.kind === "unavailable") console.error(`tollgate unavailable (${answer.error.kind}): login fails open`);

    // 2. Verify.
    const stored = users.get(fields.account);
    const tried = await stretch(fields.password);
    const ok = timingSafeEqual(tried, stored ?? dummy) && stored !== undefined;

    // 3. Report (the digest and tag come from `password` and the client's key).
    await attempt.report(ok ? "success" : "failure", { password: fields.password });
    return ok ? [200, { status: "ok" }] : [401, { error: "invalid account or password" }];
  } finally {
    await attempt.end();
  }
}

http
  .createServer(async (req, res) => {
    const arrived = Date.now();
    if (req.method !== "POST" || req.url !== "/login") return send(res, 404, { error: "not found" });
    let status, body, headers;
    try {
      [status, body, headers] = await login(req);
    } catch (error) {
      console.error(error);
      [status, body] = [500, { error: "internal error" }];
    }
    if (status !== 200) await sleep(arrived + FLOOR_MS - Date.now());
    send(res, status, body, headers);
  })
  .listen(Number(port), "127.0.0.1", () => console.error(`login server on http://127.0.0.1:${port}/login`));
