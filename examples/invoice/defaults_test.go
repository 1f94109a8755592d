package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
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
	"github.com/extworker/extworker/internal/testenv"
)

// Faults at the daemon's SHIPPED DEFAULTS: a 20s lock (EXTWORKER_LOCK_DURATION), a 20s long
// poll (EXTWORKER_LONG_POLL), a 2m ledger lease, and every other default as shipped. The
// other fault tests run their workers with 2-5s locks and a 1s long poll, under which a
// lock never outlives an engine restart and a task is never handed over late in a long
// poll; these run the real `invoice run` binary with nothing but its URLs, ledger
// namespace, worker id, log format and level and HTTP port set.
//
// They run against the killable engine (`make up`'s third, port 8082, database
// camunda_faults; testenv.FaultEngine), never the shared ones: they SIGKILL it, and a
// quiet engine is part of their scenarios. Each test starts by deleting what an earlier
// run left there (clearDemo), so its counts by process definition are its own.

// defaultLock is EXTWORKER_LOCK_DURATION's default: a lock runs out this long after the
// fetch (or the last extension).
const defaultLock = 20 * time.Second

// newDefaultsEnv is newFaultEnv on the killable engine, cleared of earlier runs' demo
// instances and history.
func newDefaultsEnv(t *testing.T, prefix string, timeout time.Duration) faultEnv {
	t.Helper()
	c := testenv.FaultEngine(t)
	clearDemo(t)
	f := newFaultEnvOn(t, c, prefix, timeout)
	waitStalePolls(t)
	return f
}

// clearDeploymentsWithin bounds clearDemo: a cascading delete of an earlier test's
// instances took past the client's 30s under CI's load, and a retry then met a stale long
// poll locking one of the deleted tasks (OptimisticLockingException): deletes are tried
// again, each with clearDeleteTimeout, until none of the demo's deployments is left.
const (
	clearDeploymentsWithin = 4 * time.Minute
	clearDeleteTimeout     = 2 * time.Minute
)

// clearDemo deletes the demo's deployments on the killable engine with everything of
// theirs (instances, tasks, incidents, history): whatever an earlier run left there.
func clearDemo(t *testing.T) {
	t.Helper()
	cc, err := camunda7.New(camunda7.Config{BaseURL: testenv.FaultEngineURL(), Timeout: clearDeleteTimeout})
	require.NoError(t, err)
	c := admin.New(cc)
	testenv.Eventually(t, clearDeploymentsWithin, "the demo's deployments deleted from the killable engine", func() (bool, error) {
		ctx := testenv.Context(t, clearDeleteTimeout+30*time.Second)
		var deployments []struct {
			ID string `json:"id"`
		}
		if err := faultEngineGet(ctx, "/deployment", url.Values{"name": {demoProcessKey}}, &deployments); err != nil {
			return false, err
		}
		for _, d := range deployments {
			if err := c.DeleteDeployment(ctx, d.ID, true); err != nil {
				t.Logf("delete deployment %s: %v (trying again)", d.ID, err)
				return false, err
			}
		}
		return len(deployments) == 0, nil
	})
}

// faultEngineGet is GET <killable engine><path>?q, decoding the JSON answer into out.
func faultEngineGet(ctx context.Context, path string, q url.Values, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, testenv.FaultEngineURL()+path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %.200s", path, resp.Status, data)
	}
	return json.Unmarshal(data, out)
}

// demoCount is GET <path>/count for the demo's process definition with q added.
func demoCount(ctx context.Context, path string, q url.Values) (int, error) {
	q2 := url.Values{"processDefinitionKey": {demoProcessKey}}
	for k, v := range q {
		q2[k] = v
	}
	var out struct {
		Count int `json:"count"`
	}
	err := faultEngineGet(ctx, path+"/count", q2, &out)
	return out.Count, err
}

// demoState is the engine's view of the demo's instances (all of them this test's).
type demoState struct {
	Finished, Completed    int // ended; ended normally
	WithOpenIncident       int // running instances with an open incident
	Incidents              int // incidents ever raised (history)
	FailuresReported       int // failure reports the engine accepted (external task log)
	Completions, Deletions int // tasks completed; tasks deleted
}

