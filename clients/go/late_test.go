package tollgate

// A late daemon is never a gone one, a check its caller ended never
// proceeds, and the guard's report carries the check's tag.

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// answerOnce answers one check on path and goes away (closing the
// connection), so a client has heard from the daemon and pools nothing usable.
func answerOnce(t *testing.T, path string) <-chan struct{} {
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer ln.Close()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var header [4]byte
		if _, err := io.ReadFull(c, header[:]); err != nil {
			return
		}
		payload := make([]byte, binary.LittleEndian.Uint32(header[:]))
		if _, err := io.ReadFull(c, payload); err != nil {
			return
		}
		c.Write(frameOf(payload[0], binary.LittleEndian.Uint64(payload[1:9]), verdictBody(payload[0], Allow)))
	}()
	return done
}

// stalledListener listens on path with a backlog of 1 and never accepts;
// connections fill its queue until connecting fails with EAGAIN.
func stalledListener(t *testing.T, path string) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 1); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		c, err := net.Dial("unix", path)
		if errors.Is(err, syscall.EAGAIN) {
			return
		}
		if err != nil || i == 64 {
			t.Fatalf("filling the queue: %v after %d", err, i)
		}
		t.Cleanup(func() { c.Close() })
	}
}

func TestAFullAcceptQueueIsALateDaemonNotAGoneOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.sock")
	answered := answerOnce(t, path)
	c := fakeClient(t, &fakeDaemon{path: path}, nil)
	if a := c.Check(context.Background(), "login", alice); a.Kind != AnswerVerdict {
		t.Fatalf("%+v", a)
	}
	<-answered
	stalledListener(t, path)

	// A lone user's check: a timeout (an outage for the policy), not connect.
	if a := c.Check(context.Background(), "login", Subject{Account: Some("lone")}); a.Err == nil || a.Err.Kind != ErrTimeout {
		t.Fatalf("a full queue, alone: %+v", a)
	}
	// An overlapped pair on one account: busy, neither proceeds.
	var arrived sync.WaitGroup
	arrived.Add(2)
	c.beforeConnect = func() { arrived.Done(); arrived.Wait() }
	answers := make([]Answer, 2)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			answers[i] = c.Check(context.Background(), "login", alice)
		}(i)
	}
	wg.Wait()
	for _, a := range answers {
		if a.Err == nil || a.Err.Kind != ErrBusy || a.Proceeds() {
			t.Fatalf("a full queue, a burst on one account: %+v", a)
		}
	}
}

func TestNoSocketOrNobodyListeningIsConnect(t *testing.T) {
	dir := t.TempDir()
	refusing := filepath.Join(dir, "bound.sock")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: refusing}); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "none.sock"), refusing} {
		c := fakeClient(t, &fakeDaemon{path: path}, nil)
		if a := c.Check(context.Background(), "login", alice); a.Err == nil || a.Err.Kind != ErrConnect || !a.Proceeds() {
			t.Fatalf("%s: %+v", path, a)
		}
	}
}

func TestADialOutOfTimeIsATimeout(t *testing.T) {
	f := startFake(t, func(version uint8, id uint64, _ uint32) []byte {
		return frameOf(version, id, verdictBody(version, Allow))
	})
	// The client's own timeout passes before the dial: net's "i/o timeout".
	c := fakeClient(t, f, func(cfg *Config) { cfg.Timeout = time.Nanosecond })
	if a := c.Check(context.Background(), "login", alice); a.Err == nil || a.Err.Kind != ErrTimeout {
		t.Fatalf("%+v", a)
	}
}

