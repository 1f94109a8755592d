package camunda7

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// answerSentinels are the sentinels that classify an engine answer.
var answerSentinels = []error{ErrNotFound, ErrTaskGone, ErrLockLost, ErrSuspended, ErrOptimisticLock, ErrUnauthorized, ErrBadRequest}

// transportSentinels never match an engine answer.
var transportSentinels = []error{ErrNotSent, ErrOutcomeUnknown, ErrMalformedResponse, ErrInvalidArgument}

// TestClassify pins classify against every engine message of the error matrix in
// /work/shared/reference/camunda7-rest.md §1.5 (verbatim, including the engine's quirks).
func TestClassify(t *testing.T) {
	code0, code1 := ptr(0), ptr(1)
	cases := []struct {
		name   string
		task   bool // a per-task endpoint
		status int
		typ    string
		msg    string
		code   *int
		want   error // nil: no specific kind
	}{
		// Locked by someone else, or by nobody: the worker no longer holds the task.
		{"complete by another worker", true, 400, "RestException",
			"External Task 1 cannot be completed by worker 'a'. It is locked by worker 'b'.", code0, ErrLockLost},
		{"complete after unlock (owner null)", true, 400, "RestException",
			"External Task 1 cannot be completed by worker 'a'. It is locked by worker 'null'.", code0, ErrLockLost},
		{"failure by another worker", true, 400, "RestException",
			"Failure of External Task 1 cannot be reported by worker 'a'. It is locked by worker 'b'.", code0, ErrLockLost},
		{"bpmnError by another worker", true, 400, "RestException",
			"Bpmn error of External Task 1 cannot be reported by worker 'a'. It is locked by worker 'b'.", code0, ErrLockLost},
		{"extendLock by another worker (doubled quote)", true, 400, "RestException",
			"The lock of the External Task 1 cannot be extended by worker 'a''. It is locked by worker 'b'.", code0, ErrLockLost},
		{"extendLock of a never-locked task", true, 400, "RestException",
			"The lock of the External Task 1 cannot be extended by worker 'a''. It is locked by worker 'null'.", code0, ErrLockLost},
		{"extendLock after expiry", true, 400, "RestException",
			"Cannot extend a lock that expired: lockExpirationTime is not greater than or equal to 1700000000000", code0, ErrLockLost},
		{"lock held by another worker", true, 400, "RestException",
			"External Task 1 cannot be locked by worker 'a'. It is locked by worker 'b'.", code0, ErrLockLost},
		{"worker id with quotes and spaces", true, 400, "RestException",
			"External Task 1 cannot be completed by worker 'it's me'. It is locked by worker 'other worker'.", code0, ErrLockLost},

		{"suspended", true, 400, "RestException", "ENGINE-03043 ExternalTask with id '1' is suspended.", code0, ErrSuspended},
		{"suspended process definition (not a task endpoint)", false, 400, "RestException",
			"ENGINE-03043 ProcessDefinition with id 'p:1:2' is suspended.", code0, ErrSuspended},

		{"404 task, code 0", true, 404, "RestException", "External task with id 1 does not exist", code0, ErrTaskGone},
		{"404 task, code null", true, 404, "RestException", "External task with id 1 does not exist", nil, ErrTaskGone},
		{"404 task, no engine body", true, 404, "", "Not Found", nil, ErrTaskGone},
		{"404 elsewhere", false, 404, "RestException", "No matching process definition with key: x and no tenant-id", nil, ErrNotFound},

		{"401 no body", false, 401, "", "Unauthorized", nil, ErrUnauthorized},
		{"401 on a task endpoint", true, 401, "", "Unauthorized", nil, ErrUnauthorized},
		{"403 authorization exception", true, 403, "AuthorizationException",
			"The user with id 'x' does not have 'UPDATE' permission on resource '1' of type 'ProcessInstance'.", code0, ErrUnauthorized},

		{"optimistic locking", true, 500, "OptimisticLockingException",
			"ENGINE-03005 Execution of 'UPDATE ExternalTaskEntity[1]' failed. Entity was updated by another transaction concurrently.", code1, ErrOptimisticLock},
		{"optimistic locking, code null", false, 500, "OptimisticLockingException", "...", nil, ErrOptimisticLock},
		{"code 1 under another type", true, 500, "ProcessEngineException", "...", code1, ErrOptimisticLock},

		{"lock message on a non-task endpoint", false, 400, "RestException",
			"External Task 1 cannot be completed by worker 'a'. It is locked by worker 'b'.", code0, ErrBadRequest},
		{"lockTime not greater than 0", true, 400, "RestException", "lockTime is not greater than 0", code0, ErrBadRequest},
		{"negative retries", true, 400, "RestException",
			"The number of retries cannot be negative: retries is not greater than or equal to 0", code0, ErrBadRequest},
		{"jackson mapping error", true, 400, "InvalidRequestException", "", nil, ErrBadRequest},
		{"unsupported variable type", false, 400, "InvalidRequestException", "Unsupported value type 'Foo'", nil, ErrBadRequest},

		{"workerId null", true, 500, "NullValueException", "workerId is null", code0, nil},
		{"failure with negative retries", true, 500, "ProcessEngineException", "retries is not greater than or equal to 0", code0, nil},
		{"database deadlock", true, 500, "ProcessEngineException", "deadlock", ptr(10000), nil},
		{"continuation failed", true, 500, "ScriptEvaluationException", "Unable to evaluate script", code0, nil},
		{"413 from a proxy", true, 413, "", "Request Entity Too Large", nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, classify(tc.task, tc.status, tc.typ, tc.msg, tc.code))

			e := newError("op", tc.task, tc.status, tc.typ, tc.msg, tc.code)
			for _, s := range answerSentinels {
				want := s == tc.want ||
					(s == ErrNotFound && tc.status == http.StatusNotFound) ||
					(s == ErrBadRequest && tc.status == http.StatusBadRequest)
				assert.Equal(t, want, errors.Is(e, s), "errors.Is(%v)", s)
			}
			for _, s := range transportSentinels {
				assert.NotErrorIs(t, e, s)
			}
			assert.True(t, SafeToRetry(e), "an engine answer proves nothing took effect")
			assert.True(t, SafeToRetry(fmt.Errorf("worker: %w", e)))
		})
	}
}

