package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	invariants "github.com/extworker/extworker/internal/oracle"
	"github.com/extworker/extworker/internal/testenv"
)

// clusterLock: the short tier's 5s locks and ledger leases rather than startNetWorker's
// 2s, which a worker process starved of CPU by a restarting JVM beside a test suite on two
// cores can fail to extend in time.
var clusterLock = []string{"EXTWORKER_LOCK_DURATION=5s", "EXTWORKER_LEDGER_LEASE=5s"}

// afterFor is how long the work lasts at least after the killed node is back.
const afterFor = 10 * time.Second

// clusterTier is a tier of TestWorkersAcrossEngineCluster (docs/testing.md): the workers'
// settings, the node it kills, and its load.
type clusterTier struct {
	tier faultTier
	// victim is the node SIGKILLed once half of the first instances completed.
	victim int
	// instances are started before the workers; the node is killed once half of them
	// completed. backlog is how many the feeder keeps waiting for the workers from then.
	instances, backlog int
	// lockLostRuns tolerates a second run of a task's handler when one of the runs lost
	// its lock (its report refused: another worker had the task): with 5s locks a worker
	// starved of CPU by a restarting JVM can fail to extend in time (seen once in three
	// runs at a load of 30 on two cores; the ledger replayed the effect, one per intent).
	// The defaults tier's 20s locks tolerate none.
	lockLostRuns bool
}

// clusterTiers run one after the other on one engine cluster (starting it is the slow
// part), each killing and restarting a node of its own.
//
//   - defaults: the worker processes at the shipped settings (20s lock and long poll, 2m
//     ledger lease, 10s provider timeout): faults_test.go's defaults tier, which sets
//     where things are and nothing else. A task the dead node had locked for a poll whose
//     answer never arrived waits out a 20s lock.
//   - short: 5s locks and ledger leases (clusterLock), a 1s long poll and a 1.5s provider
//     timeout (startNetWorker's).
var clusterTiers = []clusterTier{
	{tier: faultTiers[1], victim: 0, instances: 200, backlog: 100},
	{tier: shortTier, victim: 1, instances: 200, backlog: 100, lockLostRuns: true},
}

// Three worker processes against an engine cluster (two nodes on one database behind
// HAProxy: testenv.StartCluster), all through the balancer's URL, working through
// invoices (a backlog kept up until afterFor after the restart) while one node is
// SIGKILLed, once half of the first invoices completed, and started again; once per tier
// (clusterTiers: the shipped defaults first, then short timeouts), on the same cluster.
// Every instance completes, with no incident; no handler runs twice for a task (a lost
// complete is resent, not redone: the worker logs); the provider charged each invoice
// once and the ledger agrees (the oracle: internal/oracle). Each tier logs the
// throughput (instances completed per second, from the engine's history) before, during
// and after the node was down, how long after the kill it was back to 80% of before (in
// 2s windows), and the dip when the restarted node rejoins.
func TestWorkersAcrossEngineCluster(t *testing.T) {
	cl := testenv.StartCluster(t, 2)
	c := cl.Client(t)
	for _, ct := range clusterTiers {
		t.Run(ct.tier.name, func(t *testing.T) {
			ct.tier.skipIfShort(t)
			began := time.Now()
			workersAcrossEngineCluster(t, cl, c, ct)
			t.Logf("%s tier: %v", ct.tier.name, time.Since(began).Round(time.Millisecond))
		})
	}
}

