package tasks

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
)

// tracerName is the instrumentation scope of the worker's spans.
const tracerName = "github.com/extworker/extworker/tasks"

// startTaskSpan starts a task's span, the root of its trace (package doc, Traces).
func (w *Worker) startTaskSpan(ctx context.Context, raw *camunda7.LockedExternalTask, attempt int) (context.Context, trace.Span) {
	ctx, span := otel.Tracer(tracerName).Start(ctx, "task "+raw.TopicName, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithNewRoot())
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("camunda.topic", raw.TopicName),
			attribute.String("camunda.process_definition_key", raw.ProcessDefinitionKey),
			attribute.String("camunda.activity_id", raw.ActivityID),
			attribute.String("camunda.process_instance_id", raw.ProcessInstanceID),
			attribute.String("camunda.external_task_id", raw.ID),
			attribute.String("extworker.worker_id", w.cfg.WorkerID),
			attribute.Int("extworker.attempt", attempt),
		)
	}
	return ctx, span
}

// endOutcomeSpan records the task's outcome and, for a failure (Outcome.Failed), the
// Error status with class (the failure's kind) or else the outcome as its description;
// then it ends the span.
func endOutcomeSpan(span trace.Span, outcome Outcome, class string) {
	if span.IsRecording() {
		span.SetAttributes(attribute.String("extworker.outcome", outcome.String()))
		if outcome.Failed() {
			desc := class
			if desc == "" {
				desc = outcome.String()
			}
			span.SetStatus(codes.Error, desc)
		}
	}
	span.End()
}

// startHandlerSpan starts the span of the handler's call, which its ctx carries.
func startHandlerSpan(ctx context.Context) (context.Context, trace.Span) {
	return otel.Tracer(tracerName).Start(ctx, "handler")
}

// endHandlerSpan records the handler's result (its failure's kind) and ends its span.
func endHandlerSpan(span trace.Span, err error) {
	if span.IsRecording() && err != nil {
		o := failure.Classify(err)
		kind := o.Kind.String()
		if o.KeepRetries {
			kind = "deferred"
		}
		span.SetAttributes(attribute.String("extworker.failure_kind", kind))
		if o.Kind != failure.KindBPMNError && !o.KeepRetries {
			span.SetStatus(codes.Error, kind)
		}
	}
	span.End()
}

// startReportSpan starts the span of a task's report.
func startReportSpan(ctx context.Context) (context.Context, trace.Span) {
	return otel.Tracer(tracerName).Start(ctx, "report")
}

// endReportSpan records the report's outcome and ends its span: an Error only if the
// report did not get through (report-failed, lock-lost); a failure reported is a
// report delivered.
func endReportSpan(span trace.Span, outcome Outcome) {
	if span.IsRecording() {
		span.SetAttributes(attribute.String("extworker.outcome", outcome.String()))
		if outcome == OutcomeReportFailed || outcome == OutcomeLockLost {
			span.SetStatus(codes.Error, outcome.String())
		}
	}
	span.End()
}
