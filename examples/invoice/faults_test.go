package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/failpoint"
	invariants "github.com/extworker/extworker/internal/oracle"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/lockext"
)

// The crash matrix runs in two tiers (docs/testing.md), each row once per tier:
//
//   - defaults: the worker at the daemon's shipped settings, the configuration users run.
//     Its environment says where the engine, the ledger database and the provider are, and
//     sets the ledger namespace, the worker id, logging, the operations endpoint (a free
//     port) and the failpoint; the lock (20s), the long poll (20s), the ledger lease (2m)
//     and every timeout are the daemon's own. A crashed attempt is taken over only once its
//     lock and its lease have run out, so these rows take minutes: the crash points run
//     together, as six invoices under one supervisor. Skipped by go test -short outside CI.
//   - short: a 2s lock, a 2s ledger lease and a 1s long poll (and a 1.5s provider timeout,
//     which the 2s lease requires, unless the test sets its own), so a crashed attempt is
//     taken over within seconds and each crash point runs on its own. Its workers inherit
//     the test's EXTWORKER_ variables (t.Setenv), which rows of other files rely on.
//
// go test -run 'TestCrashPoints/defaults' (or /short) picks one.
type faultTier struct {
	name string
	// settings are the tier's EXTWORKER_ settings on top of the daemon's defaults.
	settings []string
	// fallback are settings the tier uses unless the test's environment has its own.
	fallback []string
}

var faultTiers = []faultTier{
	{name: "short", settings: []string{"EXTWORKER_LOCK_DURATION=2s", "EXTWORKER_LEDGER_LEASE=2s", "EXTWORKER_LONG_POLL=1s"},
		fallback: []string{"EXTWORKER_PROVIDER_TIMEOUT=1500ms"}},
	{name: "defaults"},
}

// shortTier is the tier of the rows that run only with short timeouts.
var shortTier = faultTiers[0]

func (ft faultTier) atDefaults() bool { return ft.name == "defaults" }

// skipIfShort skips the defaults tier under go test -short, except in CI, which always
// runs it (as bench/harness does with its smoke run).
func (ft faultTier) skipIfShort(t *testing.T) {
	t.Helper()
	if ft.atDefaults() && testing.Short() && !testenv.InCI() {
		t.Skip("the defaults tier waits out 20s locks and 2m ledger leases (CI always runs it)")
	}
}

// env is a worker's environment in the tier: the tier's fallbacks, this process's
// environment (at the defaults without any EXTWORKER_ variable: an inherited setting
// would change the tier), where things are, the namespace, logging, then the tier's
// settings. Later entries win.
func (ft faultTier) env(ns, providerURL string) []string {
	env := append([]string{}, ft.fallback...)
	for _, kv := range os.Environ() {
		if !ft.atDefaults() || !strings.HasPrefix(kv, "EXTWORKER_") {
			env = append(env, kv)
		}
	}
	level := "warn"
	if ft.atDefaults() {
		level = "info" // one run covers six crash points: its logs must tell them apart
	}
	env = append(env, "EXTWORKER_ENGINE_URL="+testenv.EngineURL(), "EXTWORKER_DATABASE_URL="+testenv.DBURL(),
		"EXTWORKER_LEDGER_NAMESPACE="+ns, "EXTWORKER_PROVIDER_URL="+providerURL, "EXTWORKER_LOG_LEVEL="+level,
		"EXTWORKER_HTTP_ADDR=127.0.0.1:0")
	return append(env, ft.settings...)
}

// workerTiming is what a tier's worker runs with, as the binary itself reports it
// (`invoice config -json`), and what a test derives from it.
type workerTiming struct {
	lock, longPoll, lease, providerTimeout time.Duration
	// stop bounds a worker's exit after SIGTERM: its shutdown timeout (or grace) and 15s.
	stop time.Duration
}

