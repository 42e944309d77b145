package tollgate

// The client an auth server links: pooled connections, a per-call
// deadline, version step-down, and each route's fail policy applied when
// the daemon cannot answer in time, surfaced as such (never as a made-up
// verdict). Mirrors client/src/client.rs.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// CallTimeoutDefault: a stalled daemon costs a login no more than a few
	// ms before the fail policy decides.
	CallTimeoutDefault = 5 * time.Millisecond
	// BusyMaxDefault: how long a run of timeouts from a daemon that has
	// answered this client (and how long after an answer, in time or late)
	// is taken for a busy daemon, not a lost one.
	BusyMaxDefault = time.Second
	// PoolConnectionsMax idle connections are kept for reuse.
	PoolConnectionsMax = 64
	// LateListenersMax timed-out connections at most are kept open at once
	// to hear a late reply; beyond that they are closed at once, so that
	// an attacker's bursts cannot run the auth server out of descriptors.
	LateListenersMax = 16
	// SocketPathDefault is the daemon's default socket.
	SocketPathDefault = "/run/tollgate/tollgate.sock"
)

// FailPolicy is what to do with an attempt when the daemon cannot answer.
type FailPolicy int

const (
	// Open lets the attempt proceed: the rule protects users, and refusing
	// every login while the limiter is down would be the bigger harm.
	Open FailPolicy = iota
	// Closed refuses the attempt: the rule protects the system.
	Closed
)

func (p FailPolicy) String() string {
	if p == Closed {
		return "closed"
	}
	return "open"
}

// BuiltinFailPolicies are the built-in routes' policies (the daemon's
// built-in routes carry the same); routes not listed are open.
var BuiltinFailPolicies = map[string]FailPolicy{
	"login":          Open,
	"reauth":         Open,
	"request":        Closed,
	"mfa_verify":     Closed,
	"mfa_resend":     Closed,
	"password_reset": Closed,
	"registration":   Closed,
	"token":          Closed,
}

// StaticBudget lets a closed route through at Limit per Period (Burst at
// once) in this process while the daemon cannot answer. Size it for one
// process of many.
type StaticBudget struct {
	Limit  uint32
	Period time.Duration
	Burst  uint32
}

// Config is a client's settings; NewConfig has the defaults.
type Config struct {
	Socket string
	// Timeout bounds each call (a sooner context deadline wins).
	Timeout time.Duration
	// BusyMax: a timeout in a run of timeouts younger than this (or this
	// soon after an answer in time, or after a reply heard late), from a
	// daemon that has answered this client in time, for a check overlapped by
	// another on the same account (or address), is ErrBusy and never
	// proceeds: for as long as it lasts when the other is from the same
	// address and X-Forwarded-For too, or when no success was reported
	// through this client for its tenant, account, address and
	// X-Forwarded-For (in the last 30 days, and among the last 16 of its
	// account); else for at most BusyMax in 120 x BusyMax per requester.
	// Zero: every timeout is an outage.
	BusyMax time.Duration
	// FailPolicies per route; others get DefaultFailPolicy.
	FailPolicies      map[string]FailPolicy
	DefaultFailPolicy FailPolicy
	// StaticBudgets per closed route (only checks spend from them).
	StaticBudgets map[string]StaticBudget
	// ProtocolVersion each new connection starts at (1 to 5).
	ProtocolVersion uint8
	// PasswordKey, when set, is the auth server's 32-byte secret from which
	// Begin and Attempt.Report make the password tag and digest.
	PasswordKey *[32]byte
}

// NewConfig returns the defaults: the built-in fail policies, a 5 ms
// timeout, busy_max 1 s, protocol version 5.
func NewConfig(socket string) Config {
	policies := make(map[string]FailPolicy, len(BuiltinFailPolicies))
	for route, policy := range BuiltinFailPolicies {
		policies[route] = policy
	}
	return Config{
		Socket:            socket,
		Timeout:           CallTimeoutDefault,
		BusyMax:           BusyMaxDefault,
		FailPolicies:      policies,
		DefaultFailPolicy: Open,
		StaticBudgets:     map[string]StaticBudget{},
		ProtocolVersion:   ProtocolVersion,
	}
}

