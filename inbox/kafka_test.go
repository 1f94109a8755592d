package inbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/outbox"
)

// kafkaEnv is env with a topic of the test's own on the shared Kafka broker.
type kafkaEnv struct {
	env
	brokers []string
	topic   string
}

func newKafkaEnv(t *testing.T) kafkaEnv {
	t.Helper()
	return kafkaEnv{env: newEnv(t), brokers: []string{testenv.Kafka(t)}, topic: testenv.Unique("topic")}
}

// consumer runs a Kafka consumer of the topic in group until the test ends.
func (k kafkaEnv) consumer(t *testing.T, group string, replay bool, cfg inbox.Config) *inbox.KafkaConsumer {
	t.Helper()
	cfg.Source, cfg.Queue = k.source, k.topic
	cfg.BackoffInitial, cfg.BackoffMax = 200*time.Millisecond, time.Second
	c, err := inbox.NewKafkaConsumer(k.pool, k.engine, k.decide, cfg, inbox.KafkaConfig{Brokers: k.brokers, Group: group, Replay: replay})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// publish sends messages to the topic as the outbox's relay does.
func (k kafkaEnv) publish(t *testing.T, ms ...inbox.Message) {
	t.Helper()
	pub, err := outbox.NewKafkaPublisher(k.brokers)
	require.NoError(t, err)
	defer pub.Close()
	for _, m := range ms {
		require.NoError(t, pub.Publish(testenv.Context(t, 30*time.Second), outbox.Event{MessageID: m.ID, Type: m.Type,
			RoutingKey: k.topic, CorrelationID: m.CorrelationID, Body: m.Body}))
	}
}

// state waits until the inbox row of id is in state, and returns it.
func (k kafkaEnv) state(t *testing.T, id string, want inbox.State) inbox.Record {
	t.Helper()
	var r inbox.Record
	testenv.Eventually(t, 3*time.Minute, "inbox row "+id+" "+string(want), func() (bool, error) {
		rows, err := inbox.List(testenv.Context(t, 10*time.Second), k.pool, inbox.Filter{Source: inbox.KafkaSource(k.source, k.topic), MessageID: id})
		if err != nil || len(rows) == 0 {
			return false, err
		}
		r = rows[0]
		return r.State == want, nil
	})
	return r
}

// records reads every record of topic from the start until it has n.
func (k kafkaEnv) records(t *testing.T, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	var out []*kgo.Record
	ctx := testenv.Context(t, time.Minute)
	for len(out) < n && ctx.Err() == nil {
		out = append(out, cl.PollFetches(ctx).Records()...)
	}
	require.Len(t, out, n, "records in %s", topic)
	return out
}

// TestKafkaConsumer: over a real broker, the inbox's classification holds as over
// RabbitMQ: a start redelivered starts once, an early correlation waits in the retry
// topic (without holding up the partition) and is correlated once its instance waits, a
// conflicting copy goes to the dead-letter topic, and the topic is part of the identity.
func TestKafkaConsumer(t *testing.T) {
	k := newKafkaEnv(t)
	bkStart, bkEarly, bkLater := testenv.Unique("INV"), testenv.Unique("INV"), testenv.Unique("INV")
	start := msg("k-start", payload{Do: "start", BusinessKey: bkStart})
	early := msg("k-early", payload{Do: "correlate", BusinessKey: bkEarly})
	later := msg("k-later", payload{Do: "correlate", BusinessKey: bkLater})
	conflict := msg("k-start", payload{Do: "start", BusinessKey: bkStart, Note: "another body"})
	k.startWaiting(t, bkLater)
	k.publish(t, start, early, later, start, conflict)
	k.consumer(t, testenv.Unique("group"), false, inbox.Config{})

	k.state(t, "k-start", inbox.StateProcessed)
	k.state(t, "k-later", inbox.StateProcessed)
	r := k.state(t, "k-early", inbox.StateFailedRetryable)
	assert.Equal(t, 1, k.correlations(t, bkLater), "the message after the early one was not held up")
	k.startWaiting(t, bkEarly)
	k.state(t, "k-early", inbox.StateProcessed)
	assert.GreaterOrEqual(t, r.Attempts, 1)

	assert.Equal(t, 1, k.instances(t, k.ship, bkStart), "one start for two deliveries")
	assert.Equal(t, 1, k.correlations(t, bkEarly))
	dead := k.records(t, inbox.DeadLetterQueue(k.topic), 1)
	assert.Equal(t, conflict.Body, dead[0].Value, "the conflicting copy is parked")
	rows, err := inbox.List(testenv.Context(t, 10*time.Second), k.pool, inbox.Filter{Source: k.source, MessageID: "k-start"})
	require.NoError(t, err)
	assert.Empty(t, rows, "the topic is part of the source: a RabbitMQ consumer of source %s does not see it", k.source)
}

// TestKafkaReplayNeverStarts: a group reading history (KafkaConfig.Replay) correlates
// but never starts a process, and leaves no trace of the start it skipped: a live group
// that has not read the message yet still starts it, once (the replay recorded it as
// processed, and the live delivery was then suppressed as its duplicate).
func TestKafkaReplayNeverStarts(t *testing.T) {
	k := newKafkaEnv(t)
	bk, bkWait := testenv.Unique("INV"), testenv.Unique("INV")
	k.startWaiting(t, bkWait)
	k.publish(t, msg("r-start", payload{Do: "start", BusinessKey: bk}), msg("r-corr", payload{Do: "correlate", BusinessKey: bkWait}))
	replay := k.consumer(t, testenv.Unique("replay"), true, inbox.Config{})

	k.state(t, "r-corr", inbox.StateProcessed)
	testenv.Eventually(t, time.Minute, "the replay handled both", func() (bool, error) {
		return replay.Stats().Received.Load() == 2, nil
	})
	rows, err := inbox.List(testenv.Context(t, 10*time.Second), k.pool, inbox.Filter{Source: inbox.KafkaSource(k.source, k.topic), MessageID: "r-start"})
	require.NoError(t, err)
	assert.Empty(t, rows, "a replayed start leaves no row")
	assert.Equal(t, 0, k.instances(t, k.ship, bk), "a replay started a process")
	assert.Equal(t, 1, k.correlations(t, bkWait), "a replay still correlates, once")

	k.consumer(t, testenv.Unique("live"), false, inbox.Config{})
	k.state(t, "r-start", inbox.StateProcessed)
	assert.Equal(t, 1, k.instances(t, k.ship, bk), "the live group starts it, once")
	assert.Equal(t, 1, k.correlations(t, bkWait), "and does not correlate again")
}

// TestKafkaRebalanceMidMessage: a second consumer joins the group while the first holds
// a message in the middle of its handling; the rebalance waits for it, and every message
// acts once, none lost.
func TestKafkaRebalanceMidMessage(t *testing.T) {
	k := newKafkaEnv(t)
	group := testenv.Unique("group")
	var ms []inbox.Message
	for range 12 {
		bk := testenv.Unique("INV")
		k.startWaiting(t, bk)
		ms = append(ms, msg("rb-"+bk, payload{Do: "correlate", BusinessKey: bk}))
	}
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	slow := k
	slowDecide := func(m inbox.Message) (inbox.Action, error) {
		once.Do(func() { close(held); <-release })
		return k.decide(m)
	}
	c, err := inbox.NewKafkaConsumer(slow.pool, slow.engine, slowDecide, inbox.Config{Source: k.source, Queue: k.topic},
		inbox.KafkaConfig{Brokers: k.brokers, Group: group})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	k.publish(t, ms...)
	select {
	case <-held:
	case <-time.After(time.Minute):
		t.Fatal("the first consumer got no message")
	}
	k.consumer(t, group, false, inbox.Config{}) // joins: a rebalance, blocked by the message in hand
	close(release)
	for _, m := range ms {
		k.state(t, m.ID, inbox.StateProcessed)
	}
	for _, m := range ms {
		bk := m.ID[len("rb-"):]
		assert.Equal(t, 1, k.correlations(t, bk), "correlations of %s", bk)
	}
}

// TestKafkaReplayFromDeadLetterTopic: a message parked in the dead-letter topic (its
// consumer could not read it then) is replayed by ReplayKafka once the consumer can, and
// acts once; a second replay finds nothing parked and sends nothing.
func TestKafkaReplayFromDeadLetterTopic(t *testing.T) {
	k := newKafkaEnv(t)
	var readable atomic.Bool
	decide := func(m inbox.Message) (inbox.Action, error) {
		if !readable.Load() {
			return inbox.Action{}, errors.New("schema version unknown to this consumer")
		}
		return k.decide(m)
	}
	c, err := inbox.NewKafkaConsumer(k.pool, k.engine, decide, inbox.Config{Source: k.source, Queue: k.topic},
		inbox.KafkaConfig{Brokers: k.brokers, Group: testenv.Unique("group")})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	bk := testenv.Unique("INV")
	k.startWaiting(t, bk)
	k.publish(t, msg("p-1", payload{Do: "correlate", BusinessKey: bk}))
	k.state(t, "p-1", inbox.StateFailedFinal)
	k.records(t, inbox.DeadLetterQueue(k.topic), 1)

	readable.Store(true)
	all := func(string) bool { return true }
	rep, err := inbox.ReplayKafka(testenv.Context(t, time.Minute), k.pool, k.brokers, k.topic, all)
	require.NoError(t, err)
	assert.Equal(t, []string{"p-1"}, rep.Replayed)
	k.state(t, "p-1", inbox.StateProcessed)
	assert.Equal(t, 1, k.correlations(t, bk))

	again, err := inbox.ReplayKafka(testenv.Context(t, time.Minute), k.pool, k.brokers, k.topic, all)
	require.NoError(t, err)
	assert.Empty(t, again.Replayed, "nothing parked any more")
	assert.Equal(t, 1, again.Kept)
}
