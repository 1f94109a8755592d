package tasks_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/tasks"
)

// A handler working for three times its lock duration completes: the lock is extended
// the whole time, and nobody else can take the task.
func TestHandlerRunsThreeLockDurations(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(1)
	const lock = time.Second
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		work := time.NewTimer(3 * lock) // the handler's work: three lock durations
		defer work.Stop()
		select {
		case <-work.C:
			return camunda7.Variables{"done": camunda7.BoolVar(true)}, nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}, tasks.TopicOptions{LockDuration: lock})
	w, stop := f.run(reg, tasks.Config{})
	f.waitEnded(ids, 30*time.Second)
	stop()
	assert.EqualValues(t, 1, w.Stats().Completed.Load())
	assert.Zero(t, w.Stats().LockLost.Load())
	assert.Zero(t, w.Stats().Failures.Load())
}

// Deleting the process instance while its handler runs cancels the handler's context
// with the lock-lost cause within one extension interval (a third of the lock).
func TestInstanceDeletedCancelsHandler(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(1)
	const lock = 3 * time.Second
	type end struct {
		cause error
		at    time.Time
	}
	ends := make(chan end, 1)
	started := make(chan struct{})
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		close(started)
		<-ctx.Done()
		ends <- end{context.Cause(ctx), time.Now()}
		return nil, ctx.Err()
	}, tasks.TopicOptions{LockDuration: lock})
	w, stop := f.run(reg, tasks.Config{})
	<-started
	require.NoError(t, f.c.DeleteProcessInstance(f.ctx, ids[0]))
	deleted := time.Now()
	select {
	case e := <-ends:
		assert.ErrorIs(t, e.cause, camunda7.ErrLockLost)
		assert.ErrorIs(t, e.cause, camunda7.ErrTaskGone)
		latency := e.at.Sub(deleted)
		assert.Less(t, latency, lock/3+time.Second, "within one extension interval (%v) plus a request", lock/3)
		t.Logf("lock loss detected %v after the instance was deleted (extension interval %v)", latency, lock/3)
	case <-time.After(2 * lock):
		t.Fatal("handler not cancelled after its process instance was deleted")
	}
	stop()
	assert.Zero(t, w.Stats().ReportErrors.Load(), "nothing reported for a lost task")
}

// Two workers, small locks, slow handlers, and one handler that overruns its maximum run
// time so its lock runs out: every task is completed exactly once on the engine, and a
// worker that lost a task sees a typed lock-lost error, not a crash. Each worker has one
// slot, so the overrunning worker cannot fetch its own task back (which it would be
// entitled to do) and the other worker takes it over.
func TestTwoWorkersCompleteEachTaskOnce(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	const n = 3
	ids := f.start(n)
	var calls atomic.Int64
	var overran atomic.Bool
	handler := func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		calls.Add(1)
		d := 1500 * time.Millisecond // slow: more than the 1s lock
		if tk.BusinessKey() == "order-0" && overran.CompareAndSwap(false, true) {
			d = 10 * time.Second // ignores its context and overruns MaxRunTime: its lock expires and the other worker takes it
		}
		work := time.NewTimer(d)
		defer work.Stop()
		<-work.C
		return nil, nil
	}
	opts := tasks.TopicOptions{LockDuration: time.Second, MaxRunTime: 2 * time.Second}
	regA, regB := tasks.NewRegistry(), tasks.NewRegistry()
	register(t, regA, f.m.Topic, handler, opts)
	register(t, regB, f.m.Topic, handler, opts)
	a, stopA := f.run(regA, tasks.Config{MaxConcurrency: 1})
	b, stopB := f.run(regB, tasks.Config{MaxConcurrency: 1})
	f.waitEnded(ids, 2*time.Minute)
	testenv.Eventually(t, 30*time.Second, "the overrunning handler to report", func() (bool, error) {
		return a.Stats().ReportErrors.Load()+b.Stats().ReportErrors.Load() == 1, fmt.Errorf("calls %d, completed %d+%d, report errors %d+%d",
			calls.Load(), a.Stats().Completed.Load(), b.Stats().Completed.Load(), a.Stats().ReportErrors.Load(), b.Stats().ReportErrors.Load())
	})
	stopA()
	stopB()
	for _, id := range ids {
		log, err := f.c.ExternalTaskLog(f.ctx, url.Values{"processInstanceId": {id}, "successLog": {"true"}})
		require.NoError(t, err)
		assert.Len(t, log, 1, "instance %s completed once", id)
	}
	completed := a.Stats().Completed.Load() + b.Stats().Completed.Load()
	assert.EqualValues(t, n, completed)
	assert.EqualValues(t, n+1, calls.Load(), "the overrun task ran a second time, on the worker that took it over")
	assert.EqualValues(t, 1, a.Stats().LockLost.Load()+b.Stats().LockLost.Load(), "the overrunning worker's report failed as lock lost")
	// A report that failed did so only because the lock was lost (typed), never otherwise.
	assert.Equal(t, a.Stats().ReportErrors.Load()+b.Stats().ReportErrors.Load(), a.Stats().LockLost.Load()+b.Stats().LockLost.Load())
	t.Logf("handler calls %d for 3 tasks; worker A completed %d, B %d; lock-lost reports %d",
		calls.Load(), a.Stats().Completed.Load(), b.Stats().Completed.Load(), a.Stats().LockLost.Load()+b.Stats().LockLost.Load())
}

