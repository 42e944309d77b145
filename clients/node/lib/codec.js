// The wire format of PROTOCOL.md: frames, the envelope, and the messages
// the auth-server path sends (Check, Report, Abandon) and reads (Verdict,
// Error), in every version 1 to 5. Pure: no I/O.

import { isIPv4, isIPv6 } from "node:net";

export const PROTOCOL_VERSION = 5;
export const PROTOCOL_VERSION_MIN = 1;
/** The first version whose Check and Report carry a password tag. */
export const TAG_VERSION = 3;
export const FRAME_HEADER_BYTES = 4;
export const ENVELOPE_BYTES = 9;
export const RESPONSE_PAYLOAD_BYTES_MAX = 8 * 1024 * 1024;
/** The daemon refuses a larger request payload (`frame_too_large`) and closes the connection. */
export const REQUEST_PAYLOAD_BYTES_MAX = 16 * 1024;
/** The longest account, device, tenant or client id (UTF-8 bytes) the daemon accepts. */
export const IDENTIFIER_BYTES_MAX = 512;

export const DECISIONS = ["allow", "delay", "challenge", "deny"];
export const REASONS = [
  "allowed", "rate_limited", "too_many_failures", "monitor_rate_limited", "monitor_too_many_failures",
  "spray_suspected", "distributed_attack", "tenant_anomaly", "monitor_signal", "attempts_in_flight",
];
export const ERROR_CODES = [
  "malformed", "unsupported_version", "unknown_route", "missing_field", "field_too_long",
  "permission_denied", "not_manual_clock", "frame_too_large", "internal",
];
export const OUTCOMES = ["success", "failure"];

const REQUEST_CHECK = 0;
const REQUEST_REPORT = 1;
const REQUEST_ABANDON = 8;
const RESPONSE_VERDICT = 0;
const RESPONSE_ERROR = 5;
const FLAG_DEGRADED = 1;

/** A reply that does not decode: the connection is broken. */
export class DecodeError extends Error {}

/** Appends little-endian values to one growing buffer (a check is ~60 bytes). */
class Writer {
  constructor() {
    this.buf = Buffer.allocUnsafe(256);
    this.at = 0;
  }
  room(n) {
    if (this.at + n <= this.buf.length) return;
    const bigger = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.at + n));
    this.buf.copy(bigger, 0, 0, this.at);
    this.buf = bigger;
  }
  u8(value) {
    this.room(1);
    this.buf[this.at++] = value;
  }
  u32(value) {
    this.room(4);
    this.at = this.buf.writeUInt32LE(value, this.at);
  }
  u64(value) {
    this.room(8);
    this.at = this.buf.writeBigUInt64LE(BigInt(value), this.at);
  }
  bytes(value) {
    this.room(value.length);
    this.buf.set(value, this.at);
    this.at += value.length;
  }
  str(value) {
    const length = Buffer.byteLength(value, "utf8");
    this.u64(length);
    this.room(length);
    this.at += this.buf.write(value, this.at, "utf8");
  }
  optionStr(value) {
    if (value === undefined || value === null) return this.u8(0);
    this.u8(1);
    this.str(value);
  }
  optionBytes16(value) {
    if (value === undefined || value === null) return this.u8(0);
    if (value.length !== 16) throw new RangeError("a password digest or tag is 16 bytes");
    this.u8(1);
    this.bytes(value);
  }
}

