package humantask

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Answer is the service's answer to a completion: an HTTP status and a small JSON body
// built from non-secret fields only (task, command, user, time, reason). The answer of
// a command the engine acted on, or refused for good, is recorded, and the same command
// again gets it byte for byte.
type Answer struct {
	Status int
	Body   []byte
	// RetryAfter is set on a 503: the command's outcome is not settled yet.
	RetryAfter time.Duration
}

// StateKeyReused is the "state" of the 422 answering a command id sent again with
// another request (another form, or by another route): that request was not sent, and
// the command keeps its own answer (Service.Answer).
const StateKeyReused = "key-reused"

// answerBody is every answer's body; the fields an answer does not use are left out.
type answerBody struct {
	State       string `json:"state,omitempty"`
	Error       string `json:"error,omitempty"`
	Task        string `json:"task,omitempty"`
	Command     string `json:"command,omitempty"`
	CompletedBy string `json:"completedBy,omitempty"`
	CompletedAt string `json:"completedAt,omitempty"`
	Reason      string `json:"reason,omitempty"`
}

func newAnswer(status int, b answerBody) Answer {
	body, _ := json.Marshal(b) // plain strings: cannot fail
	return Answer{Status: status, Body: body}
}

// completed is the answer of the command that completed the task.
func completed(taskID, command, user string) Answer {
	return newAnswer(http.StatusOK, answerBody{State: "completed", Task: taskID, Command: command, CompletedBy: user})
}

// conflict is the answer of a command on a task another command completed: who (empty
// when the task was completed outside this service) and when.
func conflict(taskID, by string, at time.Time) Answer {
	msg := "the task was completed by another command"
	if by == "" {
		msg = "the task was completed outside this service"
	}
	return newAnswer(http.StatusConflict, answerBody{Error: msg, Task: taskID, CompletedBy: by,
		CompletedAt: at.UTC().Format(time.RFC3339Nano)})
}

// suspended is the answer of a command on a task whose process is suspended: the
// engine refuses to complete it until the process is activated again.
func suspended(taskID string) Answer {
	return newAnswer(http.StatusConflict, answerBody{State: "suspended", Task: taskID,
		Error: "the task is suspended: it cannot be completed until its process is activated again"})
}

// delegated is the answer of a command on a task delegated to its assignee by its
// owner (pending): the engine would resolve it back to the owner, not complete it.
func delegated(taskID string) Answer {
	return newAnswer(http.StatusConflict, answerBody{State: "delegated", Task: taskID,
		Error: "the task is delegated: its delegate resolves it back to its owner (in Tasklist), which is not a completion; once resolved, its owner completes it"})
}

// refusal is an error answer: status, the error, and a reason (a guard's) if any.
func refusal(status int, taskID, msg, reason string) *Answer {
	a := newAnswer(status, answerBody{Error: msg, Task: taskID, Reason: reason})
	return &a
}

// unsettled is the 503 of a command whose outcome is not settled yet (another request
// of it in flight, the engine unreachable, an unknown outcome being reconciled).
func unsettled(msg string, after time.Duration) Answer {
	a := newAnswer(http.StatusServiceUnavailable, answerBody{Error: msg})
	a.RetryAfter = max(after, time.Second)
	return a
}

// write sends a.
func (a Answer) write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if a.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int((a.RetryAfter+time.Second-1)/time.Second)))
	}
	w.WriteHeader(a.Status)
	_, _ = w.Write(a.Body)
}
