package tollgate

// A daemon kept late for every call is busy, not down: the client keeps
// listening on a timed-out connection and counts a reply that comes after
// the deadline, on at most LateListenersMax connections at once.

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

const (
	// lateTimeout is the client's timeout in these tests; lateBy, how long
	// after its request a late daemon answers (past the timeout, well
	// within lateBusyMax).
	lateTimeout = 30 * time.Millisecond
	lateBy      = 80 * time.Millisecond
	lateBusyMax = 400 * time.Millisecond
)

// lateDaemon answers in time until late is set, then each request lateBy
// after it came, and nothing at all to requests that come once silent is
// set.
type lateDaemon struct {
	*fakeDaemon
	late, silent atomic.Bool
}

func startLateDaemon(t *testing.T) (*lateDaemon, *Client) {
	d := &lateDaemon{}
	d.fakeDaemon = startFake(t, func(version uint8, id uint64, _ uint32) []byte {
		if d.silent.Load() {
			return nil
		}
		if d.late.Load() {
			time.Sleep(lateBy)
		}
		return frameOf(version, id, verdictBody(version, Deny))
	})
	c := fakeClient(t, d.fakeDaemon, func(cfg *Config) {
		cfg.Timeout = lateTimeout
		cfg.BusyMax = lateBusyMax
	})
	if a := c.Check(context.Background(), "login", alice); a.Kind != AnswerVerdict {
		t.Fatalf("answered in time: %+v", a)
	}
	return d, c
}

// lateForLonger makes the daemon late and keeps lone users checking, one
// after another, until its first timeout is older than BusyMax: a lone
// user's timeout is a plain one, and proceeds on login.
func lateForLonger(t *testing.T, d *lateDaemon, c *Client) {
	t.Helper()
	d.late.Store(true)
	var runBegan time.Time
	for i := 0; runBegan.IsZero() || time.Since(runBegan) < lateBusyMax+50*time.Millisecond; i++ {
		a := c.Check(context.Background(), "login", Subject{Account: Some("lone" + strconv.Itoa(i))})
		if a.Err == nil || a.Err.Kind != ErrTimeout || !a.Proceeds() {
			t.Fatalf("a lone user's late check %d: %+v", i, a)
		}
		if runBegan.IsZero() {
			runBegan = time.Now()
		}
	}
}

