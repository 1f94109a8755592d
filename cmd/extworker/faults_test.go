package main

import (
	"context"
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
	"github.com/extworker/extworker/failpoint"
	"github.com/extworker/extworker/fakeprovider"
	"github.com/extworker/extworker/idempotency"
	invariants "github.com/extworker/extworker/internal/oracle"
	"github.com/extworker/extworker/internal/testenv"
)

// The crash points of the ledger, each hit by a real worker process that dies by SIGKILL
// there (package failpoint) and is restarted by a supervisor, against the real engine,
// the real PostgreSQL and the fake provider. After each run the oracle checks both sides:
// one charge for the invoice, the ledger settled with that charge, the instance completed
// with the ledger's result, and no dispatch after an unknown without a not-found.
func TestCrashPoints(t *testing.T) {
	f := newFaultEnv(t, "crash", 5*time.Minute)
	c, ctx, bin, pay, ns, ledger := f.c, f.ctx, f.bin, f.pay, f.ns, f.ledger

	pay.SlowDelay = 3 * time.Second // longer than the 2s lock: the extender must run
	for _, point := range []string{failpoint.AfterPrepared, failpoint.AfterDispatchMark, failpoint.AfterProviderAnswer,
		failpoint.AfterConfirm, failpoint.BeforeComplete, failpoint.InExtension} {
		t.Run(point, func(t *testing.T) {
			invoice := testenv.Unique("INV-" + point)
			if point == failpoint.InExtension {
				// C6: the worker dies extending the lock while the provider is still charging.
				pay.Script(invoice, fakeprovider.SlowAnswer)
			}
			id := f.start(t, invoice, 4200)
			kills := supervise(t, bin, ns, pay.URL(), point, func() bool {
				h, err := c.HistoricProcessInstance(ctx, id)
				return err == nil && h.State == "COMPLETED"
			})
			assert.Equal(t, 1, kills, "the worker died once, at %s", point)
			oracle(t, ctx, c, ledger, pay, invoice, id)
		})
	}
}

// faultEnv is what every fault scenario needs: the engine, the demo deployed, the worker
// binary, a fake provider, and a migrated ledger in a namespace of its own.
type faultEnv struct {
	c      *camunda7.Client
	ctx    context.Context
	bin    string
	pay    *fakeprovider.Server
	ns     string
	ledger *idempotency.Ledger
}

func newFaultEnv(t *testing.T, prefix string, timeout time.Duration) faultEnv {
	t.Helper()
	f := faultEnv{c: testenv.Engine(t), ctx: testenv.Context(t, timeout), bin: buildBinary(t), ns: testenv.Unique(prefix)}
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
	pi, err := f.c.StartProcess(f.ctx, demoProcessKey, camunda7.StartProcessRequest{BusinessKey: invoice,
		Variables: camunda7.Variables{"invoiceId": camunda7.StringVar(invoice), "amountCents": camunda7.LongVar(amount)}})
	require.NoError(t, err)
	return pi.ID
}