// ErrorKind says why a call got no answer.
type ErrorKind int

const (
	ErrConnect  ErrorKind = iota // the socket cannot be reached
	ErrTimeout                   // no reply within the deadline
	ErrBusy                      // a timeout taken for a busy daemon: never proceeds
	ErrIO                        // the connection failed
	ErrProtocol                  // a reply that does not decode, or answers another request
	// ErrCanceled: the check's context was cancelled. Never proceeds,
	// whatever the policy: net/http cancels a request's context when the
	// end user hangs up, and a hang-up must not buy an unchecked guess.
	ErrCanceled
	// ErrDeadline: the check's context deadline, sooner than the client's
	// Timeout, passed before an answer came (or before the check began),
	// while the daemon is taken for healthy or busy (see deadlineKind).
	// Never proceeds, spends no static budget, and is not the daemon being
	// late: whoever sets the request's deadline (a gRPC client's
	// grpc-timeout, a slow body under http.TimeoutHandler) would otherwise
	// turn a locked account into an outage that fails open.
	ErrDeadline
)

var errorKindNames = []string{"connect", "timeout", "busy", "io", "protocol", "canceled", "deadline"}

func (k ErrorKind) String() string { return nameOf(errorKindNames, uint32(k)) }

// CallError is a call that got no answer.
type CallError struct {
	Kind ErrorKind
	Err  error
}

func (e *CallError) Error() string { return fmt.Sprintf("tollgate %s: %v", e.Kind, e.Err) }
func (e *CallError) Unwrap() error { return e.Err }

// neverProceeds: a busy daemon, or a check its caller ended (cancelled, or
// its deadline passed first), is no outage: no policy lets it through.
func (e *CallError) neverProceeds() bool {
	return e.Kind == ErrBusy || e.Kind == ErrCanceled || e.Kind == ErrDeadline
}

// AnswerKind tells which of Answer's shapes it is.
type AnswerKind int

const (
	// AnswerVerdict: the daemon's verdict.
	AnswerVerdict AnswerKind = iota
	// AnswerRejected: the daemon refused the request itself (an identifier
	// too long, an unknown route): the attempt is refused; fix the caller.
	AnswerRejected
	// AnswerUnavailable: no answer in time; the route's fail policy decides.
	AnswerUnavailable
)

var answerKindNames = []string{"verdict", "rejected", "unavailable"}

func (k AnswerKind) String() string { return nameOf(answerKindNames, uint32(k)) }

// Answer is what the auth server should do with an attempt.
type Answer struct {
	Kind     AnswerKind
	Verdict  *Verdict    // AnswerVerdict
	Rejected *ErrorReply // AnswerRejected
	// AnswerUnavailable: the route's policy, why, and for a closed route
	// whether its static budget had room.
	Policy             FailPolicy
	Err                *CallError
	WithinStaticBudget bool
}

// Proceeds tells whether the attempt may go ahead (after Delay for a delay).
func (a Answer) Proceeds() bool {
	switch a.Kind {
	case AnswerVerdict:
		return a.Verdict.Proceeds()
	case AnswerUnavailable:
		if a.Err != nil && a.Err.neverProceeds() {
			return false
		}
		return a.Policy == Open || a.WithinStaticBudget
	default:
		return false
	}
}

// Delay is how long to hold the attempt before it proceeds (a delay
// verdict); 0 otherwise.
func (a Answer) Delay() time.Duration {
	if a.Kind == AnswerVerdict && a.Verdict.Decision == Delay {
		return time.Duration(a.Verdict.DelayMs) * time.Millisecond
	}
	return 0
}

// RetryAfterSecs is the Retry-After to send with a refusal: whole seconds,
// rounded up, at least 1; 1 when the refusal did not come from a verdict.
func (a Answer) RetryAfterSecs() uint64 {
	if a.Kind != AnswerVerdict {
		return 1
	}
	secs := a.Verdict.RetryAfterMs / 1000
	if a.Verdict.RetryAfterMs%1000 != 0 {
		secs++
	}
	if secs < 1 {
		secs = 1
	}
	return secs
}

