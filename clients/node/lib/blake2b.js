// BLAKE2b (RFC 7693) with key, salt and personalization. Our own because
// Node's crypto offers BLAKE2b only unkeyed and without personalization,
// and the password digest and tag need both (PROTOCOL.md, "The password
// tag"). BigInt keeps it short and obviously right; a 16-byte digest of a
// short password still takes well under a millisecond.

const MASK = (1n << 64n) - 1n;

const IV = [
  0x6a09e667f3bcc908n, 0xbb67ae8584caa73bn, 0x3c6ef372fe94f82bn, 0xa54ff53a5f1d36f1n,
  0x510e527fade682d1n, 0x9b05688c2b3e6c1fn, 0x1f83d9abfb41bd6bn, 0x5be0cd19137e2179n,
];

const SIGMA = [
  [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
  [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
  [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
  [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
  [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
  [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
  [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
  [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
  [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
  [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0],
];

const BLOCK_BYTES = 128;

function rotr(x, n) {
  return ((x >> n) | (x << (64n - n))) & MASK;
}

function word(bytes, offset) {
  const view = new DataView(bytes.buffer, bytes.byteOffset + offset, 8);
  return view.getBigUint64(0, true);
}

/** Mixes one 128-byte block into the state `h` (RFC 7693 section 3.2). */
function compress(h, block, bytesSoFar, last) {
  const m = new Array(16);
  for (let i = 0; i < 16; i++) m[i] = word(block, i * 8);
  const v = h.concat(IV);
  v[12] ^= bytesSoFar & MASK;
  v[13] ^= bytesSoFar >> 64n;
  if (last) v[14] ^= MASK;
  const g = (a, b, c, d, x, y) => {
    v[a] = (v[a] + v[b] + x) & MASK;
    v[d] = rotr(v[d] ^ v[a], 32n);
    v[c] = (v[c] + v[d]) & MASK;
    v[b] = rotr(v[b] ^ v[c], 24n);
    v[a] = (v[a] + v[b] + y) & MASK;
    v[d] = rotr(v[d] ^ v[a], 16n);
    v[c] = (v[c] + v[d]) & MASK;
    v[b] = rotr(v[b] ^ v[c], 63n);
  };
  for (let round = 0; round < 12; round++) {
    const s = SIGMA[round % 10];
    g(0, 4, 8, 12, m[s[0]], m[s[1]]);
    g(1, 5, 9, 13, m[s[2]], m[s[3]]);
    g(2, 6, 10, 14, m[s[4]], m[s[5]]);
    g(3, 7, 11, 15, m[s[6]], m[s[7]]);
    g(0, 5, 10, 15, m[s[8]], m[s[9]]);
    g(1, 6, 11, 12, m[s[10]], m[s[11]]);
    g(2, 7, 8, 13, m[s[12]], m[s[13]]);
    g(3, 4, 9, 14, m[s[14]], m[s[15]]);
  }
  for (let i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
}

function sixteenBytes(value, what) {
  const out = new Uint8Array(16);
  if (value === undefined || value === null) return out;
  if (value.length > 16) throw new RangeError(`BLAKE2b ${what} is at most 16 bytes`);
  out.set(value);
  return out;
}

/**
 * BLAKE2b of `input` (a Uint8Array): `outlen` 1..64 bytes, optional `key`
 * (at most 64 bytes), `salt` and `personal` (at most 16 bytes each,
 * zero-padded).
 */
export function blake2b(input, { outlen = 64, key, salt, personal } = {}) {
  const keyBytes = key ? Uint8Array.from(key) : new Uint8Array(0);
  if (!(outlen >= 1 && outlen <= 64)) throw new RangeError("BLAKE2b outlen is 1 to 64 bytes");
  if (keyBytes.length > 64) throw new RangeError("BLAKE2b key is at most 64 bytes");
  const saltBytes = sixteenBytes(salt, "salt");
  const personalBytes = sixteenBytes(personal, "personalization");
  const h = IV.slice();
  h[0] ^= 0x01010000n ^ (BigInt(keyBytes.length) << 8n) ^ BigInt(outlen);
  h[4] ^= word(saltBytes, 0);
  h[5] ^= word(saltBytes, 8);
  h[6] ^= word(personalBytes, 0);
  h[7] ^= word(personalBytes, 8);

  // A keyed hash hashes the key, zero-padded to a block, before the input.
  let data = Uint8Array.from(input);
  if (keyBytes.length > 0) {
    const keyed = new Uint8Array(BLOCK_BYTES + data.length);
    keyed.set(keyBytes);
    keyed.set(data, BLOCK_BYTES);
    data = keyed;
  }
  const blocks = Math.max(1, Math.ceil(data.length / BLOCK_BYTES));
  for (let i = 0; i < blocks; i++) {
    const block = new Uint8Array(BLOCK_BYTES);
    const chunk = data.subarray(i * BLOCK_BYTES, (i + 1) * BLOCK_BYTES);
    block.set(chunk);
    const last = i === blocks - 1;
    const counted = last ? data.length : (i + 1) * BLOCK_BYTES;
    compress(h, block, BigInt(counted), last);
  }
  const out = new Uint8Array(64);
  const view = new DataView(out.buffer);
  for (let i = 0; i < 8; i++) view.setBigUint64(i * 8, h[i], true);
  return out.slice(0, outlen);
}
