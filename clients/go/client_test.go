package tollgate

import (
	"context"
	"encoding/binary"
	"io"
	"math"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestForwardedTail(t *testing.T) {
	short := "203.0.113.9, 10.0.0.1"
	if ForwardedTail(short) != short {
		t.Error("a short header is sent whole")
	}
	exact := strings.Repeat("a", ForwardedForBytesMax)
	if ForwardedTail(exact) != exact {
		t.Error("a header of exactly the maximum is sent whole")
	}
	long := strings.Repeat("a", 5000) + ", 198.51.100.7"
	if got := ForwardedTail(long); got != " 198.51.100.7" {
		t.Errorf("got %q", got)
	}
	entries := strings.Repeat("10.0.0.1, ", 1000) + "192.0.2.1"
	got := ForwardedTail(entries)
	if len(got) > ForwardedForBytesMax || !strings.HasSuffix(entries, got) || !strings.HasPrefix(got, " 10.0.0.1,") {
		t.Errorf("got %d bytes starting %q", len(got), got[:12])
	}
	// A comma right before the window: the window starts with a whole entry.
	edge := strings.Repeat("b", 10) + "," + strings.Repeat("c", ForwardedForBytesMax)
	if got := ForwardedTail(edge); got != strings.Repeat("c", ForwardedForBytesMax) {
		t.Errorf("edge: got %d bytes", len(got))
	}
	if ForwardedTail(strings.Repeat("x", ForwardedForBytesMax+1)) != "" {
		t.Error("one overlong entry is malformed: nothing sent")
	}
}

func TestGcraBurstThenOnePerInterval(t *testing.T) {
	const second = uint64(1_000_000)
	spec := newGcraSpec(60, 60*time.Second, 3)
	tat, now := uint64(0), 1000*second
	for _, remaining := range []uint32{2, 1, 0} {
		d, after := gcraDecide(spec, tat, now, true)
		if !d.allowed || d.remaining != remaining {
			t.Fatalf("%+v, want remaining %d", d, remaining)
		}
		tat = after
	}
	refused, after := gcraDecide(spec, tat, now, true)
	if refused.allowed || refused.retryAfterUs != second || after != tat {
		t.Fatalf("%+v", refused)
	}
	if d, _ := gcraDecide(spec, tat, now+second, true); !d.allowed {
		t.Fatal("one more after an interval")
	}
	if d, after := gcraDecide(spec, 0, now, false); !d.allowed || after != now {
		t.Fatal("a look without spending keeps the TAT")
	}
}

func deadClient(t *testing.T, edit func(*Config)) *Client {
	cfg := NewConfig(filepath.Join(t.TempDir(), "nobody-listens.sock"))
	if edit != nil {
		edit(&cfg)
	}
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

var alice = Subject{Peer: netip.MustParseAddr("198.51.100.7"), Account: Some("alice")}

func TestFailPoliciesWhenTheDaemonCannotBeReached(t *testing.T) {
	c := deadClient(t, nil)
	ctx := context.Background()
	cases := []struct {
		route    string
		policy   FailPolicy
		proceeds bool
	}{
		{"login", Open, true}, {"reauth", Open, true}, {"password_reset", Closed, false},
		{"request", Closed, false}, {"token", Closed, false}, {"no_such_route", Open, true},
	}
	for _, tc := range cases {
		a := c.Check(ctx, tc.route, alice)
		if a.Kind != AnswerUnavailable || a.Policy != tc.policy || a.Proceeds() != tc.proceeds || a.Err.Kind != ErrConnect {
			t.Errorf("%s: %+v", tc.route, a)
		}
		if a.RetryAfterSecs() != 1 || a.Delay() != 0 {
			t.Errorf("%s: retry after %d", tc.route, a.RetryAfterSecs())
		}
	}
	overridden := deadClient(t, func(cfg *Config) { cfg.FailPolicies["login"] = Closed })
	if overridden.Check(ctx, "login", alice).Proceeds() {
		t.Error("login overridden closed still proceeds")
	}
}

func TestStaticBudgetIsSpentByChecksOnly(t *testing.T) {
	c := deadClient(t, func(cfg *Config) {
		cfg.StaticBudgets["password_reset"] = StaticBudget{Limit: 2, Period: time.Hour, Burst: 2}
	})
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		if r := c.Report(ctx, "password_reset", alice, Failure); !r.WithinStaticBudget {
			t.Fatal("a report reads the budget without spending it")
		}
	}
	for i, want := range []bool{true, true, false, false} {
		a := c.Check(ctx, "password_reset", alice)
		if a.WithinStaticBudget != want || a.Proceeds() != want {
			t.Errorf("check %d: %+v", i, a)
		}
	}
	if r := c.Report(ctx, "password_reset", alice, Failure); r.WithinStaticBudget || r.Proceeds() {
		t.Error("the budget is spent")
	}
}

func TestAnswerProceedsDelayAndRetryAfter(t *testing.T) {
	verdict := func(d Decision, retry, delay uint64) Answer {
		return Answer{Kind: AnswerVerdict, Verdict: &Verdict{Decision: d, RetryAfterMs: retry, DelayMs: delay}}
	}
	if a := verdict(Allow, 0, 0); !a.Proceeds() || a.Delay() != 0 || a.RetryAfterSecs() != 1 {
		t.Error("allow")
	}
	if a := verdict(Delay, 2000, 1500); !a.Proceeds() || a.Delay() != 1500*time.Millisecond || a.RetryAfterSecs() != 2 {
		t.Error("delay")
	}
	if a := verdict(Challenge, 1, 0); a.Proceeds() || a.RetryAfterSecs() != 1 {
		t.Error("challenge")
	}
	if a := verdict(Deny, 899251, 0); a.Proceeds() || a.RetryAfterSecs() != 900 {
		t.Error("deny")
	}
	rejected := Answer{Kind: AnswerRejected, Rejected: &ErrorReply{Code: CodeFieldTooLong}}
	if rejected.Proceeds() {
		t.Error("rejected")
	}
	busy := Answer{Kind: AnswerUnavailable, Policy: Open, Err: &CallError{Kind: ErrBusy}}
	if busy.Proceeds() {
		t.Error("busy never proceeds")
	}
}

func TestBadProtocolVersionIsRefused(t *testing.T) {
	for _, v := range []uint8{0, 6} {
		cfg := NewConfig("/nonexistent")
		cfg.ProtocolVersion = v
		if _, err := NewClient(cfg); err == nil {
			t.Errorf("version %d accepted", v)
		}
	}
}

func TestBursts(t *testing.T) {
	b := newBursts()
	erin := Subject{Account: Some("erin")}
	first := b.enter("login", &alice)
	if first.inBurst() {
		t.Fatal("alone")
	}
	lone := b.enter("login", &erin)
	second := b.enter("login", &alice)
	if !first.inBurst() || !second.inBurst() || lone.inBurst() {
		t.Fatal("overlapping on alice only")
	}
	first.leave()
	second.leave()
	lone.leave()
	straggler := b.enter("login", &alice)
	if !straggler.inBurst() {
		t.Fatal("started just after the burst")
	}
	straggler.leave()
	time.Sleep(burstGap + 10*time.Millisecond)
	if later := b.enter("login", &erin); later.inBurst() {
		t.Fatal("a moment later, alone")
	}
}

// Checks on one account from one address are their own burst; from two
// addresses, a burst on the account that is neither's own.
func TestOwnBursts(t *testing.T) {
	b := newBursts()
	elsewhere := Subject{Peer: netip.MustParseAddr("203.0.113.9"), Account: alice.Account}
	first := b.enter("login", &alice)
	other := b.enter("login", &elsewhere)
	if !first.inBurst() || !other.inBurst() {
		t.Fatal("overlapping on alice's account: a burst")
	}
	if first.ownBurst() || other.ownBurst() {
		t.Fatal("from two addresses: neither's own")
	}
	second := b.enter("login", &alice)
	if !first.ownBurst() || !second.ownBurst() || other.ownBurst() {
		t.Fatal("two on alice from one address are each other's own")
	}
	first.leave()
	second.leave()
	other.leave()
	if g := b.enter("login", &alice); !g.ownBurst() {
		t.Fatal("started just after her own: own")
	} else {
		g.leave()
	}

	// Without an account, the address is both keys.
	b = newBursts()
	peerOnly := Subject{Peer: alice.Peer}
	lone := b.enter("login", &peerOnly)
	if lone.inBurst() || lone.ownBurst() {
		t.Fatal("alone")
	}
	again := b.enter("login", &peerOnly)
	if !lone.ownBurst() || !again.ownBurst() || !again.inBurst() {
		t.Fatal("two on one address are each other's own")
	}
	lone.leave()
	again.leave()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.entries) != 1 || b.entries[burstKey("login", &peerOnly)].waiting != 0 {
		t.Fatalf("one key entered once and left: %d entries", len(b.entries))
	}
}

