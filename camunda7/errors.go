package camunda7

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/extworker/extworker/internal/transport"
)

// Sentinel errors, matched with errors.Is against what a Client method returns.
//
// The first group classifies answers the engine gave (an *Error); the second group
// classifies requests that got no usable answer (a *TransportError or *ResponseError).
// The line between ErrNotSent and ErrUnknownOutcome is the one the rest of extworker
// relies on: a request that certainly did not leave may be retried blindly, a request
// that left with no answer may have taken effect and must be resolved, not repeated.
var (
	// ErrNotFound matches a 404 answer (an *Error). On an external-task endpoint only the
	// engine's own answer that the task does not exist is one (then ErrTaskGone matches
	// too); any other 404 there is a *ResponseError matching ErrNotSent.
	ErrNotFound = errors.New("camunda7: not found")
	// ErrTaskGone matches the engine's own answer, on an external-task endpoint, that the
	// task does not exist: the task was completed (by anyone), cancelled by a boundary
	// event, or its process instance was deleted. Only the engine's JSON error body with
	// its message naming the task counts (taskGoneAnswer lists them; the conformance
	// suite pins them): a 404 from anything else in front of the engine (a proxy's or a
	// servlet container's HTML page while the engine is redeployed, an empty body, JSON of
	// another shape) says nothing about the task, and matches ErrNotSent instead.
	ErrTaskGone = errors.New("camunda7: external task does not exist")
	// ErrLockLost matches a 400 from complete, failure, bpmnError, extendLock or lock that
	// says the task is locked by another worker (or by nobody, after an unlock), or that
	// the lock being extended has already expired (then ErrLockExpired matches too).
	ErrLockLost = errors.New("camunda7: lock lost or held by another worker")
	// ErrLockExpired matches extendLock's 400 "Cannot extend a lock that expired": the
	// lock ran out, and nobody else has fetched or locked the task since (that would be
	// "It is locked by worker '...'", which matches ErrLockLost only). Until someone
	// does, the worker can take the task back with Lock (as any worker could) or report
	// its result: complete, failure and bpmnError still succeed. It also matches
	// ErrLockLost, as it did before it had a name of its own.
	ErrLockExpired = errors.New("camunda7: lock expired, not taken by another worker")
	// ErrSuspended matches a 400 for a task whose process instance is suspended.
	ErrSuspended = errors.New("camunda7: external task is suspended")
	// ErrOptimisticLock matches the engine's OptimisticLockingException (a concurrent
	// modification, such as two completes racing). Nothing was committed.
	ErrOptimisticLock = errors.New("camunda7: concurrent modification")
	// ErrFormRefused matches the engine's refusal of a user task form's values on
	// submit-form: a 500 of code 0, "Cannot submit task form <id>: …", for a form field's
	// failed validation, a value not among an enum field's values, or a date not in its
	// field's format. The task was not completed. FormRefusal gives the reason without the
	// value (the engine's enum and date messages quote it).
	ErrFormRefused = errors.New("camunda7: form values refused")
	// ErrUnauthorized matches 401 and 403 answers.
	ErrUnauthorized = errors.New("camunda7: unauthorized")
	// ErrBadRequest matches every 400 answer, including those classified more precisely
	// (ErrLockLost, ErrLockExpired, ErrSuspended).
	ErrBadRequest = errors.New("camunda7: bad request")
	// ErrThrottled matches a 429 Too Many Requests or a 413 Payload Too Large, with or
	// without an engine body (an *Error or a *ResponseError), as a proxy or gateway in
	// front of the engine answers when it rations requests. The request was refused, not acted on; wait
	// RetryAfter(err) when it says how long. A 413 is temporary only when it carries a
	// Retry-After; without one, the same body will most likely be refused again.
	ErrThrottled = errors.New("camunda7: throttled")

	// ErrNotSent matches a request that certainly never reached the engine: the connection
	// could not be made, the request could not be written in full, or the context ended
	// first; or it reached no part of the engine that could act on it: a 404 on an
	// external-task endpoint that is not the engine's answer about the task (a
	// *ResponseError; see ErrTaskGone). Retrying it cannot cause a second effect.
	ErrNotSent = errors.New("camunda7: request not sent")
	// ErrUnknownOutcome matches a request that was sent but whose answer was lost or
	// unreadable (timeout, reset, a proxy's error page, a truncated body). The engine may
	// or may not have acted on it.
	ErrUnknownOutcome = errors.New("camunda7: request sent, unknown outcome")
	// ErrMalformedResponse matches an answer that could not be read: not JSON where JSON
	// was due, truncated, or larger than Config.MaxResponseBytes.
	ErrMalformedResponse = errors.New("camunda7: malformed response")
	// ErrResponseTooLarge matches an answer larger than Config.MaxResponseBytes (it also
	// matches ErrMalformedResponse). For fetchAndLock it means the engine locked tasks
	// whose answer the client would not read: fetch fewer, or fewer variables.
	ErrResponseTooLarge = errors.New("camunda7: response larger than MaxResponseBytes")
	// ErrInvalidArgument matches a request rejected by the client before sending.
	ErrInvalidArgument = errors.New("camunda7: invalid argument")
)

