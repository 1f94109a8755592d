package taskpage

import (
	"encoding/json"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/humantask"
)

// What a person types into a number input reaches the service as JSON writes it: an
// outside tester's "0500" (a browser sends it as typed) and "+5" were answered 503 "send
// the same form again" for ever.
func TestTypedNumbers(t *testing.T) {
	for typed, want := range map[string]string{"0500": "500", "+5": "5", "-007.50": "-7.50", "00.5": "0.5", "0": "0",
		"-0": "-0", "1e3": "1e3", "12": "12", "0x1p3": "0x1p3", "1_001": "1_001"} {
		n, ok := typedNumber(typed)
		assert.True(t, ok, typed)
		assert.Equal(t, json.Number(want), n, typed)
	}
	for _, typed := range []string{"+-5", "-+5", ".5", "Inf", "NaN", "-", "+", "e5"} {
		_, ok := typedNumber(typed)
		assert.False(t, ok, typed)
	}
	f, err := formOf(url.Values{"kind.amount": {"number"}, "var.amount": {" 0500 "}})
	require.NoError(t, err)
	assert.Equal(t, json.Number("500"), f["amount"])
	_, err = formOf(url.Values{"kind.amount": {"number"}, "var.amount": {"Inf"}})
	assert.Error(t, err)
}

// A variable posted with two kinds is a bad form, not a variable left out: an outside
// tester's "kind.amount=number&kind.amount=string&var.amount=5000" was answered 200
// "You completed this task" without the amount.
func TestTwoKindsOfOneVariable(t *testing.T) {
	_, err := formOf(url.Values{"kind.amount": {"number", "string"}, "var.amount": {"5000"}})
	assert.Error(t, err)
}

// What the engine holds (a task's name, its variables' names and values, users) is shown
// with what a terminal or a bidi renderer would act on escaped, as the console shows
// it: an outside tester's task name with U+202E (right-to-left override) reversed the
// page's heading and title.
func TestEngineTextIsShownEscaped(t *testing.T) {
	const rlo = "nm\u202e\u0001"
	task := humantask.Task{ID: "t1", Name: rlo, Assignee: "al\u202eice", CandidateUsers: []string{"b\u202eob"},
		Variables: camunda7.Variables{"n\u202eote": camunda7.StringVar("x")}}
	for _, c := range []struct {
		name string
		v    view
	}{
		{"form", view{User: "u\u202e", Title: taskTitle(task), Task: &task, Fields: fields(task), Command: "c"}},
		{"list", view{User: "u\u202e", Title: "Your tasks", Tasks: []humantask.Task{task}}},
		{"result", view{User: "u\u202e", Title: "Already completed", Message: "completed by " + rlo,
			Answer: answer{CompletedBy: "al\u202eice"}}},
	} {
		var b strings.Builder
		require.NoError(t, templates.ExecuteTemplate(&b, c.name, c.v))
		// what the page shows: its text, not its tags (an input's name keeps the variable's
		// own name, which the engine is sent back)
		shown := regexp.MustCompile(`<[^>]*>`).ReplaceAllString(b.String(), "")
		assert.NotContains(t, shown, "\u202e", c.name)
		assert.NotContains(t, shown, "\u0001", c.name)
		assert.Contains(t, shown, `\u202e`, c.name)
	}
}

// A posted field's name is the sender's: a refusal that names it shows it escaped, and
// the "message" page shows its text escaped too. An outside tester's name with a byte
// that is not UTF-8 and an unknown kind came back raw in the 400 page.
func TestRefusedFieldNameIsShownEscaped(t *testing.T) {
	const name = "a\xff\u202e\x1b"
	for _, c := range []struct {
		why  string
		form url.Values
	}{
		{"unknown kind", url.Values{"kind." + name: {"date"}}},
		{"two kinds", url.Values{"kind." + name: {"number", "string"}}},
		{"not a number", url.Values{"kind." + name: {"number"}, "var." + name: {"x"}}},
	} {
		_, err := formOf(c.form)
		require.Error(t, err, c.why)
		for _, raw := range []string{"\xff", "\u202e", "\x1b"} {
			assert.NotContains(t, err.Error(), raw, c.why)
		}
		var b strings.Builder
		require.NoError(t, templates.ExecuteTemplate(&b, "message", view{Title: "Form refused", Message: "completed by " + name}))
		for _, raw := range []string{"\xff", "\u202e", "\x1b"} {
			assert.NotContains(t, b.String(), raw, c.why)
		}
	}
}
