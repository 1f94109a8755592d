package main

import (
	"bufio"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
)

// Network faults (matrix rows C5b, E1, P1, P2): a real worker process whose link to the
// engine or to the ledger's PostgreSQL runs through toxiproxy (testenv.Toxi), against
// the real engine, the real PostgreSQL and the fake provider, checked on both sides by
// the oracle after each run.
//
// They run against the engine with REST authentication (`make up`'s second engine, its
// own database), as the harness does (docs/reliability.md, The harness); that also keeps
// them apart from the other fault tests, which run their workers on the first engine.
// Every worker binary serves the demo topics, so no other demo worker may run against
// the same engine meanwhile; netCollectTask fails, naming the cause, if one took a task.

// confirmMarker is in the ledger's confirmed transition, and only there: the event reason
// it binds as a parameter. That transition is one statement, a transaction of its own
// (idempotency's confirm for an effect without Local), so the answer to it is the answer
// to its COMMIT.
var confirmMarker = []byte("confirmed by the provider")

// C5b: the engine commits a completion whose answer is lost (a downstream timeout toxic
// on the worker->engine link from the moment the provider has the request). The worker
// resolves the lost answer by asking the engine, finds the task gone, and counts it done:
// completed once, one charge, no incident, no second provider request.
func TestNetworkC5bCompleteAnswerLost(t *testing.T) {
	f := newNetEnv(t, "c5b")
	engine := testenv.Toxi(t, "engine", netHostPort(t, testenv.AuthEngineURL()))
	f.pay.SlowDelay = time.Second
	invoice := testenv.Unique("INV-C5b")
	f.pay.Script(invoice, fakeprovider.SlowAnswer)
	id := f.start(t, invoice, 4200)
	w := startNetWorker(t, f, netViaProxy(t, testenv.AuthEngineURL(), engine.Addr()), testenv.DBURL(),
		"EXTWORKER_ENGINE_TIMEOUT=3s", "EXTWORKER_LOCK_DURATION=20s", "EXTWORKER_LEDGER_LEASE=10s", "EXTWORKER_PROVIDER_TIMEOUT=8s")

	w.eventually(t, 30*time.Second, "the provider to have the charge request", func() bool { return len(chargesFor(f.pay, invoice)) == 1 })
	engine.Add("answers", testenv.Downstream, testenv.Timeout{})
	w.note(t, "toxic: downstream timeout on worker->engine (answers dropped), the handler inside the provider call")
	var collect admin.HistoricActivityInstance
	w.eventually(t, 20*time.Second, "the engine to commit the completion of collectPayment", func() bool {
		acts, err := f.c.HistoricActivityInstances(f.ctx, url.Values{"processInstanceId": {id}, "activityId": {"collectPayment"}})
		if err != nil || len(acts) != 1 || acts[0].EndTime.IsZero() {
			return false
		}
		collect = acts[0]
		return true
	})
	w.note(t, "the engine committed the completion at %s; its answer is held", collect.EndTime.Format("15:04:05.000"))
	engine.Remove("answers")
	w.note(t, "toxic removed (the connection holding the answer closes)")
	w.eventually(t, 30*time.Second, "the instance to complete", netCompleted(f, id))
	w.stop(t)

	oracle(t, f.ctx, f.c, f.ledger, f.pay, invoice, id)
	taskID := netCollectTask(t, f, w, id)
	netNoIncident(t, f, id)
	row := netLedgerRow(t, f, invoice)
	assert.Equal(t, idempotency.StateConfirmed, row.State)
	assert.Equal(t, 1, row.Dispatches, "no second provider request")
	assert.Len(t, requestsFor(f.pay, invoice), 1, "no second provider request")
	resolved := w.records(t, "report answer was lost; the task is gone, so the report took effect", taskID)
	if assert.Len(t, resolved, 1, "the worker resolved the lost answer by asking the engine; logs:\n%s", w.logs.String()) {
		t.Logf("worker: %q (lost answer: %v)", resolved[0]["msg"], resolved[0]["lost_answer"])
	}
	assert.Empty(t, w.records(t, "reporting the result failed", taskID), "the completion was not reported as failed")
}