func TestTheCallersDeadlineNeverProceeds(t *testing.T) {
	// A locked account: every answer is deny, every other one a little
	// late, so deadlines run out while dialling and while reading.
	f := startFake(t, func(version uint8, id uint64, _ uint32) []byte {
		if id%2 == 0 {
			time.Sleep(100 * time.Microsecond)
		}
		return frameOf(version, id, verdictBody(version, Deny))
	})
	c := fakeClient(t, f, func(cfg *Config) { cfg.Timeout = time.Second })
	ended := 0
	for i := 0; i < 600; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(20+i%40)*time.Microsecond)
		a := c.Check(ctx, "login", alice)
		cancel()
		if a.Proceeds() {
			t.Fatalf("check %d on a locked account proceeded: %+v", i, a.Err)
		}
		if a.Kind == AnswerUnavailable {
			if a.Err.Kind != ErrDeadline {
				t.Fatalf("check %d: %+v", i, a.Err)
			}
			ended++
		}
	}
	if ended < 100 {
		t.Fatalf("only %d of 600 deadlines ran out", ended)
	}
	c.lateMu.Lock()
	run := c.lateRun
	c.lateMu.Unlock()
	if run != [2]uint64{} {
		t.Fatalf("the caller's deadline counted as the daemon late: %v", run)
	}

	// On the wire, a closed route: no static budget spent on it.
	silent := startFake(t, func(uint8, uint64, uint32) []byte { return nil })
	s := fakeClient(t, silent, func(cfg *Config) {
		cfg.Timeout = 60 * time.Millisecond
		cfg.StaticBudgets["password_reset"] = StaticBudget{Limit: 1, Period: time.Hour, Burst: 1}
	})
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		a := s.Check(ctx, "password_reset", alice)
		cancel()
		if a.Err == nil || a.Err.Kind != ErrDeadline || a.Proceeds() || a.WithinStaticBudget {
			t.Fatalf("%+v", a)
		}
	}
	// Begin's check is cut by the deadline too, and never proceeds.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if attempt := s.Begin(ctx, "login", Subject{Account: Some("bob")}, nil); attempt.Proceeds() || attempt.Answer().Err.Kind != ErrDeadline {
		t.Fatalf("%+v", attempt.Answer().Err)
	}
	// The client's own timeout is an outage, and the budget is still whole.
	if a := s.Check(context.Background(), "password_reset", alice); a.Err == nil || a.Err.Kind != ErrTimeout || !a.WithinStaticBudget {
		t.Fatalf("%+v", a)
	}
}

func TestALateCancelLeavesAPooledConnectionAlone(t *testing.T) {
	// Replies come a little late, so a read whose deadline was set in the
	// past finds nothing yet.
	f := startFake(t, func(version uint8, id uint64, _ uint32) []byte {
		time.Sleep(20 * time.Millisecond)
		return frameOf(version, id, verdictBody(version, Deny))
	})
	c := fakeClient(t, f, func(cfg *Config) { cfg.Timeout = time.Second })
	deadline := time.Now().Add(time.Second)
	first := &cancelWatch{}
	cn, err := c.connect(deadline, first)
	if err != nil {
		t.Fatal(err)
	}
	req := &request{kind: requestCheck, route: "login", subject: alice}
	if _, err := c.callOn(cn, deadline, first, req); err != nil {
		t.Fatal(err)
	}
	// The first call's watcher fires late, while the next call has the
	// connection from the pool.
	c.afterWrite = func() { first.cancel() }
	if a := c.Check(context.Background(), "login", alice); a.Kind != AnswerVerdict || a.Proceeds() {
		t.Fatalf("a late cancel broke the next call: %+v", a.Err)
	}
	if f.conns != 1 {
		t.Fatalf("%d connections: the pooled one was used", f.conns)
	}
}

