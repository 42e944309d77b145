package dev.tollgate.client;

import java.util.Arrays;
import java.util.Objects;

/** A tiny assertion helper (no JUnit here): counts failures and prints each. */
final class Expect {
    static int checks;
    static int failures;
    static String group = "";

    private Expect() {
    }

    static void group(String name) {
        group = name;
        System.out.println("== " + name);
    }

    static void that(boolean condition, String what) {
        checks++;
        if (!condition) {
            failures++;
            System.out.println("FAIL [" + group + "] " + what);
        }
    }

    static void equal(Object expected, Object actual, String what) {
        boolean same = expected instanceof byte[] e && actual instanceof byte[] a ? Arrays.equals(e, a) : Objects.equals(expected, actual);
        checks++;
        if (!same) {
            failures++;
            System.out.println("FAIL [" + group + "] " + what + ": expected " + show(expected) + ", got " + show(actual));
        }
    }

    private static String show(Object value) {
        return value instanceof byte[] b ? hex(b) : String.valueOf(value);
    }

    static String hex(byte[] bytes) {
        StringBuilder out = new StringBuilder();
        for (byte b : bytes) out.append(String.format("%02x", b & 0xff));
        return out.toString();
    }

    static byte[] unhex(String text) {
        byte[] out = new byte[text.length() / 2];
        for (int i = 0; i < out.length; i++) out[i] = (byte) Integer.parseInt(text.substring(2 * i, 2 * i + 2), 16);
        return out;
    }
}