// Error is an answer from the engine carrying its error body
// ({"type": ..., "message": ..., "code": ...}), or a 4xx status without one.
// The engine answered, so the outcome is known: the request had no effect.
type Error struct {
	// Op names the operation and its identifiers, e.g. "complete external task 42".
	Op string
	// StatusCode is the HTTP status.
	StatusCode int
	// Type is the engine's exception class name, such as "RestException"; empty when the
	// body was not an engine error body.
	Type string
	// Message is the engine's message, verbatim.
	Message string
	// Code is the engine's error code: 0 for ordinary errors, 1 for optimistic locking,
	// 10000+ for database errors; nil when the engine sent null or no body.
	Code *int
	// RetryAfter is the delay the answer's Retry-After header asked for (see RetryAfter);
	// zero without one.
	RetryAfter time.Duration

	kind error // the sentinel this answer is classified as; see classify
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Op)
	fmt.Fprintf(&b, ": engine answered %d", e.StatusCode)
	if e.Type != "" {
		b.WriteString(" ")
		b.WriteString(e.Type)
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, " (retry after %v)", e.RetryAfter)
	}
	return b.String()
}

// Is reports whether the answer is classified as target (one of the sentinels above).
func (e *Error) Is(target error) bool {
	if target == e.kind {
		return true
	}
	switch target {
	case ErrNotFound:
		return e.StatusCode == http.StatusNotFound
	case ErrBadRequest:
		return e.StatusCode == http.StatusBadRequest
	case ErrLockLost:
		return e.kind == ErrLockExpired
	}
	return false
}

// newError builds an *Error and classifies it once.
func newError(op string, taskEndpoint bool, status int, typ, msg string, code *int) *Error {
	e := &Error{Op: op, StatusCode: status, Type: typ, Message: msg, Code: code}
	e.kind = classify(taskEndpoint, status, typ, msg, code)
	return e
}

// classify maps an engine answer to a sentinel. It is the one place that reads message
// text: the engine wraps nearly every external-task failure as a RestException with
// code 0, so the status alone cannot tell "locked by another worker" from "suspended".
// Each message matched here is pinned by a conformance test against the real engine.
func classify(taskEndpoint bool, status int, typ, msg string, code *int) error {
	switch {
	case isThrottled(status):
		return ErrThrottled
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return ErrUnauthorized
	case taskEndpoint && taskGoneAnswer(status, typ, msg):
		return ErrTaskGone
	case status == http.StatusNotFound:
		return ErrNotFound
	case typ == "OptimisticLockingException" || (code != nil && *code == 1):
		return ErrOptimisticLock
	case status == http.StatusInternalServerError && typ != "" && code != nil && *code == 0 && formRefusalReason(msg) != "":
		// submit-form of a user task with values its form refuses.
		return ErrFormRefused
	case status == http.StatusBadRequest && taskEndpoint && strings.Contains(msg, "It is locked by worker '"):
		// complete, failure, bpmnError, extendLock and lock by a worker that does not hold the lock.
		return ErrLockLost
	case status == http.StatusBadRequest && taskEndpoint && strings.HasPrefix(msg, "Cannot extend a lock that expired"):
		// extendLock by the lock's own worker after it ran out, before anyone else took it.
		return ErrLockExpired
	case status == http.StatusBadRequest && strings.Contains(msg, "is suspended"):
		return ErrSuspended
	case status == http.StatusBadRequest:
		return ErrBadRequest
	}
	return nil
}

