package camunda7

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// answerSentinels are the sentinels that classify an engine answer.
var answerSentinels = []error{ErrNotFound, ErrTaskGone, ErrLockLost, ErrLockExpired, ErrSuspended, ErrOptimisticLock, ErrFormRefused, ErrUnauthorized, ErrBadRequest, ErrThrottled}

// transportSentinels never match an engine answer.
var transportSentinels = []error{ErrNotSent, ErrUnknownOutcome, ErrMalformedResponse, ErrInvalidArgument}

// TestClassify pins classify against every engine message of the error matrix that the
// conformance suite pins against the real engine (verbatim, including the engine's quirks;
// see docs/engine-facts.md).
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
			"Cannot extend a lock that expired: lockExpirationTime is not greater than or equal to 1700000000000", code0, ErrLockExpired},
		{"extendLock after expiry, refetched by another worker", true, 400, "RestException",
			"The lock of the External Task 1 cannot be extended by worker 'a''. It is locked by worker 'b'.", code0, ErrLockLost},
		{"expired-lock message on a non-task endpoint", false, 400, "RestException",
			"Cannot extend a lock that expired: lockExpirationTime is not greater than or equal to 1700000000000", code0, ErrBadRequest},
		{"lock held by another worker", true, 400, "RestException",
			"External Task 1 cannot be locked by worker 'a'. It is locked by worker 'b'.", code0, ErrLockLost},
		{"worker id with quotes and spaces", true, 400, "RestException",
			"External Task 1 cannot be completed by worker 'it's me'. It is locked by worker 'other worker'.", code0, ErrLockLost},

		{"suspended", true, 400, "RestException", "ENGINE-03043 ExternalTask with id '1' is suspended.", code0, ErrSuspended},
		{"suspended process definition (not a task endpoint)", false, 400, "RestException",
			"ENGINE-03043 ProcessDefinition with id 'p:1:2' is suspended.", code0, ErrSuspended},

		{"404 task, code 0", true, 404, "RestException", "External task with id 1 does not exist", code0, ErrTaskGone},
		{"404 task, code null", true, 404, "RestException", "External task with id 1 does not exist", nil, ErrTaskGone},
		{"404 task, no engine body (answerError makes it a *ResponseError)", true, 404, "", "Not Found", nil, ErrNotFound},
		{"404 task, the engine's answer for a path it does not serve", true, 404, "NotFoundException", "HTTP 404 Not Found", nil, ErrNotFound},
		{"500 errorDetails of an unknown task", true, 500, "NullValueException", "No external task found with id 1: externalTask is null", code0, ErrTaskGone},
		{"500 no-task message on a non-task endpoint", false, 500, "NullValueException", "No external task found with id 1: externalTask is null", code0, nil},
		{"404 elsewhere", false, 404, "RestException", "No matching process definition with key: x and no tenant-id", nil, ErrNotFound},

		{"401 no body", false, 401, "", "Unauthorized", nil, ErrUnauthorized},
		{"401 on a task endpoint", true, 401, "", "Unauthorized", nil, ErrUnauthorized},
		{"403 authorization exception", true, 403, "AuthorizationException",
			"The user with id 'x' does not have 'UPDATE' permission on resource '1' of type 'ProcessInstance'.", code0, ErrUnauthorized},

		{"optimistic locking", true, 500, "OptimisticLockingException",
			"ENGINE-03005 Execution of 'UPDATE ExternalTaskEntity[1]' failed. Entity was updated by another transaction concurrently.", code1, ErrOptimisticLock},
		{"optimistic locking, code null", false, 500, "OptimisticLockingException", "...", nil, ErrOptimisticLock},
		{"code 1 under another type", true, 500, "ProcessEngineException", "...", code1, ErrOptimisticLock},

		// submit-form: the form's values refused (TestFormRefusal gives the reasons), and what is not.
		{"form field validation", false, 500, "RestException",
			"Cannot submit task form t1: Invalid value submitted for form field 'amount': validation of max(1000) failed.", code0, ErrFormRefused},
		{"enum form field", false, 500, "RestException", "Cannot submit task form t1: Invalid value for enum form property: secret", code0, ErrFormRefused},
		{"date form field", false, 500, "RestException",
			"Cannot submit task form t1: Could not parse value 'secret' as date using date format 'dd/MM/yyyy'.", code0, ErrFormRefused},
		{"submit-form, optimistic locking", false, 500, "RestException",
			"Cannot submit task form t1: ENGINE-03005 Execution of 'UPDATE ExecutionEntity' failed", code1, ErrOptimisticLock},
		{"submit-form, a listener's expression", false, 500, "RestException",
			"Cannot submit task form t1: Unknown property used in expression: ${nosuchbean}", code0, nil},
		{"submit-form, a validation message without a code (an engine before 7.20)", false, 500, "RestException",
			"Cannot submit task form t1: Invalid value submitted for form field 'amount': validation of max(1000) failed.", nil, nil},
		{"submit-form, a validation message with a database's code", false, 500, "ProcessEngineException",
			"Cannot submit task form t1: Invalid value submitted for form field 'amount': validation of max(1000) failed.", ptr(10000), nil},
		{"validation message in a 404", false, 404, "RestException",
			"Cannot submit task form t1: Invalid value submitted for form field 'amount': validation of max(1000) failed.", code0, ErrNotFound},

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
		{"413 from a proxy", true, 413, "", "Request Entity Too Large", nil, ErrThrottled},
		{"429 from a proxy", true, 429, "", "Too Many Requests", nil, ErrThrottled},
		{"429 with a JSON body, not a task endpoint", false, 429, "RestException", "rate limited", code0, ErrThrottled},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, classify(tc.task, tc.status, tc.typ, tc.msg, tc.code))

			e := newError("op", tc.task, tc.status, tc.typ, tc.msg, tc.code)
			for _, s := range answerSentinels {
				want := s == tc.want ||
					(s == ErrNotFound && tc.status == http.StatusNotFound) ||
					(s == ErrBadRequest && tc.status == http.StatusBadRequest) ||
					(s == ErrLockLost && tc.want == ErrLockExpired)
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

// FormRefusal's reasons name the field and the validation, an enum's values or a date's
// format, and never quote the value refused.
func TestFormRefusal(t *testing.T) {
	for _, c := range []struct{ msg, reason string }{
		{"Cannot submit task form t1: Invalid value submitted for form field 'amount': validation of max(1000) failed.",
			`form field "amount": validation of max(1000) failed`},
		{"Cannot submit task form t1: Invalid value submitted for form field 'code': validation of required failed.",
			`form field "code": validation of required failed`},
		{"Cannot submit task form t1: Invalid value for enum form property: secret", "a value is not one of its enum field's values"},
		{"Cannot submit task form t1: Could not parse value 'secret' as date using date format 'dd/MM/yyyy'.",
			"a date is not in its field's format (dd/MM/yyyy unless the engine is configured otherwise)"},
		// a value that reads like a field's refusal, quoted in another refusal, is not taken for one
		{"Cannot submit task form t1: Invalid value for enum form property: form field 'secret': validation of required failed",
			"a value is not one of its enum field's values"},
		{"Cannot submit task form t1: Could not parse value 'x: Invalid value submitted for form field 'secret': validation of required failed' as date using date format 'dd/MM/yyyy'.",
			"a date is not in its field's format (dd/MM/yyyy unless the engine is configured otherwise)"},
	} {
		err := fmt.Errorf("wrapped: %w", newError("submit", false, 500, "RestException", c.msg, ptr(0)))
		got, ok := FormRefusal(err)
		assert.True(t, ok, c.msg)
		assert.Equal(t, c.reason, got)
		assert.NotContains(t, got, "secret")
	}
	for _, err := range []error{
		newError("submit", false, 500, "RestException", "Cannot submit task form t1: Unknown property used in expression", ptr(0)),
		newError("submit", false, 500, "RestException", "Cannot submit task form t1: Invalid value for enum form property: x", ptr(1)),
		newError("submit", false, 500, "RestException", "Cannot submit task form t1: Unknown property: Invalid value for enum form property: secret", ptr(0)),
		newError("submit", false, 500, "RestException", "Cannot submit task form t1: a listener: Invalid value submitted for form field 'secret': validation of required failed.", ptr(0)),
		&TransportError{Op: "submit", Sent: true, Err: io.EOF},
		nil,
	} {
		_, ok := FormRefusal(err)
		assert.False(t, ok, "%v", err)
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
		{"joined not-sent and unknown-outcome", errors.Join(notSent, sent), false},
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
	assert.NotErrorIs(t, te, ErrUnknownOutcome)
	assert.ErrorIs(t, te, io.EOF, "the cause stays reachable")
	te.Sent = true
	assert.ErrorIs(t, te, ErrUnknownOutcome)
	assert.NotErrorIs(t, te, ErrNotSent)
	assert.NotErrorIs(t, te, ErrMalformedResponse)

	for _, status := range []int{200, 204, 302, 500, 502, 503, 504} {
		re := &ResponseError{Op: "op", StatusCode: status, Err: io.ErrUnexpectedEOF}
		assert.ErrorIs(t, re, ErrMalformedResponse, "%d", status)
		assert.ErrorIs(t, re, ErrUnknownOutcome, "%d", status)
		assert.NotErrorIs(t, re, ErrNotSent, "%d", status)
		assert.ErrorIs(t, re, io.ErrUnexpectedEOF, "%d", status)
	}
	for _, status := range []int{400, 404, 413, 429, 499} {
		re := &ResponseError{Op: "op", StatusCode: status, Err: io.ErrUnexpectedEOF}
		assert.ErrorIs(t, re, ErrMalformedResponse, "%d", status)
		assert.NotErrorIs(t, re, ErrUnknownOutcome, "a %d proves the request was refused", status)
		assert.Equal(t, status == 413 || status == 429, errors.Is(re, ErrThrottled), "%d throttled", status)
	}
	for _, status := range []int{200, 500, 502, 503} {
		assert.NotErrorIs(t, &ResponseError{Op: "op", StatusCode: status, Err: io.EOF}, ErrThrottled, "%d", status)
	}

	ae := invalid("op", "bad %s", "thing")
	assert.ErrorIs(t, ae, ErrInvalidArgument)
	assert.ErrorIs(t, ae, ErrNotSent)
	assert.NotErrorIs(t, ae, ErrUnknownOutcome)
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

// ErrLockExpired is a kind of ErrLockLost that says more: the lock ran out and nobody
// else took the task. "It is locked by worker ..." (another worker, or nobody after an
// unlock) is ErrLockLost only.
func TestErrLockExpiredIsDistinctFromLockedByAnother(t *testing.T) {
	expired := newError("extend lock of external task 1", true, 400, "RestException",
		"Cannot extend a lock that expired: lockExpirationTime is not greater than or equal to 1764597600000", ptr(0))
	for _, err := range []error{expired, fmt.Errorf("extender: %w", expired)} {
		assert.ErrorIs(t, err, ErrLockExpired)
		assert.ErrorIs(t, err, ErrLockLost, "backward compatible: an expired lock is still a lost lock")
		assert.ErrorIs(t, err, ErrBadRequest)
		assert.NotErrorIs(t, err, ErrTaskGone)
		assert.NotErrorIs(t, err, ErrThrottled)
		assert.True(t, SafeToRetry(err))
	}
	for _, msg := range []string{
		"The lock of the External Task 1 cannot be extended by worker 'a''. It is locked by worker 'b'.",
		"The lock of the External Task 1 cannot be extended by worker 'a''. It is locked by worker 'null'.",
		"External Task 1 cannot be locked by worker 'a'. It is locked by worker 'b'.",
		"External Task 1 cannot be completed by worker 'a'. It is locked by worker 'b'.",
	} {
		err := newError("op", true, 400, "RestException", msg, ptr(0))
		assert.ErrorIs(t, err, ErrLockLost, msg)
		assert.NotErrorIs(t, err, ErrLockExpired, msg)
	}
	// The sentinels themselves stay apart: neither wraps the other.
	assert.NotErrorIs(t, ErrLockExpired, ErrLockLost)
	assert.NotErrorIs(t, ErrLockLost, ErrLockExpired)
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC)
	cases := []struct {
		name, header string
		want         time.Duration
	}{
		{"absent", "", 0},
		{"seconds", "120", 2 * time.Minute},
		{"seconds with spaces", " 7 ", 7 * time.Second},
		{"zero asks for no wait", "0", 0},
		{"at the cap", "300", MaxRetryAfter},
		{"above the cap", "301", MaxRetryAfter},
		{"far above the cap", "86400", MaxRetryAfter},
		{"too many digits for an int64", "99999999999999999999999", MaxRetryAfter},
		{"negative", "-5", 0},
		{"fractional", "1.5", 0},
		{"garbage", "soon", 0},
		{"IMF-fixdate", "Sat, 14 Mar 2026 09:28:23 GMT", 90 * time.Second},
		{"obsolete RFC 850 date", "Saturday, 14-Mar-26 09:27:03 GMT", 10 * time.Second},
		{"obsolete asctime date", "Sat Mar 14 09:27:53 2026", time.Minute},
		{"date already past", "Sat, 14 Mar 2026 09:00:00 GMT", 0},
		{"date an hour ahead", "Sat, 14 Mar 2026 10:26:53 GMT", MaxRetryAfter},
		{"date not in GMT", "Sat, 14 Mar 2026 11:28:23 +0200", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, parseRetryAfter(tc.header, now))
		})
	}
}

