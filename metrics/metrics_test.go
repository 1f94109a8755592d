package metrics_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/metrics"
	"github.com/extworker/extworker/outbox"
	"github.com/extworker/extworker/tasks"

	"github.com/extworker/extworker/internal/testenv"
)

const (
	dashboardFile  = "../deploy/grafana/extworker.json"
	alertsFile     = "../deploy/prometheus/alerts.yml"
	alertTestsFile = "../deploy/prometheus/alerts_test.yml"
)

// promtool returns the path of promtool (services/tools-up.sh installs it). Missing, the
// test fails in CI and is skipped elsewhere.

type fakeBacklog struct {
	rows []idempotency.BacklogRow
	err  error
}

func (f *fakeBacklog) Backlog(context.Context) ([]idempotency.BacklogRow, error) {
	return f.rows, f.err
}

// registered returns every metric name the package registers (histograms with their
// _bucket, _sum and _count series).
func registered(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, metrics.Options{MaxConcurrency: 4})
	require.NoError(t, err)
	reg.MustRegister(metrics.NewBacklogCollector(&fakeBacklog{}, time.Second, m, nil))
	reg.MustRegister(metrics.NewOutboxCollector(func(context.Context) (outbox.Backlog, error) { return outbox.Backlog{}, nil }, time.Second, nil))
	reg.MustRegister(metrics.NewInboxCollector(func(context.Context) (inbox.Parked, error) { return inbox.Parked{}, nil }, time.Second, nil))
	ch := make(chan *prometheus.Desc, 100)
	reg.Describe(ch)
	close(ch)
	names := map[string]bool{}
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range ch {
		mm := fq.FindStringSubmatch(d.String())
		require.NotNil(t, mm, d.String())
		names[mm[1]] = true
		if strings.HasSuffix(mm[1], "_seconds") && strings.Contains(mm[1], "duration") {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[mm[1]+s] = true
			}
		}
	}
	return names
}

var metricName = regexp.MustCompile(`\bextworker_[a-z_]+\b`)

// checkNames asserts every extworker_ name in expr is registered.
func checkNames(t *testing.T, where, expr string, names map[string]bool) {
	t.Helper()
	found := metricName.FindAllString(expr, -1)
	assert.NotEmpty(t, found, "%s: no extworker metric in %q", where, expr)
	for _, n := range found {
		assert.True(t, names[n], "%s: %s is not a metric package metrics registers (expr %q)", where, n, expr)
	}
}

// The dashboard is valid JSON, every panel queries something, and every query names
// only metrics this package registers.
func TestDashboardUsesRegisteredMetrics(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	names := registered(t)
	used := map[string]bool{}
	panels := 0
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		panels++
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			checkNames(t, "panel "+p.Title, tg.Expr, names)
			for _, n := range metricName.FindAllString(tg.Expr, -1) {
				used[n] = true
			}
		}
	}
	assert.GreaterOrEqual(t, panels, 15)
	// The signals the on-call engineer needs are all on it.
	for _, n := range []string{"extworker_ledger_oldest_intent_age_seconds", "extworker_ledger_intents", "extworker_ledger_duplicates_suppressed_total",
		"extworker_ledger_idempotency_conflicts_total", "extworker_incidents_total", "extworker_locks_lost_total", "extworker_engine_errors_total",
		"extworker_ledger_reconciliations_total", "extworker_handler_duration_seconds_bucket", "extworker_fetch_duration_seconds_bucket",
		"extworker_slots_free", "extworker_database_errors_total"} {
		assert.True(t, used[n], "the dashboard shows %s", n)
	}
}

// Every alert rule names only metrics this package registers.
func TestAlertRulesUseRegisteredMetrics(t *testing.T) {
	raw, err := os.ReadFile(alertsFile)
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	names := registered(t)
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			checkNames(t, "alert "+r.Alert, r.Expr, names)
		}
	}
	sort.Strings(alerts)
	for _, want := range []string{"ExtworkerUnknownOutcomeOlderThanProviderWindow", "ExtworkerDuplicatePreventionRising", "ExtworkerIdempotencyConflicts", "ExtworkerOutboxStuck", "ExtworkerInboxParked",
		"ExtworkerIncidentsAfterRetryExhaustion", "ExtworkerLocksLost", "ExtworkerFetchErrors", "ExtworkerReconciliationBacklog"} {
		assert.Contains(t, alerts, want)
	}
}

// The real promtool accepts the rules and their unit tests pass.
func TestPromtoolChecksRules(t *testing.T) {
	bin := testenv.Promtool(t)
	out, err := exec.Command(bin, "check", "rules", alertsFile).CombinedOutput()
	require.NoError(t, err, "promtool check rules:\n%s", out)
	assert.Contains(t, string(out), "SUCCESS")
	out, err = exec.Command(bin, "test", "rules", alertTestsFile).CombinedOutput()
	require.NoError(t, err, "promtool test rules:\n%s", out)
	assert.Contains(t, string(out), "SUCCESS")
}