type conn struct {
	c    *net.UnixConn
	buf  []byte
	read []byte
	// version its requests go out in: lowered once for each newer version
	// its daemon refused, for as long as the connection lives.
	version uint8
	// replyOwed: a request was written whole and its reply not read yet.
	replyOwed bool
}

// Client talks to one daemon. Safe for concurrent use; share one per
// process (the busy rule reads the client's own history).
type Client struct {
	cfg     Config
	started time.Time
	nextID  atomic.Uint64

	poolMu sync.Mutex
	idle   []*conn
	// listening: the timed-out connections kept open to hear a late reply
	// (at most LateListenersMax), closed by Close with the idle ones.
	listening map[*conn]struct{}
	closed    bool

	budgetMu   sync.Mutex
	budgetTats map[string]uint64
	budgets    map[string]gcraSpec

	// lastAnswered: when the daemon last answered in time (µs since
	// started, plus one; 0 never): a daemon never heard from is not busy.
	lastAnswered atomic.Uint64
	// lastHeard: when a reply last came to a call that had already timed
	// out (same clock; 0 never), heard by a late listener (listenLate).
	// It neither ends a run nor counts as an answer in time, but the next
	// timeout after it starts the run anew (joinRun).
	lastHeard atomic.Uint64
	// lateRun: the current run of timeouts (when it began, the last one;
	// 0 none). A daemon late for longer than BusyMax, with no call answered
	// in time within it and no reply heard late within it, is down or
	// overloaded: the fail policy applies.
	lateMu  sync.Mutex
	lateRun [2]uint64
	bursts  *bursts
	// busy: each requester's busy window, for checks in others' bursts.
	busy *busyWindows
	// known: the requesters with a success reported through this client;
	// only they leave busy in others' bursts.
	known *knownRequesters
	// afterWrite, in tests, holds a call between its write and its read;
	// beforeConnect, one about to dial.
	afterWrite, beforeConnect func()
}

// NewClient makes a client; it connects on first use.
func NewClient(cfg Config) (*Client, error) {
	if cfg.ProtocolVersion < ProtocolVersionMin || cfg.ProtocolVersion > ProtocolVersion {
		return nil, fmt.Errorf("protocol version %d is not one this client speaks (%d to %d)",
			cfg.ProtocolVersion, ProtocolVersionMin, ProtocolVersion)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = CallTimeoutDefault
	}
	c := &Client{cfg: cfg, started: time.Now(), listening: map[*conn]struct{}{}, budgetTats: map[string]uint64{}, budgets: map[string]gcraSpec{}, bursts: newBursts(), busy: newBusyWindows(), known: newKnownRequesters()}
	c.cfg.FailPolicies = make(map[string]FailPolicy, len(cfg.FailPolicies))
	for route, policy := range cfg.FailPolicies {
		c.cfg.FailPolicies[route] = policy
	}
	for route, b := range cfg.StaticBudgets {
		c.budgets[route] = newGcraSpec(b.Limit, b.Period, b.Burst)
	}
	return c, nil
}

// Close closes the idle connections and those still listening for a late
// reply; calls in flight close theirs.
func (c *Client) Close() {
	c.poolMu.Lock()
	idle, listening := c.idle, c.listening
	c.idle, c.listening, c.closed = nil, nil, true
	c.poolMu.Unlock()
	for _, cn := range idle {
		cn.c.Close()
	}
	for cn := range listening {
		cn.c.Close()
	}
}

// Check asks before the expensive work: may this attempt proceed?
func (c *Client) Check(ctx context.Context, route string, subject Subject) Answer {
	return c.CheckTagged(ctx, route, subject, nil)
}

// CheckTagged is Check with the attempted password's tag (PasswordTag),
// so that a password failing across many accounts can be refused. A
// daemon older than version 3 never sees it.
func (c *Client) CheckTagged(ctx context.Context, route string, subject Subject, passwordTag *[16]byte) Answer {
	req := &request{kind: requestCheck, route: route, subject: bounded(subject), passwordTag: passwordTag}
	return c.decide(ctx, true, req)
}

