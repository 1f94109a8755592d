package metrics

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/outbox"
	"github.com/extworker/extworker/tasks"
)

// Namespace prefixes every metric name.
const Namespace = "extworker"

// Metrics implements tasks.Observer and idempotency.Observer on Prometheus collectors.
// Create it with New; it is safe for concurrent use.
type Metrics struct {
	fetched        *prometheus.CounterVec
	completed      *prometheus.CounterVec
	bpmnErrors     *prometheus.CounterVec
	failed         *prometheus.CounterVec
	incidents      *prometheus.CounterVec
	handled        *prometheus.CounterVec
	handlerSeconds *prometheus.HistogramVec
	fetchSeconds   prometheus.Histogram
	polls          prometheus.Counter
	emptyPolls     prometheus.Counter
	inFlight       *prometheus.GaugeVec
	freeSlots      prometheus.Gauge
	extensions     *prometheus.CounterVec
	extensionFails *prometheus.CounterVec
	locksLost      *prometheus.CounterVec
	engineErrors   *prometheus.CounterVec
	dbErrors       *prometheus.CounterVec
	transitions    *prometheus.CounterVec
	duplicates     *prometheus.CounterVec
	reconciliation *prometheus.CounterVec
	conflicts      *prometheus.CounterVec
}

var (
	_ tasks.Observer       = (*Metrics)(nil)
	_ idempotency.Observer = (*Metrics)(nil)
)

// Options configure New. Zero values take the documented defaults.
type Options struct {
	// MaxConcurrency is the worker's slot count: extworker_slots_free starts at it
	// (before the first task), and extworker_slots_max reports it. Default 0: both stay
	// unset until the worker reports.
	MaxConcurrency int
}

// New creates the metrics and registers them on reg. It fails if any name is already
// registered there.
func New(reg prometheus.Registerer, opts Options) (*Metrics, error) {
	m := newTaskMetrics()
	m.addLedgerMetrics()
	cs := []prometheus.Collector{m.fetched, m.completed, m.bpmnErrors, m.failed, m.incidents, m.handled, m.handlerSeconds,
		m.fetchSeconds, m.polls, m.emptyPolls, m.inFlight, m.freeSlots, m.extensions, m.extensionFails, m.locksLost,
		m.engineErrors, m.dbErrors, m.transitions, m.duplicates, m.reconciliation, m.conflicts}
	if opts.MaxConcurrency > 0 {
		m.freeSlots.Set(float64(opts.MaxConcurrency))
		max := gauge("slots_max", "The worker's MaxConcurrency.")
		max.Set(float64(opts.MaxConcurrency))
		cs = append(cs, max)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Series that alerts and the dashboard rely on exist from the start, at zero.
	for _, op := range []string{"fetch-and-lock", "complete", "failure", "bpmn-error", "unlock", "extend-lock"} {
		m.engineErrors.WithLabelValues(op)
	}
	for _, op := range []string{"ledger-write", "ledger-backlog"} {
		m.dbErrors.WithLabelValues(op)
	}
	return m, nil
}

// The one way this file makes a collector: a name under Namespace, a help text, labels.

func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help})
}

func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, labels)
}

func gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help})
}

func gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help}, labels)
}

func histogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: buckets})
}

func histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: buckets}, labels)
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(Namespace+"_"+name, help, labels, nil)
}

