// A small login endpoint in front of a tollgate daemon, as
// examples/login_server.rs: check before the password is verified, report
// after, through the attempt guard; 401 for a wrong password, one 429 with
// Retry-After for every refusal (the reason is for logs only), delays
// honoured, and a floor so refusals are never faster than a wrong password.
//
//	go run ./example -socket /tmp/tollgate/tollgate.sock
//	curl -si -d 'account=alice&password=correct+horse+battery+staple' http://127.0.0.1:8080/login
package main

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"flag"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	tollgate "github.com/tollgate/tollgate/clients/go"
)

// floor: every answer but a success waits until this long after arrival,
// so refusals and unknown accounts look like a real failed verify.
const floor = 100 * time.Millisecond

type server struct {
	limiter *tollgate.Client
	users   map[string][32]byte // account -> stretched password
	salt    []byte
}

// stretch stands in for a real password hash (argon2, bcrypt: not in Go's
// standard library): deliberately slow, the work tollgate guards.
func (s *server) stretch(password string) [32]byte {
	sum := sha256.Sum256(append(append([]byte{}, s.salt...), password...))
	for i := 0; i < 200_000; i++ {
		sum = sha256.Sum256(sum[:])
	}
	return sum
}

func reply(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write([]byte(body + "\n"))
}

func (s *server) login(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	status := http.StatusOK
	defer func() {
		if status != http.StatusOK {
			time.Sleep(time.Until(arrived.Add(floor)))
		}
	}()
	account, password, ok := credentials(w, r)
	if !ok {
		status = http.StatusBadRequest
		reply(w, status, `{"error":"bad request"}`)
		return
	}
	subject := tollgate.Subject{Account: &account}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		subject.Peer, _ = netip.ParseAddr(host)
	}
	if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
		subject.ForwardedFor = tollgate.Some(strings.Join(xff, ", "))
	}

	attempt := s.limiter.Begin(r.Context(), "login", subject, &password)
	defer attempt.End() // abandons if we leave before reporting (panic, hang-up)
	answer := attempt.Answer()
	if !answer.Proceeds() {
		log.Printf("login refused: %+v", answerForLog(answer))
		status = http.StatusTooManyRequests
		w.Header().Set("Retry-After", strconv.FormatUint(answer.RetryAfterSecs(), 10))
		reply(w, status, `{"error":"too many attempts, try again later"}`)
		return
	}
	if answer.Kind == tollgate.AnswerUnavailable {
		log.Printf("tollgate unavailable (%v): login fails %s", answer.Err, answer.Policy)
	}
	time.Sleep(answer.Delay())

	stored, known := s.users[account]
	tried := s.stretch(password) // the same work for unknown accounts
	if known && subtle.ConstantTimeCompare(stored[:], tried[:]) == 1 {
		attempt.Report(r.Context(), tollgate.Success, nil)
		reply(w, status, `{"status":"ok"}`)
		return
	}
	// The digest makes a repeated wrong password (a stale phone) count once.
	attempt.Report(r.Context(), tollgate.Failure, &password)
	status = http.StatusUnauthorized
	reply(w, status, `{"error":"invalid account or password"}`)
}

func answerForLog(a tollgate.Answer) interface{} {
	switch a.Kind {
	case tollgate.AnswerVerdict:
		return *a.Verdict
	case tollgate.AnswerRejected:
		return *a.Rejected
	}
	return a.Err
}

// credentials reads a form or a JSON body with account and password.
func credentials(w http.ResponseWriter, r *http.Request) (account, password string, ok bool) {
	r.Body = http.MaxBytesReader(w, r.Body, 64*1024)
	if strings.HasPrefix(strings.ToLower(r.Header.Get("Content-Type")), "application/json") {
		var body struct{ Account, Password string }
		if json.NewDecoder(r.Body).Decode(&body) != nil {
			return "", "", false
		}
		return body.Account, body.Password, body.Account != ""
	}
	if r.ParseForm() != nil {
		return "", "", false
	}
	return r.PostForm.Get("account"), r.PostForm.Get("password"), r.PostForm.Has("account")
}

func main() {
	socket := flag.String("socket", tollgate.SocketPathDefault, "the tollgate daemon's socket")
	listen := flag.String("listen", "127.0.0.1:8080", "address to serve on (loopback only)")
	demo := flag.String("demo-password", "correct horse battery staple", "alice's password")
	flag.Parse()
	if addr, err := netip.ParseAddrPort(*listen); err != nil || !addr.Addr().IsLoopback() {
		log.Fatalf("-listen %s: this example binds loopback only", *listen)
	}
	cfg := tollgate.NewConfig(*socket)
	// Keep this secret stable (restarts, every process sharing the daemon): load it.
	var key [32]byte
	if hexKey, ok := os.LookupEnv("TOLLGATE_PASSWORD_KEY"); ok { // 64 hex digits
		raw, err := hex.DecodeString(hexKey)
		if err != nil || len(raw) != 32 {
			log.Fatal("TOLLGATE_PASSWORD_KEY: 64 hex digits")
		}
		copy(key[:], raw)
	} else {
		log.Print("TOLLGATE_PASSWORD_KEY unset: a throwaway key, for this demo only")
		rand.Read(key[:])
	}
	cfg.PasswordKey = &key
	limiter, err := tollgate.NewClient(cfg)
	if err != nil {
		log.Fatal(err)
	}
	s := &server{limiter: limiter, salt: make([]byte, 16)}
	rand.Read(s.salt)
	s.users = map[string][32]byte{"alice": s.stretch(*demo)}
	mux := http.NewServeMux()
	mux.HandleFunc("/login", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			reply(w, http.StatusMethodNotAllowed, `{"error":"POST only"}`)
			return
		}
		s.login(w, r)
	})
	log.Printf("listening on http://%s/login", *listen)
	log.Fatal(http.ListenAndServe(*listen, mux))
}