// E1: the engine is unreachable (connections refused, open ones dropped) for 3 x
// lockDuration while a task is in the handler. The handler finishes and confirms in the
// ledger; its completion cannot be delivered, and is sent again with backoff (the lock
// kept, locked again once the engine is back, as nobody took the task) until it lands:
// the handler runs once, the provider is asked once, and no incident or failure comes of
// the outage.
func TestNetworkE1EngineUnreachable(t *testing.T) {
	f := newNetEnv(t, "e1")
	engine := testenv.Toxi(t, "engine", netHostPort(t, testenv.AuthEngineURL()))
	const lock = 2 * time.Second
	f.pay.SlowDelay = time.Second
	invoice := testenv.Unique("INV-E1")
	f.pay.Script(invoice, fakeprovider.SlowAnswer)
	id := f.start(t, invoice, 4300)
	w := startNetWorker(t, f, netViaProxy(t, testenv.AuthEngineURL(), engine.Addr()), testenv.DBURL(),
		"EXTWORKER_LOCK_DURATION="+lock.String(), "EXTWORKER_ENGINE_TIMEOUT=2s")

	w.eventually(t, 30*time.Second, "the provider to have the charge request", func() bool { return len(chargesFor(f.pay, invoice)) == 1 })
	engine.Disable()
	down := time.Now()
	w.note(t, "engine link disabled for %v (3 x lockDuration), the handler inside the provider call", 3*lock)
	w.eventually(t, 20*time.Second, "the handler to settle the intent in the ledger during the outage", func() bool {
		row, err := f.ledger.Operations().Get(f.ctx, "payment.collect", "invoice:"+invoice+":v1")
		return err == nil && row.State.Terminal()
	})
	w.note(t, "the ledger settled the intent while the engine is away")
	// The outage has a fixed length: this wait is the fault's schedule, not a wait for state.
	outage := time.NewTimer(time.Until(down.Add(3 * lock)))
	<-outage.C
	engine.Enable()
	w.note(t, "engine link enabled again after %v", time.Since(down).Round(time.Millisecond))
	w.eventually(t, 40*time.Second, "the instance to complete", netCompleted(f, id))
	w.stop(t)

	oracle(t, f.ctx, f.c, f.ledger, f.pay, invoice, id)
	taskID := netCollectTask(t, f, w, id)
	netNoIncident(t, f, id)
	row := netLedgerRow(t, f, invoice)
	assert.Equal(t, 1, row.Dispatches, "dispatched once")
	assert.Len(t, requestsFor(f.pay, invoice), 1, "the provider was asked once")
	resending := w.records(t, "reporting the result failed; sending it again until the engine answers", taskID)
	delivered := w.records(t, "report delivered", taskID)
	handled := w.records(t, "task handled", taskID)
	for _, r := range delivered {
		t.Logf("collect-payment task %s: report delivered after %v attempts over %vns", taskID, r["attempts"], r["after"])
	}
	assert.Len(t, resending, 1, "the first report could not reach the engine, and was sent again")
	assert.Len(t, delivered, 1, "the resent report landed")
	assert.Len(t, handled, 1, "the handler ran once; its result delivered once, after the outage")
	assert.Empty(t, w.records(t, "reporting the result failed", taskID), "the report was not given up")
	assert.Empty(t, w.records(t, "lock lost while the handler ran; result discarded", taskID))
}

