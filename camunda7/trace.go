package camunda7

import (
	"context"
	"errors"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the client's spans.
const tracerName = "github.com/extworker/extworker/camunda7"

// startSpan starts the span of one engine call, a child of ctx's span, named
// "camunda7 " + the operation (spanName). With no TracerProvider installed it is a
// no-op span.
func (c *Client) startSpan(ctx context.Context, k call) (context.Context, trace.Span) {
	ctx, span := otel.Tracer(tracerName).Start(ctx, spanName(k.method, k.path), trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(attribute.String("http.request.method", k.method), attribute.String("server.address", c.host))
	}
	return ctx, span
}

// endSpan records the call's answer and outcome on its span and ends it. Nothing of the
// request's or the answer's content goes on the span, and of an error only its kind
// (errorKind), never its message, which may quote the engine (and the engine, a
// variable's value).
func endSpan(span trace.Span, status, resends int, err error) {
	if span.IsRecording() {
		if status > 0 {
			span.SetAttributes(attribute.Int("http.response.status_code", status))
		}
		if resends > 0 {
			span.SetAttributes(attribute.Int("http.request.resend_count", resends))
		}
		span.SetAttributes(attribute.String("camunda7.outcome", outcome(err)))
		if err != nil {
			kind := errorKind(err)
			span.SetAttributes(attribute.String("error.type", kind))
			span.SetStatus(codes.Error, kind)
		}
	}
	span.End()
}

// outcome classifies a call's error for its span (attribute camunda7.outcome): "ok"
// (nil), "not-sent" (it certainly never reached the engine: ErrNotSent), "unknown" (it
// left and its answer was lost or unreadable: ErrUnknownOutcome), "engine-error" (an
// answer that refused it: nothing happened).
func outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrNotSent):
		return "not-sent"
	case errors.Is(err, ErrUnknownOutcome):
		return "unknown"
	}
	return "engine-error"
}

// errorKinds name the sentinels, most specific first.
var errorKinds = []struct {
	err  error
	name string
}{
	{ErrInvalidArgument, "invalid-argument"},
	{ErrNotSent, "not-sent"},
	{ErrResponseTooLarge, "response-too-large"},
	{ErrThrottled, "throttled"},
	{ErrUnknownOutcome, "unknown-outcome"},
	{ErrMalformedResponse, "malformed-response"},
	{ErrLockExpired, "lock-expired"},
	{ErrLockLost, "lock-lost"},
	{ErrTaskGone, "task-gone"},
	{ErrNotFound, "not-found"},
	{ErrSuspended, "suspended"},
	{ErrOptimisticLock, "optimistic-lock"},
	{ErrFormRefused, "form-refused"},
	{ErrUnauthorized, "unauthorized"},
	{ErrBadRequest, "bad-request"},
}

// errorKind names the kind of a call's error in a word, for its span (attribute
// error.type, and the status description):
// "lock-lost", "task-gone", "not-sent", "unknown-outcome", "throttled", ...; "engine-error"
// for another engine answer (a 500, say); "" for nil. It never contains the error's text.
func errorKind(err error) string {
	if err == nil {
		return ""
	}
	for _, k := range errorKinds {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return "engine-error"
}

// externalTaskActions are the sub-resources of /external-task/{id} (and fetchAndLock)
// that name an engine call by themselves.
var externalTaskActions = map[string]bool{
	"fetchAndLock": true, "complete": true, "failure": true, "bpmnError": true, "extendLock": true,
	"lock": true, "unlock": true, "retries": true, "priority": true, "errorDetails": true,
}

// pathWords are the path segments of the engine's REST API that are never an id or a
// name: any other segment is shown as {id}.
var pathWords = map[string]bool{
	"external-task": true, "fetchAndLock": true, "complete": true, "failure": true, "bpmnError": true, "extendLock": true,
	"lock": true, "unlock": true, "retries": true, "retries-sync": true, "priority": true, "errorDetails": true, "count": true,
	"topic-names": true, "process-instance": true, "process-definition": true, "key": true, "tenant-id": true, "start": true,
	"submit-form": true, "deployment": true, "create": true, "resources": true, "redeploy": true, "history": true,
	"external-task-log": true, "activity-instance": true, "variable-instance": true, "incident": true, "message": true,
	"signal": true, "version": true, "variables": true, "localVariables": true, "data": true, "execution": true,
	"task": true, "job": true, "job-definition": true, "suspended": true, "modification": true, "delete": true,
	"xml": true, "statistics": true, "identity": true, "user": true, "group": true, "authorization": true,
	"engine": true, "batch": true, "decision-definition": true, "evaluate": true, "correlate": true,
}

// spanName is the span name of an engine call: "camunda7 " and its operation, stable and
// of low cardinality (never an id): the action of an external-task call ("camunda7
// complete", "camunda7 fetchAndLock", "camunda7 extendLock"), otherwise the method and
// the path with every segment that is not one of the REST API's words shown as {id}
// ("camunda7 GET /external-task/{id}", "camunda7 POST /process-definition/key/{id}/start").
func spanName(method, path string) string {
	path, _, _ = strings.Cut(path, "?")
	segs := strings.Split(strings.Trim(path, "/"), "/")
	if last := segs[len(segs)-1]; len(segs) >= 2 && segs[0] == "external-task" && externalTaskActions[last] {
		return "camunda7 " + last
	}
	var b strings.Builder
	b.WriteString("camunda7 ")
	b.WriteString(method)
	b.WriteString(" ")
	for _, s := range segs {
		b.WriteByte('/')
		if pathWords[s] {
			b.WriteString(s)
		} else if s != "" {
			b.WriteString("{id}")
		}
	}
	return b.String()
}
