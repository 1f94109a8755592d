package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
	"github.com/extworker/extworker/outbox"
)

// Crash point "Kafka broker restarted mid-stream" (docs/reliability.md, "Kafka"): a
// private broker is SIGKILLed while a relay with a KafkaPublisher publishes a stream of
// events on four ordering keys, more events are added while it is down, and it is started
// again on its data. Every event's message id reaches the topic (at least once), and per
// ordering key the first occurrences are in the order the events were added. The relay
// and the publisher reconnect by themselves. (The relay SIGKILLed at its failpoints is
// inbox.TestKafkaRelayKilled: the crash rows' child processes are the inbox tests'.)
func TestKafkaBrokerKilledMidPublish(t *testing.T) {
	t.Parallel()
	pool := testenv.DB(t)
	migrateOnce.Do(func() {
		_, err := migrations.Up(context.Background(), stdlib.OpenDBFromPool(pool))
		require.NoError(t, err)
	})
	node := testenv.StartKafka(t)
	ctx := testenv.Context(t, 3*time.Minute)
	ns, topic := testenv.Unique("ns"), testenv.Unique("topic")

	const (
		keys           = 4
		perKey         = 30
		publishTimeout = 2 * time.Second
		perTx          = 4
		total          = keys * perKey
		killAt         = 40 // the relay's 40th publish: some events of every key published, more waiting
		firstAdd       = total / 2
	)
	var events []outbox.Event
	for i := range perKey {
		for k := range keys {
			key := string(rune('A' + k))
			id := fmt.Sprintf("%s-%s-%03d", ns, key, i)
			events = append(events, outbox.Event{MessageID: id, Type: "invoice.paid", RoutingKey: topic, OrderingKey: key,
				Body: []byte(fmt.Sprintf(`{"invoice":%q}`, id))})
		}
	}
	add := func(from, to int) {
		for i := from; i < to; i += perTx {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			for _, ev := range events[i:min(i+perTx, to)] {
				require.NoError(t, outbox.Add(ctx, tx, ns, ev))
			}
			require.NoError(t, tx.Commit(ctx))
		}
	}

	var logs testenv.Buffer
	obs := &counter{}
	pub, err := outbox.NewKafkaPublisher([]string{node.Addr()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	rec := &recording{pub: pub, killAt: killAt, reach: make(chan struct{})}
	relay := outbox.NewRelay(pool, rec, outbox.RelayConfig{Namespace: ns, PollInterval: 20 * time.Millisecond,
		BackoffInitial: 100 * time.Millisecond, BackoffMax: time.Second, PublishTimeout: publishTimeout,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Observer: obs})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	})

	add(0, firstAdd)
	select {
	case <-rec.reach:
	case <-time.After(time.Minute):
		t.Fatalf("the relay did not reach its %dth publish within a minute (%d published, %d failed)", killAt, obs.published.Load(), obs.failed.Load())
	}
	k := node.Kill(t)
	publishedBefore := obs.published.Load()
	add(firstAdd, total) // they wait in the outbox
	// The broker stays down until the relay has given up on the publish under way
	// (RelayConfig.PublishTimeout bounds each publish), or for that timeout and 3s more.
	gaveUp := func() bool {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for deadline := k.At.Add(publishTimeout + 3*time.Second); time.Now().Before(deadline); <-tick.C {
			if obs.failed.Load() > 0 {
				return true
			}
		}
		return false
	}()
	node.Restart(t)
	up := time.Now()

	testenv.Eventually(t, time.Minute, "the outbox backlog to empty after the broker's restart", func() (bool, error) {
		bl, err := outbox.ReadBacklog(ctx, pool, ns)
		return err == nil && bl.Unpublished == 0, err
	})
	recovered := time.Since(up)
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the relay's Run did not return within 10s of its context's end (a publish hangs?)")
	}

	got := kafkaRecords(t, []string{node.Addr()}, topic)
	lost, misordered, dups := kafkaOrder(events, got)
	assert.Empty(t, lost, "events lost")
	assert.Empty(t, misordered, "first occurrences out of their key's order")
	for _, a := range rec.overlapping(k.At, up) {
		t.Logf("publish of %s under way while the broker was down: began %v after the SIGKILL, took %v: %v",
			a.id, a.start.Sub(k.At).Round(time.Millisecond), a.end.Sub(a.start).Round(time.Millisecond), a.err)
		assert.LessOrEqual(t, a.end.Sub(a.start), publishTimeout+time.Second,
			"the publish of %s outlived the relay's PublishTimeout %v (KafkaPublisher.Publish waits for a record sent to a dead broker until it is back)", a.id, publishTimeout)
	}
	assert.True(t, gaveUp, "the relay gave up on no publish within PublishTimeout of the SIGKILL, the broker still down")
	t.Logf("%d events, %d records, %d duplicates %v; %d published before the kill, %d failed publishes; backlog empty %v after the restart",
		total, len(got), len(dups), dups, publishedBefore, obs.failed.Load(), recovered.Round(time.Millisecond))
}

// kafkaRecords reads topic from its start to its end offsets (as they are when it is
// called): every record on it, each partition's in order.
func kafkaRecords(t *testing.T, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	require.NoError(t, err)
	require.NoError(t, ends.Error())
	left := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	var out []*kgo.Record
	for len(left) > 0 {
		f := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "reading %s: partitions not read to their end: %v", topic, left)
		f.EachRecord(func(r *kgo.Record) {
			out = append(out, r)
			if end, ok := left[r.Partition]; ok && r.Offset+1 >= end {
				delete(left, r.Partition)
			}
		})
	}
	return out
}

// kafkaOrder compares the records on a topic (each partition's in order) with the events
// in the order they were added: the events whose message id is on no record, the
// records whose event came first before an earlier event of its ordering key did (or
// that are no event's), and the ids that came more than once.
func kafkaOrder(events []outbox.Event, recs []*kgo.Record) (lost, misordered, dups []string) {
	index := map[string]int{}
	for i, ev := range events {
		index[ev.MessageID] = i
	}
	seen := map[string]int{}
	last := map[string]int{} // per ordering key, the index of the last first occurrence
	for _, r := range recs {
		id := ""
		for _, h := range r.Headers {
			if h.Key == outbox.KafkaHeaderMessageID {
				id = string(h.Value)
			}
		}
		i, ok := index[id]
		if !ok {
			misordered = append(misordered, "unknown id "+id)
			continue
		}
		if seen[id]++; seen[id] > 1 {
			dups = append(dups, id)
			continue
		}
		key := events[i].OrderingKey
		if prev, ok := last[key]; ok && prev > i {
			misordered = append(misordered, fmt.Sprintf("%s after %s", id, events[prev].MessageID))
		}
		last[key] = i
	}
	for _, ev := range events {
		if seen[ev.MessageID] == 0 {
			lost = append(lost, ev.MessageID)
		}
	}
	return lost, misordered, dups
}
