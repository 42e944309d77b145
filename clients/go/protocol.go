package tollgate

// The wire format of PROTOCOL.md, for what an auth server sends and reads:
// Check, Report and Abandon requests; Verdict and Error replies.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"unicode/utf8"
)

const (
	// ProtocolVersion is the newest version this client speaks (and the
	// one it starts each connection at).
	ProtocolVersion    uint8 = 5
	ProtocolVersionMin uint8 = 1
	// signalsVersion is the first version whose Check and Report carry a
	// password tag.
	signalsVersion uint8 = 3
	// abandonVersion is the first version with the Abandon request.
	abandonVersion uint8 = 5

	frameHeaderBytes = 4
	envelopeBytes    = 9
	// RequestPayloadBytesMax: the daemon refuses a longer request (and
	// closes the connection), so the client refuses it before sending.
	RequestPayloadBytesMax = 16 * 1024
	// IdentifierBytesMax: the longest account, device, tenant or client id
	// the daemon takes; the client refuses a longer one before sending.
	IdentifierBytesMax = 512
	// ResponsePayloadBytesMax: a longer reply means a broken connection.
	ResponsePayloadBytesMax = 8 * 1024 * 1024
	// ForwardedForBytesMax is how much of an X-Forwarded-For header, from
	// the right, the daemon reads (and so the client sends).
	ForwardedForBytesMax = 4096
	flagDegraded         = 1
)

const (
	requestCheck   uint32 = 0
	requestReport  uint32 = 1
	requestAbandon uint32 = 8

	responseVerdict uint32 = 0
	responseError   uint32 = 5
)

// Subject is who is attempting. A nil field (or an invalid Peer) is None
// on the wire; an empty string is Some("").
type Subject struct {
	Peer         netip.Addr
	ForwardedFor *string
	Account      *string
	Device       *string
	Tenant       *string
	ClientID     *string
}

// Some returns a pointer to s, for Subject's optional fields.
func Some(s string) *string { return &s }

type Outcome uint32

const (
	Success Outcome = 0
	Failure Outcome = 1
)

func (o Outcome) String() string {
	if o == Success {
		return "success"
	}
	return "failure"
}

type Decision uint32

const (
	Allow Decision = iota
	Delay
	Challenge
	Deny
)

var decisionNames = []string{"allow", "delay", "challenge", "deny"}

func (d Decision) String() string { return nameOf(decisionNames, uint32(d)) }

type Reason uint32

const (
	ReasonAllowed Reason = iota
	ReasonRateLimited
	ReasonTooManyFailures
	ReasonMonitorRateLimited
	ReasonMonitorTooManyFailures
	ReasonSpraySuspected
	ReasonDistributedAttack
	ReasonTenantAnomaly
	ReasonMonitorSignal
	ReasonAttemptsInFlight
)

var reasonNames = []string{
	"allowed", "rate_limited", "too_many_failures", "monitor_rate_limited", "monitor_too_many_failures",
	"spray_suspected", "distributed_attack", "tenant_anomaly", "monitor_signal", "attempts_in_flight",
}

func (r Reason) String() string { return nameOf(reasonNames, uint32(r)) }

type ErrorCode uint32

const (
	CodeMalformed ErrorCode = iota
	CodeUnsupportedVersion
	CodeUnknownRoute
	CodeMissingField
	CodeFieldTooLong
	CodePermissionDenied
	CodeNotManualClock
	CodeFrameTooLarge
	CodeInternal
)

var errorCodeNames = []string{
	"malformed", "unsupported_version", "unknown_route", "missing_field", "field_too_long",
	"permission_denied", "not_manual_clock", "frame_too_large", "internal",
}

func (c ErrorCode) String() string { return nameOf(errorCodeNames, uint32(c)) }

func nameOf(names []string, v uint32) string {
	if int(v) < len(names) {
		return names[v]
	}
	return fmt.Sprintf("unknown(%d)", v)
}

// Verdict is the daemon's answer to a check, report or abandon.
type Verdict struct {
	Decision     Decision
	RetryAfterMs uint64
	DelayMs      uint64
	Limit        uint32
	Remaining    uint32
	ResetMs      uint64
	Reason       Reason // for logs; never show it to the end user
	Rule         string
	// Degraded is bit 0 of a version-2+ verdict's flags (a global rule was
	// decided on this host's share); false in version 1.
	Degraded bool
	// Version is the protocol version the reply came in.
	Version uint8
}

// Proceeds tells whether the attempt may go ahead (after DelayMs for a delay).
func (v *Verdict) Proceeds() bool { return v.Decision == Allow || v.Decision == Delay }