// The observer methods land in the documented metrics.
func TestObserverCounts(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, metrics.Options{MaxConcurrency: 8})
	require.NoError(t, err)
	assert.Equal(t, 8.0, scrape(t, reg)["extworker_slots_free"], "all slots free before the first task")

	m.Polled(0, 20*time.Second, nil)
	m.Polled(2, 10*time.Millisecond, nil)
	m.Polled(0, time.Millisecond, errors.New("connection refused"))
	m.EngineError("fetch-and-lock", errors.New("connection refused"))
	m.Fetched("pay")
	m.Fetched("pay")
	m.Slots("pay", 2, 6)
	m.Handled("pay", tasks.OutcomeCompleted, "", 50*time.Millisecond)
	m.Handled("pay", tasks.OutcomeIncident, "retryable", time.Second)
	m.Handled("pay", tasks.OutcomeRetryable, "retryable", time.Second)
	m.LockExtended("pay", nil)
	m.LockExtended("pay", errors.New("503"))
	m.LockLost("pay", "taken")
	m.Transition("payment.collect", idempotency.StateDispatched, idempotency.StateUnknown)
	m.DuplicateSuppressed("payment.collect", "replayed")
	m.Reconciled("payment.collect", "found")
	m.DigestMismatch("payment.collect")
	m.DatabaseError("ledger-write", errors.New("conn closed"))

	expect := map[string]float64{
		`extworker_fetch_polls_total`:                                                             3,
		`extworker_fetch_empty_polls_total`:                                                       1,
		`extworker_engine_errors_total{operation="fetch-and-lock"}`:                               1,
		`extworker_engine_errors_total{operation="complete"}`:                                     0,
		`extworker_tasks_fetched_total{topic="pay"}`:                                              2,
		`extworker_tasks_in_flight{topic="pay"}`:                                                  2,
		`extworker_slots_free`:                                                                    6,
		`extworker_slots_max`:                                                                     8,
		`extworker_tasks_completed_total{topic="pay"}`:                                            1,
		`extworker_tasks_failed_total{classification="retryable",topic="pay"}`:                    2,
		`extworker_incidents_total{classification="retryable",topic="pay"}`:                       1,
		`extworker_tasks_handled_total{outcome="incident",topic="pay"}`:                           1,
		`extworker_lock_extensions_total{topic="pay"}`:                                            1,
		`extworker_lock_extension_failures_total{topic="pay"}`:                                    1,
		`extworker_locks_lost_total{reason="taken",topic="pay"}`:                                  1,
		`extworker_ledger_transitions_total{scope="payment.collect",state="unknown"}`:             1,
		`extworker_ledger_duplicates_suppressed_total{reason="replayed",scope="payment.collect"}`: 1,
		`extworker_ledger_reconciliations_total{result="found",scope="payment.collect"}`:          1,
		`extworker_ledger_idempotency_conflicts_total{scope="payment.collect"}`:                   1,
		`extworker_database_errors_total{operation="ledger-write"}`:                               1,
	}
	got := scrape(t, reg)
	for k, v := range expect {
		assert.Equal(t, v, got[k], k)
	}
	assert.Equal(t, 3.0, got[`extworker_fetch_duration_seconds_count`])
	assert.Equal(t, 1.0, got[`extworker_handler_duration_seconds_bucket{le="0.05",outcome="completed",topic="pay"}`])
}

// The backlog collector reports the ledger's rows, zero for a backlog that drained, and
// backlog_up 0 with a counted error when the query fails.
func TestBacklogCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, metrics.Options{})
	require.NoError(t, err)
	fb := &fakeBacklog{rows: []idempotency.BacklogRow{
		{Scope: "payment.collect", State: idempotency.StateUnknown, Count: 3, OldestAge: 90 * time.Second},
		{Scope: "payment.collect", State: idempotency.StateOperatorHold, Count: 1, OldestAge: time.Hour},
	}}
	reg.MustRegister(metrics.NewBacklogCollector(fb, time.Second, m, nil))
	got := scrape(t, reg)
	assert.Equal(t, 1.0, got[`extworker_ledger_backlog_up`])
	assert.Equal(t, 3.0, got[`extworker_ledger_intents{scope="payment.collect",state="unknown"}`])
	assert.Equal(t, 90.0, got[`extworker_ledger_oldest_intent_age_seconds{scope="payment.collect",state="unknown"}`])
	assert.Equal(t, 3600.0, got[`extworker_ledger_oldest_intent_age_seconds{scope="payment.collect",state="operator_hold"}`])

	fb.rows = fb.rows[1:]
	got = scrape(t, reg)
	assert.Equal(t, 0.0, got[`extworker_ledger_intents{scope="payment.collect",state="unknown"}`], "a drained backlog reads 0")
	_, present := got[`extworker_ledger_intents{scope="payment.collect",state="unknown"}`]
	assert.True(t, present)

	fb.err = errors.New("connection refused")
	got = scrape(t, reg)
	assert.Equal(t, 0.0, got[`extworker_ledger_backlog_up`])
	// The error counter is another collector of the same registry, gathered concurrently
	// with the backlog query: the next scrape shows the count.
	got = scrape(t, reg)
	assert.GreaterOrEqual(t, got[`extworker_database_errors_total{operation="ledger-backlog"}`], 1.0)
}

