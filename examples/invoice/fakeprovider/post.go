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
	"net/http"
	"time"
)

// maxBody bounds request bodies.
const maxBody = 64 << 10

// maxKeyLen is Stripe's limit on idempotency keys.
const maxKeyLen = 255

const (
	endpointCharges = "charges"
	endpointEmails  = "emails"
)

type chargeRequest struct {
	Invoice     string `json:"invoice"`
	AmountCents int64  `json:"amountCents"`
}

type emailRequest struct {
	To       string `json:"to"`
	Template string `json:"template"`
	Invoice  string `json:"invoice"`
}

// call is one decoded POST: what to do, under which key.
type call struct {
	endpoint   string
	key        string
	idempotent bool // the key store applies (false: an email without key or with dedupe off)
	invoice    string
	digest     string
	charge     chargeRequest
	email      emailRequest
}

// digest is the hex SHA-256 of v marshalled by encoding/json: the canonical body.
func digest(v any) string {
	b, _ := json.Marshal(v)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// decode reads one bounded JSON object into v, refusing unknown fields and trailing
// data. The answer is the refusal, if any.
func decode(w http.ResponseWriter, r *http.Request, v any) (answer, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		a := apiError(http.StatusRequestEntityTooLarge, "invalid_request_error", "body_too_large", fmt.Sprintf("request bodies are limited to %d bytes", maxBody))
		return a, false
	}
	if err != nil {
		return badRequest("unreadable body"), false
	}
	if !bytes.HasPrefix(bytes.TrimSpace(body), []byte("{")) {
		return badRequest("the body must be a JSON object"), false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("malformed JSON body: " + err.Error()), false
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("trailing data after the JSON body"), false
	}
	return answer{}, true
}

func keyTooLong() answer {
	return badRequest(fmt.Sprintf("the Idempotency-Key is longer than %d characters", maxKeyLen))
}

func (s *Server) postCharge(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var req chargeRequest
	refusal, ok := decode(w, r, &req)
	switch {
	case !ok:
	case key == "":
		refusal, ok = badRequest("an Idempotency-Key header is required"), false
	case len(key) > maxKeyLen:
		refusal, ok = keyTooLong(), false
	case req.Invoice == "":
		refusal, ok = badRequest("invoice is required"), false
	}
	s.mu.Lock()
	n := s.requests.Add(1)
	if !ok {
		s.refuse(w, r, key, refusal)
		return
	}
	c := call{endpoint: endpointCharges, key: key, idempotent: true, invoice: req.Invoice, digest: digest(req), charge: req}
	s.perform(w, r, c, s.script.pick(key, req.Invoice, n))
}

func (s *Server) postEmail(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var req emailRequest
	refusal, ok := decode(w, r, &req)
	switch {
	case !ok:
	case len(key) > maxKeyLen:
		refusal, ok = keyTooLong(), false
	case req.To == "" || req.Template == "":
		refusal, ok = badRequest("to and template are required"), false
	}
	s.mu.Lock()
	if !ok {
		s.refuse(w, r, key, refusal)
		return
	}
	c := call{endpoint: endpointEmails, key: key, idempotent: key != "" && !s.opts.EmailDedupeOff,
		invoice: req.Invoice, digest: digest(req), email: req}
	s.perform(w, r, c, s.script.pick(key, req.Invoice, 0))
}

// refuse records and answers a malformed request. It is called with s.mu held and
// releases it.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, key string, a answer) {
	if len(key) > maxKeyLen {
		key = key[:maxKeyLen]
	}
	i := s.record(Request{Method: r.Method, Path: r.URL.Path, Key: key})
	s.finish(i, outBadRequest, "", fateAnswered)
	s.mu.Unlock()
	a.write(w)
}

// perform carries out one decoded POST under its fault. It is called with s.mu held
// (the fault was chosen under it, so the history's order is the order faults were
// drawn in) and releases it.
func (s *Server) perform(w http.ResponseWriter, r *http.Request, c call, fault Fault) {
	req := Request{Method: r.Method, Path: r.URL.Path, Key: c.key, Invoice: c.invoice, Digest: c.digest}
	if fault != 0 {
		req.Fault = fault.String()
	}
	i := s.record(req)
	s.mu.Unlock()

	ctx := r.Context()
	gone := false // the client left; the provider carries on regardless
	// Before the idempotency layer.
	switch fault {
	case RateLimited:
		s.settle(i, outRateLimited, "", fateAnswered)
		a := apiError(http.StatusTooManyRequests, "rate_limit_error", "rate_limited", "Too many requests hit the API too quickly.")
		a.retryAfter = "1"
		a.write(w)
		return
	case Unavailable:
		s.settle(i, outUnavailable, "", fateAnswered)
		apiError(http.StatusServiceUnavailable, "api_error", "unavailable", "The service is temporarily unavailable.").write(w)
		return
	case DropBeforeAccept:
		s.settle(i, outDropped, "", fateDropped)
		hangUp(w)
		return
	case Delay:
		g, closed := s.pause(ctx, s.SlowDelay, false)
		if closed {
			s.settle(i, outDropped, "", fateDropped)
			hangUp(w)
			return
		}
		gone = g
	}

	a, outcome, effect, held := s.execute(c, fault)
	if held {
		g, closed := s.pause(ctx, s.SlowDelay, false)
		if closed {
			s.abandon(c)
			s.settle(i, outDropped, "", fateDropped)
			hangUp(w)
			return
		}
		gone = gone || g
		a, outcome, effect = s.commitHeld(c)
	}

	// After the effect.
	switch fault {
	case LoseAnswer:
		s.settle(i, outcome, effect, fateDropped)
		hangUp(w)
		return
	case SlowAnswer:
		g, closed := s.pause(ctx, s.SlowDelay, true)
		if closed {
			s.settle(i, outcome, effect, fateDropped)
			hangUp(w)
			return
		}
		gone = gone || g
	}
	if gone {
		s.settle(i, outcome, effect, fateClientGone)
		hangUp(w)
		return
	}
	s.settle(i, outcome, effect, fateAnswered)
	a.write(w)
}

