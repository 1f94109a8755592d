package fakeprovider

import (
	"encoding/json"
	"net/http"
)

// lookup answers GET /v1/charges?idempotency_key=K and GET /v1/charges/by-key/{K}: the
// answer stored under the key (marked Idempotent-Replayed), 404 if none is (never
// stored, stored by the emails endpoint, or forgotten after the retention), 409 while a
// request with the key is in flight. Scripted faults do not apply to lookups.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if key == "" {
		key = r.URL.Query().Get("idempotency_key")
	}
	s.mu.Lock()
	i := s.record(Request{Method: r.Method, Path: r.URL.Path, Key: key})
	var (
		a       answer
		outcome = outFound
		effect  string
	)
	switch e := s.entry(key, s.Now()); {
	case e == nil || e.endpoint != endpointCharges:
		a, outcome = apiError(http.StatusNotFound, "invalid_request_error", "not_found", "No request was stored under this idempotency key."), outNotFound
	case e.inFlight:
		a, outcome = s.inUse(), outInUse
	default:
		a, effect = answer{status: e.status, body: e.body, replayed: true}, e.effectID
	}
	s.finish(i, outcome, effect, fateAnswered)
	s.mu.Unlock()
	a.write(w)
}

// search answers GET /v1/charges/search?invoice=INV, a business-key search like Stripe
// Search: {"data":[charge...]} with the invoice's charges made at least SearchLag ago
// on the virtual clock, and 501 when Options.SearchDisabled.
func (s *Server) search(w http.ResponseWriter, r *http.Request) {
	invoice := r.URL.Query().Get("invoice")
	s.mu.Lock()
	i := s.record(Request{Method: r.Method, Path: r.URL.Path, Invoice: invoice})
	switch {
	case s.opts.SearchDisabled:
		s.finish(i, outSearchUnavailable, "", fateAnswered)
		s.mu.Unlock()
		apiError(http.StatusNotImplemented, "api_error", "search_unavailable", "Search is not available.").write(w)
		return
	case invoice == "":
		s.finish(i, outBadRequest, "", fateAnswered)
		s.mu.Unlock()
		badRequest("the invoice parameter is required").write(w)
		return
	}
	cutoff := s.Now().Add(-s.opts.SearchLag)
	data := []Charge{}
	for _, c := range s.charges {
		if c.Invoice == invoice && !c.At.After(cutoff) {
			data = append(data, c)
		}
	}
	s.finish(i, outSearch, "", fateAnswered)
	s.mu.Unlock()
	b, _ := json.Marshal(struct {
		Data []Charge `json:"data"`
	}{data})
	answer{status: http.StatusOK, body: b}.write(w)
}

// unknown answers any other /v1/ request, so that the history holds every one.
func (s *Server) unknown(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	i := s.record(Request{Method: r.Method, Path: r.URL.Path})
	s.finish(i, outBadRequest, "", fateAnswered)
	s.mu.Unlock()
	apiError(http.StatusNotFound, "invalid_request_error", "resource_missing", "Unrecognized request URL ("+r.Method+": "+r.URL.Path+").").write(w)
}
