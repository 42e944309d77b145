// Every request vector of tests/vectors/protocol.json this client can send
// (Check, Report, Abandon), encoded and compared with its frame; every
// Verdict and Error vector decoded and compared with its fields.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { decodeResponse, encodeRequest, DecodeError, DECISIONS, REASONS, ERROR_CODES, PROTOCOL_VERSION } from "../index.js";

const { vectors } = JSON.parse(readFileSync(new URL("../../../tests/vectors/protocol.json", import.meta.url)));

/** `<type> <field> = <value> (note)` as { type, field, value } with the value parsed. */
function parseMeaning(meaning) {
  const m = /^(\w+) (.+?) = (.*)$/s.exec(meaning);
  assert.ok(m, `unparsed meaning: ${meaning}`);
  const [, type, field, rest] = m;
  let value;
  if (type === "utf8") value = JSON.parse(/^"(?:[^"\\]|\\.)*"/.exec(rest)[0]);
  else if (type === "bool") value = rest.startsWith("true");
  else value = rest.split(" ")[0];
  if (["u8", "u32", "u64", "i64"].includes(type)) value = Number(value);
  return { type, field, value };
}

const REQUEST_TYPES = { 0: "check", 1: "report", 8: "abandon" };

/** The request a vector's fields describe, or null for one this client never sends. */
function requestOf(vector) {
  const request = { subject: {} };
  const subjectNames = { forwarded_for: "forwardedFor", client_id: "clientId" };
  for (const { meaning } of vector.fields) {
    const { type, field, value } = parseMeaning(meaning);
    if (field === "Request variant") {
      request.type = REQUEST_TYPES[value];
      if (!request.type) return null;
    } else if (field === "route") request.route = value;
    else if (field === "outcome") request.outcome = value === 0 ? "success" : "failure";
    else if (field === "password_digest" && type === "bytes") request.passwordDigest = Buffer.from(value, "hex");
    else if (field === "password_tag" && type === "bytes") request.passwordTag = Buffer.from(value, "hex");
    else if (field.startsWith("subject.") && ["utf8", "ipv4", "ipv6"].includes(type)) {
      const name = field.slice("subject.".length);
      request.subject[subjectNames[name] ?? name] = value;
    }
  }
  return request;
}

const sendable = vectors.filter((v) => v.kind === "request" && requestOf(v));
// A reply in a version newer than this client's (the daemon's admin
// requests) is one it never asks for: it must refuse such a frame.
const spoken = (v) => (v.version ?? 1) <= PROTOCOL_VERSION;
const readable = vectors.filter((v) => v.kind === "response" && spoken(v) && [0, 5].includes(responseVariant(v)));
const newer = vectors.filter((v) => v.kind === "response" && !spoken(v));

function responseVariant(vector) {
  const field = vector.fields.map((f) => parseMeaning(f.meaning)).find((f) => f.field === "Response variant");
  return field.value;
}

test("the vectors include every request and reply this client handles, in every version", () => {
  assert.ok(sendable.length >= 10, `only ${sendable.length} request vectors`);
  const versions = new Set(sendable.map((v) => v.version ?? 1));
  assert.deepEqual([...versions].sort(), [1, 2, 3, 4, 5]);
  assert.ok(sendable.some((v) => requestOf(v).type === "abandon"));
  assert.ok(sendable.some((v) => requestOf(v).passwordTag));
  assert.deepEqual([...new Set(readable.map((v) => v.version ?? 1))].sort(), [1, 2, 3, 4, 5]);
});

for (const vector of sendable) {
  test(`encodes ${vector.name}`, () => {
    const frame = encodeRequest(vector.version ?? 1, vector.id, requestOf(vector));
    assert.equal(frame.toString("hex"), vector.frame);
  });
}

for (const vector of newer) {
  test(`refuses ${vector.name}, a version ${vector.version} reply`, () => {
    assert.throws(() => decodeResponse(Buffer.from(vector.frame, "hex").subarray(4)), DecodeError);
  });
}

