package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/idempotency"
	invariants "github.com/extworker/extworker/internal/oracle"
	"github.com/extworker/extworker/internal/testenv"
)

// Rows W2, L1, D1 and O1 (docs/reliability.md, Scenario matrix), each with real
// worker processes of the binary (`invoice run`, the demo handlers charging through the
// effect ledger), the real engine, the real PostgreSQL and the fake provider. Workers are
// frozen with SIGSTOP and thawed with SIGCONT to make locks expire under a handler that
// is still inside the provider call: a pause the worker cannot notice while it lasts,
// which is what a GC pause, a VM migration or an overloaded host does to a real worker.

const collectScope = "payment.collect"

// W2: two workers compete for one task. Worker A fetches the task and is inside the
// provider call (the provider holds its answer 1.5s) when it is frozen; its 2s lock and
// its 2s ledger lease run out; worker B fetches the task, finds the intent dispatched by
// an attempt whose lease has ended, reconciles it with the provider by key (the charge is
// there) and completes. Only then is A thawed: its late result must be refused by the
// engine and must change nothing.
func TestW2CompetingWorkers(t *testing.T) {
	f := newFaultEnv(t, "w2", 2*time.Minute)
	c, ctx, ledger, pay := f.c, f.ctx, f.ledger, f.pay
	invoice := testenv.Unique("INV-W2")
	key := "invoice:" + invoice + ":v1"
	pkey := idempotency.ProviderKey(f.ns, collectScope, key)
	pay.SlowDelay = 1500 * time.Millisecond // under the 1.8s dispatch deadline of a 2s lease: unfrozen, A would confirm
	pay.Script(invoice, fakeprovider.SlowAnswer)

	var a atomic.Pointer[workerProc]
	frozenAt := make(chan time.Time, 1)
	var once sync.Once
	tap := newProviderTap(t, f.pay.URL(), func(r tapRequest) {
		if r.Method != http.MethodPost || r.Invoice != invoice {
			return
		}
		once.Do(func() {
			// A is the only worker running: the charge is A's. Freeze it before the request
			// reaches the provider, so A is inside the call for the whole pause.
			a.Load().freeze(t)
			frozenAt <- time.Now()
		})
	}, nil)
	a.Store(startWorker(t, f, "A", tap.URL()))
	id := f.start(t, invoice, 4200)

	var at time.Time
	select {
	case at = <-frozenAt:
	case <-time.After(30 * time.Second):
		t.Fatalf("worker A never charged %s; its logs:\n%s", invoice, a.Load().logs.String())
	}
	b := startWorker(t, f, "B", tap.URL())
	waitCompleted(t, c, id, 40*time.Second)
	held := time.Since(at)
	require.Greater(t, held, 2*time.Second, "A was frozen past its 2s lock")
	a.Load().thaw(t)

	// What A made of its late result is in its log, once its handler has ended.
	taskID := collectTaskID(t, c, id)
	var late logRecord
	testenv.Eventually(t, 20*time.Second, "worker A to log what became of its late result", func() (bool, error) {
		for _, r := range a.Load().records() {
			if r.str("external_task_id") == taskID && handlerEnded(r) {
				late = r
				return true, nil
			}
		}
		return false, nil
	})
	a.Load().stop(t)
	b.stop(t)
	requireOwnWorkers(t, c, []string{id}, a.Load(), b)
	t.Logf("A frozen %v; A's late result: %s (outcome %s, report_error %q, cause %q)", held.Round(time.Millisecond),
		late.Msg, late.str("outcome"), late.str("report_error"), late.str("cause"))

	// Both sides: one charge, the ledger settled by B's attempt, the engine completed once
	// by B, and nothing A did reached the engine.
	oracle(t, ctx, c, ledger, pay, invoice, id)
	row, err := ledger.Operations().Get(ctx, collectScope, key)
	require.NoError(t, err)
	assert.Contains(t, []idempotency.State{idempotency.StateConfirmed, idempotency.StateReconciled}, row.State)
	assert.GreaterOrEqual(t, row.Attempt, 2, "B took the intent over with a new attempt (the fencing token)")
	actors := eventActors(t, ledger, key)
	assert.Contains(t, actors, a.Load().id, "A's attempt is in the ledger")
	assert.Contains(t, actors, b.id, "B's attempt is in the ledger")

	// The fake provider has no in-flight 409: the lease alone must keep the attempts apart.
	assert.Empty(t, tap.overlaps(pkey), "the lease kept the attempts apart at the provider: no same-key requests in flight together")
	t.Logf("provider requests for the key: %s", tap.describe(pkey))

	// A's late result changed nothing in the engine, in one of two ways, whichever of A's
	// goroutines woke first after the thaw: A reported it (a retryable failure: its
	// dispatch was cut off, or its confirm fenced by B's attempt) and the engine refused
	// it; or A's lock keeper asked the engine first, learned the lock was gone, and A
	// discarded the result without sending it.
	switch late.Msg {
	case "reporting the result failed":
		assert.Regexp(t, `engine answered (404|400 .*It is locked by worker)`, late.str("report_error"), "refused: task gone (404) or locked by another worker (400)")
	case "lock lost while the handler ran; result discarded":
		assert.Regexp(t, `engine answered (404|400 .*locked by)`, late.str("cause"), "the engine said the lock was gone: task gone (404) or locked by another worker")
	default:
		t.Fatalf("A's late result must be refused by the engine or discarded for a lock the engine says is gone: %s", late.raw)
	}
	entries, err := c.ExternalTaskLog(ctx, url.Values{"processInstanceId": {id}, "topicName": {demoTopicCollect}})
	require.NoError(t, err)
	var success []string
	for _, e := range entries {
		if e.FailureLog {
			assert.NotEqual(t, a.Load().id, e.WorkerID, "A failed the task: %s", e.ErrorMessage)
		}
		if e.SuccessLog {
			success = append(success, e.WorkerID)
		}
	}
	assert.Equal(t, []string{b.id}, success, "the task completed once, by B")
	assertNoIncidents(t, c, id)
	acts, err := c.HistoricActivityInstances(ctx, url.Values{"processInstanceId": {id}, "activityId": {"collectPayment"}})
	require.NoError(t, err)
	assert.Len(t, acts, 1, "collect payment ran once in the engine")
}

