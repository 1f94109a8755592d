package inbox_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/inbox/callback"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

// The consume side's cost per message, against the real PostgreSQL, RabbitMQ, Kafka and
// engine (make up):
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

// BenchmarkConsume is the consume side end to end, per transport: b.N messages wait for
// the consumer first (not timed), then it takes them until the inbox has recorded every
// one as processed; ns/op is per message. The time includes the consumer's connecting
// (once per run) and up to one poll of the inbox (every 2ms) after the last message.
//
//   - ignore: Action{Ignore}, so that the engine is not the bottleneck;
//   - start: each message starts a process instance in the real engine.
//
// And the transports, side by side:
//
//   - rabbitmq: published to a fresh queue (with confirms); a Consumer (Run, the default
//     Concurrency of 4) consumes them, declaring its queues first;
//   - kafka: produced to a fresh topic on the shared broker (3 partitions, acknowledged);
//     a KafkaConsumer (Run, Concurrency 4) in a fresh group reads them from the start,
//     committing each poll's offsets per partition once its rows are settled;
//   - callback: signed (Standard Webhooks, before the timer) and POSTed to a
//     callback.Server over loopback HTTP, 4 at a time, each answered once its row is
//     settled (200): the signature check is timed, the provider's signing is not.
func BenchmarkConsume(b *testing.B) {
	for _, name := range []string{"ignore", "start"} {
		b.Run(name, func(b *testing.B) {
			for _, transport := range []string{"rabbitmq", "kafka", "callback"} {
				b.Run(transport, func(b *testing.B) { benchConsume(b, name, transport) })
			}
		})
	}
}

func benchConsume(b *testing.B, name, transport string) {
	e, trips := benchEnv(b, name == "start")
	decide := ignore
	if name == "start" {
		decide = e.decide
	}
	run := testenv.Unique("BK")
	msgs := benchMessages(b.N, func(i int) payload { return payload{Do: name, BusinessKey: fmt.Sprintf("%s-%06d", run, i)} })
	poll := testenv.DB(b) // the polls are not the consumer's round trips
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		h       *inbox.Handler
		source  = e.source
		consume func() error // runs until ctx ends, or sends every message
	)
	switch transport {
	case "rabbitmq":
		cfg := inbox.Config{Source: e.source, Queue: testenv.Unique("bench-q")}
		c := benchConsumer(b, e, decide, cfg)
		publish(b, cfg, msgs)
		h, consume = c.Handler, func() error { return c.Run(ctx) }
	case "kafka":
		brokers := []string{testenv.Kafka(b)}
		topic := testenv.Unique("bench-topic")
		c, err := inbox.NewKafkaConsumer(e.pool, e.engine, decide, inbox.Config{Source: e.source, Queue: topic},
			inbox.KafkaConfig{Brokers: brokers, Group: testenv.Unique("bench-group")})
		if err != nil {
			b.Fatal(err)
		}
		produce(b, brokers, topic, msgs)
		h, source, consume = c.Handler, inbox.KafkaSource(e.source, topic), func() error { return c.Run(ctx) }
	case "callback":
		var send func(ctx context.Context, i int) error
		h, send = callbackServer(b, e, decide, msgs)
		consume = func() error { return sendAll(ctx, b.N, 4, send) }
	}
	done := make(chan error, 1)
	trips.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	go func() { done <- consume() }()
	if transport == "callback" { // each callback answered once its row is settled
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		done <- nil
	}
	waitRecorded(b, h, poll, source, b.N)
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	report(b, trips)
	s := h.Stats()
	if s.Retried.Load() != 0 || s.Parked.Load() != 0 || s.Duplicates.Load() != 0 {
		b.Fatalf("retried %d, parked %d, duplicates %d: want none", s.Retried.Load(), s.Parked.Load(), s.Duplicates.Load())
	}
	if name == "start" && s.Started.Load() != int64(b.N) {
		b.Fatalf("started %d, want %d", s.Started.Load(), b.N)
	}
}

// produce writes msgs to topic as the outbox's KafkaPublisher does (each message its own
// record key and its headers), all at once, and waits for the broker's acknowledgements.
func produce(b *testing.B, brokers []string, topic string, msgs []inbox.Message) {
	b.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.AllowAutoTopicCreation(), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(m.ID), Value: m.Body, Headers: []kgo.RecordHeader{
			{Key: inbox.HeaderMessageID, Value: []byte(m.ID)}, {Key: inbox.HeaderType, Value: []byte(m.Type)},
			{Key: inbox.HeaderCorrelationID, Value: []byte(m.CorrelationID)}}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		b.Fatal(err)
	}
}

// callbackServer serves a callback.Server for a source of the handler's own over loopback
// HTTP (closed at cleanup), and returns the handler and send, which POSTs the i-th of
// msgs, signed before the timer, and checks it is answered 200.
func callbackServer(b *testing.B, e env, decide inbox.Decide, msgs []inbox.Message) (*inbox.Handler, func(context.Context, int) error) {
	b.Helper()
	h, err := inbox.NewHandler(e.pool, e.engine, decide, inbox.Config{Source: e.source})
	if err != nil {
		b.Fatal(err)
	}
	const secret = "whsec_c2VjcmV0LWtleS1vZi1hdC1sZWFzdC0yNC1ieXRlcw=="
	srv, err := callback.New(e.pool, []callback.Source{{Handler: h, Secrets: []string{secret}}}, callback.Config{})
	if err != nil {
		b.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/callbacks/{source}", srv)
	hs := httptest.NewServer(mux)
	b.Cleanup(hs.Close)
	key, err := callback.ParseSecret(secret)
	if err != nil {
		b.Fatal(err)
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	sigs := make([]string, len(msgs))
	for i, m := range msgs {
		sigs[i] = callback.Sign(key, m.ID, ts, m.Body)
	}
	url := hs.URL + "/callbacks/" + e.source
	client := hs.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = 8
	return h, func(ctx context.Context, i int) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(msgs[i].Body))
		if err != nil {
			return err
		}
		req.Header.Set(callback.HeaderID, msgs[i].ID)
		req.Header.Set(callback.HeaderTimestamp, ts)
		req.Header.Set(callback.HeaderSignature, sigs[i])
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("callback %s answered %d", msgs[i].ID, resp.StatusCode)
		}
		return nil
	}
}

// sendAll calls send for 0..n-1, at most conc at a time, and returns the first error.
func sendAll(ctx context.Context, n, conc int, send func(context.Context, int) error) error {
	var next atomic.Int64
	errs := make(chan error, conc)
	for range conc {
		go func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					errs <- nil
					return
				}
				if err := send(ctx, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var first error
	for range conc {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// waitRecorded waits until n messages of source are processed in the inbox: it asks the
// database every 2ms once the handler has received n deliveries (an atomic read until
// then).
func waitRecorded(b *testing.B, h *inbox.Handler, pool *pgxpool.Pool, source string, n int) {
	b.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if h.Stats().Received.Load() >= int64(n) {
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
			b.Fatalf("%d of %d messages received after 5m", h.Stats().Received.Load(), n)
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
