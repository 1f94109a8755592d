package soak

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/kafkarec"
)

// newKafkaTap is the tap on Kafka at brokers (host:port): it reads the topic invoice.paid
// and watches the workers' group; the workers' inbox records the events under
// inbox.KafkaSource(paidSource, paidTopic).
func newKafkaTap(brokers string) *tap {
	t := newTap(brokers, "")
	t.kafka, t.source = true, inbox.KafkaSource(paidSource, paidTopic)
	return t
}

// kafkaEnv is the workers' environment for their events on Kafka at brokers: the demo's
// setting, the brokers, and the relay publishing there.
func kafkaEnv(brokers string) []string {
	return []string{"EXTWORKER_DEMO_EVENTS=kafka", "EXTWORKER_KAFKA_BROKERS=" + brokers, "EXTWORKER_OUTBOX_BROKER=kafka"}
}

// declareKafka creates the topic before any worker runs (as the broker would on its
// first use, with its default partitions), so that the tap reads it from its first record.
func (t *tap) declareKafka() error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(t.url))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = kadm.NewClient(cl).CreateTopic(ctx, -1, -1, nil, paidTopic)
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return err
	}
	return nil
}

// runKafka reads every partition of the topic from its start, outside any group, until
// ctx ends (its client reconnects after the broker dies), and meanwhile watches the
// workers' group.
func (t *tap) runKafka(ctx context.Context) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(t.url), kgo.ConsumeTopics(paidTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return
	}
	defer cl.Close()
	watched := make(chan struct{})
	go func() { t.watchGroup(ctx, kadm.NewClient(cl)); close(watched) }()
	defer func() { <-watched }()
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return
		}
		fetches.EachRecord(func(r *kgo.Record) {
			t.record(kafkarec.Header(r, inbox.HeaderMessageID), r.Value)
		})
	}
}

// groupWatchEvery is how often the tap describes the workers' group.
const groupWatchEvery = 200 * time.Millisecond

// watchGroup describes the workers' consumer group every groupWatchEvery until ctx ends
// and counts its rebalances as it can see them (rebalanceCounter).
func (t *tap) watchGroup(ctx context.Context, adm *kadm.Client) {
	var rc rebalanceCounter
	tick := time.NewTicker(groupWatchEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		gs, err := adm.DescribeGroups(dctx, shippingGroup)
		cancel()
		g, ok := gs[shippingGroup]
		if err != nil || !ok || g.Err != nil {
			continue
		}
		if rc.observe(g.State, groupMembers(g)) {
			t.rebalances.Add(1)
		}
	}
}

// rebalanceCounter counts a classic consumer group's rebalances from its described
// states: one each time the group is seen rebalancing (PreparingRebalance or
// CompletingRebalance) after it was seen settled (Stable or Empty), and one each time its
// stable members differ from the last stable members seen with no rebalance seen between
// (one that began and ended between two looks). Rebalances that follow each other
// between two looks and end with the members they began with are not seen: the count is
// a lower bound. The first look is the baseline.
type rebalanceCounter struct {
	looked      bool
	rebalancing bool   // the last look saw the group rebalancing
	stable      string // the members at the last stable look
}

// observe takes one look at the group, its state and its members; it reports whether a
// rebalance is counted.
func (c *rebalanceCounter) observe(state, members string) bool {
	first := !c.looked
	c.looked = true
	switch state {
	case "PreparingRebalance", "CompletingRebalance":
		counted := !c.rebalancing && !first
		c.rebalancing = true
		return counted
	case "Stable":
		counted := !c.rebalancing && !first && members != c.stable
		c.rebalancing, c.stable = false, members
		return counted
	case "Empty":
		c.rebalancing, c.stable = false, ""
	}
	return false
}

// groupMembers is the group's member ids, sorted and joined: its membership.
func groupMembers(g kadm.DescribedGroup) string {
	ids := make([]string, 0, len(g.Members))
	for _, m := range g.Members {
		ids = append(ids, m.MemberID)
	}
	slices.Sort(ids)
	return strings.Join(ids, ",")
}