// goneAnswers are the engine's answers that an external task does not exist: the status,
// the exception types it comes under, and how the message, which names the task, begins
// and ends. The conformance suite pins them (TestConformanceUnknownTaskAnswers,
// TestConformanceTaskGone).
var goneAnswers = []struct {
	status         int
	types          []string
	prefix, suffix string
}{
	// complete, failure, bpmnError, extendLock, lock, unlock, get, retries, priority.
	{http.StatusNotFound, []string{"RestException", "InvalidRequestException", "NotFoundException"}, "External task with id ", " does not exist"},
	// The engine's own NotFoundException, as some releases and forks pass it on.
	{http.StatusNotFound, []string{"RestException", "InvalidRequestException", "NotFoundException"}, "Cannot find external task with id ", ""},
	// errorDetails: a 500, the engine's quirk (docs/engine-facts.md).
	{http.StatusInternalServerError, []string{"NullValueException"}, "No external task found with id ", ": externalTask is null"},
}

// taskGoneAnswer reports whether an engine error body (status, exception type, message)
// on an external-task endpoint is the engine's answer that the task does not exist. It
// is the one place that decides "task gone": nothing but these answers ends a lock or
// drops a result.
func taskGoneAnswer(status int, typ, msg string) bool {
	for _, g := range goneAnswers {
		if status == g.status && slices.Contains(g.types, typ) && len(msg) > len(g.prefix)+len(g.suffix) &&
			strings.HasPrefix(msg, g.prefix) && strings.HasSuffix(msg, g.suffix) {
			return true
		}
	}
	return false
}

// errForeign404 is the cause of a *ResponseError for a 404 on an external-task endpoint
// that is not the engine's answer about the task.
var errForeign404 = errors.New("a 404 that is not the engine's answer about the task (a proxy's or servlet container's page, " +
	"as while the engine is redeployed): nothing was done, send it again")

// foreign404 reports whether an answer on an endpoint is a 404 that is not the engine's
// own answer that the task does not exist: taskEndpoint, status 404, and engine false
// (the body is not the engine's JSON error) or typ and msg not one of goneAnswers. Such
// an answer says nothing about the task, so it is a refusal to send again (ErrNotSent),
// never ErrTaskGone.
func foreign404(taskEndpoint bool, status int, engine bool, typ, msg string) bool {
	return taskEndpoint && status == http.StatusNotFound && !(engine && taskGoneAnswer(status, typ, msg))
}

// TransportError is a request that got no HTTP answer. Sent tells whether the request
// was written to the connection in full before the failure: if it was not, the engine
// cannot have acted on it (errors.Is(err, ErrNotSent)); if it was, the outcome is unknown
// (errors.Is(err, ErrUnknownOutcome)). The tracking is internal/transport's, the same
// that package idempotency/httpeffect uses for a provider's requests.
type TransportError struct {
	Op   string
	Sent bool
	Err  error
}

func (e *TransportError) Error() string { return transport.Describe(e.Op, e.Sent, e.Err) }

func (e *TransportError) Unwrap() error { return e.Err }

// Is matches ErrNotSent or ErrUnknownOutcome according to Sent.
func (e *TransportError) Is(target error) bool {
	return (target == ErrNotSent && !e.Sent) || (target == ErrUnknownOutcome && e.Sent)
}

// ResponseError is an HTTP answer that could not be read as the engine's: a proxy's HTML
// error page, a truncated or oversized body, malformed JSON. The request was sent, so
// unless the status proves the engine refused it (a 4xx), the outcome is unknown.
type ResponseError struct {
	Op          string
	StatusCode  int
	ContentType string
	// Snippet is the start of the body, cut short and stripped of control characters, to
	// help tell a proxy page from a broken engine answer.
	Snippet string
	Err     error
	// RetryAfter is the delay the answer's Retry-After header asked for (see RetryAfter);
	// zero without one.
	RetryAfter time.Duration
}

func (e *ResponseError) Error() string {
	s := fmt.Sprintf("%s: unreadable answer (status %d, content-type %q): %v", e.Op, e.StatusCode, e.ContentType, e.Err)
	if e.Snippet != "" {
		s += fmt.Sprintf("; body starts %q", e.Snippet)
	}
	if e.RetryAfter > 0 {
		s += fmt.Sprintf(" (retry after %v)", e.RetryAfter)
	}
	return s
}

func (e *ResponseError) Unwrap() error { return e.Err }

