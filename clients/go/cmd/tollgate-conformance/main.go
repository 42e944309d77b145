// Command tollgate-conformance drives the Go client for the conformance
// kit (docs/clients.md, "The runner"): one JSON request a line on stdin,
// one JSON reply a line on stdout, in order.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	tollgate "github.com/tollgate/tollgate/clients/go"
)

type subjectJSON struct {
	Peer         *string `json:"peer"`
	ForwardedFor *string `json:"forwarded_for"`
	Account      *string `json:"account"`
	Device       *string `json:"device"`
	Tenant       *string `json:"tenant"`
	ClientID     *string `json:"client_id"`
}

type budgetJSON struct {
	Limit    uint32  `json:"limit"`
	PeriodMs float64 `json:"period_ms"`
	Burst    uint32  `json:"burst"`
}

type requestJSON struct {
	Op              string                `json:"op"`
	Socket          *string               `json:"socket"`
	TimeoutMs       *float64              `json:"timeout_ms"`
	BusyMaxMs       *float64              `json:"busy_max_ms"`
	ProtocolVersion *uint8                `json:"protocol_version"`
	FailPolicies    map[string]string     `json:"fail_policies"`
	StaticBudgets   map[string]budgetJSON `json:"static_budgets"`
	Key             *string               `json:"key"`
	Route           string                `json:"route"`
	Subject         *subjectJSON          `json:"subject"`
	Subjects        []*subjectJSON        `json:"subjects"`
	Password        *string               `json:"password"`
	Outcome         string                `json:"outcome"`
	Attempt         string                `json:"attempt"`
	Account         *string               `json:"account"`
	Threads         int                   `json:"threads"`
	Millis          float64               `json:"millis"`
	Raw             bool                  `json:"raw"`
}

type verdictJSON struct {
	Answer       string `json:"answer"`
	Proceeds     bool   `json:"proceeds"`
	Decision     string `json:"decision"`
	RetryAfterMs uint64 `json:"retry_after_ms"`
	DelayMs      uint64 `json:"delay_ms"`
	Limit        uint32 `json:"limit"`
	Remaining    uint32 `json:"remaining"`
	ResetMs      uint64 `json:"reset_ms"`
	Reason       string `json:"reason"`
	Rule         string `json:"rule"`
	Degraded     bool   `json:"degraded"`
	RetryAfterS  uint64 `json:"retry_after_s"`
	Version      uint8  `json:"version"`
}

type rejectedJSON struct {
	Answer      string `json:"answer"`
	Proceeds    bool   `json:"proceeds"`
	Code        string `json:"code"`
	RetryAfterS uint64 `json:"retry_after_s"`
}

type unavailableJSON struct {
	Answer             string `json:"answer"`
	Proceeds           bool   `json:"proceeds"`
	Policy             string `json:"policy"`
	Error              string `json:"error"`
	WithinStaticBudget bool   `json:"within_static_budget"`
	RetryAfterS        uint64 `json:"retry_after_s"`
}

func answerJSON(a tollgate.Answer) interface{} {
	switch a.Kind {
	case tollgate.AnswerVerdict:
		v := a.Verdict
		return verdictJSON{"verdict", a.Proceeds(), v.Decision.String(), v.RetryAfterMs, v.DelayMs, v.Limit,
			v.Remaining, v.ResetMs, v.Reason.String(), v.Rule, v.Degraded, a.RetryAfterSecs(), v.Version}
	case tollgate.AnswerRejected:
		return rejectedJSON{"rejected", false, a.Rejected.Code.String(), a.RetryAfterSecs()}
	default:
		return unavailableJSON{"unavailable", a.Proceeds(), a.Policy.String(), a.Err.Kind.String(),
			a.WithinStaticBudget, a.RetryAfterSecs()}
	}
}

type runner struct {
	client   *tollgate.Client
	key      [32]byte
	attempts map[string]*tollgate.Attempt
}

func parseKey(text string) ([32]byte, error) {
	var key [32]byte
	raw, err := hex.DecodeString(text)
	if err != nil || len(raw) != 32 {
		return key, fmt.Errorf("key must be 64 hex digits")
	}
	copy(key[:], raw)
	return key, nil
}

