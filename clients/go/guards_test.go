package tollgate

// Tests of the red-team fixes: oversized requests refused before sending,
// a reply that arrived by the deadline winning over it, a cancelled
// context never letting a check proceed (while reports still go out), and
// one ended state for the guard.

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestOversizedRequestsAreRefusedBeforeSending(t *testing.T) {
	f := startFake(t, func(version uint8, id uint64, _ uint32) []byte {
		return frameOf(version, id, verdictBody(version, Allow))
	})
	c := fakeClient(t, f, func(cfg *Config) {
		cfg.FailPolicies["login"] = Closed
		cfg.StaticBudgets["login"] = StaticBudget{Limit: 1, Period: time.Hour, Burst: 1}
	})
	ctx := context.Background()
	long := strings.Repeat("x", IdentifierBytesMax+1)
	with := map[string]func(Subject) Subject{
		"account":   func(s Subject) Subject { s.Account = Some(long); return s },
		"device":    func(s Subject) Subject { s.Device = Some(long); return s },
		"tenant":    func(s Subject) Subject { s.Tenant = Some(long); return s },
		"client_id": func(s Subject) Subject { s.ClientID = Some(strings.Repeat("p", 250_000)); return s },
	}
	refused := func(what string, a Answer, code ErrorCode, field string) {
		t.Helper()
		if a.Kind != AnswerRejected || a.Rejected.Code != code || a.Proceeds() ||
			!strings.Contains(a.Rejected.Message, field) || !strings.Contains(a.Rejected.Message, "refused before sending") {
			t.Fatalf("%s: %+v %+v", what, a, a.Rejected)
		}
	}
	for field, edit := range with {
		subject := edit(alice)
		refused(field+" check", c.Check(ctx, "login", subject), CodeFieldTooLong, "`subject."+field+"`")
		refused(field+" report", c.ReportTagged(ctx, "login", subject, Failure, &[16]byte{}, &[16]byte{}), CodeFieldTooLong, field)
		refused(field+" abandon", c.Abandon(ctx, "login", subject), CodeFieldTooLong, field)
		attempt := c.Begin(ctx, "login", subject, nil)
		refused(field+" begin", attempt.Answer(), CodeFieldTooLong, field)
		if attempt.End() {
			t.Fatalf("%s: a rejected check holds nothing", field)
		}
	}
	hugeRoute := strings.Repeat("r", RequestPayloadBytesMax)
	refused("route check", c.Check(ctx, hugeRoute, alice), CodeFrameTooLarge, "16384")
	refused("route report", c.Report(ctx, hugeRoute, alice, Failure), CodeFrameTooLarge, "16384")
	refused("route abandon", c.Abandon(ctx, hugeRoute, alice), CodeFrameTooLarge, "16384")
	// X-Forwarded-For is cut to its tail, so a long one alone never refuses.
	xff := alice
	xff.ForwardedFor = Some(strings.Repeat("10.0.0.1, ", 5000) + "192.0.2.1")
	if a := c.Check(ctx, "login", xff); a.Kind != AnswerVerdict {
		t.Fatalf("a long X-Forwarded-For: %+v", a)
	}
	if got := f.requests(); len(got) != 1 {
		t.Fatalf("only the X-Forwarded-For check was sent: %v", got)
	}
	c.bursts.mu.Lock()
	entries := len(c.bursts.entries)
	c.bursts.mu.Unlock()
	// The sent check's burst key and its requester key.
	if entries != 2 {
		t.Fatalf("%d burst entries: a refused check never enters the table", entries)
	}

	// At the limits exactly, requests go out.
	limit := Some(strings.Repeat("y", IdentifierBytesMax))
	atLimit := Subject{Peer: alice.Peer, Account: limit, Device: limit, Tenant: limit, ClientID: limit}
	if a := c.Check(ctx, "login", atLimit); a.Kind != AnswerVerdict {
		t.Fatalf("512-byte identifiers: %+v", a)
	}
	tag := [16]byte{}
	probe := &request{kind: requestCheck, subject: alice, passwordTag: &tag}
	fill := RequestPayloadBytesMax - requestPayloadBytes(ProtocolVersion, probe)
	if a := c.CheckTagged(ctx, strings.Repeat("r", fill), alice, &tag); a.Kind != AnswerVerdict {
		t.Fatalf("a request of exactly %d bytes: %+v", RequestPayloadBytesMax, a)
	}
	refused("one byte over", c.CheckTagged(ctx, strings.Repeat("r", fill+1), alice, &tag), CodeFrameTooLarge, "16385")

	// The static budget was never spent by the refusals: a dead daemon's
	// first check still gets its one unit.
	dead := deadClient(t, func(cfg *Config) {
		cfg.StaticBudgets["password_reset"] = StaticBudget{Limit: 1, Period: time.Hour, Burst: 1}
	})
	for i := 0; i < 3; i++ {
		refused("dead", dead.Check(ctx, "password_reset", with["device"](alice)), CodeFieldTooLong, "device")
	}
	if a := dead.Check(ctx, "password_reset", alice); !a.WithinStaticBudget || a.Err.Kind != ErrConnect {
		t.Fatalf("the budget is untouched: %+v", a)
	}
}