// supervise runs worker processes, the first with the failpoint enabled, restarting any
// that dies, until done reports true; then it stops the last one. It returns the kills.
func supervise(t *testing.T, bin, ns, providerURL, point string, done func() bool) int {
	t.Helper()
	kills := 0
	deadline := time.Now().Add(90 * time.Second)
	for attempt := 0; ; attempt++ {
		env := append(os.Environ(), "EXTWORKER_ENGINE_URL="+testenv.EngineURL(), "EXTWORKER_DATABASE_URL="+testenv.DBURL(),
			"EXTWORKER_LEDGER_NAMESPACE="+ns, "EXTWORKER_PROVIDER_URL="+providerURL, "EXTWORKER_WORKER_ID="+testenv.Unique("w"),
			"EXTWORKER_LOCK_DURATION=2s", "EXTWORKER_LEDGER_LEASE=2s", "EXTWORKER_LONG_POLL=1s", "EXTWORKER_LOG_LEVEL=warn",
			"EXTWORKER_HTTP_ADDR=127.0.0.1:0")
		if attempt == 0 {
			env = append(env, failpoint.Env+"="+point)
		}
		cmd := exec.Command(bin, "run")
		cmd.Env = env
		logs := &testenv.Buffer{}
		cmd.Stdout, cmd.Stderr = logs, logs
		require.NoError(t, cmd.Start())
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		for {
			select {
			case err := <-exited:
				var exit *exec.ExitError
				if errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL {
					kills++
					goto restart
				}
				t.Fatalf("worker exited unexpectedly: %v\n%s", err, logs.String())
			default:
			}
			if done() {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				<-exited
				return kills
			}
			if time.Now().After(deadline) {
				_ = cmd.Process.Kill()
				<-exited
				t.Fatalf("not done within 90s at %s; worker logs:\n%s", point, logs.String())
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
func oracle(t *testing.T, ctx context.Context, c *camunda7.Client, l *idempotency.Ledger, pay *fakeprovider.Server, invoice, instanceID string) {
	t.Helper()
	hv, err := c.HistoricVariableInstances(ctx, url.Values{"processInstanceId": {instanceID}, "variableName": {"paymentRef"}})
	require.NoError(t, err)
	require.Len(t, hv, 1)
	ref, err := camunda7.Variables{"v": hv[0].Variable()}.String("v")
	require.NoError(t, err)
	key := "invoice:" + invoice + ":v1"
	for _, v := range invariants.Check(ctx, l, pay.Charges(), invariants.Expect{Scope: "payment.collect", Key: key, Invoice: invoice, EngineRef: ref}) {
		t.Error(v)
	}
	events, err := l.Events(ctx, "payment.collect", key)
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
	f := newFaultEnv(t, "faults", 3*time.Minute)
	c, ctx, bin, pay, ns, ledger := f.c, f.ctx, f.bin, f.pay, f.ns, f.ledger

	start := func(invoice string, amount int64) string { return f.start(t, invoice, amount) }
	declined := testenv.Unique("INV-B1")
	twice := testenv.Unique("INV-K1")
	bID := start(declined, demoDeclineLimit+1)
	firstID := start(twice, 1000)
	var secondID string
	kills := supervise(t, bin, ns, pay.URL(), "", func() bool {
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
	assert.Zero(t, kills)

	// B1: the BPMN error path, no charge, the ledger rejected.
	acts, err := c.HistoricActivityInstances(ctx, url.Values{"processInstanceId": {bID}, "activityId": {"invoiceDeclined"}})
	require.NoError(t, err)
	assert.Len(t, acts, 1, "B1: the declined path")
	row, err := ledger.Get(ctx, "payment.collect", "invoice:"+declined+":v1")
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
	f := newFaultEnv(t, "throttle", 3*time.Minute)
	c, ctx, bin, pay, ns, ledger := f.c, f.ctx, f.bin, f.pay, f.ns, f.ledger
	cases := map[string][]fakeprovider.Fault{
		testenv.Unique("INV-T1"): {fakeprovider.RateLimited, fakeprovider.RateLimited, fakeprovider.RateLimited},
		testenv.Unique("INV-T3"): {fakeprovider.Unavailable},
	}
	ids := map[string]string{}
	for invoice, faults := range cases {
		pay.Script(invoice, faults...)
		ids[invoice] = f.start(t, invoice, 777)
	}
	kills := supervise(t, bin, ns, pay.URL(), "", func() bool {
		for _, id := range ids {
			if h, err := c.HistoricProcessInstance(ctx, id); err != nil || h.State != "COMPLETED" {
				return false
			}
		}
		return true
	})
	assert.Zero(t, kills)
	for invoice, id := range ids {
		oracle(t, ctx, c, ledger, pay, invoice, id)
		inc, err := c.HistoricIncidents(ctx, url.Values{"processInstanceId": {id}})
		require.NoError(t, err)
		assert.Empty(t, inc, "%s: no incident", invoice)
		if strings.HasPrefix(invoice, "INV-T1") {
			// Each retry after a 429 waited out the provider's Retry-After (1s).
			events, err := ledger.Events(ctx, "payment.collect", "invoice:"+invoice+":v1")
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
