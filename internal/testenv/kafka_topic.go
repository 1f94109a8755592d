package testenv

import (
	"fmt"
	"testing"
	"time"

	"github.com/extworker/extworker/internal/kafkarec"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// KafkaRecords reads topic from its start to its end offsets (as they are when it is
// called): every record on it, each partition's in order.
func KafkaRecords(t testing.TB, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	ctx := Context(t, time.Minute)
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

// Added is an event as a producer added it: its message id and its ordering key.
type Added struct{ ID, Key string }

// KafkaOrder compares the records on a topic (each partition's in order), whose message
// ids are in their idHeader, with the events in the order they were added: the events
// whose id is on no record, the records whose event came first before an earlier event
// of its ordering key did (or that are no event's), and the ids that came more than once.
func KafkaOrder(added []Added, recs []*kgo.Record, idHeader string) (lost, misordered, dups []string) {
	index := map[string]int{}
	for i, a := range added {
		index[a.ID] = i
	}
	seen := map[string]int{}
	last := map[string]int{} // per ordering key, the index of the last first occurrence
	for _, r := range recs {
		id := kafkarec.Header(r, idHeader)
		i, ok := index[id]
		if !ok {
			misordered = append(misordered, "unknown id "+id)
			continue
		}
		if seen[id]++; seen[id] > 1 {
			dups = append(dups, id)
			continue
		}
		key := added[i].Key
		if prev, ok := last[key]; ok && prev > i {
			misordered = append(misordered, fmt.Sprintf("%s after %s", id, added[prev].ID))
		}
		last[key] = i
	}
	for _, a := range added {
		if seen[a.ID] == 0 {
			lost = append(lost, a.ID)
		}
	}
	return lost, misordered, dups
}