func TestRequestPayloadBytesIsTheEncodedLength(t *testing.T) {
	tag, digest := [16]byte{7}, [16]byte{9}
	subjects := []Subject{
		{},
		alice,
		{Peer: netip.MustParseAddr("2001:db8::1"), ForwardedFor: Some("203.0.113.9"), Account: Some(""),
			Device: Some("d"), Tenant: Some("tenant"), ClientID: Some("client")},
	}
	for version := ProtocolVersionMin; version <= ProtocolVersion; version++ {
		for _, s := range subjects {
			for _, req := range []*request{
				{kind: requestCheck, route: "login", subject: s},
				{kind: requestCheck, route: "login", subject: s, passwordTag: &tag},
				{kind: requestReport, route: "mfa", subject: s, outcome: Failure, digest: &digest, passwordTag: &tag},
				{kind: requestReport, route: "mfa", subject: s},
				{kind: requestAbandon, route: "login", subject: s},
			} {
				if got, want := requestPayloadBytes(version, req), len(encodeRequest(nil, version, 1, req))-frameHeaderBytes; got != want {
					t.Fatalf("v%d kind %d: counted %d, encoded %d", version, req.kind, got, want)
				}
			}
		}
	}
}

func TestAReplyThatArrivedWinsOverTheDeadline(t *testing.T) {
	var mu sync.Mutex
	silent := false
	longRule := strings.Repeat("rule", 600) // past the read buffer: the last look reads on
	f := startFake(t, func(version uint8, id uint64, kind uint32) []byte {
		mu.Lock()
		defer mu.Unlock()
		if silent {
			return nil
		}
		if kind == requestReport {
			b := verdictBody(version, Allow)
			b = append(b[:len(b)-len("rule")-8-1], appendString(nil, longRule)...)
			return frameOf(version, id, append(b, 0))
		}
		return frameOf(version, id, verdictBody(version, Deny))
	})
	c := fakeClient(t, f, func(cfg *Config) { cfg.Timeout = 20 * time.Millisecond })
	// Held between the write and the read until well past the deadline:
	// the daemon's reply is in the socket by then.
	c.afterWrite = func() { time.Sleep(80 * time.Millisecond) }
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		a := c.Check(ctx, "login", alice)
		if a.Kind != AnswerVerdict || a.Verdict.Decision != Deny || a.Proceeds() {
			t.Fatalf("check %d: a verdict that arrived became %+v", i, a.Err)
		}
	}
	if a := c.Report(ctx, "login", alice, Failure); a.Kind != AnswerVerdict || a.Verdict.Rule != longRule {
		t.Fatalf("a long reply that arrived: %+v", a.Err)
	}
	// A silent daemon still times out, no later than the deadline allows.
	mu.Lock()
	silent = true
	mu.Unlock()
	c.afterWrite = nil
	started := time.Now()
	if a := c.Check(ctx, "login", Subject{Account: Some("lone")}); a.Err == nil || a.Err.Kind != ErrTimeout {
		t.Fatalf("silence: %+v", a)
	}
	if waited := time.Since(started); waited > time.Second {
		t.Fatalf("silence took %v", waited)
	}
}

func TestACancelledCheckNeverProceeds(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancelExpired := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancelExpired()
	dead := deadClient(t, func(cfg *Config) {
		cfg.StaticBudgets["password_reset"] = StaticBudget{Limit: 1, Period: time.Hour, Burst: 1}
	})
	for ctx, kind := range map[context.Context]ErrorKind{cancelled: ErrCanceled, expired: ErrDeadline} {
		for _, route := range []string{"login", "password_reset", "no_such_route"} {
			a := dead.Check(ctx, route, alice)
			if a.Proceeds() || a.Kind != AnswerUnavailable || a.Err.Kind != kind || a.WithinStaticBudget {
				t.Fatalf("%s: %+v", route, a)
			}
			if attempt := dead.Begin(ctx, route, alice, nil); attempt.Proceeds() {
				t.Fatalf("begin %s: %+v", route, attempt.Answer())
			}
		}
	}
	if a := dead.Check(context.Background(), "password_reset", alice); !a.WithinStaticBudget {
		t.Fatal("cancelled checks spend no static budget")
	}

	// Cancelled while on the wire: Begin's check is not aborted, but it
	// does not proceed either.
	silent := startFake(t, func(uint8, uint64, uint32) []byte { return nil })
	slow := fakeClient(t, silent, func(cfg *Config) { cfg.Timeout = 100 * time.Millisecond })
	ctx, cancelSoon := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancelSoon)
	if attempt := slow.Begin(ctx, "login", alice, nil); attempt.Proceeds() || attempt.Answer().Err.Kind != ErrCanceled {
		t.Fatalf("begin cancelled on the wire: %+v", attempt.Answer().Err)
	}
}