// Regression (found by this matrix): a worker that dies inside the provider call leaves
// its intent dispatched under its ledger lease, and every attempt made before the lease
// ended spent one of the task's engine retries, so a lease that outlasted the retry
// policy turned a healthy task into an incident. Fixed: an attempt that finds the intent
// in progress returns failure.Deferred, reported with the task's retries unchanged.
//
// Worker A is killed (SIGKILL) while its charge is at the provider; worker B fetches the
// task once A's 2s lock has run out. The ledger lease is 20s (the daemon's defaults have
// the same shape: a 20s lock, a 2m lease). Each of B's attempts finds the intent owned
// by A's live lease and returns failure.RetryableAfter(idempotency.ErrInProgress,
// min(lease left, 1s)); tasks.report turns that into a handleFailure whose retries are
// counted down by the topic's policy (the demo's: 5 attempts), so after five attempts,
// about 8s in and 12s before the lease ends, the task raises an incident "intent in
// progress in another attempt ... (attempt 5 of 5, retries exhausted)", although the
// next attempt after the lease would have reconciled the charge (it is at the provider)
// and completed. Expected (I3, matrix rows W2 and T4: in progress is "retryable with
// backoff"): completed, no incident, one charge. A fix would let an attempt that finds
// the intent in progress wait without spending a retry (report the failure with the
// task's current retries and a retry timeout of the lease's remainder, like river's
// JobSnooze), or keep leases within the lock duration.
func TestW2DeadWorkersLeaseDoesNotSpendRetries(t *testing.T) {
	f := newFaultEnv(t, "w2dead", 2*time.Minute)
	c, ctx, ledger, pay := f.c, f.ctx, f.ledger, f.pay
	invoice := testenv.Unique("INV-W2dead")
	var a atomic.Pointer[workerProc]
	killed := make(chan struct{})
	var once sync.Once
	tap := newProviderTap(t, pay.URL(), func(r tapRequest) {
		if r.Method == http.MethodPost && r.Invoice == invoice {
			once.Do(func() { _ = a.Load().cmd.Process.Kill(); close(killed) }) // dies with its charge in flight
		}
	}, nil)
	a.Store(startWorker(t, f, "A", tap.URL(), "EXTWORKER_LEDGER_LEASE=20s"))
	id := f.start(t, invoice, 4200)
	select {
	case <-killed:
	case <-time.After(30 * time.Second):
		t.Fatalf("worker A never charged %s; its logs:\n%s", invoice, a.Load().logs.String())
	}
	b := startWorker(t, f, "B", tap.URL(), "EXTWORKER_LEDGER_LEASE=20s")
	var incident string
	testenv.Eventually(t, 50*time.Second, "the instance to complete (or an incident)", func() (bool, error) {
		inc, err := c.Incidents(ctx, url.Values{"processInstanceId": {id}})
		if err == nil && len(inc) > 0 {
			incident = inc[0].IncidentMessage
			return true, nil
		}
		h, err := c.HistoricProcessInstance(ctx, id)
		return err == nil && h.State == "COMPLETED", err
	})
	b.stop(t)
	requireOwnWorkers(t, c, []string{id}, a.Load(), b)
	if incident != "" {
		entries, err := c.ExternalTaskLog(ctx, url.Values{"processInstanceId": {id}, "failureLog": {"true"}})
		require.NoError(t, err)
		for _, e := range entries {
			t.Logf("failure by %s at %s: %.160s", e.WorkerID, e.Timestamp.Format(time.StampMilli), e.ErrorMessage)
		}
		t.Fatalf("regression: an intent in progress under a dead worker's lease spent all %d of the task's attempts: incident %q", len(entries), incident)
	}
	oracle(t, ctx, c, ledger, pay, invoice, id)
	assertNoIncidents(t, c, id)
}