func millis(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

func (r *runner) open(req *requestJSON) (interface{}, error) {
	socket := tollgate.SocketPathDefault
	if req.Socket != nil {
		socket = *req.Socket
	}
	cfg := tollgate.NewConfig(socket)
	if req.TimeoutMs != nil {
		cfg.Timeout = millis(*req.TimeoutMs)
	}
	if req.BusyMaxMs != nil {
		cfg.BusyMax = millis(*req.BusyMaxMs)
	}
	if req.ProtocolVersion != nil {
		cfg.ProtocolVersion = *req.ProtocolVersion
	}
	for route, name := range req.FailPolicies {
		switch name {
		case "open":
			cfg.FailPolicies[route] = tollgate.Open
		case "closed":
			cfg.FailPolicies[route] = tollgate.Closed
		default:
			return nil, fmt.Errorf("fail policy %q is not open or closed", name)
		}
	}
	for route, b := range req.StaticBudgets {
		cfg.StaticBudgets[route] = tollgate.StaticBudget{Limit: b.Limit, Period: millis(b.PeriodMs), Burst: b.Burst}
	}
	var key [32]byte
	if req.Key != nil {
		var err error
		if key, err = parseKey(*req.Key); err != nil {
			return nil, err
		}
	}
	cfg.PasswordKey = &key
	client, err := tollgate.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	if r.client != nil {
		r.client.Close()
	}
	r.client, r.key = client, key
	return map[string]bool{"ok": true}, nil
}

func subjectOf(s *subjectJSON) (tollgate.Subject, error) {
	if s == nil {
		return tollgate.Subject{}, nil
	}
	subject := tollgate.Subject{ForwardedFor: s.ForwardedFor, Account: s.Account, Device: s.Device, Tenant: s.Tenant, ClientID: s.ClientID}
	if s.Peer != nil {
		peer, err := netip.ParseAddr(*s.Peer)
		if err != nil {
			return subject, fmt.Errorf("peer: %v", err)
		}
		subject.Peer = peer
	}
	return subject, nil
}

func outcomeOf(name string) (tollgate.Outcome, error) {
	switch name {
	case "success":
		return tollgate.Success, nil
	case "failure":
		return tollgate.Failure, nil
	}
	return 0, fmt.Errorf("outcome %q is not success or failure", name)
}

func (r *runner) tag(password *string) *[16]byte {
	if password == nil {
		return nil
	}
	tag := tollgate.PasswordTag(&r.key, *password)
	return &tag
}

func (r *runner) handle(req *requestJSON) (interface{}, error) {
	if req.Op == "open" {
		return r.open(req)
	}
	if req.Op == "digest" {
		key := r.key
		if req.Key != nil {
			var err error
			if key, err = parseKey(*req.Key); err != nil {
				return nil, err
			}
		}
		account, password := "", ""
		if req.Account != nil {
			account = *req.Account
		}
		if req.Password != nil {
			password = *req.Password
		}
		digest, tag := tollgate.PasswordDigest(&key, account, password), tollgate.PasswordTag(&key, password)
		return map[string]string{"digest": hex.EncodeToString(digest[:]), "tag": hex.EncodeToString(tag[:])}, nil
	}
	if r.client == nil {
		return nil, errors.New("no client: send open first")
	}
	ctx := context.Background()
	subject, err := subjectOf(req.Subject)
	if err != nil {
		return nil, err
	}
	switch req.Op {
	case "check":
		return answerJSON(r.client.CheckTagged(ctx, req.Route, subject, r.tag(req.Password))), nil
	case "report":
		outcome, err := outcomeOf(req.Outcome)
		if err != nil {
			return nil, err
		}
		var digest *[16]byte
		if req.Password != nil {
			account := ""
			if subject.Account != nil {
				account = *subject.Account
			}
			d := tollgate.PasswordDigest(&r.key, account, *req.Password)
			digest = &d
		}
		return answerJSON(r.client.ReportTagged(ctx, req.Route, subject, outcome, digest, r.tag(req.Password))), nil
	case "abandon":
		return answerJSON(r.client.Abandon(ctx, req.Route, subject)), nil
	case "checks":
		subjects := make([]tollgate.Subject, len(req.Subjects))
		for i, s := range req.Subjects {
			if subjects[i], err = subjectOf(s); err != nil {
				return nil, err
			}
		}
		answers := make([]interface{}, len(subjects))
		var wg sync.WaitGroup
		for i := range subjects {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				answers[i] = answerJSON(r.client.Check(ctx, req.Route, subjects[i]))
			}(i)
		}
		wg.Wait()
		return map[string]interface{}{"answers": answers}, nil
	case "begin":
		attempt := r.client.Begin(ctx, req.Route, subject, req.Password)
		if old := r.attempts[req.Attempt]; old != nil {
			old.End()
		}
		r.attempts[req.Attempt] = attempt
		return answerJSON(attempt.Answer()), nil
	case "finish":
		attempt := r.attempts[req.Attempt]
		if attempt == nil {
			return nil, fmt.Errorf("no attempt %q", req.Attempt)
		}
		outcome, err := outcomeOf(req.Outcome)
		if err != nil {
			return nil, err
		}
		var answer tollgate.Answer
		if req.Subject != nil {
			answer, err = attempt.ReportAs(ctx, subject, outcome, req.Password)
		} else {
			answer, err = attempt.Report(ctx, outcome, req.Password)
		}
		if err != nil {
			return nil, err
		}
		return answerJSON(answer), nil
	case "end":
		attempt := r.attempts[req.Attempt]
		if attempt == nil {
			return nil, fmt.Errorf("no attempt %q", req.Attempt)
		}
		delete(r.attempts, req.Attempt)
		return map[string]bool{"abandoned": attempt.End()}, nil
	case "bench":
		return r.bench(req, subject)
	}
	return nil, fmt.Errorf("unknown op %q", req.Op)
}

