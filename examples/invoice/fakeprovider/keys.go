package fakeprovider

import (
	"encoding/json"
	"net/http"
	"time"
)

// entry is what the idempotency layer keeps under one key: a request in flight (Hold),
// or the stored answer of a finished one.
type entry struct {
	endpoint string    // "charges" or "emails": a key reused on the other endpoint is a mismatch
	digest   string    // of the request that stored it
	at       time.Time // stored at, virtual clock; retention counts from here
	inFlight bool
	status   int
	body     []byte
	effectID string // the charge or email the stored answer names, "" for a failure
}

// entry returns what is kept under key, forgetting it first when it is at least the
// retention old on the virtual clock. A request in flight never expires. The caller
// holds s.mu.
func (s *Server) entry(key string, now time.Time) *entry {
	e := s.keys[key]
	if e == nil || key == "" {
		return nil
	}
	if !e.inFlight && now.Sub(e.at) >= s.opts.Retention {
		delete(s.keys, key)
		return nil
	}
	return e
}

// answer is one HTTP answer the provider gives.
type answer struct {
	status     int
	body       []byte
	problem    bool   // application/problem+json (the ietf dialect's idempotency errors)
	retryAfter string // Retry-After header, if any
	replayed   bool   // Idempotent-Replayed: true (the answer came from the key store)
}

func (a answer) write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if a.problem {
		h.Set("Content-Type", "application/problem+json")
	}
	if a.retryAfter != "" {
		h.Set("Retry-After", a.retryAfter)
	}
	if a.replayed {
		h.Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}

// apiError is the provider's own error shape (Stripe's), used by every dialect for
// everything but the ietf dialect's idempotency errors.
func apiError(status int, typ, code, message string) answer {
	type detail struct {
		Type    string `json:"type"`
		Code    string `json:"code,omitempty"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct {
		Error detail `json:"error"`
	}{detail{typ, code, message}})
	return answer{status: status, body: b}
}

// problem is an RFC 9457 problem, as the IETF draft asks for idempotency errors.
func problem(status int, code, title string) answer {
	b, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Code   string `json:"code"`
	}{"https://datatracker.ietf.org/doc/draft-ietf-httpapi-idempotency-key-header/", title, status, code})
	return answer{status: status, body: b, problem: true}
}

const (
	codeMismatch = "idempotency_key_mismatch"
	codeInUse    = "idempotency_key_in_use"
	typeIdemErr  = "idempotency_error"
)

// mismatch answers a key reused with a different request, as the dialect does.
func (s *Server) mismatch() answer {
	switch s.opts.Dialect {
	case DialectIETF:
		return problem(http.StatusUnprocessableEntity, codeMismatch, "Idempotency-Key is already used with a different payload")
	case DialectBrandur:
		return apiError(http.StatusConflict, "invalid_request_error", codeMismatch, "There was a mismatch between this request's parameters and the parameters of a previously stored request with the same Idempotency-Key.")
	}
	return apiError(http.StatusBadRequest, typeIdemErr, "", "Keys for idempotent requests can only be used with the same parameters they were first used with.")
}

// inUse answers a request whose key is still in flight, as the dialect does. Nothing is
// stored; come back later with the same key.
func (s *Server) inUse() answer {
	var a answer
	switch s.opts.Dialect {
	case DialectIETF:
		a = problem(http.StatusConflict, codeInUse, "A request with the same Idempotency-Key is still being processed")
	case DialectBrandur:
		a = apiError(http.StatusConflict, "invalid_request_error", codeInUse, "A request with the same Idempotency-Key is still being processed.")
	default:
		a = apiError(http.StatusConflict, typeIdemErr, codeInUse, "There is currently another in-progress request using this idempotency key. Try again later.")
	}
	a.retryAfter = "1"
	return a
}

func declined(message string) answer {
	return apiError(http.StatusPaymentRequired, "card_error", "card_declined", message)
}

func stored500() answer {
	return apiError(http.StatusInternalServerError, "api_error", "", "An unknown error occurred while processing the request.")
}

func badRequest(message string) answer {
	return apiError(http.StatusBadRequest, "invalid_request_error", "parameter_invalid", message)
}
