package dev.tollgate.client;

import java.util.Arrays;

/**
 * BLAKE2b (RFC 7693) with a key and a personalization. Our own code because
 * the JDK has no BLAKE2b at all (MessageDigest offers neither it nor its
 * keyed mode), and the password digest and tag are keyed BLAKE2b-128,
 * one of them personalized.
 */
public final class Blake2b {
    private static final int BLOCK_BYTES = 128;

    private static final long[] IV = {
        0x6a09e667f3bcc908L, 0xbb67ae8584caa73bL, 0x3c6ef372fe94f82bL, 0xa54ff53a5f1d36f1L,
        0x510e527fade682d1L, 0x9b05688c2b3e6c1fL, 0x1f83d9abfb41bd6bL, 0x5be0cd19137e2179L,
    };

    private static final byte[][] SIGMA = {
        {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
        {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
        {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
        {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
        {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
        {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
        {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
        {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
        {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
        {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    };

    private final long[] h = new long[8];
    private final long[] v = new long[16];
    private final long[] m = new long[16];
    private final byte[] buffer = new byte[BLOCK_BYTES];
    private int buffered;
    /** Bytes compressed so far (the 128-bit counter's low half; inputs here never need the high one). */
    private long counter;
    private final int digestBytes;
    private boolean finished;

    /**
     * @param digestBytes 1 to 64
     * @param key 0 to 64 bytes (none: unkeyed)
     * @param personal at most 16 bytes, zero-padded (null: none)
     */
    public Blake2b(int digestBytes, byte[] key, byte[] personal) {
        if (digestBytes < 1 || digestBytes > 64) throw new IllegalArgumentException("digest length 1 to 64");
        byte[] k = key == null ? new byte[0] : key;
        if (k.length > 64) throw new IllegalArgumentException("key of at most 64 bytes");
        if (personal != null && personal.length > 16) throw new IllegalArgumentException("personalization of at most 16 bytes");
        this.digestBytes = digestBytes;
        System.arraycopy(IV, 0, h, 0, 8);
        // Parameter block: digest length, key length, fanout 1, depth 1; salt zero.
        h[0] ^= 0x01010000L ^ ((long) k.length << 8) ^ digestBytes;
        if (personal != null) {
            byte[] padded = Arrays.copyOf(personal, 16);
            h[6] ^= littleEndian(padded, 0);
            h[7] ^= littleEndian(padded, 8);
        }
        if (k.length > 0) {
            // The key, zero-padded to a whole block, is the first block.
            System.arraycopy(k, 0, buffer, 0, k.length);
            buffered = BLOCK_BYTES;
        }
    }

    public Blake2b update(byte[] data) {
        return update(data, 0, data.length);
    }

    public Blake2b update(byte[] data, int offset, int length) {
        if (finished) throw new IllegalStateException("already finished");
        while (length > 0) {
            // The last block is compressed in digest(), flagged final: a
            // full buffer waits until more input proves it is not the last.
            if (buffered == BLOCK_BYTES) {
                counter += BLOCK_BYTES;
                compress(buffer, false);
                buffered = 0;
            }
            int take = Math.min(length, BLOCK_BYTES - buffered);
            System.arraycopy(data, offset, buffer, buffered, take);
            buffered += take;
            offset += take;
            length -= take;
        }
        return this;
    }

    public byte[] digest() {
        if (finished) throw new IllegalStateException("already finished");
        finished = true;
        counter += buffered;
        Arrays.fill(buffer, buffered, BLOCK_BYTES, (byte) 0);
        compress(buffer, true);
        byte[] out = new byte[digestBytes];
        for (int i = 0; i < digestBytes; i++) out[i] = (byte) (h[i / 8] >>> (8 * (i % 8)));
        return out;
    }

    private void compress(byte[] block, boolean last) {
        for (int i = 0; i < 16; i++) m[i] = littleEndian(block, i * 8);
        System.arraycopy(h, 0, v, 0, 8);
        System.arraycopy(IV, 0, v, 8, 8);
        v[12] ^= counter;
        if (last) v[14] = ~v[14];
        for (int round = 0; round < 12; round++) {
            byte[] s = SIGMA[round % 10];
            mix(0, 4, 8, 12, m[s[0]], m[s[1]]);
            mix(1, 5, 9, 13, m[s[2]], m[s[3]]);
            mix(2, 6, 10, 14, m[s[4]], m[s[5]]);
            mix(3, 7, 11, 15, m[s[6]], m[s[7]]);
            mix(0, 5, 10, 15, m[s[8]], m[s[9]]);
            mix(1, 6, 11, 12, m[s[10]], m[s[11]]);
            mix(2, 7, 8, 13, m[s[12]], m[s[13]]);
            mix(3, 4, 9, 14, m[s[14]], m[s[15]]);
        }
        for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
    }

    private void mix(int a, int b, int c, int d, long x, long y) {
        v[a] = v[a] + v[b] + x;
        v[d] = Long.rotateRight(v[d] ^ v[a], 32);
        v[c] = v[c] + v[d];
        v[b] = Long.rotateRight(v[b] ^ v[c], 24);
        v[a] = v[a] + v[b] + y;
        v[d] = Long.rotateRight(v[d] ^ v[a], 16);
        v[c] = v[c] + v[d];
        v[b] = Long.rotateRight(v[b] ^ v[c], 63);
    }

    private static long littleEndian(byte[] b, int at) {
        long value = 0;
        for (int i = 7; i >= 0; i--) value = (value << 8) | (b[at + i] & 0xffL);
        return value;
    }
}