// L1: one worker, its lock expires while the handler runs, and nobody fetches the task
// meanwhile. The worker is frozen (SIGSTOP) for 4s, twice its 2s lock, while its charge
// is at the provider (which answers after 1.5s, into the frozen worker's socket), then
// thawed.
//
// The spec expects "complete by the original worker still succeeds": the engine checks
// only the worker id on complete, not the lock's expiry. On thawing, the worker's lock
// extender asks the engine (its local deadline passed, but the local clock never declares
// a lock lost): the lock has expired and nobody took the task, so the extender locks it
// again, or the worker's own next poll has already fetched it back (a redelivery, not run
// twice). The handler's context is not cancelled for the lock. The provider call ends
// either with the answer that was waiting in the socket (the ledger confirms; the worker
// reports complete and the engine, seeing the same worker id, accepts it: the spec's
// path), or at the provider client's timeout first (the worker was frozen past it): the
// ledger records the outcome unknown and the worker reports a retryable failure (one
// retry spent, no incident); the task is fetched again after its retry timeout and the
// next attempt reconciles the intent with the provider by key (found: reconciled),
// without charging again. Either way: one charge, completed, settled, no incident, and
// no lock declared lost. The test logs which path the run took.
func TestL1LockExpiresUnderHandler(t *testing.T) {
	f := newFaultEnv(t, "l1", 2*time.Minute)
	c, ctx, ledger, pay := f.c, f.ctx, f.ledger, f.pay
	invoice := testenv.Unique("INV-L1")
	key := "invoice:" + invoice + ":v1"
	pay.SlowDelay = 1500 * time.Millisecond
	pay.Script(invoice, fakeprovider.SlowAnswer)

	var w atomic.Pointer[workerProc]
	frozen := make(chan struct{})
	var once sync.Once
	tap := newProviderTap(t, f.pay.URL(), func(r tapRequest) {
		if r.Method == http.MethodPost && r.Invoice == invoice {
			once.Do(func() { w.Load().freeze(t); close(frozen) })
		}
	}, nil)
	w.Store(startWorker(t, f, "L1", tap.URL()))
	id := f.start(t, invoice, 4200)
	select {
	case <-frozen:
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker never charged %s; its logs:\n%s", invoice, w.Load().logs.String())
	}
	pause := time.NewTimer(4 * time.Second) // the fault itself: a pause twice the lock
	<-pause.C
	w.Load().thaw(t)
	waitCompleted(t, c, id, 40*time.Second)
	w.Load().stop(t)
	requireOwnWorkers(t, c, []string{id}, w.Load())

	oracle(t, ctx, c, ledger, pay, invoice, id)
	row, err := ledger.Operations().Get(ctx, collectScope, key)
	require.NoError(t, err)
	assert.Contains(t, []idempotency.State{idempotency.StateConfirmed, idempotency.StateReconciled}, row.State)
	assertNoIncidents(t, c, id)

	taskID := collectTaskID(t, c, id)
	var lost []string // what the extender said about the task's lock
	for _, r := range w.Load().records() {
		if r.str("task_id") == taskID && strings.HasPrefix(r.Msg, "lockext:") {
			lost = append(lost, r.Msg+": "+r.str("reason"))
			assert.NotContains(t, r.Msg, "lock lost", "nobody took the task: its lock was not lost")
		}
	}
	entries, err := c.ExternalTaskLog(ctx, url.Values{"processInstanceId": {id}, "topicName": {demoTopicCollect}})
	require.NoError(t, err)
	failures, successes := 0, 0
	for _, e := range entries {
		if e.FailureLog {
			failures++
			t.Logf("failure reported by %s: %s", e.WorkerID, e.ErrorMessage)
		}
		if e.SuccessLog {
			successes++
			assert.Equal(t, w.Load().id, e.WorkerID)
		}
	}
	assert.Equal(t, 1, successes, "completed once")
	pkey := idempotency.ProviderKey(f.ns, collectScope, key)
	posts := 0
	for _, r := range tap.requests(pkey) {
		if r.Method == http.MethodPost {
			posts++
		}
	}
	assert.Equal(t, 1, posts, "charged with one request; a retry reconciles by key instead")
	switch {
	case failures == 0:
		assert.Equal(t, idempotency.StateConfirmed, row.State)
		t.Logf("L1 path: the buffered answer won; the original worker confirmed and completed after its lock expired (the spec's path); extender: %v", lost)
	default:
		assert.Equal(t, 1, failures, "one retryable failure for the unknown outcome")
		assert.Equal(t, idempotency.StateReconciled, row.State, "the next attempt settles by reconciling, not by charging again")
		t.Logf("L1 path: the provider client's timeout came first; the handler recorded the outcome unknown, reported a retryable failure, and the task was fetched again and reconciled; extender: %v", lost)
	}
	t.Logf("provider requests for the key: %s", tap.describe(pkey))
}

