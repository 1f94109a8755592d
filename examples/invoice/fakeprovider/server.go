package fakeprovider

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Dialect is how the idempotency layer answers conflicts (docs/reliability.md, Dialects).
type Dialect string

// The three dialects. They differ in the status of a key reused with a different body
// (stripe 400 idempotency_error, ietf 422, brandur 409 idempotency_key_mismatch), in the
// body of the 409 for a key still in flight, and in whether a 500 is stored (stripe only).
const (
	DialectStripe  Dialect = "stripe"
	DialectIETF    Dialect = "ietf"
	DialectBrandur Dialect = "brandur"
)

// Options configure a provider; zero values are the defaults noted.
type Options struct {
	DeclineAboveCents int64         // 0: never decline by amount
	Dialect           Dialect       // default stripe
	Retention         time.Duration // how long keys are kept, on the virtual clock; default 24h
	SearchLag         time.Duration // a charge becomes visible to Search this long after it was made (virtual clock); default 0
	SearchDisabled    bool          // Search answers 501: no authoritative business lookup
	EmailDedupeOff    bool          // /v1/emails ignores Idempotency-Key (a non-idempotent channel, row N1)
	SlowDelay         time.Duration // SlowAnswer / Hold delay; default 2s
	Seed              int64         // for probabilistic faults; printed by whoever sets it
}

// WithDefaults returns a copy of o with the documented defaults filled in.
func (o Options) WithDefaults() Options {
	if o.Dialect == "" {
		o.Dialect = DialectStripe
	}
	if o.Retention == 0 {
		o.Retention = 24 * time.Hour
	}
	if o.SlowDelay == 0 {
		o.SlowDelay = 2 * time.Second
	}
	return o
}

func (o Options) validate() error {
	switch {
	case o.Dialect != DialectStripe && o.Dialect != DialectIETF && o.Dialect != DialectBrandur:
		return fmt.Errorf("fakeprovider: Options.Dialect %q: want stripe, ietf or brandur", o.Dialect)
	case o.Retention < 0:
		return fmt.Errorf("fakeprovider: Options.Retention %v is negative", o.Retention)
	case o.SearchLag < 0:
		return fmt.Errorf("fakeprovider: Options.SearchLag %v is negative", o.SearchLag)
	case o.SlowDelay < 0:
		return fmt.Errorf("fakeprovider: Options.SlowDelay %v is negative", o.SlowDelay)
	case o.DeclineAboveCents < 0:
		return fmt.Errorf("fakeprovider: Options.DeclineAboveCents %d is negative", o.DeclineAboveCents)
	}
	return nil
}

// Charge is one effect the provider performed.
type Charge struct {
	ID          string `json:"id"`
	Invoice     string `json:"invoice"`
	AmountCents int64  `json:"amountCents"`
	// Key is the Idempotency-Key of the request that made the charge.
	Key string `json:"key,omitempty"`
	// Digest is the hex SHA-256 of the canonical request body: the decoded request
	// marshalled again by encoding/json as {"invoice":...,"amountCents":...}, in that
	// field order, whatever the spacing or key order of the bytes sent. For invoice
	// "INV-1" and 500 cents it is the SHA-256 of {"invoice":"INV-1","amountCents":500}.
	// Two requests under one key are the same request exactly when their digests match.
	Digest string `json:"digest,omitempty"`
	// At is when the charge was made, on the provider's virtual clock (Server.Now).
	At time.Time `json:"at,omitzero"`
}

// Email is one email the provider sent.
type Email struct {
	ID string `json:"id"`
	// Key is the Idempotency-Key of the request that sent it, "" if none.
	Key     string `json:"key,omitempty"`
	Invoice string `json:"invoice,omitempty"`
	// To is the recipient. It is kept here and nowhere else: not in the history, not in
	// the stored answer, not in the answer itself (the client fills it in).
	To       string `json:"to,omitempty"`
	Template string `json:"template"`
	// Digest is the hex SHA-256 of the canonical request body
	// {"to":...,"template":...,"invoice":...} marshalled by encoding/json in that order.
	Digest string `json:"digest"`
	// At is when the email was sent, on the provider's virtual clock.
	At time.Time `json:"at,omitzero"`
}

