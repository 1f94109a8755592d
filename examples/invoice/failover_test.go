package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/daemon"
	invariants "github.com/extworker/extworker/internal/oracle"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/tasks"
)

// PostgreSQL failover under the ledger (issue 27; docs/failover.md). The ledger runs on
// a primary with a streaming standby (testenv.StartPGPair) through the multi-host URL
// (target_session_attrs=read-write); two in-process workers serve the demo's handlers
// (on topics of the test's own) while invoices arrive at a steady pace. Mid-run the
// standby is made to lag (its WAL held back), the primary is SIGKILLed, and after a
// short outage the standby is promoted. The workers are not restarted. Then: every
// instance ends, the provider has at most one charge per invoice, the oracle's checks
// hold for every intent (internal/oracle), unknown outcomes were reconciled, and the
// intents whose settlement the old primary had committed are counted by whether the
// new primary still has that settlement.
//
// With asynchronous replication the settlements committed during the lag vanish at
// failover: the ledger finds those intents dispatched again (or not at all) and asks
// the provider, by the same provider key, which replays the charge it made. With
// synchronous replication nothing acknowledged is lost: commits wait for the standby.
//
// Each mode runs in tiers (docs/testing.md): sync at the shipped defaults first
// (sync/defaults), then both modes with short timeouts (async/short, sync/short). At the
// defaults a provider call in flight at the kill leaves its intent dispatched under a 2m
// lease (its confirmation could not be written), and its reconciliation waits for the
// lease to end: the run lasts about the lease plus a long poll, where the short tier
// takes seconds (docs/failover.md has the figures). The async mode's lost settlements do
// not depend on the timing, so it runs in the short tier only.
func TestLedgerFailover(t *testing.T) {
	for _, mode := range []struct {
		name   string
		sync   bool
		outage time.Duration
		tiers  []faultTier
	}{
		{"async", false, failoverOutage, []faultTier{shortTier}},
		// An outage longer than the demo's retry budget (about 3 s): a ledger that cannot
		// reach its database defers the task, its retries kept, so no incident. (Before,
		// 2 of 150 instances ended in incidents at 8 s.)
		{"sync", true, 4 * failoverOutage, []faultTier{faultTiers[1], shortTier}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			for _, ft := range mode.tiers {
				t.Run(ft.name, func(t *testing.T) {
					ft.skipIfShort(t)
					began := time.Now()
					ledgerFailover(t, mode.sync, mode.outage, ft)
					t.Logf("%s/%s: %v", mode.name, ft.name, time.Since(began).Round(time.Millisecond))
				})
			}
		})
	}
}

const (
	failoverInvoices = 150
	// failoverPace is the arrival rate of invoices: a steady stream, so that work is in
	// flight around the kill and new work arrives after the promotion.
	failoverPace = 60 * time.Millisecond
	// failoverOutage is how long no server accepts the ledger's writes before the
	// promotion starts (the promotion itself adds to it).
	failoverOutage = 2 * time.Second
	// failoverLagged is how many intents must settle on the primary while the standby
	// lags (asynchronous replication), for the vanished settlements to be shown.
	failoverLagged = 5
)

// settled are the states of an intent whose outcome the ledger has recorded.
var settled = []string{string(idempotency.StateConfirmed), string(idempotency.StateReconciled), string(idempotency.StateRejected)}