// D1: duplicate fetches after lock expiry. Three workers, ten invoices arriving over a
// few seconds, a provider that performs each charge at once and answers 2-5s later
// (seeded per invoice), and random SIGSTOP pauses of 3-4.5s (longer than the 2s lock
// and the 1s long poll after it) of one worker at a time, each inside a provider call,
// until every instance has ended. The spec disables lock extension instead; ours cannot
// be, and a paused worker cannot extend. Per invoice exactly one charge, whatever the
// provider request count; every instance completed; the oracle clean; no two same-key
// requests in flight at the provider together. EXTWORKER_TEST_SEED replays the seeded
// choices (the timing of a run is the machine's).
//
// The ledger lease is 6s so that an unpaused attempt outlasts the slowest answer (its
// dispatch is cut off at 90% of the lease). Attempts made while a paused worker's lease
// lasts wait without spending the task's retries ("intent in progress" is
// failure.Deferred; TestW2DeadWorkersLeaseDoesNotSpendRetries).
func TestD1DuplicateFetchAfterLockExpiry(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0xD1))
	f := newFaultEnv(t, "d1", 2*time.Minute)
	c, ctx, ledger, pay := f.c, f.ctx, f.ledger, f.pay

	const n = 10
	delays := map[string]time.Duration{}
	gaps := map[string]time.Duration{}
	var invoices []string
	for i := range n {
		inv := testenv.Unique(fmt.Sprintf("INV-D1-%02d", i))
		invoices = append(invoices, inv)
		delays[inv] = 2*time.Second + time.Duration(rng.IntN(3000))*time.Millisecond
		gaps[inv] = 200*time.Millisecond + time.Duration(rng.IntN(600))*time.Millisecond
	}
	tap := newProviderTap(t, pay.URL(), nil, func(invoice string) time.Duration { return delays[invoice] })
	var workers []*workerProc
	for i := range 3 {
		// At most 6 handlers each: the ten invoices spread over the workers, and each
		// keeps free slots to fetch a task whose lock ran out elsewhere.
		workers = append(workers, startWorker(t, f, fmt.Sprintf("D1-%d", i), tap.URL(), "EXTWORKER_LEDGER_LEASE=6s", "EXTWORKER_MAX_CONCURRENCY=6"))
	}
	// The invoices arrive over a few seconds (seeded gaps), so that charges are in flight
	// for most of the run and pauses keep finding workers inside provider calls.
	var (
		idsMu   sync.Mutex
		ids     = map[string]string{}
		started = make(chan struct{})
	)
	go func() {
		defer close(started)
		for i, inv := range invoices {
			gap := time.NewTimer(gaps[inv])
			<-gap.C
			pi, err := c.StartProcess(ctx, demoProcessKey, admin.StartProcessRequest{BusinessKey: inv,
				Variables: camunda7.Variables{"invoiceId": camunda7.StringVar(inv), "amountCents": camunda7.LongVar(int64(1000 + i))}})
			if err != nil {
				t.Errorf("start %s: %v", inv, err)
				return
			}
			idsMu.Lock()
			ids[inv] = pi.ID
			idsMu.Unlock()
		}
	}()

	// Pause one worker at a time, each for 3-4.5s with 0.3-1.5s between pauses, until
	// every instance has ended. The worker paused is drawn from those inside a provider
	// call at that moment (their intent dispatched under their lease, in the ledger), so
	// that pauses land where they matter; a worker is not paused again within 6s of its
	// last thaw.
	allDone := func() bool {
		select {
		case <-started:
		default:
			return false
		}
		for _, id := range ids {
			if h, err := c.HistoricProcessInstance(ctx, id); err != nil || h.State != "COMPLETED" {
				return false
			}
		}
		return true
	}
	busy := func() []int {
		var out []int
		for _, inv := range invoices {
			row, err := ledger.Operations().Get(ctx, collectScope, "invoice:"+inv+":v1")
			if err != nil || row.State != idempotency.StateDispatched || row.LeaseOwner == nil {
				continue
			}
			for i, w := range workers {
				if w.id == *row.LeaseOwner && !slices.Contains(out, i) {
					out = append(out, i)
				}
			}
		}
		sort.Ints(out)
		return out
	}
	type pause struct {
		worker   string
		from, to time.Time
	}
	var pauses []pause
	lastThaw := map[int]time.Time{}
	deadline := time.Now().Add(50 * time.Second)
	for !allDone() {
		if time.Now().After(deadline) {
			<-started // its goroutine reports through t
			t.Fatalf("seed %d: not every instance ended within 50s", seed)
		}
		gap := time.NewTimer(300*time.Millisecond + time.Duration(rng.IntN(1200))*time.Millisecond)
		<-gap.C
		candidates := slices.DeleteFunc(busy(), func(i int) bool { return time.Since(lastThaw[i]) < 6*time.Second })
		if len(candidates) == 0 {
			continue
		}
		i := candidates[rng.IntN(len(candidates))]
		d := 3*time.Second + time.Duration(rng.IntN(1500))*time.Millisecond
		p := pause{worker: workers[i].id, from: time.Now()}
		workers[i].freeze(t)
		hold := time.NewTimer(d) // the fault itself: a pause longer than the lock
		<-hold.C
		workers[i].thaw(t)
		p.to = time.Now()
		lastThaw[i] = p.to
		pauses = append(pauses, p)
	}
	for _, w := range workers {
		w.stop(t)
	}
	requireOwnWorkers(t, c, slices.Collect(maps.Values(ids)), workers...)

	// Which workers ran the handler of each collect task: a task fetched again after its
	// lock ran out under a paused worker was run by two.
	ranBy := map[string][]string{} // business key -> worker ids
	for _, w := range workers {
		for _, r := range w.records() {
			if r.str("topic") == demoTopicCollect && handlerEnded(r) && !slices.Contains(ranBy[r.str("business_key")], w.id) {
				ranBy[r.str("business_key")] = append(ranBy[r.str("business_key")], w.id)
			}
		}
	}
	charges := pay.Charges()
	duplicated, requests := 0, 0
	for _, inv := range invoices {
		key := "invoice:" + inv + ":v1"
		pkey := idempotency.ProviderKey(f.ns, collectScope, key)
		oracle(t, ctx, c, ledger, pay, inv, ids[inv])
		assertNoIncidents(t, c, ids[inv])
		assert.Empty(t, tap.overlaps(pkey), "seed %d: %s: same-key requests in flight together", seed, inv)
		got := 0
		for _, ch := range charges {
			if ch.Invoice == inv {
				got++
			}
		}
		assert.Equal(t, 1, got, "seed %d: %s charged %d times", seed, inv, got)
		requests += len(tap.requests(pkey))
		if len(ranBy[inv]) > 1 {
			duplicated++
		}
		entries, err := c.ExternalTaskLog(ctx, url.Values{"processInstanceId": {ids[inv]}, "topicName": {demoTopicCollect}, "failureLog": {"true"}})
		require.NoError(t, err)
		var failed []string
		for _, e := range entries {
			failed = append(failed, fmt.Sprintf("%.70s", e.ErrorMessage))
		}
		t.Logf("%s (provider delay %v): handler run by %v, ledger attempts by %v; provider requests: %s; failures reported: %q", inv, delays[inv],
			ranBy[inv], eventActors(t, ledger, key), tap.describe(pkey), failed)
	}
	t.Logf("seed %d: %d pauses, %d of %d invoices run by more than one worker's handler, %d provider requests for %d charges",
		seed, len(pauses), duplicated, n, requests, n)
	for _, p := range pauses {
		t.Logf("  paused %s for %v", p.worker, p.to.Sub(p.from).Round(time.Millisecond))
	}
	if duplicated == 0 {
		t.Errorf("seed %d: no pause hit a worker while it held a task, so no task was fetched twice: D1 not exercised", seed)
	}
}

