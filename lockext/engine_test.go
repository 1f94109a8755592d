package lockext_test

// Against the real engine that `make up` starts (internal/testenv): the extender keeps
// a short lock alive well past its duration, and hears of a lost lock or a vanished
// task through the handler's context. Each test deploys its own model and runs in
// parallel with the others.

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/lockext"
)

// engineEnv is one test's engine, model and worker id.
type engineEnv struct {
	t      *testing.T
	c      *admin.Client
	m      testenv.Model
	worker string
	ctx    context.Context
}

func newEngineEnv(t *testing.T) *engineEnv {
	t.Helper()
	t.Parallel()
	c := testenv.Engine(t)
	return &engineEnv{t: t, c: c, m: testenv.Deploy(t, c, testenv.ModelOptions{}), worker: testenv.Unique("worker"), ctx: testenv.Context(t, 2*time.Minute)}
}

func (e *engineEnv) fetch(worker string, lock time.Duration) []camunda7.LockedExternalTask {
	e.t.Helper()
	tasks, err := e.c.FetchAndLock(e.ctx, camunda7.FetchAndLockRequest{WorkerID: worker, MaxTasks: 1,
		Topics: []camunda7.FetchTopic{{TopicName: e.m.Topic, LockDuration: lock}}})
	require.NoError(e.t, err)
	return tasks
}

// startAndExtend starts an instance, fetches its task with lock for e.worker (noting
// when the fetch was sent, as the runtime does) and starts an extender on it.
func (e *engineEnv) startAndExtend(l lockext.Locker, cfg lockext.Config) (*admin.ProcessInstance, camunda7.LockedExternalTask, *lockext.Extender) {
	e.t.Helper()
	pi, err := e.c.StartProcess(e.ctx, e.m.Key, admin.StartProcessRequest{})
	require.NoError(e.t, err)
	grantedAt := time.Now()
	tasks := e.fetch(e.worker, cfg.LockDuration)
	require.Len(e.t, tasks, 1)
	require.Equal(e.t, pi.ID, tasks[0].ProcessInstanceID)
	ext, err := lockext.Start(e.ctx, l, lockext.Task{ID: tasks[0].ID, WorkerID: e.worker, GrantedAt: grantedAt}, cfg)
	require.NoError(e.t, err)
	e.t.Cleanup(ext.Stop)
	return pi, tasks[0], ext
}

// timedLocker records how long each real extendLock call took.
type timedLocker struct {
	l    lockext.Locker
	mu   sync.Mutex
	took []time.Duration
}

func (tl *timedLocker) ExtendLock(ctx context.Context, taskID, workerID string, d time.Duration) error {
	start := time.Now()
	err := tl.l.ExtendLock(ctx, taskID, workerID, d)
	tl.mu.Lock()
	tl.took = append(tl.took, time.Since(start))
	tl.mu.Unlock()
	return err
}

func (tl *timedLocker) Lock(ctx context.Context, taskID, workerID string, d time.Duration) error {
	return tl.l.Lock(ctx, taskID, workerID, d)
}

// cutLocker stands for an engine the worker cannot reach while down is set: every call
// fails as not sent.
type cutLocker struct {
	l    lockext.Locker
	down atomic.Bool
}

func (c *cutLocker) ExtendLock(ctx context.Context, taskID, workerID string, d time.Duration) error {
	if c.down.Load() {
		return &camunda7.TransportError{Op: "extend lock of external task " + taskID, Err: errors.New("connection refused")}
	}
	return c.l.ExtendLock(ctx, taskID, workerID, d)
}

func (c *cutLocker) Lock(ctx context.Context, taskID, workerID string, d time.Duration) error {
	if c.down.Load() {
		return &camunda7.TransportError{Op: "lock external task " + taskID, Err: errors.New("connection refused")}
	}
	return c.l.Lock(ctx, taskID, workerID, d)
}

func (tl *timedLocker) stats() (n int, median, worst time.Duration) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if len(tl.took) == 0 {
		return 0, 0, 0
	}
	s := slices.Sorted(slices.Values(tl.took))
	return len(s), s[len(s)/2], s[len(s)-1]
}

// waitCause waits, without sleeping, for ext's context to end and returns its cause and
// how long after since that was.
func waitCause(t *testing.T, ext *lockext.Extender, since time.Time, within time.Duration) (error, time.Duration) {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case <-ext.Context().Done():
		return context.Cause(ext.Context()), time.Since(since)
	case <-timer.C:
		t.Fatalf("extender context not cancelled within %v (extensions %d, lost %v)", within, ext.Extensions(), ext.Lost())
		return nil, 0
	}
}