func TestTheGuardsReportCarriesTheChecksTag(t *testing.T) {
	f := startFake(t, func(version uint8, id uint64, _ uint32) []byte {
		return frameOf(version, id, verdictBody(version, Allow))
	})
	key := [32]byte{7}
	c := fakeClient(t, f, func(cfg *Config) { cfg.PasswordKey = &key })
	ctx := context.Background()
	password, other := "hunter2", "swordfish"
	// The report's tag is the payload's last field: 0, or 1 and 16 bytes.
	lastTag := func(digest bool) []byte {
		t.Helper()
		f.mu.Lock()
		p := f.payloads[len(f.payloads)-1]
		f.mu.Unlock()
		untagged := &request{kind: requestReport, route: "login", subject: alice, outcome: Failure}
		if digest {
			untagged.digest = &[16]byte{}
		}
		switch bare := len(encodeRequest(nil, ProtocolVersion, 0, untagged)) - frameHeaderBytes; {
		case binary.LittleEndian.Uint32(p[9:13]) != requestReport:
			t.Fatalf("not a report: %x", p)
		case len(p) == bare && p[bare-1] == 0:
			return nil
		case len(p) != bare+16 || p[bare-1] != 1:
			t.Fatalf("a report of %d bytes, want %d or %d", len(p), bare, bare+16)
		}
		return p[len(p)-16:]
	}
	want := func(what string, digest bool, tag [16]byte) {
		t.Helper()
		if got := lastTag(digest); string(got) != string(tag[:]) {
			t.Fatalf("%s: tag %x, want %x", what, got, tag)
		}
	}
	attempt := c.Begin(ctx, "login", alice, &password)
	attempt.Report(ctx, Failure, nil)
	want("report without a password", false, PasswordTag(&key, password))
	attempt = c.Begin(ctx, "login", alice, &password)
	attempt.ReportAs(ctx, alice, Failure, nil)
	want("report as, without a password", false, PasswordTag(&key, password))
	attempt = c.Begin(ctx, "login", alice, &password)
	attempt.Report(ctx, Failure, &other)
	want("a given password wins", true, PasswordTag(&key, other))
	attempt = c.Begin(ctx, "login", alice, nil)
	attempt.Report(ctx, Failure, nil)
	if got := lastTag(false); got != nil {
		t.Fatalf("no password anywhere: tag %x", got)
	}
}

// exhaustDescriptors lowers this process's descriptor limit and fills it,
// so creating a socket fails with EMFILE until the test ends; the refill it
// returns takes any descriptor freed since (earlier tests' connections
// closing late).
func exhaustDescriptors(t *testing.T) (refill func()) {
	var saved syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &saved); err != nil {
		t.Fatal(err)
	}
	lowered := saved
	lowered.Cur = 256
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lowered); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var fds []int
	t.Cleanup(func() {
		for _, fd := range fds {
			syscall.Close(fd)
		}
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &saved)
	})
	refill = func() {
		mu.Lock()
		defer mu.Unlock()
		for {
			fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
			if errors.Is(err, syscall.EMFILE) {
				return
			}
			if err != nil || len(fds) > 256 {
				t.Errorf("filling the descriptor table: %v after %d", err, len(fds))
				return
			}
			fds = append(fds, fd)
		}
	}
	refill()
	return refill
}

func TestRunningOutOfDescriptorsIsALateDaemonNotAGoneOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.sock")
	answered := answerOnce(t, path)
	c := fakeClient(t, &fakeDaemon{path: path}, nil)
	if a := c.Check(context.Background(), "login", alice); a.Kind != AnswerVerdict {
		t.Fatalf("%+v", a)
	}
	<-answered
	// The pooled connection the daemon closed goes first: closed during
	// the next check, it would free a descriptor for that check's socket.
	if a := c.Check(context.Background(), "login", Subject{Account: Some("first")}); a.Err == nil || a.Err.Kind != ErrConnect {
		t.Fatalf("%+v", a)
	}
	refill := exhaustDescriptors(t)
	c.beforeConnect = refill

	// A lone user's check: a timeout (an outage for the policy), not connect.
	if a := c.Check(context.Background(), "login", Subject{Account: Some("lone")}); a.Err == nil || a.Err.Kind != ErrTimeout || !errors.Is(a.Err, syscall.EMFILE) {
		t.Fatalf("no descriptors, alone: %+v", a.Err)
	}
	// A burst on one locked account: busy, none proceeds.
	var arrived sync.WaitGroup
	arrived.Add(2)
	c.beforeConnect = func() { arrived.Done(); arrived.Wait(); refill() }
	answers := make([]Answer, 2)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			answers[i] = c.Check(context.Background(), "login", alice)
		}(i)
	}
	wg.Wait()
	for _, a := range answers {
		if a.Err == nil || a.Err.Kind != ErrBusy || a.Proceeds() {
			t.Fatalf("no descriptors, a burst on one account: %+v", a.Err)
		}
	}
}