// startClusterWorker starts a worker process in the tier through the cluster's balancer.
func startClusterWorker(t *testing.T, f faultEnv, cl *testenv.Cluster, ft faultTier) *netWorker {
	t.Helper()
	if !ft.atDefaults() {
		return startNetWorker(t, f, cl.URL(), testenv.DBURL(), clusterLock...)
	}
	id := testenv.Unique("net")
	cmd := exec.Command(f.bin, "run")
	// The tier's environment (no EXTWORKER_ setting but where things are), the cluster's
	// balancer as the engine, and startNetWorker's credentials and JSON logs (info: the
	// checks read "task handled").
	cmd.Env = append(ft.env(f.ns, f.pay.URL()), "EXTWORKER_ENGINE_URL="+cl.URL(),
		"EXTWORKER_ENGINE_USER="+testenv.AuthEngineUser, "EXTWORKER_ENGINE_PASSWORD="+testenv.AuthEnginePassword,
		"EXTWORKER_WORKER_ID="+id, "EXTWORKER_LOG_LEVEL=info", "EXTWORKER_LOG_FORMAT=json")
	return startNetWorkerCmd(t, id, cmd)
}

// stopAll sends SIGTERM to every worker at once and waits for each to exit cleanly: a
// worker waits for its pending long poll (up to 20s at the defaults), so that the engine
// does not go on locking tasks for it.
func stopAll(t *testing.T, workers []*netWorker, within time.Duration) {
	t.Helper()
	for _, w := range workers {
		_ = w.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for _, w := range workers {
		select {
		case err := <-w.exited:
			w.exited <- err
			assert.NoError(t, err, "worker %s exits cleanly on SIGTERM; logs:\n%s", w.id, w.logs.String())
		case <-deadline.C:
			t.Fatalf("worker %s did not stop within %v of SIGTERM", w.id, within)
		}
	}
}

func workersAcrossEngineCluster(t *testing.T, cl *testenv.Cluster, c *admin.Client, ct clusterTier) {
	clusterInstances, clusterBacklog := ct.instances, ct.backlog
	f := newFaultEnvOn(t, c, "cluster", 6*time.Minute)
	timing := tierTiming(t, f.bin, ct.tier)
	if !ct.tier.atDefaults() {
		timing.lock, timing.lease = 5*time.Second, 5*time.Second // clusterLock
	}
	t.Logf("%s tier: lock %v, long poll %v, ledger lease %v, provider timeout %v; %d invoices, then a backlog of %d; node %d killed",
		ct.tier.name, timing.lock, timing.longPoll, timing.lease, timing.providerTimeout, clusterInstances, clusterBacklog, ct.victim)
	prefix := testenv.Unique("CL")

	// The invoices: clusterInstances first, so that the workers run at full speed from the
	// start; then a feeder keeps clusterBacklog waiting until afterFor after the killed node
	// is back, so that the throughput is the workers' and the engine's at every moment.
	var mu sync.Mutex
	var ids, invoices []string
	// startOne starts an invoice's instance. A start sent to the node being killed fails
	// (its connection closed: EOF, or HAProxy's 502) and may have taken effect: the engine
	// is asked by business key before the start is sent again, so that each invoice has
	// one instance.
	var startsLost, startsTookEffect int
	startOne := func(inv string, k int64) (string, error) {
		deadline := time.Now().Add(time.Minute)
		for {
			pi, err := c.StartProcess(f.ctx, demoProcessKey, admin.StartProcessRequest{BusinessKey: inv,
				Variables: camunda7.Variables{"invoiceId": camunda7.StringVar(inv), "amountCents": camunda7.LongVar(1000 + k)}})
			if err == nil {
				return pi.ID, nil
			}
			mu.Lock()
			startsLost++
			mu.Unlock()
			for {
				if time.Now().After(deadline) {
					return "", fmt.Errorf("no instance a minute after its start failed: %w", err)
				}
				retry := time.NewTimer(250 * time.Millisecond) // the live node takes over
				select {
				case <-retry.C:
				case <-f.ctx.Done():
					retry.Stop()
					return "", f.ctx.Err()
				}
				hs, qerr := c.HistoricProcessInstances(f.ctx, url.Values{"processInstanceBusinessKey": {inv}})
				if qerr != nil {
					continue
				}
				if len(hs) > 1 {
					return "", fmt.Errorf("%d instances", len(hs))
				}
				if len(hs) == 1 {
					mu.Lock()
					startsTookEffect++
					mu.Unlock()
					return hs[0].ID, nil
				}
				break // it did not take effect: start it again
			}
		}
	}
	start := func(n int) error {
		mu.Lock()
		from := len(ids)
		ids, invoices = append(ids, make([]string, n)...), append(invoices, make([]string, n)...)
		mu.Unlock()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		next := make(chan int)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range next {
					inv := fmt.Sprintf("%s-%04d", prefix, k)
					id, err := startOne(inv, int64(k))
					if err != nil {
						errs <- fmt.Errorf("start invoice %s: %w", inv, err)
						continue
					}
					mu.Lock()
					ids[k], invoices[k] = id, inv
					mu.Unlock()
				}
			}()
		}
		for k := from; k < from+n; k++ {
			next <- k
		}
		close(next)
		wg.Wait()
		close(errs)
		var all []error
		for err := range errs {
			all = append(all, err)
		}
		return errors.Join(all...)
	}
	started := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(ids)
	}
	require.NoError(t, start(clusterInstances))

	finished := func() int {
		n, err := c.HistoricProcessInstanceCount(f.ctx, url.Values{"processInstanceBusinessKeyLike": {prefix + "-%"}, "finished": {"true"}})
		if err != nil {
			return -1 // a request lost with the node: ask again
		}
		return n
	}
	began := time.Now()
	var workers []*netWorker
	for range 3 {
		workers = append(workers, startClusterWorker(t, f, cl, ct.tier))
	}
	stopFeeding := make(chan struct{})
	fed := make(chan error, 1)
	go func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopFeeding:
				fed <- nil
				return
			case <-tick.C:
			}
			if done := finished(); done >= 0 && started()-done < clusterBacklog {
				if err := start(clusterBacklog / 2); err != nil {
					fed <- err
					return
				}
			}
		}
	}()

	workers[0].eventually(t, 2*time.Minute, fmt.Sprintf("%d invoices completed", clusterInstances/2), func() bool { return finished() >= clusterInstances/2 })
	victim := ct.victim
	kill := cl.Kill(t, victim)
	cl.Restart(t, victim)
	restarted := time.Now()
	workers[0].eventually(t, afterFor+10*time.Second, fmt.Sprintf("%v of work after the restart", afterFor), func() bool { return time.Since(restarted) >= afterFor })
	close(stopFeeding)
	require.NoError(t, <-fed, "the feeder")
	workers[0].eventually(t, 3*time.Minute, "every invoice completed", func() bool { return finished() == started() })
	t.Logf("%d invoices through 3 workers and 2 nodes in %v; %d starts failed with the node (%d of them had taken effect)",
		len(ids), time.Since(began).Round(time.Millisecond), startsLost, startsTookEffect)
	stopAll(t, workers, timing.stop)

	// Every instance completed, without an incident.
	hist, err := invariants.AllPages(f.ctx, url.Values{"processInstanceBusinessKeyLike": {prefix + "-%"}}, c.HistoricProcessInstances)
	require.NoError(t, err)
	require.Len(t, hist, len(ids))
	var ends []time.Time
	for _, h := range hist {
		assert.Equal(t, "COMPLETED", h.State, "instance %s (%s)", h.ID, h.BusinessKey)
		ends = append(ends, h.EndTime.Time)
	}
	incidents, err := c.HistoricIncidents(f.ctx, url.Values{"processDefinitionKey": {demoProcessKey}})
	require.NoError(t, err)
	mine := map[string]bool{}
	for _, id := range ids {
		mine[id] = true
	}
	var ours []admin.HistoricIncident
	for _, in := range incidents {
		if mine[in.ProcessInstanceID] {
			ours = append(ours, in)
		}
	}
	assert.Empty(t, ours, "no incident")

	// At most one effect per intent, the ledger in agreement (the oracle).
	charges := f.pay.Charges()
	perInvoice := map[string]int{}
	for _, ch := range charges {
		perInvoice[ch.Invoice]++
	}
	maxEffects := 0
	for k, inv := range invoices {
		maxEffects = max(maxEffects, perInvoice[inv])
		hv, err := c.HistoricVariableInstances(f.ctx, url.Values{"processInstanceId": {ids[k]}, "variableName": {"paymentRef"}})
		require.NoError(t, err)
		require.Len(t, hv, 1, "paymentRef of %s", inv)
		ref, err := camunda7.Variables{"v": hv[0].Variable()}.String("v")
		require.NoError(t, err)
		for _, v := range invariants.Check(f.ctx, f.ledger.Operations(), charges, invariants.Expect{Scope: demoScope,
			Key: "invoice:" + inv + ":v1", Invoice: inv, EngineRef: ref}) {
			t.Error(v)
		}
	}
	assert.Equal(t, 1, maxEffects, "effects per intent")

	// No handler ran twice for a task: each task's handler ends in one "task handled" (or
	// "reporting the result failed") record, over all workers' logs.
	runs, lockLost := map[string]int{}, map[string]int{}
	resent, gone := 0, 0
	causes := map[string]int{} // why a report was sent again
	var records []map[string]any
	for _, w := range workers {
		sc := bufio.NewScanner(strings.NewReader(w.logs.String()))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var r map[string]any
			if json.Unmarshal(sc.Bytes(), &r) != nil {
				continue
			}
			records = append(records, r)
			switch msg, _ := r["msg"].(string); {
			case msg == "task handled", msg == "reporting the result failed":
				if id, _ := r["external_task_id"].(string); id != "" {
					runs[id]++
					if r["outcome"] == "lock-lost" {
						lockLost[id]++
					}
				}
			case msg == "report delivered":
				resent++
			case msg == "report answer was lost; the task is gone, so the report took effect":
				gone++
			case strings.HasPrefix(msg, "reporting the result failed; sending it again"):
				e, _ := r["error"].(string)
				switch {
				case strings.Contains(e, "OptimisticLockingException"):
					causes["concurrent modification (the worker's own extendLock)"]++
				case strings.Contains(e, "status 502"):
					causes["HAProxy's 502"]++
				case strings.Contains(e, "sent, no answer"):
					causes["answer lost"]++
				default:
					causes[e]++
				}
			}
		}
	}
	reruns := 0
	for id, n := range runs {
		if n > 1 && ct.lockLostRuns && n-1 <= lockLost[id] {
			t.Logf("external task %s: its handler ran %d times, %d of them losing the lock to another worker (tolerated in this tier)", id, n, lockLost[id])
			continue
		}
		if n > 1 {
			reruns += n - 1
			var trail []string
			for _, r := range records {
				if r["external_task_id"] == id {
					trail = append(trail, fmt.Sprintf("%v %v %v: %v %v %v", r["time"], r["worker_id"], r["level"], r["msg"], r["error"], r["reason"]))
				}
			}
			// And what else those workers warned about from 10s before the first record to
			// the last one (a lock extension that failed, a report resent), kill included.
			var first, lastAt time.Time
			who := map[any]bool{}
			for _, r := range records {
				if r["external_task_id"] == id {
					at, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(r["time"]))
					if first.IsZero() {
						first = at
					}
					lastAt = at
					who[r["worker_id"]] = true
				}
			}
			var around []string
			for _, r := range records {
				at, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(r["time"]))
				if who[r["worker_id"]] && r["level"] != "INFO" && r["external_task_id"] != id &&
					!at.Before(first.Add(-10*time.Second)) && !at.After(lastAt) && len(around) < 40 {
					around = append(around, fmt.Sprintf("%v %v %v: %v %v %v", r["time"], r["worker_id"], r["level"], r["msg"], r["external_task_id"], r["error"]))
				}
			}
			t.Errorf("external task %s: its handler ran %d times (node killed at %v); the workers' records about it:\n  %s\nthose workers' other warnings meanwhile (at most 40):\n  %s",
				id, n, kill.At.UTC().Format(time.RFC3339Nano), strings.Join(trail, "\n  "), strings.Join(around, "\n  "))
		}
	}
	assert.Len(t, runs, 2*len(ids), "handler runs: one per task (collect payment and send receipt per invoice)")

	// Throughput, from when the engine ended each instance.
	sort.Slice(ends, func(i, j int) bool { return ends[i].Before(ends[j]) })
	rate := func(from, to time.Time) float64 {
		if !to.After(from) {
			return 0
		}
		n := 0
		for _, e := range ends {
			if !e.Before(from) && e.Before(to) {
				n++
			}
		}
		return float64(n) / to.Sub(from).Seconds()
	}
	last := ends[len(ends)-1]
	beforeFrom := kill.At.Add(-10 * time.Second)
	if ends[0].After(beforeFrom) {
		beforeFrom = ends[0]
	}
	before := rate(beforeFrom, kill.At)
	during := rate(kill.At, restarted)
	after := rate(restarted, restarted.Add(afterFor))
	recovery := time.Duration(-1)
	const window = 2 * time.Second
	for at := kill.At; at.Add(window).Before(last); at = at.Add(100 * time.Millisecond) {
		if rate(at, at.Add(window)) >= 0.8*before {
			recovery = at.Add(window).Sub(kill.At)
			break
		}
	}
	// The restarted node rejoins cold (HAProxy sends it half the requests at once): the
	// lowest 2s window after the restart, and when the last one below 80% of before ended.
	rejoinMin, rejoinBack := -1.0, time.Duration(0)
	for at := restarted; !at.Add(window).After(restarted.Add(afterFor)); at = at.Add(100 * time.Millisecond) {
		r := rate(at, at.Add(window))
		if rejoinMin < 0 || r < rejoinMin {
			rejoinMin = r
		}
		if r < 0.8*before {
			rejoinBack = at.Add(window).Sub(restarted)
		}
	}
	t.Logf("%s tier: instances %d, incidents %d, handler re-runs %d, max effects per intent %d; reports delivered after a resend %d, found taken effect after a lost answer %d; first resends by cause: %v",
		ct.tier.name, len(hist), len(ours), reruns, maxEffects, resent, gone, causes)
	t.Logf("completions/s: before the kill %.1f (%v), node down %.1f (%v, kill to restarted), after %.1f (%v); back to >= 80%% of before %v after the kill (-1: not before the work ran out)",
		before, kill.At.Sub(beforeFrom).Round(time.Millisecond), during, restarted.Sub(kill.At).Round(time.Millisecond),
		after, afterFor, recovery.Round(100*time.Millisecond))
	back := fmt.Sprintf("back to >= 80%% of before %v after the restart", rejoinBack.Round(100*time.Millisecond))
	if rejoinBack >= afterFor {
		back = fmt.Sprintf("still below 80%% of before at the end of the %v measured", afterFor)
	}
	t.Logf("after the restart: lowest %.1f/s (2s windows), %s", rejoinMin, back)
	var series []string
	for at := kill.At.Add(-6 * time.Second); at.Before(last); at = at.Add(2 * time.Second) {
		series = append(series, fmt.Sprintf("%+.0fs %.1f", at.Sub(kill.At).Seconds(), rate(at, at.Add(2*time.Second))))
	}
	t.Logf("completions/s in 2s windows from the kill (restarted at %+.1fs): %s", restarted.Sub(kill.At).Seconds(), strings.Join(series, ", "))
	assert.Greater(t, before, 0.0, "invoices completed before the kill")
	assert.Greater(t, during, 0.0, "invoices completed while a node was down")
}