// newTaskMetrics creates the worker's metrics (tasks.Observer).
func newTaskMetrics() *Metrics {
	return &Metrics{
		fetched:    counterVec("tasks_fetched_total", "External tasks locked by fetchAndLock for this worker.", "topic"),
		completed:  counterVec("tasks_completed_total", "Tasks completed (the engine accepted the completion).", "topic"),
		bpmnErrors: counterVec("tasks_bpmn_errors_total", "Tasks ended with a BPMN error (the model's error path).", "topic"),
		failed: counterVec("tasks_failed_total",
			"Failures reported to the engine, by classification (retryable, permanent, unknown-outcome), with or without retries left.", "topic", "classification"),
		incidents: counterVec("incidents_total",
			"Failures reported with retries 0, which raise an incident: classification retryable means retries were exhausted.", "topic", "classification"),
		handled: counterVec("tasks_handled_total",
			"Tasks this worker ran, by outcome (tasks.Outcome): completed, bpmn-error, retryable, incident, deferred, unlocked, lock-lost, report-failed.", "topic", "outcome"),
		handlerSeconds: histogramVec("handler_duration_seconds", "How long handlers ran, by outcome.",
			[]float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}, "topic", "outcome"),
		fetchSeconds: histogram("fetch_duration_seconds", "How long fetchAndLock calls took, including the long poll's wait for work.",
			[]float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60}),
		polls:      counter("fetch_polls_total", "fetchAndLock calls that returned (successful or not)."),
		emptyPolls: counter("fetch_empty_polls_total", "Successful fetchAndLock calls that returned no task."),
		inFlight:   gaugeVec("tasks_in_flight", "Handlers running now.", "topic"),
		freeSlots: gauge("slots_free",
			"Free handler slots: MaxConcurrency minus running handlers; the next fetch asks for at most this many tasks."),
		extensions:     counterVec("lock_extensions_total", "Successful extendLock calls for running tasks.", "topic"),
		extensionFails: counterVec("lock_extension_failures_total", "Failed extendLock calls (transient errors and lost locks).", "topic"),
		locksLost: counterVec("locks_lost_total",
			"Locks lost while a task ran or was reported: reason gone, taken or max-run-time.", "topic", "reason"),
		engineErrors: counterVec("engine_errors_total",
			"Failed engine calls: operation fetch-and-lock, complete, failure, bpmn-error, unlock, extend-lock, query, version.", "operation"),
	}
}

// addLedgerMetrics creates the effect ledger's metrics (idempotency.Observer) and the
// database errors.
func (m *Metrics) addLedgerMetrics() {
	m.dbErrors = counterVec("database_errors_total",
		"Failed database operations: ledger-write, ledger-backlog, ping, migrations.", "operation")
	m.transitions = counterVec("ledger_transitions_total",
		"Committed effect-ledger state changes, by scope and the state entered.", "scope", "state")
	m.duplicates = counterVec("ledger_duplicates_suppressed_total",
		"Attempts kept from dispatching an effect again: reason replayed (answered from the ledger) or in-progress (another attempt owns it).", "scope", "reason")
	m.reconciliation = counterVec("ledger_reconciliations_total",
		"Reconciliations of unknown outcomes with the provider: result found, absent, still-unknown, rejected.", "scope", "result")
	m.conflicts = counterVec("ledger_idempotency_conflicts_total",
		"Intent keys that came with a different request digest; refused, nothing sent.", "scope")
}

// Polled implements tasks.Observer.
func (m *Metrics) Polled(n int, latency time.Duration, err error) {
	m.polls.Inc()
	m.fetchSeconds.Observe(latency.Seconds())
	if err == nil && n == 0 {
		m.emptyPolls.Inc()
	}
}

// Fetched implements tasks.Observer.
func (m *Metrics) Fetched(topic string) { m.fetched.WithLabelValues(topic).Inc() }

// Handled implements tasks.Observer.
func (m *Metrics) Handled(topic string, outcome tasks.Outcome, classification string, took time.Duration) {
	m.handled.WithLabelValues(topic, outcome.String()).Inc()
	m.handlerSeconds.WithLabelValues(topic, outcome.String()).Observe(took.Seconds())
	switch outcome {
	case tasks.OutcomeCompleted:
		m.completed.WithLabelValues(topic).Inc()
	case tasks.OutcomeBPMNError:
		m.bpmnErrors.WithLabelValues(topic).Inc()
	case tasks.OutcomeRetryable:
		m.failed.WithLabelValues(topic, classification).Inc()
	case tasks.OutcomeIncident:
		m.failed.WithLabelValues(topic, classification).Inc()
		m.incidents.WithLabelValues(topic, classification).Inc()
	}
}

