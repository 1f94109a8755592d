package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/extworker/extworker/internal/digest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
	"github.com/extworker/extworker/outbox"
)

var migrateOnce sync.Once

// env is a migrated database, a namespace of the test's own and a queue on the real
// broker that the default exchange routes to.
type env struct {
	pool  *pgxpool.Pool
	ns    string
	queue string
	ch    *amqp.Channel
	pub   *outbox.AMQPPublisher
}

func newEnv(t *testing.T) env {
	t.Helper()
	pool := testenv.DB(t)
	migrateOnce.Do(func() {
		_, err := migrations.Up(context.Background(), stdlib.OpenDBFromPool(pool))
		require.NoError(t, err)
	})
	conn := testenv.AMQP(t)
	q, ch := testenv.Queue(t, conn)
	pub := outbox.NewAMQPPublisher(testenv.AMQPURL())
	t.Cleanup(func() { _ = pub.Close() })
	return env{pool: pool, ns: testenv.Unique("ns"), queue: q, ch: ch, pub: pub}
}

func (e env) event(id, key string) outbox.Event {
	return outbox.Event{MessageID: id, Type: "invoice.paid", RoutingKey: e.queue, OrderingKey: key, CorrelationID: "corr-" + id,
		Body: []byte(fmt.Sprintf(`{"invoice":%q}`, id))}
}

// add adds events in one transaction, committed or rolled back.
func (e env) add(t *testing.T, commit bool, events ...outbox.Event) {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	for _, ev := range events {
		require.NoError(t, outbox.Add(ctx, tx, e.ns, ev))
	}
	if commit {
		require.NoError(t, tx.Commit(ctx))
	} else {
		require.NoError(t, tx.Rollback(ctx))
	}
}

// received drains the queue until n messages have come, or the deadline.
func (e env) received(t *testing.T, n int) []amqp.Delivery {
	t.Helper()
	var got []amqp.Delivery
	testenv.Eventually(t, 20*time.Second, fmt.Sprintf("%d messages in the queue", n), func() (bool, error) {
		for {
			d, ok, err := e.ch.Get(e.queue, true)
			if err != nil || !ok {
				return len(got) >= n, err
			}
			got = append(got, d)
		}
	})
	return got
}

// An event is published if and only if its transaction committed, once, with its message
// id, type and correlation id, persistent; once the broker confirmed it, only its digest
// stays.
func TestPublishesCommittedEventsOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t, time.Minute)
	e.add(t, true, e.event("INV-1", ""))
	e.add(t, false, e.event("INV-2", ""))
	r := outbox.NewRelay(e.pool, e.pub, outbox.RelayConfig{Namespace: e.ns})
	n, err := r.PublishPending(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	got := e.received(t, 1)
	require.Len(t, got, 1)
	d := got[0]
	assert.Equal(t, "INV-1", d.MessageId)
	assert.Equal(t, "invoice.paid", d.Type)
	assert.Equal(t, "corr-INV-1", d.CorrelationId)
	assert.Equal(t, amqp.Persistent, d.DeliveryMode)
	assert.JSONEq(t, `{"invoice":"INV-1"}`, string(d.Body))

	var body []byte
	var stored string
	var published *time.Time
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT body, body_digest, published_at FROM extworker_outbox WHERE namespace = $1 AND message_id = 'INV-1'`,
		e.ns).Scan(&body, &stored, &published))
	assert.Nil(t, body, "the body goes once the broker has it")
	assert.Equal(t, digest.Bytes([]byte(`{"invoice":"INV-1"}`)), stored)
	assert.NotNil(t, published)
	n, err = r.PublishPending(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "published once")
	b, err := r.Backlog(ctx)
	require.NoError(t, err)
	assert.Equal(t, outbox.Backlog{}, b)
}

// Adding an event again does nothing; the same message id with another body is refused.
func TestAddIsIdempotentAndRefusesConflicts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t, time.Minute)
	ev := e.event("INV-3", "")
	e.add(t, true, ev)
	e.add(t, true, ev)
	other := ev
	other.Body = []byte(`{"invoice":"INV-3","amount":1}`)
	err := outbox.Add(ctx, e.pool, e.ns, other)
	assert.ErrorIs(t, err, outbox.ErrConflict)
	var n int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM extworker_outbox WHERE namespace = $1`, e.ns).Scan(&n))
	assert.Equal(t, 1, n)
	assert.ErrorContains(t, outbox.Add(ctx, e.pool, e.ns, outbox.Event{MessageID: "x"}), "needs [Type RoutingKey Body]")
}

