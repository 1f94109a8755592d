package outbox

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the relay's spans.
const tracerName = "github.com/extworker/extworker/outbox"

// The W3C trace context's fields (https://www.w3.org/TR/trace-context/): what Add keeps
// of the span it is called in, and the AMQP headers a published event carries them in.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// spanPublish is the span of one event's publish, its confirm included.
const spanPublish = "outbox publish"

// traceContext returns the W3C trace context of ctx's span as the global propagator
// writes it, for Add to store with the event: nil without a span, or without a propagator
// that writes traceparent (traces off: nothing installed). Only traceparent and
// tracestate are kept: baggage, which a propagator may add, can carry anything and is
// neither stored nor sent.
func traceContext(ctx context.Context) (traceparent, tracestate *string) {
	c := w3c(ctx)
	if c[HeaderTraceparent] == "" {
		return nil, nil
	}
	return nz(c[HeaderTraceparent]), nz(c[HeaderTracestate])
}

// injectTraceContext writes the W3C trace context of ctx's span, as the global
// propagator writes it, into headers: what a Publisher sends along (AMQPPublisher does).
// It writes nothing when ctx has no span or traces are off.
func injectTraceContext(ctx context.Context, headers map[string]any) {
	for k, v := range w3c(ctx) {
		headers[k] = v
	}
}

// w3c is the traceparent and tracestate of ctx's span, as the global propagator writes
// them, and nothing else (no baggage); nil without a span (nothing allocated for an
// event or a publish that is not traced), empty with traces off.
func w3c(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	out := map[string]string{}
	c := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, c)
	for _, k := range []string{HeaderTraceparent, HeaderTracestate} {
		if v := c[k]; v != "" {
			out[k] = v
		}
	}
	return out
}

// messagingSystem is what a Publisher of this package says it publishes to (the
// messaging.system attribute); the relay cannot tell for another.
type messagingSystem interface {
	messagingSystem() string
}

// startPublishSpan starts the span of p's publish ("outbox publish", a producer), a
// child of the span p was added in, whose trace context its row keeps; the returned ctx
// carries it, for the publisher to send along. An event added outside a trace (or
// before the outbox kept trace contexts) has no span, and its ctx carries none, not even
// one of the relay's caller: it is published without a trace context.
func (r *Relay) startPublishSpan(ctx context.Context, p pending) (context.Context, trace.Span) {
	ctx = trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	if p.traceparent == "" {
		return ctx, trace.SpanFromContext(ctx)
	}
	c := propagation.MapCarrier{HeaderTraceparent: p.traceparent}
	if p.tracestate != "" {
		c[HeaderTracestate] = p.tracestate
	}
	ctx = otel.GetTextMapPropagator().Extract(ctx, c)
	if !trace.SpanContextFromContext(ctx).IsValid() {
		// Traces are off in this process (no propagator reads traceparent), or the stored
		// one is malformed: no trace to continue.
		return ctx, trace.SpanFromContext(ctx)
	}
	ctx, span := otel.Tracer(tracerName).Start(ctx, spanPublish, trace.WithSpanKind(trace.SpanKindProducer))
	if span.IsRecording() {
		// The routing key and the message id may be made of business data (the demo's
		// message ids are the invoices'), and the correlation id and the body are: none
		// of them goes on the span.
		dest := p.e.Exchange
		if s, ok := r.pub.(messagingSystem); ok && s.messagingSystem() == "kafka" {
			dest = p.e.RoutingKey // the topic
		} else if dest == "" {
			dest = "amq.default" // the default exchange, as the semantic conventions name it
		}
		span.SetAttributes(
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", dest),
			attribute.String("extworker.event_type", p.e.Type),
			attribute.Int("extworker.attempt", p.attempts+1),
		)
		if s, ok := r.pub.(messagingSystem); ok {
			span.SetAttributes(attribute.String("messaging.system", s.messagingSystem()))
		}
	}
	return ctx, span
}

// endPublishSpan records the publish's outcome and ends its span: "published", or an
// Error described by its kind only (error.type: "unroutable", "timeout",
// "publish-failed"), never the error's text, which names the message id.
func endPublishSpan(span trace.Span, err error) {
	if span.IsRecording() {
		if err == nil {
			span.SetAttributes(attribute.String("extworker.outcome", "published"))
		} else {
			kind := "publish-failed"
			switch {
			case errors.Is(err, ErrUnroutable):
				kind = "unroutable"
			case errors.Is(err, context.DeadlineExceeded):
				kind = "timeout"
			}
			span.SetAttributes(attribute.String("extworker.outcome", "failed"), attribute.String("error.type", kind))
			span.SetStatus(codes.Error, kind)
		}
	}
	span.End()
}
