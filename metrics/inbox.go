package metrics

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/extworker/extworker/inbox"
)

// InboxCollector exposes what the inbox's consumers did, and what of the inbox waits,
// at each scrape:
//
//	extworker_inbox_messages_total{queue,outcome}    deliveries handled, by outcome (below)
//	extworker_inbox_parked                           messages parked in a dead-letter queue for an operator
//	extworker_inbox_conflicts                        copies parked because their id came with another body
//	extworker_inbox_oldest_parked_age_seconds        how long the oldest parked message has waited
//	extworker_inbox_retrying                         messages waiting in a retry queue
//	extworker_inbox_parked_up                        1 if the scrape's query worked, else 0
//
// The outcomes are those of inbox.Stats: received (every delivery, duplicates and
// retries included), the classes started, correlated, reconciled, duplicate, ignored
// (late, or the start's key has its instance: recorded ignored_duplicate), the
// dispositions retried and parked (every parked delivery), conflict (a subset of
// parked), and duplicate-start. received is not the sum of the others. The class labels
// are inbox.Class constants, the words of the inbox's logs and traces.
// The gauges come from one query per scrape (inbox.ReadParked), bounded by a timeout;
// while it fails extworker_inbox_parked_up is 0 and the gauges are absent.
type InboxCollector struct {
	read    func(context.Context) (inbox.Parked, error)
	timeout time.Duration
	log     *slog.Logger

	mu    sync.Mutex
	stats map[string][]*inbox.Stats // by queue

	messages  *prometheus.Desc
	parked    *prometheus.Desc
	conflicts *prometheus.Desc
	oldest    *prometheus.Desc
	retrying  *prometheus.Desc
	up        *prometheus.Desc
}

// NewInboxCollector returns a collector reading what waits in the inbox with read
// (inbox.ReadParked on the consumers' pool, for their source or for all) for at most
// timeout (default 2s) per scrape. Add registers the consumers whose counts it reports.
func NewInboxCollector(read func(context.Context) (inbox.Parked, error), timeout time.Duration, logger *slog.Logger) *InboxCollector {
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &InboxCollector{read: read, timeout: timeout, log: logger, stats: map[string][]*inbox.Stats{},
		messages: prometheus.NewDesc(Namespace+"_inbox_messages_total",
			"Inbox deliveries by queue and outcome: received (every delivery), started, correlated, reconciled, duplicate, ignored, retried, parked, conflict (parked with another body under a known id), duplicate-start (a start that found more than one instance of its business key).",
			[]string{"queue", "outcome"}, nil),
		parked: prometheus.NewDesc(Namespace+"_inbox_parked",
			"Inbox messages parked in a dead-letter queue (failed_final), waiting for an operator.", nil, nil),
		conflicts: prometheus.NewDesc(Namespace+"_inbox_conflicts",
			"Copies parked because their message id came with another body; they stay in the dead-letter queue.", nil, nil),
		oldest: prometheus.NewDesc(Namespace+"_inbox_oldest_parked_age_seconds",
			"How long the oldest parked inbox message has been parked (0 when none is).", nil, nil),
		retrying: prometheus.NewDesc(Namespace+"_inbox_retrying",
			"Inbox messages waiting in a retry queue (failed_retryable or unknown).", nil, nil),
		up: prometheus.NewDesc(Namespace+"_inbox_parked_up",
			"1 if the last scrape's inbox query succeeded, else 0.", nil, nil),
	}
}

// Add reports st (inbox.Consumer.Stats) as queue's counts from now on; the counts of
// several consumers of one queue are summed.
func (c *InboxCollector) Add(queue string, st *inbox.Stats) {
	if st == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats[queue] = append(c.stats[queue], st)
}

// Describe implements prometheus.Collector.
func (c *InboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.messages
	ch <- c.parked
	ch <- c.conflicts
	ch <- c.oldest
	ch <- c.retrying
	ch <- c.up
}

// inboxOutcomes maps the outcome label to its inbox.Stats counter: a delivery's class
// (inbox.Class, the word its logs and traces use), the dispositions (retried, parked),
// every delivery (received), and the starts that found their key twice.
var inboxOutcomes = []struct {
	outcome string
	count   func(*inbox.Stats) int64
}{
	{"received", func(s *inbox.Stats) int64 { return s.Received.Load() }},
	{string(inbox.ClassStarted), func(s *inbox.Stats) int64 { return s.Started.Load() }},
	{string(inbox.ClassCorrelated), func(s *inbox.Stats) int64 { return s.Correlated.Load() }},
	{string(inbox.ClassReconciled), func(s *inbox.Stats) int64 { return s.Reconciled.Load() }},
	{string(inbox.ClassDuplicate), func(s *inbox.Stats) int64 { return s.Duplicates.Load() }},
	{string(inbox.ClassIgnored), func(s *inbox.Stats) int64 { return s.Ignored.Load() }},
	{"retried", func(s *inbox.Stats) int64 { return s.Retried.Load() }},
	{"parked", func(s *inbox.Stats) int64 { return s.Parked.Load() }},
	{string(inbox.ClassConflict), func(s *inbox.Stats) int64 { return s.Conflicts.Load() }},
	{"duplicate-start", func(s *inbox.Stats) int64 { return s.DuplicateStarts.Load() }},
}

// Collect implements prometheus.Collector.
func (c *InboxCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	for queue, sts := range c.stats {
		for _, o := range inboxOutcomes {
			var n int64
			for _, st := range sts {
				n += o.count(st)
			}
			ch <- prometheus.MustNewConstMetric(c.messages, prometheus.CounterValue, float64(n), queue, o.outcome)
		}
	}
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	p, err := c.read(ctx)
	if err != nil {
		c.log.Warn("querying the inbox's parked messages for metrics failed", slog.Any("error", err))
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(p.Messages))
	ch <- prometheus.MustNewConstMetric(c.conflicts, prometheus.GaugeValue, float64(p.Conflicts))
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, p.OldestAge.Seconds())
	ch <- prometheus.MustNewConstMetric(c.retrying, prometheus.GaugeValue, float64(p.Retrying))
}