/** The 4 or 16 octets of an IP address in text form; throws on anything else. */
export function ipOctets(text) {
  if (isIPv4(text)) return { variant: 0, octets: Buffer.from(text.split(".").map(Number)) };
  if (!isIPv6(text) || text.includes("%")) throw new TypeError(`not an IP address: ${JSON.stringify(text)}`);
  // An embedded IPv4 tail (::ffff:192.0.2.1) stands for the last two groups.
  let groups = text;
  const lastColon = groups.lastIndexOf(":");
  if (groups.includes(".", lastColon)) {
    const [a, b, c, d] = groups.slice(lastColon + 1).split(".").map(Number);
    groups = `${groups.slice(0, lastColon + 1)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head, rest] = groups.includes("::") ? groups.split("::") : [groups, null];
  const headGroups = head ? head.split(":") : [];
  const restGroups = rest ? rest.split(":") : [];
  const filler = rest === null ? 0 : 8 - headGroups.length - restGroups.length;
  const all = [...headGroups, ...Array(filler).fill("0"), ...restGroups];
  const octets = Buffer.alloc(16);
  all.forEach((group, i) => octets.writeUInt16BE(parseInt(group, 16), i * 2));
  return { variant: 1, octets };
}

function writeSubject(w, subject = {}) {
  if (subject.peer === undefined || subject.peer === null) {
    w.u8(0);
  } else {
    const { variant, octets } = ipOctets(subject.peer);
    w.u8(1);
    w.u32(variant);
    w.bytes(octets);
  }
  w.optionStr(subject.forwardedFor);
  w.optionStr(subject.account);
  w.optionStr(subject.device);
  w.optionStr(subject.tenant);
  w.optionStr(subject.clientId);
}

/**
 * One request frame, length prefix included. `request` is
 * `{ type: "check" | "report" | "abandon", route, subject, outcome,
 * passwordDigest, passwordTag }`. The tag goes out in version 3 and later
 * only; an abandon is written in any version (a daemon refuses it below 5).
 */
export function encodeRequest(version, id, request) {
  const w = new Writer();
  w.u32(0); // the length, filled in below
  w.u8(version);
  w.u64(id);
  switch (request.type) {
    case "check":
      w.u32(REQUEST_CHECK);
      w.str(request.route);
      writeSubject(w, request.subject);
      if (version >= TAG_VERSION) w.optionBytes16(request.passwordTag);
      break;
    case "report": {
      const outcome = OUTCOMES.indexOf(request.outcome);
      if (outcome < 0) throw new TypeError(`outcome is "success" or "failure", not ${JSON.stringify(request.outcome)}`);
      w.u32(REQUEST_REPORT);
      w.str(request.route);
      writeSubject(w, request.subject);
      w.u32(outcome);
      w.optionBytes16(request.passwordDigest);
      if (version >= TAG_VERSION) w.optionBytes16(request.passwordTag);
      break;
    }
    case "abandon":
      w.u32(REQUEST_ABANDON);
      w.str(request.route);
      writeSubject(w, request.subject);
      break;
    default:
      throw new TypeError(`no such request: ${request.type}`);
  }
  w.buf.writeUInt32LE(w.at - FRAME_HEADER_BYTES, 0);
  return Buffer.from(w.buf.subarray(0, w.at));
}

/** The subject's strings, by the names PROTOCOL.md gives them; the last four are identifiers. */
const SUBJECT_STRINGS = [
  ["forwardedFor", "forwarded_for"], ["account", "account"], ["device", "device"],
  ["tenant", "tenant"], ["clientId", "client_id"],
];
const IDENTIFIERS = SUBJECT_STRINGS.slice(1);
/** With the u flag a pair is one code point: this matches only an unpaired surrogate. */
const LONE_SURROGATE = /\p{Cs}/u;

/**
 * Why a request (as for `encodeRequest`) must not be sent, as the daemon's
 * error `{ code, message }` would say it, or null. `payloadBytes` is its
 * encoded payload's size. A string that is not well-formed UTF-16 would go
 * out as U+FFFD, sharing its counters with other strings (`malformed`); an
 * identifier over 512 bytes (`field_too_long`) or a payload over 16 KiB
 * (`frame_too_large`) the daemon refuses, the latter closing the connection
 * while the client still writes, which would look like an outage.
 */
export function refusalBeforeSending(request, payloadBytes) {
  const subject = request.subject ?? {};
  const strings = [["route", request.route], ...SUBJECT_STRINGS.map(([key, name]) => [`subject.${name}`, subject[key]])];
  for (const [name, value] of strings) {
    if (typeof value === "string" && LONE_SURROGATE.test(value)) {
      return { code: "malformed", message: `field \`${name}\` has an unpaired surrogate: not valid UTF-16 text (refused before sending)` };
    }
  }
  for (const [key, name] of IDENTIFIERS) {
    const value = subject[key];
    const bytes = typeof value === "string" ? Buffer.byteLength(value, "utf8") : 0;
    if (bytes > IDENTIFIER_BYTES_MAX) {
      return {
        code: "field_too_long",
        message: `field \`subject.${name}\` is ${bytes} bytes; the maximum is ${IDENTIFIER_BYTES_MAX} (refused before sending)`,
      };
    }
  }
  if (payloadBytes > REQUEST_PAYLOAD_BYTES_MAX) {
    return {
      code: "frame_too_large",
      message: `the request is ${payloadBytes} bytes; the maximum is ${REQUEST_PAYLOAD_BYTES_MAX} (refused before sending)`,
    };
  }
  return null;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** Reads a payload front to back; every read throws DecodeError past the end. */