// ErrorReply is the daemon refusing the request itself.
type ErrorReply struct {
	Code    ErrorCode
	Message string
}

// request is what the client sends: Check, Report or Abandon.
type request struct {
	kind        uint32
	route       string
	subject     Subject
	outcome     Outcome
	digest      *[16]byte // Report only
	passwordTag *[16]byte // Check and Report, version 3 and later
}

// encodeRequest appends one frame of req in version, with id.
func encodeRequest(out []byte, version uint8, id uint64, req *request) []byte {
	start := len(out)
	out = append(out, 0, 0, 0, 0, version)
	out = binary.LittleEndian.AppendUint64(out, id)
	out = binary.LittleEndian.AppendUint32(out, req.kind)
	out = appendString(out, req.route)
	out = appendSubject(out, &req.subject)
	if req.kind == requestReport {
		out = binary.LittleEndian.AppendUint32(out, uint32(req.outcome))
		out = appendOptionalBytes(out, req.digest)
	}
	if version >= signalsVersion && (req.kind == requestCheck || req.kind == requestReport) {
		out = appendOptionalBytes(out, req.passwordTag)
	}
	binary.LittleEndian.PutUint32(out[start:], uint32(len(out)-start-frameHeaderBytes))
	return out
}

func appendString(out []byte, s string) []byte {
	out = binary.LittleEndian.AppendUint64(out, uint64(len(s)))
	return append(out, s...)
}

func appendOptionalString(out []byte, s *string) []byte {
	if s == nil {
		return append(out, 0)
	}
	return appendString(append(out, 1), *s)
}

func appendOptionalBytes(out []byte, b *[16]byte) []byte {
	if b == nil {
		return append(out, 0)
	}
	return append(append(out, 1), b[:]...)
}

func appendSubject(out []byte, s *Subject) []byte {
	switch {
	case !s.Peer.IsValid():
		out = append(out, 0)
	case s.Peer.Is4():
		a := s.Peer.As4()
		out = binary.LittleEndian.AppendUint32(append(out, 1), 0)
		out = append(out, a[:]...)
	default:
		a := s.Peer.As16()
		out = binary.LittleEndian.AppendUint32(append(out, 1), 1)
		out = append(out, a[:]...)
	}
	for _, field := range []*string{s.ForwardedFor, s.Account, s.Device, s.Tenant, s.ClientID} {
		out = appendOptionalString(out, field)
	}
	return out
}

// refuseLocally is the refusal the daemon would give a request too big
// for it (nil for one it takes), decided before any I/O: sent, such a
// request makes the daemon close the connection mid-write, and the client
// would see an outage (fail open) instead of a refusal. version: the
// newest the request could go out in (its largest encoding).
func refuseLocally(version uint8, req *request) *ErrorReply {
	s := &req.subject
	fields := []struct {
		name  string
		value *string
	}{{"account", s.Account}, {"device", s.Device}, {"tenant", s.Tenant}, {"client_id", s.ClientID}}
	for _, f := range fields {
		if f.value != nil && len(*f.value) > IdentifierBytesMax {
			return &ErrorReply{Code: CodeFieldTooLong, Message: fmt.Sprintf(
				"field `subject.%s` is %d bytes; the maximum is %d (refused before sending)",
				f.name, len(*f.value), IdentifierBytesMax)}
		}
	}
	if n := requestPayloadBytes(version, req); n > RequestPayloadBytesMax {
		return &ErrorReply{Code: CodeFrameTooLarge, Message: fmt.Sprintf(
			"the request is %d bytes; the maximum is %d (refused before sending)", n, RequestPayloadBytesMax)}
	}
	return nil
}

// requestPayloadBytes is the length of encodeRequest's payload (its frame
// without the length prefix), counted without encoding it.
func requestPayloadBytes(version uint8, req *request) int {
	optional := func(present bool, n int) int {
		if present {
			return 1 + n
		}
		return 1
	}
	n := envelopeBytes + 4 + 8 + len(req.route)
	s := &req.subject
	switch {
	case !s.Peer.IsValid():
		n++
	case s.Peer.Is4():
		n += 1 + 4 + 4
	default:
		n += 1 + 4 + 16
	}
	for _, field := range []*string{s.ForwardedFor, s.Account, s.Device, s.Tenant, s.ClientID} {
		if field != nil {
			n += 1 + 8 + len(*field)
		} else {
			n++
		}
	}
	if req.kind == requestReport {
		n += 4 + optional(req.digest != nil, 16)
	}
	if version >= signalsVersion && (req.kind == requestCheck || req.kind == requestReport) {
		n += optional(req.passwordTag != nil, 16)
	}
	return n
}