// P1: the ledger's PostgreSQL becomes unreachable from the worker while several invoices
// are in flight: first refused with open connections dropped (Disable), then every
// connection reset as soon as it carries data (reset_peer). Invoices caught inside the
// provider call cannot confirm; others cannot claim. After each outage every invoice ends
// paid once, the ledger legal and in agreement with the provider and the engine.
//
// Each outage lasts 2s, inside the demo's retry budget (5 attempts, 200ms doubling): a
// longer one ends in incidents for an operator, by design.
func TestNetworkP1LedgerUnreachable(t *testing.T) {
	f := newNetEnv(t, "p1")
	db := testenv.Toxi(t, "ledger", netHostPort(t, testenv.DBURL()))
	f.pay.SlowDelay = time.Second
	w := startNetWorker(t, f, testenv.AuthEngineURL(), netViaProxy(t, testenv.DBURL(), db.Addr()))

	ids := map[string]string{}
	outage := func(name string, cut, restore func()) {
		var slow []string
		for i := 0; i < 3; i++ {
			invoice := testenv.Unique("INV-P1-" + name)
			f.pay.Script(invoice, fakeprovider.SlowAnswer)
			ids[invoice] = f.start(t, invoice, int64(5000+i))
			slow = append(slow, invoice)
		}
		w.eventually(t, 30*time.Second, "the slow invoices to be inside the provider call", func() bool {
			for _, inv := range slow {
				if len(chargesFor(f.pay, inv)) != 1 {
					return false
				}
			}
			return true
		})
		cut()
		start := time.Now()
		for i := 0; i < 3; i++ { // fetched while the ledger is away: their claims fail
			invoice := testenv.Unique("INV-P1-" + name)
			ids[invoice] = f.start(t, invoice, int64(6000+i))
		}
		w.note(t, "ledger link %s: 3 invoices inside the provider call, 3 more started", name)
		timer := time.NewTimer(time.Until(start.Add(2 * time.Second))) // the outage's length
		<-timer.C
		restore()
		w.note(t, "ledger link back after %v", time.Since(start).Round(time.Millisecond))
		w.eventually(t, 40*time.Second, "every invoice to complete", func() bool {
			for _, id := range ids {
				if !netCompleted(f, id)() {
					return false
				}
			}
			return true
		})
	}
	outage("disabled", db.Disable, db.Enable)
	outage("reset", func() { db.Add("reset", testenv.Upstream, testenv.ResetPeer{}) }, func() { db.Remove("reset") })
	w.stop(t)

	for invoice, id := range ids {
		oracle(t, f.ctx, f.c, f.ledger, f.pay, invoice, id)
		netNoIncident(t, f, id)
		row := netLedgerRow(t, f, invoice)
		assert.Len(t, requestsFor(f.pay, invoice), 1, "%s: one charge request (the provider is healthy)", invoice)
		t.Logf("%s: ledger %s, attempt %d, %d dispatch(es), %d reconciliation(s)", invoice, row.State, row.Attempt, row.Dispatches, row.Reconciliations)
	}
	assert.Zero(t, f.pay.DoubleCharges())
	assert.Len(t, f.pay.Charges(), len(ids), "one charge per invoice")
	failures := 0
	for _, id := range ids {
		fails, err := f.c.ExternalTaskLog(f.ctx, url.Values{"processInstanceId": {id}, "failureLog": {"true"}})
		require.NoError(t, err)
		failures += len(fails)
	}
	t.Logf("%d retryable failures reported for %d invoices across the two outages", failures, len(ids))
	assert.NotZero(t, failures, "the outages reached the handlers")
}

// P2: the ledger's PostgreSQL loses the COMMIT of the confirmed transition, at exactly that
// statement (testenv.ToxiProxy.LoseOnce on confirmMarker), while nothing else is in flight
// on the ledger link. Two variants: the answer is lost (committed; the worker cannot know,
// and its compare-and-set back to unknown is refused), and the statement itself is lost
// (never committed; the intent goes unknown and is reconciled with the provider). Either
// way: one charge, the ledger settled, the instance completed, legal transitions only.
func TestNetworkP2CommitLost(t *testing.T) {
	f := newNetEnv(t, "p2")
	db := testenv.Toxi(t, "ledger", netHostPort(t, testenv.DBURL()))
	f.pay.SlowDelay = time.Second
	// Without TLS on the proxied link, for LoseOnce to see the statement.
	dbURL, err := url.Parse(netViaProxy(t, testenv.DBURL(), db.Addr()))
	require.NoError(t, err)
	q := dbURL.Query()
	q.Set("sslmode", "disable")
	dbURL.RawQuery = q.Encode()
	w := startNetWorker(t, f, testenv.AuthEngineURL(), dbURL.String())

	for _, tc := range []struct {
		name string
		loss testenv.Loss
		want idempotency.State
	}{
		{"answer", testenv.LoseAnswer, idempotency.StateConfirmed},
		{"request", testenv.LoseRequest, idempotency.StateReconciled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			invoice := testenv.Unique("INV-P2-" + tc.name)
			f.pay.Script(invoice, fakeprovider.SlowAnswer)
			id := f.start(t, invoice, 4400)
			w.eventually(t, 30*time.Second, "the provider to have the charge request", func() bool { return len(chargesFor(f.pay, invoice)) == 1 })
			fired := db.LoseOnce("confirm", confirmMarker, tc.loss)
			t.Cleanup(func() { db.Remove("confirm") })
			w.note(t, "armed: lose the %s of the confirmed transition on worker->PostgreSQL", tc.name)
			w.eventually(t, 20*time.Second, "the confirmed transition's commit to be lost", func() bool {
				select {
				case <-fired:
					return true
				default:
					return false
				}
			})
			w.note(t, "fired: the %s of the confirmed transition was lost and its connection closed", tc.name)
			w.eventually(t, 40*time.Second, "the instance to complete", netCompleted(f, id))

			oracle(t, f.ctx, f.c, f.ledger, f.pay, invoice, id)
			netNoIncident(t, f, id)
			row := netLedgerRow(t, f, invoice)
			assert.Equal(t, tc.want, row.State)
			assert.Equal(t, 1, row.Dispatches, "never sent twice")
			assert.Len(t, requestsFor(f.pay, invoice), 1, "never sent twice")
			taskID := netCollectTask(t, f, w, id)
			fails, err := f.c.ExternalTaskLog(f.ctx, url.Values{"externalTaskId": {taskID}, "failureLog": {"true"}})
			require.NoError(t, err)
			require.NotEmpty(t, fails, "the failed confirm was reported as a retryable failure")
			assert.Contains(t, fails[0].ErrorMessage, "confirm")
			if tc.loss == testenv.LoseAnswer {
				// The COMMIT landed: moving the row back to unknown is refused by its
				// compare-and-set, and the retry replays the stored result.
				assert.NotEmpty(t, w.records(t, "recording unknown after a failed confirm failed", taskID),
					"the CAS refused to move a committed row; logs:\n%s", w.logs.String())
			}
		})
	}
	w.stop(t)
	assert.Zero(t, f.pay.DoubleCharges())
}

