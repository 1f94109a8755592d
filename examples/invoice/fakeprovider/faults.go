package fakeprovider

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// Fault is a scripted misbehaviour for one POST request (a charge or an email). Faults
// are chosen when the request has been read, in request order, so the same script, seed
// and request order give the same faults.
type Fault int

const (
	// LoseAnswer performs the charge, then drops the connection without answering:
	// the caller cannot know whether it happened (accept-then-drop, via http.Hijacker).
	LoseAnswer Fault = iota + 1
	// DropBeforeAccept reads the request, then drops the connection before doing
	// anything: nothing is committed or stored.
	DropBeforeAccept
	// SlowAnswer performs the charge, then answers after the slow delay
	// (accept-then-delay). A caller that leaves meanwhile gets no answer; the charge
	// stands.
	SlowAnswer
	// RateLimited answers 429 with Retry-After: 1 before the idempotency layer: nothing
	// is done and nothing is stored (Stripe, IETF draft).
	RateLimited
	// Unavailable answers 503 without doing or storing anything: a same-key retry is a
	// fresh attempt.
	Unavailable
	// Stored500 performs nothing and answers 500 api_error. The stripe dialect stores
	// the 500 under the key, so a same-key retry replays it and a lookup of the key
	// reports a StoredFailureError; the ietf and brandur dialects store nothing.
	Stored500
	// Hold accepts the request as in flight and holds it, uncommitted, for the slow
	// delay; then commits and answers. Meanwhile a request with the same key gets 409
	// (matrix row T4). A caller that leaves does not stop the commit.
	Hold
	// Decline answers 402 card_declined whatever the amount, stored under the key like
	// any decline.
	Decline
	// Delay waits the slow delay before doing anything, then commits and answers as
	// usual (a slow provider, or a slow network before it). A caller that leaves
	// meanwhile does not stop the commit.
	Delay
)

var faultNames = [...]string{
	LoseAnswer:       "lose_answer",
	DropBeforeAccept: "drop_before_accept",
	SlowAnswer:       "slow_answer",
	RateLimited:      "rate_limited",
	Unavailable:      "unavailable",
	Stored500:        "stored_500",
	Hold:             "hold",
	Decline:          "decline",
	Delay:            "delay",
}

// String is the fault's snake_case name, as ParseFault, the request log and
// POST /_admin/script spell it; the zero Fault is "none".
func (f Fault) String() string {
	if f == 0 {
		return "none"
	}
	if f > 0 && int(f) < len(faultNames) {
		return faultNames[f]
	}
	return fmt.Sprintf("fault(%d)", int(f))
}

// ParseFault reads a fault by its snake_case name (lose_answer, drop_before_accept,
// slow_answer, rate_limited, unavailable, stored_500, hold, decline, delay). Hyphens
// are accepted for underscores.
func ParseFault(name string) (Fault, error) {
	n := strings.ReplaceAll(strings.ToLower(strings.TrimSpace(name)), "-", "_")
	for f, s := range faultNames {
		if s != "" && s == n {
			return Fault(f), nil
		}
	}
	return 0, fmt.Errorf("fakeprovider: unknown fault %q", name)
}

// MarshalText writes the fault's name, so JSON carries "stored_500" rather than 6.
func (f Fault) MarshalText() ([]byte, error) {
	if f <= 0 || int(f) >= len(faultNames) {
		return nil, fmt.Errorf("fakeprovider: no name for fault %d", int(f))
	}
	return []byte(f.String()), nil
}

// UnmarshalText reads a fault's name (see ParseFault).
func (f *Fault) UnmarshalText(b []byte) error {
	p, err := ParseFault(string(b))
	if err != nil {
		return err
	}
	*f = p
	return nil
}

// randomRule injects a fault into each request with probability p.
type randomRule struct {
	p float64
	f Fault
}

// script holds every scripted fault. Its owner serialises access (Server.mu).
type script struct {
	byKey     map[string][]Fault // idempotency key -> faults for its next requests
	byInvoice map[string][]Fault // invoice -> faults for its next requests
	nth       map[int64]Fault    // n-th charge request overall (1-based) -> fault
	random    []randomRule
	rng       *rand.Rand
}

func newScript(seed int64) *script {
	return &script{
		byKey:     map[string][]Fault{},
		byInvoice: map[string][]Fault{},
		nth:       map[int64]Fault{},
		rng:       rand.New(rand.NewPCG(uint64(seed), 0x6661_6b65_7072_6f76)), // "fakeprov"
	}
}

// pick chooses the fault for one request: the first of the key's queue, the invoice's
// queue, the n-th rule (n is the charge request's number, 0 for other requests) and the
// random rules, in this order. Every random rule draws once for every request whatever
// matched before it, so the random stream depends on the request order only, not on
// the other rules.
func (sc *script) pick(key, invoice string, n int64) Fault {
	var random Fault
	for _, r := range sc.random {
		if sc.rng.Float64() < r.p && random == 0 {
			random = r.f
		}
	}
	if f, ok := pop(sc.byKey, key); ok {
		return f
	}
	if f, ok := pop(sc.byInvoice, invoice); ok {
		return f
	}
	if f, ok := sc.nth[n]; ok && n > 0 {
		delete(sc.nth, n)
		return f
	}
	return random
}

func pop(m map[string][]Fault, k string) (Fault, bool) {
	q := m[k]
	if k == "" || len(q) == 0 {
		return 0, false
	}
	if len(q) == 1 {
		delete(m, k)
	} else {
		m[k] = q[1:]
	}
	return q[0], true
}

// Script queues faults for an invoice's next requests, one fault per request.
func (s *Server) Script(invoice string, faults ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script.byInvoice[invoice] = append(s.script.byInvoice[invoice], faults...)
}

// ScriptKey queues faults for the next requests carrying an idempotency key, one fault
// per request. Key rules win over every other rule.
func (s *Server) ScriptKey(key string, faults ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script.byKey[key] = append(s.script.byKey[key], faults...)
}

// ScriptNth injects f into the n-th charge request overall (1-based, counted like
// Requests), unless a key or invoice rule matches it first. A later call for the same
// n replaces the fault.
func (s *Server) ScriptNth(n int64, f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script.nth[n] = f
}

// ScriptRandom injects f into each later POST request independently with probability p,
// drawn from a generator seeded with Options.Seed, when no key, invoice or n-th rule
// matches first. Rules add up; the first rule that draws a hit wins.
func (s *Server) ScriptRandom(p float64, f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script.random = append(s.script.random, randomRule{p: p, f: f})
}

// ClearFaults forgets every scripted fault (the drain phase of a scenario). The random
// generator keeps its position.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	rng := s.script.rng
	s.script = newScript(0)
	s.script.rng = rng
}