func readDemoState(ctx context.Context) (demoState, error) {
	var s demoState
	for _, q := range []struct {
		dst   *int
		path  string
		query url.Values
	}{
		{&s.Finished, "/history/process-instance", url.Values{"finished": {"true"}}},
		{&s.Completed, "/history/process-instance", url.Values{"completed": {"true"}}},
		{&s.WithOpenIncident, "/process-instance", url.Values{"withIncident": {"true"}}},
		{&s.Incidents, "/history/incident", nil},
		{&s.FailuresReported, "/history/external-task-log", url.Values{"failureLog": {"true"}}},
		{&s.Completions, "/history/external-task-log", url.Values{"successLog": {"true"}}},
		{&s.Deletions, "/history/external-task-log", url.Values{"deletionLog": {"true"}}},
	} {
		n, err := demoCount(ctx, q.path, q.query)
		if err != nil {
			return s, err
		}
		*q.dst = n
	}
	return s, nil
}

// waitDemoEnded polls until n demo instances have ended or hold an incident, or the
// deadline passes; it reports whether they did, and the engine's state last seen.
func waitDemoEnded(ctx context.Context, n int, limit time.Duration) (bool, demoState) {
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var last demoState
	for {
		s, err := readDemoState(ctx)
		if err == nil {
			last = s
			if s.Finished+s.WithOpenIncident >= n {
				return true, s
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false, last
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
	}
}

// defaultsEnviron is the test's environment without any EXTWORKER_* configuration (the
// EXTWORKER_TEST_* variables stay; the binary does not read them): a worker started with
// it runs at the shipped defaults except for what the test sets.
func defaultsEnviron() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "EXTWORKER_") && !strings.HasPrefix(kv, "EXTWORKER_TEST_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// startDefaultsWorker runs `invoice run` at the shipped defaults against engineURL:
// only the URLs, the ledger database and namespace, the worker id, JSON logs at debug
// level (for the "handler started" records) and a free port for the HTTP endpoints are
// set. No lock, poll, lease, grace or concurrency setting.
func startDefaultsWorker(t *testing.T, f faultEnv, name, engineURL string) *workerProc {
	t.Helper()
	w := &workerProc{id: testenv.Unique("d" + name), logs: &testenv.Buffer{}, exited: make(chan struct{})}
	w.cmd = exec.Command(f.bin, "run")
	w.cmd.Env = append(defaultsEnviron(), "EXTWORKER_ENGINE_URL="+engineURL, "EXTWORKER_DATABASE_URL="+testenv.DBURL(),
		"EXTWORKER_LEDGER_NAMESPACE="+f.ns, "EXTWORKER_PROVIDER_URL="+f.pay.URL(), "EXTWORKER_WORKER_ID="+w.id,
		"EXTWORKER_LOG_FORMAT=json", "EXTWORKER_LOG_LEVEL=debug", "EXTWORKER_HTTP_ADDR=127.0.0.1:0")
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
			pollGone(w)
		}
		if t.Failed() {
			keepLog(t, w)
		}
	})
	return w
}

// keepLog writes a worker's whole (debug) log to a file that outlives the test, and logs
// its warnings and errors and the file's path.
func keepLog(t *testing.T, w *workerProc) {
	var notable []string
	for _, r := range w.records() {
		if lvl, _ := r.Fields["level"].(string); lvl == "WARN" || lvl == "ERROR" {
			notable = append(notable, r.raw)
		}
	}
	if len(notable) > 40 {
		notable = append(notable[:40], fmt.Sprintf("… and %d more", len(notable)-40))
	}
	path := "(not kept)"
	if dir, err := os.MkdirTemp("", "extworker-defaults-logs"); err == nil {
		p := filepath.Join(dir, w.id+".log")
		if os.WriteFile(p, w.logs.Bytes(), 0o644) == nil {
			path = p
		}
	}
	t.Logf("worker %s: whole log in %s; its warnings and errors:\n%s", w.id, path, strings.Join(notable, "\n"))
}

// stopDefaults asks the worker to drain (SIGTERM) and requires a clean exit (at the
// defaults running handlers get 30s, and the worker may wait for the engine to drop its
// aborted 20s long poll), noting a poll it may have left pending (pollGone).
func stopDefaults(t *testing.T, w *workerProc) {
	t.Helper()
	_ = w.cmd.Process.Signal(syscall.SIGCONT)
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.exited:
	case <-time.After(75 * time.Second):
		_ = w.cmd.Process.Kill()
		<-w.exited
		t.Fatalf("worker %s did not stop within 75s of SIGTERM", w.id)
	}
	require.NoError(t, w.err, "worker %s exit", w.id)
	pollGone(w)
}