// bench runs `threads` goroutines making checks for `millis` ms; raw ones
// write one pre-encoded v5 Check frame each and read the reply frame,
// decoding nothing: the floor the client's own cost is measured against.
func (r *runner) bench(req *requestJSON, subject tollgate.Subject) (interface{}, error) {
	threads := req.Threads
	if threads < 1 {
		threads = 1
	}
	var frame []byte
	var socket string
	if req.Raw {
		frame = rawCheckFrame(req.Route, subject)
		socket = r.client.Socket()
	}
	var calls atomic.Uint64
	var failed atomic.Value
	started := time.Now()
	until := started.Add(millis(req.Millis))
	var wg sync.WaitGroup
	for i := 0; i < threads; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !req.Raw {
				for time.Now().Before(until) {
					r.client.Check(context.Background(), req.Route, subject)
					calls.Add(1)
				}
				return
			}
			if err := rawLoop(socket, frame, until, &calls); err != nil {
				failed.Store(err)
			}
		}()
	}
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		return nil, err
	}
	return map[string]uint64{"calls": calls.Load(), "millis": uint64(time.Since(started) / time.Millisecond)}, nil
}

func rawLoop(socket string, frame []byte, until time.Time, calls *atomic.Uint64) error {
	conn, err := net.Dial("unix", socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	reply := make([]byte, 4096)
	var header [4]byte
	for time.Now().Before(until) {
		if _, err := conn.Write(frame); err != nil {
			return err
		}
		if _, err := io.ReadFull(conn, header[:]); err != nil {
			return err
		}
		n := int(binary.LittleEndian.Uint32(header[:]))
		if n > cap(reply) {
			reply = make([]byte, n)
		}
		if _, err := io.ReadFull(conn, reply[:n]); err != nil {
			return err
		}
		calls.Add(1)
	}
	return nil
}

// rawCheckFrame is a version-5 Check frame, id 1, no password tag, in
// PROTOCOL.md's layout.
func rawCheckFrame(route string, s tollgate.Subject) []byte {
	str := func(out []byte, v string) []byte {
		return append(binary.LittleEndian.AppendUint64(out, uint64(len(v))), v...)
	}
	out := []byte{0, 0, 0, 0, 5}
	out = binary.LittleEndian.AppendUint64(out, 1)
	out = binary.LittleEndian.AppendUint32(out, 0)
	out = str(out, route)
	switch {
	case !s.Peer.IsValid():
		out = append(out, 0)
	case s.Peer.Is4():
		a := s.Peer.As4()
		out = append(binary.LittleEndian.AppendUint32(append(out, 1), 0), a[:]...)
	default:
		a := s.Peer.As16()
		out = append(binary.LittleEndian.AppendUint32(append(out, 1), 1), a[:]...)
	}
	for _, f := range []*string{s.ForwardedFor, s.Account, s.Device, s.Tenant, s.ClientID} {
		if f == nil {
			out = append(out, 0)
		} else {
			out = str(append(out, 1), *f)
		}
	}
	out = append(out, 0) // password_tag: None
	binary.LittleEndian.PutUint32(out, uint32(len(out)-4))
	return out
}

func main() {
	r := &runner{attempts: map[string]*tollgate.Attempt{}}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 64*1024), 64*1024*1024)
	out := bufio.NewWriter(os.Stdout)
	for in.Scan() {
		line := in.Bytes()
		if len(line) == 0 {
			continue
		}
		var reply interface{}
		var req requestJSON
		err := json.Unmarshal(line, &req)
		if err == nil {
			reply, err = r.handle(&req)
		}
		if err != nil {
			reply = map[string]string{"error": err.Error()}
		}
		encoded, _ := json.Marshal(reply)
		out.Write(append(encoded, '\n'))
		out.Flush()
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "tollgate-conformance:", err)
		os.Exit(1)
	}
	if r.client != nil {
		r.client.Close()
	}
}
