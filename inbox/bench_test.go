package inbox_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

// The consume side's cost per message, against the real PostgreSQL, RabbitMQ and engine
// (make up):
//
//	go test -tags failpoints -run '^$' -bench . -benchtime 200x -benchmem ./inbox/
//
// Each benchmark run has a source of its own (so its inbox rows are its own), business
// keys of its own, and, where it deploys one, a process of its own (deleted at cleanup,
// with its instances). Besides the time, each reports messages/s and the round trips to
// PostgreSQL per message (roundtrips/op: pgx flushes once per round trip).

// BenchmarkHandleDuplicate is a redelivered message, consumed before: the inbox
// suppresses it (its lock, the upsert that finds the row, the duplicate count, the
// unlock) and the engine is not asked. b.N distinct messages are consumed first, not
// timed; each is then delivered again.
func BenchmarkHandleDuplicate(b *testing.B) {
	e, trips := benchEnv(b, false)
	c := benchConsumer(b, e, ignore)
	ctx := context.Background()
	msgs := benchMessages(b.N, func(i int) payload { return payload{Do: "ignore", BusinessKey: fmt.Sprintf("BK-%06d", i)} })
	for _, m := range msgs {
		if out, err := c.Handle(ctx, m); err != nil || out.State != inbox.StateProcessed {
			b.Fatalf("first delivery of %s: %+v, %v", m.ID, out, err)
		}
	}
	trips.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		out, err := c.Handle(ctx, msgs[i])
		if err != nil || out.Class != inbox.ClassDuplicate || out.Disposition != inbox.Ack {
			b.Fatalf("redelivery of %s: %+v, %v", msgs[i].ID, out, err)
		}
	}
	b.StopTimer()
	report(b, trips)
	if got := c.Stats().Duplicates.Load(); got != int64(b.N) {
		b.Fatalf("%d duplicates counted, want %d", got, b.N)
	}
}

// BenchmarkHandleIgnore is a fresh message whose Decide says Action{Ignore}: the inbox's
// own bookkeeping for a message it has not seen (lock, insert, record the outcome,
// unlock), without an engine call.
func BenchmarkHandleIgnore(b *testing.B) {
	e, trips := benchEnv(b, false)
	c := benchConsumer(b, e, ignore)
	ctx := context.Background()
	msgs := benchMessages(b.N, func(i int) payload { return payload{Do: "ignore", BusinessKey: fmt.Sprintf("BK-%06d", i)} })
	warmUp(b, c)
	trips.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		out, err := c.Handle(ctx, msgs[i])
		if err != nil || out.State != inbox.StateProcessed || out.Class == inbox.ClassDuplicate || out.Disposition != inbox.Ack {
			b.Fatalf("%s: %+v, %v", msgs[i].ID, out, err)
		}
	}
	b.StopTimer()
	report(b, trips)
}

// BenchmarkHandleStart is a fresh message that starts a process instance in the real
// engine, once per business key: the inbox's bookkeeping plus the engine's calls (a
// look for an instance with the business key, running then ended, and the start). The
// engine dominates.
func BenchmarkHandleStart(b *testing.B) {
	e, trips := benchEnv(b, true)
	c := benchConsumer(b, e, e.decide)
	ctx := context.Background()
	run := testenv.Unique("BK")
	msgs := benchMessages(b.N, func(i int) payload { return payload{Do: "start", BusinessKey: fmt.Sprintf("%s-%06d", run, i)} })
	warmUp(b, c)
	trips.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		out, err := c.Handle(ctx, msgs[i])
		if err != nil || out.Class != inbox.ClassStarted {
			b.Fatalf("%s: %+v, %v", msgs[i].ID, out, err)
		}
	}
	b.StopTimer()
	report(b, trips)
}

// BenchmarkConsume is the consumer end to end through RabbitMQ: b.N messages are
// published to a fresh queue first (with confirms, not timed), then a Consumer (Run,
// the default Concurrency of 4) consumes them until the inbox has recorded every one
// as processed. The time includes the consumer's connecting and declaring its queues
// (once per run) and up to one poll of the inbox (every 2ms) after the last message.
//
//   - ignore: Action{Ignore}, so that the engine is not the bottleneck;
//   - start: each message starts a process instance in the real engine.
func BenchmarkConsume(b *testing.B) {
	for _, name := range []string{"ignore", "start"} {
		b.Run(name, func(b *testing.B) {
			e, trips := benchEnv(b, name == "start")
			decide := ignore
			if name == "start" {
				decide = e.decide
			}
			cfg := inbox.Config{Source: e.source, Queue: testenv.Unique("bench-q")}
			c := benchConsumer(b, e, decide, cfg)
			run := testenv.Unique("BK")
			publish(b, cfg, benchMessages(b.N, func(i int) payload { return payload{Do: name, BusinessKey: fmt.Sprintf("%s-%06d", run, i)} }))
			poll := testenv.DB(b) // the polls are not the consumer's round trips
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			trips.Store(0)
			b.ReportAllocs()
			b.ResetTimer()
			go func() { done <- c.Run(ctx) }()
			waitRecorded(b, c, poll, e.source, b.N)
			b.StopTimer()
			cancel()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			report(b, trips)
			s := c.Stats()
			if s.Retried.Load() != 0 || s.Parked.Load() != 0 || s.Duplicates.Load() != 0 {
				b.Fatalf("retried %d, parked %d, duplicates %d: want none", s.Retried.Load(), s.Parked.Load(), s.Duplicates.Load())
			}
			if name == "start" && s.Started.Load() != int64(b.N) {
				b.Fatalf("started %d, want %d", s.Started.Load(), b.N)
			}
		})
	}
}