// defaultLongPoll is EXTWORKER_LONG_POLL's default.
const defaultLongPoll = 20 * time.Second

// staleUntil is when the long polls that exited workers may have left pending on the
// killable engine have surely ended there.
var staleUntil struct {
	sync.Mutex
	at time.Time
}

// pollGone notes that an exited worker may have left a long poll pending on the engine.
// The engine does not notice a client leaving: until the poll's timeout it locks for the
// gone worker, for 20s, any task that appears, and the next test's first task would be
// handed to nobody. A worker that waited for that itself before exiting says so in its
// log.
func pollGone(w *workerProc) {
	for _, r := range w.records() {
		if r.Msg == "waiting for the engine to drop the aborted long poll" {
			return
		}
	}
	staleUntil.Lock()
	defer staleUntil.Unlock()
	if end := time.Now().Add(defaultLongPoll + time.Second); end.After(staleUntil.at) {
		staleUntil.at = end
	}
}

// waitStalePolls returns once the long polls noted by pollGone have ended on the engine.
// Their end is the engine's schedule (the poll's timeout), not a state a test can ask
// for.
func waitStalePolls(t *testing.T) {
	staleUntil.Lock()
	at := staleUntil.at
	staleUntil.Unlock()
	if wait := time.Until(at); wait > 0 {
		t.Logf("waiting %v for the long poll of an earlier test's worker to end on the engine", wait.Round(time.Millisecond))
		timer := time.NewTimer(wait)
		defer timer.Stop()
		<-timer.C
	}
}

// recordTime is when a log record was written.
func recordTime(r logRecord) time.Time {
	s, _ := r.Fields["time"].(string)
	at, _ := time.Parse(time.RFC3339Nano, s)
	return at
}

// isReport reports whether a record is a report of a handler's result, or an attempt at
// one: "task handled", "reporting the result failed", and every other record about a
// report ("report answer was lost; ...", "complete rejected by the engine; reporting a
// failure instead", a resend).
func isReport(r logRecord) bool {
	return r.Msg == "task handled" || strings.Contains(strings.ToLower(r.Msg), "report")
}

// isLockLoss reports whether a record says a task's lock was lost, locally or by the
// engine's word, and its handler cancelled or not run: a warning or error from the lock
// extender ("lockext: lock lost, cancelling handler", its maximum run time) or the
// runtime ("lock lost ..."), or another warning naming a lock that expired locally. A
// transient extension failure (debug) or a lock taken again (info) is not a loss, and a
// report whose error names the loss is not counted again.
func isLockLoss(r logRecord) bool {
	if lvl, _ := r.Fields["level"].(string); lvl != "WARN" && lvl != "ERROR" {
		return false
	}
	return strings.HasPrefix(r.Msg, "lockext:") || strings.HasPrefix(r.Msg, "lock lost") ||
		(strings.Contains(r.raw, "expired locally") && !isReport(r))
}

// handlerRuns is what a worker's log says about the handler runs of each task.
type handlerRuns struct {
	runs map[string]int // external task id -> "handler started" records
	// reRuns are handler runs of a task whose handler had already run to its end here:
	// it reported its result, or tried to ("task handled" or a report attempt).
	reRuns []string
	// reRunAfter counts the re-runs by how the earlier run ended.
	reRunAfter map[string]int
	// reportFailures are "reporting the result failed" records: results given up on.
	reportFailures int
	// lockLosses are the records isLockLoss picks.
	lockLosses []string
	// first and reported: per task, its first "handler started" and first report record.
	first, reported map[string]time.Time
	// attempts: per task, the attempt field of each "handler started".
	attempts map[string][]int
}