// O1: OptimisticLockingException on complete. A model whose parallel gateway forks into
// two external tasks of the demo's collect-payment topic (each branch charges its own
// invoice, "<invoice>-a" and "<invoice>-b", through input mappings) joined by a parallel
// gateway: when both branches' completes reach the join in concurrent transactions, the
// engine commits one and refuses the other with an OptimisticLockingException (REST 500,
// code 1). One worker at concurrency 16 (8 collect handlers at once) works off instances
// started beforehand, so sibling tasks are fetched together and finish together. The
// worker talks to the engine through a recording proxy, which shows each refused complete
// and the retry of the same task that the engine then accepted. A run that produced no
// refusal fails: the path was not exercised.
func TestO1OptimisticLockOnComplete(t *testing.T) {
	f := newFaultEnv(t, "o1", 2*time.Minute)
	c, ctx, ledger, pay := f.c, f.ctx, f.ledger, f.pay
	model, err := os.ReadFile("testdata/o1-parallel-join.bpmn")
	require.NoError(t, err)
	_, err = c.Deploy(ctx, admin.Deployment{Name: o1ProcessKey, Source: demoDeploymentSrc, EnableDuplicateFiltering: true,
		Resources: []admin.Resource{{Name: o1ProcessKey + ".bpmn", Content: model}}})
	require.NoError(t, err)

	const n = 40
	ids := map[string]string{}
	for i := range n {
		inv := testenv.Unique(fmt.Sprintf("INV-O1-%02d", i))
		pi, err := c.StartProcess(ctx, o1ProcessKey, admin.StartProcessRequest{BusinessKey: inv,
			Variables: camunda7.Variables{"invoiceId": camunda7.StringVar(inv), "amountCents": camunda7.LongVar(int64(500 + i))}})
		require.NoError(t, err)
		ids[inv] = pi.ID
	}
	tap := newEngineTap(t, testenv.EngineURL())
	w := startWorker(t, f, "O1", f.pay.URL(), "EXTWORKER_ENGINE_URL="+tap.url, "EXTWORKER_MAX_CONCURRENCY=16")
	start := time.Now()
	testenv.Eventually(t, 50*time.Second, "every O1 instance to complete", func() (bool, error) {
		for _, id := range ids {
			h, err := c.HistoricProcessInstance(ctx, id)
			if err != nil || h.State != "COMPLETED" {
				return false, err
			}
		}
		return true, nil
	})
	took := time.Since(start)
	w.stop(t)
	requireOwnWorkers(t, c, slices.Collect(maps.Values(ids)), w)

	// A refusal at the join names the process instance's own execution, which both
	// branches' transactions update; a complete racing a lock extension would name the
	// external task instead.
	instanceOf := map[string]string{} // external task id -> process instance id
	for _, id := range ids {
		entries, err := c.ExternalTaskLog(ctx, url.Values{"processInstanceId": {id}, "creationLog": {"true"}})
		require.NoError(t, err)
		for _, e := range entries {
			instanceOf[e.ExternalTaskID] = id
		}
	}
	refused, retried := tap.refusedCompletes()
	atJoin := 0
	for _, r := range refused {
		if inst := instanceOf[r.TaskID]; inst != "" && strings.Contains(r.Message, "ExecutionEntity["+inst+"]") {
			atJoin++
		}
	}
	t.Logf("%d instances (%d tasks) in %v: %d completes refused with an OptimisticLockingException (%d on the instance's execution at the join), %d of those tasks completed on a retry",
		n, 2*n, took.Round(time.Millisecond), len(refused), atJoin, retried)
	for _, r := range refused[:min(3, len(refused))] {
		t.Logf("  refused: task %s: %d %s (code %v): %.200s", r.TaskID, r.Status, r.Type, errorCode(r.Code), r.Message)
	}
	if atJoin == 0 {
		t.Fatalf("no complete was refused with an OptimisticLockingException at the parallel join in %d instances (%d refusals elsewhere): the retry path was not exercised", n, len(refused))
	}
	assert.Equal(t, len(refused), retried, "every refused complete was retried until the engine accepted it")
	for _, r := range w.records() {
		if r.Msg == "complete rejected by the engine; reporting a failure instead" || r.Msg == "reporting the result failed" {
			t.Errorf("the worker did not retry a refused complete: %s: %s", r.Msg, r.raw)
		}
	}
	charges := pay.Charges()
	for inv, id := range ids {
		assertNoIncidents(t, c, id)
		vars, err := c.HistoricVariableInstances(ctx, url.Values{"processInstanceId": {id}})
		require.NoError(t, err)
		refs := map[string]string{}
		for _, v := range vars {
			if s, err := (camunda7.Variables{"v": v.Variable()}).String("v"); err == nil {
				refs[v.Name] = s
			}
		}
		for _, branch := range []string{"a", "b"} {
			binv := inv + "-" + branch
			ref := refs["paymentRef"+strings.ToUpper(branch)]
			assert.NotEmpty(t, ref, "%s: branch %s completed with its payment reference", inv, branch)
			for _, v := range invariants.Check(ctx, ledger.Operations(), charges, invariants.Expect{Scope: collectScope, Key: "invoice:" + binv + ":v1", Invoice: binv, EngineRef: ref}) {
				t.Error(v)
			}
		}
	}
}