func tierTiming(t *testing.T, bin string, ft faultTier) workerTiming {
	t.Helper()
	cmd := exec.Command(bin, "config", "-json")
	cmd.Env = ft.env("probe", "http://127.0.0.1:1")
	out, err := cmd.Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		t.Fatalf("invoice config -json: the %s tier's settings are not a valid configuration: %v: %s", ft.name, err, exit.Stderr)
	}
	require.NoError(t, err, "invoice config -json")
	var vars map[string]string
	require.NoError(t, json.Unmarshal(out, &vars))
	d := func(name string) time.Duration {
		v, err := time.ParseDuration(vars[name])
		require.NoError(t, err, "%s %q", name, vars[name])
		return v
	}
	stop := d("EXTWORKER_SHUTDOWN_GRACE")
	if _, ok := vars["EXTWORKER_SHUTDOWN_TIMEOUT"]; ok {
		stop = d("EXTWORKER_SHUTDOWN_TIMEOUT")
	}
	return workerTiming{lock: d("EXTWORKER_LOCK_DURATION"), longPoll: d("EXTWORKER_LONG_POLL"),
		lease: d("EXTWORKER_LEDGER_LEASE"), providerTimeout: d("EXTWORKER_PROVIDER_TIMEOUT"), stop: stop + 15*time.Second}
}

// within is how long a supervised run of the tier may take: 90s with short timeouts; at
// longer settings, a crashed attempt's lease, twice the lock and the long poll (its lock
// runs out and the next poll finds the task; the deferred retry is found by a poll too),
// one provider call, and a minute of work.
func (w workerTiming) within() time.Duration {
	return max(90*time.Second, w.lease+2*(w.lock+w.longPoll)+w.providerTimeout+time.Minute)
}

// The crash points of the ledger, each hit by a real worker process that dies by SIGKILL
// there (package failpoint) and is restarted by a supervisor, against the real engine,
// the real PostgreSQL and the fake provider. After each run the oracle checks both sides:
// one charge for the invoice, the ledger settled with that charge, the instance completed
// with the ledger's result, and no dispatch after an unknown without a not-found.
func TestCrashPoints(t *testing.T) {
	for _, ft := range faultTiers {
		t.Run(ft.name, func(t *testing.T) {
			ft.skipIfShort(t)
			if ft.atDefaults() {
				crashPointsTogether(t, ft)
				return
			}
			crashPointsOneByOne(t, ft)
		})
	}
}

// crashPoints are the six crash points, C1-C6, in the order an attempt passes them.
var crashPoints = []string{failpoint.AfterPrepared, failpoint.AfterDispatchMark, failpoint.AfterProviderAnswer,
	failpoint.AfterConfirm, failpoint.BeforeComplete, failpoint.InExtension}

// crashPointsOneByOne runs each crash point on its own invoice, one after the other.
func crashPointsOneByOne(t *testing.T, ft faultTier) {
	f := newFaultEnv(t, "crash", 5*time.Minute)
	c, ctx, bin, pay, ns, ledger := f.c, f.ctx, f.bin, f.pay, f.ns, f.ledger
	w := tierTiming(t, bin, ft)

	pay.SlowDelay = w.lock + time.Second // longer than the lock: the extender must run
	for _, point := range crashPoints {
		t.Run(point, func(t *testing.T) {
			invoice := testenv.Unique("INV-" + point)
			if point == failpoint.InExtension {
				// C6: the worker dies extending the lock while the provider is still charging.
				pay.Script(invoice, fakeprovider.SlowAnswer)
			}
			id := f.start(t, invoice, 4200)
			kills := supervision{bin: bin, ns: ns, providerURL: pay.URL(), tier: ft, points: []string{point}, within: w.within(), stop: w.stop}.
				run(t, func() bool {
					h, err := c.HistoricProcessInstance(ctx, id)
					return err == nil && h.State == "COMPLETED"
				})
			assert.Len(t, kills, 1, "the worker died once, at %s", point)
			oracle(t, ctx, c, ledger, pay, invoice, id)
		})
	}
}

