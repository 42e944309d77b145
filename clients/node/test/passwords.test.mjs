// password_digest and password_tag against tests/vectors/passwords.json,
// and the BLAKE2b under them against RFC 7693 and Node's unkeyed BLAKE2b-512.

import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { blake2b, passwordDigest, passwordTag } from "../index.js";

const { vectors } = JSON.parse(readFileSync(new URL("../../../tests/vectors/passwords.json", import.meta.url)));
const hex = (bytes) => Buffer.from(bytes).toString("hex");

test("every password vector: digest and tag", () => {
  assert.ok(vectors.length >= 5);
  for (const v of vectors) {
    const key = Buffer.from(v.key, "hex");
    assert.equal(hex(passwordDigest(key, v.account, v.password)), v.digest, JSON.stringify(v));
    assert.equal(hex(passwordTag(key, v.password)), v.tag, JSON.stringify(v));
  }
});

test("RFC 7693 appendix A: BLAKE2b-512 of \"abc\"", () => {
  assert.equal(
    hex(blake2b(Buffer.from("abc"))),
    "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d1" +
      "7d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923",
  );
});

test("unkeyed BLAKE2b-512 matches Node's at every block edge", () => {
  for (const n of [0, 1, 111, 127, 128, 129, 255, 256, 257, 1000]) {
    const data = randomBytes(n);
    assert.equal(hex(blake2b(data)), createHash("blake2b512").update(data).digest("hex"), `${n} bytes`);
  }
});

test("the tag is not the digest, and the key matters", () => {
  const key = Buffer.alloc(32, 7);
  const tag = passwordTag(key, "hunter2");
  assert.notEqual(hex(tag), hex(passwordDigest(key, "", "hunter2")));
  assert.notEqual(hex(tag), hex(passwordTag(Buffer.alloc(32, 8), "hunter2")));
  assert.throws(() => passwordTag(Buffer.alloc(31), "x"), RangeError);
});