// Behind a reverse proxy every check has the proxy's address: two users of
// one account are told apart by X-Forwarded-For, so an attacker's checks on
// her account are not her own burst.
func TestOwnBurstsBehindAProxy(t *testing.T) {
	b := newBursts()
	proxy := netip.MustParseAddr("10.0.0.1")
	her := Subject{Peer: proxy, Account: alice.Account, ForwardedFor: Some("192.0.2.5")}
	his := Subject{Peer: proxy, Account: alice.Account, ForwardedFor: Some("203.0.113.9")}
	first := b.enter("login", &her)
	other := b.enter("login", &his)
	if !first.inBurst() || !other.inBurst() || first.ownBurst() || other.ownBurst() {
		t.Fatal("one account from two forwarded addresses: a burst, neither's own")
	}
	second := b.enter("login", &her)
	if !first.ownBurst() || !second.ownBurst() || other.ownBurst() {
		t.Fatal("one account from one forwarded address: her own")
	}
	first.leave()
	second.leave()
	other.leave()
	// Without a peer, the forwarded header alone makes the requester.
	b = newBursts()
	herNoPeer := Subject{Account: alice.Account, ForwardedFor: Some("192.0.2.5")}
	hisNoPeer := Subject{Account: alice.Account, ForwardedFor: Some("203.0.113.9")}
	g, h := b.enter("login", &herNoPeer), b.enter("login", &hisNoPeer)
	if !g.inBurst() || g.ownBurst() || h.ownBurst() {
		t.Fatal("no peer, two forwarded addresses: a burst, neither's own")
	}
	g.leave()
	h.leave()
}