class Reader {
  constructor(bytes) {
    this.bytes = bytes;
    this.at = 0;
  }
  take(n, what) {
    if (this.bytes.length - this.at < n) throw new DecodeError(`reply ends inside ${what}`);
    const out = this.bytes.subarray(this.at, this.at + n);
    this.at += n;
    return out;
  }
  u8(what) {
    return this.take(1, what)[0];
  }
  u32(what) {
    return this.take(4, what).readUInt32LE(0);
  }
  u64(what) {
    const value = this.take(8, what).readBigUInt64LE(0);
    // Times and ids in ms fit a double exactly far beyond any real value.
    return value <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(value) : value;
  }
  enumValue(names, what) {
    const value = this.u32(what);
    if (value >= names.length) throw new DecodeError(`unknown ${what} ${value}`);
    return names[value];
  }
  str(what) {
    const len = this.take(8, `the length of ${what}`).readBigUInt64LE(0);
    if (len > BigInt(this.bytes.length - this.at)) throw new DecodeError(`${what} claims ${len} bytes, more than are left`);
    try {
      return utf8.decode(this.take(Number(len), what));
    } catch {
      throw new DecodeError(`${what} is not valid UTF-8`);
    }
  }
  end() {
    const left = this.bytes.length - this.at;
    if (left !== 0) throw new DecodeError(`${left} byte(s) left over after the reply`);
  }
}

/**
 * Decodes one reply payload (without its length prefix) into
 * `{ version, id, kind: "verdict", verdict, degraded }` or
 * `{ version, id, kind: "error", code, message }`. Anything else, or a byte
 * too many or too few, throws DecodeError.
 */
export function decodeResponse(payload) {
  const bytes = Buffer.isBuffer(payload) ? payload : Buffer.from(payload);
  if (bytes.length < ENVELOPE_BYTES) throw new DecodeError(`reply of ${bytes.length} bytes is shorter than the envelope`);
  const r = new Reader(bytes);
  const version = r.u8("the version");
  if (version < PROTOCOL_VERSION_MIN || version > PROTOCOL_VERSION) {
    throw new DecodeError(`reply in protocol version ${version}, which this client does not speak`);
  }
  const id = r.u64("the id");
  const variant = r.u32("the response variant");
  if (variant === RESPONSE_VERDICT) {
    const verdict = {
      decision: r.enumValue(DECISIONS, "decision"),
      retryAfterMs: r.u64("retry_after_ms"),
      delayMs: r.u64("delay_ms"),
      limit: r.u32("limit"),
      remaining: r.u32("remaining"),
      resetMs: r.u64("reset_ms"),
      reason: r.enumValue(REASONS, "reason"),
      rule: r.str("rule"),
    };
    // Bits 1 to 7 are reserved: ignored, never refused.
    const flags = version >= 2 ? r.u8("flags") : 0;
    r.end();
    return { version, id, kind: "verdict", verdict, degraded: (flags & FLAG_DEGRADED) !== 0 };
  }
  if (variant === RESPONSE_ERROR) {
    // Every version's Error is version 1's message, with no extras.
    const code = r.enumValue(ERROR_CODES, "error code");
    const message = r.str("message");
    r.end();
    return { version, id, kind: "error", code, message };
  }
  throw new DecodeError(`unexpected reply (response variant ${variant}) to a check, report or abandon`);
}