// crashPointsTogether runs the six crash points in one supervised run, so that the
// ledger leases the crashes leave behind run out together rather than one after the
// other: the k-th worker process runs with the k-th crash point of togetherOrder armed,
// and the k-th invoice starts just before that process, so it is the fresh work the
// process dies on. The invoices crashed while the ledger held their lease wait it out;
// processes from the seventh on run without a failpoint until every invoice is done.
//
// C6 comes first: its invoice is answered slowly (the provider is still charging when
// the first lock extension goes out, a third of the lock after the fetch, and answers
// before the provider timeout), and only the first process gets its invoice at once.
// Every later invoice goes first to the pending long poll the previous, killed process
// left at the engine (an abandoned poll still locks the next task: docs/engine-facts.md)
// and is fetchable again only when that lock runs out, a lock's length later; handed over
// late, it is extended at once, which would kill C6's process before the charge.
func crashPointsTogether(t *testing.T, ft faultTier) {
	f := newFaultEnv(t, "crash", 8*time.Minute)
	c, ctx, bin, pay, ns, ledger := f.c, f.ctx, f.bin, f.pay, f.ns, f.ledger
	w := tierTiming(t, bin, ft)
	firstExtension := lockext.Config{LockDuration: w.lock}.WithDefaults().Interval
	require.Less(t, firstExtension, w.providerTimeout, "C6 needs a lock extension during a provider call")
	pay.SlowDelay = (firstExtension + w.providerTimeout) / 2
	t.Logf("worker at the shipped defaults: lock %v (first extension after %v), long poll %v, ledger lease %v, provider timeout %v; C6's provider answers after %v; the run may take %v",
		w.lock, firstExtension, w.longPoll, w.lease, w.providerTimeout, pay.SlowDelay, w.within())

	points := togetherOrder
	invoices := make([]string, len(points))
	ids := make([]string, len(points))
	for k, point := range points {
		invoices[k] = testenv.Unique("INV-" + point)
	}
	pay.Script(invoices[0], fakeprovider.SlowAnswer) // C6, in-extension
	began := time.Now()
	kills := supervision{bin: bin, ns: ns, providerURL: pay.URL(), tier: ft, points: points, within: w.within(), stop: w.stop,
		before: func(attempt int) {
			if attempt < len(points) {
				ids[attempt] = f.start(t, invoices[attempt], 4200)
			}
		}}.run(t, func() bool {
		return completed(ctx, f, ids...)
	})
	took := time.Since(began)
	for k, at := range kills {
		if k < len(points) {
			t.Logf("process %d died at %s %.1fs into the run", k, points[k], at.Seconds())
		}
	}
	require.Len(t, kills, len(points), "each armed process died once, at its crash point, and no other")
	for k, point := range points {
		h, err := c.HistoricProcessInstance(ctx, ids[k])
		require.NoError(t, err)
		t.Logf("%s: %s completed %.1fs after it started", point, invoices[k], h.EndTime.Sub(h.StartTime.Time).Seconds())
		oracle(t, ctx, c, ledger, pay, invoices[k], ids[k])
		assertNoIncidents(t, c, ids[k])
	}
	// C6 died while the provider was charging: the charge was made, and the next attempt
	// (once the lease had run out) found it by key.
	row, err := ledger.Operations().Get(ctx, "payment.collect", "invoice:"+invoices[0]+":v1")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateReconciled, row.State, "C6: dispatched when the worker died, then reconciled (found)")
	t.Logf("six crash points at the shipped defaults in %.1fs", took.Seconds())
}

// togetherOrder is the order of the crash points in crashPointsTogether: C6 first, then
// the points that leave the ledger's lease held, so that the leases run out early.
var togetherOrder = []string{failpoint.InExtension, failpoint.AfterPrepared, failpoint.AfterDispatchMark,
	failpoint.AfterProviderAnswer, failpoint.AfterConfirm, failpoint.BeforeComplete}

// faultEnv is what every fault scenario needs: the engine, the demo deployed, the worker
// binary, a fake provider, and a migrated ledger in a namespace of its own.
type faultEnv struct {
	c      *admin.Client
	ctx    context.Context
	bin    string
	pay    *fakeprovider.Server
	ns     string
	ledger *idempotency.Ledger
}

