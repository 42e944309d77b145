package tollgate

// Which checks of this client are in a burst, as client/src/burst.rs: a
// timeout from a busy daemon stops a login only when another check on the
// same account (or, without one, the same address) was waiting on this
// client at the same time, or started less than burstGap before it. A lone
// user's timeout during a flood on other accounts is an outage for the
// fail policy, not a refusal.
//
// A burst on her account is not always hers, though: anyone can check her
// account from other addresses. So each check also has a requester key
// (route, tenant, account, address and X-Forwarded-For: behind a reverse
// proxy the address is the proxy's, and only the forwarded header tells
// her from an attacker). Parallel checks on one account from one requester
// are a guesser's, and are refused as busy for as long as they last. A user who has logged in from this address through this client
// (knownRequesters) is refused as busy in others' bursts on her account
// (checks from other addresses) for at most BusyMax in a window of
// 120 x BusyMax per requester (busyWindows), so nobody can keep her out by
// checking her account; past that her timeout follows the fail policy.
// Anyone else in a burst on the account (a guesser's other addresses, a
// botnet) stays busy for as long as the burst lasts: a late guess that
// failed open would be admitted with no check at all.

import (
	"container/list"
	"math"
	"strconv"
	"sync"
	"time"
)

// burstGap: checks on one key this close together are one burst even if
// they do not overlap: far shorter than a person's next try, longer than a
// loaded host's scheduling delay.
const burstGap = 50 * time.Millisecond

// burstSweepAt is the entry count past which ended entries are swept.
const burstSweepAt = 1024

// busyWindowSpans: a requester's busy window lasts this many BusyMax, of
// which only the first BusyMax refuses a check in others' burst.
const busyWindowSpans = 120

// busyRequestersMax bounds the requesters with a busy window.
const busyRequestersMax = 4096

// knownFor: a requester's success keeps it known this long.
const knownFor = 30 * 24 * time.Hour

// knownRequestersMax bounds the known requesters.
const knownRequestersMax = 65536

// knownPerAccountMax bounds the known requesters of one account.
const knownPerAccountMax = 16

type burstEntry struct {
	waiting uint32
	newest  uint64
	started time.Duration // since bursts.epoch, plus burstGap (0 is never a start)
}

// bursts holds burst keys and requester keys in one map (their tags keep
// them apart), with the same bookkeeping for both.
type bursts struct {
	mu      sync.Mutex
	entries map[string]*burstEntry
	seq     uint64
	epoch   time.Time
}

func newBursts() *bursts {
	return &bursts{entries: make(map[string]*burstEntry), epoch: time.Now()}
}

// burstGuard is one check counted as waiting until leave, on its burst key
// and its requester key (the same key when the subject lacks an account or
// an address).
type burstGuard struct {
	bursts    *bursts
	key       string
	requester string
	seq       uint64
	company   bool
	// ownCompany: company on the requester key.
	ownCompany bool
}

// keyOf joins a tag and fields with their lengths, so that no two
// different lists of fields (nor tags) make the same key.
func keyOf(tag byte, fields ...string) string {
	b := []byte{tag}
	for _, f := range fields {
		b = appendField(b, f)
	}
	return string(b)
}

func appendField(b []byte, f string) []byte {
	b = append(b, '|')
	b = strconv.AppendInt(b, int64(len(f)), 10)
	b = append(b, ':')
	return append(b, f...)
}

// appendOptional is appendField for a field that may be absent: absent is
// "|-", which no present field (a length first) makes, not even an empty one.
func appendOptional(b []byte, f *string) []byte {
	if f == nil {
		return append(b, '|', '-')
	}
	return appendField(b, *f)
}

func burstKey(route string, s *Subject) string {
	switch {
	case s.Account != nil:
		return keyOf('1', route, *s.Account)
	case s.Peer.IsValid():
		return keyOf('2', route, s.Peer.String())
	default:
		return keyOf('0', route)
	}
}

