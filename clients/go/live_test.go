package tollgate

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// liveDaemon starts a real daemon on a temp socket, or skips the test when
// there is no binary ($TOLLGATE_DAEMON, else /tmp/tollgate-daemon).
func liveDaemon(t *testing.T) string {
	binary := os.Getenv("TOLLGATE_DAEMON")
	if binary == "" {
		binary = "/tmp/tollgate-daemon"
	}
	if _, err := os.Stat(binary); err != nil {
		t.Skipf("no daemon binary at %s", binary)
	}
	dir := t.TempDir()
	socket := filepath.Join(dir, "t.sock")
	cmd := exec.Command(binary, "serve", "--socket", socket, "--state", filepath.Join(dir, "state.redb"), "--manual-clock")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for i := 0; i < 200; i++ {
		if _, err := os.Stat(socket); err == nil {
			return socket
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatal("the daemon did not start")
	return ""
}

func liveClient(t *testing.T, socket string, version uint8) *Client {
	cfg := NewConfig(socket)
	cfg.Timeout = time.Second // a debug build on a shared machine
	cfg.ProtocolVersion = version
	key := [32]byte{7}
	cfg.PasswordKey = &key
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestLiveLockoutGuardAndRejections(t *testing.T) {
	socket := liveDaemon(t)
	c := liveClient(t, socket, ProtocolVersion)
	ctx := context.Background()

	// An abandoned attempt gives its place back: the next check sees all 5.
	attempt := c.Begin(ctx, "login", alice, Some("guess"))
	if a := attempt.Answer(); a.Kind != AnswerVerdict || a.Verdict.Remaining != 4 || a.Verdict.Version != 5 {
		t.Fatalf("%+v", a)
	}
	if !attempt.End() {
		t.Fatal("an allowed attempt is abandoned")
	}
	for i := 0; i < 5; i++ {
		attempt := c.Begin(ctx, "login", alice, Some("guess"))
		if !attempt.Proceeds() {
			t.Fatalf("attempt %d: %+v", i, attempt.Answer())
		}
		attempt.Report(ctx, Failure, Some("guess-"+string(rune('a'+i))))
		if attempt.End() {
			t.Fatal("abandoned after a report")
		}
	}
	locked := c.Begin(ctx, "login", alice, Some("guess"))
	if a := locked.Answer(); a.Proceeds() || a.Verdict.Reason != ReasonTooManyFailures || a.RetryAfterSecs() < 60 {
		t.Fatalf("locked: %+v", a.Verdict)
	}
	if locked.End() {
		t.Fatal("a refused check is not abandoned")
	}

	long := Subject{Peer: alice.Peer, Account: Some(strings.Repeat("a", 513))}
	if a := c.Check(ctx, "login", long); a.Kind != AnswerRejected || a.Rejected.Code != CodeFieldTooLong || a.Proceeds() {
		t.Fatalf("%+v", a)
	}
	if a := c.Check(ctx, "login", Subject{Peer: alice.Peer}); a.Kind != AnswerRejected || a.Rejected.Code != CodeMissingField {
		t.Fatalf("%+v", a)
	}
}

func TestLiveOlderVersions(t *testing.T) {
	socket := liveDaemon(t)
	ctx := context.Background()
	for version := uint8(1); version <= 4; version++ {
		c := liveClient(t, socket, version)
		tag := [16]byte{1}
		a := c.CheckTagged(ctx, "login", Subject{Peer: alice.Peer, Account: Some("v")}, &tag)
		if a.Kind != AnswerVerdict || a.Verdict.Version != version {
			t.Fatalf("version %d: %+v", version, a)
		}
		// What the Rust client does: the abandon goes out in the
		// connection's version, which has no such request.
		if a := c.Abandon(ctx, "login", Subject{Peer: alice.Peer, Account: Some("v")}); a.Kind != AnswerRejected || a.Rejected.Code != CodeMalformed {
			t.Fatalf("version %d abandon: %+v", version, a)
		}
	}
}
