package callback

import (
	"encoding/json"
	"net/http"

	"github.com/extworker/extworker/inbox"
)

// answer is what a callback is answered: a status and a JSON body.
type answer struct {
	status int
	body   []byte
}

// answerOf is the answer to a callback the inbox handled as h: a function of the row's
// state (and of whether this body conflicts with the one the id was recorded with), not
// of this delivery's class, so that the same callback sent again gets the same bytes,
// whichever process answers it. A pure function.
//
//	the id with another body (ClassConflict)      409 {"id":…,"error":"conflict"}
//	processed, ignored_duplicate, failed_final     200 {"id":…,"state":…}
//	anything else (waiting: held, re-handled)      202 {"id":…,"state":…}
func answerOf(id string, h inbox.Handling) answer {
	if h.Class == inbox.ClassConflict {
		return answerJSON(http.StatusConflict, reply{ID: id, Error: "conflict: this webhook-id was received with another body"})
	}
	status := http.StatusAccepted
	if settled(h.State) {
		status = http.StatusOK
	}
	return answerJSON(status, reply{ID: id, State: string(h.State)})
}

// settled reports whether a row in state st is done with: nothing more happens to it
// but an operator's replay. Its held body, if any, is deleted.
func settled(st inbox.State) bool {
	return st == inbox.StateProcessed || st == inbox.StateIgnoredDuplicate || st == inbox.StateFailedFinal
}

// reply is an answer's body.
type reply struct {
	ID    string `json:"id,omitempty"`
	State string `json:"state,omitempty"`
	Error string `json:"error,omitempty"`
}

// The answers that record nothing: fixed texts, saying no more than the status.
var (
	answerUnauthorized = answerJSON(http.StatusUnauthorized, reply{Error: "signature refused"})
	answerTooLarge     = answerJSON(http.StatusRequestEntityTooLarge, reply{Error: "body too large"})
	answerMethod       = answerJSON(http.StatusMethodNotAllowed, reply{Error: "POST only"})
	answerNoSource     = answerJSON(http.StatusNotFound, reply{Error: "no such source"})
	answerUnavailable  = answerJSON(http.StatusServiceUnavailable, reply{Error: "the inbox is unavailable: send it again later"})
	answerBadRequest   = answerJSON(http.StatusBadRequest, reply{Error: "the body could not be read"})
)

func answerJSON(status int, r reply) answer {
	b, _ := json.Marshal(r) // strings only: cannot fail
	return answer{status: status, body: append(b, '\n')}
}

func (a answer) write(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if a.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "5")
	}
	if a.status == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", http.MethodPost)
	}
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}