// scrape gathers reg into "name{labels}" -> value, labels sorted by name.
func scrape(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			var ls []string
			for _, l := range mt.GetLabel() {
				ls = append(ls, l.GetName()+`="`+l.GetValue()+`"`)
			}
			key := func(name string, extra ...string) string {
				all := append(append([]string{}, ls...), extra...)
				sort.Strings(all)
				if len(all) == 0 {
					return name
				}
				return name + "{" + strings.Join(all, ",") + "}"
			}
			switch {
			case mt.Counter != nil:
				out[key(mf.GetName())] = mt.Counter.GetValue()
			case mt.Gauge != nil:
				out[key(mf.GetName())] = mt.Gauge.GetValue()
			case mt.Histogram != nil:
				out[key(mf.GetName()+"_count")] = float64(mt.Histogram.GetSampleCount())
				for _, b := range mt.Histogram.GetBucket() {
					out[key(mf.GetName()+"_bucket", `le="`+strconvG(b.GetUpperBound())+`"`)] = float64(b.GetCumulativeCount())
				}
			}
		}
	}
	return out
}

func strconvG(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// The outbox collector reads the backlog at each scrape (0 when drained, up=0 when the
// query fails) and counts the relay's publishes.
func TestOutboxCollector(t *testing.T) {
	backlog, fail := outbox.Backlog{Unpublished: 3, OldestAge: 90 * time.Second, Failing: 1}, false
	c := metrics.NewOutboxCollector(func(context.Context) (outbox.Backlog, error) {
		if fail {
			return outbox.Backlog{}, errors.New("database down")
		}
		return backlog, nil
	}, time.Second, nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	c.Published()
	c.Published()
	c.PublishFailed()
	expect := func(want string) {
		t.Helper()
		require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "extworker_outbox_unpublished",
			"extworker_outbox_oldest_unpublished_age_seconds", "extworker_outbox_failing", "extworker_outbox_backlog_up",
			"extworker_outbox_published_total", "extworker_outbox_publish_errors_total"))
	}
	expect(`
# HELP extworker_outbox_backlog_up 1 if the last scrape's outbox backlog query succeeded, else 0.
# TYPE extworker_outbox_backlog_up gauge
extworker_outbox_backlog_up 1
# HELP extworker_outbox_failing Unpublished outbox events whose last publish failed.
# TYPE extworker_outbox_failing gauge
extworker_outbox_failing 1
# HELP extworker_outbox_oldest_unpublished_age_seconds How long the oldest unpublished outbox event has waited.
# TYPE extworker_outbox_oldest_unpublished_age_seconds gauge
extworker_outbox_oldest_unpublished_age_seconds 90
# HELP extworker_outbox_publish_errors_total Outbox publishes that failed (the event waits and is tried again).
# TYPE extworker_outbox_publish_errors_total counter
extworker_outbox_publish_errors_total 1
# HELP extworker_outbox_published_total Outbox events the broker confirmed.
# TYPE extworker_outbox_published_total counter
extworker_outbox_published_total 2
# HELP extworker_outbox_unpublished Outbox events not yet confirmed by the broker.
# TYPE extworker_outbox_unpublished gauge
extworker_outbox_unpublished 3
`)
	fail = true
	expect(`
# HELP extworker_outbox_backlog_up 1 if the last scrape's outbox backlog query succeeded, else 0.
# TYPE extworker_outbox_backlog_up gauge
extworker_outbox_backlog_up 0
# HELP extworker_outbox_publish_errors_total Outbox publishes that failed (the event waits and is tried again).
# TYPE extworker_outbox_publish_errors_total counter
extworker_outbox_publish_errors_total 1
# HELP extworker_outbox_published_total Outbox events the broker confirmed.
# TYPE extworker_outbox_published_total counter
extworker_outbox_published_total 2
`)
}