// Requester keys of subjects that differ in any of route, tenant, account,
// address or X-Forwarded-For differ, wherever the field boundaries fall,
// and an absent field is not an empty one.
func TestRequesterKeysDoNotCollide(t *testing.T) {
	peer := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	pairs := []struct {
		what string
		a, b Subject
	}{
		{"account/peer boundary",
			Subject{Account: Some("bob"), Peer: peer("192.0.2.5")},
			Subject{Account: Some("bob1"), Peer: peer("92.0.2.5")}},
		{"tenant/account boundary",
			Subject{Tenant: Some("a"), Account: Some("bc"), Peer: alice.Peer},
			Subject{Tenant: Some("ab"), Account: Some("c"), Peer: alice.Peer}},
		{"two tenants",
			Subject{Tenant: Some("one"), Account: alice.Account, Peer: alice.Peer},
			Subject{Tenant: Some("two"), Account: alice.Account, Peer: alice.Peer}},
		{"no tenant vs an empty one",
			Subject{Account: alice.Account, Peer: alice.Peer},
			Subject{Tenant: Some(""), Account: alice.Account, Peer: alice.Peer}},
		{"two forwarded addresses",
			Subject{Account: alice.Account, Peer: alice.Peer, ForwardedFor: Some("192.0.2.5")},
			Subject{Account: alice.Account, Peer: alice.Peer, ForwardedFor: Some("192.0.2.6")}},
		{"no forwarded header vs an empty one",
			Subject{Account: alice.Account, Peer: alice.Peer},
			Subject{Account: alice.Account, Peer: alice.Peer, ForwardedFor: Some("")}},
		{"forwarded header alone vs address alone",
			Subject{Account: alice.Account, ForwardedFor: Some("192.0.2.5")},
			Subject{Account: alice.Account, Peer: peer("192.0.2.5")}},
		{"account/forwarded boundary, no peer",
			Subject{Account: Some("bob"), ForwardedFor: Some("1x")},
			Subject{Account: Some("bob1"), ForwardedFor: Some("x")}},
	}
	for _, p := range pairs {
		if requesterKey("login", &p.a) == requesterKey("login", &p.b) {
			t.Errorf("%s: one requester key", p.what)
		}
	}
	if requesterKey("login", &alice) == requesterKey("reauth", &alice) {
		t.Error("two routes: one requester key")
	}
	// Without an address and a forwarded header, the requester is the
	// account's burst key, as before, whatever the tenant.
	accountOnly := Subject{Account: alice.Account, Tenant: Some("one")}
	if requesterKey("login", &accountOnly) != burstKey("login", &accountOnly) {
		t.Error("an account alone: the burst key")
	}
	// The burst key has neither tenant nor forwarded header.
	withAll := Subject{Account: alice.Account, Peer: alice.Peer, Tenant: Some("one"), ForwardedFor: Some("192.0.2.5")}
	if burstKey("login", &withAll) != burstKey("login", &Subject{Account: alice.Account}) {
		t.Error("the burst key is route and account only")
	}
}

func TestBusyWindows(t *testing.T) {
	const busyMax = 10 * time.Millisecond
	w := newBusyWindows()
	at := func(d time.Duration) time.Duration { return 5*time.Second + d }
	if !w.excused("her", at(0), busyMax) {
		t.Fatal("the first refusal is excused")
	}
	if !w.excused("her", at(busyMax-time.Microsecond), busyMax) {
		t.Fatal("still within busyMax")
	}
	if w.excused("her", at(busyMax), busyMax) || w.excused("her", at(busyWindowSpans*busyMax-time.Microsecond), busyMax) {
		t.Fatal("past busyMax, in the window: not excused")
	}
	if !w.excused("her", at(busyWindowSpans*busyMax), busyMax) {
		t.Fatal("the window ended: a new one")
	}
	if !w.excused("her", at(busyWindowSpans*busyMax+busyMax/2), busyMax) || w.excused("her", at(busyWindowSpans*busyMax+busyMax), busyMax) {
		t.Fatal("the new window refuses for busyMax only")
	}
	if newBusyWindows().excused("her", at(0), 0) {
		t.Fatal("busyMax 0: never excused")
	}

	// Bounded: a flood of requesters cannot push out live windows.
	w = newBusyWindows()
	for i := 0; i < busyRequestersMax; i++ {
		if !w.excused("flood"+strconv.Itoa(i), at(0), busyMax) {
			t.Fatal("room left")
		}
	}
	if w.excused("her", at(busyMax/2), busyMax) {
		t.Fatal("full of live windows: a new requester is not excused")
	}
	if !w.excused("flood0", at(busyMax/2), busyMax) {
		t.Fatal("a requester with a live window still has it")
	}
	if len(w.first) != busyRequestersMax {
		t.Fatalf("%d windows", len(w.first))
	}
	if !w.excused("her", at(busyWindowSpans*busyMax), busyMax) {
		t.Fatal("the windows ended: room")
	}
	if len(w.first) != 1 {
		t.Fatalf("%d windows: the ended ones dropped", len(w.first))
	}
}

