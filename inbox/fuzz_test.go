package inbox_test

import (
	"context"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/testenv"
)

// The fuzz targets feed what producers supply (the AMQP message id, type, correlation id
// and headers, the body, the business key Decide takes from it) to a consumer against
// the real database and engine, and check the inbox's invariant: the message ends in a
// row with a definite state (processed, ignored_duplicate, or parked as failed_final,
// counted), within a few deliveries: never an error that makes it an outage to be
// retried forever, never a retry without end, never a panic. Each input gets a source
// of its own, so that its row is its own. The seed corpus is in testdata/fuzz; plain
// `go test` runs it.

// fuzzConfig makes every wait short: an early message is parked at its second delivery,
// an engine failing on a message at its second failure, an unknown outcome asked about
// after quickWindow (with fuzzClient, whose timeout it exceeds).
func fuzzConfig(source string) inbox.Config {
	return inbox.Config{Source: source, Queue: "fuzz", EarlyWindow: time.Millisecond, InFlightWindow: quickWindow,
		BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond, MaxEngineFailures: 2}
}

// fuzzClient is the engine client of the fuzzed consumers.
func fuzzClient(t testing.TB) *camunda7.Client {
	return quickClient(t, testenv.EngineURL(), quickTimeout)
}

// maxRounds bounds the deliveries a fuzzed message may take to settle.
const maxRounds = 8

// settles hands a message to handle (round counts from 1) until it is not retried, and
// checks the invariant on source's inbox.
func settles(t *testing.T, e env, source string, handle func(round int) (inbox.Handling, error)) {
	t.Helper()
	var out inbox.Handling
	for round := 1; ; round++ {
		var err error
		out, err = handle(round)
		require.NoError(t, err, "the inbox refused the message: an outage to the consumer, retried forever")
		if out.Disposition != inbox.Retry {
			break
		}
		require.Less(t, round, maxRounds, "still retried after %d deliveries: %s", round, out.Reason)
		time.Sleep(out.Delay) // as the retry queue would: an unknown outcome waits out the in-flight window
	}
	ctx := testenv.Context(t, 10*time.Second)
	rows, err := inbox.List(ctx, e.pool, inbox.Filter{Source: source})
	require.NoError(t, err)
	require.Len(t, rows, 1, "one row for the message")
	final := []inbox.State{inbox.StateProcessed, inbox.StateIgnoredDuplicate, inbox.StateFailedFinal}
	require.True(t, slices.Contains(final, rows[0].State), "row in %s: %s", rows[0].State, rows[0].Reason)
	if out.Disposition == inbox.Park {
		require.Equal(t, inbox.StateFailedFinal, rows[0].State)
		p, err := inbox.ReadParked(ctx, e.pool, source)
		require.NoError(t, err)
		require.Equal(t, 1, p.Messages, "the parked message is counted")
	}
}

func FuzzMessageFields(f *testing.F) {
	e := newEnv(f)
	f.Add("evt-1", "invoice.paid", "corr-1", []byte(`{"do":"start","bk":"INV-1"}`))
	f.Fuzz(func(t *testing.T, id, typ, corr string, body []byte) {
		source := testenv.Unique("fuzz")
		c, err := inbox.NewConsumer(e.pool, admin.New(fuzzClient(t)), testenv.AMQPURL(), e.decide, fuzzConfig(source))
		require.NoError(t, err)
		m := inbox.Message{ID: id, Type: typ, CorrelationID: corr, Body: body}
		settles(t, e, source, func(int) (inbox.Handling, error) { return c.Handle(context.Background(), m) })
	})
}

func FuzzBusinessKey(f *testing.F) {
	e := newEnv(f)
	f.Add(true, "INV-1")
	f.Fuzz(func(t *testing.T, start bool, bk string) {
		source := testenv.Unique("fuzz")
		decide := func(inbox.Message) (inbox.Action, error) {
			if start {
				return inbox.Action{Start: &inbox.Start{ProcessKey: e.ship, BusinessKey: bk}}, nil
			}
			return inbox.Action{Correlate: &inbox.Correlate{ProcessDefinitionKey: e.wait, MessageName: e.paid, BusinessKey: bk}}, nil
		}
		c, err := inbox.NewConsumer(e.pool, admin.New(fuzzClient(t)), testenv.AMQPURL(), decide, fuzzConfig(source))
		require.NoError(t, err)
		m := inbox.Message{ID: "bk", Body: []byte(bk)}
		settles(t, e, source, func(int) (inbox.Handling, error) { return c.Handle(context.Background(), m) })
	})
}

func FuzzDeliveryHeaders(f *testing.F) {
	e := newEnv(f)
	f.Add("evt-1", "invoice.paid", "corr-1", "x-custom", "value", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", int64(0), false,
		[]byte(`{"do":"correlate","bk":"INV-1"}`))
	f.Fuzz(func(t *testing.T, id, typ, corr, key, value, traceparent string, attempt int64, redelivered bool, body []byte) {
		source := testenv.Unique("fuzz")
		c, err := inbox.NewConsumer(e.pool, admin.New(fuzzClient(t)), testenv.AMQPURL(), e.decide, fuzzConfig(source))
		require.NoError(t, err)
		settles(t, e, source, func(round int) (inbox.Handling, error) {
			headers := amqp.Table{key: value, inbox.HeaderTraceparent: traceparent, inbox.HeaderAttempt: attempt}
			if round > 1 {
				headers[inbox.HeaderAttempt] = int32(round - 1) // the retry queue's copy
			}
			d := amqp.Delivery{MessageId: id, Type: typ, CorrelationId: corr, Headers: headers, Redelivered: redelivered, Body: body}
			return c.HandleDelivery(context.Background(), d)
		})
	})
}