func countRuns(records []logRecord) handlerRuns {
	h := handlerRuns{runs: map[string]int{}, reRunAfter: map[string]int{}, first: map[string]time.Time{},
		reported: map[string]time.Time{}, attempts: map[string][]int{}}
	ended := map[string]string{} // task -> how its first ended run ended
	for _, r := range records {
		id := r.str("external_task_id")
		if id == "" {
			continue
		}
		switch {
		case r.Msg == "handler started":
			if how, ok := ended[id]; ok {
				h.reRuns = append(h.reRuns, fmt.Sprintf("task %s (%s, %s) run %d at %s, after %s", id, r.str("topic"), r.str("business_key"),
					h.runs[id]+1, recordTime(r).Format("15:04:05.000"), how))
				h.reRunAfter[how]++
			}
			if h.runs[id] == 0 {
				h.first[id] = recordTime(r)
			}
			h.runs[id]++
			a, _ := r.Fields["attempt"].(float64)
			h.attempts[id] = append(h.attempts[id], int(a))
		case isReport(r):
			if _, ok := ended[id]; !ok {
				how := r.Msg
				if o := r.str("outcome"); o != "" {
					how += " (" + o + ")"
				}
				ended[id] = how
				h.reported[id] = recordTime(r)
			}
			if r.Msg == "reporting the result failed" {
				h.reportFailures++
			}
		}
		if isLockLoss(r) {
			h.lockLosses = append(h.lockLosses, fmt.Sprintf("task %s: %s: %s", id, r.Msg, r.str("reason")))
		}
	}
	return h
}

// inFlightAt counts the tasks whose handler had started before at and that had not
// reported a result by then.
func (h handlerRuns) inFlightAt(at time.Time) int {
	n := 0
	for id, started := range h.first {
		if rep, ok := h.reported[id]; started.Before(at) && (!ok || !rep.Before(at)) {
			n++
		}
	}
	return n
}

func firstFew(s []string, n int) string {
	if len(s) > n {
		return strings.Join(s[:n], "\n  ") + fmt.Sprintf("\n  … and %d more", len(s)-n)
	}
	return strings.Join(s, "\n  ")
}

// chargesPerInvoice counts the provider's charges for each of invoices.
func chargesPerInvoice(pay *fakeprovider.Server, invoices []string) (missing, multiple []string) {
	got := map[string]int{}
	for _, ch := range pay.Charges() {
		got[ch.Invoice]++
	}
	for _, inv := range invoices {
		switch got[inv] {
		case 1:
		case 0:
			missing = append(missing, inv)
		default:
			multiple = append(multiple, fmt.Sprintf("%s charged %d times", inv, got[inv]))
		}
	}
	return missing, multiple
}

