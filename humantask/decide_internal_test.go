package humantask

import (
	"encoding/json"
	"net/http"
	"strings"
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
		{"deleted", engineState{history: &admin.HistoricUserTask{DeleteReason: "deleted"}, hadRight: true}, 404, false,
			`{"error":"the task was removed without being completed","task":"t"}`},
		{"by this command", engineState{history: done, marker: &marker{Command: "c1", User: "alice"}, hadRight: true}, 200, false,
			`{"state":"completed","task":"t","command":"c1","completedBy":"alice"}`},
		{"by another", engineState{history: done, marker: &marker{Command: "c2", User: "bob"}, hadRight: true}, 409, false,
			`{"error":"the task was completed by another command","task":"t","completedBy":"bob","completedAt":"2026-12-03T07:30:00Z"}`},
		// A command id another user sent first is not alice's command.
		{"this command id, another user", engineState{history: done, marker: &marker{Command: "c1", User: "bob"}, hadRight: true}, 409, false,
			`{"error":"the task was completed by another command","task":"t","completedBy":"bob","completedAt":"2026-12-03T07:30:00Z"}`},
		{"outside", engineState{history: done, hadRight: true}, 409, false,
			`{"error":"the task was completed outside this service","task":"t","completedAt":"2026-12-03T07:30:00Z"}`},
		// Who completed a task, and when, is told only to a user who had a right on it (an
		// outside tester read it of any task).
		{"by another, asked by a stranger", engineState{history: done, marker: &marker{Command: "c2", User: "bob"}}, 404, false,
			`{"error":"no such task","task":"t"}`},
		{"outside, asked by a stranger", engineState{history: done}, 404, false, `{"error":"no such task","task":"t"}`},
		// A suspended task was 503 for ever.
		{"suspended", engineState{open: true, suspended: true}, 409, false,
			`{"state":"suspended","error":"the task is suspended: it cannot be completed until its process is activated again","task":"t"}`},
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
	open := Task{ID: "t", ProcessInstanceID: "pi", CandidateUsers: []string{"alice"}, CandidateGroups: []string{"approvers"}, ETag: `"e1"`,
		Variables: camunda7.Variables{"amount": camunda7.LongVar(100), "note": camunda7.StringVar("x"), "ok": camunda7.BoolVar(true),
			"unset": camunda7.NullVar(), "due": {Type: "Date", Value: []byte(`"2026-12-03T08:00:00.000+0000"`)}}}
	claimed := open
	claimed.Assignee = "bob"
	suspendedTask := open
	suspendedTask.Suspended = true
	withFields := open
	withFields.Fields = []string{"ok", "note"}
	standalone := open
	standalone.ProcessInstanceID = ""
	delegatedTask := claimed
	delegatedTask.Owner, delegatedTask.DelegationState = "alice", "PENDING"
	resolvedTask := delegatedTask
	resolvedTask.Assignee, resolvedTask.DelegationState = "alice", "RESOLVED"
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
		// The engine resolves a delegated task submitted, it does not complete it.
		{"the delegate", delegatedTask, Identity{User: "bob"}, `"e1"`, nil, http.StatusConflict},
		{"the owner of a delegated task", delegatedTask, Identity{User: "alice"}, `"e1"`, nil, http.StatusForbidden},
		{"the owner once resolved", resolvedTask, Identity{User: "alice"}, `"e1"`, nil, 0},
		// A value must fit the type of the variable it overwrites (an outside tester turned
		// an Integer amount into the String "notanumber"); a new name may be set.
		{"fitting values", open, Identity{User: "alice"}, `"e1"`, Form{"amount": json.Number("250"), "note": "y", "ok": false, "unset": "now set", "new": "a comment"}, 0},
		{"a string for a number", open, Identity{User: "alice"}, `"e1"`, Form{"amount": "notanumber"}, http.StatusUnprocessableEntity},
		{"a number for a string", open, Identity{User: "alice"}, `"e1"`, Form{"note": json.Number("1")}, http.StatusUnprocessableEntity},
		{"a string for a boolean", open, Identity{User: "alice"}, `"e1"`, Form{"ok": "true"}, http.StatusUnprocessableEntity},
		{"a Date from a form", open, Identity{User: "alice"}, `"e1"`, Form{"due": "2027-01-01"}, http.StatusUnprocessableEntity},
		{"null for anything", open, Identity{User: "alice"}, `"e1"`, Form{"amount": nil}, 0},
		// A number keeps its variable's type: a fraction is no Long (an outside tester's 1.5
		// turned a Long field into a Double).
		{"a fraction for a Long", open, Identity{User: "alice"}, `"e1"`, Form{"amount": json.Number("1.5")}, http.StatusUnprocessableEntity},
		{"an exponent for a Long", open, Identity{User: "alice"}, `"e1"`, Form{"amount": json.Number("1e3")}, http.StatusUnprocessableEntity},
		{"If-Match *", open, Identity{User: "alice"}, `*`, nil, 0},
		{"If-Match list", open, Identity{User: "alice"}, `"old", "e1"`, nil, 0},
		{"If-Match weak", open, Identity{User: "alice"}, `W/"e1"`, nil, http.StatusPreconditionFailed},
		{"suspended", suspendedTask, Identity{User: "alice"}, `"e1"`, nil, http.StatusConflict},
		// A task without a process: the engine would keep no record of the command.
		{"standalone", standalone, Identity{User: "alice"}, `"e1"`, nil, http.StatusUnprocessableEntity},
		// A task whose form declares fields takes those only (an outside tester set any name).
		{"a declared field", withFields, Identity{User: "alice"}, `"e1"`, Form{"ok": false, "note": "y"}, 0},
		{"not a declared field", withFields, Identity{User: "alice"}, `"e1"`, Form{"ok": true, "amount": json.Number("1")}, http.StatusUnprocessableEntity},
		{"a new name, fields declared", withFields, Identity{User: "alice"}, `"e1"`, Form{"extra": "x"}, http.StatusUnprocessableEntity},
		{"suspended, stranger", suspendedTask, Identity{User: "carol"}, `"e1"`, nil, http.StatusForbidden},
	} {
		got := 0
		if a := checkCompletion(c.task, c.who, c.ifMatch, c.form); a != nil {
			got = a.Status
		}
		assert.Equal(t, c.want, got, c.name)
	}
}