func TestSafeToRetry(t *testing.T) {
	notSent := &TransportError{Op: "complete external task 1", Sent: false, Err: errors.New("dial tcp: connection refused")}
	sent := &TransportError{Op: "complete external task 1", Sent: true, Err: io.EOF}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"unknown error", errors.New("something"), false},
		{"bare context cancellation", context.Canceled, false},
		{"not sent", notSent, true},
		{"not sent, wrapped", fmt.Errorf("poll: %w", notSent), true},
		{"sent, no answer", sent, false},
		{"sent, no answer, wrapped", fmt.Errorf("poll: %w", sent), false},
		{"joined not-sent and outcome-unknown", errors.Join(notSent, sent), false},
		{"invalid argument", invalid("complete external task 1", "WorkerID is empty"), true},
		{"malformed 200", &ResponseError{Op: "op", StatusCode: 200, Err: errors.New("decode JSON")}, false},
		{"proxy 502", &ResponseError{Op: "op", StatusCode: 502, Err: errors.New("not an engine error body")}, false},
		{"redirect 302", &ResponseError{Op: "op", StatusCode: 302, Err: errors.New("content type is not JSON")}, false},
		{"engine 400", newError("op", true, 400, "RestException", "m", ptr(0)), true},
		{"engine 404", newError("op", true, 404, "RestException", "m", ptr(0)), true},
		{"engine 500", newError("op", true, 500, "ProcessEngineException", "m", ptr(0)), true},
		{"engine optimistic locking", newError("op", true, 500, "OptimisticLockingException", "m", ptr(1)), true},
		{"401", newError("op", false, 401, "", "Unauthorized", nil), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, SafeToRetry(tc.err))
		})
	}
}

