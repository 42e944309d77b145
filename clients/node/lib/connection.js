// One Unix-socket connection to the daemon: writes request frames and reads
// reply frames, one call at a time (the pool never shares a connection
// between calls). Any failure or a timeout ends it for good.

import net from "node:net";
import { FRAME_HEADER_BYTES, RESPONSE_PAYLOAD_BYTES_MAX } from "./codec.js";

/** Why a call failed: `kind` is connect, timeout, busy, io or protocol. */
export class ClientError extends Error {
  constructor(kind, message, { closed = false } = {}) {
    super(message);
    this.name = "ClientError";
    this.kind = kind;
    /** The daemon closed the connection (EOF, reset, broken pipe): a pooled one may be retried. */
    this.closed = closed;
  }
}

/**
 * The only errors connecting that mean tollgate cannot be reached: no socket,
 * nobody listening, not allowed. Any other (a full accept queue, EAGAIN; or
 * this process out of descriptors or memory, EMFILE, ENFILE, ENOBUFS, ENOMEM,
 * which an attacker can cause) is a late daemon: taken for `connect`, it would
 * let login fail open past the busy rule.
 */
const CONNECT_CODES = new Set(["ENOENT", "ECONNREFUSED", "EACCES"]);
const QUEUE_FULL_CODES = new Set(["EAGAIN", "EWOULDBLOCK"]);
const CLOSED_CODES = new Set(["EPIPE", "ECONNRESET", "ERR_STREAM_DESTROYED", "ERR_STREAM_WRITE_AFTER_END"]);

export class Connection {
  /** Starts connecting to `path`; `ready` settles when connected. */
  constructor(path, version) {
    this.version = version;
    this.dead = false;
    this.failure = null;
    this.buffer = Buffer.alloc(0);
    this.waiter = null;
    this.connected = false;
    this.socket = net.createConnection({ path });
    this.ready = new Promise((resolve, reject) => {
      this.socket.once("connect", () => {
        this.connected = true;
        resolve();
      });
      this.onConnectFailure = reject;
    });
    // Nobody may be awaiting `ready` when a dying connection rejects it.
    this.ready.catch(() => {});
    this.socket.on("data", (chunk) => this.#received(chunk));
    this.socket.on("end", () => this.#fail(new ClientError("io", "the daemon closed the connection", { closed: true })));
    this.socket.on("error", (e) => {
      if (!this.connected && CONNECT_CODES.has(e.code)) {
        this.#fail(new ClientError("connect", `cannot reach tollgate at ${path}: ${e.message}`));
      } else if (!this.connected) {
        // A full accept queue (each timed-out client's connection waits in
        // it) or no descriptor or memory for the socket: late, not gone.
        const why = QUEUE_FULL_CODES.has(e.code) ? "did not accept the connection (its queue is full)" : "could not be connected to";
        this.#fail(new ClientError("timeout", `tollgate ${why}: ${e.message}`));
      } else {
        this.#fail(new ClientError("io", `connection to tollgate failed: ${e.message}`, { closed: CLOSED_CODES.has(e.code) }));
      }
    });
    this.socket.on("close", () => this.#fail(new ClientError("io", "the connection closed", { closed: true })));
  }

  #fail(error) {
    if (this.dead) return;
    this.dead = true;
    this.failure = error;
    this.socket.destroy();
    this.onConnectFailure(error);
    const waiter = this.waiter;
    this.waiter = null;
    waiter?.reject(error);
  }

  /** Ends the connection; a call waiting on it fails with `error`. */
  destroy(error = new ClientError("io", "connection closed by the client")) {
    this.#fail(error);
  }

  #received(chunk) {
    this.buffer = this.buffer.length === 0 ? chunk : Buffer.concat([this.buffer, chunk]);
    this.#deliver();
  }

  /** Hands a complete frame to the waiting call; bytes past it wait for the next read. */
  #deliver() {
    if (!this.waiter || this.buffer.length < FRAME_HEADER_BYTES) return;
    const length = this.buffer.readUInt32LE(0);
    if (length > RESPONSE_PAYLOAD_BYTES_MAX) {
      this.#fail(new ClientError("protocol", `reply of ${length} bytes is over the maximum`));
      return;
    }
    if (this.buffer.length < FRAME_HEADER_BYTES + length) return;
    const payload = this.buffer.subarray(FRAME_HEADER_BYTES, FRAME_HEADER_BYTES + length);
    this.buffer = this.buffer.subarray(FRAME_HEADER_BYTES + length);
    const waiter = this.waiter;
    this.waiter = null;
    waiter.resolve(payload);
  }

  /** Writes one frame and resolves with the next reply payload. */
  async exchange(frame) {
    await this.ready;
    if (this.dead) throw this.failure;
    const reply = new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
    this.socket.write(frame);
    this.#deliver();
    return reply;
  }
}