// requesterKey is who asks: the route, tenant, account, address and
// X-Forwarded-For (as sent, bounded) when the subject has an account and
// an address or a forwarded header, else its burst key. Behind a reverse
// proxy every user's address is the proxy's: without the forwarded header
// an attacker's checks on her account would be her own burst. The tenant
// keeps one account name in two tenants two requesters.
func requesterKey(route string, s *Subject) string {
	if s.Account == nil || (!s.Peer.IsValid() && s.ForwardedFor == nil) {
		return burstKey(route, s)
	}
	var peer *string
	if s.Peer.IsValid() {
		peer = Some(s.Peer.String())
	}
	b := appendField([]byte{'3'}, route)
	b = appendOptional(b, s.Tenant)
	b = appendField(b, *s.Account)
	b = appendOptional(b, peer)
	b = appendOptional(b, s.ForwardedFor)
	return string(b)
}

// accountKey is whose account a requester's success is on: route, tenant
// and account; without an account the requester is an address (or the
// route alone) and is its own group.
func accountKey(route string, s *Subject) string {
	if s.Account == nil {
		return requesterKey(route, s)
	}
	b := appendField([]byte{'4'}, route)
	b = appendOptional(b, s.Tenant)
	return string(appendField(b, *s.Account))
}

// join counts one more check waiting on key started at now (seq); whether
// it has company there. Called with b.mu held.
func (b *bursts) join(key string, now time.Duration) bool {
	e := b.entries[key]
	if e == nil {
		e = &burstEntry{}
		b.entries[key] = e
	}
	company := e.waiting > 0 || (e.started > 0 && now-e.started < burstGap)
	e.waiting++
	e.newest = b.seq
	e.started = now
	return company
}

func (b *bursts) enter(route string, s *Subject) *burstGuard {
	key, requester := burstKey(route, s), requesterKey(route, s)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	now := time.Since(b.epoch) + burstGap
	if len(b.entries) >= burstSweepAt {
		_, hasKey := b.entries[key]
		_, hasRequester := b.entries[requester]
		if !hasKey || !hasRequester {
			for k, e := range b.entries {
				if e.waiting == 0 && now-e.started >= burstGap {
					delete(b.entries, k)
				}
			}
		}
	}
	g := &burstGuard{bursts: b, key: key, requester: requester, seq: b.seq}
	g.company = b.join(key, now)
	if requester == key {
		g.ownCompany = g.company
	} else {
		g.ownCompany = b.join(requester, now)
	}
	return g
}

// inBurst: another check on its key waited while it did (before or after
// it came), or started within burstGap before it.
func (g *burstGuard) inBurst() bool {
	return g.busyOn(g.key, g.company)
}

// ownBurst is inBurst on its requester key: another check on the same
// account from the same address (or, lacking either, on its burst key).
func (g *burstGuard) ownBurst() bool {
	return g.busyOn(g.requester, g.ownCompany)
}

func (g *burstGuard) busyOn(key string, company bool) bool {
	g.bursts.mu.Lock()
	defer g.bursts.mu.Unlock()
	e := g.bursts.entries[key]
	return company || (e != nil && e.newest > g.seq)
}

func (g *burstGuard) leave() {
	g.bursts.mu.Lock()
	defer g.bursts.mu.Unlock()
	if e := g.bursts.entries[g.key]; e != nil {
		e.waiting--
	}
	if g.requester != g.key {
		if e := g.bursts.entries[g.requester]; e != nil {
			e.waiting--
		}
	}
}

// busyWindows: per requester, when its window's first busy refusal came
// (a monotonic time since the client started). A known requester's check
// in others' burst on its account is busy only in the first BusyMax of
// that window, so checks on her account from other addresses cannot keep
// her out; the window, 120 x BusyMax, keeps her from being refused again
// right after.
type busyWindows struct {
	mu    sync.Mutex
	first map[string]time.Duration
}

func newBusyWindows() *busyWindows {
	return &busyWindows{first: make(map[string]time.Duration)}
}