// A huge BusyMax makes a window that never ends, not a negative one.
func TestBusyWindowSaturates(t *testing.T) {
	if got := busyWindow(10 * time.Millisecond); got != busyWindowSpans*10*time.Millisecond {
		t.Fatalf("window %v", got)
	}
	huge := time.Duration(math.MaxInt64 / 100)
	if got := busyWindow(huge); got != math.MaxInt64 {
		t.Fatalf("window of %v: %v, want saturated", huge, got)
	}
	if got := busyWindow(math.MaxInt64); got != math.MaxInt64 {
		t.Fatalf("window of the largest BusyMax: %v", got)
	}
	w := newBusyWindows()
	for _, now := range []time.Duration{time.Second, time.Second + huge/2, time.Second + huge + 1} {
		excused := w.excused("her", now, huge)
		if want := now == time.Second || now == time.Second+huge/2; excused != want {
			t.Fatalf("at %v: excused %v, want %v (one window that never ends)", now, excused, want)
		}
	}
}

func TestKnownRequesters(t *testing.T) {
	k := newKnownRequesters()
	at := func(d time.Duration) time.Duration { return 5*time.Second + d }
	if k.known("her", at(0)) {
		t.Fatal("unknown before a success")
	}
	k.succeeded("her", "alice", at(0))
	if !k.known("her", at(0)) || !k.known("her", at(knownFor-time.Microsecond)) {
		t.Fatal("known after a success")
	}
	if k.known("him", at(0)) {
		t.Fatal("another requester stays unknown")
	}
	if k.known("her", at(knownFor)) {
		t.Fatal("not known past knownFor")
	}
	k.succeeded("her", "alice", at(knownFor))
	if !k.known("her", at(knownFor+time.Hour)) {
		t.Fatal("a new success makes her known again")
	}
	if k.order.Len() != 1 || len(k.entries) != 1 || len(k.accounts["alice"]) != 1 {
		t.Fatal("an update is one entry")
	}
}

// 17 successes on one account from 17 addresses: the first is forgotten,
// another account's requester is not.
func TestKnownRequestersPerAccount(t *testing.T) {
	k := newKnownRequesters()
	at := func(d time.Duration) time.Duration { return 5*time.Second + d }
	k.succeeded("bob@home", "bob", at(0))
	for i := 0; i < knownPerAccountMax; i++ {
		k.succeeded("alice@"+strconv.Itoa(i), "alice", at(time.Duration(i+1)*time.Second))
	}
	if !k.known("alice@0", at(time.Hour)) {
		t.Fatal("16 of one account: all kept")
	}
	// An update makes alice@0 her most recent: alice@1 is next to go.
	k.succeeded("alice@0", "alice", at(time.Minute))
	k.succeeded("alice@new", "alice", at(time.Hour))
	if k.known("alice@1", at(time.Hour)) {
		t.Fatal("the 17th of one account forgets its least recent")
	}
	for _, r := range []string{"alice@0", "alice@2", "alice@15", "alice@new", "bob@home"} {
		if !k.known(r, at(time.Hour)) {
			t.Fatalf("%s forgotten", r)
		}
	}
	if len(k.accounts["alice"]) != knownPerAccountMax || k.order.Len() != knownPerAccountMax+1 || len(k.entries) != knownPerAccountMax+1 {
		t.Fatalf("%d of alice's, %d in all", len(k.accounts["alice"]), k.order.Len())
	}
}

