// Type declarations of tollgate-client (hand-written; the library is plain ESM).

/// <reference types="node" />

export type FailPolicy = "open" | "closed";
export type Outcome = "success" | "failure";
export type Decision = "allow" | "delay" | "challenge" | "deny";
export type Reason =
  | "allowed" | "rate_limited" | "too_many_failures" | "monitor_rate_limited" | "monitor_too_many_failures"
  | "spray_suspected" | "distributed_attack" | "tenant_anomaly" | "monitor_signal" | "attempts_in_flight";
export type ErrorCode =
  | "malformed" | "unsupported_version" | "unknown_route" | "missing_field" | "field_too_long"
  | "permission_denied" | "not_manual_clock" | "frame_too_large" | "internal";
/**
 * Why a call had no answer. `connect`: no such socket, nobody listening or
 * not allowed (ENOENT, ECONNREFUSED, EACCES); any other failure to connect
 * (a full accept queue, EAGAIN; no descriptor or memory, EMFILE, ENFILE,
 * ENOBUFS, ENOMEM) is `timeout` or `busy`, as a daemon late to reply.
 */
export type ErrorKind = "connect" | "timeout" | "busy" | "io" | "protocol";
export type Bytes = Uint8Array;

/** Who is attempting; absent or null fields are None. */
export interface Subject {
  /** The TCP peer's address, IPv4 or IPv6 text. */
  peer?: string | null;
  /** The raw X-Forwarded-For header; only its last 4096 bytes' whole entries are sent. */
  forwardedFor?: string | null;
  account?: string | null;
  device?: string | null;
  tenant?: string | null;
  clientId?: string | null;
}

export interface Verdict {
  decision: Decision;
  retryAfterMs: number;
  delayMs: number;
  limit: number;
  remaining: number;
  resetMs: number;
  reason: Reason;
  rule: string;
}

export interface StaticBudget {
  limit: number;
  periodMs: number;
  burst: number;
}

export interface ClientConfig {
  socket: string;
  /** Per call, default 5. */
  timeoutMs?: number;
  /** Default 1000; 0 makes every timeout an outage. */
  busyMaxMs?: number;
  /** 1 to 5, default 5. */
  protocolVersion?: number;
  /** Merged over BUILTIN_FAIL_POLICIES. */
  failPolicies?: Record<string, FailPolicy>;
  /** For routes in neither table; default "open". */
  defaultFailPolicy?: FailPolicy;
  /** Per closed route: what this process lets through while the daemon cannot answer. */
  staticBudgets?: Record<string, StaticBudget>;
  /** 32 bytes (or 64 hex digits): the key of `password` options. */
  passwordKey?: Bytes | string;
}

export interface CheckOptions {
  /** The attempted password: its tag is computed with `passwordKey`. */
  password?: string;
  passwordTag?: Bytes;
}

export interface ReportOptions extends CheckOptions {
  passwordDigest?: Bytes;
}

export interface AttemptReportOptions extends ReportOptions {
  /** The subject after the verify (such as a device id issued at sign-in). */
  subject?: Subject;
}

export class ClientError extends Error {
  readonly kind: ErrorKind;
  readonly closed: boolean;
  constructor(kind: ErrorKind, message: string, options?: { closed?: boolean });
}

export class Answer {
  readonly kind: "verdict" | "rejected" | "unavailable";
  readonly verdict: Verdict | null;
  readonly degraded: boolean;
  /** The protocol version of the reply; null without one. */
  readonly version: number | null;
  /**
   * For "rejected": the daemon's error, or the same refusal made before
   * sending (`field_too_long`, `frame_too_large`, `malformed` for an
   * unpaired surrogate); `version` is then null.
   */
  readonly error: { code: ErrorCode; message: string } | ClientError | null;
  readonly policy: FailPolicy | null;
  readonly withinStaticBudget: boolean;
  constructor(fields: object);
  /** Whether the attempt may go ahead (after `delay()` ms for a delay). */
  proceeds(): boolean;
  /** A delay verdict's delay in ms; null otherwise. */
  delay(): number | null;
  /** Retry-After for a refusal: whole seconds, rounded up, at least 1. */
  retryAfterSecs(): number;
}

