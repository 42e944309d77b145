// A stand-in daemon on a temp Unix socket for tests that need one to
// misbehave: speak only version 1, fall silent, answer with bad frames.

import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";

/** One reply frame: the envelope, then `message` bytes. */
export function frame(version, id, message) {
  const payload = Buffer.alloc(9 + message.length);
  payload[0] = version;
  payload.writeBigUInt64LE(BigInt(id), 1);
  message.copy(payload, 9);
  const header = Buffer.alloc(4);
  header.writeUInt32LE(payload.length);
  return Buffer.concat([header, payload]);
}

function str(text) {
  const bytes = Buffer.from(text);
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(bytes.length));
  return Buffer.concat([length, bytes]);
}

/** A verdict message: decision and reason as numbers; a flags byte from version 2. */
export function verdictMessage(version, { decision = 0, retryAfterMs = 0, delayMs = 0, reason = 0, rule = "source_failures" } = {}) {
  const fixed = Buffer.alloc(44);
  fixed.writeUInt32LE(0, 0);
  fixed.writeUInt32LE(decision, 4);
  fixed.writeBigUInt64LE(BigInt(retryAfterMs), 8);
  fixed.writeBigUInt64LE(BigInt(delayMs), 16);
  fixed.writeUInt32LE(5, 24);
  fixed.writeUInt32LE(4, 28);
  fixed.writeBigUInt64LE(0n, 32);
  fixed.writeUInt32LE(reason, 40);
  return Buffer.concat([fixed, str(rule), version >= 2 ? Buffer.from([0]) : Buffer.alloc(0)]);
}

export function errorMessage(code, message) {
  const head = Buffer.alloc(8);
  head.writeUInt32LE(5, 0);
  head.writeUInt32LE(code, 4);
  return Buffer.concat([head, str(message)]);
}

/**
 * Starts a fake daemon. `respond({ version, id, tag, payload })` returns
 * the bytes to write back (or null for silence). `requests` records every
 * request; `connections` counts the open ones.
 */
export async function fakeDaemon(respond, { backlog } = {}) {
  const dir = mkdtempSync(join(tmpdir(), "tollgate-fake-"));
  const path = join(dir, "fake.sock");
  const daemon = { path, requests: [], connections: 0, accepted: 0, respond };
  const sockets = new Set();
  daemon.server = net.createServer((socket) => {
    daemon.connections++;
    daemon.accepted++;
    sockets.add(socket);
    socket.on("close", () => {
      daemon.connections--;
      sockets.delete(socket);
    });
    socket.on("error", () => {});
    let buffered = Buffer.alloc(0);
    socket.on("data", (chunk) => {
      buffered = Buffer.concat([buffered, chunk]);
      while (buffered.length >= 4 && buffered.length >= 4 + buffered.readUInt32LE(0)) {
        const payload = buffered.subarray(4, 4 + buffered.readUInt32LE(0));
        buffered = buffered.subarray(4 + payload.length);
        const request = { version: payload[0], id: Number(payload.readBigUInt64LE(1)), tag: payload.readUInt32LE(9), payload, socket };
        daemon.requests.push(request);
        const reply = daemon.respond(request);
        if (reply) socket.write(reply);
      }
    });
  });
  await new Promise((resolve) => daemon.server.listen(backlog ? { path, backlog } : path, resolve));
  daemon.close = () =>
    new Promise((resolve) => {
      for (const s of sockets) s.destroy();
      daemon.server.close(() => {
        rmSync(dir, { recursive: true, force: true });
        resolve();
      });
    });
  return daemon;
}

/** A daemon of version 1 only: newer versions get a version-1 unsupported_version. */
export function versionOneOnly({ version, id, tag }) {
  if (version !== 1) return frame(1, id, errorMessage(1, `protocol version ${version} is not supported`));
  if (tag > 5) return frame(1, id, errorMessage(0, `unknown request tag ${tag} (the known tags are 0 to 5)`));
  return frame(1, id, verdictMessage(1));
}

/** A current daemon that allows everything. */
export function allowAll({ version, id }) {
  return frame(version, id, verdictMessage(version));
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * `allowAll` on a worker thread (test/fake_daemon_thread.mjs): `{ path,
 * hold, release, close }`. `hold()` stops its thread (it neither accepts nor
 * reads: a stalled daemon) until `release()`; `backlog` sizes its accept queue.
 */
export async function fakeDaemonThread({ backlog } = {}) {
  const { Worker } = await import("node:worker_threads");
  const held = new Int32Array(new SharedArrayBuffer(8)); // [0]: hold asked; [1]: holding
  const worker = new Worker(new URL("./fake_daemon_thread.mjs", import.meta.url), { workerData: { backlog, held } });
  const path = await new Promise((resolve, reject) => worker.once("message", resolve).once("error", reject));
  const release = () => {
    Atomics.store(held, 0, 0);
    Atomics.notify(held, 0);
  };
  return {
    path,
    async hold() {
      Atomics.store(held, 0, 1);
      worker.postMessage("hold");
      while (Atomics.load(held, 1) === 0) await sleep(1);
    },
    release,
    close: async () => {
      release();
      await worker.terminate();
      rmSync(dirname(path), { recursive: true, force: true });
    },
  };
}
