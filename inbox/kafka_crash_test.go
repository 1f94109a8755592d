package inbox_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/failpoint"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
	"github.com/extworker/extworker/outbox"
)

// The crash-point rows of the events over Kafka (docs/reliability.md, "Kafka"): a
// KafkaConsumer or a relay with a KafkaPublisher in a child process (crash_test.go's
// child, modes "kafka-consume" and "kafka-relay") killed by SIGKILL at a failpoint, and a
// private broker SIGKILLed under a consumer. Each row asserts: nothing lost, no process
// started twice, no message correlated twice; for the relay, every event on the topic at
// least once and, per ordering key, first in the order the events were added.

// kafkaChildOptions are the child consumer's group settings: its session expires 6s after
// its SIGKILL (the broker's minimum; 45s by default), so that the consumer taking over
// the group is not kept waiting for the dead member.
var kafkaChildOptions = []kgo.Opt{kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(time.Second)}

// kafkaChild runs the Kafka modes of child: a KafkaConsumer of the topic _QUEUE in the
// group _GROUP ("kafka-consume"), or a relay of the namespace _NS with a KafkaPublisher
// ("kafka-relay"), on the brokers _BROKERS, until the failpoint kills it.
func kafkaChild(ctx context.Context, pool *pgxpool.Pool, mode string) error {
	brokers := strings.Split(os.Getenv(childEnv+"_BROKERS"), ",")
	if mode == "kafka-relay" {
		pub, err := outbox.NewKafkaPublisher(brokers)
		if err != nil {
			return err
		}
		defer pub.Close()
		return outbox.NewRelay(pool, pub, outbox.RelayConfig{Namespace: os.Getenv(childEnv + "_NS"), PollInterval: 50 * time.Millisecond}).Run(ctx)
	}
	// The short tier: the quick client of the test's consumers, so that a dead attempt's
	// request cannot land after the in-flight window of the consumer that takes over, and
	// a short session. The defaults tier: the shipped settings throughout.
	ccfg, cfg := camunda7.Config{BaseURL: testenv.EngineURL(), Timeout: quickTimeout, LongPollMargin: quickTimeout},
		inbox.Config{Source: os.Getenv(childEnv + "_SOURCE"), Queue: os.Getenv(childEnv + "_QUEUE"), InFlightWindow: quickWindow}
	kc := inbox.KafkaConfig{Brokers: brokers, Group: os.Getenv(childEnv + "_GROUP"), Options: kafkaChildOptions}
	if os.Getenv(childEnv+"_TIER") == "defaults" {
		ccfg, cfg.InFlightWindow, kc.Options = camunda7.Config{BaseURL: testenv.EngineURL()}, 0, nil
	}
	ec, err := camunda7.New(ccfg)
	if err != nil {
		return err
	}
	e := env{ship: os.Getenv(childEnv + "_SHIP"), wait: os.Getenv(childEnv + "_WAIT"), paid: os.Getenv(childEnv + "_PAID")}
	c, err := inbox.NewKafkaConsumer(pool, admin.New(ec), e.decide, cfg, kc)
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

func (k kafkaEnv) childVars(group string) []string {
	return []string{childEnv + "_SOURCE=" + k.source, childEnv + "_QUEUE=" + k.topic, childEnv + "_GROUP=" + group,
		childEnv + "_BROKERS=" + strings.Join(k.brokers, ","), childEnv + "_SHIP=" + k.ship, childEnv + "_WAIT=" + k.wait,
		childEnv + "_PAID=" + k.paid}
}

// kafkaStream is a stream of messages, n starts and n correlations, each with a business
// key of its own (the correlations' instances waiting), interleaved; each message its own
// record key, so that they spread over the topic's partitions.
type kafkaStream struct {
	msgs               []inbox.Message
	starts, correlates []string // business keys
}

func (k kafkaEnv) stream(t *testing.T, prefix string, n int) kafkaStream {
	t.Helper()
	var s kafkaStream
	for i := range n {
		bkS, bkC := testenv.Unique("INV"), testenv.Unique("INV")
		k.startWaiting(t, bkC)
		s.starts, s.correlates = append(s.starts, bkS), append(s.correlates, bkC)
		s.msgs = append(s.msgs, msg(fmt.Sprintf("%s-s%02d-%s", prefix, i, bkS), payload{Do: "start", BusinessKey: bkS}),
			msg(fmt.Sprintf("%s-c%02d-%s", prefix, i, bkC), payload{Do: "correlate", BusinessKey: bkC}))
	}
	return s
}

// actedOnce waits until every message of s is processed in the inbox, then asserts that
// the engine acted once for each: one instance per start, one correlation per correlation.
func (k kafkaEnv) actedOnce(t *testing.T, s kafkaStream) {
	t.Helper()
	for _, m := range s.msgs {
		k.state(t, m.ID, inbox.StateProcessed)
	}
	for _, bk := range s.starts {
		assert.Equal(t, 1, k.instances(t, k.ship, bk), "instances started for %s", bk)
	}
	for _, bk := range s.correlates {
		assert.Equal(t, 1, k.correlations(t, bk), "correlations of %s", bk)
	}
}

// rowStates counts the inbox rows of the topic by state.
func (k kafkaEnv) rowStates(t *testing.T) map[inbox.State]int {
	t.Helper()
	rows, err := inbox.List(testenv.Context(t, 10*time.Second), k.pool, inbox.Filter{Source: inbox.KafkaSource(k.source, k.topic)})
	require.NoError(t, err)
	out := map[inbox.State]int{}
	for _, r := range rows {
		out[r.State]++
	}
	return out
}

// runKafka runs c until the test ends.
func runKafka(t *testing.T, c *inbox.KafkaConsumer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("the Kafka consumer did not stop within 30s")
		}
	})
}

