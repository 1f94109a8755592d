package console

import (
	"container/list"
	"net"
	"net/netip"
	"sync"
	"time"
)

// throttle slows password guessing down without locking anyone out for long.
//
// Failed logins are counted per name and per client address (an IPv6 client by its
// /64), and per device: a browser that has logged in as an operator before carries a
// signed cookie saying so (deviceCookie), and its attempts for that operator are counted
// on that cookie alone, so that nobody else's failures, for the name or from a shared
// proxy's address, slow it down. After a rule's free failures, every further attempt
// waits: 1s after the next failure, doubling with each one, at most two minutes; a
// failure older than forgetAfter is forgotten. An attempt during the wait is refused
// without checking the password and is not counted.
//
// Memory is bounded: the operators' own names are always kept (there are few), the rest
// in at most throttleSlots entries; a new entry then evicts, among the evictScan least
// recently failed, the one with the fewest live failures. A flood of failures for new
// names or addresses evicts its own kind, never a name or address it was meant to hide.
type throttle struct {
	mu     sync.Mutex
	pinned map[string]*strikes
	recent map[string]*list.Element // of *strikes; the least recently failed at the back
	order  list.List
	slots  int
}

// strikes are one key's failures.
type strikes struct {
	key      string
	failures int
	last     time.Time
}

// rule is how a kind of key is throttled.
type rule struct {
	free       int
	first, max time.Duration
}

// throttleKey is one thing an attempt is counted on.
type throttleKey struct {
	id   string
	rule rule
}

var (
	nameRule    = rule{free: 3, first: time.Second, max: 2 * time.Minute}
	addressRule = rule{free: 10, first: time.Second, max: 2 * time.Minute}
	deviceRule  = rule{free: 5, first: time.Second, max: 2 * time.Minute}
)

const (
	forgetAfter   = 15 * time.Minute
	throttleSlots = 10000
	evictScan     = 32
)

func newThrottle(names []string, slots int) *throttle {
	t := &throttle{pinned: map[string]*strikes{}, recent: map[string]*list.Element{}, slots: slots}
	for _, n := range names {
		t.pinned["name:"+n] = &strikes{key: "name:" + n}
	}
	return t
}

// delay is how long an attempt waits after n failures.
func (r rule) delay(n int) time.Duration {
	if n < r.free {
		return 0
	}
	if shift := n - r.free; shift < 16 {
		return min(r.first<<shift, r.max)
	}
	return r.max
}

// live is s's failures that still count at now.
func (s *strikes) live(now time.Time) int {
	if now.Sub(s.last) > forgetAfter {
		return 0
	}
	return s.failures
}

// wait is how long an attempt counted on keys must still wait at now (0: go ahead).
func (t *throttle) wait(now time.Time, keys ...throttleKey) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	var longest time.Duration
	for _, k := range keys {
		if s := t.lookup(k.id); s != nil {
			longest = max(longest, s.last.Add(k.rule.delay(s.live(now))).Sub(now))
		}
	}
	return longest
}

// fail counts a failed attempt on keys.
func (t *throttle) fail(now time.Time, keys ...throttleKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		s := t.lookup(k.id)
		if s == nil {
			s = t.add(now, k.id)
		}
		s.failures, s.last = s.live(now)+1, now
		if e, ok := t.recent[k.id]; ok {
			t.order.MoveToFront(e)
		}
	}
}

// forget clears keys' failures (a device's, once its operator is in).
func (t *throttle) forget(keys ...throttleKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		if e, ok := t.recent[k.id]; ok {
			t.order.Remove(e)
			delete(t.recent, k.id)
		}
	}
}

func (t *throttle) lookup(id string) *strikes {
	if s, ok := t.pinned[id]; ok {
		return s
	}
	if e, ok := t.recent[id]; ok {
		return e.Value.(*strikes)
	}
	return nil
}

func (t *throttle) add(now time.Time, id string) *strikes {
	if len(t.recent) >= t.slots {
		t.evict(now)
	}
	s := &strikes{key: id}
	t.recent[id] = t.order.PushFront(s)
	return s
}

// evict drops, of the evictScan least recently failed entries, the one with the fewest
// live failures (the oldest of those).
func (t *throttle) evict(now time.Time) {
	var victim *list.Element
	least := -1
	e := t.order.Back()
	for i := 0; e != nil && i < evictScan; i, e = i+1, e.Prev() {
		if n := e.Value.(*strikes).live(now); least < 0 || n < least {
			victim, least = e, n
		}
	}
	if victim != nil {
		t.order.Remove(victim)
		delete(t.recent, victim.Value.(*strikes).key)
	}
}

// size is how many entries t holds besides the pinned ones.
func (t *throttle) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.recent)
}

// clientKey is what a client address is counted as: an IPv4 address, an IPv6 client's
// /64 (one subscriber has them all), or the remote address as given when it does not
// parse.
func clientKey(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return "addr:" + host
	}
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return "addr:" + p.String()
	}
	return "addr:" + a.String()
}