// Report tells the outcome after verifying the credential. It is not
// cancelled by ctx (nor cut short by its deadline): the verify happened,
// so the outcome must count; the client's Timeout bounds it.
func (c *Client) Report(ctx context.Context, route string, subject Subject, outcome Outcome) Answer {
	return c.ReportTagged(ctx, route, subject, outcome, nil, nil)
}

// ReportTagged is Report with the password's digest (PasswordDigest: a
// repeated wrong password is not counted again) and tag (PasswordTag).
func (c *Client) ReportTagged(ctx context.Context, route string, subject Subject, outcome Outcome, digest, passwordTag *[16]byte) Answer {
	req := &request{kind: requestReport, route: route, subject: bounded(subject), outcome: outcome, digest: digest, passwordTag: passwordTag}
	return c.decide(ctx, false, req)
}

// Abandon gives back the places of an allowed check whose attempt ended
// without an outcome. Prefer Begin, whose guard sends it by itself. On a
// connection below version 5 the daemon answers malformed (rejected) and
// the places lapse. Like Report, ctx neither cancels nor shortens it.
func (c *Client) Abandon(ctx context.Context, route string, subject Subject) Answer {
	req := &request{kind: requestAbandon, route: route, subject: bounded(subject)}
	return c.decide(ctx, false, req)
}

// bounded is the subject as sent: of X-Forwarded-For, only ForwardedTail.
func bounded(s Subject) Subject {
	if s.ForwardedFor != nil {
		s.ForwardedFor = Some(ForwardedTail(*s.ForwardedFor))
	}
	return s
}

// decide sends req and applies the fail policy when no answer comes;
// cancellable: a cancelled ctx aborts a check on the wire (not Begin's).
func (c *Client) decide(ctx context.Context, cancellable bool, req *request) Answer {
	// Refused here before it costs anything: sent, it would break the
	// connection mid-write and read as an outage (fail open).
	if refused := refuseLocally(c.cfg.ProtocolVersion, req); refused != nil {
		return Answer{Kind: AnswerRejected, Rejected: refused}
	}
	// A success makes its requester known (whatever becomes of the report:
	// the auth server found the password right), so that her timeouts in
	// others' bursts on her account may leave busy after BusyMax.
	// A requester that is its burst key (no address) is never asked
	// about: its overlaps are all its own.
	if req.kind == requestReport && req.outcome == Success {
		if requester := requesterKey(req.route, &req.subject); requester != burstKey(req.route, &req.subject) {
			c.known.succeeded(requester, accountKey(req.route, &req.subject), time.Since(c.started))
		}
	}
	// Only a check is an attempt: a report of its outcome must not spend a
	// second unit of the static budget.
	spend := req.kind == requestCheck
	if !spend {
		// A report or abandon is owed whatever became of the caller's
		// request: only the client's timeout bounds it.
		ctx, cancellable = context.Background(), false
	} else if err := ctx.Err(); err != nil {
		// A request already given up: never proceeds, spends nothing,
		// unless its deadline passed in an outage (deadlineKind).
		kind := callerEndedKind(err)
		if kind == ErrDeadline {
			kind = c.deadlineKind()
		}
		return c.unavailable(req.route, &CallError{Kind: kind, Err: err}, spend)
	}
	var burst *burstGuard
	if spend {
		burst = c.bursts.enter(req.route, &req.subject)
		// Deferred, so that a panic in the call cannot leave it waiting.
		defer burst.leave()
	}
	resp, err := c.call(ctx, cancellable, req)
	// Busy stops a login only in a burst on its account: a lone user's
	// timeout during a flood on others is an outage for the fail policy.
	// Parallel checks on one account from one address (and one
	// X-Forwarded-For, as behind a proxy every address is the proxy's) are
	// a guesser's, refused for as long as they last. A user who has logged
	// in from this address through this client is refused as busy in a
	// burst on her account that is not her own (others' checks, from other
	// addresses) for at most BusyMax in a window of 120 x BusyMax, so
	// nobody can keep her out by checking her account; past that her
	// timeout follows the policy. Anyone else in a burst on the account (a
	// guesser's other addresses, a botnet) stays busy: a late guess that
	// failed open would be admitted with no check at all.
	if err != nil && err.Kind == ErrBusy && !c.staysBusy(burst) {
		err.Kind = ErrTimeout
	}
	switch {
	case err != nil:
		return c.unavailable(req.route, err, spend)
	case resp.verdict != nil:
		return Answer{Kind: AnswerVerdict, Verdict: resp.verdict}
	default:
		return Answer{Kind: AnswerRejected, Rejected: resp.errorReply}
	}
}

