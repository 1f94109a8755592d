package inbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/testenv"
)

// broker is the test's queue on the real RabbitMQ (with its retry and dead-letter
// queues), deleted at cleanup.
type broker struct {
	ch    *amqp.Channel
	queue string
}

func newBroker(t *testing.T) broker {
	t.Helper()
	conn := testenv.AMQP(t)
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	b := broker{ch: ch, queue: testenv.Unique("inbox-q")}
	require.NoError(t, inbox.Declare(ch, inbox.Config{Queue: b.queue}))
	t.Cleanup(func() {
		for _, q := range []string{b.queue, inbox.RetryQueue(b.queue), inbox.DeadLetterQueue(b.queue)} {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
	})
	return b
}

// publish sends m to the queue as a producer would, confirmed.
func (b broker) publish(t *testing.T, m inbox.Message) {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	dc, err := b.ch.PublishWithDeferredConfirmWithContext(ctx, "", b.queue, true, false, amqp.Publishing{MessageId: m.ID, Type: m.Type,
		CorrelationId: m.CorrelationID, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: m.Body})
	require.NoError(t, err)
	ok, err := dc.WaitContext(ctx)
	require.NoError(t, err)
	require.True(t, ok)
}

// dlq takes what the dead-letter queue holds (acknowledging it).
func (b broker) dlq(t *testing.T) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := b.ch.Get(inbox.DeadLetterQueue(b.queue), true)
		require.NoError(t, err)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// dlqDepth is how many messages the dead-letter queue holds (taking none).
func (b broker) dlqDepth(t *testing.T) int {
	t.Helper()
	q, err := b.ch.QueueDeclarePassive(inbox.DeadLetterQueue(b.queue), true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

// run runs c until the test ends, and fails the test if Run returns an error.
func run(t *testing.T, c *inbox.Consumer) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stop := func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("the consumer did not stop within 30s")
		}
	}
	var once sync.Once
	t.Cleanup(func() { once.Do(stop) })
	return func() { once.Do(stop) }
}

func (e env) waitState(t *testing.T, id string, want inbox.State) inbox.Record {
	t.Helper()
	var r inbox.Record
	testenv.Eventually(t, 30*time.Second, "message "+id+" "+string(want), func() (bool, error) {
		rows, err := inbox.List(context.Background(), e.pool, inbox.Filter{Source: e.source, MessageID: id})
		if err != nil || len(rows) == 0 {
			return false, err
		}
		r = rows[0]
		return r.State == want, nil
	})
	return r
}