func TestReportsAndAbandonsIgnoreTheCallersContext(t *testing.T) {
	f := startFake(t, func(version uint8, id uint64, _ uint32) []byte {
		return frameOf(version, id, verdictBody(version, Allow))
	})
	c := fakeClient(t, f, nil)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancelExpired := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancelExpired()
	for _, ctx := range []context.Context{cancelled, expired} {
		if a := c.Report(ctx, "login", alice, Failure); a.Kind != AnswerVerdict {
			t.Fatalf("report: %+v", a.Err)
		}
		if a := c.Abandon(ctx, "login", alice); a.Kind != AnswerVerdict {
			t.Fatalf("abandon: %+v", a.Err)
		}
		attempt := c.Begin(context.Background(), "login", alice, nil)
		if a, err := attempt.Report(ctx, Failure, nil); err != nil || a.Kind != AnswerVerdict {
			t.Fatalf("the guard's report: %+v %v", a.Err, err)
		}
		abandoned := c.Begin(context.Background(), "login", alice, nil)
		if a, sent := abandoned.Abandon(ctx); !sent || a.Kind != AnswerVerdict {
			t.Fatalf("the guard's abandon: %+v", a.Err)
		}
	}
	want := []uint32{1, 8, 0, 1, 0, 8, 1, 8, 0, 1, 0, 8}
	got := f.requests()
	if len(got) != len(want) {
		t.Fatalf("requests %v, want kinds %v", got, want)
	}
	for i := range want {
		if got[i][1] != want[i] {
			t.Fatalf("requests %v, want kinds %v", got, want)
		}
	}
}

func TestTheGuardSendsNothingAfterItEnded(t *testing.T) {
	var mu sync.Mutex
	decision := Allow
	f := startFake(t, func(version uint8, id uint64, _ uint32) []byte {
		mu.Lock()
		defer mu.Unlock()
		return frameOf(version, id, verdictBody(version, decision))
	})
	c := fakeClient(t, f, nil)
	ctx := context.Background()
	ended := func(what string, a *Attempt) {
		t.Helper()
		if _, err := a.Report(ctx, Failure, nil); !errors.Is(err, ErrAttemptEnded) {
			t.Fatalf("%s: report: %v", what, err)
		}
		if _, err := a.ReportAs(ctx, alice, Success, nil); !errors.Is(err, ErrAttemptEnded) {
			t.Fatalf("%s: report as: %v", what, err)
		}
		if _, sent := a.Abandon(ctx); sent || a.End() {
			t.Fatalf("%s: abandon", what)
		}
	}
	twice := c.Begin(ctx, "login", alice, nil)                 // 0
	if _, err := twice.Report(ctx, Failure, nil); err != nil { // 1
		t.Fatal(err)
	}
	ended("reported", twice)
	afterEnd := c.Begin(ctx, "login", alice, nil) // 0
	afterEnd.End()                                // 8
	ended("ended", afterEnd)
	afterAbandon := c.Begin(ctx, "login", alice, nil) // 0
	afterAbandon.Abandon(ctx)                         // 8
	ended("abandoned", afterAbandon)
	mu.Lock()
	decision = Deny
	mu.Unlock()
	denied := c.Begin(ctx, "login", alice, nil) // 0
	denied.End()
	ended("denied and ended", denied)
	mu.Lock()
	decision = Allow
	mu.Unlock()
	// A report refused before sending leaves the attempt as it was.
	kept := c.Begin(ctx, "login", alice, nil) // 0
	long := alice
	long.Device = Some(strings.Repeat("d", IdentifierBytesMax+1))
	if a, err := kept.ReportAs(ctx, long, Failure, nil); err != nil || a.Kind != AnswerRejected {
		t.Fatalf("refused report: %+v %v", a, err)
	}
	if !kept.End() { // 8
		t.Fatal("an attempt whose report was refused before sending still gives its place back")
	}
	ended("refused report, then ended", kept)
	want := []uint32{0, 1, 0, 8, 0, 8, 0, 0, 8}
	got := f.requests()
	if len(got) != len(want) {
		t.Fatalf("requests %v, want kinds %v", got, want)
	}
	for i := range want {
		if got[i][1] != want[i] {
			t.Fatalf("requests %v, want kinds %v", got, want)
		}
	}
}