func newFaultEnv(t *testing.T, prefix string, timeout time.Duration) faultEnv {
	t.Helper()
	return newFaultEnvOn(t, testenv.Engine(t), prefix, timeout)
}

// newFaultEnvOn is newFaultEnv on the engine c talks to.
func newFaultEnvOn(t *testing.T, c *admin.Client, prefix string, timeout time.Duration) faultEnv {
	t.Helper()
	f := faultEnv{c: c, ctx: testenv.Context(t, timeout), bin: buildBinary(t), ns: testenv.Unique(prefix)}
	pool := testenv.DB(t)
	require.NoError(t, deployDemo(f.ctx, f.c))
	pay, err := fakeprovider.Start(demoDeclineLimit)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pay.Close() })
	f.pay = pay
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	require.NoError(t, run([]string{"migrate"}, &strings.Builder{}, &strings.Builder{}))
	f.ledger, err = idempotency.New(pool, idempotency.Config{Namespace: f.ns})
	require.NoError(t, err)
	return f
}

// start starts a demo invoice and returns its process instance id.
func (f faultEnv) start(t *testing.T, invoice string, amount int64) string {
	t.Helper()
	pi, err := f.c.StartProcess(f.ctx, demoProcessKey, admin.StartProcessRequest{BusinessKey: invoice,
		Variables: camunda7.Variables{"invoiceId": camunda7.StringVar(invoice), "amountCents": camunda7.LongVar(amount)}})
	require.NoError(t, err)
	return pi.ID
}

// supervise runs worker processes with short timeouts, the first with the failpoint
// enabled, restarting any that dies, until done reports true; then it stops the last
// one. It returns the kills.
func supervise(t *testing.T, bin, ns, providerURL, point string, done func() bool) int {
	t.Helper()
	var points []string
	if point != "" {
		points = []string{point}
	}
	return len(supervision{bin: bin, ns: ns, providerURL: providerURL, tier: shortTier, points: points, within: 90 * time.Second,
		stop: tierTiming(t, bin, shortTier).stop}.run(t, done))
}

// supervision runs one worker process at a time in a tier, restarting any that dies by
// SIGKILL (its failpoint), until done.
type supervision struct {
	bin, ns, providerURL string
	tier                 faultTier
	// points: the k-th process runs with points[k] armed, later ones with none.
	points []string
	// within bounds the whole run; stop bounds the last process's exit after SIGTERM.
	within, stop time.Duration
	// before, if set, is called before the attempt-th process (from 0) starts.
	before func(attempt int)
}

// run supervises until done reports true, then stops the last process with SIGTERM. It
// returns when each kill happened, from the start of the run. Every process's logs are
// printed if the test fails.
func (s supervision) run(t *testing.T, done func() bool) []time.Duration {
	t.Helper()
	var kills []time.Duration
	began := time.Now()
	deadline := began.Add(s.within)
	var logs []*testenv.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			for k, l := range logs {
				t.Logf("worker process %d (%s tier) logs:\n%s", k, s.tier.name, l.String())
			}
		}
	})
	for attempt := 0; ; attempt++ {
		env := append(s.tier.env(s.ns, s.providerURL), "EXTWORKER_WORKER_ID="+testenv.Unique("w"))
		point := ""
		if attempt < len(s.points) {
			point = s.points[attempt]
			env = append(env, failpoint.Env+"="+point)
		}
		if s.before != nil {
			s.before(attempt)
		}
		cmd := exec.Command(s.bin, "run")
		cmd.Env = env
		l := &testenv.Buffer{}
		logs = append(logs, l)
		cmd.Stdout, cmd.Stderr = l, l
		require.NoError(t, cmd.Start())
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		for {
			select {
			case err := <-exited:
				var exit *exec.ExitError
				if errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL {
					kills = append(kills, time.Since(began))
					goto restart
				}
				t.Fatalf("worker process %d exited unexpectedly: %v (its logs follow)", attempt, err)
			default:
			}
			if done() {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				stopped := time.NewTimer(s.stop)
				defer stopped.Stop()
				select {
				case <-exited:
				case <-stopped.C:
					_ = cmd.Process.Kill()
					<-exited
					t.Errorf("worker process %d still ran %v after SIGTERM (%s tier)", attempt, s.stop, s.tier.name)
				}
				return kills
			}
			if time.Now().After(deadline) {
				_ = cmd.Process.Kill()
				<-exited
				t.Fatalf("not done within %v (%s tier, process %d, failpoint %q)", s.within, s.tier.name, attempt, point)
			}
			tick := time.NewTimer(100 * time.Millisecond) // poll the engine for the outcome
			select {
			case <-tick.C:
			case err := <-exited:
				tick.Stop()
				exited <- err
			}
		}
	restart:
	}
}