// staysBusy: whether a busy timeout of the check burst guards is refused
// as busy (else it is a plain timeout). The window is asked only for a
// known requester in a burst not its own, so neither a guesser's own
// bursts nor an unknown requester ever start one.
func (c *Client) staysBusy(burst *burstGuard) bool {
	if burst == nil {
		return false
	}
	if burst.ownBurst() {
		return true
	}
	if !burst.inBurst() {
		return false
	}
	now := time.Since(c.started)
	return !c.known.known(burst.requester, now) || c.busy.excused(burst.requester, now, c.cfg.BusyMax)
}

// unavailable applies the route's fail policy; for a closed route, whether
// the static budget has room (spent from only when spend).
func (c *Client) unavailable(route string, err *CallError, spend bool) Answer {
	policy, ok := c.cfg.FailPolicies[route]
	if !ok {
		policy = c.cfg.DefaultFailPolicy
	}
	within := false
	// A busy daemon is not an outage, nor is a check its caller ended an
	// attempt: the budget is not spent on them.
	if spec, ok := c.budgets[route]; ok && policy == Closed && !err.neverProceeds() {
		c.budgetMu.Lock()
		decision, after := gcraDecide(spec, c.budgetTats[route], c.nowUs(), spend)
		c.budgetTats[route] = after
		c.budgetMu.Unlock()
		within = decision.allowed
	}
	return Answer{Kind: AnswerUnavailable, Policy: policy, Err: err, WithinStaticBudget: within}
}

func (c *Client) nowUs() uint64 { return uint64(time.Since(c.started)/time.Microsecond) + 1 }

func callerEndedKind(ctxErr error) ErrorKind {
	if errors.Is(ctxErr, context.DeadlineExceeded) {
		return ErrDeadline
	}
	return ErrCanceled
}

// call is one request and its reply, with the busy rule's bookkeeping.
// Its deadline is the context's if sooner, else now + the client's
// Timeout; only the client's own Timeout running out is the daemon late.
func (c *Client) call(ctx context.Context, cancellable bool, req *request) (*response, *CallError) {
	deadline, callersDeadline := time.Now().Add(c.cfg.Timeout), false
	if cd, ok := ctx.Deadline(); ok && cd.Before(deadline) {
		deadline, callersDeadline = cd, true
	}
	resp, err := c.callUntimed(ctx, cancellable, deadline, req)
	// Whatever error a call that ran into its caller's deadline got (a read
	// or a dial out of time, a connection it cut), the caller ended it.
	cutByCaller := err != nil && callersDeadline && (ctx.Err() != nil || !time.Now().Before(deadline))
	if cutByCaller {
		// Not late by the client's own Timeout: it neither starts nor
		// extends the run, or tiny deadlines alone would age a run past
		// BusyMax and fail open against a healthy daemon.
		err.Kind = c.deadlineKind()
	} else if err == nil {
		c.lateMu.Lock()
		now := c.nowUs()
		c.lastAnswered.Store(now)
		// A timely answer busy_max after the run's last timeout ends the
		// run (quiet gaps alone do not: a frozen daemon's sparse calls are
		// one run that grows old). A reply heard late never ends it.
		if c.lateRun[1] != 0 && now-c.lateRun[1] >= uint64(c.cfg.BusyMax/time.Microsecond) {
			c.lateRun[1] = 0
		}
		c.lateMu.Unlock()
	} else if err.Kind == ErrTimeout {
		// The time is read under the lock: read before it, another call
		// could start the run after this one's instant.
		c.lateMu.Lock()
		now := c.nowUs()
		c.joinRun(now)
		busy := c.busyAt(now, c.lateRun)
		c.lateMu.Unlock()
		if busy {
			err.Kind = ErrBusy
		}
	}
	// Cancelled on the way (also Begin's, which is not aborted by it: a
	// timeout of the client's own before that still counted as late).
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		err.Kind = ErrCanceled
	}
	return resp, err
}

