package inbox_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/outbox"
)

// Each message handled is an "inbox handle" span, a consumer, through the real broker:
// a message published in a trace (by outbox.AMQPPublisher, with traceparent and
// tracestate headers, as the relay publishes) is handled in that trace, a child of the
// publishing span, with the engine's calls under it; its redelivery is a second span
// there, a duplicate without engine calls; an early message's retries come back with
// the headers and stay in its trace; a message without trace context is the root of a
// trace of its own. A parked conflict is an Error. No span carries the message id, the
// correlation id, the business key or the body.
func TestHandleSpansContinueTheMessagesTrace(t *testing.T) {
	spans := testenv.RecordSpans(t) // global: not parallel
	e := newEnv(t)
	b := newBroker(t)
	c := e.consumer(t, inbox.Config{Queue: b.queue, BackoffInitial: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	run(t, c)
	ctx := testenv.Context(t, time.Minute)
	pub := outbox.NewAMQPPublisher(testenv.AMQPURL())
	t.Cleanup(func() { _ = pub.Close() })
	event := func(id string, p payload) outbox.Event {
		body, _ := json.Marshal(p)
		return outbox.Event{MessageID: id, Type: "test." + p.Do, RoutingKey: b.queue, CorrelationID: "corr-" + id, Body: body}
	}
	secret := func() string { return testenv.Unique("SECRET") }
	tracedID, rootID, earlyID, conflictID := secret(), secret(), secret(), secret()
	tracedBK, rootBK, earlyBK, conflictBK := secret(), secret(), secret(), secret()

	// Published in a trace, twice (a redelivery).
	pctx, producer := otel.Tracer("test").Start(ctx, "outbox publish")
	require.NoError(t, pub.Publish(pctx, event(tracedID, payload{Do: "start", BusinessKey: tracedBK})))
	require.NoError(t, pub.Publish(pctx, event(tracedID, payload{Do: "start", BusinessKey: tracedBK})))
	producer.End()
	// Published without trace context.
	b.publish(t, msg(rootID, payload{Do: "start", BusinessKey: rootBK}))
	// Early: retried until its instance waits.
	ectx, earlyProducer := otel.Tracer("test").Start(ctx, "early publish")
	require.NoError(t, pub.Publish(ectx, event(earlyID, payload{Do: "correlate", BusinessKey: earlyBK})))
	earlyProducer.End()
	e.waitState(t, earlyID, inbox.StateFailedRetryable)
	e.startWaiting(t, earlyBK)

	handles := func(match func(tracetest.SpanStub) bool) []testenv.SpanNode {
		var out []testenv.SpanNode
		for _, sp := range spans.Ended() {
			if sp.Name == "inbox handle" && match(sp) {
				out = append(out, testenv.NodeOf(sp))
			}
		}
		return out
	}
	inTrace := func(sc trace.SpanContext) func(tracetest.SpanStub) bool {
		return func(sp tracetest.SpanStub) bool { return sp.SpanContext.TraceID() == sc.TraceID() }
	}
	outcomes := func(nodes []testenv.SpanNode) []string {
		var out []string
		for _, n := range nodes {
			out = append(out, n.Attrs["extworker.outcome"])
		}
		slices.Sort(out)
		return out
	}
	testenv.Eventually(t, 30*time.Second, "the messages' spans", func() (bool, error) {
		return slices.Equal(outcomes(handles(inTrace(producer.SpanContext()))), []string{"duplicate", "started"}) &&
			slices.Contains(outcomes(handles(inTrace(earlyProducer.SpanContext()))), "correlated") &&
			len(handles(func(sp tracetest.SpanStub) bool { return !sp.Parent.IsValid() })) >= 1, nil
	})
	all := spans.Ended()
	nodesOf := func(sc trace.SpanContext) []testenv.SpanNode {
		var out []testenv.SpanNode
		for _, sp := range all {
			if sp.SpanContext.TraceID() == sc.TraceID() {
				out = append(out, testenv.NodeOf(sp))
			}
		}
		return out
	}

	// The traced message: started in the publisher's trace, the engine's calls under it;
	// its redelivery a duplicate there too.
	traced := nodesOf(producer.SpanContext())
	t.Logf("the traced message's trace:\n%s", testenv.SpanTree(traced))
	var started testenv.SpanNode
	for _, n := range testenv.Children(traced, producer.SpanContext().SpanID().String()) {
		require.Equal(t, "inbox handle", n.Name)
		switch n.Attrs["extworker.outcome"] {
		case "started":
			started = n
		case "duplicate":
			assert.Empty(t, testenv.Children(traced, n.ID), "a duplicate asks the engine nothing")
			assert.Equal(t, "processed", n.Attrs["extworker.inbox.state"])
		}
	}
	require.NotEmpty(t, started.ID, "the handling is a child of the publishing span")
	assert.Equal(t, map[string]string{"messaging.system": "rabbitmq", "messaging.operation.type": "process",
		"messaging.destination.name": b.queue, "extworker.inbox.source": e.source, "extworker.event_type": "test.start",
		"extworker.outcome": "started", "extworker.inbox.state": "processed"}, started.Attrs)
	assert.Empty(t, started.Status)
	assert.Contains(t, testenv.Names(testenv.Children(traced, started.ID)), "camunda7 POST /process-definition/key/{id}/start",
		"the engine's calls nest under the handling")
	for _, sp := range all {
		if sp.Name == "inbox handle" && sp.SpanContext.SpanID().String() == started.ID {
			assert.Equal(t, trace.SpanKindConsumer, sp.SpanKind)
		}
	}

	// The early message: each delivery (the retry queue's copies keep the headers) in its
	// publisher's trace.
	early := nodesOf(earlyProducer.SpanContext())
	t.Logf("the early message's trace:\n%s", testenv.SpanTree(early))
	earlyHandles := testenv.Children(early, earlyProducer.SpanContext().SpanID().String())
	require.GreaterOrEqual(t, len(earlyHandles), 2)
	for i, n := range earlyHandles {
		want := "early"
		if i == len(earlyHandles)-1 {
			want = "correlated"
		}
		assert.Equal(t, want, n.Attrs["extworker.outcome"], "delivery %d", i+1)
		assert.Empty(t, n.Status, "early is no failure")
	}

	// The message without trace context: the root of a trace of its own.
	var rootTrace []testenv.SpanNode
	for _, sp := range all {
		if sp.Name == "inbox handle" && !sp.Parent.IsValid() && sp.SpanContext.TraceID() != producer.SpanContext().TraceID() {
			rootTrace = nodesOf(sp.SpanContext)
		}
	}
	t.Logf("the untraced message's trace:\n%s", testenv.SpanTree(rootTrace))
	require.Len(t, testenv.Children(rootTrace, ""), 1)
	root := testenv.Children(rootTrace, "")[0]
	assert.Equal(t, "inbox handle", root.Name)
	assert.Equal(t, "started", root.Attrs["extworker.outcome"])
	assert.Contains(t, testenv.Names(testenv.Children(rootTrace, root.ID)), "camunda7 POST /process-definition/key/{id}/start")

	// Handle called directly, without a span in its ctx: a root; a conflict, parked, is an
	// Error described by the outcome only.
	_, err := c.Handle(ctx, msg(conflictID, payload{Do: "start", BusinessKey: conflictBK}))
	require.NoError(t, err)
	out, err := c.Handle(ctx, msg(conflictID, payload{Do: "start", BusinessKey: conflictBK, Note: "another body"}))
	require.NoError(t, err)
	require.Equal(t, inbox.ClassConflict, out.Class)
	conflicts := handles(func(sp tracetest.SpanStub) bool {
		return !sp.Parent.IsValid() && slices.ContainsFunc(sp.Attributes, func(kv attribute.KeyValue) bool {
			return string(kv.Key) == "extworker.outcome" && kv.Value.AsString() == "conflict"
		})
	})
	require.Len(t, conflicts, 1)
	assert.Equal(t, "Error", conflicts[0].Status)
	assert.Equal(t, "conflict", conflicts[0].StatusDescription)
	assert.Equal(t, "processed", conflicts[0].Attrs["extworker.inbox.state"])

	var nodes []testenv.SpanNode
	for _, sp := range spans.Ended() {
		nodes = append(nodes, testenv.NodeOf(sp))
	}
	assert.Empty(t, testenv.SpanLeaks(nodes, tracedID, rootID, earlyID, conflictID, tracedBK, rootBK, earlyBK, conflictBK, "corr-", "another body"))
}