func TestOnlyAGoneOrForbiddenSocketIsConnect(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.ENOENT, syscall.ECONNREFUSED, syscall.EACCES} {
		if k := connectError("s", &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", errno)}).Kind; k != ErrConnect {
			t.Errorf("%v: %v", errno, k)
		}
	}
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.EAGAIN, syscall.EINVAL} {
		if k := connectError("s", &net.OpError{Op: "dial", Err: os.NewSyscallError("socket", errno)}).Kind; k != ErrTimeout {
			t.Errorf("%v: %v", errno, k)
		}
	}
}

func TestTheCallersDeadlineProceedsOnlyInAnOutage(t *testing.T) {
	var frozen atomic.Bool
	f := startFake(t, func(version uint8, id uint64, _ uint32) []byte {
		if frozen.Load() {
			return nil
		}
		return frameOf(version, id, verdictBody(version, Deny))
	})
	c := fakeClient(t, f, func(cfg *Config) {
		cfg.Timeout = 20 * time.Millisecond
		cfg.BusyMax = 150 * time.Millisecond
	})
	short := func() Answer {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
		defer cancel()
		return c.Check(ctx, "login", Subject{Account: Some("lone")})
	}
	if a := c.Check(context.Background(), "login", alice); a.Kind != AnswerVerdict {
		t.Fatalf("%+v", a)
	}
	frozen.Store(true)
	// No run of the client's own timeouts yet: the caller's doing.
	if a := short(); a.Err == nil || a.Err.Kind != ErrDeadline || a.Proceeds() {
		t.Fatalf("no run: %+v", a.Err)
	}
	// A run begins, and while it is young the deadline still never proceeds.
	if a := c.Check(context.Background(), "login", Subject{Account: Some("other")}); a.Err == nil || a.Err.Kind != ErrTimeout {
		t.Fatalf("%+v", a.Err)
	}
	if a := short(); a.Err == nil || a.Err.Kind != ErrDeadline || a.Proceeds() {
		t.Fatalf("a young run: %+v", a.Err)
	}
	// Late for longer than BusyMax: an outage, and login fails open.
	time.Sleep(160 * time.Millisecond)
	if a := short(); a.Err == nil || a.Err.Kind != ErrTimeout || !a.Proceeds() {
		t.Fatalf("an old run: %+v", a.Err)
	}
	gone, cancel := context.WithTimeout(context.Background(), -time.Second)
	defer cancel()
	if a := c.Check(gone, "login", alice); a.Err == nil || a.Err.Kind != ErrTimeout || !a.Proceeds() {
		t.Fatalf("an old run, a deadline already past: %+v", a.Err)
	}

	// A daemon never heard from: tiny deadlines alone never proceed; once
	// the client's own timeout ran out on it, they are an outage.
	silent := startFake(t, func(uint8, uint64, uint32) []byte { return nil })
	s := fakeClient(t, silent, func(cfg *Config) { cfg.Timeout = 20 * time.Millisecond })
	ctx, cancel2 := context.WithTimeout(context.Background(), 2*time.Millisecond)
	defer cancel2()
	if a := s.Check(ctx, "login", alice); a.Err == nil || a.Err.Kind != ErrDeadline || a.Proceeds() {
		t.Fatalf("never answered, no run: %+v", a.Err)
	}
	if a := s.Check(context.Background(), "login", alice); a.Err == nil || a.Err.Kind != ErrTimeout {
		t.Fatalf("%+v", a.Err)
	}
	ctx, cancel3 := context.WithTimeout(context.Background(), 2*time.Millisecond)
	defer cancel3()
	if a := s.Check(ctx, "login", alice); a.Err == nil || a.Err.Kind != ErrTimeout || !a.Proceeds() {
		t.Fatalf("never answered, a run: %+v", a.Err)
	}
}