// hadRight alone: who learns who completed a gone task.
func TestHadRight(t *testing.T) {
	h := admin.HistoricUserTask{Assignee: "bob"}
	log := []admin.HistoricIdentityLink{
		{Type: "candidate", UserID: "alice", OperationType: "add"},
		{Type: "candidate", GroupID: "approvers", OperationType: "add"},
		{Type: "assignee", UserID: "erin", OperationType: "add"},
		{Type: "owner", UserID: "olga", OperationType: "add"},
	}
	for who, want := range map[string]bool{"bob": true, "alice": true, "erin": true, "dave@approvers": true,
		"olga": false, "carol": false, "mallory@auditors": false, "marker": true} {
		user, group, _ := strings.Cut(who, "@")
		id := Identity{User: user}
		if group != "" {
			id.Groups = []string{group}
		}
		assert.Equal(t, want, hadRight(h, &marker{Command: "c", User: "marker"}, log, id), who)
	}
	assert.False(t, hadRight(h, nil, nil, Identity{User: "alice"}), "no log (history below full): only the assignee")
}

// matchETag alone: RFC 9110's If-Match.
func TestMatchETag(t *testing.T) {
	for in, want := range map[string]bool{`"e1"`: true, `*`: true, ` * `: true, `"a","e1"`: true, `"a" , "e1"`: true,
		`W/"e1"`: false, `"a"`: false, `e1`: false, `"e1`: false, `"a" x, "e1"`: false, ``: false, `"a", W/"e1"`: false} {
		assert.Equal(t, want, matchETag(in, `"e1"`), in)
	}
}

// A command's ledger key: the task's prefix, the command id back, and another user's
// copy of the command id is another key.
func TestCommandKey(t *testing.T) {
	k := commandKey("t1", "alice", "c1")
	assert.NotEqual(t, k, commandKey("t1", "bob", "c1"))
	assert.NotEqual(t, k, commandKey("t1", "alice/c1", ""))
	c, ok := CommandOfKey("t1", k)
	assert.True(t, ok)
	assert.Equal(t, "c1", c)
	_, ok = CommandOfKey("t", k)
	assert.False(t, ok, "a key of task t1 is not one of task t")
}