// When full, a new requester's success evicts the least recently
// succeeded one (an update makes an old entry recent again); an update
// needs no room.
func TestKnownRequestersGlobalCap(t *testing.T) {
	k := newKnownRequesters()
	at := func(d time.Duration) time.Duration { return 5*time.Second + d }
	for i := 0; i < knownRequestersMax; i++ {
		k.succeeded("user"+strconv.Itoa(i), "account"+strconv.Itoa(i), at(time.Duration(i)*time.Microsecond))
	}
	k.succeeded("user0", "account0", at(time.Hour)) // an update needs no room
	if k.order.Len() != knownRequestersMax || !k.known("user1", at(time.Hour)) {
		t.Fatalf("an update evicted: %d entries", k.order.Len())
	}
	k.succeeded("her", "alice", at(time.Hour))
	if k.order.Len() != knownRequestersMax || len(k.entries) != knownRequestersMax || !k.known("her", at(time.Hour)) {
		t.Fatalf("%d entries, her known: %v", k.order.Len(), k.known("her", at(time.Hour)))
	}
	if k.known("user1", at(time.Hour)) || !k.known("user0", at(time.Hour)) || !k.known("user2", at(time.Hour)) {
		t.Fatal("the least recent (user1; user0 was updated) is the one evicted")
	}
	if _, ok := k.accounts["account1"]; ok {
		t.Fatal("the evicted entry left its account's list")
	}
	k.succeeded("him", "bob", at(time.Hour))
	if k.known("user2", at(time.Hour)) || !k.known("user3", at(time.Hour)) {
		t.Fatal("then the next least recent")
	}
}

// A success reported through the client makes its requester known, even
// when the report gets no answer; a failure does not.
func TestReportedSuccessesMakeRequestersKnown(t *testing.T) {
	c := deadClient(t, nil)
	ctx := context.Background()
	bob := Subject{Peer: alice.Peer, Account: Some("bob")}
	peerOnly := Subject{Peer: netip.MustParseAddr("198.51.100.7")}
	now := func() time.Duration { return time.Since(c.started) }
	c.Report(ctx, "login", bob, Failure)
	if a := c.Report(ctx, "login", alice, Success); a.Kind != AnswerUnavailable {
		t.Fatalf("a dead daemon: %+v", a)
	}
	c.Report(ctx, "login", peerOnly, Success)
	if !c.known.known(requesterKey("login", &alice), now()) {
		t.Fatal("her success makes her known")
	}
	if c.known.known(burstKey("login", &peerOnly), now()) {
		t.Fatal("without an account the requester is its burst key, never asked about: not recorded")
	}
	other := Subject{Peer: netip.MustParseAddr("203.0.113.9"), Account: alice.Account}
	for what, key := range map[string]string{
		"a failure":           requesterKey("login", &bob),
		"another address":     requesterKey("login", &other),
		"another route":       requesterKey("reauth", &alice),
		"the account's burst": burstKey("login", &alice),
	} {
		if c.known.known(key, now()) {
			t.Fatalf("%s is not known", what)
		}
	}

	// The requester is the subject as sent: its tenant and its
	// X-Forwarded-For cut to the tail; a report refused before sending
	// records nothing.
	proxied := Subject{Peer: netip.MustParseAddr("10.0.0.1"), Account: Some("carol"), Tenant: Some("acme"),
		ForwardedFor: Some(strings.Repeat("10.9.9.9, ", 5000) + "192.0.2.1")}
	c.Report(ctx, "login", proxied, Success)
	sent := bounded(proxied)
	if !c.known.known(requesterKey("login", &sent), now()) {
		t.Fatal("her success behind the proxy makes her known")
	}
	otherTenant, otherForwarded := sent, sent
	otherTenant.Tenant = Some("other")
	otherForwarded.ForwardedFor = Some("192.0.2.2")
	if c.known.known(requesterKey("login", &otherTenant), now()) || c.known.known(requesterKey("login", &otherForwarded), now()) {
		t.Fatal("another tenant or forwarded address is not known")
	}
	tooLong := Subject{Peer: alice.Peer, Account: Some(strings.Repeat("x", IdentifierBytesMax+1))}
	if a := c.Report(ctx, "login", tooLong, Success); a.Kind != AnswerRejected {
		t.Fatalf("refused before sending: %+v", a)
	}
	if c.known.known(requesterKey("login", &tooLong), now()) {
		t.Fatal("a report refused before sending records no success")
	}
}

// fakeDaemon answers each request frame with reply(version, id, kind);
// a nil reply is silence. It records each request's version and kind.
type fakeDaemon struct {
	path  string
	mu    sync.Mutex
	seen  [][2]uint32
	conns int
	// open: the connections accepted and not yet closed by the client.
	open int
	// payloads: each request frame's payload, as received.
	payloads [][]byte
}

func startFake(t *testing.T, reply func(version uint8, id uint64, kind uint32) []byte) *fakeDaemon {
	f := &fakeDaemon{path: filepath.Join(t.TempDir(), "fake.sock")}
	ln, err := net.Listen("unix", f.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns++
			f.open++
			f.mu.Unlock()
			go func() {
				defer func() {
					c.Close()
					f.mu.Lock()
					f.open--
					f.mu.Unlock()
				}()
				for {
					var header [4]byte
					if _, err := io.ReadFull(c, header[:]); err != nil {
						return
					}
					payload := make([]byte, binary.LittleEndian.Uint32(header[:]))
					if _, err := io.ReadFull(c, payload); err != nil {
						return
					}
					version, id, kind := payload[0], binary.LittleEndian.Uint64(payload[1:9]), binary.LittleEndian.Uint32(payload[9:13])
					f.mu.Lock()
					f.seen = append(f.seen, [2]uint32{uint32(version), kind})
					f.payloads = append(f.payloads, payload)
					f.mu.Unlock()
					if out := reply(version, id, kind); out != nil {
						c.Write(out)
					}
				}
			}()
		}
	}()
	return f
}

