package outbox_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
	"github.com/extworker/extworker/outbox"
)

// The publish side's cost per event, against the real PostgreSQL, RabbitMQ and Kafka (make
// up):
//
//	go test -tags failpoints -run '^$' -bench . -benchtime 200x -benchmem ./outbox/
//
// Each benchmark run has a namespace and a queue of its own (exclusive, deleted with its
// connection at cleanup). Besides the time, each reports events/s and the round trips to
// PostgreSQL per event (roundtrips/op: pgx flushes once per round trip).

// BenchmarkAdd is what adding an event costs a handler.
//
//   - own-tx: the event in a transaction of its own (begin, insert, commit: what an event
//     added on its own costs);
//   - in-tx: the event added to a transaction that is open anyway (the handler's): one
//     insert; the one commit at the end is timed too, spread over all the events.
func BenchmarkAdd(b *testing.B) {
	b.Run("own-tx", func(b *testing.B) {
		e, trips := benchEnv(b)
		ctx := context.Background()
		events := benchEvents(e, b.N)
		warmUp(b, e)
		trips.Store(0)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, e.ns, events[i]) }); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		report(b, trips, "events/s")
		expectRows(b, e, b.N+1, b.N+1)
	})
	b.Run("in-tx", func(b *testing.B) {
		e, trips := benchEnv(b)
		ctx := context.Background()
		events := benchEvents(e, b.N)
		warmUp(b, e)
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		trips.Store(0)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := outbox.Add(ctx, tx, e.ns, events[i]); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		report(b, trips, "events/s")
		expectRows(b, e, b.N+1, b.N+1)
	})
}

// BenchmarkAddAndPublish is one event end to end on the publish side: added in a
// transaction of its own, then a relay pass publishes it, waits for the broker's
// confirm and marks it published (the pass's own transaction). Per transport (see
// transports): rabbitmq, kafka.
func BenchmarkAddAndPublish(b *testing.B) {
	for _, transport := range transports {
		b.Run(transport, func(b *testing.B) { benchAddAndPublish(b, transport) })
	}
}

func benchAddAndPublish(b *testing.B, transport string) {
	e, trips := benchEnv(b)
	pub, published := benchPublisher(b, &e, transport)
	ctx := context.Background()
	events := benchEvents(e, b.N)
	r := outbox.NewRelay(e.pool, pub, outbox.RelayConfig{Namespace: e.ns})
	warmUp(b, e)
	if n, err := r.PublishPending(ctx); err != nil || n != 1 { // connects the publisher
		b.Fatalf("warm-up pass: published %d: %v", n, err)
	}
	trips.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, e.ns, events[i]) }); err != nil {
			b.Fatal(err)
		}
		n, err := r.PublishPending(ctx)
		if err != nil || n != 1 {
			b.Fatalf("pass %d: published %d: %v", i, n, err)
		}
	}
	b.StopTimer()
	report(b, trips, "events/s")
	expectRows(b, e, b.N+1, 0)
	expectPublished(b, published, b.N+1)
}

// BenchmarkPublishBatch is the relay working a backlog: b.N events are added first (not
// timed), then relay passes of Batch 100 publish them all. ns/op is per event. A pass
// publishes its events one at a time, each waiting for its confirm; the batch shares
// the pass's query and transaction. Per transport (see transports): rabbitmq, kafka.
func BenchmarkPublishBatch(b *testing.B) {
	for _, transport := range transports {
		b.Run(transport, func(b *testing.B) { benchPublishBatch(b, transport) })
	}
}

