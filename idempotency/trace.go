package idempotency

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/extworker/extworker/failure"
)

// tracerName is the instrumentation scope of the ledger's spans.
const tracerName = "github.com/extworker/extworker/idempotency"

// Span names of the ledger's steps, children of the span in Do's ctx (a task's handler
// span, under package tasks).
const (
	spanClaim          = "ledger claim"
	spanMarkDispatched = "ledger mark dispatched"
	spanProviderCall   = "provider call"
	spanProviderLookup = "provider lookup"
	spanConfirm        = "ledger confirm"
	spanReject         = "ledger reject"
	spanUnknown        = "ledger unknown"
	spanNotSent        = "ledger not sent"
	spanReconcile      = "ledger reconcile"
	spanHold           = "ledger hold"
)

// startStep starts the span of one of the attempt's steps.
func (a *attempt) startStep(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return otel.Tracer(tracerName).Start(ctx, name, opts...)
}

// endStep records what the step reached (the intent's scope, the state it is in, the
// attempt) and, when err is a failure, the Error status described by its kind only; then
// it ends the span. Neither the intent's key, nor its request, nor an error's text (which
// names the key) goes on a span.
func (a *attempt) endStep(span trace.Span, err error) {
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("idempotency.scope", a.in.Scope),
			attribute.String("idempotency.state", string(a.row.State)),
			attribute.Int("idempotency.attempt", a.row.Attempt),
		)
		if kind, failed := failureKind(err); failed {
			span.SetStatus(codes.Error, kind)
		} else if kind != "" {
			span.SetAttributes(attribute.String("idempotency.result", kind))
		}
	}
	span.End()
}

// failureKind names err's failure kind (failure.Classify), and whether it is a failure
// for a span's status: a deferral (another attempt owns the intent) and a BPMN error (a
// decline) are not.
func failureKind(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	o := failure.Classify(err)
	switch {
	case o.KeepRetries:
		return "deferred", false
	case o.Kind == failure.KindBPMNError:
		return o.Kind.String(), false
	}
	return o.Kind.String(), true
}

// setAttr sets a string attribute on ctx's span when it records.
func setAttr(ctx context.Context, key, value string) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attribute.String(key, value))
	}
}

// endProviderCall records how the provider answered a dispatch (idempotency.dispatch:
// answered, declined, refused, not-sent, unknown), as dispatch goes on to classify it,
// and ends the span. A refused, unsent or unknown dispatch is an Error, described by
// that word.
func (a *attempt) endProviderCall(span trace.Span, derr error) {
	if span.IsRecording() {
		verdict, _, _ := classifyDispatch(derr)
		result := dispatchResults[verdict]
		span.SetAttributes(
			attribute.String("idempotency.scope", a.in.Scope),
			attribute.Int("idempotency.attempt", a.row.Attempt),
			attribute.String("idempotency.dispatch", result),
		)
		if result != "answered" && result != "declined" {
			span.SetStatus(codes.Error, result)
		}
	}
	span.End()
}

// endLookup records a reconciliation's lookup (by key, or the business search) and its
// answer, and ends the span; a lookup that failed is an Error.
func (a *attempt) endLookup(span trace.Span, bySearch bool, rec Reconciliation, err error) {
	if span.IsRecording() {
		how := "reconcile"
		if bySearch {
			how = "search"
		}
		span.SetAttributes(
			attribute.String("idempotency.scope", a.in.Scope),
			attribute.Int("idempotency.attempt", a.row.Attempt),
			attribute.String("idempotency.lookup", how),
		)
		if err != nil {
			span.SetStatus(codes.Error, "lookup-failed")
		} else {
			span.SetAttributes(attribute.String("idempotency.reconciliation", reconResults[rec.kind]))
		}
	}
	span.End()
}
