// tollgate-client: the Node.js client of the tollgate login rate limiter.
// See README.md, ../../PROTOCOL.md and ../../docs/clients.md.

export { Attempt } from "./lib/attempt.js";
export { Client, Answer, CALL_TIMEOUT_DEFAULT_MS, BUSY_MAX_DEFAULT_MS, POOL_CONNECTIONS_MAX, LATE_LISTENERS_MAX } from "./lib/client.js";
export { ClientError } from "./lib/connection.js";
export { passwordDigest, passwordTag, PASSWORD_TAG_PERSONAL } from "./lib/passwords.js";
export { BUILTIN_FAIL_POLICIES, FORWARDED_FOR_BYTES_MAX, forwardedTail } from "./lib/policies.js";
export { gcraSpec, gcraDecide } from "./lib/gcra.js";
export { blake2b } from "./lib/blake2b.js";
export {
  encodeRequest, decodeResponse, DecodeError, DECISIONS, REASONS, ERROR_CODES,
  PROTOCOL_VERSION, PROTOCOL_VERSION_MIN, RESPONSE_PAYLOAD_BYTES_MAX, REQUEST_PAYLOAD_BYTES_MAX, IDENTIFIER_BYTES_MAX,
} from "./lib/codec.js";
