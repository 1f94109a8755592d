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

	got := testenv.KafkaRecords(t, []string{node.Addr()}, topic)
	lost, misordered, dups := testenv.KafkaOrder(added(events), got, outbox.KafkaHeaderMessageID)
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

// added is the events as testenv.KafkaOrder takes them.
func added(events []outbox.Event) []testenv.Added {
	out := make([]testenv.Added, len(events))
	for i, e := range events {
		out[i] = testenv.Added{ID: e.MessageID, Key: e.OrderingKey}
	}
	return out
}