func ledgerFailover(t *testing.T, sync bool, outageFor time.Duration, ft faultTier) {
	c := testenv.Engine(t)
	pair := testenv.StartPGPair(t, sync)
	ctx := testenv.Context(t, 8*time.Minute)
	ns := testenv.Unique("failover")
	// The workers run in this process and read its environment: at the defaults without
	// any EXTWORKER_ setting (the harness's own EXTWORKER_TEST_ variables stay), as
	// faultTier.env does for a worker process.
	if ft.atDefaults() {
		for _, kv := range os.Environ() {
			if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "EXTWORKER_") && !strings.HasPrefix(k, "EXTWORKER_TEST_") {
				t.Setenv(k, "") // restored at cleanup
				require.NoError(t, os.Unsetenv(k))
			}
		}
	}
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	t.Setenv("EXTWORKER_DATABASE_URL", pair.URL())
	t.Setenv("EXTWORKER_LEDGER_NAMESPACE", ns)
	// The tier's timing (faults_test.go): none at the defaults; in the short tier a 2s
	// lock and lease and a 1s long poll, so that a dead attempt's lease and lock run out
	// within seconds.
	for _, kv := range ft.settings {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	require.NoError(t, extworker.Migrate(ctx, extworker.Options{}, io.Discard))

	// The demo's process under a key and topics of the test's own: no other demo worker
	// on the engine takes its tasks.
	key, collect, receipt := testenv.Unique("failover"), testenv.Unique("collect"), testenv.Unique("receipt")
	topics := map[string]string{demoTopicCollect: collect, demoTopicReceipt: receipt}
	bpmn := strings.NewReplacer(demoProcessKey, key, demoTopicCollect, collect, demoTopicReceipt, receipt).Replace(demoBPMN)
	dep, err := c.Deploy(ctx, admin.Deployment{Name: key, Resources: []admin.Resource{{Name: key + ".bpmn", Content: []byte(bpmn)}}})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.DeleteDeployment(ctx, dep.ID, true); err != nil {
			t.Logf("cleanup: delete deployment %s: %v", dep.ID, err)
		}
	})
	pay, err := fakeprovider.Start(demoDeclineLimit)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pay.Close() })
	// Each invoice's first charge is answered 300ms after it was made: a few charges are
	// always between the provider and the ledger's confirmation, and the kill finds some
	// there (unknown outcomes).
	pay.SlowDelay = 300 * time.Millisecond
	pc := providerConfig{URL: pay.URL(), Timeout: 1500 * time.Millisecond, Search: true, SearchLag: time.Minute}
	if ft.atDefaults() {
		pc, err = loadProviderConfig() // the demo's defaults: a 10s provider timeout
		require.NoError(t, err)
		pc.URL = pay.URL()
	}
	// The workers' settings, as they read them; the ledger's lease, which a dead attempt's
	// intent waits out, bounds the drain with a long poll (a deferred task's retry is
	// handed over when a poll ends) and a minute.
	cfg, err := daemon.LoadConfig()
	require.NoError(t, err)
	lease := cfg.LedgerLease
	drainFor := max(3*time.Minute, lease+cfg.LongPoll+time.Minute)
	t.Logf("%s tier: lock %v, long poll %v, ledger lease %v, provider timeout %v", ft.name, cfg.LockDuration, cfg.LongPoll, lease, pc.Timeout)

	// Two workers, never restarted.
	wctx, stopWorkers := context.WithCancel(ctx)
	var workers []*failoverWorker
	for i := range 2 {
		w := startFailoverWorker(t, wctx, i, pc, topics)
		workers = append(workers, w)
	}
	defer func() {
		stopWorkers()
		for _, w := range workers {
			assert.NoError(t, <-w.done, "worker %d", w.n)
			w.app.Close()
		}
	}()

	// Invoices arrive at a steady pace (the load's schedule); every tenth is declined.
	began := time.Now()
	starter := startInvoiceStream(t, ctx, c, key, pay)

	primary := failoverPool(t, ctx, pair.PrimaryURL())
	// Mid-run: a third of the invoices charged.
	testenv.Eventually(t, 2*time.Minute, "a third of the invoices charged", func() (bool, error) {
		return len(pay.Charges()) >= failoverInvoices/3, nil
	})
	before, _, err := settledOn(ctx, primary, ns)
	require.NoError(t, err)
	pair.PauseReplication()
	if sync {
		// Commits wait for the standby now: nothing settles on the primary meanwhile. The
		// window has a fixed length: it is the fault's schedule, not a wait for state.
		window := time.NewTimer(time.Second)
		<-window.C
	} else {
		testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%d more intents settled on the primary while the standby lags", failoverLagged),
			func() (bool, error) {
				now, _, err := settledOn(ctx, primary, ns)
				return len(now) >= len(before)+failoverLagged, err
			})
	}
	snapshot, snapAt, err := settledOn(ctx, primary, ns)
	require.NoError(t, err)
	pair.KillPrimary()
	killed := time.Now()
	primary.Close()
	if sync {
		assert.Equal(t, len(before), len(snapshot), "with synchronous replication nothing settles while the standby does not answer")
	}
	t.Logf("primary SIGKILLed %v into the run: %d intents settled on it (%d of them while the standby lagged), %d charges at the provider",
		killed.Sub(began).Round(time.Millisecond), len(snapshot), len(snapshot)-len(before), len(pay.Charges()))

	// What the operator sees during the outage: readiness fails.
	ready := http.StatusOK
	testenv.Eventually(t, 10*time.Second, "worker 0 to report itself not ready", func() (bool, error) {
		ready = readyz(workers[0].addr)
		return ready != http.StatusOK, nil
	})
	outage := time.NewTimer(time.Until(killed.Add(outageFor))) // the outage's schedule
	<-outage.C
	promotion := pair.Promote()
	promoted := time.Now()
	newPrimary := failoverPool(t, ctx, pair.StandbyURL())
	var firstWrite time.Time
	testenv.Eventually(t, time.Minute, "a ledger write on the new primary", func() (bool, error) {
		var at *time.Time
		err := newPrimary.QueryRow(ctx, `SELECT min(e.at) FROM extworker_intent_events e JOIN extworker_intents i ON i.id = e.intent_id
			WHERE i.namespace = $1 AND e.at > $2`, ns, snapAt).Scan(&at)
		if at != nil {
			firstWrite = *at
		}
		return at != nil, err
	})
	downtime := firstWrite.Sub(killed)
	testenv.Eventually(t, 30*time.Second, "worker 0 to report itself ready again", func() (bool, error) {
		return readyz(workers[0].addr) == http.StatusOK, nil
	})

	ids := starter.wait(t)
	st, engine := drainFailover(t, ctx, c, key, ids, began, drainFor)
	for _, w := range workers {
		select {
		case err := <-w.done:
			t.Fatalf("worker %d stopped during the run: %v", w.n, err)
		default:
		}
	}

	// The run's unknown outcomes (a charge made, its confirmation not written: the kill)
	// and reconciliations, as the new primary has them.
	// An intent can go unknown more than once (a reconciliation that finds nothing sends it
	// again, and that answer can be lost too) and settle by a confirmation rather than a
	// reconciliation: what must hold is that none of them is left unknown or in doubt.
	var unknown, reconciled, unsettled int
	require.NoError(t, newPrimary.QueryRow(ctx, `SELECT count(*) FILTER (WHERE e.to_state = 'unknown'), count(*) FILTER (WHERE e.to_state = 'reconciled')
		FROM extworker_intent_events e JOIN extworker_intents i ON i.id = e.intent_id WHERE i.namespace = $1`, ns).Scan(&unknown, &reconciled))
	require.NoError(t, newPrimary.QueryRow(ctx, `SELECT count(*) FROM extworker_intents i WHERE i.namespace = $1
		AND i.state NOT IN ('confirmed', 'reconciled', 'rejected')
		AND EXISTS (SELECT 1 FROM extworker_intent_events e WHERE e.intent_id = i.id AND e.to_state = 'unknown')`, ns).Scan(&unsettled))
	assert.Zero(t, unsettled, "every unknown outcome settled (%d unknown, %d reconciled)", unknown, reconciled)

	// The settlements the old primary had committed by the snapshot, and which of them
	// the new one lacks.
	vanished, err := vanishedOn(ctx, newPrimary, ns, snapshot, snapAt)
	require.NoError(t, err)

	// Both sides, by the oracle. It flags an intent whose settlement vanished after the
	// engine had ended its instance (so nothing delivers it again): the worker reports a
	// task only once the ledger has acknowledged its settlement, yet the new primary does
	// not hold it settled (I4, I8: the provider charged, the ledger has no row, or one
	// left dispatched). This also catches settlements committed between the snapshot and
	// the kill. The oracle flags nothing else.
	ops := workers[0].app.Ledger().Operations()
	refs := paymentRefs(t, ctx, c, ids)
	ended := map[string]bool{}
	for _, h := range engine.Instances {
		ended[h.ID] = h.State == "COMPLETED"
	}
	expect := func(inv streamInvoice) invariants.Expect {
		return invariants.Expect{Scope: demoScope, Key: intentKey(inv.id), Invoice: inv.id, Declined: inv.amount > demoDeclineLimit, EngineRef: refs[inv.instance]}
	}
	lost := map[string]bool{}
	for _, k := range vanished {
		lost[k] = true
	}
	var flagged []streamInvoice
	for _, inv := range starter.invoices {
		vs := invariants.Check(ctx, ops, pay.Charges(), expect(inv))
		switch {
		case len(vs) == 0:
		case ended[inv.instance]:
			flagged = append(flagged, inv)
			lost[intentKey(inv.id)] = true
			t.Logf("the oracle sees %s's vanished settlement: %s", inv.id, strings.Join(vs, "; "))
		default:
			for _, v := range vs {
				t.Error(v)
			}
		}
	}
	if sync {
		assert.Empty(t, vanished, "synchronous replication loses no settlement the primary acknowledged")
		assert.Empty(t, flagged, "nothing for the oracle to flag")
	} else {
		assert.NotEmpty(t, vanished, "asynchronous replication loses the settlements committed while the standby lagged")
	}

	// The engine delivers each flagged invoice's command again (a duplicate submission; in
	// production also a redelivered message or an operator's retry): the ledger, with no
	// settled row, sends the charge again, with the same provider key, and the provider
	// replays the charge it made instead of making a second one. The ledger ends with
	// that charge, and the oracle is satisfied.
	var again []string
	for _, inv := range flagged {
		pi, err := c.StartProcess(ctx, key, admin.StartProcessRequest{BusinessKey: inv.id + "-again",
			Variables: camunda7.Variables{"invoiceId": camunda7.StringVar(inv.id), "amountCents": camunda7.LongVar(inv.amount)}})
		require.NoError(t, err)
		again = append(again, pi.ID)
	}
	testenv.Eventually(t, time.Minute, "the invoices delivered again to complete", func() (bool, error) {
		for _, id := range again {
			h, err := c.HistoricProcessInstance(ctx, id)
			if err != nil || h.State != "COMPLETED" {
				return false, err
			}
		}
		return true, nil
	})
	for _, inv := range flagged {
		for _, v := range invariants.Check(ctx, ops, pay.Charges(), expect(inv)) {
			t.Errorf("after the invoice was delivered again: %s", v)
		}
		charges := 1
		if inv.amount > demoDeclineLimit {
			charges = 0
		}
		assert.Len(t, chargesFor(pay, inv.id), charges, "%s: no second charge", inv.id)
		// Its row was there, dispatched (the settlement alone vanished): the ledger asked
		// the provider by the provider key and recorded the charge it found. Or its row
		// had vanished altogether: the ledger sent the charge again with the same key.
		row, err := ops.Get(ctx, demoScope, intentKey(inv.id))
		require.NoError(t, err)
		if row.State != idempotency.StateReconciled {
			assert.GreaterOrEqual(t, len(requestsFor(pay, inv.id)), 2, "%s (%s): sent again, with the same provider key", inv.id, row.State)
		}
	}
	// Invoices sent to the provider more than once (always with the same provider key),
	// and how many of them had a vanished settlement.
	replayed, replayedLost := 0, 0
	for _, inv := range starter.invoices {
		if len(requestsFor(pay, inv.id)) > 1 {
			replayed++
			if lost[intentKey(inv.id)] {
				replayedLost++
			}
		}
	}
	assert.Zero(t, pay.DoubleCharges(), "no invoice charged twice")

	// How long the run lasted past the kill: the last instance's end, and how long the
	// reconciled intents waited (from their last dispatch to their reconciliation: the
	// lease, for an unknown outcome; with async, the invoices delivered again count too).
	var lastEnd time.Time
	for _, h := range engine.Instances {
		if h.EndTime.After(lastEnd) {
			lastEnd = h.EndTime.Time
		}
	}
	var waitMin, waitMax float64
	require.NoError(t, newPrimary.QueryRow(ctx, `SELECT coalesce(min(w), 0), coalesce(max(w), 0) FROM (
			SELECT extract(epoch FROM r.at - (SELECT max(d.at) FROM extworker_intent_events d WHERE d.intent_id = r.intent_id AND d.to_state = 'dispatched' AND d.at < r.at))::float8 w
			FROM extworker_intent_events r JOIN extworker_intents i ON i.id = r.intent_id WHERE i.namespace = $1 AND r.to_state = 'reconciled') x`, ns).Scan(&waitMin, &waitMax))
	t.Logf("%s tier: the last instance ended %v after the kill; reconciliations %.1f-%.1fs after the intent's last dispatch (lease %v)",
		ft.name, lastEnd.Sub(killed).Round(time.Millisecond), waitMin, waitMax, lease)

	heldN := 0
	require.NoError(t, newPrimary.QueryRow(ctx, `SELECT count(*) FROM extworker_intents WHERE namespace = $1 AND state = 'operator_hold'`, ns).Scan(&heldN))
	assert.Zero(t, heldN, "no intent went to an operator")
	t.Logf("failover (%s replication): downtime %v (kill -> first ledger write on the new primary; promotion took %v, started %v after the kill), "+
		"readiness during the outage %d; %d instances: %d completed, %d declined, %d incidents; "+
		"%d settlements vanished with the old primary (%d of them in the snapshot before the kill; %d flagged by the oracle and delivered again; %d sent again with the same provider key), "+
		"%d invoices sent to the provider twice with the same key and charged once, "+
		"unknown outcomes %d, reconciled %d, double charges %d",
		replicationMode(sync), downtime.Round(time.Millisecond), promotion.Round(time.Millisecond), promoted.Add(-promotion).Sub(killed).Round(time.Millisecond),
		ready, st.Started, st.Completed, st.BPMNErrorEnded, st.Incidents, len(lost), len(vanished), len(flagged), replayedLost, replayed, unknown, reconciled, pay.DoubleCharges())
}