// TestRunRetriesParksAndReplays goes through the broker: an early message comes back
// from the retry queue until its process waits; an unreadable one and one whose window
// passed are parked in the dead-letter queue with their reasons; the operator's replay
// brings the second back, and it is correlated.
func TestRunRetriesParksAndReplays(t *testing.T) {
	e := newEnv(t)
	b := newBroker(t)
	c := e.consumer(t, inbox.Config{Queue: b.queue, BackoffInitial: 100 * time.Millisecond, BackoffMax: 400 * time.Millisecond,
		EarlyWindow: 3 * time.Second})
	run(t, c)

	soon, never := testenv.Unique("INV"), testenv.Unique("INV")
	b.publish(t, msg("early-soon", payload{Do: "correlate", BusinessKey: soon}))
	b.publish(t, msg("early-never", payload{Do: "correlate", BusinessKey: never}))
	b.publish(t, inbox.Message{ID: "garbage", Body: []byte("{")})

	e.waitState(t, "early-soon", inbox.StateFailedRetryable)
	e.startWaiting(t, soon)
	r := e.waitState(t, "early-soon", inbox.StateProcessed)
	assert.GreaterOrEqual(t, r.Attempts, 2, "it came back from the retry queue")
	assert.Equal(t, 1, e.correlations(t, soon))

	parked := e.waitState(t, "early-never", inbox.StateFailedFinal)
	assert.Contains(t, parked.Reason, "past the window of 3s")
	e.waitState(t, "garbage", inbox.StateFailedFinal)

	var inDLQ []amqp.Delivery
	testenv.Eventually(t, 10*time.Second, "two parked messages in the dead-letter queue", func() (bool, error) {
		inDLQ = append(inDLQ, b.dlq(t)...)
		return len(inDLQ) == 2, nil
	})
	reasons := map[string]string{}
	for _, d := range inDLQ {
		reasons[d.MessageId], _ = d.Headers[inbox.HeaderReason].(string)
		assert.Equal(t, e.source, d.Headers[inbox.HeaderSource])
	}
	assert.Contains(t, reasons["early-never"], "early for")
	assert.Contains(t, reasons["garbage"], "could not read the message")

	// Put them back, as they were, and replay one once its process waits.
	for _, d := range inDLQ {
		dc, err := b.ch.PublishWithDeferredConfirmWithContext(context.Background(), "", inbox.DeadLetterQueue(b.queue), true, false,
			amqp.Publishing{MessageId: d.MessageId, Headers: d.Headers, DeliveryMode: amqp.Persistent, Body: d.Body})
		require.NoError(t, err)
		ok, err := dc.WaitContext(context.Background())
		require.NoError(t, err)
		require.True(t, ok)
	}
	e.startWaiting(t, never)
	rep, err := inbox.Replay(testenv.Context(t, 30*time.Second), e.pool, testenv.AMQPURL(), b.queue, func(id string) bool { return id == "early-never" })
	require.NoError(t, err)
	assert.Equal(t, []string{"early-never"}, rep.Replayed)
	assert.Equal(t, 1, rep.Kept)
	r = e.waitState(t, "early-never", inbox.StateProcessed)
	assert.Equal(t, 1, r.Replays)
	assert.Equal(t, 1, e.correlations(t, never))
	left := b.dlq(t)
	require.Len(t, left, 1)
	assert.Equal(t, "garbage", left[0].MessageId)
}

// TestSameEventTwiceToTwoConsumers: a producer's event delivered twice, at once, to two
// consumers of the same queue (two worker processes) starts one instance.
func TestSameEventTwiceToTwoConsumers(t *testing.T) {
	e := newEnv(t)
	b := newBroker(t)
	c1 := e.consumer(t, inbox.Config{Queue: b.queue})
	c2 := e.consumer(t, inbox.Config{Queue: b.queue})
	run(t, c1)
	run(t, c2)
	const events = 20
	var bks []string
	for i := range events {
		bk := testenv.Unique("INV")
		bks = append(bks, bk)
		m := msg("twice-"+bk, payload{Do: "start", BusinessKey: bk})
		b.publish(t, m)
		b.publish(t, m)
		if i%2 == 0 {
			b.publish(t, m) // and a third time for some
		}
	}
	testenv.Eventually(t, 60*time.Second, "every delivery handled", func() (bool, error) {
		n := int64(0)
		for _, c := range []*inbox.Consumer{c1, c2} {
			st := c.Stats()
			n += st.Started.Load() + st.Duplicates.Load() + st.Ignored.Load() + st.Retried.Load() + st.Parked.Load()
		}
		return n == events*2+events/2, nil
	})
	started := c1.Stats().Started.Load() + c2.Stats().Started.Load()
	dups := c1.Stats().Duplicates.Load() + c2.Stats().Duplicates.Load()
	assert.Equal(t, int64(events), started)
	assert.Equal(t, int64(events+events/2), dups)
	assert.NotZero(t, c1.Stats().Received.Load(), "both consumers took deliveries")
	assert.NotZero(t, c2.Stats().Received.Load(), "both consumers took deliveries")
	for _, bk := range bks {
		assert.Equal(t, 1, e.instances(t, e.ship, bk), "instances for %s", bk)
	}
	t.Logf("consumer 1 took %d deliveries, consumer 2 %d", c1.Stats().Received.Load(), c2.Stats().Received.Load())
}