// excused: whether a timeout of requester's in others' burst, at now, may
// still be refused as busy (its window started then if none was open).
func (w *busyWindows) excused(requester string, now, busyMax time.Duration) bool {
	window := busyWindow(busyMax)
	w.mu.Lock()
	defer w.mu.Unlock()
	if first, ok := w.first[requester]; ok {
		if now-first < window {
			return now-first < busyMax
		}
		w.first[requester] = now
		return busyMax > 0
	}
	if len(w.first) >= busyRequestersMax {
		for k, first := range w.first {
			if now-first >= window {
				delete(w.first, k)
			}
		}
		// Still full: every window is live. A flood of new keys must not
		// push one out, or its requester would be refused afresh.
		if len(w.first) >= busyRequestersMax {
			return false
		}
	}
	w.first[requester] = now
	return busyMax > 0
}

// busyWindow is busyWindowSpans x busyMax, saturating: a huge BusyMax is a
// window that never ends, not one that wraps around to the past.
func busyWindow(busyMax time.Duration) time.Duration {
	if busyMax > math.MaxInt64/busyWindowSpans {
		return math.MaxInt64
	}
	if busyMax < math.MinInt64/busyWindowSpans {
		return math.MinInt64
	}
	return busyWindowSpans * busyMax
}

// knownRequesters: per requester, when a success was last reported through
// this client for it (a monotonic time since the client started). Only a
// known requester leaves busy in others' bursts on its account after its
// window's BusyMax: she has logged in from that address before, while a
// guesser's other addresses (or a botnet's) have not, and their late
// guesses must not fail open unchecked.
//
// Bounded per account (knownPerAccountMax) and in all
// (knownRequestersMax), each evicting its least recent success. An
// attacker logging in to his own account from fresh addresses could
// otherwise push every user out with 65,536 logins; capped per account he
// needs 4,096 accounts of his own. Eviction takes the front of a recency
// list (and a scan of one account's 16 at most), never a scan of the whole
// map under the lock.
type knownRequesters struct {
	mu sync.Mutex
	// entries: requester key -> its element in order.
	entries map[string]*list.Element
	// order: every *knownEntry, least recent success first.
	order *list.List
	// accounts: account key -> its entries, least recent first.
	accounts map[string][]*knownEntry
}

type knownEntry struct {
	requester string
	account   string
	last      time.Duration
}

func newKnownRequesters() *knownRequesters {
	return &knownRequesters{entries: make(map[string]*list.Element), order: list.New(), accounts: make(map[string][]*knownEntry)}
}

// succeeded records a success of requester's (on account) at now, making
// it the most recent one, globally and in its account.
func (k *knownRequesters) succeeded(requester, account string, now time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if el, ok := k.entries[requester]; ok {
		e := el.Value.(*knownEntry)
		e.last = now
		k.order.MoveToBack(el)
		k.dropFromAccount(e)
		k.accounts[e.account] = append(k.accounts[e.account], e)
		return
	}
	if mine := k.accounts[account]; len(mine) >= knownPerAccountMax {
		k.remove(mine[0])
	}
	if k.order.Len() >= knownRequestersMax {
		k.remove(k.order.Front().Value.(*knownEntry))
	}
	e := &knownEntry{requester: requester, account: account, last: now}
	k.entries[requester] = k.order.PushBack(e)
	k.accounts[account] = append(k.accounts[account], e)
}

// remove forgets e everywhere. Called with k.mu held.
func (k *knownRequesters) remove(e *knownEntry) {
	k.order.Remove(k.entries[e.requester])
	delete(k.entries, e.requester)
	k.dropFromAccount(e)
	if len(k.accounts[e.account]) == 0 {
		delete(k.accounts, e.account)
	}
}

// dropFromAccount takes e out of its account's list (16 at most), keeping
// the order of the others. Called with k.mu held.
func (k *knownRequesters) dropFromAccount(e *knownEntry) {
	mine := k.accounts[e.account]
	for i, other := range mine {
		if other == e {
			copy(mine[i:], mine[i+1:])
			mine[len(mine)-1] = nil
			k.accounts[e.account] = mine[:len(mine)-1]
			return
		}
	}
}

// known: whether requester had a success reported within knownFor of now.
// An expired entry stays until evicted.
func (k *knownRequesters) known(requester string, now time.Duration) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	el, ok := k.entries[requester]
	return ok && now-el.Value.(*knownEntry).last < knownFor
}