export class Attempt {
  readonly answer: Answer;
  readonly holdsPlaces: boolean;
  proceeds(): boolean;
  /**
   * Reports the outcome; the guard is spent. Without a `passwordTag` or
   * `password`, the report carries the check's tag; a given one wins.
   */
  report(outcome: Outcome, options?: AttemptReportOptions): Promise<Answer>;
  /** Abandons an allowed, unreported attempt (resolving with that answer); otherwise resolves null. */
  end(): Promise<Answer | null>;
}

export class Client {
  constructor(config: ClientConfig);
  readonly config: Readonly<{
    socket: string;
    timeoutMs: number;
    busyMaxMs: number;
    protocolVersion: number;
    failPolicies: Record<string, FailPolicy>;
    defaultFailPolicy: FailPolicy;
  }>;
  failPolicy(route: string): FailPolicy;
  check(route: string, subject: Subject, options?: CheckOptions): Promise<Answer>;
  report(route: string, subject: Subject, outcome: Outcome, options?: ReportOptions): Promise<Answer>;
  abandon(route: string, subject: Subject): Promise<Answer>;
  begin(route: string, subject: Subject, options?: CheckOptions): Promise<Attempt>;
  unavailable(route: string, error: ClientError, spend: boolean): Answer;
  /** Closes the idle connections and those listening for a late reply. */
  close(): void;
}

export const CALL_TIMEOUT_DEFAULT_MS: number;
export const BUSY_MAX_DEFAULT_MS: number;
export const POOL_CONNECTIONS_MAX: number;
/** Timed-out connections one client keeps listening for a late reply at once. */
export const LATE_LISTENERS_MAX: number;
export const BUILTIN_FAIL_POLICIES: Readonly<Record<string, FailPolicy>>;
export const FORWARDED_FOR_BYTES_MAX: number;
export const PASSWORD_TAG_PERSONAL: Buffer;
export const PROTOCOL_VERSION: number;
export const PROTOCOL_VERSION_MIN: number;
export const RESPONSE_PAYLOAD_BYTES_MAX: number;
/** 16384: a larger request payload is refused before sending (`frame_too_large`). */
export const REQUEST_PAYLOAD_BYTES_MAX: number;
/** 512: a longer account, device, tenant or client id is refused before sending (`field_too_long`). */
export const IDENTIFIER_BYTES_MAX: number;
export const DECISIONS: readonly Decision[];
export const REASONS: readonly Reason[];
export const ERROR_CODES: readonly ErrorCode[];

export function forwardedTail(header: string): string;
export function passwordDigest(key: Bytes, account: string, password: string): Buffer;
export function passwordTag(key: Bytes, password: string): Buffer;
export function blake2b(
  input: Bytes,
  options?: { outlen?: number; key?: Bytes; salt?: Bytes; personal?: Bytes },
): Uint8Array;

export interface GcraSpec {
  intervalUs: number;
  burst: number;
}
export interface GcraDecision {
  allowed: boolean;
  remaining: number;
  retryAfterUs: number;
  resetUs: number;
}
export function gcraSpec(limit: number, periodUs: number, burst: number): GcraSpec;
export function gcraDecide(spec: GcraSpec, tatUs: number | null, nowUs: number, spend: boolean): [GcraDecision, number];

export interface Request {
  type: "check" | "report" | "abandon";
  route: string;
  subject?: Subject;
  outcome?: Outcome;
  passwordDigest?: Bytes | null;
  passwordTag?: Bytes | null;
}
export type Reply =
  | { version: number; id: number; kind: "verdict"; verdict: Verdict; degraded: boolean }
  | { version: number; id: number; kind: "error"; code: ErrorCode; message: string };
export class DecodeError extends Error {}
export function encodeRequest(version: number, id: number, request: Request): Buffer;
export function decodeResponse(payload: Bytes): Reply;