// errorCode renders an engine error code that may be absent.
func errorCode(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

// o1ProcessKey is the process of testdata/o1-parallel-join.bpmn.
const o1ProcessKey = "extworker-o1-parallel-join"

// workerProc is one `invoice run` process that a test can freeze (SIGSTOP), thaw
// (SIGCONT) and stop (SIGTERM), with its JSON log.
type workerProc struct {
	id     string // EXTWORKER_WORKER_ID: the engine's workerId and the ledger's actor
	cmd    *exec.Cmd
	logs   *testenv.Buffer
	exited chan struct{}
	err    error // the exit status, once exited is closed
}

// startWorker runs the binary's demo worker with a 2s lock, a 2s ledger lease and a 1s
// long poll (extra KEY=VALUE entries override them), charging through providerURL.
func startWorker(t *testing.T, f faultEnv, name, providerURL string, extra ...string) *workerProc {
	t.Helper()
	w := &workerProc{id: testenv.Unique("w" + name), logs: &testenv.Buffer{}, exited: make(chan struct{})}
	env := append(os.Environ(), "EXTWORKER_ENGINE_URL="+testenv.EngineURL(), "EXTWORKER_DATABASE_URL="+testenv.DBURL(),
		"EXTWORKER_LEDGER_NAMESPACE="+f.ns, "EXTWORKER_PROVIDER_URL="+providerURL, "EXTWORKER_WORKER_ID="+w.id,
		"EXTWORKER_LOCK_DURATION=2s", "EXTWORKER_LEDGER_LEASE=2s", "EXTWORKER_PROVIDER_TIMEOUT=1500ms", "EXTWORKER_LONG_POLL=1s",
		"EXTWORKER_LOG_LEVEL=info", "EXTWORKER_LOG_FORMAT=json", "EXTWORKER_HTTP_ADDR=127.0.0.1:0", "EXTWORKER_SHUTDOWN_GRACE=5s")
	w.cmd = exec.Command(f.bin, "run")
	w.cmd.Env = append(env, extra...) // later entries win
	w.cmd.Stdout, w.cmd.Stderr = w.logs, w.logs
	require.NoError(t, w.cmd.Start())
	go func() { w.err = w.cmd.Wait(); close(w.exited) }()
	t.Cleanup(func() {
		select {
		case <-w.exited:
		default:
			_ = w.cmd.Process.Signal(syscall.SIGCONT)
			_ = w.cmd.Process.Kill()
			<-w.exited
		}
		if t.Failed() {
			t.Logf("worker %s logs:\n%s", w.id, w.logs.String())
		}
	})
	return w
}

func (w *workerProc) freeze(t *testing.T) {
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Errorf("SIGSTOP %s: %v", w.id, err)
	}
}

func (w *workerProc) thaw(t *testing.T) {
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Errorf("SIGCONT %s: %v", w.id, err)
	}
}

// stop thaws the worker, asks it to drain (SIGTERM) and requires a clean exit.
func (w *workerProc) stop(t *testing.T) {
	t.Helper()
	_ = w.cmd.Process.Signal(syscall.SIGCONT)
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.exited:
	case <-time.After(30 * time.Second):
		_ = w.cmd.Process.Kill()
		<-w.exited
		t.Fatalf("worker %s did not stop within 30s of SIGTERM; logs:\n%s", w.id, w.logs.String())
	}
	require.NoError(t, w.err, "worker %s exit; logs:\n%s", w.id, w.logs.String())
}