func (f *fakeDaemon) requests() [][2]uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][2]uint32{}, f.seen...)
}

func frameOf(version uint8, id uint64, body []byte) []byte {
	out := binary.LittleEndian.AppendUint32(nil, uint32(9+len(body)))
	out = append(out, version)
	out = binary.LittleEndian.AppendUint64(out, id)
	return append(out, body...)
}

func verdictBody(version uint8, d Decision) []byte {
	b := binary.LittleEndian.AppendUint32(nil, responseVerdict)
	b = binary.LittleEndian.AppendUint32(b, uint32(d))
	b = append(b, make([]byte, 8+8+4+4+8+4)...)
	b = appendString(b, "rule")
	if version >= 2 {
		b = append(b, 0)
	}
	return b
}

func errorBody(code ErrorCode) []byte {
	b := binary.LittleEndian.AppendUint32(nil, responseError)
	b = binary.LittleEndian.AppendUint32(b, uint32(code))
	return appendString(b, "no")
}

func fakeClient(t *testing.T, f *fakeDaemon, edit func(*Config)) *Client {
	cfg := NewConfig(f.path)
	cfg.Timeout = 200 * time.Millisecond
	if edit != nil {
		edit(&cfg)
	}
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestStepsDownOneVersionAtATimeAndKeepsIt(t *testing.T) {
	f := startFake(t, func(version uint8, id uint64, kind uint32) []byte {
		if version > 2 {
			return frameOf(1, id, errorBody(CodeUnsupportedVersion))
		}
		return frameOf(version, id, verdictBody(version, Allow))
	})
	c := fakeClient(t, f, nil)
	tag := [16]byte{1}
	for i := 0; i < 2; i++ {
		a := c.CheckTagged(context.Background(), "login", alice, &tag)
		if a.Kind != AnswerVerdict || a.Verdict.Version != 2 {
			t.Fatalf("%+v", a)
		}
	}
	want := [][2]uint32{{5, 0}, {4, 0}, {3, 0}, {2, 0}, {2, 0}}
	if got := f.requests(); len(got) != len(want) || got[4] != want[4] || got[0] != want[0] || got[3] != want[3] {
		t.Fatalf("requests %v, want %v", got, want)
	}
	if f.conns != 1 {
		t.Fatalf("%d connections: the connection is reused", f.conns)
	}
}

func TestMalformedRepliesBreakTheConnection(t *testing.T) {
	replies := map[string]func(uint64) []byte{
		"trailing byte": func(id uint64) []byte { return frameOf(5, id, append(verdictBody(5, Allow), 0)) },
		"wrong id":      func(id uint64) []byte { return frameOf(5, id+7, verdictBody(5, Allow)) },
		"over 8 MiB":    func(id uint64) []byte { return binary.LittleEndian.AppendUint32(nil, ResponsePayloadBytesMax+1) },
	}
	for name, reply := range replies {
		f := startFake(t, func(_ uint8, id uint64, _ uint32) []byte { return reply(id) })
		c := fakeClient(t, f, nil)
		for i := 0; i < 2; i++ {
			a := c.Check(context.Background(), "login", alice)
			if a.Kind != AnswerUnavailable || a.Err.Kind != ErrProtocol || !a.Proceeds() {
				t.Fatalf("%s: %+v", name, a)
			}
		}
		if f.conns != 2 {
			t.Errorf("%s: %d connections, want a fresh one per call", name, f.conns)
		}
	}
}

func TestABusyDaemonRefusesBurstsButNotALoneUser(t *testing.T) {
	var mu sync.Mutex
	silent := false
	f := startFake(t, func(version uint8, id uint64, _ uint32) []byte {
		mu.Lock()
		defer mu.Unlock()
		if silent {
			return nil
		}
		return frameOf(version, id, verdictBody(version, Allow))
	})
	c := fakeClient(t, f, func(cfg *Config) { cfg.Timeout = 30 * time.Millisecond })
	ctx := context.Background()
	if a := c.Check(ctx, "login", alice); a.Kind != AnswerVerdict {
		t.Fatalf("%+v", a)
	}
	mu.Lock()
	silent = true
	mu.Unlock()
	time.Sleep(burstGap + 10*time.Millisecond)
	if a := c.Check(ctx, "login", Subject{Account: Some("lone")}); a.Err == nil || a.Err.Kind != ErrTimeout || !a.Proceeds() {
		t.Fatalf("a lone user's timeout is an outage: %+v", a)
	} else if strings.Contains(a.Err.Error(), "busy") {
		// Taken for busy first, then downgraded: the message is a plain timeout's.
		t.Fatalf("a timeout downgraded from busy says busy: %v", a.Err)
	}
	for _, a := range together(c, 3, alice) {
		if a.Err == nil || a.Err.Kind != ErrBusy || a.Proceeds() {
			t.Fatalf("a burst on one account is busy: %+v", a.Err)
		}
	}
}

// together is n login checks on s at once.
func together(c *Client, n int, s Subject) []Answer {
	answers := make([]Answer, n)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			answers[i] = c.Check(context.Background(), "login", s)
		}(i)
	}
	wg.Wait()
	return answers
}