// newNetEnv is newFaultEnv on the engine with REST authentication.
func newNetEnv(t *testing.T, prefix string) faultEnv {
	t.Helper()
	f := newFaultEnv(t, prefix, 2*time.Minute)
	f.c = testenv.AuthEngine(t)
	require.NoError(t, deployDemo(f.ctx, f.c))
	return f
}

// netLongPoll is the workers' long poll.
const netLongPoll = time.Second

// netWorker is one real worker process ("invoice run") with its engine and ledger
// URLs chosen by the test, logging JSON into logs.
type netWorker struct {
	id     string
	cmd    *exec.Cmd
	logs   *testenv.Buffer
	exited chan error
	began  time.Time
}

// startNetWorker starts a worker for f's namespace and provider, with a 2s lock and ledger
// lease and a 1s long poll unless extra overrides them (the lease also bounds a dispatch:
// a scripted slow answer must come sooner). It is killed at cleanup if the test ends
// without stopping it.
func startNetWorker(t *testing.T, f faultEnv, engineURL, dbURL string, extra ...string) *netWorker {
	t.Helper()
	id := testenv.Unique("net")
	cmd := exec.Command(f.bin, "run")
	cmd.Env = append(os.Environ(), "EXTWORKER_ENGINE_URL="+engineURL, "EXTWORKER_DATABASE_URL="+dbURL,
		"EXTWORKER_ENGINE_USER="+testenv.AuthEngineUser, "EXTWORKER_ENGINE_PASSWORD="+testenv.AuthEnginePassword,
		"EXTWORKER_LEDGER_NAMESPACE="+f.ns, "EXTWORKER_PROVIDER_URL="+f.pay.URL(), "EXTWORKER_WORKER_ID="+id,
		"EXTWORKER_LOCK_DURATION=2s", "EXTWORKER_LEDGER_LEASE=2s", "EXTWORKER_PROVIDER_TIMEOUT=1500ms", "EXTWORKER_LONG_POLL="+netLongPoll.String(),
		"EXTWORKER_LOG_LEVEL=info",
		"EXTWORKER_LOG_FORMAT=json", "EXTWORKER_HTTP_ADDR=127.0.0.1:0")
	cmd.Env = append(cmd.Env, extra...)
	return startNetWorkerCmd(t, id, cmd)
}

// note logs an injection or an observation with the time since the worker started.
func (w *netWorker) note(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf("[+%6.3fs] "+format, append([]any{time.Since(w.began).Seconds()}, args...)...)
}