// Events of one ordering key are published in the order they were added, with several
// relays at once; the keys do not wait for each other.
func TestOrderPerKeyAcrossRelays(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t, time.Minute)
	const perKey = 15
	var events []outbox.Event
	for i := 0; i < perKey; i++ {
		for _, k := range []string{"A", "B"} {
			events = append(events, e.event(fmt.Sprintf("%s-%02d", k, i), k))
		}
	}
	e.add(t, true, events...)
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := outbox.NewRelay(e.pool, outbox.NewAMQPPublisher(testenv.AMQPURL()), outbox.RelayConfig{Namespace: e.ns, Batch: 4})
			for {
				n, err := r.PublishPending(ctx)
				if err != nil || n == 0 {
					b, berr := r.Backlog(ctx)
					if err != nil || berr != nil || b.Unpublished == 0 {
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	got := e.received(t, 2*perKey)
	next := map[string]int{}
	for _, d := range got {
		var k string
		var i int
		_, err := fmt.Sscanf(d.MessageId, "%1s-%02d", &k, &i)
		require.NoError(t, err)
		assert.Equal(t, next[k], i, "key %s out of order at %s", k, d.MessageId)
		next[k] = i + 1
	}
	assert.Equal(t, map[string]int{"A": perKey, "B": perKey}, next)
}

// failing fails every publish, as an unreachable broker does.
type failing struct{}

func (failing) Publish(context.Context, outbox.Event) error {
	return errors.New("dial tcp 127.0.0.1:1: connection refused")
}

// A publish that fails leaves the event unpublished, with the error and a backoff, and
// holds back the later events of its key, not the others; once the broker is back, all
// are published, in order.
func TestFailedPublishWaitsAndHoldsItsKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t, time.Minute)
	e.add(t, true, e.event("K-1", "K"), e.event("K-2", "K"))
	down := outbox.NewRelay(e.pool, failing{}, outbox.RelayConfig{Namespace: e.ns}) // the shipped backoff: 1s first
	n, err := down.PublishPending(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
	var attempts int
	var lastErr string
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT attempts, last_error FROM extworker_outbox WHERE namespace = $1 AND message_id = 'K-1'`, e.ns).
		Scan(&attempts, &lastErr))
	assert.Equal(t, 1, attempts)
	assert.Contains(t, lastErr, "connection refused")
	b, err := down.Backlog(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, b.Unpublished)
	assert.Equal(t, 1, b.Failing)
	assert.Positive(t, b.OldestAge)

	up := outbox.NewRelay(e.pool, e.pub, outbox.RelayConfig{Namespace: e.ns})
	n, err = up.PublishPending(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "K-1 waits out its backoff, and K-2 waits for K-1")
	testenv.Eventually(t, 10*time.Second, "both published after the backoff", func() (bool, error) {
		_, err := up.PublishPending(ctx)
		b, berr := up.Backlog(ctx)
		return err == nil && berr == nil && b.Unpublished == 0, errors.Join(err, berr)
	})
	got := e.received(t, 2)
	assert.Equal(t, []string{"K-1", "K-2"}, []string{got[0].MessageId, got[1].MessageId})
}

// confirmedThenLost publishes, then loses the relay's transaction, as a relay that dies
// after the broker's confirm and before its mark commits.
type confirmedThenLost struct {
	pub    outbox.Publisher
	cancel context.CancelFunc
}

func (c confirmedThenLost) Publish(ctx context.Context, e outbox.Event) error {
	err := c.pub.Publish(ctx, e)
	c.cancel()
	return err
}

// A relay that dies after the broker confirmed an event and before it marked it leaves
// it unpublished: the next relay publishes it again, with the same message id (at least
// once; consumers deduplicate by the id).
func TestRepublishedAfterALostMarkWithTheSameID(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t, time.Minute)
	e.add(t, true, e.event("INV-9", ""))
	dying, die := context.WithCancel(ctx)
	_, err := outbox.NewRelay(e.pool, confirmedThenLost{pub: e.pub, cancel: die}, outbox.RelayConfig{Namespace: e.ns}).PublishPending(dying)
	require.Error(t, err, "the mark's transaction died with the relay")
	// The dead relay's transaction holds the event until PostgreSQL has seen its
	// connection go (a loaded machine takes a moment); SKIP LOCKED passes over it until then.
	relay := outbox.NewRelay(e.pool, e.pub, outbox.RelayConfig{Namespace: e.ns})
	testenv.Eventually(t, 30*time.Second, "a second relay to publish the event again", func() (bool, error) {
		n, err := relay.PublishPending(ctx)
		return n == 1, err
	})
	got := e.received(t, 2)
	assert.Equal(t, []string{"INV-9", "INV-9"}, []string{got[0].MessageId, got[1].MessageId})
}

// A message no queue would receive is not published: it stays in the outbox, failing,
// instead of being confirmed into nowhere.
func TestUnroutableIsNotPublished(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t, time.Minute)
	ev := e.event("INV-10", "")
	ev.RoutingKey = testenv.Unique("nobody-listens")
	e.add(t, true, ev)
	n, err := outbox.NewRelay(e.pool, e.pub, outbox.RelayConfig{Namespace: e.ns}).PublishPending(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
	var lastErr string
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT last_error FROM extworker_outbox WHERE namespace = $1`, e.ns).Scan(&lastErr))
	assert.Contains(t, lastErr, "routed the message to no queue")
}

// Adding through the ledger's transaction: an event and the business rows commit together
// (idempotency.Effect.Local hands the transaction over).
func ExampleAdd() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://extworker@127.0.0.1:5432/extworker")
	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... the business rows, in tx ...
		return outbox.Add(ctx, tx, "default", outbox.Event{MessageID: "invoice.paid:INV-1", Type: "invoice.paid",
			Exchange: "billing", RoutingKey: "invoice.paid", OrderingKey: "INV-1", Body: []byte(`{"invoice":"INV-1"}`)})
	})
}