// at is one login check for each subject, all at once.
func at(c *Client, subjects ...Subject) []Answer {
	answers := make([]Answer, len(subjects))
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			answers[i] = c.Check(context.Background(), "login", subjects[i])
		}(i)
	}
	wg.Wait()
	return answers
}

// Others checking her account from other addresses while the daemon is
// busy: her overlapped check is busy only for BusyMax from her first
// refusal, once she has logged in from her address through this client;
// the others' (unknown) checks, and a guesser's from one address, stay
// busy.
func TestABurstFromOtherAddressesIsBusyOnlyForBusyMax(t *testing.T) {
	burstFromOtherAddresses(t, true, false)
}

// The same behind a reverse proxy: every check has the proxy's address,
// and X-Forwarded-For tells her from the others, so their checks on her
// account are not her own burst.
func TestABurstFromOtherForwardedAddressesIsBusyOnlyForBusyMax(t *testing.T) {
	burstFromOtherAddresses(t, true, true)
}

// The same sequence with no success reported for her address: her check
// in the burst on her account stays busy past BusyMax (she could be a
// guesser's other address), and no window is ever started.
func TestABurstFromUnknownAddressesStaysBusy(t *testing.T) {
	burstFromOtherAddresses(t, false, false)
}

func burstFromOtherAddresses(t *testing.T, herSuccess, behindProxy bool) {
	var silent atomic.Bool
	f := startFake(t, func(version uint8, id uint64, _ uint32) []byte {
		if silent.Load() {
			return nil
		}
		return frameOf(version, id, verdictBody(version, Allow))
	})
	// BusyMax is far longer than the refusals below take even on a slow,
	// shared host (two overlaps of one Timeout each, burstGap apart).
	const busyMax = 1500 * time.Millisecond
	c := fakeClient(t, f, func(cfg *Config) {
		cfg.Timeout = 40 * time.Millisecond
		cfg.BusyMax = busyMax
	})
	ctx := context.Background()
	her := alice
	his := Subject{Peer: netip.MustParseAddr("203.0.113.9"), Account: alice.Account}
	if behindProxy {
		proxy := netip.MustParseAddr("10.0.0.1")
		her = Subject{Peer: proxy, Account: alice.Account, ForwardedFor: Some(alice.Peer.String())}
		his = Subject{Peer: proxy, Account: alice.Account, ForwardedFor: Some("203.0.113.9")}
	}
	if a := c.Check(ctx, "login", her); a.Kind != AnswerVerdict {
		t.Fatalf("%+v", a)
	}
	if herSuccess {
		if a := c.Report(ctx, "login", her, Success); a.Kind != AnswerVerdict {
			t.Fatalf("%+v", a)
		}
	}
	// Apart by more than burstGap, so that no check below is its
	// requester's own burst with the one before.
	apart := func() { time.Sleep(burstGap + 10*time.Millisecond) }
	apart()
	silent.Store(true)
	started := time.Now()
	var refused time.Time
	for i := 0; i < 2; i++ {
		if i > 0 {
			apart()
		}
		for _, a := range at(c, her, his) {
			if a.Err == nil || a.Err.Kind != ErrBusy || a.Proceeds() {
				t.Fatalf("overlap %d, within BusyMax of the first refusal: %+v", i, a.Err)
			}
		}
		if i == 0 {
			refused = time.Now()
		}
	}
	if took := time.Since(started); took >= busyMax {
		t.Fatalf("the refusals took %v, past BusyMax %v", took, busyMax)
	}
	// Past BusyMax since those refusals; an answer in time keeps the
	// daemon busy (not down) for the late checks.
	time.Sleep(busyMax + 20*time.Millisecond - time.Since(refused))
	silent.Store(false)
	if a := c.Check(ctx, "login", Subject{Account: Some("bob")}); a.Kind != AnswerVerdict {
		t.Fatalf("answered in time: %+v", a)
	}
	silent.Store(true)
	answers := at(c, her, his)
	if a := answers[0]; herSuccess && (a.Err == nil || a.Err.Kind != ErrTimeout || !a.Proceeds()) {
		t.Fatalf("known, in her window past BusyMax: a plain timeout: %+v", a.Err)
	} else if !herSuccess && (a.Err == nil || a.Err.Kind != ErrBusy || a.Proceeds()) {
		t.Fatalf("unknown, past BusyMax: still busy: %+v", a.Err)
	}
	if a := answers[1]; a.Err == nil || a.Err.Kind != ErrBusy || a.Proceeds() {
		t.Fatalf("an address that never logged in stays busy: %+v", a.Err)
	}
	for _, a := range at(c, his, his) {
		if a.Err == nil || a.Err.Kind != ErrBusy || a.Proceeds() {
			t.Fatalf("his own burst stays busy: %+v", a.Err)
		}
	}
	// Only a known requester in others' burst starts a window.
	c.busy.mu.Lock()
	defer c.busy.mu.Unlock()
	_, herWindow := c.busy.first[requesterKey("login", &her)]
	if len(c.busy.first) != map[bool]int{true: 1, false: 0}[herSuccess] || herWindow != herSuccess {
		t.Fatalf("%d windows (hers: %v)", len(c.busy.first), herWindow)
	}
}