// Under load the worker never holds more locked tasks than it has slots.
func TestLockedNeverExceedsSlots(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(40)
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		work := time.NewTimer(30 * time.Millisecond)
		defer work.Stop()
		<-work.C
		return nil, nil
	}, tasks.TopicOptions{})
	w, stop := f.run(reg, tasks.Config{MaxConcurrency: 3})
	samples, maxLocked := 0, 0
	testenv.Eventually(t, 2*time.Minute, "all instances done while sampling locks", func() (bool, error) {
		l, err := f.c.ExternalTasks(f.ctx, camunda7.ExternalTaskQuery{WorkerID: w.WorkerID(), Locked: true})
		if err != nil {
			return false, err
		}
		samples++
		maxLocked = max(maxLocked, len(l))
		require.LessOrEqual(t, len(l), 3, "locked tasks exceed the worker's slots")
		open, err := f.c.ExternalTasks(f.ctx, camunda7.ExternalTaskQuery{TopicName: f.m.Topic})
		return len(open) == 0, err
	})
	f.waitEnded(ids, time.Minute)
	stop()
	t.Logf("%d samples, at most %d tasks locked by the worker with 3 slots", samples, maxLocked)
	assert.EqualValues(t, 40, w.Stats().Completed.Load())
}

// The engine away for a while and back: the worker carries on without a restart.
func TestEngineOutageNeedsNoRestart(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	u, err := url.Parse(testenv.EngineURL())
	require.NoError(t, err)
	proxy := testenv.NewProxy(t, u.Host)
	via, err := camunda7.New(camunda7.Config{BaseURL: "http://" + proxy.Addr() + u.Path})
	require.NoError(t, err)
	logs := &recordingHandler{}
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) { return nil, nil }, tasks.TopicOptions{})
	w, err := tasks.New(via, reg, tasks.Config{WorkerID: testenv.Unique("w"), AsyncResponseTimeout: time.Second,
		FetchBackoffInitial: 50 * time.Millisecond, FetchBackoffMax: 200 * time.Millisecond, Logger: newLogger(logs)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	first := f.start(1)
	f.waitEnded(first, 30*time.Second)
	proxy.Cut()
	testenv.Eventually(t, 20*time.Second, "fetches failing", func() (bool, error) { return logs.count("fetching tasks failed again") >= 3, nil })
	during := f.start(3)
	proxy.Restore()
	// The engine still held the poll that the cut cut off, and may have locked the new
	// tasks for it; the worker finds such orphaned locks and releases them, so the tasks
	// do not wait out their lock.
	f.waitEnded(during, 20*time.Second)
	t.Logf("orphaned locks released after the outage: %d", w.Stats().Orphans.Load())
	assert.Equal(t, 1, logs.count("fetching tasks failed; backing off until the engine answers"), "logged once per outage")
	assert.Equal(t, 1, logs.count("fetching tasks recovered"))
	assert.EqualValues(t, 4, w.Stats().Completed.Load())
}

// SIGTERM during work (Run's context ending): running handlers finish within the grace
// period, and nothing stays locked by the stopped worker.
func TestShutdownLeavesNothingLocked(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(8)
	var startedN atomic.Int64
	gate := make(chan struct{})
	var once sync.Once
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		if startedN.Add(1) == 3 {
			once.Do(func() { close(gate) })
		}
		work := time.NewTimer(300 * time.Millisecond)
		defer work.Stop()
		select {
		case <-work.C:
			return nil, nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}, tasks.TopicOptions{})
	w, stop := f.run(reg, tasks.Config{MaxConcurrency: 3, ShutdownGrace: 10 * time.Second})
	<-gate
	t0 := time.Now()
	stop()
	drain := time.Since(t0)
	t.Logf("drained %d running handlers in %v", 3, drain)
	assert.Less(t, drain, 10*time.Second, "within the grace period")
	left, err := f.c.ExternalTasks(f.ctx, camunda7.ExternalTaskQuery{WorkerID: w.WorkerID(), Locked: true})
	require.NoError(t, err)
	assert.Empty(t, left, "nothing left locked by the stopped worker")
	done := 0
	for _, id := range ids {
		if f.state(id) == "COMPLETED" {
			done++
		}
	}
	assert.EqualValues(t, done, w.Stats().Completed.Load(), "every handler that ran reported")
	assert.GreaterOrEqual(t, done, 3)

	// The rest are free for the next worker at once.
	reg2 := tasks.NewRegistry()
	register(t, reg2, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) { return nil, nil }, tasks.TopicOptions{})
	_, stop2 := f.run(reg2, tasks.Config{})
	t1 := time.Now()
	f.waitEnded(ids, 30*time.Second)
	stop2()
	t.Logf("a second worker finished the remaining %d tasks in %v", len(ids)-done, time.Since(t1))
	assert.Less(t, time.Since(t1), tasks.DefaultLockDuration*3/4, "well under the lock duration")
}