// startInvoices starts the demo for each invoice, four at a time, and returns the
// process instance ids by invoice.
func startInvoices(t *testing.T, f faultEnv, invoices []string) map[string]string {
	t.Helper()
	var (
		mu   sync.Mutex
		ids  = map[string]string{}
		wg   sync.WaitGroup
		next atomic.Int64
		errs = make(chan error, 4)
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(invoices) {
					return
				}
				inv := invoices[i]
				pi, err := f.c.StartProcess(f.ctx, demoProcessKey, admin.StartProcessRequest{BusinessKey: inv,
					Variables: camunda7.Variables{"invoiceId": camunda7.StringVar(inv), "amountCents": camunda7.LongVar(int64(1000 + i))}})
				if err != nil {
					errs <- fmt.Errorf("start %s: %w", inv, err)
					return
				}
				mu.Lock()
				ids[inv] = pi.ID
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return ids
}

// The run: the engine's JVM SIGKILLed during a run of 600 instances served by one
// worker at the shipped defaults. Expected: every instance completes, no incident, no
// handler run again for a task whose handler had finished (its report must outlast the
// outage instead of being given up), no double charge.
//
// The worker works off a backlog of 600 invoices; one in twenty charges takes 2s at the
// provider (a slow answer), so that when the engine dies handlers are inside provider
// calls as well as reporting. The JVM is SIGKILLed twice, each time while a slow charge
// is in flight and tasks are locked for the worker, and started again with
// services/engine-up.sh:
//
//   - once 100 instances have completed: kept down 4s, then started again, so that the
//     engine is away about 10s in all (the JVM takes 6-10s to start), as in the issue.
//     The worker's 20s locks outlive the outage;
//   - once 350 have completed: kept down 15s, then started again, so that the engine is
//     away over 20s and the locks run out during the outage.
func TestEngineSIGKILLAtDefaults(t *testing.T) {
	const n = 600
	outages := []struct {
		after int           // charge requests at the provider before the kill
		hold  time.Duration // how long the dead engine stays down before its restart begins
	}{{100, 4 * time.Second}, {350, 15 * time.Second}}
	// The budget bounds a hang, not the engine: beside CI's other stages starting JVMs, its
	// restarts took 1m15s-1m55s (6-10s alone), and 7 minutes ran out twice.
	f := newDefaultsEnv(t, "sigkill", 12*time.Minute)
	ctx, pay := f.ctx, f.pay
	pay.SlowDelay = 2 * time.Second
	run := testenv.Unique("INV-SK")
	invoices := make([]string, n)
	for i := range invoices {
		invoices[i] = fmt.Sprintf("%s-%03d", run, i)
		if i%20 == 10 {
			pay.Script(invoices[i], fakeprovider.Delay)
		}
	}
	began := time.Now()
	startInvoices(t, f, invoices)
	t.Logf("started %d instances in %v", n, time.Since(began).Round(time.Millisecond))

	w := startDefaultsWorker(t, f, "K", testenv.FaultEngineURL())
	workStart := time.Now()
	type outage struct {
		kill      testenv.EngineKill
		completed int // instances completed at the kill
		locked    int // tasks locked for the worker at the kill
		down      time.Duration
	}
	var done []outage
	var upAt time.Time
	for _, o := range outages {
		// Counted at the provider, not in completed instances: the engine hands out the
		// payments, created first, before the receipts, so an instance completes only once
		// most payments are done, and a fast worker may have sent every slow charge by
		// then, leaving none in flight for the kill to land on.
		testenv.Eventually(t, 2*time.Minute, fmt.Sprintf("%d charge requests before the kill", o.after), func() (bool, error) {
			return len(pay.Log()) >= o.after, nil
		})
		before, err := readDemoState(ctx)
		require.NoError(t, err)
		var locked []camunda7.ExternalTask
		testenv.Eventually(t, time.Minute, "a slow charge in flight at the provider and tasks locked for the worker", func() (bool, error) {
			slow := false
			for _, r := range pay.Log() {
				slow = slow || (r.Fault == fakeprovider.Delay.String() && r.Outcome == "")
			}
			if !slow {
				return false, nil
			}
			var err error
			locked, err = f.c.ExternalTasks(ctx, camunda7.ExternalTaskQuery{WorkerID: w.id, Locked: true})
			return err == nil && len(locked) > 0, err
		})
		kill := testenv.KillEngine(t)
		t.Logf("SIGKILLed the engine's JVM (pid %d) %v into the run, %d instances completed, %d tasks locked for the worker; dead after %v",
			kill.PID, kill.At.Sub(workStart).Round(time.Millisecond), before.Completed, len(locked), kill.Dead.Round(time.Millisecond))
		// The hold is the fault's schedule; meanwhile the engine must stay down.
		tick := time.NewTicker(250 * time.Millisecond)
		for time.Since(kill.At) < o.hold {
			<-tick.C
			vctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, err := f.c.Version(vctx)
			cancel()
			require.Error(t, err, "the killed engine answered again by itself")
		}
		tick.Stop()
		startup := testenv.StartEngine(t)
		upAt = time.Now()
		done = append(done, outage{kill: kill, completed: before.Completed, locked: len(locked), down: upAt.Sub(kill.At)})
		t.Logf("engine started again in %v: away %v in all", startup.Round(time.Millisecond), upAt.Sub(kill.At).Round(time.Millisecond))
	}

	drained, s := waitDemoEnded(ctx, n, 150*time.Second)
	drain := time.Since(upAt)
	if drained {
		stopDefaults(t, w)
	} else {
		var err error
		s, err = readDemoState(ctx)
		require.NoError(t, err)
	}
	h := countRuns(w.records())
	missing, multiple := chargesPerInvoice(pay, invoices)
	var downs []string
	inFlight := make([]int, len(done))
	for i, o := range done {
		inFlight[i] = h.inFlightAt(o.kill.At)
		downs = append(downs, fmt.Sprintf("%v (killed at %d completed, %d handlers running or reporting, %d tasks locked)",
			o.down.Round(time.Millisecond), o.completed, inFlight[i], o.locked))
	}
	t.Logf("figures: instances %d, finished %d (completed %d), incidents %d (%d instances holding one), handler re-runs %d %v, "+
		"failures reported %d, reports given up %d, lock losses %d, time down %s, time to drain after the last restart %v%s; "+
		"provider: %d charges, %d double, %d invoices uncharged",
		n, s.Finished, s.Completed, s.Incidents, s.WithOpenIncident, len(h.reRuns), h.reRunAfter, s.FailuresReported, h.reportFailures,
		len(h.lockLosses), strings.Join(downs, ", "), drain.Round(time.Millisecond),
		map[bool]string{true: "", false: " (NOT drained: deadline)"}[drained], len(pay.Charges()), pay.DoubleCharges(), len(missing))
	if len(h.reRuns) > 0 {
		t.Logf("re-runs:\n  %s", firstFew(h.reRuns, 10))
	}
	if len(h.lockLosses) > 0 {
		t.Logf("lock losses:\n  %s", firstFew(h.lockLosses, 10))
	}

	for i, n := range inFlight {
		assert.Positive(t, n, "kill %d landed while handlers were running or reporting", i+1)
	}
	assert.True(t, drained, "every instance ended or holds an incident within 150s of the last restart")
	assert.Equal(t, n, s.Finished, "every instance finished")
	assert.Equal(t, n, s.Completed, "every instance completed")
	assert.Zero(t, s.Incidents, "no incident")
	assert.Empty(t, h.reRuns, "no handler ran again for a task whose handler had finished")
	assert.Zero(t, pay.DoubleCharges(), "no double charge")
	assert.Empty(t, multiple, "one charge per invoice")
	assert.Empty(t, missing, "every invoice charged")
	if drained {
		// Every task was completed by this test's worker: nothing else served the topics.
		mine, err := demoCount(ctx, "/history/external-task-log", url.Values{"successLog": {"true"}, "workerId": {w.id}})
		require.NoError(t, err)
		assert.Equal(t, s.Completions, mine, "every task completed by the test's worker")
	}
	if !t.Failed() && (h.reportFailures > 0 || len(h.lockLosses) > 0) {
		keepLog(t, w) // passed, but a result was given up or a lock lost: worth a look
	}
}

// fetchGate is a reverse proxy in front of the engine for one worker. It lets requests
// through, except that the first fetchAndLock answer carrying tasks is held back until
// onTasks has run (the test freezes the worker there), and only then delivered: the
// tasks are then locked for a worker that holds them without having started a handler.
type fetchGate struct {
	url  string // the engine's REST base URL through the gate
	once sync.Once
	got  chan []camunda7.LockedExternalTask // the first answer with tasks, and when it came
	at   time.Time
}

func newFetchGate(t *testing.T, engineURL string, onTasks func()) *fetchGate {
	u, err := url.Parse(engineURL)
	require.NoError(t, err)
	g := &fetchGate{got: make(chan []camunda7.LockedExternalTask, 1)}
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: u.Scheme, Host: u.Host})
	rp.ErrorLog = log.New(io.Discard, "", 0) // the frozen, then killed, worker's requests
	rp.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.Method != http.MethodPost || !strings.HasSuffix(resp.Request.URL.Path, "/external-task/fetchAndLock") || resp.StatusCode != http.StatusOK {
			return nil
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		resp.Body = io.NopCloser(bytes.NewReader(data))
		var tasks []camunda7.LockedExternalTask
		if json.Unmarshal(data, &tasks) != nil || len(tasks) == 0 {
			return nil
		}
		g.once.Do(func() {
			g.at = time.Now()
			onTasks()
			g.got <- tasks
		})
		return nil
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	g.url = srv.URL + u.Path
	return g
}

