package tollgate

// GCRA (generic cell rate algorithm), as the daemon and the Rust client
// run it: a rate limit whose whole state is one theoretical arrival time
// (TAT). Used for static budgets: what a closed route lets through per
// client process while the daemon cannot answer.

import (
	"math"
	"time"
)

// gcraSpec is `burst` at once, refilled at one per intervalUs.
type gcraSpec struct {
	intervalUs uint64
	burst      uint32
}

// newGcraSpec makes limit per period, burst at once (each at least 1, as
// ClientConfig::static_budget does).
func newGcraSpec(limit uint32, period time.Duration, burst uint32) gcraSpec {
	if limit == 0 {
		limit = 1
	}
	if burst == 0 {
		burst = 1
	}
	periodUs := uint64(1)
	if period > time.Microsecond {
		periodUs = uint64(period / time.Microsecond)
	}
	interval := (periodUs + uint64(limit) - 1) / uint64(limit)
	if interval == 0 {
		interval = 1
	}
	return gcraSpec{intervalUs: interval, burst: burst}
}

func saturatingAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

func saturatingMul(a, b uint64) uint64 {
	if a != 0 && b > math.MaxUint64/a {
		return math.MaxUint64
	}
	return a * b
}

// gcraDecision is one step's answer.
type gcraDecision struct {
	allowed      bool
	remaining    uint32
	retryAfterUs uint64
}

// gcraDecide decides one request at nowUs against tat (0: none yet) and
// returns the new TAT: unchanged when refused or when spend is false.
// Refused when tat + interval − tolerance > now; compared as
// tat + interval > now + tolerance so nothing goes below zero.
func gcraDecide(spec gcraSpec, tat, nowUs uint64, spend bool) (gcraDecision, uint64) {
	if tat < nowUs {
		tat = nowUs
	}
	tolerance := saturatingMul(spec.intervalUs, uint64(spec.burst))
	newTat := saturatingAdd(tat, spec.intervalUs)
	horizon := saturatingAdd(nowUs, tolerance)
	if newTat > horizon {
		return gcraDecision{retryAfterUs: newTat - horizon}, tat
	}
	after := tat
	if spend {
		after = newTat
	}
	room := (horizon - newTat) / spec.intervalUs
	if room > math.MaxUint32 {
		room = math.MaxUint32
	}
	return gcraDecision{allowed: true, remaining: uint32(room)}, after
}
