// Package fakeprovider is a deterministic fake payment provider over HTTP, for what we
// cannot run for real: it honours Idempotency-Key like Stripe (the same key replays the
// stored answer; the same key with a different body is refused), records every request,
// and injects scripted faults per invoice. The demo and the tests charge through it.
package fakeprovider

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Fault is a scripted misbehaviour for one request.
type Fault int

const (
	// LoseAnswer performs the charge, then drops the connection without answering:
	// the caller cannot know whether it happened.
	LoseAnswer Fault = iota + 1
	// DropBeforeAccept drops the connection before doing anything.
	DropBeforeAccept
	// SlowAnswer performs the charge, then answers after Server.SlowDelay.
	SlowAnswer
	// RateLimited answers 429 with Retry-After: 1 before the idempotency layer: nothing
	// is done and nothing is stored (Stripe, IETF draft).
	RateLimited
	// Unavailable answers 503 without doing or storing anything.
	Unavailable
)

// Charge is one effect the provider performed.
type Charge struct {
	ID          string `json:"id"`
	Invoice     string `json:"invoice"`
	AmountCents int64  `json:"amountCents"`
}

type stored struct {
	digest string
	status int
	body   []byte
}

// Server is the fake provider. Its zero value is not usable; use Start.
type Server struct {
	// DeclineAboveCents declines charges above this amount with 402 card_declined.
	DeclineAboveCents int64
	// SlowDelay is how long a SlowAnswer fault holds the answer back. Set before use.
	SlowDelay time.Duration

	srv      *http.Server
	ln       net.Listener
	requests atomic.Int64

	mu      sync.Mutex
	byKey   map[string]stored
	charges []Charge
	faults  map[string][]Fault // invoice -> faults for its next requests, in order
}