// parseForm refuses what the engine would store otherwise than sent.
func TestParseFormNumbers(t *testing.T) {
	for body, ok := range map[string]bool{`{"n": 9223372036854775807}`: true, `{"n": 9223372036854775808}`: false,
		`{"n": -9223372036854775809}`: false, `{"n": 1e3}`: true, `{"n": 12345678901234567890.5}`: true, `{"n": 1e999}`: false,
		// Stored as 0, so refused; zero itself is fine.
		`{"n": 0.1e-400}`: false, `{"n": 0e5}`: true, `{"n": -0.0}`: true,
		// An outside tester: the last of two equal names won, silently; a lone surrogate
		// in a name was stored as U+FFFD.
		`{"n": 1, "n": "x"}`: false, `{"n": 1, "m": {"n": 2}}`: false, `{"\ud800": 1}`: false, `{"a": "\ud800"}`: false} {
		_, err := parseForm([]byte(body))
		assert.Equal(t, ok, err == nil, body)
	}
	assert.Error(t, checkCommand(Identity{User: "u"}, Command{TaskID: "a/b", ID: "c"}), "a / in a task id")
	assert.Error(t, checkCommand(Identity{User: "u"}, Command{TaskID: "a", ID: "c/d"}), "a / in a command id")
	assert.NoError(t, checkCommand(Identity{User: "u/v"}, Command{TaskID: "a", ID: "c"}), "a user id may hold a /")
}

// formFields alone: the fields each user task of a BPMN document declares, in
// subprocesses too, and none for a task without formData.
func TestFormFields(t *testing.T) {
	doc := `<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn" xmlns:other="urn:other">
  <bpmn:process id="p" isExecutable="true">
    <bpmn:userTask id="approve"><bpmn:extensionElements><camunda:formData>
      <camunda:formField id="approved" type="boolean"><camunda:validation><camunda:constraint name="required"/></camunda:validation></camunda:formField>
      <camunda:formField id="comment" type="string"/>
    </camunda:formData></bpmn:extensionElements></bpmn:userTask>
    <bpmn:userTask id="plain" camunda:formKey="embedded:app:forms/plain.html"/>
    <bpmn:userTask id="foreign"><bpmn:extensionElements><other:formField id="x"/></bpmn:extensionElements></bpmn:userTask>
    <bpmn:subProcess id="sub"><bpmn:userTask id="nested"><bpmn:extensionElements><camunda:formData>
      <camunda:formField id="level" type="long"/></camunda:formData></bpmn:extensionElements></bpmn:userTask></bpmn:subProcess>
    <bpmn:serviceTask id="after"><bpmn:extensionElements><camunda:formData><camunda:formField id="stray"/></camunda:formData></bpmn:extensionElements></bpmn:serviceTask>
    <bpmn:userTask id="legacy" xmlns:activiti="http://activiti.org/bpmn"><bpmn:extensionElements><activiti:formData>
      <activiti:formField id="approved" type="boolean"/></activiti:formData></bpmn:extensionElements></bpmn:userTask>
    <bpmn:userTask id="fixed"><bpmn:extensionElements><camunda:formData>
      <camunda:formField id="limit" type="long"><camunda:validation><camunda:constraint name="readonly"/></camunda:validation></camunda:formField>
    </camunda:formData></bpmn:extensionElements></bpmn:userTask>
    <bpmn:userTask id="defaults"><bpmn:extensionElements><camunda:formData>
      <camunda:formField id="amount" type="long" defaultValue="5"/><camunda:formField id="note" type="string"/>
    </camunda:formData></bpmn:extensionElements></bpmn:userTask>
    <bpmn:userTask id="mixed"><bpmn:extensionElements><camunda:formData>
      <camunda:formField id="limit" type="long"><camunda:validation><camunda:constraint name="readonly"/><camunda:constraint name="max" config="5"/></camunda:validation></camunda:formField>
      <camunda:formField id="amount" type="long"><camunda:validation><camunda:constraint name="required"/></camunda:validation></camunda:formField>
    </camunda:formData></bpmn:extensionElements></bpmn:userTask>
  </bpmn:process>
</bpmn:definitions>`
	forms, err := formFields(doc)
	assert.NoError(t, err)
	got := map[string][]string{}
	for task, f := range forms {
		got[task] = f.fields
	}
	// An outside tester: activiti:formField was not seen (any variable could be set), and
	// a readonly field could be set.
	assert.Equal(t, map[string][]string{"approve": {"approved", "comment"}, "nested": {"level"}, "legacy": {"approved"},
		"fixed": {}, "mixed": {"amount"}, "defaults": {"amount", "note"}}, got)
	assert.Equal(t, []string{"amount"}, forms["defaults"].defaulted, "the fields with a default value")
	_, err = formFields(`<bpmn:definitions><bpmn:userTask id="a">`)
	assert.Error(t, err, "a document cut short")
}