// pause waits d, or until the server closes (closed). A client that leaves meanwhile is
// reported (gone) and ends the wait only if stopOnGone.
func (s *Server) pause(ctx context.Context, d time.Duration, stopOnGone bool) (gone, closed bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	left := ctx.Done()
	for {
		select {
		case <-t.C:
			return gone, false
		case <-s.done:
			return gone, true
		case <-left:
			gone, left = true, nil
			if stopOnGone {
				return true, false
			}
		}
	}
}

// execute runs the idempotency layer and, for a new request, the endpoint. held means
// the request is now in flight under its key (Hold) and commitHeld must finish it.
func (s *Server) execute(c call, fault Fault) (a answer, outcome, effect string, held bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.Now()
	if c.idempotent {
		if e := s.entry(c.key, now); e != nil {
			switch {
			case e.endpoint != c.endpoint || e.digest != c.digest:
				return s.mismatch(), outMismatch, "", false
			case e.inFlight:
				return s.inUse(), outInUse, "", false
			}
			return answer{status: e.status, body: e.body, replayed: true}, outReplayed, e.effectID, false
		}
	}
	switch fault {
	case Stored500:
		a := stored500()
		if c.idempotent && s.opts.Dialect == DialectStripe {
			s.store(c, now, a, "")
			return a, outStored500, "", false
		}
		return a, outError500, "", false
	case Decline:
		a := declined("Your card was declined.")
		s.store(c, now, a, "")
		return a, outDeclined, "", false
	case Hold:
		if c.idempotent {
			s.keys[c.key] = &entry{endpoint: c.endpoint, digest: c.digest, at: now, inFlight: true}
		}
		return answer{}, "", "", true
	}
	a, outcome, effect = s.commit(c, now)
	return a, outcome, effect, false
}

// commitHeld commits a request that Hold kept in flight.
func (s *Server) commitHeld(c call) (answer, string, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.idempotent {
		delete(s.keys, c.key)
	}
	return s.commit(c, s.Now())
}

// abandon forgets a held request that will never commit.
func (s *Server) abandon(c call) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.keys[c.key]; c.idempotent && e != nil && e.inFlight {
		delete(s.keys, c.key)
	}
}

// commit performs a new request: a charge (or a decline above the limit) or an email.
// The caller holds s.mu.
func (s *Server) commit(c call, now time.Time) (answer, string, string) {
	if c.endpoint == endpointEmails {
		e := Email{ID: fmt.Sprintf("em_%06d", len(s.emails)+1), Key: c.key, Invoice: c.invoice,
			To: c.email.To, Template: c.email.Template, Digest: c.digest, At: now}
		s.emails = append(s.emails, e)
		e.To = "" // the answer, and so the key store, never carries the address
		b, _ := json.Marshal(e)
		a := answer{status: http.StatusOK, body: b}
		s.store(c, now, a, e.ID)
		return a, outCreated, e.ID
	}
	if limit := s.DeclineAboveCents; limit > 0 && c.charge.AmountCents > limit {
		a := declined("amount above the card limit")
		s.store(c, now, a, "")
		return a, outDeclined, ""
	}
	ch := Charge{ID: fmt.Sprintf("ch_%06d", len(s.charges)+1), Invoice: c.invoice, AmountCents: c.charge.AmountCents,
		Key: c.key, Digest: c.digest, At: now}
	s.charges = append(s.charges, ch)
	b, _ := json.Marshal(ch)
	a := answer{status: http.StatusOK, body: b}
	s.store(c, now, a, ch.ID)
	return a, outCreated, ch.ID
}

// store keeps an answer under the request's key, if the key store applies to it. The
// caller holds s.mu.
func (s *Server) store(c call, now time.Time, a answer, effectID string) {
	if !c.idempotent {
		return
	}
	s.keys[c.key] = &entry{endpoint: c.endpoint, digest: c.digest, at: now, status: a.status, body: a.body, effectID: effectID}
}
