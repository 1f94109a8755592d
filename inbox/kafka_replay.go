package inbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/extworker/extworker/internal/digest"
	"github.com/extworker/extworker/internal/kafkarec"
)

// ReplayKafka sends parked messages from topic's dead-letter topic back to topic: those
// whose stored message id selected returns true for, and whose inbox row is still parked
// with the body the record carries. A dead-letter topic is a log: its records stay, and
// ReplayKafka reads it whole each time, up to its end when it began; a record whose row
// is no longer parked (replayed before, or settled since) counts as Kept. Each row goes
// back to received as Replay says, then the record is written to topic (its key, value
// and headers, less the consumer's reason, digest, attempt and due headers) and
// acknowledged by the broker: a replay that fails half-way may be run again. opts are
// further franz-go options (TLS, SASL).
func ReplayKafka(ctx context.Context, pool *pgxpool.Pool, brokers []string, topic string, selected func(id string) bool, opts ...kgo.Opt) (ReplayReport, error) {
	var rep ReplayReport
	dead := DeadLetterQueue(topic)
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(dead),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.RequiredAcks(kgo.AllISRAcks())}, opts...)...)
	if err != nil {
		return rep, fmt.Errorf("inbox: replay: Kafka client: %w", err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, dead)
	if err != nil {
		return rep, fmt.Errorf("inbox: replay: the end of %s: %w", dead, err)
	}
	left := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	for len(left) > 0 {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("inbox: replay: %w", err)
		}
		for _, r := range fetches.Records() {
			if end, ok := left[r.Partition]; ok && r.Offset < end {
				if err := replayRecord(ctx, pool, cl, topic, r, selected, &rep); err != nil {
					return rep, err
				}
			}
			if r.Offset+1 >= left[r.Partition] {
				delete(left, r.Partition)
			}
		}
	}
	return rep, nil
}

// replayRecord replays one parked record, if selected and still parked, recording what it
// did in rep.
func replayRecord(ctx context.Context, pool *pgxpool.Pool, cl *kgo.Client, topic string, r *kgo.Record, selected func(string) bool, rep *ReplayReport) error {
	m := kafkaMessage(r, false)
	id := ""
	if m.ID != "" {
		id = StoredID(m.ID)
	}
	switch {
	case !selected(id):
		rep.Kept++
		return nil
	case m.ID == "" || !storable(m.ID) || !storable(m.Type) || !storable(m.CorrelationID):
		rep.Unreplayable = append(rep.Unreplayable, id)
		return nil
	}
	reopened, err := reopen(ctx, pool, kafkarec.Header(r, HeaderSource), id, digest.Bytes(r.Value))
	if err != nil {
		return err
	}
	if !reopened {
		rep.Kept++
		return nil
	}
	drop := map[string]string{HeaderReason: "", HeaderDigest: "", HeaderAttempt: "", HeaderDue: ""}
	if err := kafkarec.Produce(ctx, cl, &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: withHeaders(r.Headers, drop)}); err != nil {
		return fmt.Errorf("inbox: replay %s: %w", id, err)
	}
	rep.Replayed = append(rep.Replayed, id)
	return nil
}
