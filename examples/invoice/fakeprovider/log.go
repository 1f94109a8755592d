package fakeprovider

import (
	"encoding/json"
	"io"
	"time"
)

// Request is one entry of the provider's history (Jepsen-style): every request to
// /v1/*, in the order the provider decided on it, with what it did and what became of
// the connection. The recipient address of an email is never part of it.
type Request struct {
	// Seq numbers requests from 1 in the order the provider decided on them.
	Seq int64 `json:"seq"`
	// At is when the request was read, on the virtual clock.
	At     time.Time `json:"at"`
	Method string    `json:"method"`
	// Path is the URL path without the query.
	Path string `json:"path"`
	// Key is the Idempotency-Key (for a lookup, the key looked up).
	Key string `json:"key,omitempty"`
	// Invoice is the request's invoice (for a search, the invoice searched).
	Invoice string `json:"invoice,omitempty"`
	// Digest is the request's digest (see Charge.Digest and Email.Digest).
	Digest string `json:"digest,omitempty"`
	// Fault is the scripted fault applied (see Fault.String), "" if none.
	Fault string `json:"fault,omitempty"`
	// Outcome is what the provider did: created, replayed, mismatch, in_use, declined,
	// rate_limited, stored_500, error_500 (a Stored500 fault the dialect does not store),
	// unavailable, dropped, not_found, found, search, search_unavailable, bad_request;
	// "" while the request is still being handled.
	Outcome string `json:"outcome"`
	// EffectID is the charge or email created or replayed (or found), "" if none.
	EffectID string `json:"effectId,omitempty"`
	// Fate is what became of the connection: answered, dropped (hung up without an
	// answer), client_gone (the client left before the answer); "" while the request is
	// still being handled.
	Fate string `json:"fate"`
}

// Outcomes and fates as the log spells them.
const (
	outCreated           = "created"
	outReplayed          = "replayed"
	outMismatch          = "mismatch"
	outInUse             = "in_use"
	outDeclined          = "declined"
	outRateLimited       = "rate_limited"
	outStored500         = "stored_500"
	outError500          = "error_500"
	outUnavailable       = "unavailable"
	outDropped           = "dropped"
	outNotFound          = "not_found"
	outFound             = "found"
	outSearch            = "search"
	outSearchUnavailable = "search_unavailable"
	outBadRequest        = "bad_request"

	fateAnswered   = "answered"
	fateDropped    = "dropped"
	fateClientGone = "client_gone"
)

// Log returns a copy of the history so far, in Seq order.
func (s *Server) Log() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.log...)
}

// WriteHistory writes the history so far, one JSON object per line.
func (s *Server) WriteHistory(w io.Writer) error {
	enc := json.NewEncoder(w)
	for _, r := range s.Log() {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// record appends a request to the history and returns its index. The caller holds s.mu.
func (s *Server) record(r Request) int {
	r.Seq = int64(len(s.log)) + 1
	r.At = s.Now()
	s.log = append(s.log, r)
	return len(s.log) - 1
}

// finish sets what became of a recorded request. The caller holds s.mu.
func (s *Server) finish(i int, outcome, effectID, fate string) {
	s.log[i].Outcome, s.log[i].EffectID, s.log[i].Fate = outcome, effectID, fate
}

// settle is finish for callers that do not hold s.mu.
func (s *Server) settle(i int, outcome, effectID, fate string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.finish(i, outcome, effectID, fate)
}