// TestKafkaConsumerKilled: a KafkaConsumer dies by SIGKILL with a record in hand, its
// offset not committed: after the engine acted on it and before its inbox row was
// settled (inbox-after-engine), or after the row was settled (inbox-after-ack: on Kafka,
// before the offset is committed). A consumer of the same group takes the partitions
// over once the dead member's session has expired, and is given the record again (and
// the others the dead one had not committed): it reconciles the first case from the
// engine, answers the second from the inbox, and acts on the rest. Nothing is lost, no
// process is started twice, no message is correlated twice.
func TestKafkaConsumerKilled(t *testing.T) {
	for _, tc := range []struct{ tier, point string }{
		{"defaults", failpoint.InboxAfterEngine}, {"short", failpoint.InboxAfterEngine}, {"short", failpoint.InboxAfterAck},
	} {
		t.Run(tc.tier+"/"+tc.point, func(t *testing.T) {
			k := newKafkaEnv(t)
			group := testenv.Unique("group")
			s := k.stream(t, "kc", 3)
			k.publish(t, s.msgs...)
			killedAt(t, "kafka-consume", tc.point, append(k.childVars(group), childEnv+"_TIER="+tc.tier)...)

			left := k.rowStates(t)
			t.Logf("inbox rows the dead consumer left: %v", left)
			if tc.point == failpoint.InboxAfterEngine {
				assert.Positive(t, left[inbox.StateProcessing], "the row of the message the engine acted on is not settled")
			} else {
				assert.Positive(t, left[inbox.StateProcessed], "the row of the message at the failpoint is settled")
			}
			c := k.takeOver(t, group, tc.tier)
			k.actedOnce(t, s)
			st := c.Stats()
			t.Logf("the consumer that took over: received %d, started %d, correlated %d, reconciled %d, duplicates %d, retried %d",
				st.Received.Load(), st.Started.Load(), st.Correlated.Load(), st.Reconciled.Load(), st.Duplicates.Load(), st.Retried.Load())
			if tc.point == failpoint.InboxAfterEngine {
				assert.GreaterOrEqual(t, st.Reconciled.Load(), int64(1), "the dead attempt's action found in the engine")
			} else {
				assert.GreaterOrEqual(t, st.Duplicates.Load(), int64(1), "the settled, uncommitted record delivered again and answered from the inbox")
			}
			assert.Zero(t, st.DuplicateStarts.Load())
			assert.Zero(t, st.Parked.Load())
		})
	}
}

// takeOver runs a consumer of the group that takes over from a dead one: at the shipped
// settings (the defaults tier: it waits out the dead member's session, 10s, and the
// in-flight window, 1m), or the short tier's.
func (k kafkaEnv) takeOver(t *testing.T, group, tier string) *inbox.KafkaConsumer {
	t.Helper()
	engine, cfg := admin.New(quickClient(t, testenv.EngineURL(), quickTimeout)),
		inbox.Config{Source: k.source, Queue: k.topic, InFlightWindow: quickWindow, BackoffInitial: 200 * time.Millisecond, BackoffMax: time.Second}
	if tier == "defaults" {
		engine, cfg = k.engine, inbox.Config{Source: k.source, Queue: k.topic}
	}
	c, err := inbox.NewKafkaConsumer(k.pool, engine, k.decide, cfg, inbox.KafkaConfig{Brokers: k.brokers, Group: group})
	require.NoError(t, err)
	runKafka(t, c)
	return c
}