// A worker SIGKILLed while it holds tasks: worker A, at the defaults, fetches the eight
// invoices' collect-payment tasks (the demo's concurrency for that topic) and is frozen
// (SIGSTOP) before their answer reaches it, then SIGKILLed: the tasks are locked for a
// dead worker for the default 20s. Worker B, at the defaults, started right after, must
// take them over once those locks run out and complete every instance without a failure
// reported to the engine, an incident or a double charge. B's long poll is pending when
// the locks run out, and the engine hands the tasks over only when that poll ends: B
// receives them from a poll sent about 20s earlier.
func TestWorkerKilledWhileHoldingTasksAtDefaults(t *testing.T) {
	const n = 8
	f := newDefaultsEnv(t, "heldkill", 5*time.Minute)
	ctx, pay := f.ctx, f.pay
	run := testenv.Unique("INV-HK")
	invoices := make([]string, n)
	for i := range invoices {
		invoices[i] = fmt.Sprintf("%s-%d", run, i)
	}
	ids := startInvoices(t, f, invoices)

	started := make(chan *workerProc, 1) // worker A, once started
	gate := newFetchGate(t, testenv.FaultEngineURL(), func() { a := <-started; started <- a; a.freeze(t) })
	a := startDefaultsWorker(t, f, "A", gate.url)
	started <- a
	var held []camunda7.LockedExternalTask
	select {
	case held = <-gate.got:
	case <-time.After(60 * time.Second):
		t.Fatalf("worker A fetched no task within 60s")
	}
	require.NoError(t, a.cmd.Process.Kill())
	<-a.exited // frozen as its fetch's answer came, A had no long poll pending
	killedAt := time.Now()
	heldIDs := map[string]bool{}
	for _, task := range held {
		heldIDs[task.ID] = true
	}
	t.Logf("worker A frozen holding %d tasks (%v after their answer came), then SIGKILLed", len(held), killedAt.Sub(gate.at).Round(time.Millisecond))
	require.NotEmpty(t, held)

	b := startDefaultsWorker(t, f, "B", testenv.FaultEngineURL())
	ended, s := waitDemoEnded(ctx, n, 150*time.Second)
	if ended {
		stopDefaults(t, b)
	} else {
		var err error
		s, err = readDemoState(ctx)
		require.NoError(t, err)
	}
	hb := countRuns(b.records())
	ha := countRuns(a.records())
	var takenOver []time.Duration
	for id := range heldIDs {
		if at, ok := hb.first[id]; ok {
			takenOver = append(takenOver, at.Sub(gate.at))
		}
	}
	slices.Sort(takenOver)
	var failures []string
	for _, id := range ids {
		entries, err := f.c.ExternalTaskLog(ctx, url.Values{"processInstanceId": {id}, "failureLog": {"true"}})
		require.NoError(t, err)
		for _, e := range entries {
			failures = append(failures, fmt.Sprintf("%s by %s: %.160s", e.ExternalTaskID, e.WorkerID, e.ErrorMessage))
		}
	}
	missing, multiple := chargesPerInvoice(pay, invoices)
	t.Logf("figures: instances %d, held by A %d, finished %d (completed %d), incidents %d, failures reported %d, B's handler runs of the held tasks %v, "+
		"B's re-runs %d, B's lock losses %d, taken over %v after A's fetch%s; provider: %d charges, %d double",
		n, len(held), s.Finished, s.Completed, s.Incidents, len(failures), runsOf(hb, heldIDs), len(hb.reRuns), len(hb.lockLosses), takenOver,
		map[bool]string{true: "", false: " (NOT ended: deadline)"}[ended], len(pay.Charges()), pay.DoubleCharges())
	if len(failures) > 0 {
		t.Logf("failures reported:\n  %s", firstFew(failures, 10))
	}
	if len(hb.lockLosses) > 0 {
		t.Logf("B's lock losses:\n  %s", firstFew(hb.lockLosses, 10))
	}

	assert.Empty(t, ha.runs, "A held its tasks without starting a handler")
	for _, d := range takenOver {
		assert.GreaterOrEqual(t, d, defaultLock-time.Second, "B got a held task only once A's lock had run out")
	}
	assert.True(t, ended, "every instance ended or holds an incident within 150s")
	assert.Equal(t, n, s.Completed, "every instance completed")
	assert.Empty(t, failures, "no failure reported to the engine")
	assert.Zero(t, s.Incidents, "no incident")
	assert.Empty(t, hb.lockLosses, "B lost no lock")
	assert.Zero(t, pay.DoubleCharges(), "no double charge")
	assert.Empty(t, multiple, "one charge per invoice")
	assert.Empty(t, missing, "every invoice charged")
	for _, id := range ids {
		entries, err := f.c.ExternalTaskLog(ctx, url.Values{"processInstanceId": {id}, "successLog": {"true"}})
		require.NoError(t, err)
		for _, e := range entries {
			assert.Equal(t, b.id, e.WorkerID, "task %s completed by B", e.ExternalTaskID)
		}
	}
}