// logRecord is one JSON log line of a worker.
type logRecord struct {
	Msg    string
	Fields map[string]any
	raw    string
}

func (r logRecord) str(k string) string {
	s, _ := r.Fields[k].(string)
	return s
}

// records parses the worker's log so far, skipping lines that are not JSON.
func (w *workerProc) records() []logRecord {
	var out []logRecord
	sc := bufio.NewScanner(bytes.NewReader(w.logs.Bytes()))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		msg, _ := m["msg"].(string)
		out = append(out, logRecord{Msg: msg, Fields: m, raw: sc.Text()})
	}
	return out
}

// waitCompleted waits for the instance to complete (the workers' logs are printed at
// cleanup when the test failed).
func waitCompleted(t *testing.T, c *admin.Client, id string, d time.Duration) {
	t.Helper()
	ctx := testenv.Context(t, d+10*time.Second)
	deadline := time.Now().Add(d)
	for {
		h, err := c.HistoricProcessInstance(ctx, id)
		if err == nil && h.State == "COMPLETED" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance %s not completed within %v (last: %+v, %v)", id, d, h, err)
		}
		tick := time.NewTimer(100 * time.Millisecond)
		<-tick.C
	}
}

// collectTaskID is the id of the instance's collect-payment external task.
func collectTaskID(t *testing.T, c *admin.Client, instanceID string) string {
	t.Helper()
	entries, err := c.ExternalTaskLog(testenv.Context(t, 10*time.Second), url.Values{"processInstanceId": {instanceID}, "topicName": {demoTopicCollect}, "creationLog": {"true"}})
	require.NoError(t, err)
	require.Len(t, entries, 1, "one collect-payment task")
	return entries[0].ExternalTaskID
}

// requireOwnWorkers stops the test if a worker it did not start handled a task of its
// instances: another process serving the demo topics on the same engine (a concurrent
// test run elsewhere) charges through its own ledger and provider, and every other
// assertion would then be about the wrong worker.
func requireOwnWorkers(t *testing.T, c *admin.Client, instanceIDs []string, workers ...*workerProc) {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	mine := map[string]bool{}
	for _, w := range workers {
		mine[w.id] = true
	}
	foreign := map[string]int{}
	for _, id := range instanceIDs {
		entries, err := c.ExternalTaskLog(ctx, url.Values{"processInstanceId": {id}})
		require.NoError(t, err)
		for _, e := range entries {
			if (e.SuccessLog || e.FailureLog) && !mine[e.WorkerID] {
				foreign[e.WorkerID]++
			}
		}
	}
	if len(foreign) > 0 {
		t.Fatalf("tasks of this test were handled by workers it did not start %v: another process serves the demo topics on this engine; run the test alone", foreign)
	}
}

func assertNoIncidents(t *testing.T, c *admin.Client, instanceID string) {
	t.Helper()
	inc, err := c.HistoricIncidents(testenv.Context(t, 10*time.Second), url.Values{"processInstanceId": {instanceID}})
	require.NoError(t, err)
	assert.Empty(t, inc, "instance %s: no incident", instanceID)
}

// handlerEnded reports whether a worker's log record is the end of one handler run: its
// result reported, refused or discarded.
func handlerEnded(r logRecord) bool {
	switch r.Msg {
	case "task handled", "reporting the result failed", "lock lost while the handler ran; result discarded":
		return true
	}
	return false
}

// eventActors lists the workers that took part in the intent, from its ledger events.
func eventActors(t *testing.T, l *idempotency.Ledger, key string) []string {
	t.Helper()
	events, err := l.Operations().Events(testenv.Context(t, 10*time.Second), collectScope, key)
	require.NoError(t, err)
	var actors []string
	for _, e := range events {
		if !slices.Contains(actors, e.Actor) {
			actors = append(actors, e.Actor)
		}
	}
	return actors
}

// testSeed is EXTWORKER_TEST_SEED, or a fresh seed; either way it is logged for replay.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("EXTWORKER_TEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "EXTWORKER_TEST_SEED")
		seed = v
	}
	t.Logf("seed %d (replay with EXTWORKER_TEST_SEED=%d)", seed, seed)
	return seed
}

// providerTap sits between the workers and the fake provider. It forwards every request
// and records when each arrived and when its answer went out (or its caller left): the
// provider's request log by idempotency key, for checking that two attempts never had
// the same key in flight together. before, if set, runs before a request is forwarded
// (to freeze the worker that sent it); delay, if set, holds a charge's answer back after
// the provider performed the charge: a slow provider.
type providerTap struct {
	target string
	srv    *httptest.Server
	hc     *http.Client
	before func(tapRequest)
	delay  func(invoice string) time.Duration

	mu   sync.Mutex
	reqs []tapRequest
}

// tapRequest is one request through the tap.
type tapRequest struct {
	Method, Key, Invoice string
	Start, End           time.Time
	Status               int // 0: no answer reached the caller
}

func newProviderTap(t *testing.T, target string, before func(tapRequest), delay func(string) time.Duration) *providerTap {
	p := &providerTap{target: target, before: before, delay: delay, hc: &http.Client{Timeout: 30 * time.Second}}
	p.srv = httptest.NewServer(p)
	t.Cleanup(p.srv.Close)
	return p
}