// A 2s lock extended every 500ms stays ours for 5s: the engine's expiry keeps moving,
// never falls behind the extender's conservative local deadline, and no other worker
// can fetch the task. Then complete succeeds.
func TestEngineKeepsLockAlive(t *testing.T) {
	e := newEngineEnv(t)
	const lock = 2 * time.Second
	tl := &timedLocker{l: e.c}
	_, task, ext := e.startAndExtend(tl, lockext.Config{LockDuration: lock, Interval: 500 * time.Millisecond})
	started := time.Now()

	var (
		expiries   []time.Time
		minMargin  = time.Hour // engine expiry minus local deadline: how conservative the deadline is
		tick       = time.NewTicker(250 * time.Millisecond)
		stolen     []camunda7.LockedExternalTask
		thief      = testenv.Unique("thief")
		afterFirst bool
	)
	defer tick.Stop()
	for time.Since(started) < 5*time.Second {
		<-tick.C
		deadline := ext.Deadline()
		got, err := e.c.ExternalTask(e.ctx, task.ID)
		require.NoError(t, err)
		require.Equal(t, e.worker, got.WorkerID)
		exp := got.LockExpirationTime.Time
		require.True(t, exp.After(time.Now()), "lock expired at %v", exp)
		if afterFirst = afterFirst || ext.Extensions() > 0; afterFirst {
			// The engine's clock and ours are the same host's; the engine truncates to ms.
			margin := exp.Sub(deadline)
			assert.Greater(t, margin, -5*time.Millisecond, "engine expiry %v before local deadline %v", exp, deadline)
			minMargin = min(minMargin, margin)
		}
		if n := len(expiries); n == 0 || !exp.Equal(expiries[n-1]) {
			require.True(t, n == 0 || exp.After(expiries[n-1]), "lock expiry went back: %v after %v", exp, expiries)
			expiries = append(expiries, exp)
		}
		stolen = append(stolen, e.fetch(thief, time.Minute)...)
	}
	require.Empty(t, stolen, "another worker fetched a task whose lock was being extended")
	require.NoError(t, ext.Context().Err())
	require.NoError(t, ext.Lost())
	held := time.Since(started)
	assert.Greater(t, held, 2*lock, "held well past the original lock")
	assert.GreaterOrEqual(t, len(expiries), 8, "lock expiry moved with the extensions: %v", expiries)
	assert.GreaterOrEqual(t, ext.Extensions(), 8)

	// The runtime reports the result while the extender still runs, then stops it. A
	// complete racing an extendLock can meet the engine's optimistic lock (nothing was
	// committed, so it is retried).
	err := e.c.Complete(e.ctx, task.ID, camunda7.CompleteRequest{WorkerID: e.worker})
	if errors.Is(err, camunda7.ErrOptimisticLock) {
		t.Logf("complete met a concurrent extendLock (%v); retrying", err)
		err = e.c.Complete(e.ctx, task.ID, camunda7.CompleteRequest{WorkerID: e.worker})
	}
	require.NoError(t, err)
	ext.Stop()
	cause := context.Cause(ext.Context())
	if !errors.Is(cause, lockext.ErrStopped) {
		// An extension sent between complete and Stop finds the task gone.
		assert.ErrorIs(t, cause, camunda7.ErrTaskGone)
	}
	_, err = e.c.ExternalTask(e.ctx, task.ID)
	assert.ErrorIs(t, err, camunda7.ErrTaskGone)

	n, median, worst := tl.stats()
	t.Logf("lock %v held %v by %d extensions (%d calls; extendLock median %v, worst %v); %d distinct engine expiries; engine expiry ahead of local deadline by at least %v",
		lock, held.Round(time.Millisecond), ext.Extensions(), n, median, worst, len(expiries), minMargin)
}

// Someone unlocks the task and another worker fetches it: the next extension is refused
// and the handler's context ends with a *LockLostError.
func TestEngineLockLostToAnotherWorker(t *testing.T) {
	e := newEngineEnv(t)
	_, task, ext := e.startAndExtend(e.c, lockext.Config{LockDuration: 2 * time.Second, Interval: 500 * time.Millisecond})
	testenv.Eventually(t, 10*time.Second, "two extensions", func() (bool, error) { return ext.Extensions() >= 2, ext.Lost() })

	require.NoError(t, e.c.Unlock(e.ctx, task.ID))
	lostAt := time.Now()
	thief := testenv.Unique("thief")
	got := e.fetch(thief, time.Minute)
	require.Len(t, got, 1, "another worker fetches the unlocked task")
	require.Equal(t, task.ID, got[0].ID)

	cause, after := waitCause(t, ext, lostAt, 5*time.Second)
	assert.ErrorIs(t, cause, camunda7.ErrLockLost)
	var lost *lockext.LockLostError
	require.ErrorAs(t, cause, &lost)
	assert.Equal(t, task.ID, lost.TaskID)
	var ee *camunda7.Error
	require.ErrorAs(t, cause, &ee)
	assert.Equal(t, 400, ee.StatusCode)
	assert.Equal(t, lost, ext.Lost())
	t.Logf("lock lost %v after unlock (%d extensions before): %v", after.Round(time.Millisecond), ext.Extensions(), cause)

	// The thief holds it now and can complete.
	require.NoError(t, e.c.Complete(e.ctx, task.ID, camunda7.CompleteRequest{WorkerID: thief}))
}