// runsOf lists the handler runs of each of ids, sorted.
func runsOf(h handlerRuns, ids map[string]bool) []int {
	var out []int
	for id := range ids {
		out = append(out, h.runs[id])
	}
	sort.Ints(out)
	return out
}

// A quiet worker and one failing task: one worker at the defaults, one instance and
// nothing else on the engine's topics. Its charge fails once with a 503 (the provider
// did nothing; the client cannot tell, so the ledger records the outcome unknown and the
// task fails retryably, to be retried 2s later, reconciling first). That retry timeout
// ends while the worker's 20s long poll is pending, and the engine hands the task over
// only when that poll ends, about 20s after the poll was sent. Expected: attempt 2 runs
// to its end (its handler not cancelled: no lock lost, nothing "expired locally"),
// finds nothing charged, charges and completes; no incident; one charge.
func TestQuietWorkerOneFailingTaskAtDefaults(t *testing.T) {
	f := newDefaultsEnv(t, "quiet", 4*time.Minute)
	ctx, pay := f.ctx, f.pay
	invoice := testenv.Unique("INV-Q1")
	pay.Script(invoice, fakeprovider.Unavailable)
	w := startDefaultsWorker(t, f, "Q", testenv.FaultEngineURL())
	id := f.start(t, invoice, 4200)

	ended, s := waitDemoEnded(ctx, 1, 150*time.Second)
	if ended {
		stopDefaults(t, w)
	}
	h := countRuns(w.records())
	entries, err := f.c.ExternalTaskLog(ctx, url.Values{"processInstanceId": {id}, "topicName": {demoTopicCollect}})
	require.NoError(t, err)
	var taskID string
	var failures, successes []camunda7.ExternalTaskLogEntry
	for _, e := range entries {
		taskID = e.ExternalTaskID
		switch {
		case e.FailureLog:
			failures = append(failures, e)
		case e.SuccessLog:
			successes = append(successes, e)
		}
	}
	var handled []logRecord // the collect task's results, in order
	var firstReport, secondStart time.Time
	for _, r := range w.records() {
		if r.str("external_task_id") != taskID {
			continue
		}
		switch {
		case r.Msg == "task handled":
			handled = append(handled, r)
			if firstReport.IsZero() {
				firstReport = recordTime(r)
			}
		case r.Msg == "handler started" && !firstReport.IsZero() && secondStart.IsZero():
			secondStart = recordTime(r)
		}
	}
	var outcomes []string
	for _, r := range handled {
		a, _ := r.Fields["attempt"].(float64)
		outcomes = append(outcomes, fmt.Sprintf("attempt %d: %s", int(a), r.str("outcome")))
	}
	var handedOver time.Duration
	if !secondStart.IsZero() {
		handedOver = secondStart.Sub(firstReport)
	}
	row, err := f.ledger.Operations().Get(ctx, collectScope, "invoice:"+invoice+":v1")
	require.NoError(t, err)
	t.Logf("figures: ended %v (completed %d), incidents %d, collect-payment runs %d (attempts %v), outcomes %v, failures reported %d, "+
		"attempt 2 handed over %v after attempt 1's failure was reported, lock losses %d; ledger %s, attempt %d, %d dispatch(es); provider: %d charge(s), %d request(s)",
		ended, s.Completed, s.Incidents, h.runs[taskID], h.attempts[taskID], outcomes, len(failures), handedOver.Round(time.Millisecond),
		len(h.lockLosses), row.State, row.Attempt, row.Dispatches, len(chargesFor(pay, invoice)), len(requestsFor(pay, invoice)))
	for _, e := range failures {
		t.Logf("failure reported by %s: %.200s", e.WorkerID, e.ErrorMessage)
	}
	if len(h.lockLosses) > 0 {
		t.Logf("lock losses:\n  %s", firstFew(h.lockLosses, 10))
	}

	require.True(t, ended, "the instance ended or holds an incident within 150s")
	assert.Equal(t, 1, s.Completed, "the instance completed")
	assert.Zero(t, s.Incidents, "no incident")
	assert.Empty(t, h.lockLosses, "no handler of the task was cancelled: no lock lost, nothing expired locally")
	assert.Equal(t, []int{1, 2}, h.attempts[taskID], "two handler runs: attempt 1 (the 503) and attempt 2")
	assert.Equal(t, []string{"attempt 1: retryable", "attempt 2: completed"}, outcomes, "attempt 1 failed (retryable), attempt 2 completed")
	if assert.Len(t, failures, 1, "one failure reported: attempt 1's") {
		assert.Contains(t, failures[0].ErrorMessage, "attempt 1 of 5")
	}
	if assert.Len(t, successes, 1, "completed once") {
		assert.Equal(t, w.id, successes[0].WorkerID)
	}
	assert.Equal(t, idempotency.StateConfirmed, row.State, "the ledger confirmed attempt 2's charge")
	assert.Equal(t, 2, row.Attempt, "the ledger's intent was taken by two attempts")
	assert.Len(t, chargesFor(pay, invoice), 1, "one charge")
	assert.Zero(t, pay.DoubleCharges())
}