// oracle checks the invariants for one invoice after its instance completed
// (internal/oracle: the same checks as the soak's), and that the engine completed it.
func oracle(t *testing.T, ctx context.Context, c *admin.Client, l *idempotency.Ledger, pay *fakeprovider.Server, invoice, instanceID string) {
	t.Helper()
	hv, err := c.HistoricVariableInstances(ctx, url.Values{"processInstanceId": {instanceID}, "variableName": {"paymentRef"}})
	require.NoError(t, err)
	require.Len(t, hv, 1)
	ref, err := camunda7.Variables{"v": hv[0].Variable()}.String("v")
	require.NoError(t, err)
	key := "invoice:" + invoice + ":v1"
	for _, v := range invariants.Check(ctx, l.Operations(), pay.Charges(), invariants.Expect{Scope: "payment.collect", Key: key, Invoice: invoice, EngineRef: ref}) {
		t.Error(v)
	}
	events, err := l.Operations().Events(ctx, "payment.collect", key)
	require.NoError(t, err)
	var trail []string
	for _, e := range events {
		trail = append(trail, fmt.Sprintf("%s (attempt %d): %s", e.ToState, e.Attempt, e.Reason))
	}
	t.Logf("ledger trail for %s:\n  %s", invoice, strings.Join(trail, "\n  "))
}

// B1 and K1: a decline takes the BPMN error path with no charge and no retries; the same
// invoice submitted again with a different amount (same intent key, different request)
// is refused with an incident, and nothing is sent with the new request.
func TestDeclineAndDigestMismatch(t *testing.T) {
	for _, ft := range faultTiers {
		t.Run(ft.name, func(t *testing.T) {
			ft.skipIfShort(t)
			declineAndDigestMismatch(t, ft)
		})
	}
}

func declineAndDigestMismatch(t *testing.T, ft faultTier) {
	f := newFaultEnv(t, "faults", 6*time.Minute)
	c, ctx, bin, pay, ns, ledger := f.c, f.ctx, f.bin, f.pay, f.ns, f.ledger
	w := tierTiming(t, bin, ft)
	began := time.Now()
	defer func() { t.Logf("%s tier: %.1fs", ft.name, time.Since(began).Seconds()) }()

	start := func(invoice string, amount int64) string { return f.start(t, invoice, amount) }
	declined := testenv.Unique("INV-B1")
	twice := testenv.Unique("INV-K1")
	bID := start(declined, demoDeclineLimit+1)
	firstID := start(twice, 1000)
	var secondID string
	kills := supervision{bin: bin, ns: ns, providerURL: pay.URL(), tier: ft, within: w.within(), stop: w.stop}.run(t, func() bool {
		h, err := c.HistoricProcessInstance(ctx, firstID)
		if err != nil || h.State != "COMPLETED" {
			return false
		}
		if secondID == "" {
			secondID = start(twice, 999_999) // the same invoice, another amount
		}
		hb, err := c.HistoricProcessInstance(ctx, bID)
		inc, ierr := c.Incidents(ctx, url.Values{"processInstanceId": {secondID}})
		return err == nil && ierr == nil && hb.State == "COMPLETED" && len(inc) == 1
	})
	assert.Empty(t, kills)

	// B1: the BPMN error path, no charge, the ledger rejected.
	acts, err := c.HistoricActivityInstances(ctx, url.Values{"processInstanceId": {bID}, "activityId": {"invoiceDeclined"}})
	require.NoError(t, err)
	assert.Len(t, acts, 1, "B1: the declined path")
	row, err := ledger.Operations().Get(ctx, "payment.collect", "invoice:"+declined+":v1")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateRejected, row.State)
	log, err := c.ExternalTaskLog(ctx, url.Values{"processInstanceId": {bID}, "failureLog": {"true"}})
	require.NoError(t, err)
	assert.Empty(t, log, "B1: no failure reported, no retries")

	// K1: one charge with the first amount; the second instance holds an incident.
	var charges []fakeprovider.Charge
	for _, ch := range pay.Charges() {
		if ch.Invoice == twice || ch.Invoice == declined {
			charges = append(charges, ch)
		}
	}
	require.Len(t, charges, 1)
	assert.EqualValues(t, 1000, charges[0].AmountCents, "K1: never a request with the new digest")
	inc, err := c.Incidents(ctx, url.Values{"processInstanceId": {secondID}})
	require.NoError(t, err)
	require.Len(t, inc, 1)
	assert.Contains(t, inc[0].IncidentMessage, "same intent key, different request")
	details, err := c.ExternalTaskErrorDetails(ctx, inc[0].Configuration)
	require.NoError(t, err)
	assert.NotContains(t, details, "999999", "errorDetails hold digests, not the request")
}