func (c *Client) callUntimed(ctx context.Context, cancellable bool, deadline time.Time, req *request) (*response, *CallError) {
	watch := &cancelWatch{}
	if cancellable && ctx.Done() != nil {
		if ctx.Err() == context.Canceled {
			return nil, &CallError{Kind: ErrCanceled, Err: ctx.Err()}
		}
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			select {
			case <-ctx.Done():
				// A context deadline is already the connection's deadline.
				if ctx.Err() == context.Canceled {
					watch.cancel()
				}
			case <-stop:
			}
		}()
	}
	c.poolMu.Lock()
	var pooled *conn
	if n := len(c.idle); n > 0 {
		pooled, c.idle = c.idle[n-1], c.idle[:n-1]
	}
	c.poolMu.Unlock()
	if pooled != nil {
		resp, err := c.callOn(pooled, deadline, watch, req)
		// A pooled connection the daemon closed while it sat idle (or a
		// restarted daemon): nothing was read, so ask once more on a fresh one.
		if err == nil || err.Kind != ErrIO || !isClosed(err.Err) {
			return resp, err
		}
	}
	cn, err := c.connect(deadline, watch)
	if err != nil {
		return nil, err
	}
	return c.callOn(cn, deadline, watch, req)
}

// callOn is one exchange; the connection goes back to the pool only if it
// ended cleanly (after any error or timeout its state is unknown: closed).
func (c *Client) callOn(cn *conn, deadline time.Time, watch *cancelWatch, req *request) (*response, *CallError) {
	watch.use(cn)
	resp, err := c.exchange(cn, deadline, req)
	// A daemon older than the connection's version refuses it in version
	// 1's bytes: ask again one version lower, each step once per connection.
	for err == nil && cn.version > ProtocolVersionMin && refusesVersion(resp) {
		cn.version--
		resp, err = c.exchange(cn, deadline, req)
	}
	if err != nil {
		// Let the connection go before a listener may take it: a cancel
		// coming later must not cut the listener's wait short.
		watch.detach()
		if err.Kind == ErrTimeout && watch.wasCanceled() {
			err.Kind = ErrCanceled
		}
		if err.Kind == ErrTimeout && cn.replyOwed {
			c.listenLate(cn)
		} else {
			cn.c.Close()
		}
		return nil, err
	}
	watch.detach()
	c.poolMu.Lock()
	keep := !c.closed && len(c.idle) < PoolConnectionsMax
	if keep {
		c.idle = append(c.idle, cn)
	}
	c.poolMu.Unlock()
	if !keep {
		cn.c.Close()
	}
	return resp, nil
}

func refusesVersion(r *response) bool {
	return r.version == 1 && r.errorReply != nil && r.errorReply.Code == CodeUnsupportedVersion
}

// exchange writes the request in the connection's version and reads its reply.
func (c *Client) exchange(cn *conn, deadline time.Time, req *request) (*response, *CallError) {
	id := c.nextID.Add(1)
	cn.buf = encodeRequest(cn.buf[:0], cn.version, id, req)
	if err := cn.c.SetDeadline(deadline); err != nil {
		return nil, ioError(err)
	}
	if _, err := cn.c.Write(cn.buf); err != nil {
		return nil, ioError(err)
	}
	// Written whole: the daemon will answer it, however late.
	cn.replyOwed = true
	if c.afterWrite != nil {
		c.afterWrite()
	}
	payload, rerr := cn.readReply()
	if rerr != nil {
		return nil, rerr
	}
	cn.replyOwed = false
	resp, err := decodeResponse(payload)
	if err != nil {
		return nil, &CallError{Kind: ErrProtocol, Err: err}
	}
	// Id 0 is the daemon's reply to a frame it could not read at all.
	if resp.id != id && !(resp.id == 0 && resp.errorReply != nil) {
		return nil, &CallError{Kind: ErrProtocol, Err: fmt.Errorf("reply id %d for request %d", resp.id, id)}
	}
	return resp, nil
}

// Socket is the daemon's socket path this client connects to.
func (c *Client) Socket() string { return c.cfg.Socket }