func (p *providerTap) URL() string { return p.srv.URL }

func (p *providerTap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := tapRequest{Method: r.Method, Start: time.Now(), Key: r.Header.Get("Idempotency-Key")}
	if rec.Key == "" {
		rec.Key = r.URL.Query().Get("idempotency_key")
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	var charge struct{ Invoice string }
	_ = json.Unmarshal(body, &charge)
	rec.Invoice = charge.Invoice
	p.mu.Lock()
	i := len(p.reqs)
	p.reqs = append(p.reqs, rec)
	p.mu.Unlock()
	status := 0
	defer func() {
		p.mu.Lock()
		p.reqs[i].End, p.reqs[i].Status = time.Now(), status
		p.mu.Unlock()
	}()
	if p.before != nil {
		p.before(rec)
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	req.Header = r.Header.Clone()
	resp, err := p.hc.Do(req)
	if err != nil {
		panic(http.ErrAbortHandler) // the provider hung up: so does the tap
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if p.delay != nil && r.Method == http.MethodPost {
		hold := time.NewTimer(p.delay(rec.Invoice))
		select {
		case <-hold.C:
		case <-r.Context().Done(): // the caller gave up (or its context ended): the charge stands
			hold.Stop()
			return
		}
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	if _, err := w.Write(data); err == nil {
		status = resp.StatusCode
	}
}

// requests returns the requests with an idempotency key, in arrival order.
func (p *providerTap) requests(key string) []tapRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []tapRequest
	for _, r := range p.reqs {
		if r.Key == key {
			out = append(out, r)
		}
	}
	return out
}

// overlaps describes every pair of requests with the key that were in flight at once.
func (p *providerTap) overlaps(key string) []string {
	reqs := p.requests(key)
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].Start.Before(reqs[j].Start) })
	var out []string
	for i, a := range reqs {
		for _, b := range reqs[i+1:] {
			if a.End.IsZero() || b.Start.Before(a.End) {
				out = append(out, fmt.Sprintf("%s %s-%s overlaps %s from %s", a.Method, a.Start.Format(time.StampMilli),
					a.End.Format(time.StampMilli), b.Method, b.Start.Format(time.StampMilli)))
			}
		}
	}
	return out
}

// describe renders the requests with a key, for the test log.
func (p *providerTap) describe(key string) string {
	var parts []string
	for _, r := range p.requests(key) {
		parts = append(parts, fmt.Sprintf("%s@%s→%d(%v)", r.Method, r.Start.Format("05.000"), r.Status, r.End.Sub(r.Start).Round(time.Millisecond)))
	}
	return strings.Join(parts, " ")
}

// engineTap is a recording reverse proxy in front of the engine's REST API: it keeps the
// answer to every external-task complete, so a test can see a complete the engine
// refused and the retry it then accepted.
type engineTap struct {
	url string // the engine REST base URL through the proxy

	mu        sync.Mutex
	completes []completeCall
}

// completeCall is one POST /external-task/{id}/complete and the engine's answer.
type completeCall struct {
	TaskID  string
	Status  int
	Type    string // the exception type of an error answer
	Code    *int   // the engine's error code (1: optimistic locking)
	Message string
}

var completePath = regexp.MustCompile(`/external-task/([^/]+)/complete$`)

func newEngineTap(t *testing.T, engineURL string) *engineTap {
	u, err := url.Parse(engineURL)
	require.NoError(t, err)
	e := &engineTap{}
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: u.Scheme, Host: u.Host})
	rp.ErrorLog = log.New(io.Discard, "", 0) // long polls the worker abandons are no news
	rp.ModifyResponse = func(resp *http.Response) error {
		m := completePath.FindStringSubmatch(resp.Request.URL.Path)
		if resp.Request.Method != http.MethodPost || m == nil {
			return nil
		}
		call := completeCall{TaskID: m[1], Status: resp.StatusCode}
		if resp.StatusCode >= 300 {
			data, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return err
			}
			resp.Body = io.NopCloser(bytes.NewReader(data))
			var body struct {
				Type    string `json:"type"`
				Code    *int   `json:"code"`
				Message string `json:"message"`
			}
			_ = json.Unmarshal(data, &body)
			call.Type, call.Code, call.Message = body.Type, body.Code, body.Message
		}
		e.mu.Lock()
		e.completes = append(e.completes, call)
		e.mu.Unlock()
		return nil
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	e.url = srv.URL + u.Path
	return e
}

// refusedCompletes returns the completes the engine refused with an
// OptimisticLockingException, and how many of their tasks a later complete did complete.
func (e *engineTap) refusedCompletes() (refused []completeCall, retried int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	done := map[string]bool{}
	for i, call := range e.completes {
		if call.Status == http.StatusInternalServerError && (call.Type == "OptimisticLockingException" || (call.Code != nil && *call.Code == 1)) {
			refused = append(refused, call)
			for _, later := range e.completes[i+1:] {
				if later.TaskID == call.TaskID && later.Status == http.StatusNoContent && !done[call.TaskID+strconv.Itoa(i)] {
					done[call.TaskID+strconv.Itoa(i)] = true
					retried++
					break
				}
			}
		}
	}
	return refused, retried
}