// numberVarAs alone: a number as the type of the variable it overwrites.
func TestNumberVarAs(t *testing.T) {
	for _, c := range []struct {
		typ, n, want string // want: type and value, or "" refused
	}{
		{camunda7.TypeShort, "32767", "Short 32767"}, {camunda7.TypeShort, "32768", ""},
		{camunda7.TypeInteger, "-2147483648", "Integer -2147483648"}, {camunda7.TypeInteger, "3000000000", ""},
		{camunda7.TypeLong, "9223372036854775807", "Long 9223372036854775807"}, {camunda7.TypeLong, "1.5", ""},
		{camunda7.TypeLong, "1e3", ""}, {camunda7.TypeDouble, "5", "Double 5"}, {camunda7.TypeDouble, "1.5", "Double 1.5"},
		{camunda7.TypeDouble, "1e999", ""}, {camunda7.TypeNull, "7", "Long 7"}, {"", "2.5", "Double 2.5"},
	} {
		v, err := numberVarAs(c.typ, json.Number(c.n))
		got := ""
		if err == nil {
			got = v.Type + " " + string(v.Value)
		}
		assert.Equal(t, c.want, got, "%s %s", c.typ, c.n)
	}
	vars := engineVariables(Form{"count": json.Number("3")}, camunda7.Variables{"count": {Type: camunda7.TypeInteger}}, "t", "c", "u")
	assert.Equal(t, camunda7.TypeInteger, vars["count"].Type, "an Integer stays an Integer")
}

// logLimit alone: one record per interval, the others counted (an outside tester's
// 22,000 bad tokens wrote 22,000 records).
func TestLogLimit(t *testing.T) {
	var l logLimit
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	ok, n := l.allow(t0)
	assert.True(t, ok)
	assert.Zero(t, n)
	for i := range 100 {
		ok, _ := l.allow(t0.Add(time.Duration(i) * 50 * time.Millisecond))
		assert.False(t, ok, "within the interval")
	}
	ok, n = l.allow(t0.Add(logEvery))
	assert.True(t, ok)
	assert.Equal(t, 100, n, "the records not written are counted")
}

// engineFault alone: which engine answers are the engine failing for good (502), and
// which are retried (a concurrent change, the database: an outside tester's parallel
// branches got a 422 for an optimistic-locking failure). Which are a form's values refused
// (422) is camunda7's classification (ErrFormRefused, camunda7.TestFormRefusal).
func TestEngineFault(t *testing.T) {
	code := func(n int) *int { return &n }
	for _, c := range []struct {
		e     *camunda7.Error
		fault bool
	}{
		{&camunda7.Error{StatusCode: 500, Type: "RestException", Code: code(0), Message: "Cannot submit task form t1: Invalid value submitted for form field 'amount': validation of max(1000) failed."}, true},
		{&camunda7.Error{StatusCode: 500, Type: "RestException", Code: code(1), Message: "Cannot submit task form t1: ENGINE-03005 Execution of 'UPDATE ExecutionEntity' failed"}, false},
		{&camunda7.Error{StatusCode: 500, Type: "RestException", Code: code(0), Message: "Cannot submit task form t1: Unknown property used in expression: ${nosuchbean}"}, true},
		{&camunda7.Error{StatusCode: 500, Type: "ProcessEngineException", Code: code(10000), Message: "deadlock"}, false},
		{&camunda7.Error{StatusCode: 500, Type: "RestException", Message: "Cannot submit task form t1: no code (an engine before 7.20)"}, false},
		{&camunda7.Error{StatusCode: 404, Type: "RestException", Code: code(0), Message: "Cannot submit task form t1"}, false},
		{&camunda7.Error{StatusCode: 502, Message: "a proxy's"}, false},
		{nil, false},
	} {
		assert.Equal(t, c.fault, engineFault(c.e) != nil, "%+v", c.e)
	}
	vars := engineVariables(Form{"amount": nil, "fresh": nil}, camunda7.Variables{"amount": camunda7.LongVar(5)}, "t", "c", "u")
	assert.Equal(t, camunda7.TypeLong, vars["amount"].Type, "a null keeps its variable's type")
	assert.Equal(t, camunda7.TypeNull, vars["fresh"].Type)
}