// Server is the fake provider. Its zero value is not usable; use Start or StartWith.
type Server struct {
	// DeclineAboveCents declines charges above this amount with 402 card_declined.
	// Set before use.
	DeclineAboveCents int64
	// SlowDelay is how long SlowAnswer, Hold and Delay hold a request. Set before use.
	SlowDelay time.Duration

	opts     Options
	srv      *http.Server
	ln       net.Listener
	offset   atomic.Int64 // virtual clock minus real time, in nanoseconds
	requests atomic.Int64 // charge requests

	done      chan struct{} // closed by Close: held requests give up
	served    chan struct{} // closed when Serve returns
	closeOnce sync.Once
	closeErr  error
	gate      sync.Mutex // orders handler starts against Close
	closing   bool
	active    sync.WaitGroup // running handlers

	mu      sync.Mutex
	keys    map[string]*entry // idempotency key -> stored answer or request in flight
	charges []Charge
	emails  []Email
	script  *script
	log     []Request
}

// Start listens on a free loopback port with the default options and declines charges
// above declineAboveCents: Start(d) is StartWith(Options{DeclineAboveCents: d}).
func Start(declineAboveCents int64) (*Server, error) {
	return StartWith(Options{DeclineAboveCents: declineAboveCents})
}

// StartWith listens on a free loopback port and serves until Close.
func StartWith(o Options) (*Server, error) {
	o = o.WithDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fakeprovider: listen: %w", err)
	}
	return serve(o, ln), nil
}

// serve runs a provider on ln; o has its defaults and is valid.
func serve(o Options, ln net.Listener) *Server {
	s := &Server{
		DeclineAboveCents: o.DeclineAboveCents,
		SlowDelay:         o.SlowDelay,
		opts:              o,
		ln:                ln,
		done:              make(chan struct{}),
		served:            make(chan struct{}),
		keys:              map[string]*entry{},
		script:            newScript(o.Seed),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", s.postCharge)
	mux.HandleFunc("GET /v1/charges", s.lookup)
	mux.HandleFunc("GET /v1/charges/by-key/{key}", s.lookup)
	mux.HandleFunc("GET /v1/charges/search", s.search)
	mux.HandleFunc("POST /v1/emails", s.postEmail)
	mux.HandleFunc("/v1/", s.unknown)
	s.admin(mux)
	s.srv = &http.Server{Handler: s.track(mux), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(s.served)
		_ = s.srv.Serve(ln)
	}()
	return s
}

// track counts running handlers so that Close can wait for them.
func (s *Server) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.gate.Lock()
		if s.closing {
			s.gate.Unlock()
			hangUp(w)
			return
		}
		s.active.Add(1)
		s.gate.Unlock()
		defer s.active.Done()
		h.ServeHTTP(w, r)
	})
}

// URL is the provider's base URL.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops the server: it closes the listener and every connection, abandons held
// requests without committing them (the provider died) and waits for every handler.
// Calling it again does nothing.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.gate.Lock()
		s.closing = true
		s.gate.Unlock()
		close(s.done)
		s.closeErr = s.srv.Close()
		s.active.Wait()
		<-s.served
		if errors.Is(s.closeErr, net.ErrClosed) {
			s.closeErr = nil
		}
	})
	return s.closeErr
}

// Requests is how many charge requests (POST /v1/charges) arrived, malformed ones
// included.
func (s *Server) Requests() int64 { return s.requests.Load() }

// Charges returns every charge performed, in order.
func (s *Server) Charges() []Charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Charge(nil), s.charges...)
}

// Emails returns every email sent, in order.
func (s *Server) Emails() []Email {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Email(nil), s.emails...)
}

// DoubleCharges counts invoices charged more than once.
func (s *Server) DoubleCharges() int {
	n := map[string]int{}
	for _, c := range s.Charges() {
		n[c.Invoice]++
	}
	d := 0
	for _, k := range n {
		if k > 1 {
			d++
		}
	}
	return d
}

// hangUp closes the connection without an answer.
func hangUp(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			_ = c.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}