// Is matches ErrMalformedResponse always, ErrUnknownOutcome unless the status was a
// 4xx (which no engine or proxy sends after acting on a request), ErrThrottled for
// a 429 or 413, and ErrNotSent for a 404 on an external-task endpoint that was not the
// engine's answer about the task.
func (e *ResponseError) Is(target error) bool {
	switch target {
	case ErrMalformedResponse:
		return true
	case ErrNotSent:
		return e.Err == errForeign404
	case ErrUnknownOutcome:
		return e.StatusCode < 400 || e.StatusCode >= 500
	case ErrThrottled:
		return isThrottled(e.StatusCode)
	}
	return false
}

// isThrottled reports whether status is one a proxy uses to push back: 429 or 413.
func isThrottled(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusRequestEntityTooLarge
}

// MaxRetryAfter caps the delay RetryAfter returns: a longer Retry-After (or a date
// further ahead) is cut to it, so a misconfigured proxy cannot park a worker for hours.
const MaxRetryAfter = 5 * time.Minute

// RetryAfter returns the delay the Retry-After header of the answer in err asked for,
// when err is (or wraps) an *Error or *ResponseError whose answer had one. The header
// may hold delay-seconds ("120") or an HTTP-date, counted from the local clock when the
// answer arrived; the delay is capped at MaxRetryAfter. ok is false without the header,
// with one that cannot be parsed, or with one that asks for no wait (0, a date already
// past). Any error status may carry it: a 429 or 413 (ErrThrottled), and a proxy's 503.
func RetryAfter(err error) (d time.Duration, ok bool) {
	var ee *Error
	var re *ResponseError
	switch {
	case errors.As(err, &ee):
		d = ee.RetryAfter
	case errors.As(err, &re):
		d = re.RetryAfter
	}
	return d, d > 0
}

// parseRetryAfter reads a Retry-After header value (RFC 9110 §10.2.3) received at now:
// delay-seconds or an HTTP-date. It returns 0 for an empty, invalid or past value, and
// at most MaxRetryAfter.
func parseRetryAfter(v string, now time.Time) time.Duration {
	return transport.ParseRetryAfter(v, now, MaxRetryAfter)
}

// SafeToRetry reports whether err proves that the request had no effect on the engine:
// it was never sent, or the engine answered with an error (which rolls its transaction
// back). Like pgconn.SafeToRetry, it is false for every outcome that might have taken
// effect. Whether a retry is useful (a 400 will fail again) is for the caller to judge.
func SafeToRetry(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrUnknownOutcome) {
		return false
	}
	var ee *Error
	var re *ResponseError
	if errors.As(err, &re) && re.StatusCode >= 400 && re.StatusCode < 500 {
		return true // a 4xx, however unreadable, is a refusal
	}
	return errors.Is(err, ErrNotSent) || errors.As(err, &ee)
}

// formFieldRefusal is the whole of the engine's message for a form field's failed
// validation after its "Cannot submit task form <id>: " (the field and the constraint
// come from the BPMN, never from the value); anchored, so that a value quoted in another
// refusal cannot pass for one.
var formFieldRefusal = regexp.MustCompile(`^Invalid value submitted for form field '([^']{1,255})': validation of ([a-z]{1,32}(\([^)]{0,64}\))?) failed\.?$`)

// formRefusalReason is the reason of the engine's refusal of a form's values (msg: its
// message, "Cannot submit task form <id>: …"), which never quotes the value; "" when msg
// is no such refusal. The conformance suite pins the messages (TestConformanceFormRefusals).
func formRefusalReason(msg string) string {
	rest, ok := strings.CutPrefix(msg, "Cannot submit task form ")
	if !ok {
		return ""
	}
	if _, rest, ok = strings.Cut(rest, ": "); !ok { // the task's id, generated by the engine
		return ""
	}
	switch m := formFieldRefusal.FindStringSubmatch(rest); {
	case m != nil:
		return fmt.Sprintf("form field %q: validation of %s failed", m[1], m[2])
	case strings.HasPrefix(rest, "Invalid value for enum form property: "):
		return "a value is not one of its enum field's values"
	case strings.HasPrefix(rest, "Could not parse value '") && strings.Contains(rest, "' as date using date format '"):
		return "a date is not in its field's format (dd/MM/yyyy unless the engine is configured otherwise)"
	}
	return ""
}

// FormRefusal reports whether err is the engine's refusal of a user task form's values
// (ErrFormRefused), and its reason: the field and the validation, an enum's values or a
// date's format, never the value refused.
func FormRefusal(err error) (reason string, ok bool) {
	var e *Error
	if !errors.As(err, &e) || !errors.Is(e, ErrFormRefused) {
		return "", false
	}
	return formRefusalReason(e.Message), true
}