// eventually polls cond until it holds; the worker dying or the deadline passing fails
// the test with the worker's logs.
func (w *netWorker) eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case err := <-w.exited:
			w.exited <- err
			t.Fatalf("the worker exited (%v) while waiting for %s; logs:\n%s", err, what, w.logs.String())
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; worker logs:\n%s", timeout, what, w.logs.String())
		}
	}
	w.note(t, "observed: %s", what)
}

// stop sends SIGTERM and waits for a clean exit, then for the engine to drop the long
// poll the worker aborted: the engine keeps an abandoned poll until its timeout (1s here)
// and locks for it any task that appears meanwhile, and the worker waits for that only
// if it changed something itself. Without this wait, the next test's first task can be
// locked for a worker that is gone, for that worker's lock duration.
func (w *netWorker) stop(t *testing.T) {
	t.Helper()
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(45 * time.Second)
	defer timer.Stop()
	select {
	case err := <-w.exited:
		w.exited <- err
		require.NoError(t, err, "the worker exits cleanly on SIGTERM; logs:\n%s", w.logs.String())
	case <-timer.C:
		_ = w.cmd.Process.Kill()
		t.Fatalf("the worker did not stop within 45s of SIGTERM; logs:\n%s", w.logs.String())
	}
	pollEnd := time.NewTimer(netLongPoll + 500*time.Millisecond)
	<-pollEnd.C
}

// records returns the worker's JSON log records with message msg about external task
// taskID.
func (w *netWorker) records(t *testing.T, msg, taskID string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(w.logs.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r map[string]any
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		if r["msg"] == msg && r["external_task_id"] == taskID {
			out = append(out, r)
		}
	}
	return out
}

// netHostPort is a URL's "host:port".
func netHostPort(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	return u.Host
}

// netViaProxy is raw with its host replaced by the proxy's address.
func netViaProxy(t *testing.T, raw, proxyAddr string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	u.Host = proxyAddr
	return u.String()
}

// netCompleted reports whether the instance has completed.
func netCompleted(f faultEnv, id string) func() bool {
	return func() bool {
		h, err := f.c.HistoricProcessInstance(f.ctx, id)
		return err == nil && h.State == "COMPLETED"
	}
}

// netCollectTask returns the id of the instance's collect-payment task, and checks the
// engine recorded exactly one completion of it, by w. (Every worker binary serves the
// demo topics: a test's worker must be the only one running against the engine.)
func netCollectTask(t *testing.T, f faultEnv, w *netWorker, id string) string {
	t.Helper()
	done, err := f.c.ExternalTaskLog(f.ctx, url.Values{"processInstanceId": {id}, "topicName": {demoTopicCollect}, "successLog": {"true"}})
	require.NoError(t, err)
	require.Len(t, done, 1, "collect-payment completed exactly once")
	require.Equal(t, w.id, done[0].WorkerID, "completed by another worker: another process serves the demo topics on this engine")
	acts, err := f.c.HistoricActivityInstances(f.ctx, url.Values{"processInstanceId": {id}, "activityId": {"collectPayment"}})
	require.NoError(t, err)
	assert.Len(t, acts, 1, "collectPayment ran once in the engine")
	return done[0].ExternalTaskID
}

func netNoIncident(t *testing.T, f faultEnv, id string) {
	t.Helper()
	inc, err := f.c.HistoricIncidents(f.ctx, url.Values{"processInstanceId": {id}})
	require.NoError(t, err)
	assert.Empty(t, inc, "no incident")
}

func netLedgerRow(t *testing.T, f faultEnv, invoice string) idempotency.Row {
	t.Helper()
	row, err := f.ledger.Operations().Get(f.ctx, "payment.collect", "invoice:"+invoice+":v1")
	require.NoError(t, err)
	return row
}

// startNetWorkerCmd starts cmd as the worker process id, its output in the worker's
// logs; at cleanup a process still running is killed and reaped.
func startNetWorkerCmd(t *testing.T, id string, cmd *exec.Cmd) *netWorker {
	t.Helper()
	w := &netWorker{id: id, cmd: cmd, logs: &testenv.Buffer{}, exited: make(chan error, 1), began: time.Now()}
	cmd.Stdout, cmd.Stderr = w.logs, w.logs
	require.NoError(t, cmd.Start())
	go func() { w.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case err := <-w.exited:
			w.exited <- err
		default:
			_ = cmd.Process.Kill()
			<-w.exited
		}
	})
	return w
}