// The daemon answers every call, each after the deadline, for longer than
// BusyMax: nothing came in time within BusyMax, but the replies heard late
// show it alive. A guesser's burst on one account is busy and does not
// proceed, and so is a check its caller's deadline cut.
func TestADaemonLateForEveryCallPastBusyMaxIsBusy(t *testing.T) {
	d, c := startLateDaemon(t)
	lateForLonger(t, d, c)
	for _, a := range together(c, 2, alice) {
		if a.Err == nil || a.Err.Kind != ErrBusy || a.Proceeds() {
			t.Fatalf("a burst on one account, replies heard late within BusyMax: %+v", a.Err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
	defer cancel()
	if a := c.Check(ctx, "login", Subject{Account: Some("short")}); a.Err == nil || a.Err.Kind != ErrDeadline || a.Proceeds() {
		t.Fatalf("the caller's deadline, replies heard late within BusyMax: %+v", a.Err)
	}
	// A reply heard late is no answer in time: it does not end the run
	// (though a timeout after it starts the run anew).
	c.lateMu.Lock()
	run := c.lateRun
	c.lateMu.Unlock()
	if run[1] == 0 {
		t.Fatalf("the run ended: %v", run)
	}
}

// The daemon answered late, then stops answering: a burst is busy while
// its last late reply is younger than BusyMax, and an outage (login
// proceeds) once that reply is older and the run it started is too.
func TestADaemonSilentPastBusyMaxAfterLateRepliesIsAnOutage(t *testing.T) {
	d, c := startLateDaemon(t)
	lateForLonger(t, d, c)
	d.silent.Store(true)
	// The replies still owed when it fell silent come within lateBy. One
	// heard after a timeout would start the run anew at the next timeout.
	time.Sleep(lateBy + 20*time.Millisecond)
	for _, a := range together(c, 2, alice) {
		if a.Err == nil || a.Err.Kind != ErrBusy || a.Proceeds() {
			t.Fatalf("silent, a reply heard late just before: %+v", a.Err)
		}
	}
	time.Sleep(lateBusyMax + 100*time.Millisecond)
	for _, a := range together(c, 2, alice) {
		if a.Err == nil || a.Err.Kind != ErrTimeout || !a.Proceeds() {
			t.Fatalf("silent for longer than BusyMax: an outage: %+v", a.Err)
		}
	}
}

// Load from elsewhere keeps the daemon late while this client is quiet for
// longer than BusyMax after a lone late check whose reply it heard. Then a
// guesser's burst times out before any of its own late replies come: the
// run, the last answer in time and the last late reply are all older than
// BusyMax, but the reply heard after the run's last timeout starts a new
// run, so the burst is busy and does not proceed.
func TestABurstAfterAQuietGapIsBusyWhenALateReplyWasHeardAfterTheRun(t *testing.T) {
	d, c := startLateDaemon(t)
	d.late.Store(true)
	if a := c.Check(context.Background(), "login", Subject{Account: Some("lone")}); a.Err == nil || a.Err.Kind != ErrTimeout || !a.Proceeds() {
		t.Fatalf("a lone user's late check: %+v", a)
	}
	for give := time.Now().Add(2 * time.Second); c.lastHeard.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(give) {
			t.Fatal("the lone check's late reply was not heard")
		}
	}
	// No calls at all for longer than BusyMax.
	time.Sleep(lateBusyMax + 50*time.Millisecond)
	// A check its caller's short deadline cuts (a gRPC grpc-timeout the
	// attacker sets) is no outage either: it never proceeds.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
	defer cancel()
	if a := c.Check(ctx, "login", Subject{Account: Some("short")}); a.Err == nil || a.Err.Kind != ErrDeadline || a.Proceeds() {
		t.Fatalf("a check cut by its caller after a quiet gap, a late reply heard after the run: %+v", a)
	}
	for _, a := range together(c, 2, alice) {
		if a.Err == nil || a.Err.Kind != ErrBusy || a.Proceeds() {
			t.Fatalf("a burst after a quiet gap, a late reply heard after the run: %+v", a.Err)
		}
	}
}

// More timed-out calls at once than LateListenersMax: only that many
// connections stay open, each until BusyMax (here, until Close).
func TestLateListenersAreCapped(t *testing.T) {
	f := startFake(t, func(uint8, uint64, uint32) []byte { return nil })
	c := fakeClient(t, f, func(cfg *Config) {
		cfg.Timeout = lateTimeout
		cfg.BusyMax = time.Minute
	})
	subjects := make([]Subject, 2*LateListenersMax+8)
	for i := range subjects {
		subjects[i] = Subject{Account: Some("user" + strconv.Itoa(i))}
	}
	for _, a := range at(c, subjects...) {
		if a.Err == nil || a.Err.Kind != ErrTimeout {
			t.Fatalf("%+v", a.Err)
		}
	}
	open := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.open
	}
	// The connections closed at once reach the daemon a moment later.
	waitFor := func(want int) {
		t.Helper()
		for give := time.Now().Add(2 * time.Second); open() != want && time.Now().Before(give); {
			time.Sleep(5 * time.Millisecond)
		}
		if got := open(); got != want {
			t.Fatalf("%d connections open, want %d", got, want)
		}
	}
	waitFor(LateListenersMax)
	f.mu.Lock()
	conns := f.conns
	f.mu.Unlock()
	c.poolMu.Lock()
	listening := len(c.listening)
	c.poolMu.Unlock()
	if conns != len(subjects) || listening != LateListenersMax {
		t.Fatalf("%d connections for %d calls, %d listening", conns, len(subjects), listening)
	}
	c.Close()
	waitFor(0)
}