// A 429 or 413 from a proxy is ErrThrottled whatever its body, and RetryAfter reads
// its Retry-After header in either form.
func TestThrottledAnswersAndRetryAfter(t *testing.T) {
	const engineBody = `{"type":"RestException","message":"rate limit exceeded","code":0}`
	page := func(status int) string {
		return fmt.Sprintf("<html><body><h1>%d %s</h1></body></html>", status, http.StatusText(status))
	}
	seconds := func(time.Time) string { return "30" }
	httpDate := func(now time.Time) string { return now.Add(2 * time.Minute).UTC().Format(http.TimeFormat) }
	none := func(time.Time) string { return "" }
	cases := []struct {
		name     string
		status   int
		ctype    string
		body     string
		cfg      Config
		header   func(now time.Time) string
		want     time.Duration // 0: no Retry-After
		engine   bool          // *Error (else *ResponseError)
		typ      string
		tolerate time.Duration // an HTTP-date has whole seconds
	}{
		{name: "429 engine body, seconds", status: 429, ctype: "application/json", body: engineBody, header: seconds,
			want: 30 * time.Second, engine: true, typ: "RestException"},
		{name: "429 engine body, HTTP-date", status: 429, ctype: "application/json", body: engineBody, header: httpDate,
			want: 2 * time.Minute, engine: true, typ: "RestException", tolerate: 2 * time.Second},
		{name: "429 engine body, no header", status: 429, ctype: "application/json", body: engineBody, header: none,
			engine: true, typ: "RestException"},
		{name: "429 proxy page, seconds", status: 429, ctype: "text/html", body: page(429), header: seconds,
			want: 30 * time.Second, engine: true},
		{name: "429 proxy page, HTTP-date", status: 429, ctype: "text/html", body: page(429), header: httpDate,
			want: 2 * time.Minute, engine: true, tolerate: 2 * time.Second},
		{name: "429 proxy page, no header", status: 429, ctype: "text/html", body: page(429), header: none, engine: true},
		{name: "413 proxy page, seconds", status: 413, ctype: "text/html", body: page(413), header: seconds,
			want: 30 * time.Second, engine: true},
		{name: "413 proxy page, no header", status: 413, ctype: "text/html", body: page(413), header: none, engine: true},
		{name: "429 unreadable body, seconds", status: 429, ctype: "text/html", body: page(429), header: seconds,
			cfg: Config{MaxResponseBytes: 16}, want: 30 * time.Second},
		{name: "429 unreadable body, HTTP-date", status: 429, ctype: "text/html", body: page(429), header: httpDate,
			cfg: Config{MaxResponseBytes: 16}, want: 2 * time.Minute, tolerate: 2 * time.Second},
		{name: "413 unreadable body, no header", status: 413, ctype: "text/html", body: page(413), header: none,
			cfg: Config{MaxResponseBytes: 16}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeEngine(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				if h := tc.header(time.Now()); h != "" {
					w.Header().Set("Retry-After", h)
				}
				w.Header().Set("Content-Type", tc.ctype)
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			})
			err := completeCall(t.Context(), f.client(t, tc.cfg))
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrThrottled)
			assert.NotErrorIs(t, err, ErrUnknownOutcome, "a 4xx is a refusal")
			assert.NotErrorIs(t, err, ErrBadRequest)
			assert.NotErrorIs(t, err, ErrLockLost)
			assert.True(t, SafeToRetry(err))

			var field time.Duration
			if tc.engine {
				var ee *Error
				require.ErrorAs(t, err, &ee)
				assert.Equal(t, tc.status, ee.StatusCode)
				assert.Equal(t, tc.typ, ee.Type)
				field = ee.RetryAfter
			} else {
				var re *ResponseError
				require.ErrorAs(t, err, &re)
				assert.Equal(t, tc.status, re.StatusCode)
				assert.ErrorIs(t, err, ErrMalformedResponse)
				field = re.RetryAfter
			}
			d, ok := RetryAfter(fmt.Errorf("worker: %w", err))
			assert.Equal(t, field, d, "RetryAfter returns the stored field")
			if tc.want == 0 {
				assert.False(t, ok)
				assert.Zero(t, d)
				assert.NotContains(t, err.Error(), "retry after")
				return
			}
			assert.True(t, ok)
			assert.InDelta(t, tc.want, d, float64(tc.tolerate), "got %v", d)
			assert.Contains(t, err.Error(), "(retry after ")
		})
	}
}

// Retry-After is kept on any refused or unreadable answer (a proxy's 503 says it too),
// and never read from a success.
func TestRetryAfterOnOtherAnswers(t *testing.T) {
	proxy503 := newFakeEngine(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Retry-After", "12")
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "<html>maintenance</html>")
	})
	err := completeCall(t.Context(), proxy503.client(t, Config{}))
	var re *ResponseError
	require.ErrorAs(t, err, &re)
	assert.NotErrorIs(t, err, ErrThrottled)
	assert.ErrorIs(t, err, ErrUnknownOutcome)
	d, ok := RetryAfter(err)
	assert.True(t, ok)
	assert.Equal(t, 12*time.Second, d)

	success := newFakeEngine(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Retry-After", "12")
		w.WriteHeader(http.StatusNoContent)
	})
	require.NoError(t, completeCall(t.Context(), success.client(t, Config{})))

	for _, err := range []error{nil, errors.New("other"), &TransportError{Op: "op", Err: io.EOF},
		newError("op", true, 400, "RestException", "m", ptr(0))} {
		d, ok := RetryAfter(err)
		assert.False(t, ok, "%v", err)
		assert.Zero(t, d)
	}
}