func intentKey(invoice string) string { return "invoice:" + invoice + ":v1" }

func replicationMode(sync bool) string {
	if sync {
		return "synchronous"
	}
	return "asynchronous"
}

// failoverWorker is one in-process worker on the demo's handlers.
type failoverWorker struct {
	n    int
	app  *extworker.App
	addr string // its operations endpoint
	logs *testenv.Buffer
	done chan error
}

func startFailoverWorker(t *testing.T, ctx context.Context, n int, pc providerConfig, topics map[string]string) *failoverWorker {
	t.Helper()
	w := &failoverWorker{n: n, addr: testenv.FreeAddr(t), logs: &testenv.Buffer{}, done: make(chan error, 1)}
	t.Setenv("EXTWORKER_WORKER_ID", testenv.Unique(fmt.Sprintf("failover-w%d", n)))
	t.Setenv("EXTWORKER_HTTP_ADDR", w.addr)
	app, err := extworker.New(ctx, extworker.Options{Logger: slog.New(slog.NewJSONHandler(w.logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(t, err)
	w.app = app
	env, _, closeEnv, err := newDemoEnv(pc, app.Ledger())
	require.NoError(t, err)
	t.Cleanup(closeEnv)
	require.NoError(t, demoHandlers(env, func(topic string, h tasks.Handler, o tasks.TopicOptions) error {
		return app.Handle(topics[topic], h, o)
	}))
	go func() { w.done <- app.Run(ctx) }()
	t.Cleanup(func() {
		if t.Failed() {
			logs := w.logs.String()
			if len(logs) > 20000 {
				logs = "…" + logs[len(logs)-20000:]
			}
			t.Logf("worker %d logs (warnings and errors):\n%s", n, logs)
		}
	})
	return w
}

func readyz(addr string) int {
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func failoverPool(t *testing.T, ctx context.Context, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// settledOn returns the keys of the namespace's settled intents on a server, and the
// server's clock when it read them.
func settledOn(ctx context.Context, pool *pgxpool.Pool, ns string) ([]string, time.Time, error) {
	rows, err := pool.Query(ctx, `SELECT intent_key, clock_timestamp() FROM extworker_intents WHERE namespace = $1 AND state = ANY($2)`, ns, settled)
	if err != nil {
		return nil, time.Time{}, err
	}
	defer rows.Close()
	var keys []string
	var at time.Time
	for rows.Next() {
		var k string
		if err := rows.Scan(&k, &at); err != nil {
			return nil, time.Time{}, err
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil || len(keys) > 0 {
		return keys, at, err
	}
	err = pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&at)
	return keys, at, err
}

// vanishedOn returns the keys, of those the old primary had settled by at, whose
// settlement by then the new primary does not have: their rows or their settling events
// were committed on the old primary and never reached the standby.
func vanishedOn(ctx context.Context, pool *pgxpool.Pool, ns string, keys []string, at time.Time) ([]string, error) {
	rows, err := pool.Query(ctx, `SELECT k FROM unnest($2::text[]) k WHERE NOT EXISTS (
			SELECT 1 FROM extworker_intents i JOIN extworker_intent_events e ON e.intent_id = i.id
			WHERE i.namespace = $1 AND i.scope = $3 AND i.intent_key = k AND e.to_state = ANY($4) AND e.at <= $5)
		ORDER BY k`, ns, keys, demoScope, settled, at)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

type streamInvoice struct {
	id, instance string
	amount       int64
}

// invoiceStream starts the run's invoices at failoverPace in the background.
type invoiceStream struct {
	invoices []streamInvoice
	done     chan error
	mu       sync.Mutex
}

func startInvoiceStream(t *testing.T, ctx context.Context, c *admin.Client, key string, pay *fakeprovider.Server) *invoiceStream {
	t.Helper()
	s := &invoiceStream{done: make(chan error, 1)}
	run := testenv.Unique("FO")
	go func() {
		pace := time.NewTicker(failoverPace)
		defer pace.Stop()
		for i := range failoverInvoices {
			amount := int64(1000 + i)
			if i%10 == 9 {
				amount = 25_000_00 // above the decline limit: the BPMN error path
			}
			inv := fmt.Sprintf("%s-%03d", run, i)
			pay.Script(inv, fakeprovider.SlowAnswer)
			pi, err := c.StartProcess(ctx, key, admin.StartProcessRequest{BusinessKey: inv,
				Variables: camunda7.Variables{"invoiceId": camunda7.StringVar(inv), "amountCents": camunda7.LongVar(amount)}})
			if err != nil {
				s.done <- fmt.Errorf("start invoice %s: %w", inv, err)
				return
			}
			s.mu.Lock()
			s.invoices = append(s.invoices, streamInvoice{id: inv, instance: pi.ID, amount: amount})
			s.mu.Unlock()
			select {
			case <-pace.C:
			case <-ctx.Done():
				s.done <- ctx.Err()
				return
			}
		}
		s.done <- nil
	}()
	return s
}

// wait waits for every invoice to have started and returns the instances' ids.
func (s *invoiceStream) wait(t *testing.T) []string {
	t.Helper()
	require.NoError(t, <-s.done)
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, len(s.invoices))
	for i, inv := range s.invoices {
		ids[i] = inv.instance
	}
	return ids
}

// drainFailover waits until every instance has ended or holds an incident, then checks
// I3 (no lost instances) as the soak does; no incident is allowed.
func drainFailover(t *testing.T, ctx context.Context, c *admin.Client, key string, ids []string, since time.Time, within time.Duration) (invariants.InstanceCounts, invariants.EngineState) {
	t.Helper()
	q := invariants.EngineQuery{ProcessDefinitionKey: key, BusinessKeyPrefix: "FO-", ErrorEndActivities: []string{"invoiceDeclined"},
		Since: since.Add(-time.Minute)}
	var st invariants.EngineState
	testenv.Eventually(t, within, "every instance to end or hold an incident", func() (bool, error) {
		var err error
		st, err = invariants.ReadEngine(ctx, c, q)
		if err != nil {
			return false, err
		}
		open := 0
		incident := map[string]bool{}
		for _, in := range st.Incidents {
			incident[in.ProcessInstanceID] = true
		}
		for _, h := range st.Instances {
			if h.State == "ACTIVE" && !incident[h.ID] {
				open++
			}
		}
		return len(st.Instances) == len(ids) && open == 0, nil
	})
	n, violations := invariants.CheckInstances(ids, st, nil, time.Now())
	for _, v := range violations {
		t.Error(v)
	}
	for _, in := range st.Incidents {
		t.Logf("incident on %s: %s: %.300s", in.ProcessInstanceID, in.IncidentType, in.IncidentMessage)
	}
	return n, st
}

// paymentRefs maps each instance to the paymentRef the engine completed it with.
func paymentRefs(t *testing.T, ctx context.Context, c *admin.Client, ids []string) map[string]string {
	t.Helper()
	refs := map[string]string{}
	for from := 0; from < len(ids); from += 50 {
		batch := ids[from:min(from+50, len(ids))]
		hv, err := c.HistoricVariableInstances(ctx, url.Values{"processInstanceIdIn": {strings.Join(batch, ",")}, "variableName": {"paymentRef"}})
		require.NoError(t, err)
		for _, v := range hv {
			ref, err := camunda7.Variables{"v": v.Variable()}.String("v")
			require.NoError(t, err)
			refs[v.ProcessInstanceID] = ref
		}
	}
	return refs
}