// The instance is deleted (the task is cancelled, as by a boundary event or an
// operator): the next extension gets a 404 and the cause wraps camunda7.ErrTaskGone.
func TestEngineTaskGone(t *testing.T) {
	e := newEngineEnv(t)
	pi, task, ext := e.startAndExtend(e.c, lockext.Config{LockDuration: 2 * time.Second, Interval: 500 * time.Millisecond})
	testenv.Eventually(t, 10*time.Second, "one extension", func() (bool, error) { return ext.Extensions() >= 1, ext.Lost() })

	require.NoError(t, e.c.DeleteProcessInstance(e.ctx, pi.ID))
	goneAt := time.Now()

	cause, after := waitCause(t, ext, goneAt, 5*time.Second)
	assert.ErrorIs(t, cause, camunda7.ErrLockLost)
	assert.ErrorIs(t, cause, camunda7.ErrTaskGone)
	var lost *lockext.LockLostError
	require.ErrorAs(t, cause, &lost)
	assert.Equal(t, task.ID, lost.TaskID)
	t.Logf("task gone noticed %v after the instance was deleted: %v", after.Round(time.Millisecond), cause)

	ext.Stop()
	assert.Equal(t, cause, context.Cause(ext.Context()), "Stop keeps the cause")
}

// The engine fact behind "Reporting while extending" in the package doc: a complete
// that meets a concurrent extendLock is refused with an OptimisticLockingException
// (nothing committed) and succeeds when sent again; the extension either succeeds, or
// is refused with an OptimisticLockingException or a 404 when the complete won. Either
// way nothing is lost or done twice.
func TestEngineCompleteRacingExtension(t *testing.T) {
	e := newEngineEnv(t)
	outcomes := map[string]int{}
	for range 10 {
		_, err := e.c.StartProcess(e.ctx, e.m.Key, admin.StartProcessRequest{})
		require.NoError(t, err)
		tasks := e.fetch(e.worker, time.Minute)
		require.Len(t, tasks, 1)
		id := tasks[0].ID

		var wg sync.WaitGroup
		var completeErr, extendErr error
		wg.Go(func() { completeErr = e.c.Complete(e.ctx, id, camunda7.CompleteRequest{WorkerID: e.worker}) })
		wg.Go(func() { extendErr = e.c.ExtendLock(e.ctx, id, e.worker, time.Minute) })
		wg.Wait()

		switch {
		case extendErr == nil:
		case errors.Is(extendErr, camunda7.ErrTaskGone), errors.Is(extendErr, camunda7.ErrOptimisticLock):
			// The complete won; the extender retries an optimistic-lock refusal (transient)
			// and then finds the task gone, unless Stop comes first.
			outcomes["extension refused"]++
		default:
			t.Errorf("extendLock racing complete: %v", extendErr)
		}
		switch {
		case completeErr == nil:
			outcomes["complete won"]++
		case errors.Is(completeErr, camunda7.ErrOptimisticLock):
			outcomes["complete refused, retried"]++
			require.NoError(t, e.c.Complete(e.ctx, id, camunda7.CompleteRequest{WorkerID: e.worker}), "complete again")
		default:
			t.Errorf("complete racing extendLock: %v", completeErr)
		}
		_, err = e.c.ExternalTask(e.ctx, id)
		require.ErrorIs(t, err, camunda7.ErrTaskGone, "completed exactly once")
	}
	t.Logf("complete sent together with extendLock, 10 tries: %v", outcomes)
}

