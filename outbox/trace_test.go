package outbox_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/outbox"
)

// An event added inside a span keeps that span's W3C trace context (tracestate
// included) with its row; the relay's "outbox publish" span, a producer, continues the
// trace, and the message carries the publish span's context in its traceparent and
// tracestate headers. An event added outside a trace is published without a span and
// without trace headers, even by a relay whose caller traces. No span carries the
// message id, the correlation id, the routing key or the body.
func TestPublishCarriesTheTraceTheEventWasAddedIn(t *testing.T) {
	spans := testenv.RecordSpans(t) // global: not parallel
	e := newEnv(t)
	ctx := testenv.Context(t, time.Minute)

	// The span the event is added in (a ledger's confirm, in a worker), under a remote
	// parent with a tracestate of its own.
	state, err := trace.ParseTraceState("vendor=opaque")
	require.NoError(t, err)
	remote := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0x4b, 0xf9, 0x2f, 1}, SpanID: trace.SpanID{0x00, 0xf0, 0x67, 1},
		TraceFlags: trace.FlagsSampled, TraceState: state, Remote: true})
	actx, adding := otel.Tracer("test").Start(trace.ContextWithRemoteSpanContext(ctx, remote), "ledger confirm")
	traced, untraced := e.event(testenv.Unique("INV-SECRET"), ""), e.event(testenv.Unique("INV-SECRET"), "")
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, outbox.Add(actx, tx, e.ns, traced))
	require.NoError(t, outbox.Add(ctx, tx, e.ns, untraced))
	require.NoError(t, tx.Commit(ctx))
	adding.End()

	var tp, ts *string
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT traceparent, tracestate FROM extworker_outbox WHERE namespace = $1 AND message_id = $2`,
		e.ns, traced.MessageID).Scan(&tp, &ts))
	require.NotNil(t, tp)
	assert.Equal(t, "00-"+remote.TraceID().String()+"-"+adding.SpanContext().SpanID().String()+"-01", *tp, "the adding span's context")
	require.NotNil(t, ts)
	assert.Equal(t, "vendor=opaque", *ts)
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT traceparent, tracestate FROM extworker_outbox WHERE namespace = $1 AND message_id = $2`,
		e.ns, untraced.MessageID).Scan(&tp, &ts))
	assert.Nil(t, tp, "no trace, no context")
	assert.Nil(t, ts)

	// The relay, called in a trace of its own: the untraced event must not join it.
	rctx, relaySpan := otel.Tracer("test").Start(ctx, "relay caller")
	n, err := outbox.NewRelay(e.pool, e.pub, outbox.RelayConfig{Namespace: e.ns}).PublishPending(rctx)
	relaySpan.End()
	require.NoError(t, err)
	require.Equal(t, 2, n)

	var publish tracetest.SpanStub
	for _, sp := range spans.Ended() {
		if sp.Name == "outbox publish" {
			require.Empty(t, publish.Name, "one publish span: the untraced event has none")
			publish = sp
		}
	}
	require.Equal(t, "outbox publish", publish.Name)
	assert.Equal(t, trace.SpanKindProducer, publish.SpanKind)
	assert.Equal(t, remote.TraceID(), publish.SpanContext.TraceID(), "the trace the event was added in")
	assert.Equal(t, adding.SpanContext().SpanID(), publish.Parent.SpanID(), "a child of the span it was added in")
	assert.Equal(t, "vendor=opaque", publish.SpanContext.TraceState().String())
	node := testenv.NodeOf(publish)
	assert.Equal(t, map[string]string{"messaging.system": "rabbitmq", "messaging.operation.type": "send",
		"messaging.destination.name": "amq.default", "extworker.event_type": "invoice.paid", "extworker.attempt": "1",
		"extworker.outcome": "published"}, node.Attrs)
	assert.Empty(t, node.Status)

	got := e.received(t, 2)
	require.Len(t, got, 2)
	for _, d := range got {
		switch d.MessageId {
		case traced.MessageID:
			assert.Equal(t, "00-"+remote.TraceID().String()+"-"+publish.SpanContext.SpanID().String()+"-01", d.Headers[outbox.HeaderTraceparent],
				"the publish span's context")
			assert.Equal(t, "vendor=opaque", d.Headers[outbox.HeaderTracestate])
		case untraced.MessageID:
			assert.NotContains(t, d.Headers, outbox.HeaderTraceparent, "no trace context for an event added outside a trace")
			assert.NotContains(t, d.Headers, outbox.HeaderTracestate)
		default:
			t.Errorf("unexpected message %s", d.MessageId)
		}
	}

	var nodes []testenv.SpanNode
	for _, sp := range spans.Ended() {
		nodes = append(nodes, testenv.NodeOf(sp))
	}
	assert.Empty(t, testenv.SpanLeaks(nodes, traced.MessageID, untraced.MessageID, traced.CorrelationID, e.queue, string(traced.Body)))
}

// A publish that fails is an Error on its span, described by its kind only, never the
// error's text (which names the message id); the traceparent stays with the event for
// its next attempt, whose span is attempt 2 of the same trace.
func TestFailedPublishSpan(t *testing.T) {
	spans := testenv.RecordSpans(t) // global: not parallel
	e := newEnv(t)
	ctx := testenv.Context(t, time.Minute)
	actx, adding := otel.Tracer("test").Start(ctx, "ledger confirm")
	ev := e.event(testenv.Unique("INV-SECRET"), "")
	ev.RoutingKey = testenv.Unique("no-such-queue") // unroutable: the broker returns it
	require.NoError(t, outbox.Add(actx, e.pool, e.ns, ev))
	adding.End()

	r := outbox.NewRelay(e.pool, e.pub, outbox.RelayConfig{Namespace: e.ns, BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond})
	for range 2 {
		n, err := r.PublishPending(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
		time.Sleep(5 * time.Millisecond) // past the backoff
	}
	var failed []testenv.SpanNode
	for _, sp := range spans.Ended() {
		if sp.Name == "outbox publish" && sp.SpanContext.TraceID() == adding.SpanContext().TraceID() {
			failed = append(failed, testenv.NodeOf(sp))
		}
	}
	require.Len(t, failed, 2, "a span per attempt, in the event's trace")
	for i, n := range failed {
		assert.Equal(t, adding.SpanContext().SpanID().String(), n.Parent)
		assert.Equal(t, "Error", n.Status)
		assert.Equal(t, "unroutable", n.StatusDescription)
		assert.Equal(t, "unroutable", n.Attrs["error.type"])
		assert.Equal(t, "failed", n.Attrs["extworker.outcome"])
		assert.Equal(t, []string{"1", "2"}[i], n.Attrs["extworker.attempt"])
	}
	assert.Empty(t, testenv.SpanLeaks(failed, ev.MessageID, ev.RoutingKey, ev.CorrelationID))
}