func TestErrorKindsMatchTheirSentinels(t *testing.T) {
	te := &TransportError{Op: "op", Sent: false, Err: io.EOF}
	assert.ErrorIs(t, te, ErrNotSent)
	assert.NotErrorIs(t, te, ErrOutcomeUnknown)
	assert.ErrorIs(t, te, io.EOF, "the cause stays reachable")
	te.Sent = true
	assert.ErrorIs(t, te, ErrOutcomeUnknown)
	assert.NotErrorIs(t, te, ErrNotSent)
	assert.NotErrorIs(t, te, ErrMalformedResponse)

	for _, status := range []int{200, 204, 302, 500, 502, 503, 504} {
		re := &ResponseError{Op: "op", StatusCode: status, Err: io.ErrUnexpectedEOF}
		assert.ErrorIs(t, re, ErrMalformedResponse, "%d", status)
		assert.ErrorIs(t, re, ErrOutcomeUnknown, "%d", status)
		assert.NotErrorIs(t, re, ErrNotSent, "%d", status)
		assert.ErrorIs(t, re, io.ErrUnexpectedEOF, "%d", status)
	}
	for _, status := range []int{400, 404, 413, 499} {
		re := &ResponseError{Op: "op", StatusCode: status, Err: io.ErrUnexpectedEOF}
		assert.ErrorIs(t, re, ErrMalformedResponse, "%d", status)
		assert.NotErrorIs(t, re, ErrOutcomeUnknown, "a %d proves the request was refused", status)
	}

	ae := invalid("op", "bad %s", "thing")
	assert.ErrorIs(t, ae, ErrInvalidArgument)
	assert.ErrorIs(t, ae, ErrNotSent)
	assert.NotErrorIs(t, ae, ErrOutcomeUnknown)
	assert.NotErrorIs(t, ae, ErrBadRequest)

	// A nil kind (a 500 the client does not classify) must not match a nil target or anything else.
	e := newError("op", true, 500, "NullValueException", "workerId is null", ptr(0))
	for _, s := range append(answerSentinels, transportSentinels...) {
		assert.NotErrorIs(t, e, s)
	}
}

func TestErrorStringsIncludeOp(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"engine error", newError("complete external task 1", true, 400, "RestException", "External Task 1 cannot be completed by worker 'a'. It is locked by worker 'b'.", ptr(0)),
			"complete external task 1: engine answered 400 RestException: External Task 1 cannot be completed by worker 'a'. It is locked by worker 'b'."},
		{"status only", newError("complete external task 1", true, 401, "", "Unauthorized", nil),
			"complete external task 1: engine answered 401: Unauthorized"},
		{"type without message", newError("complete external task 1", true, 400, "InvalidRequestException", "", nil),
			"complete external task 1: engine answered 400 InvalidRequestException"},
		{"not sent", &TransportError{Op: "extend lock of external task 1", Err: errors.New("dial tcp 127.0.0.1:1: connect: connection refused")},
			"extend lock of external task 1: not sent: dial tcp 127.0.0.1:1: connect: connection refused"},
		{"sent, no answer", &TransportError{Op: "report failure of external task 1", Sent: true, Err: io.EOF},
			"report failure of external task 1: sent, no answer: EOF"},
		{"unreadable with snippet", &ResponseError{Op: "fetch and lock external tasks", StatusCode: 502, ContentType: "text/html",
			Snippet: "<html>", Err: errors.New("not an engine error body")},
			`fetch and lock external tasks: unreadable answer (status 502, content-type "text/html"): not an engine error body; body starts "<html>"`},
		{"unreadable without snippet", &ResponseError{Op: "get engine version", StatusCode: 200, ContentType: "application/json",
			Err: io.ErrUnexpectedEOF},
			`get engine version: unreadable answer (status 200, content-type "application/json"): unexpected EOF`},
		{"invalid argument", invalid("complete external task 1", "WorkerID is empty"),
			"complete external task 1: WorkerID is empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.err.Error())
		})
	}
}

func TestSnippet(t *testing.T) {
	assert.Equal(t, "", snippet(nil))
	assert.Equal(t, "a b c", snippet([]byte("a\nb\tc")))
	long := snippet([]byte(fmt.Sprintf("%0500d", 0)))
	assert.Len(t, long, 120)
	// Invalid UTF-8 and multi-byte runes are cut on rune boundaries, never mid-rune.
	s := snippet(append([]byte{0xff, 0xfe}, []byte("żółw")...))
	assert.Equal(t, "?żółw", s)
	many := snippet([]byte(strings.Repeat("ż", 200)))
	require.Len(t, []rune(many), 120)
	assert.Equal(t, strings.Repeat("ż", 120), many)
}