func benchPublishBatch(b *testing.B, transport string) {
	e, trips := benchEnv(b)
	pub, published := benchPublisher(b, &e, transport)
	ctx := context.Background()
	events := benchEvents(e, b.N)
	for i := 0; i < len(events); i += 1000 {
		chunk := events[i:min(i+1000, len(events))]
		if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			for _, ev := range chunk {
				if err := outbox.Add(ctx, tx, e.ns, ev); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	// Connects the publisher and the pool: publishes a probe through the same broker
	// connection, not counted.
	if err := pub.Publish(ctx, e.event("warm-up", "")); err != nil {
		b.Fatal(err)
	}
	r := outbox.NewRelay(e.pool, pub, outbox.RelayConfig{Namespace: e.ns, Batch: 100})
	trips.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	passes := 0
	for total := 0; total < b.N; {
		n, err := r.PublishPending(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if n == 0 {
			b.Fatalf("a pass published nothing with %d of %d published", total, b.N)
		}
		total += n
		passes++
	}
	b.StopTimer()
	report(b, trips, "events/s")
	b.ReportMetric(float64(passes), "passes")
	expectRows(b, e, b.N, 0)
	expectPublished(b, published, b.N+1)
}

// benchEnv is newEnv for a benchmark: a migrated database, a fresh namespace, a queue of
// its own and a publisher; its pool counts the round trips to PostgreSQL.
func benchEnv(b *testing.B) (env, *atomic.Int64) {
	b.Helper()
	plain := testenv.DB(b) // checks the database is there, and migrates it once
	migrateOnce.Do(func() {
		if _, err := migrations.Up(context.Background(), stdlib.OpenDBFromPool(plain)); err != nil {
			b.Fatal(err)
		}
	})
	pool, trips := countingPool(b)
	conn := testenv.AMQP(b)
	q, ch := testenv.Queue(b, conn)
	pub := outbox.NewAMQPPublisher(testenv.AMQPURL())
	b.Cleanup(func() { _ = pub.Close() })
	return env{pool: pool, ns: testenv.Unique("ns"), queue: q, ch: ch, pub: pub}, trips
}

// benchEvents builds n distinct events (each its own ordering key), before the timer.
func benchEvents(e env, n int) []outbox.Event {
	events := make([]outbox.Event, n)
	for i := range events {
		events[i] = e.event(fmt.Sprintf("B-%06d", i), "")
	}
	return events
}

// warmUp adds one event outside the timer, so that the pool's connection is open and
// its statements prepared before the first timed operation.
func warmUp(b *testing.B, e env) {
	b.Helper()
	if err := outbox.Add(context.Background(), e.pool, e.ns, e.event("warm-up", "")); err != nil {
		b.Fatal(err)
	}
}

// report adds the rate and the round trips per operation.
func report(b *testing.B, trips *atomic.Int64, rate string) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), rate)
	b.ReportMetric(float64(trips.Load())/float64(b.N), "roundtrips/op")
}

// expectRows checks, after the timer, that the namespace holds rows events, unpublished
// of them unpublished.
func expectRows(b *testing.B, e env, rows, unpublished int) {
	b.Helper()
	var n, u int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE published_at IS NULL)
		FROM extworker_outbox WHERE namespace = $1`, e.ns).Scan(&n, &u); err != nil {
		b.Fatal(err)
	}
	if n != rows || u != unpublished {
		b.Fatalf("the outbox holds %d events, %d unpublished; want %d, %d unpublished", n, u, rows, unpublished)
	}
}

// transports are the publishers the relay benchmarks run with, side by side:
//
//   - rabbitmq: outbox.AMQPPublisher, persistent, to a queue of the run's own through the
//     default exchange, waiting for each publisher confirm;
//   - kafka: outbox.KafkaPublisher to a topic of the run's own on the shared broker (3
//     partitions, one replica), waiting for each acknowledgement (acks=all, idempotent).
var transports = []string{"rabbitmq", "kafka"}

// benchPublisher is the publisher of transport for e (for kafka, e's events go to a topic
// of its own) and a count of the messages it has put on the queue or topic.
func benchPublisher(b *testing.B, e *env, transport string) (outbox.Publisher, func() int) {
	b.Helper()
	if transport == "rabbitmq" {
		return e.pub, func() int {
			q, err := e.ch.QueueDeclarePassive(e.queue, false, true, true, false, nil)
			if err != nil {
				b.Fatal(err)
			}
			return q.Messages
		}
	}
	brokers := []string{testenv.Kafka(b)}
	e.queue = testenv.Unique("bench-topic") // e.event's RoutingKey: the topic
	pub, err := outbox.NewKafkaPublisher(brokers)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = pub.Close() })
	return pub, func() int {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			b.Fatal(err)
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, e.queue)
		if err == nil {
			err = ends.Error()
		}
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		ends.Each(func(o kadm.ListedOffset) { n += int(o.Offset) })
		return n
	}
}

// expectPublished checks, after the timer, that the broker holds n messages in the queue
// or on the topic.
func expectPublished(b *testing.B, published func() int, n int) {
	b.Helper()
	if got := published(); got != n {
		b.Fatalf("the broker holds %d messages, want %d", got, n)
	}
}

// countingPool is a pool on the worker's database whose connections count their writes:
// pgx flushes once per round trip, so the count is the number of round trips.
func countingPool(b *testing.B) (*pgxpool.Pool, *atomic.Int64) {
	b.Helper()
	pc, err := pgxpool.ParseConfig(testenv.DBURL())
	if err != nil {
		b.Fatal(err)
	}
	var trips atomic.Int64
	dial := pc.ConnConfig.DialFunc
	pc.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, writes: &trips}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		b.Fatal(err)
	}
	return pool, &trips
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}