// Slots implements tasks.Observer.
func (m *Metrics) Slots(topic string, inFlight, free int) {
	m.inFlight.WithLabelValues(topic).Set(float64(inFlight))
	m.freeSlots.Set(float64(free))
}

// LockExtended implements tasks.Observer.
func (m *Metrics) LockExtended(topic string, err error) {
	if err != nil {
		m.extensionFails.WithLabelValues(topic).Inc()
		return
	}
	m.extensions.WithLabelValues(topic).Inc()
}

// LockLost implements tasks.Observer.
func (m *Metrics) LockLost(topic, reason string) { m.locksLost.WithLabelValues(topic, reason).Inc() }

// EngineError implements tasks.Observer.
func (m *Metrics) EngineError(operation string, _ error) {
	m.engineErrors.WithLabelValues(operation).Inc()
}

// Transition implements idempotency.Observer.
func (m *Metrics) Transition(scope string, _, to idempotency.State) {
	m.transitions.WithLabelValues(scope, string(to)).Inc()
}

// DuplicateSuppressed implements idempotency.Observer.
func (m *Metrics) DuplicateSuppressed(scope, reason string) {
	m.duplicates.WithLabelValues(scope, reason).Inc()
}

// Reconciled implements idempotency.Observer.
func (m *Metrics) Reconciled(scope, result string) {
	m.reconciliation.WithLabelValues(scope, result).Inc()
}

// DigestMismatch implements idempotency.Observer.
func (m *Metrics) DigestMismatch(scope string) { m.conflicts.WithLabelValues(scope).Inc() }

// DatabaseError implements idempotency.Observer, and counts the ops endpoints' failed
// database checks.
func (m *Metrics) DatabaseError(operation string, _ error) {
	m.dbErrors.WithLabelValues(operation).Inc()
}

// Backlogger is the part of *idempotency.Operations the backlog collector needs.
type Backlogger interface {
	Backlog(ctx context.Context) ([]idempotency.BacklogRow, error)
}

var _ Backlogger = (*idempotency.Operations)(nil)

// BacklogCollector reports the ledger's backlog (unknown, held and dispatched intents,
// and the age of the oldest, per scope), queried from the database at each scrape with a
// short timeout. Register it with NewBacklogCollector.
type BacklogCollector struct {
	l       Backlogger
	timeout time.Duration
	log     *slog.Logger
	errs    *Metrics // counts failed queries; may be nil

	mu       sync.Mutex
	seen     map[[2]string]bool // scope/state pairs reported before: reported as 0 when gone
	intents  *prometheus.Desc
	oldest   *prometheus.Desc
	up       *prometheus.Desc
	duration *prometheus.Desc
}

// NewBacklogCollector returns a collector querying l at each scrape, for at most timeout
// (default 2s). m, if not nil, counts failed queries as database_errors_total
// {operation="ledger-backlog"}. logger receives a Warn record per failed query (default
// discard).
func NewBacklogCollector(l Backlogger, timeout time.Duration, m *Metrics, logger *slog.Logger) *BacklogCollector {
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &BacklogCollector{l: l, timeout: timeout, errs: m, log: logger, seen: map[[2]string]bool{},
		intents:  desc("ledger_intents", "Intents needing attention, by scope and state: unknown (outcome not known yet), operator_hold (an operator must resolve), dispatched (in flight, or left by a dead worker).", "scope", "state"),
		oldest:   desc("ledger_oldest_intent_age_seconds", "Age of the oldest such intent: for unknown since its first dispatch, else since its last change.", "scope", "state"),
		up:       desc("ledger_backlog_up", "1 if the last scrape's backlog query succeeded, else 0."),
		duration: desc("ledger_backlog_query_seconds", "How long the last scrape's backlog query took."),
	}
}

// Describe implements prometheus.Collector.
func (c *BacklogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.intents
	ch <- c.oldest
	ch <- c.up
	ch <- c.duration
}

