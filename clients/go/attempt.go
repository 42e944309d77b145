package tollgate

// Attempt: a login attempt from its check to its outcome, which gives its
// places back when it ends without one.
//
// An allowed check holds a place on each failure rule until its report, so
// parallel guesses cannot all pass before the first failure is counted. A
// handler that never reports (the end user hung up, a deadline passed, a
// panic) would leave its place held until attempt_timeout_ms, and a
// stranger who aborts logins on purpose could keep a real user out with
// places nobody tried a password for. `defer attempt.End()` closes that.

import (
	"context"
	"errors"
	"sync"
)

// ErrAttemptEnded is Report's error for an attempt already reported,
// abandoned or ended: nothing is sent. A stray report would count a
// failure twice, or settle another attempt's place.
var ErrAttemptEnded = errors.New("tollgate: the attempt was already reported, abandoned or ended")

// Attempt is a checked attempt, until its outcome is reported (Report,
// ReportAs) or it ends without one (End, Abandon).
type Attempt struct {
	client  *Client
	route   string
	subject Subject
	answer  Answer
	// checkTag: the check's password tag, which a report given no password
	// carries too (a failure without a tag is invisible to spray detection).
	checkTag *[16]byte

	mu sync.Mutex
	// holdsPlaces: the daemon allowed the check and nothing settled it yet.
	holdsPlaces bool
	// ended: reported, abandoned or ended; the guard sends nothing more.
	ended bool
}

// Begin checks an attempt and returns it as a guard; use it as
//
//	attempt := client.Begin(ctx, "login", subject, &password)
//	defer attempt.End()
//
// With Config.PasswordKey set and a password given, the check carries the
// password's tag. A context cancelled while the check is on the wire does
// not abort it (only a deadline does): an allowed check whose reply was
// never read could not be abandoned, and its place would stay held. But a
// check whose context is cancelled never proceeds (ErrCanceled).
func (c *Client) Begin(ctx context.Context, route string, subject Subject, password *string) *Attempt {
	tag := c.tagOf(password)
	req := &request{kind: requestCheck, route: route, subject: bounded(subject), passwordTag: tag}
	answer := c.decide(ctx, false, req)
	// Only an allowed check holds places: a delayed one gave them back,
	// and one without a verdict may never have reached the daemon (an
	// abandon would then free another attempt's place).
	holds := answer.Kind == AnswerVerdict && answer.Verdict.Decision == Allow
	return &Attempt{client: c, route: route, subject: subject, answer: answer, checkTag: tag, holdsPlaces: holds}
}

func (c *Client) tagOf(password *string) *[16]byte {
	if password == nil || c.cfg.PasswordKey == nil {
		return nil
	}
	tag := PasswordTag(c.cfg.PasswordKey, *password)
	return &tag
}

// Answer is the check's answer.
func (a *Attempt) Answer() Answer { return a.answer }

// Proceeds tells whether the attempt may go ahead (see Answer.Proceeds).
func (a *Attempt) Proceeds() bool { return a.answer.Proceeds() }

// Report sends the verified outcome, with the password's digest and tag
// when a password is given and the client has a PasswordKey; given none,
// it carries the check's tag (no digest). Call it once:
// after a report, Abandon or End it sends nothing and returns
// ErrAttemptEnded. Neither ctx's cancellation nor its deadline cuts it
// short (the client's Timeout bounds it): the verify happened, so the
// outcome must count.
func (a *Attempt) Report(ctx context.Context, outcome Outcome, password *string) (Answer, error) {
	return a.ReportAs(ctx, a.subject, outcome, password)
}

// ReportAs is Report with the subject as it stands after the verify (such
// as a device id issued at a successful sign-in); the route is the check's.
// A report refused before sending (an identifier too long: AnswerRejected)
// leaves the attempt as it was: End still gives its places back.
func (a *Attempt) ReportAs(ctx context.Context, subject Subject, outcome Outcome, password *string) (Answer, error) {
	c := a.client
	tag := c.tagOf(password)
	if tag == nil {
		tag = a.checkTag
	}
	req := &request{kind: requestReport, route: a.route, subject: bounded(subject), outcome: outcome, passwordTag: tag}
	if password != nil && c.cfg.PasswordKey != nil {
		account := ""
		if subject.Account != nil {
			account = *subject.Account
		}
		digest := PasswordDigest(c.cfg.PasswordKey, account, *password)
		req.digest = &digest
	}
	a.mu.Lock()
	if a.ended {
		a.mu.Unlock()
		return Answer{}, ErrAttemptEnded
	}
	if refused := refuseLocally(c.cfg.ProtocolVersion, req); refused != nil {
		a.mu.Unlock()
		return Answer{Kind: AnswerRejected, Rejected: refused}, nil
	}
	a.ended, a.holdsPlaces = true, false
	a.mu.Unlock()
	return c.decide(ctx, false, req), nil
}

// End ends the attempt without an outcome, as a `defer` does however the
// handler leaves: if the check was allowed and nothing was reported, it
// sends Abandon (once) and waits for the answer, within the client's
// timeout. It tells whether it sent one. After it the attempt is ended.
func (a *Attempt) End() bool {
	_, sent := a.Abandon(context.Background())
	return sent
}

// Abandon is End with the daemon's answer; sent is false (and the answer
// empty) when the attempt held no place or had ended. Like Report, ctx
// neither cancels nor shortens it (the client's Timeout bounds it).
func (a *Attempt) Abandon(ctx context.Context) (answer Answer, sent bool) {
	a.mu.Lock()
	holds := a.holdsPlaces && !a.ended
	a.holdsPlaces, a.ended = false, true
	a.mu.Unlock()
	if !holds {
		return Answer{}, false
	}
	req := &request{kind: requestAbandon, route: a.route, subject: bounded(a.subject)}
	return a.client.decide(ctx, false, req), true
}