// TestDeclaredBeforeAnyPublishNeedsIt: Declared closes only once the queue is bound to
// its exchange, so a publisher that waits for it (the outbox's relay in the same
// process) never publishes past the consumer. The soak found the race without it: the
// first event of a run, published before the consumer had bound its queue, went only to
// the soak's tap.
func TestDeclaredBeforeAnyPublishNeedsIt(t *testing.T) {
	e := newEnv(t)
	conn := testenv.AMQP(t)
	ch, err := conn.Channel()
	require.NoError(t, err)
	exchange, queue := testenv.Unique("ex"), testenv.Unique("inbox-q")
	t.Cleanup(func() {
		for _, q := range []string{queue, inbox.RetryQueue(queue), inbox.DeadLetterQueue(queue)} {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
		_ = ch.ExchangeDelete(exchange, false, false)
	})
	c := e.consumer(t, inbox.Config{Queue: queue, Bindings: []inbox.Binding{{Exchange: exchange, RoutingKey: "test.#"}}})
	select {
	case <-c.Declared():
		t.Fatal("Declared before Run")
	default:
	}
	run(t, c)
	select {
	case <-c.Declared():
	case <-time.After(30 * time.Second):
		t.Fatal("not declared within 30s of Run")
	}
	bk := testenv.Unique("INV")
	m := msg("bound-"+bk, payload{Do: "start", BusinessKey: bk})
	require.NoError(t, ch.Confirm(false))
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), exchange, "test.start", true, false,
		amqp.Publishing{MessageId: m.ID, Body: m.Body, DeliveryMode: amqp.Persistent})
	require.NoError(t, err)
	ok, err := dc.WaitContext(testenv.Context(t, 10*time.Second))
	require.NoError(t, err)
	require.True(t, ok)
	select {
	case r := <-returns:
		t.Fatalf("the broker returned the message: no queue bound (%s)", r.ReplyText)
	default:
	}
	e.waitState(t, m.ID, inbox.StateProcessed)
	assert.Equal(t, 1, e.instances(t, e.ship, bk))
}

// TestReplayStoppedHalfWayRunsAgain: a replay that put the row back to received and
// stopped before it sent the copy (killed, the broker gone) is run again: the copy still
// in the dead-letter queue is sent, and the row is not reopened a second time (an
// operator may reopen only a parked row: migration 00014).
func TestReplayStoppedHalfWayRunsAgain(t *testing.T) {
	e := newEnv(t)
	b := newBroker(t)
	c := e.consumer(t, inbox.Config{Queue: b.queue, BackoffInitial: 100 * time.Millisecond, BackoffMax: 400 * time.Millisecond,
		EarlyWindow: time.Second})
	run(t, c)

	bk := testenv.Unique("INV")
	b.publish(t, msg("half-way", payload{Do: "correlate", BusinessKey: bk}))
	e.waitState(t, "half-way", inbox.StateFailedFinal)
	testenv.Eventually(t, 10*time.Second, "the parked copy in the dead-letter queue", func() (bool, error) {
		return b.dlqDepth(t) == 1, nil
	})

	// The first replay's half: the row back to received, the copy still parked.
	ok, err := inbox.Reopen(testenv.Context(t, 10*time.Second), e.pool, e.source, "half-way")
	require.NoError(t, err)
	require.True(t, ok)

	e.startWaiting(t, bk)
	rep, err := inbox.Replay(testenv.Context(t, 30*time.Second), e.pool, testenv.AMQPURL(), b.queue, func(id string) bool { return id == "half-way" })
	require.NoError(t, err)
	assert.Equal(t, []string{"half-way"}, rep.Replayed)
	assert.Empty(t, rep.Conflicts)
	r := e.waitState(t, "half-way", inbox.StateProcessed)
	assert.Equal(t, 1, r.Replays, "reopened once")
	assert.Equal(t, 1, e.correlations(t, bk))
	assert.Zero(t, b.dlqDepth(t))
}