// T1 and T3: a 429 (nothing done, Retry-After) and a 503 (nothing stored) from the
// provider: retried with the same key, one charge, completed, no incident.
func TestProviderRateLimitedAndUnavailable(t *testing.T) {
	for _, ft := range faultTiers {
		t.Run(ft.name, func(t *testing.T) {
			ft.skipIfShort(t)
			providerRateLimitedAndUnavailable(t, ft)
		})
	}
}

func providerRateLimitedAndUnavailable(t *testing.T, ft faultTier) {
	f := newFaultEnv(t, "throttle", 6*time.Minute)
	c, ctx, bin, pay, ns, ledger := f.c, f.ctx, f.bin, f.pay, f.ns, f.ledger
	w := tierTiming(t, bin, ft)
	began := time.Now()
	defer func() { t.Logf("%s tier: %.1fs", ft.name, time.Since(began).Seconds()) }()
	cases := map[string][]fakeprovider.Fault{
		testenv.Unique("INV-T1"): {fakeprovider.RateLimited, fakeprovider.RateLimited, fakeprovider.RateLimited},
		testenv.Unique("INV-T3"): {fakeprovider.Unavailable},
	}
	ids := map[string]string{}
	for invoice, faults := range cases {
		pay.Script(invoice, faults...)
		ids[invoice] = f.start(t, invoice, 777)
	}
	kills := supervision{bin: bin, ns: ns, providerURL: pay.URL(), tier: ft, within: w.within(), stop: w.stop}.run(t, func() bool {
		for _, id := range ids {
			if h, err := c.HistoricProcessInstance(ctx, id); err != nil || h.State != "COMPLETED" {
				return false
			}
		}
		return true
	})
	assert.Empty(t, kills)
	for invoice, id := range ids {
		oracle(t, ctx, c, ledger, pay, invoice, id)
		inc, err := c.HistoricIncidents(ctx, url.Values{"processInstanceId": {id}})
		require.NoError(t, err)
		assert.Empty(t, inc, "%s: no incident", invoice)
		if strings.HasPrefix(invoice, "INV-T1") {
			// Each retry after a 429 waited out the provider's Retry-After (1s).
			events, err := ledger.Operations().Events(ctx, "payment.collect", "invoice:"+invoice+":v1")
			require.NoError(t, err)
			var last time.Time
			for _, e := range events {
				if e.ToState != idempotency.StateDispatched {
					continue
				}
				if !last.IsZero() {
					assert.GreaterOrEqual(t, e.At.Sub(last), 900*time.Millisecond, "dispatches after a 429 honour Retry-After")
				}
				last = e.At
			}
		}
	}
}