// Bursts closer together than BusyMax: the answer between them comes too
// soon to end the run, which grows older than BusyMax; a late burst then
// must still not proceed.
func TestADaemonThatAnsweredInTimeWithinBusyMaxIsBusyInAnOldRun(t *testing.T) {
	var silent atomic.Bool
	f := startFake(t, func(version uint8, id uint64, _ uint32) []byte {
		if silent.Load() {
			return nil
		}
		return frameOf(version, id, verdictBody(version, Allow))
	})
	c := fakeClient(t, f, func(cfg *Config) {
		cfg.Timeout = 30 * time.Millisecond
		cfg.BusyMax = 600 * time.Millisecond
	})
	ctx := context.Background()
	burst := func() []Answer { return together(c, 2, alice) }
	if a := c.Check(ctx, "login", alice); a.Kind != AnswerVerdict {
		t.Fatalf("%+v", a)
	}
	silent.Store(true)
	for _, a := range burst() {
		if a.Err == nil || a.Err.Kind != ErrBusy {
			t.Fatalf("a first burst: %+v", a.Err)
		}
	}
	// The run began just before: timed from here, the late burst meets a
	// run older than BusyMax however slow the start was.
	started := time.Now()
	silent.Store(false)
	time.Sleep(200 * time.Millisecond)
	if a := c.Check(ctx, "login", Subject{Account: Some("bob")}); a.Kind != AnswerVerdict {
		t.Fatalf("answered in time: %+v", a)
	}
	time.Sleep(650*time.Millisecond - time.Since(started))
	silent.Store(true)
	for _, a := range burst() {
		if a.Err == nil || a.Err.Kind != ErrBusy || a.Proceeds() {
			t.Fatalf("answered in time within BusyMax, the run older: %+v", a.Err)
		}
	}
	time.Sleep(650 * time.Millisecond)
	for _, a := range burst() {
		if a.Err == nil || a.Err.Kind != ErrTimeout || !a.Proceeds() {
			t.Fatalf("nothing in time for BusyMax: an outage: %+v", a.Err)
		}
	}
}

func TestTheGuardAbandonsOnlyAnAllowedUnreportedCheck(t *testing.T) {
	var mu sync.Mutex
	decision := Allow
	f := startFake(t, func(version uint8, id uint64, _ uint32) []byte {
		mu.Lock()
		defer mu.Unlock()
		return frameOf(version, id, verdictBody(version, decision))
	})
	c := fakeClient(t, f, nil)
	ctx := context.Background()
	kinds := func() []uint32 {
		var out []uint32
		for _, r := range f.requests() {
			out = append(out, r[1])
		}
		return out
	}

	attempt := c.Begin(ctx, "login", alice, nil)
	if !attempt.Proceeds() || !attempt.End() || attempt.End() {
		t.Fatal("an allowed attempt ended without an outcome abandons, once")
	}
	reported := c.Begin(ctx, "login", alice, nil)
	reported.Report(ctx, Failure, nil)
	if reported.End() {
		t.Fatal("never after a report")
	}
	for _, d := range []Decision{Delay, Deny, Challenge} {
		mu.Lock()
		decision = d
		mu.Unlock()
		if c.Begin(ctx, "login", alice, nil).End() {
			t.Fatalf("%s: nothing to abandon", d)
		}
	}
	want := []uint32{0, 8, 0, 1, 0, 0, 0}
	got := kinds()
	if len(got) != len(want) {
		t.Fatalf("requests %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("requests %v, want %v", got, want)
		}
	}
}

func TestACancelledContextIsNotATimeout(t *testing.T) {
	f := startFake(t, func(uint8, uint64, uint32) []byte { return nil })
	c := fakeClient(t, f, func(cfg *Config) { cfg.Timeout = time.Second })
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	started := time.Now()
	a := c.Check(ctx, "login", alice)
	if a.Err == nil || a.Err.Kind != ErrCanceled || time.Since(started) > 2*time.Second {
		t.Fatalf("%+v", a.Err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort()
	// The caller's sooner deadline ended it, not the daemon: never proceeds.
	if a := c.Check(short, "login", alice); a.Err == nil || a.Err.Kind != ErrDeadline || a.Proceeds() {
		t.Fatalf("the context's sooner deadline: %+v", a.Err)
	}
}
