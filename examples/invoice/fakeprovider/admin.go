package fakeprovider

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// AdminScript is the body of POST /_admin/script: exactly one selector (Key, Invoice,
// Nth or Probability) and its faults, or Clear alone. Nth and Probability take exactly
// one fault.
type AdminScript struct {
	Invoice     string  `json:"invoice,omitempty"`
	Key         string  `json:"key,omitempty"`
	Nth         int64   `json:"nth,omitempty"`
	Probability float64 `json:"probability,omitempty"`
	Faults      []Fault `json:"faults,omitempty"`
	// Clear forgets every scripted fault (ClearFaults).
	Clear bool `json:"clear,omitempty"`
}

// admin registers the test-only endpoints, for processes outside the test that drive or
// inspect the provider. They are not part of the history.
//
//	GET  /_admin/effects              {"charges":[...],"emails":[...]}
//	GET  /_admin/log                  the history, one JSON object per line
//	GET  /_admin/clock                {"now":...}
//	POST /_admin/clock?advance=25h    moves the virtual clock, answers {"now":...}
//	POST /_admin/script               an AdminScript
func (s *Server) admin(mux *http.ServeMux) {
	mux.HandleFunc("GET /_admin/effects", func(w http.ResponseWriter, r *http.Request) {
		charges, emails := s.Charges(), s.Emails()
		if charges == nil {
			charges = []Charge{}
		}
		if emails == nil {
			emails = []Email{}
		}
		writeJSON(w, http.StatusOK, map[string]any{"charges": charges, "emails": emails})
	})
	mux.HandleFunc("GET /_admin/log", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_ = s.WriteHistory(w)
	})
	mux.HandleFunc("GET /_admin/clock", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]time.Time{"now": s.Now()})
	})
	mux.HandleFunc("POST /_admin/clock", func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("advance"))
		if err != nil || d < 0 {
			badRequest("advance must be a non-negative duration such as 25h").write(w)
			return
		}
		s.Advance(d)
		writeJSON(w, http.StatusOK, map[string]time.Time{"now": s.Now()})
	})
	mux.HandleFunc("POST /_admin/script", func(w http.ResponseWriter, r *http.Request) {
		var sc AdminScript
		if a, ok := decode(w, r, &sc); !ok {
			a.write(w)
			return
		}
		if err := s.applyScript(sc); err != nil {
			badRequest(err.Error()).write(w)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

// applyScript applies one AdminScript.
func (s *Server) applyScript(sc AdminScript) error {
	selectors := 0
	for _, set := range []bool{sc.Invoice != "", sc.Key != "", sc.Nth != 0, sc.Probability != 0} {
		if set {
			selectors++
		}
	}
	switch {
	case sc.Clear && (selectors > 0 || len(sc.Faults) > 0):
		return errors.New("clear takes no selector and no faults")
	case sc.Clear:
		s.ClearFaults()
		return nil
	case selectors != 1:
		return errors.New("give exactly one of invoice, key, nth, probability")
	case len(sc.Faults) == 0:
		return errors.New("faults is empty")
	case sc.Key != "":
		s.ScriptKey(sc.Key, sc.Faults...)
	case sc.Invoice != "":
		s.Script(sc.Invoice, sc.Faults...)
	case len(sc.Faults) != 1:
		return errors.New("nth and probability take exactly one fault")
	case sc.Nth < 0:
		return fmt.Errorf("nth %d: want 1 or more", sc.Nth)
	case sc.Nth > 0:
		s.ScriptNth(sc.Nth, sc.Faults[0])
	case sc.Probability < 0 || sc.Probability > 1:
		return fmt.Errorf("probability %v: want a value in (0, 1]", sc.Probability)
	default:
		s.ScriptRandom(sc.Probability, sc.Faults[0])
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	answer{status: status, body: b}.write(w)
}
