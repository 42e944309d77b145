package tollgate

// Which checks of this client are in a burst, as client/src/burst.rs: a
// timeout from a busy daemon stops a login only when another check on the
// same account (or, without one, the same address) was waiting on this
// client at the same time, or started less than burstGap before it. A lone
// user's timeout during a flood on other accounts is an outage for the
// fail policy, not a refusal.

import (
	"sync"
	"time"
)

// burstGap: checks on one key this close together are one burst even if
// they do not overlap: far shorter than a person's next try, longer than a
// loaded host's scheduling delay.
const burstGap = 50 * time.Millisecond

// burstSweepAt is the entry count past which ended entries are swept.
const burstSweepAt = 1024

type burstEntry struct {
	waiting uint32
	newest  uint64
	started time.Duration // since bursts.epoch, plus burstGap (0 is never a start)
}

type bursts struct {
	mu      sync.Mutex
	entries map[string]*burstEntry
	seq     uint64
	epoch   time.Time
}

func newBursts() *bursts {
	return &bursts{entries: make(map[string]*burstEntry), epoch: time.Now()}
}

// burstGuard is one check counted as waiting until leave.
type burstGuard struct {
	bursts  *bursts
	key     string
	seq     uint64
	company bool
}

func burstKey(route string, s *Subject) string {
	switch {
	case s.Account != nil:
		return route + "\x00a" + *s.Account
	case s.Peer.IsValid():
		return route + "\x00p" + s.Peer.String()
	default:
		return route + "\x00-"
	}
}

func (b *bursts) enter(route string, s *Subject) *burstGuard {
	key := burstKey(route, s)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	now := time.Since(b.epoch) + burstGap
	if len(b.entries) >= burstSweepAt {
		if _, ok := b.entries[key]; !ok {
			for k, e := range b.entries {
				if e.waiting == 0 && now-e.started >= burstGap {
					delete(b.entries, k)
				}
			}
		}
	}
	e := b.entries[key]
	if e == nil {
		e = &burstEntry{}
		b.entries[key] = e
	}
	company := e.waiting > 0 || (e.started > 0 && now-e.started < burstGap)
	e.waiting++
	e.newest = b.seq
	e.started = now
	return &burstGuard{bursts: b, key: key, seq: b.seq, company: company}
}

// inBurst: another check on its key waited while it did (before or after
// it came), or started within burstGap before it.
func (g *burstGuard) inBurst() bool {
	g.bursts.mu.Lock()
	defer g.bursts.mu.Unlock()
	e := g.bursts.entries[g.key]
	return g.company || (e != nil && e.newest > g.seq)
}

func (g *burstGuard) leave() {
	g.bursts.mu.Lock()
	defer g.bursts.mu.Unlock()
	if e := g.bursts.entries[g.key]; e != nil {
		e.waiting--
	}
}