// response is a decoded reply: exactly one of verdict and errorReply is set.
type response struct {
	version    uint8
	id         uint64
	verdict    *Verdict
	errorReply *ErrorReply
}

var errShortReply = errors.New("reply ends early")

// reader reads a reply's fields in order; the first failure sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = errShortReply
		return nil
	}
	head := r.b[:n]
	r.b = r.b[n:]
	return head
}

func (r *reader) u8() uint8 {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (r *reader) str() string {
	n := r.u64()
	if r.err == nil && n > uint64(len(r.b)) {
		r.err = errShortReply
	}
	b := r.take(int(n))
	if r.err == nil && !utf8.Valid(b) {
		r.err = errors.New("a string is not UTF-8")
	}
	return string(b)
}

func (r *reader) enum(what string, count int) uint32 {
	v := r.u32()
	if r.err == nil && v >= uint32(count) {
		r.err = fmt.Errorf("unknown %s %d", what, v)
	}
	return v
}

// decodeResponse decodes one reply payload (without its length prefix),
// using every byte. Replies other than Verdict and Error are errors: the
// requests this client sends get no others.
func decodeResponse(payload []byte) (*response, error) {
	if len(payload) < envelopeBytes {
		return nil, fmt.Errorf("reply of %d bytes is shorter than the envelope", len(payload))
	}
	resp := &response{version: payload[0], id: binary.LittleEndian.Uint64(payload[1:9])}
	if resp.version < ProtocolVersionMin || resp.version > ProtocolVersion {
		return nil, fmt.Errorf("reply in unknown protocol version %d", resp.version)
	}
	r := &reader{b: payload[envelopeBytes:]}
	switch kind := r.u32(); {
	case r.err != nil:
	case kind == responseVerdict:
		v := &Verdict{Version: resp.version}
		v.Decision = Decision(r.enum("decision", len(decisionNames)))
		v.RetryAfterMs = r.u64()
		v.DelayMs = r.u64()
		v.Limit = r.u32()
		v.Remaining = r.u32()
		v.ResetMs = r.u64()
		v.Reason = Reason(r.enum("reason", len(reasonNames)))
		v.Rule = r.str()
		if resp.version >= 2 {
			// Bits 1-7 are reserved: ignored, never refused.
			v.Degraded = r.u8()&flagDegraded != 0
		}
		resp.verdict = v
	case kind == responseError:
		e := &ErrorReply{}
		e.Code = ErrorCode(r.enum("error code", len(errorCodeNames)))
		e.Message = r.str()
		resp.errorReply = e
	case kind <= 7:
		return nil, fmt.Errorf("unexpected reply (response %d) to a check, report or abandon", kind)
	default:
		return nil, fmt.Errorf("unknown response %d", kind)
	}
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%d byte(s) left over after the reply", len(r.b))
	}
	return resp, nil
}

// ForwardedTail is the part of an X-Forwarded-For header the daemon reads,
// and so the part the client sends: all of it, or for a longer one the
// whole entries within its last ForwardedForBytesMax bytes ("" when one
// entry is longer than that: malformed, and the daemon uses the peer).
// Sent whole, a header the end user made huge would overflow the frame.
func ForwardedTail(header string) string {
	if len(header) <= ForwardedForBytesMax {
		return header
	}
	start := len(header) - ForwardedForBytesMax
	for i := start - 1; i < len(header); i++ {
		if header[i] == ',' {
			return header[i+1:]
		}
	}
	return ""
}

// PasswordDigest is keyed BLAKE2b-128 of the account's byte count (u64
// LE), the account and the password: what a Report's password_digest
// carries, so a repeated wrong password is not counted twice.
func PasswordDigest(key *[32]byte, account, password string) [16]byte {
	h := newBlake2b(16, key[:], nil)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(account)))
	h.Write(n[:])
	h.Write([]byte(account))
	h.Write([]byte(password))
	var out [16]byte
	copy(out[:], h.Sum())
	return out
}

// passwordTagPersonal keeps a tag unrelated to the digest under one key.
var passwordTagPersonal = []byte("tollgate-pw-tag")

// PasswordTag is keyed BLAKE2b-128 of the password alone, personalized
// "tollgate-pw-tag": one password tried across many accounts gives one
// tag, which lets the daemon see a spray.
func PasswordTag(key *[32]byte, password string) [16]byte {
	h := newBlake2b(16, key[:], passwordTagPersonal)
	h.Write([]byte(password))
	var out [16]byte
	copy(out[:], h.Sum())
	return out
}
