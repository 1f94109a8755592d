package testenv

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A record the broker acknowledged (acks=all, idempotent: franz-go's defaults) and the
// offset a consumer group committed after reading it survive a SIGKILL of the broker's
// JVM and its restart on the same data directory and ports.
func TestKafkaKeepsAcknowledgedRecordsAcrossKill(t *testing.T) {
	t.Parallel()
	n := StartKafka(t)
	ctx := Context(t, time.Minute)
	topic, group := Unique("kafka-kill"), Unique("kafka-kill-group")
	value := []byte(Unique("kept"))

	producer := kafkaClient(t, n.Addr(), kgo.DefaultProduceTopic(topic), kgo.AllowAutoTopicCreation())
	if err := producer.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: value}).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	closeKafka(producer)

	consumer := kafkaClient(t, n.Addr(), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	got := pollOne(ctx, t, consumer)
	if string(got.Value) != string(value) {
		t.Fatalf("the group read %q, want %q", got.Value, value)
	}
	if err := consumer.CommitRecords(ctx, got); err != nil {
		t.Fatalf("commit: %v", err)
	}
	closeKafka(consumer) // leaves the group

	n.Kill(t)
	n.Restart(t)

	// The record is in the log again: a reader without a group, from the start.
	reader := kafkaClient(t, n.Addr(), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	again := pollOne(ctx, t, reader)
	if string(again.Value) != string(value) || again.Partition != got.Partition || again.Offset != got.Offset {
		t.Fatalf("after the restart: %q at %d/%d, want %q at %d/%d", again.Value, again.Partition, again.Offset, value, got.Partition, got.Offset)
	}
	// The group's commit is there again: the next record to read is the one after it.
	adm := kadm.NewClient(kafkaClient(t, n.Addr()))
	var offsets kadm.OffsetResponses
	Eventually(t, 30*time.Second, "the group's committed offsets after the restart", func() (bool, error) {
		var err error
		offsets, err = adm.FetchOffsets(ctx, group)
		if err == nil {
			err = offsets.Error()
		}
		return err == nil, err
	})
	o, ok := offsets.Lookup(topic, got.Partition)
	if !ok || o.At != got.Offset+1 {
		t.Fatalf("the group's committed offset on %s/%d after the restart: %+v (found %v), want %d", topic, got.Partition, o, ok, got.Offset+1)
	}
}

// The shared broker (make up: services/kafka-up.sh) answers, and takes and serves a record.
func TestSharedKafka(t *testing.T) {
	t.Parallel()
	brokers := Kafka(t)
	ctx := Context(t, 30*time.Second)
	topic := Unique("kafka-shared")
	cl := kafkaClient(t, brokers, kgo.DefaultProduceTopic(topic), kgo.AllowAutoTopicCreation(),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("hello")}).FirstErr(); err != nil {
		t.Fatalf("produce to %s: %v", brokers, err)
	}
	if got := pollOne(ctx, t, cl); string(got.Value) != "hello" {
		t.Fatalf("read %q, want hello", got.Value)
	}
}

// kafkaClient is a franz-go client on addr, closed at cleanup unless closeKafka closed it.
func kafkaClient(t testing.TB, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeKafka(cl) })
	return cl
}

var closedKafka sync.Map // *kgo.Client -> struct{}

// closeKafka closes cl once: a second Close of a client is not documented as harmless.
func closeKafka(cl *kgo.Client) {
	if _, done := closedKafka.LoadOrStore(cl, struct{}{}); !done {
		cl.Close()
	}
}

// pollOne polls cl until it returns a record, and returns the first.
func pollOne(ctx context.Context, t testing.TB, cl *kgo.Client) *kgo.Record {
	t.Helper()
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("no record before the deadline: %v", err)
		}
		for _, fe := range fs.Errors() {
			if !errors.Is(fe.Err, context.DeadlineExceeded) {
				t.Logf("fetch %s/%d: %v (retried)", fe.Topic, fe.Partition, fe.Err)
			}
		}
		if recs := fs.Records(); len(recs) > 0 {
			return recs[0]
		}
	}
}
