// Fail policies and the X-Forwarded-For bound, copied from client/src/lib.rs.

/**
 * The built-in routes' fail policies: login and reauth protect users (open);
 * the rest protect the system (closed). Routes not listed fail open.
 */
export const BUILTIN_FAIL_POLICIES = Object.freeze({
  login: "open",
  reauth: "open",
  request: "closed",
  mfa_verify: "closed",
  mfa_resend: "closed",
  password_reset: "closed",
  registration: "closed",
  token: "closed",
});

/** Bytes of X-Forwarded-For the daemon reads, from the right. */
export const FORWARDED_FOR_BYTES_MAX = 4096;

/**
 * The part of an X-Forwarded-For header the daemon reads: all of it, or for
 * a longer one the whole entries within its last 4096 bytes (the part after
 * the first comma at or after byte len − 4096 − 1); "" when one entry fills
 * the window. Sent whole, a huge header would overflow the frame.
 */
export function forwardedTail(header) {
  const bytes = Buffer.from(header, "utf8");
  const start = bytes.length - FORWARDED_FOR_BYTES_MAX;
  if (start <= 0) return header;
  const comma = bytes.indexOf(0x2c, start - 1);
  return comma < 0 ? "" : bytes.subarray(comma + 1).toString("utf8");
}