for (const vector of readable) {
  test(`decodes ${vector.name}`, () => {
    const frame = Buffer.from(vector.frame, "hex");
    assert.equal(frame.readUInt32LE(0), frame.length - 4);
    const reply = decodeResponse(frame.subarray(4));
    for (const { meaning } of vector.fields) {
      const { field, value } = parseMeaning(meaning);
      const v = reply.verdict;
      const expected = {
        version: () => assert.equal(reply.version, value),
        "request id": () => assert.equal(reply.id, value),
        "Response variant": () => assert.equal(reply.kind, value === 0 ? "verdict" : "error"),
        decision: () => assert.equal(v.decision, DECISIONS[value]),
        retry_after_ms: () => assert.equal(v.retryAfterMs, value),
        delay_ms: () => assert.equal(v.delayMs, value),
        limit: () => assert.equal(v.limit, value),
        remaining: () => assert.equal(v.remaining, value),
        reset_ms: () => assert.equal(v.resetMs, value),
        reason: () => assert.equal(v.reason, REASONS[value]),
        rule: () => assert.equal(v.rule, value),
        flags: () => assert.equal(reply.degraded, (value & 1) === 1),
        code: () => assert.equal(reply.code, ERROR_CODES[value]),
        message: () => assert.equal(reply.message, value),
      }[field];
      if (expected) expected();
      else assert.match(field, /length$/, `field ${field} not compared`);
    }
    if ((vector.version ?? 1) === 1 && reply.kind === "verdict") assert.equal(reply.degraded, false);
  });
}

test("a reply with a byte too many or too few is refused", () => {
  for (const vector of readable) {
    const payload = Buffer.from(vector.frame, "hex").subarray(4);
    assert.throws(() => decodeResponse(Buffer.concat([payload, Buffer.from([0])])), DecodeError, vector.name);
    assert.throws(() => decodeResponse(payload.subarray(0, payload.length - 1)), DecodeError, vector.name);
  }
});

test("a verdict's reserved flag bits are ignored, not refused", () => {
  const vector = vectors.find((v) => v.name === "verdict-deny-degraded-v5");
  const payload = Buffer.from(vector.frame, "hex").subarray(4);
  payload[payload.length - 1] = 0xfe;
  assert.equal(decodeResponse(payload).degraded, false);
  payload[payload.length - 1] = 0xff;
  assert.equal(decodeResponse(payload).degraded, true);
});

test("unknown enum values, bad UTF-8, unknown versions and other replies are refused", () => {
  const allow = Buffer.from(vectors.find((v) => v.name === "verdict-allow").frame, "hex").subarray(4);
  const bad = (mutate) => {
    const copy = Buffer.from(allow);
    mutate(copy);
    assert.throws(() => decodeResponse(copy), DecodeError);
  };
  bad((p) => p.writeUInt32LE(4, 13)); // decision 4
  bad((p) => p.writeUInt32LE(10, 49)); // reason 10
  bad((p) => (p[p.length - 1] = 0xff)); // the rule's last byte
  bad((p) => (p[0] = 6));
  bad((p) => (p[0] = 0));
  bad((p) => p.writeUInt32LE(9, 9)); // no response 9
  for (const name of ["status-small", "unlocked-2", "lockouts-one", "clock-advanced", "activity-v4", "samples-v4"]) {
    const payload = Buffer.from(vectors.find((v) => v.name === name).frame, "hex").subarray(4);
    assert.throws(() => decodeResponse(payload), DecodeError, name);
  }
  assert.throws(() => decodeResponse(Buffer.alloc(5)), DecodeError);
});

test("a tag is dropped below version 3; an abandon is written in any version", () => {
  const request = { type: "check", route: "login", subject: { account: "a" }, passwordTag: Buffer.alloc(16, 1) };
  const v2 = encodeRequest(2, 1, request);
  const v3 = encodeRequest(3, 1, request);
  assert.equal(v3.length - v2.length, 17);
  const abandon = encodeRequest(4, 13, { type: "abandon", route: "login", subject: { peer: "198.51.100.7", account: "alice" } });
  const v5 = vectors.find((v) => v.name === "abandon-login-v5").frame;
  assert.equal(abandon.toString("hex"), v5.slice(0, 8) + "04" + v5.slice(10));
});
