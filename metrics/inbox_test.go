package metrics_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/metrics"
)

// The inbox collector reports each added consumer's counts by queue and outcome (the
// consumers of one queue summed), and what waits in the inbox at each scrape: absent,
// with parked_up 0, when the query fails.
func TestInboxCollector(t *testing.T) {
	parked, fail := inbox.Parked{Messages: 2, Conflicts: 1, OldestAge: 90 * time.Second, Retrying: 3}, false
	c := metrics.NewInboxCollector(func(ctx context.Context) (inbox.Parked, error) {
		if _, ok := ctx.Deadline(); !ok {
			return inbox.Parked{}, errors.New("no deadline on the scrape's query")
		}
		if fail {
			return inbox.Parked{}, errors.New("database down")
		}
		return parked, nil
	}, time.Second, nil)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)

	var orders1, orders2, payments inbox.Stats
	c.Add("orders", &orders1)
	c.Add("orders", &orders2)
	c.Add("payments", &payments)
	c.Add("ignored", nil)
	orders1.Received.Add(5)
	orders1.Started.Add(2)
	orders1.Duplicates.Add(1)
	orders1.Parked.Add(2)
	orders1.Conflicts.Add(1)
	orders2.DuplicateStarts.Add(1)
	orders2.Received.Add(3)
	orders2.Started.Add(1)
	orders2.Retried.Add(2)
	payments.Received.Add(4)
	payments.Correlated.Add(1)
	payments.Reconciled.Add(1)
	payments.Ignored.Add(1)
	payments.Retried.Add(1)

	const counters = `
# HELP extworker_inbox_messages_total Inbox deliveries by queue and outcome: received (every delivery), started, correlated, reconciled, duplicate, ignored, retried, parked, conflict (parked with another body under a known id), duplicate-start (a start that found more than one instance of its business key).
# TYPE extworker_inbox_messages_total counter
extworker_inbox_messages_total{outcome="conflict",queue="orders"} 1
extworker_inbox_messages_total{outcome="correlated",queue="orders"} 0
extworker_inbox_messages_total{outcome="duplicate",queue="orders"} 1
extworker_inbox_messages_total{outcome="duplicate-start",queue="orders"} 1
extworker_inbox_messages_total{outcome="ignored",queue="orders"} 0
extworker_inbox_messages_total{outcome="parked",queue="orders"} 2
extworker_inbox_messages_total{outcome="received",queue="orders"} 8
extworker_inbox_messages_total{outcome="reconciled",queue="orders"} 0
extworker_inbox_messages_total{outcome="retried",queue="orders"} 2
extworker_inbox_messages_total{outcome="started",queue="orders"} 3
extworker_inbox_messages_total{outcome="conflict",queue="payments"} 0
extworker_inbox_messages_total{outcome="correlated",queue="payments"} 1
extworker_inbox_messages_total{outcome="duplicate",queue="payments"} 0
extworker_inbox_messages_total{outcome="duplicate-start",queue="payments"} 0
extworker_inbox_messages_total{outcome="ignored",queue="payments"} 1
extworker_inbox_messages_total{outcome="parked",queue="payments"} 0
extworker_inbox_messages_total{outcome="received",queue="payments"} 4
extworker_inbox_messages_total{outcome="reconciled",queue="payments"} 1
extworker_inbox_messages_total{outcome="retried",queue="payments"} 1
extworker_inbox_messages_total{outcome="started",queue="payments"} 0
`
	names := []string{"extworker_inbox_messages_total", "extworker_inbox_parked", "extworker_inbox_conflicts",
		"extworker_inbox_oldest_parked_age_seconds", "extworker_inbox_retrying", "extworker_inbox_parked_up"}
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(counters+`
# HELP extworker_inbox_conflicts Copies parked because their message id came with another body; they stay in the dead-letter queue.
# TYPE extworker_inbox_conflicts gauge
extworker_inbox_conflicts 1
# HELP extworker_inbox_oldest_parked_age_seconds How long the oldest parked inbox message has been parked (0 when none is).
# TYPE extworker_inbox_oldest_parked_age_seconds gauge
extworker_inbox_oldest_parked_age_seconds 90
# HELP extworker_inbox_parked Inbox messages parked in a dead-letter queue (failed_final), waiting for an operator.
# TYPE extworker_inbox_parked gauge
extworker_inbox_parked 2
# HELP extworker_inbox_parked_up 1 if the last scrape's inbox query succeeded, else 0.
# TYPE extworker_inbox_parked_up gauge
extworker_inbox_parked_up 1
# HELP extworker_inbox_retrying Inbox messages waiting in a retry queue (failed_retryable or unknown).
# TYPE extworker_inbox_retrying gauge
extworker_inbox_retrying 3
`), names...))

	// Drained: the gauges read 0, not absent.
	parked = inbox.Parked{}
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP extworker_inbox_oldest_parked_age_seconds How long the oldest parked inbox message has been parked (0 when none is).
# TYPE extworker_inbox_oldest_parked_age_seconds gauge
extworker_inbox_oldest_parked_age_seconds 0
# HELP extworker_inbox_parked Inbox messages parked in a dead-letter queue (failed_final), waiting for an operator.
# TYPE extworker_inbox_parked gauge
extworker_inbox_parked 0
`), "extworker_inbox_parked", "extworker_inbox_oldest_parked_age_seconds"))

	// The query fails: up is 0, the gauges are absent, the counters are still there.
	fail = true
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(counters+`
# HELP extworker_inbox_parked_up 1 if the last scrape's inbox query succeeded, else 0.
# TYPE extworker_inbox_parked_up gauge
extworker_inbox_parked_up 0
`), names...))
}

// Without consumers the collector reports the inbox's gauges alone.
func TestInboxCollectorWithoutConsumers(t *testing.T) {
	c := metrics.NewInboxCollector(func(context.Context) (inbox.Parked, error) { return inbox.Parked{Messages: 1}, nil }, 0, nil)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	n, err := testutil.GatherAndCount(reg, "extworker_inbox_messages_total")
	require.NoError(t, err)
	require.Equal(t, 0, n)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP extworker_inbox_parked Inbox messages parked in a dead-letter queue (failed_final), waiting for an operator.
# TYPE extworker_inbox_parked gauge
extworker_inbox_parked 1
`), "extworker_inbox_parked"))
}