// Why the runtime stops the extender before it unlocks a task (rather than after): an
// unlock that meets a concurrent extendLock is refused with an
// OptimisticLockingException, and the task stays locked by this worker until the
// extended lock runs out, out of every other worker's reach.
func TestEngineUnlockRacingExtension(t *testing.T) {
	e := newEngineEnv(t)
	outcomes := map[string]int{}
	for range 10 {
		_, err := e.c.StartProcess(e.ctx, e.m.Key, admin.StartProcessRequest{})
		require.NoError(t, err)
		tasks := e.fetch(e.worker, time.Minute)
		require.Len(t, tasks, 1)
		id := tasks[0].ID

		var wg sync.WaitGroup
		var unlockErr, extendErr error
		wg.Go(func() { unlockErr = e.c.Unlock(e.ctx, id) })
		wg.Go(func() { extendErr = e.c.ExtendLock(e.ctx, id, e.worker, time.Minute) })
		wg.Wait()

		got, err := e.c.ExternalTask(e.ctx, id)
		require.NoError(t, err)
		switch {
		case unlockErr == nil:
			outcomes["unlocked"]++
			assert.Empty(t, got.WorkerID)
			if extendErr != nil {
				assert.True(t, errors.Is(extendErr, camunda7.ErrOptimisticLock) || errors.Is(extendErr, camunda7.ErrLockLost), "extendLock: %v", extendErr)
			}
		case errors.Is(unlockErr, camunda7.ErrOptimisticLock):
			outcomes["unlock refused, still locked"]++
			require.NoError(t, extendErr)
			assert.Equal(t, e.worker, got.WorkerID, "the task stays locked by this worker")
		default:
			t.Errorf("unlock racing extendLock: %v", unlockErr)
		}
		require.NoError(t, e.c.Lock(e.ctx, id, e.worker, time.Minute))
		require.NoError(t, e.c.Complete(e.ctx, id, camunda7.CompleteRequest{WorkerID: e.worker}))
	}
	t.Logf("unlock sent together with extendLock, 10 tries: %v", outcomes)
}

// The engine is out of reach for longer than the lock: the lock expires on the engine,
// the extender keeps trying (the local clock never declares it lost), and once the
// engine answers "Cannot extend a lock that expired" the extender locks the task again,
// since nobody took it. The handler's context never ends, and the complete succeeds.
func TestEngineExpiredLockLockedAgain(t *testing.T) {
	e := newEngineEnv(t)
	cut := &cutLocker{l: e.c}
	_, task, ext := e.startAndExtend(cut, lockext.Config{LockDuration: time.Second, Interval: 300 * time.Millisecond})
	testenv.Eventually(t, 10*time.Second, "one extension", func() (bool, error) { return ext.Extensions() >= 1, ext.Lost() })

	cut.down.Store(true)
	testenv.Eventually(t, 10*time.Second, "the engine's lock expired", func() (bool, error) {
		got, err := e.c.ExternalTask(e.ctx, task.ID)
		return err == nil && got.LockExpirationTime.Time.Before(time.Now().Add(-500*time.Millisecond)), err
	})
	require.NoError(t, ext.Context().Err(), "not declared lost while the engine was out of reach")
	cut.down.Store(false)

	testenv.Eventually(t, 10*time.Second, "locked again", func() (bool, error) { return ext.Relocks() == 1, ext.Lost() })
	got, err := e.c.ExternalTask(e.ctx, task.ID)
	require.NoError(t, err)
	assert.Equal(t, e.worker, got.WorkerID)
	assert.True(t, got.LockExpirationTime.Time.After(time.Now()), "the lock is live again")
	require.NoError(t, ext.Context().Err())
	// The extender keeps extending meanwhile: a complete that meets an extension is the
	// engine's optimistic-locking failure (CI met one), sent again as a worker does.
	testenv.Eventually(t, 10*time.Second, "completed", func() (bool, error) {
		err := e.c.Complete(e.ctx, task.ID, camunda7.CompleteRequest{WorkerID: e.worker})
		if errors.Is(err, camunda7.ErrOptimisticLock) {
			return false, nil
		}
		return err == nil, err
	})
}

// The same outage, but another worker fetched the task once its lock expired: the
// extender's lock is refused with the other worker's name, and that is a loss.
func TestEngineExpiredLockTakenMeanwhile(t *testing.T) {
	e := newEngineEnv(t)
	cut := &cutLocker{l: e.c}
	_, task, ext := e.startAndExtend(cut, lockext.Config{LockDuration: time.Second, Interval: 300 * time.Millisecond})
	testenv.Eventually(t, 10*time.Second, "one extension", func() (bool, error) { return ext.Extensions() >= 1, ext.Lost() })

	cut.down.Store(true)
	thief := testenv.Unique("thief")
	testenv.Eventually(t, 10*time.Second, "another worker fetched the task", func() (bool, error) {
		return len(e.fetch(thief, time.Minute)) == 1, nil
	})
	cut.down.Store(false)
	cause, _ := waitCause(t, ext, time.Now(), 5*time.Second)
	assert.ErrorIs(t, cause, camunda7.ErrLockLost)
	assert.NotErrorIs(t, cause, camunda7.ErrLockExpired)
	assert.Contains(t, cause.Error(), thief)
	require.NoError(t, e.c.Complete(e.ctx, task.ID, camunda7.CompleteRequest{WorkerID: thief}))
}