// Start listens on a free loopback port.
func Start(declineAboveCents int64) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{DeclineAboveCents: declineAboveCents, ln: ln, byKey: map[string]stored{}, faults: map[string][]Fault{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", s.charge)
	mux.HandleFunc("GET /v1/charges", s.lookup)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// URL is the provider's base URL.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops the server.
func (s *Server) Close() error { return s.srv.Close() }

// Script queues faults for an invoice's next requests.
func (s *Server) Script(invoice string, faults ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[invoice] = append(s.faults[invoice], faults...)
}

// Requests is how many charge requests arrived.
func (s *Server) Requests() int64 { return s.requests.Load() }

// Charges returns every charge performed.
func (s *Server) Charges() []Charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Charge(nil), s.charges...)
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

type chargeRequest struct {
	Invoice     string `json:"invoice"`
	AmountCents int64  `json:"amountCents"`
}

func (s *Server) charge(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	key := r.Header.Get("Idempotency-Key")
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	var req chargeRequest
	if err != nil || json.Unmarshal(body, &req) != nil || key == "" {
		http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
		return
	}
	sum := sha256.Sum256(body)
	digest := hex.EncodeToString(sum[:])

	s.mu.Lock()
	var fault Fault
	if q := s.faults[req.Invoice]; len(q) > 0 {
		fault, s.faults[req.Invoice] = q[0], q[1:]
	}
	switch fault {
	case DropBeforeAccept:
		s.mu.Unlock()
		hangUp(w)
		return
	case RateLimited:
		s.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		http.Error(w, `{"error":{"code":"rate_limited"}}`, http.StatusTooManyRequests)
		return
	case Unavailable:
		s.mu.Unlock()
		http.Error(w, `{"error":{"code":"unavailable"}}`, http.StatusServiceUnavailable)
		return
	}
	prev, seen := s.byKey[key]
	var st stored
	switch {
	case seen && prev.digest != digest:
		st = stored{status: http.StatusBadRequest, body: []byte(`{"error":{"code":"idempotency_key_mismatch"}}`)}
	case seen:
		st = prev
	case s.DeclineAboveCents > 0 && req.AmountCents > s.DeclineAboveCents:
		st = stored{digest: digest, status: http.StatusPaymentRequired, body: []byte(`{"error":{"code":"card_declined","message":"amount above the card limit"}}`)}
		s.byKey[key] = st
	default:
		c := Charge{ID: fmt.Sprintf("ch_%06d", len(s.charges)+1), Invoice: req.Invoice, AmountCents: req.AmountCents}
		s.charges = append(s.charges, c)
		b, _ := json.Marshal(c)
		st = stored{digest: digest, status: http.StatusOK, body: b}
		s.byKey[key] = st
	}
	s.mu.Unlock()
	switch fault {
	case LoseAnswer:
		hangUp(w)
		return
	case SlowAnswer:
		t := time.NewTimer(s.SlowDelay)
		select {
		case <-t.C:
		case <-r.Context().Done(): // the caller gave up (or died): the charge stands
			t.Stop()
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(st.status)
	_, _ = w.Write(st.body)
}

func (s *Server) lookup(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	st, ok := s.byKey[r.URL.Query().Get("idempotency_key")]
	s.mu.Unlock()
	if !ok {
		http.Error(w, `{"error":{"code":"not_found"}}`, http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(st.status)
	_, _ = w.Write(st.body)
}

// hangUp closes the connection without an answer.
func hangUp(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			c.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

// Client errors.
var (
	// ErrNotSent: the request certainly did not reach the provider.
	ErrNotSent = errors.New("fakeprovider: request not sent")
	// ErrAmbiguous: the request left and no answer came back.
	ErrAmbiguous = errors.New("fakeprovider: outcome unknown")
	// ErrNotFound: a lookup found no charge for the key.
	ErrNotFound = errors.New("fakeprovider: no charge for this key")
)

// RateLimitError is a 429: nothing was done; come back after After. It matches ErrNotSent.
type RateLimitError struct{ After time.Duration }

func (e *RateLimitError) Error() string {
	return fmt.Sprintf("rate limited (429), retry after %v", e.After)
}

// Is matches ErrNotSent: the provider did nothing.
func (e *RateLimitError) Is(target error) bool { return target == ErrNotSent }

// RetryAfter is how long the provider asked to wait.
func (e *RateLimitError) RetryAfter() time.Duration { return e.After }

// DeclineError is a definitive decline.
type DeclineError struct{ Code, Message string }

func (e *DeclineError) Error() string { return "declined: " + e.Code + ": " + e.Message }

// Client charges through a provider.
type Client struct {
	BaseURL string
	HTTP    *http.Client
}

// Charge charges an invoice once per idempotency key.
func (c *Client) Charge(ctx context.Context, key, invoice string, amountCents int64) (Charge, error) {
	body, _ := json.Marshal(chargeRequest{Invoice: invoice, AmountCents: amountCents})
	return c.do(ctx, http.MethodPost, "/v1/charges", key, body)
}

// Lookup finds the charge made with an idempotency key (ErrNotFound if none).
func (c *Client) Lookup(ctx context.Context, key string) (Charge, error) {
	return c.do(ctx, http.MethodGet, "/v1/charges?idempotency_key="+key, "", nil)
}

func (c *Client) do(ctx context.Context, method, path, key string, body []byte) (Charge, error) {
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) {
		if i.Err == nil {
			wrote.Store(true)
		}
	}})
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return Charge{}, fmt.Errorf("%w: %v", ErrNotSent, err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		if wrote.Load() {
			return Charge{}, fmt.Errorf("%w: %v", ErrAmbiguous, err)
		}
		return Charge{}, fmt.Errorf("%w: %v", ErrNotSent, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return Charge{}, fmt.Errorf("%w: read answer: %v", ErrAmbiguous, err)
	}
	switch {
	case resp.StatusCode == http.StatusOK:
		var ch Charge
		if err := json.Unmarshal(data, &ch); err != nil {
			return Charge{}, fmt.Errorf("%w: unreadable answer", ErrAmbiguous)
		}
		return ch, nil
	case resp.StatusCode == http.StatusPaymentRequired:
		var e struct{ Error DeclineError }
		_ = json.Unmarshal(data, &e)
		return Charge{}, &e.Error
	case resp.StatusCode == http.StatusNotFound && method == http.MethodGet:
		return Charge{}, ErrNotFound
	case resp.StatusCode == http.StatusTooManyRequests:
		secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return Charge{}, &RateLimitError{After: time.Duration(secs) * time.Second}
	case resp.StatusCode >= 500:
		return Charge{}, fmt.Errorf("%w: status %d", ErrAmbiguous, resp.StatusCode)
	}
	return Charge{}, fmt.Errorf("fakeprovider: status %d: %.200s", resp.StatusCode, data)
}
