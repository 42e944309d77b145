// password_digest and password_tag, byte for byte as the Rust client's
// (PROTOCOL.md, "The password tag"): keyed BLAKE2b-128 under the auth
// server's own 32-byte key.

import { blake2b } from "./blake2b.js";

/** BLAKE2b's personalization for the tag: the same key and password give unrelated digest and tag. */
export const PASSWORD_TAG_PERSONAL = Buffer.from("tollgate-pw-tag", "ascii");

function checkedKey(key) {
  if (!key || key.length !== 32) throw new RangeError("the password key is 32 bytes");
  return key;
}

/** The account's UTF-8 byte count (u64 LE), the account, then the password: 16 bytes. */
export function passwordDigest(key, account, password) {
  const accountBytes = Buffer.from(account, "utf8");
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(accountBytes.length));
  const input = Buffer.concat([length, accountBytes, Buffer.from(password, "utf8")]);
  return Buffer.from(blake2b(input, { key: checkedKey(key), outlen: 16 }));
}

/** The password alone, personalized `tollgate-pw-tag`: 16 bytes. */
export function passwordTag(key, password) {
  const input = Buffer.from(password, "utf8");
  return Buffer.from(blake2b(input, { key: checkedKey(key), outlen: 16, personal: PASSWORD_TAG_PERSONAL }));
}