// waitRecorded waits until n messages of source are processed in the inbox: it asks the
// database every 2ms once the consumer has received n deliveries (an atomic read until
// then).
func waitRecorded(b *testing.B, c *inbox.Consumer, pool *pgxpool.Pool, source string, n int) {
	b.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if c.Stats().Received.Load() >= int64(n) {
			var got int
			if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM extworker_inbox WHERE source = $1 AND state = 'processed'`,
				source).Scan(&got); err != nil {
				b.Fatal(err)
			}
			if got >= n {
				return
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d messages received after 5m", c.Stats().Received.Load(), n)
		}
		<-tick.C
	}
}

// publish declares cfg's queues (deleted at cleanup) and publishes msgs to the queue,
// persistent, waiting for the broker's confirms.
func publish(b *testing.B, cfg inbox.Config, msgs []inbox.Message) {
	b.Helper()
	conn := testenv.AMQP(b)
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := inbox.Declare(ch, cfg); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { // before the connection closes (cleanups run last first)
		ch, err := conn.Channel()
		if err != nil {
			b.Errorf("deleting the benchmark's queues: %v", err)
			return
		}
		for _, q := range []string{cfg.Queue, inbox.RetryQueue(cfg.Queue), inbox.DeadLetterQueue(cfg.Queue)} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				b.Errorf("delete queue %s: %v", q, err)
			}
		}
	})
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", cfg.Queue, true, false, amqp.Publishing{
			MessageId: m.ID, Type: m.Type, CorrelationId: m.CorrelationID, ContentType: "application/json",
			DeliveryMode: amqp.Persistent, Body: m.Body})
		if err != nil {
			b.Fatal(err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			b.Fatalf("publish confirm: %v, %v", ok, err)
		}
	}
	q, err := ch.QueueDeclarePassive(cfg.Queue, true, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	if q.Messages != len(msgs) {
		b.Fatalf("the queue holds %d messages, want %d", q.Messages, len(msgs))
	}
}

// ignore is a Decide that acts on nothing.
func ignore(inbox.Message) (inbox.Action, error) {
	return inbox.Action{Ignore: "benchmark"}, nil
}

// benchEnv is newEnv for a benchmark: a migrated database and a fresh source, the real
// engine, and with deploy the test's processes; its pool counts the round trips to
// PostgreSQL.
func benchEnv(b *testing.B, deploy bool) (env, *atomic.Int64) {
	b.Helper()
	plain := testenv.DB(b) // checks the database is there, and migrates it once
	migrateOnce.Do(func() {
		if _, err := migrations.Up(context.Background(), stdlib.OpenDBFromPool(plain)); err != nil {
			b.Fatal(err)
		}
	})
	pool, trips := countingPool(b)
	e := env{pool: pool, engine: testenv.Engine(b), source: testenv.Unique("src")}
	e.wait, e.ship, e.paid = testenv.Unique("wait"), testenv.Unique("ship"), testenv.Unique("paid")
	if deploy {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := e.engine.Deploy(ctx, admin.Deployment{Name: e.wait, Resources: []admin.Resource{{Name: e.wait + ".bpmn",
			Content: []byte(fmt.Sprintf(procBPMN, e.wait, e.paid, e.ship))}}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := e.engine.DeleteDeployment(ctx, res.ID, true); err != nil {
				b.Errorf("delete deployment: %v", err)
			}
		})
	}
	return e, trips
}

func benchConsumer(b *testing.B, e env, decide inbox.Decide, cfg ...inbox.Config) *inbox.Consumer {
	b.Helper()
	var c inbox.Config
	if len(cfg) > 0 {
		c = cfg[0]
	}
	if c.Source == "" {
		c.Source = e.source
	}
	if c.Queue == "" {
		c.Queue = testenv.Unique("q") // Handle alone does not use it
	}
	cons, err := inbox.NewConsumer(e.pool, e.engine, testenv.AMQPURL(), decide, c)
	if err != nil {
		b.Fatal(err)
	}
	return cons
}

// benchMessages builds n distinct messages, before the timer.
func benchMessages(n int, p func(i int) payload) []inbox.Message {
	msgs := make([]inbox.Message, n)
	for i := range msgs {
		msgs[i] = msg(fmt.Sprintf("B-%06d", i), p(i))
	}
	return msgs
}

// warmUp handles one message outside the timer (under its own id and business key), so
// that the pool's connection is open, its statements prepared and, for a start, the
// engine's connection open before the first timed message.
func warmUp(b *testing.B, c *inbox.Consumer) {
	b.Helper()
	out, err := c.Handle(context.Background(), msg("warm-up", payload{Do: "start", BusinessKey: testenv.Unique("warm-up")}))
	if err != nil || out.Disposition != inbox.Ack {
		b.Fatalf("warm-up: %+v, %v", out, err)
	}
}

// report adds the rate and the round trips per message.
func report(b *testing.B, trips *atomic.Int64) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "messages/s")
	b.ReportMetric(float64(trips.Load())/float64(b.N), "roundtrips/op")
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
