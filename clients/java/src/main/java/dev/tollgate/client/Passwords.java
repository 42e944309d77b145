package dev.tollgate.client;

import java.nio.charset.StandardCharsets;

/**
 * The password digest and tag (PROTOCOL.md, "The password tag"), byte for
 * byte the Rust client's password_digest and password_tag: keyed
 * BLAKE2b-128 under a 32-byte key only the auth server holds.
 */
public final class Passwords {
    /** The tag's personalization: the same key and password give unrelated digest and tag. */
    public static final byte[] TAG_PERSONAL = "tollgate-pw-tag".getBytes(StandardCharsets.US_ASCII);

    private Passwords() {
    }

    /** For a report's password_digest: the account's byte count (u64 LE), the account, then the password. */
    public static byte[] passwordDigest(byte[] key, String account, String password) {
        checkKey(key);
        byte[] accountBytes = account.getBytes(StandardCharsets.UTF_8);
        byte[] length = new byte[8];
        long n = accountBytes.length;
        for (int i = 0; i < 8; i++) length[i] = (byte) (n >>> (8 * i));
        return new Blake2b(16, key, null)
                .update(length)
                .update(accountBytes)
                .update(password.getBytes(StandardCharsets.UTF_8))
                .digest();
    }

    /** For a check's and report's password_tag: the password alone, personalized. */
    public static byte[] passwordTag(byte[] key, String password) {
        checkKey(key);
        return new Blake2b(16, key, TAG_PERSONAL).update(password.getBytes(StandardCharsets.UTF_8)).digest();
    }

    private static void checkKey(byte[] key) {
        if (key == null || key.length != 32) throw new IllegalArgumentException("the password key is 32 bytes");
    }
}
