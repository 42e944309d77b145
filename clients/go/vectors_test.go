package tollgate

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// repoFile is a file of the repository this module lives in (go test runs
// in the package directory, clients/go).
func repoFile(t *testing.T, rel string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

type vectorField struct {
	Hex     string `json:"hex"`
	Meaning string `json:"meaning"`
}

type protocolVector struct {
	Name    string        `json:"name"`
	Kind    string        `json:"kind"`
	ID      uint64        `json:"id"`
	Version *uint8        `json:"version"`
	Frame   string        `json:"frame"`
	Fields  []vectorField `json:"fields"`
}

// fieldValues reads each meaning, `<type> <field> = <value> (note)`, into
// field -> value (strings unquoted).
func fieldValues(t *testing.T, v protocolVector) map[string]string {
	t.Helper()
	values := map[string]string{}
	joined := ""
	for _, f := range v.Fields {
		joined += f.Hex
		typ, rest, _ := strings.Cut(f.Meaning, " ")
		name, value, ok := strings.Cut(rest, " = ")
		if !ok {
			t.Fatalf("%s: cannot read meaning %q", v.Name, f.Meaning)
		}
		if typ == "utf8" {
			var s string
			if err := json.NewDecoder(strings.NewReader(value)).Decode(&s); err != nil {
				t.Fatalf("%s: string in %q: %v", v.Name, f.Meaning, err)
			}
			value = s
		} else {
			value, _, _ = strings.Cut(value, " ")
		}
		values[name] = value
	}
	if joined != v.Frame {
		t.Fatalf("%s: fields do not join to the frame", v.Name)
	}
	return values
}

func loadProtocolVectors(t *testing.T) []protocolVector {
	var file struct {
		Vectors []protocolVector `json:"vectors"`
	}
	if err := json.Unmarshal(repoFile(t, "tests/vectors/protocol.json"), &file); err != nil {
		t.Fatal(err)
	}
	return file.Vectors
}

func num(t *testing.T, values map[string]string, name string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(values[name], 10, 64)
	if err != nil {
		t.Fatalf("field %s = %q: %v", name, values[name], err)
	}
	return n
}

func optionalField(values map[string]string, name string) *string {
	if values[name+" tag"] != "1" {
		return nil
	}
	return Some(values[name])
}

func optionalBytes(t *testing.T, values map[string]string, name string) *[16]byte {
	if values[name+" tag"] != "1" {
		return nil
	}
	raw, err := hex.DecodeString(values[name])
	if err != nil || len(raw) != 16 {
		t.Fatalf("%s = %q", name, values[name])
	}
	var b [16]byte
	copy(b[:], raw)
	return &b
}

func TestEncodesEveryCheckReportAndAbandonVector(t *testing.T) {
	encoded := 0
	for _, v := range loadProtocolVectors(t) {
		if v.Kind != "request" {
			continue
		}
		values := fieldValues(t, v)
		kind := uint32(num(t, values, "Request variant"))
		if kind != requestCheck && kind != requestReport && kind != requestAbandon {
			continue // admin and operator requests: the tollgate CLI's
		}
		req := &request{kind: kind, route: values["route"]}
		if values["subject.peer tag"] == "1" {
			req.subject.Peer = netip.MustParseAddr(values["subject.peer"])
		}
		req.subject.ForwardedFor = optionalField(values, "subject.forwarded_for")
		req.subject.Account = optionalField(values, "subject.account")
		req.subject.Device = optionalField(values, "subject.device")
		req.subject.Tenant = optionalField(values, "subject.tenant")
		req.subject.ClientID = optionalField(values, "subject.client_id")
		if kind == requestReport {
			req.outcome = Outcome(num(t, values, "outcome"))
			req.digest = optionalBytes(t, values, "password_digest")
		}
		req.passwordTag = optionalBytes(t, values, "password_tag")
		version := uint8(num(t, values, "version"))
		got := hex.EncodeToString(encodeRequest(nil, version, num(t, values, "request id"), req))
		if got != v.Frame {
			t.Errorf("%s:\n got %s\nwant %s", v.Name, got, v.Frame)
		}
		encoded++
	}
	if encoded < 10 {
		t.Fatalf("only %d request vectors encoded", encoded)
	}
}

func TestDecodesEveryVerdictAndErrorVector(t *testing.T) {
	decoded := 0
	for _, v := range loadProtocolVectors(t) {
		if v.Kind != "response" {
			continue
		}
		values := fieldValues(t, v)
		kind := uint32(num(t, values, "Response variant"))
		frame, _ := hex.DecodeString(v.Frame)
		// A newer version's reply (the daemon's admin requests): this
		// client never asks in it, and refuses such a frame.
		if kind != responseVerdict && kind != responseError || num(t, values, "version") > uint64(ProtocolVersion) {
			if _, err := decodeResponse(frame[4:]); err == nil {
				t.Errorf("%s: a reply no check gets decoded", v.Name)
			}
			continue
		}
		if n := num(t, values, "frame length"); n != uint64(len(frame)-4) {
			t.Fatalf("%s: length %d", v.Name, n)
		}
		resp, err := decodeResponse(frame[4:])
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		if resp.id != v.ID || uint64(resp.version) != num(t, values, "version") {
			t.Errorf("%s: id %d version %d", v.Name, resp.id, resp.version)
		}
		if kind == responseVerdict {
			got := resp.verdict
			want := Verdict{
				Decision:     Decision(num(t, values, "decision")),
				RetryAfterMs: num(t, values, "retry_after_ms"),
				DelayMs:      num(t, values, "delay_ms"),
				Limit:        uint32(num(t, values, "limit")),
				Remaining:    uint32(num(t, values, "remaining")),
				ResetMs:      num(t, values, "reset_ms"),
				Reason:       Reason(num(t, values, "reason")),
				Rule:         values["rule"],
				Version:      resp.version,
			}
			if flags, ok := values["flags"]; ok {
				want.Degraded = flags == "1" || flags == "3"
			}
			if got == nil || *got != want {
				t.Errorf("%s: got %+v want %+v", v.Name, got, want)
			}
		} else {
			got := resp.errorReply
			want := ErrorReply{Code: ErrorCode(num(t, values, "code")), Message: values["message"]}
			if got == nil || *got != want {
				t.Errorf("%s: got %+v want %+v", v.Name, got, want)
			}
		}
		decoded++
	}
	if decoded < 20 {
		t.Fatalf("only %d response vectors decoded", decoded)
	}
}

func TestRefusesMalformedReplies(t *testing.T) {
	for _, v := range loadProtocolVectors(t) {
		if v.Name != "verdict-deny-degraded-v5" {
			continue
		}
		frame, _ := hex.DecodeString(v.Frame)
		payload := frame[4:]
		if _, err := decodeResponse(append(append([]byte{}, payload...), 0)); err == nil {
			t.Error("a trailing byte was accepted")
		}
		if _, err := decodeResponse(payload[:len(payload)-1]); err == nil {
			t.Error("a verdict without its flags was accepted")
		}
		reserved := append([]byte{}, payload...)
		reserved[len(reserved)-1] = 0xfe
		if resp, err := decodeResponse(reserved); err != nil || resp.verdict.Degraded {
			t.Errorf("reserved flag bits: %v", err)
		}
		badDecision := append([]byte{}, payload...)
		badDecision[13] = 4
		if _, err := decodeResponse(badDecision); err == nil {
			t.Error("decision 4 was accepted")
		}
		badVersion := append([]byte{}, payload...)
		badVersion[0] = 6
		if _, err := decodeResponse(badVersion); err == nil {
			t.Error("version 6 was accepted")
		}
		return
	}
	t.Fatal("vector missing")
}

func TestPasswordVectors(t *testing.T) {
	var file struct {
		Vectors []struct {
			Key, Account, Password, Digest, Tag string
		} `json:"vectors"`
	}
	if err := json.Unmarshal(repoFile(t, "tests/vectors/passwords.json"), &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Vectors) < 5 {
		t.Fatalf("%d vectors", len(file.Vectors))
	}
	for _, v := range file.Vectors {
		raw, _ := hex.DecodeString(v.Key)
		var key [32]byte
		copy(key[:], raw)
		digest := PasswordDigest(&key, v.Account, v.Password)
		tag := PasswordTag(&key, v.Password)
		if hex.EncodeToString(digest[:]) != v.Digest || hex.EncodeToString(tag[:]) != v.Tag {
			t.Errorf("account %q password %q: digest %x tag %x", v.Account, v.Password, digest, tag)
		}
	}
}

func TestBlake2b512OfAbcFromRFC7693(t *testing.T) {
	h := newBlake2b(64, nil, nil)
	h.Write([]byte("abc"))
	want := "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d1" +
		"7d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923"
	if got := hex.EncodeToString(h.Sum()); got != want {
		t.Fatalf("got %s", got)
	}
	// Split writes across the block edge give the same hash.
	data := bytes.Repeat([]byte("x"), 300)
	whole := newBlake2b(32, []byte("k"), nil)
	whole.Write(data)
	parts := newBlake2b(32, []byte("k"), nil)
	parts.Write(data[:127])
	parts.Write(data[127:129])
	parts.Write(data[129:])
	if !bytes.Equal(whole.Sum(), parts.Sum()) {
		t.Fatal("split writes differ")
	}
}