// TestKafkaBrokerKilledMidBatch: the broker (a private one) is SIGKILLed while a consumer
// is in the middle of a poll's records (one held in its Decide until the broker is dead,
// the others going on), and is started again on its data. The consumer's commits fail
// meanwhile; it goes on by itself once the broker is back, and every message acts once.
func TestKafkaBrokerKilledMidBatch(t *testing.T) {
	node := testenv.StartKafka(t)
	k := newKafkaEnv(t)
	k.brokers = []string{node.Addr()}
	s := k.stream(t, "bk", 10)
	k.publish(t, s.msgs...)

	const holdAt = 8 // the eighth message decided
	var decided atomic.Int64
	held, resume := make(chan struct{}), make(chan struct{})
	decide := func(m inbox.Message) (inbox.Action, error) {
		if decided.Add(1) == holdAt {
			close(held)
			<-resume
		}
		return k.decide(m)
	}
	c, err := inbox.NewKafkaConsumer(k.pool, k.engine, decide,
		inbox.Config{Source: k.source, Queue: k.topic, BackoffInitial: 200 * time.Millisecond, BackoffMax: time.Second},
		inbox.KafkaConfig{Brokers: k.brokers, Group: testenv.Unique("group")})
	require.NoError(t, err)
	runKafka(t, c)
	select {
	case <-held:
	case <-time.After(time.Minute):
		close(resume)
		t.Fatalf("the consumer did not decide %d messages within a minute", holdAt)
	}
	node.Kill(t)
	settledWhileDown := k.rowStates(t)[inbox.StateProcessed]
	close(resume) // the held message acts, and its commit meets a dead broker
	node.Restart(t)

	k.actedOnce(t, s)
	st := c.Stats()
	t.Logf("%d messages; %d processed when the broker died; received %d, started %d, correlated %d, duplicates %d, retried %d",
		len(s.msgs), settledWhileDown, st.Received.Load(), st.Started.Load(), st.Correlated.Load(), st.Duplicates.Load(), st.Retried.Load())
	assert.Less(t, settledWhileDown, len(s.msgs), "the broker died mid-stream, with messages left")
	assert.Equal(t, int64(len(s.starts)), st.Started.Load(), "starts")
	assert.Equal(t, int64(len(s.correlates)), st.Correlated.Load(), "correlations")
	assert.Zero(t, st.DuplicateStarts.Load())
}

// TestKafkaRelayKilled: the outbox's relay, publishing to Kafka, dies by SIGKILL before a
// publish, or after the broker acknowledged one and before its pass marked it published
// (the pass's earlier events, published too, unmarked with it). A relay in the test
// publishes what is left. Every event's message id is on the topic at least once, and
// per ordering key the first occurrences are in the order the events were added.
func TestKafkaRelayKilled(t *testing.T) {
	for _, point := range []string{failpoint.OutboxBeforePublish, failpoint.OutboxAfterPublish} {
		t.Run(point, func(t *testing.T) {
			pool := testenv.DB(t)
			migrateOnce.Do(func() {
				_, err := migrations.Up(context.Background(), stdlib.OpenDBFromPool(pool))
				require.NoError(t, err)
			})
			brokers := []string{testenv.Kafka(t)}
			ns, topic := testenv.Unique("ns"), testenv.Unique("topic")
			ctx := testenv.Context(t, time.Minute)
			// Three keys, four events each, added one by one: a pass publishes one event per
			// key, so the fifth publish is in the second pass, after one of its events.
			var events []outbox.Event
			for i := range 4 {
				for _, key := range []string{"A", "B", "C"} {
					id := fmt.Sprintf("%s-%s-%d", ns, key, i)
					ev := outbox.Event{MessageID: id, Type: "invoice.paid", RoutingKey: topic, OrderingKey: key, Body: []byte(`{"n":"` + id + `"}`)}
					require.NoError(t, outbox.Add(ctx, pool, ns, ev))
					events = append(events, ev)
				}
			}

			killedAt(t, "kafka-relay", point+"@5", childEnv+"_NS="+ns, childEnv+"_BROKERS="+strings.Join(brokers, ","))
			backlog, err := outbox.ReadBacklog(ctx, pool, ns)
			require.NoError(t, err)
			assert.Equal(t, len(events)-3, backlog.Unpublished, "the first pass marked, the second not")

			pub, err := outbox.NewKafkaPublisher(brokers)
			require.NoError(t, err)
			t.Cleanup(func() { _ = pub.Close() })
			relay := outbox.NewRelay(pool, pub, outbox.RelayConfig{Namespace: ns})
			// The dead relay's transaction holds its pass's events until PostgreSQL has
			// noticed its connection closed; SKIP LOCKED passes over them until then.
			testenv.Eventually(t, 30*time.Second, "the second relay to publish every event", func() (bool, error) {
				if _, err := relay.PublishPending(ctx); err != nil {
					return false, err
				}
				b, err := relay.Backlog(ctx)
				return b.Unpublished == 0, err
			})

			got := testenv.KafkaRecords(t, brokers, topic)
			lost, misordered, dups := testenv.KafkaOrder(added(events), got, inbox.HeaderMessageID)
			t.Logf("%d events, %d records on the topic, duplicates %v", len(events), len(got), dups)
			assert.Empty(t, lost, "events lost")
			assert.Empty(t, misordered, "first occurrences out of their key's order")
			if point == failpoint.OutboxAfterPublish {
				assert.NotEmpty(t, dups, "the acknowledged, unmarked events published again")
			}
		})
	}
}

// added is the events as testenv.KafkaOrder takes them.
func added(events []outbox.Event) []testenv.Added {
	out := make([]testenv.Added, len(events))
	for i, e := range events {
		out[i] = testenv.Added{ID: e.MessageID, Key: e.OrderingKey}
	}
	return out
}
