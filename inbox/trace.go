package inbox

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the consumer's spans.
const tracerName = "github.com/extworker/extworker/inbox"

// The W3C trace context's headers (https://www.w3.org/TR/trace-context/), as the outbox's
// relay sends them: a delivery's handling continues the trace they carry.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// spanHandle is the span of one message's handling.
const spanHandle = "inbox handle"

// deliveryContext returns ctx carrying the W3C trace context of d's headers, read by the
// global propagator (none while traces are off), as a remote parent; without one, ctx
// carries no span at all, so that the handling starts a trace of its own. Only
// traceparent and tracestate are read: a message's baggage is not taken in.
func deliveryContext(ctx context.Context, d amqp.Delivery) context.Context {
	ctx = trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	c := propagation.MapCarrier{}
	for _, k := range []string{HeaderTraceparent, HeaderTracestate} {
		switch v := d.Headers[k].(type) {
		case string:
			c[k] = v
		case []byte: // a byte array ("x"), as some clients send strings
			c[k] = string(v)
		}
	}
	if c[HeaderTraceparent] == "" {
		return ctx
	}
	return otel.GetTextMapPropagator().Extract(ctx, c)
}

// startHandleSpan starts the span of m's handling ("inbox handle", a consumer), a child
// of ctx's span: under Run, the span whose trace context the delivery carried (the
// outbox's publish), else the root of a trace of its own. The engine's calls nest under
// it. Neither the message id nor the correlation id goes on it (producers make them of
// business data: the demo's are the invoice's), nor the body. typ is the message's type
// as the inbox stores it (escaped when it is not valid text).
func (c *Handler) startHandleSpan(ctx context.Context, typ string) (context.Context, trace.Span) {
	ctx, span := otel.Tracer(tracerName).Start(ctx, spanHandle, trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() {
		if c.system != "" {
			span.SetAttributes(attribute.String("messaging.system", c.system))
		}
		span.SetAttributes(
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", c.cfg.Queue),
			attribute.String("extworker.inbox.source", c.cfg.Source),
			attribute.String("extworker.event_type", typ),
		)
	}
	return ctx, span
}

// endHandleSpan records what became of the message (extworker.outcome: its Class, or
// "failed" when the inbox could not record it) and the row's state, and ends the span. A
// parked message (a conflict among them) and an inbox that could not record it are
// Errors, described by the class; a retry is not: the message comes back, and the engine
// call that failed, if one did, is an Error of its own. Reasons are not recorded: they
// quote business keys.
func endHandleSpan(span trace.Span, out Handling, err error) {
	if span.IsRecording() {
		class := out.Class
		if err != nil {
			class = ClassFailed
		}
		span.SetAttributes(attribute.String("extworker.outcome", string(class)))
		if out.State != "" {
			span.SetAttributes(attribute.String("extworker.inbox.state", string(out.State)))
		}
		if class == ClassFailed || out.Disposition == Park {
			span.SetStatus(codes.Error, string(class))
		}
	}
	span.End()
}
