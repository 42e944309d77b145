// One Unix-socket connection to the daemon: writes request frames and reads
// reply frames, one call at a time (the pool never shares a connection
// between calls). Any failure or a timeout ends it for good; after a
// timeout its socket may still listen a while for the late reply (LateListeners).

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
  /** The socket's event handlers of this connection, by event. */
  #handlers;
  /** Counts the frames written, so that a write's completion is only taken for the frame it wrote. */
  #writes = 0;

  /** Starts connecting to `path`; `ready` settles when connected. */
  constructor(path, version) {
    this.version = version;
    this.dead = false;
    this.failure = null;
    this.buffer = Buffer.alloc(0);
    this.waiter = null;
    this.connected = false;
    /** Whether the kernel has taken the whole of the last request frame: only then can the daemon answer it. */
    this.requestWritten = false;
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
    // Kept by name so that handOver can take them off the socket.
    this.#handlers = {
      data: (chunk) => this.#received(chunk),
      end: () => this.#fail(new ClientError("io", "the daemon closed the connection", { closed: true })),
      error: (e) => {
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
      },
      close: () => this.#fail(new ClientError("io", "the connection closed", { closed: true })),
    };
    for (const [event, handler] of Object.entries(this.#handlers)) this.socket.on(event, handler);
  }

  #fail(error, { keepSocket = false } = {}) {
    if (this.dead) return;
    this.dead = true;
    this.failure = error;
    if (!keepSocket) this.socket.destroy();
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
    // A frame still partly in this process's buffer when the deadline passes
    // cannot have been answered: the write's completion says it all went out.
    const write = ++this.#writes;
    this.requestWritten = false;
    this.socket.write(frame, (error) => {
      if (!error && write === this.#writes) this.requestWritten = true;
    });
    this.#deliver();
    return reply;
  }

  /**
   * Gives up the socket, still open, so that a late reply can be heard on
   * it: the call waiting here fails with `error`, and this connection is
   * dead to its own reader (its state is unknown; it is never reused). Only
   * a request completely written can be answered, so when it was not, or
   * the socket is not connected or already ended, this returns null and
   * keeps the socket (the caller then destroys the connection). Bytes of
   * a reply already read stay behind: its rest is still to come on the socket.
   */
  handOver(error) {
    if (this.dead || !this.connected || !this.requestWritten) return null;
    const socket = this.socket;
    for (const [event, handler] of Object.entries(this.#handlers)) socket.off(event, handler);
    this.buffer = Buffer.alloc(0);
    this.#fail(error, { keepSocket: true });
    return socket;
  }
}

/**
 * Timed-out connections of one client kept listening for their late reply
 * at once. Beyond this they close at once: an attacker who makes every call
 * late must not run the auth server out of descriptors.
 */
export const LATE_LISTENERS_MAX = 16;

/**
 * The timed-out connections of one client that still listen for a late
 * reply. The daemon is the only writer on its socket, so any byte that
 * comes is its answer: proof that it is alive and answering, only late (a
 * loaded host), and not down. No byte is parsed. Each listens for at most
 * the time it is given, then closes; none keeps the process alive, and the
 * call that timed out has already returned.
 */
export class LateListeners {
  /** Each listening socket and what stops its listening. */
  #listening = new Map();

  /**
   * Takes `conn`'s socket over (its call fails with `error`) and runs
   * `heard()` if a byte of the reply comes within `ms`; the socket then
   * closes. Returns false, and leaves `conn` to its caller, when all
   * LATE_LISTENERS_MAX places are taken or `conn` has no completely
   * written request that could be answered.
   */
  listen(conn, error, ms, heard) {
    if (this.#listening.size >= LATE_LISTENERS_MAX) return false;
    const socket = conn.handOver(error);
    if (!socket) return false;
    let timer = null;
    const stop = () => {
      if (!this.#listening.delete(socket)) return;
      clearTimeout(timer);
      socket.destroy();
    };
    this.#listening.set(socket, stop);
    // Any error or end: nothing more can be heard.
    socket.on("error", stop);
    socket.on("end", stop);
    socket.on("close", stop);
    socket.on("data", () => {
      if (this.#listening.has(socket)) heard();
      stop();
    });
    timer = setTimeout(stop, ms);
    // Waiting for a late byte is no reason for the process to stay up.
    timer.unref();
    socket.unref();
    return true;
  }

  /** Closes every connection still listening. */
  closeAll() {
    for (const stop of [...this.#listening.values()]) stop();
  }
}
