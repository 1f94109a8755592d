package humantask

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
)

// settle alone: which answer a command gets from the engine's state.
func TestSettle(t *testing.T) {
	end := time.Date(2026, 12, 3, 7, 30, 0, 0, time.UTC)
	done := &admin.HistoricUserTask{ID: "t", DeleteReason: "completed", EndTime: camunda7.Time{Time: end}}
	for _, c := range []struct {
		name   string
		st     engineState
		status int
		open   bool
		body   string
	}{
		{"waiting", engineState{open: true}, 0, true, ""},
		{"never there", engineState{}, 404, false, `{"error":"no such task","task":"t"}`},
		{"deleted", engineState{history: &admin.HistoricUserTask{DeleteReason: "deleted"}}, 404, false,
			`{"error":"the task was removed without being completed","task":"t"}`},
		{"by this command", engineState{history: done, marker: &marker{Command: "c1", User: "alice"}}, 200, false,
			`{"state":"completed","task":"t","command":"c1","completedBy":"alice"}`},
		{"by another", engineState{history: done, marker: &marker{Command: "c2", User: "bob"}}, 409, false,
			`{"error":"the task was completed by another command","task":"t","completedBy":"bob","completedAt":"2026-12-03T07:30:00Z"}`},
		{"outside", engineState{history: done}, 409, false,
			`{"error":"the task was completed outside this service","task":"t","completedAt":"2026-12-03T07:30:00Z"}`},
	} {
		a, open := settle(c.st, "t", "c1", "alice")
		assert.Equal(t, c.open, open, c.name)
		assert.Equal(t, c.status, a.Status, c.name)
		if c.body != "" {
			assert.Equal(t, c.body, string(a.Body), c.name)
		}
	}
}

// checkCompletion alone: 403 before 412, a claimed task only for its assignee.
func TestCheckCompletion(t *testing.T) {
	open := Task{ID: "t", CandidateUsers: []string{"alice"}, CandidateGroups: []string{"approvers"}, ETag: `"e1"`,
		Variables: camunda7.Variables{"amount": camunda7.LongVar(100), "note": camunda7.StringVar("x"), "ok": camunda7.BoolVar(true),
			"unset": camunda7.NullVar(), "due": {Type: "Date", Value: []byte(`"2026-12-03T08:00:00.000+0000"`)}}}
	claimed := open
	claimed.Assignee = "bob"
	for _, c := range []struct {
		name    string
		task    Task
		who     Identity
		ifMatch string
		form    Form
		want    int
	}{
		{"candidate user", open, Identity{User: "alice"}, `"e1"`, nil, 0},
		{"candidate group", open, Identity{User: "dave", Groups: []string{"x", "approvers"}}, `"e1"`, nil, 0},
		{"stranger", open, Identity{User: "carol"}, `"e1"`, nil, http.StatusForbidden},
		{"stranger with a stale tag", open, Identity{User: "carol"}, `"old"`, nil, http.StatusForbidden},
		{"stale", open, Identity{User: "alice"}, `"old"`, nil, http.StatusPreconditionFailed},
		{"assignee", claimed, Identity{User: "bob"}, `"e1"`, nil, 0},
		{"candidate of a claimed task", claimed, Identity{User: "alice"}, `"e1"`, nil, http.StatusForbidden},
		// A value must fit the type of the variable it overwrites (an outside tester turned
		// an Integer amount into the String "notanumber"); a new name may be set.
		{"fitting values", open, Identity{User: "alice"}, `"e1"`, Form{"amount": json.Number("250"), "note": "y", "ok": false, "unset": "now set", "new": "a comment"}, 0},
		{"a string for a number", open, Identity{User: "alice"}, `"e1"`, Form{"amount": "notanumber"}, http.StatusUnprocessableEntity},
		{"a number for a string", open, Identity{User: "alice"}, `"e1"`, Form{"note": json.Number("1")}, http.StatusUnprocessableEntity},
		{"a string for a boolean", open, Identity{User: "alice"}, `"e1"`, Form{"ok": "true"}, http.StatusUnprocessableEntity},
		{"a Date from a form", open, Identity{User: "alice"}, `"e1"`, Form{"due": "2027-01-01"}, http.StatusUnprocessableEntity},
		{"null for anything", open, Identity{User: "alice"}, `"e1"`, Form{"amount": nil}, 0},
	} {
		got := 0
		if a := checkCompletion(c.task, c.who, c.ifMatch, c.form); a != nil {
			got = a.Status
		}
		assert.Equal(t, c.want, got, c.name)
	}
}