// Collect implements prometheus.Collector.
func (c *BacklogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	start := time.Now()
	rows, err := c.l.Backlog(ctx)
	ch <- prometheus.MustNewConstMetric(c.duration, prometheus.GaugeValue, time.Since(start).Seconds())
	if err != nil {
		c.log.Warn("querying the ledger backlog for metrics failed", slog.Any("error", err))
		if c.errs != nil {
			c.errs.DatabaseError("ledger-backlog", err)
		}
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	now := map[[2]string]bool{}
	for _, r := range rows {
		k := [2]string{r.Scope, string(r.State)}
		now[k] = true
		c.seen[k] = true
		ch <- prometheus.MustNewConstMetric(c.intents, prometheus.GaugeValue, float64(r.Count), r.Scope, string(r.State))
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, r.OldestAge.Seconds(), r.Scope, string(r.State))
	}
	// A backlog that drained reads 0, not absent: alerts and graphs see it recover.
	for k := range c.seen {
		if !now[k] {
			ch <- prometheus.MustNewConstMetric(c.intents, prometheus.GaugeValue, 0, k[0], k[1])
			ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, 0, k[0], k[1])
		}
	}
}

// OutboxCollector exposes the outbox's backlog at each scrape and counts the relay's
// publishes (it is the relay's outbox.Observer):
//
//	extworker_outbox_unpublished                     events not yet confirmed by the broker
//	extworker_outbox_oldest_unpublished_age_seconds  how long the oldest has waited
//	extworker_outbox_failing                         unpublished events whose last publish failed
//	extworker_outbox_published_total                 publishes the broker confirmed
//	extworker_outbox_publish_errors_total            publishes that failed (each is retried)
type OutboxCollector struct {
	read      func(context.Context) (outbox.Backlog, error)
	timeout   time.Duration
	log       *slog.Logger
	published prometheus.Counter
	errors    prometheus.Counter
	unpub     *prometheus.Desc
	oldest    *prometheus.Desc
	failing   *prometheus.Desc
	up        *prometheus.Desc
}

// NewOutboxCollector returns a collector reading the backlog with read (outbox.ReadBacklog
// on the relay's pool and namespace) for at most timeout (default 2s) per scrape.
func NewOutboxCollector(read func(context.Context) (outbox.Backlog, error), timeout time.Duration, logger *slog.Logger) *OutboxCollector {
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &OutboxCollector{read: read, timeout: timeout, log: logger,
		published: counter("outbox_published_total", "Outbox events the broker confirmed."),
		errors:    counter("outbox_publish_errors_total", "Outbox publishes that failed (the event waits and is tried again)."),
		unpub:     desc("outbox_unpublished", "Outbox events not yet confirmed by the broker."),
		oldest:    desc("outbox_oldest_unpublished_age_seconds", "How long the oldest unpublished outbox event has waited."),
		failing:   desc("outbox_failing", "Unpublished outbox events whose last publish failed."),
		up:        desc("outbox_backlog_up", "1 if the last scrape's outbox backlog query succeeded, else 0."),
	}
}

// Published counts a confirmed publish (outbox.Observer).
func (c *OutboxCollector) Published() { c.published.Inc() }

// PublishFailed counts a failed publish (outbox.Observer).
func (c *OutboxCollector) PublishFailed() { c.errors.Inc() }

// Describe implements prometheus.Collector.
func (c *OutboxCollector) Describe(ch chan<- *prometheus.Desc) {
	c.published.Describe(ch)
	c.errors.Describe(ch)
	ch <- c.unpub
	ch <- c.oldest
	ch <- c.failing
	ch <- c.up
}

// Collect implements prometheus.Collector.
func (c *OutboxCollector) Collect(ch chan<- prometheus.Metric) {
	c.published.Collect(ch)
	c.errors.Collect(ch)
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	b, err := c.read(ctx)
	if err != nil {
		c.log.Warn("querying the outbox backlog for metrics failed", slog.Any("error", err))
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(c.unpub, prometheus.GaugeValue, float64(b.Unpublished))
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, b.OldestAge.Seconds())
	ch <- prometheus.MustNewConstMetric(c.failing, prometheus.GaugeValue, float64(b.Failing))
}
