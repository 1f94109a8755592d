package tasks_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/tasks"
)

// fastRetry keeps retry tests short; the engine does not wake a pending long poll when
// a retry timeout ends, so tests also use a short long poll.
var fastRetry = failure.RetryPolicy{MaxAttempts: 3, InitialDelay: 100 * time.Millisecond, Multiplier: 2, MaxDelay: time.Second}

type fixture struct {
	t   *testing.T
	c   *admin.Client
	m   testenv.Model
	ctx context.Context
}

func newFixture(t *testing.T, opts testenv.ModelOptions) *fixture {
	t.Helper()
	t.Parallel()
	c := testenv.Engine(t)
	return &fixture{t: t, c: c, m: testenv.Deploy(t, c, opts), ctx: testenv.Context(t, 3*time.Minute)}
}

func (f *fixture) start(n int) []string {
	f.t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		pi, err := f.c.StartProcess(f.ctx, f.m.Key, admin.StartProcessRequest{
			BusinessKey: fmt.Sprintf("order-%d", i),
			Variables:   camunda7.Variables{"n": camunda7.LongVar(int64(i)), "secretish": camunda7.StringVar("not fetched")},
		})
		require.NoError(f.t, err)
		ids = append(ids, pi.ID)
	}
	return ids
}

// run starts a worker and returns a stop function that cancels it and waits for Run.
func (f *fixture) run(reg *tasks.Registry, cfg tasks.Config) (*tasks.Worker, func()) {
	f.t.Helper()
	if cfg.AsyncResponseTimeout == 0 {
		cfg.AsyncResponseTimeout = time.Second
	}
	if cfg.WorkerID == "" {
		cfg.WorkerID = testenv.Unique("w")
	}
	w, err := tasks.New(f.c, reg, cfg)
	require.NoError(f.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				assert.NoError(f.t, err)
			case <-time.After(time.Minute):
				f.t.Error("worker did not stop within a minute")
			}
		})
	}
	f.t.Cleanup(stop)
	return w, stop
}

func (f *fixture) state(id string) string {
	h, err := f.c.HistoricProcessInstance(f.ctx, id)
	require.NoError(f.t, err)
	return h.State
}

func (f *fixture) waitEnded(ids []string, timeout time.Duration) {
	f.t.Helper()
	testenv.Eventually(f.t, timeout, fmt.Sprintf("%d instances to end", len(ids)), func() (bool, error) {
		for _, id := range ids {
			if f.state(id) != "COMPLETED" {
				return false, nil
			}
		}
		return true, nil
	})
}

func (f *fixture) waitIncident(id string, timeout time.Duration) admin.Incident {
	f.t.Helper()
	var inc []admin.Incident
	testenv.Eventually(f.t, timeout, "an incident on "+id, func() (bool, error) {
		var err error
		inc, err = f.c.Incidents(f.ctx, url.Values{"processInstanceId": {id}})
		return len(inc) > 0, err
	})
	return inc[0]
}

func register(t *testing.T, reg *tasks.Registry, topic string, h tasks.Handler, opts tasks.TopicOptions) {
	t.Helper()
	require.NoError(t, reg.Register(topic, h, opts))
}

func TestWorkerCompletesWithVariables(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(10)
	var calls atomic.Int64
	seen := sync.Map{}
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		calls.Add(1)
		if _, dup := seen.LoadOrStore(tk.ID(), true); dup {
			t.Errorf("task %s handled twice", tk.ID())
		}
		n, err := tk.Variables().Long("n")
		if err != nil {
			return nil, failure.Permanent(err)
		}
		if tk.Variables().Has("secretish") {
			t.Errorf("fetched a variable the topic did not name")
		}
		assert.Equal(t, 1, tk.Attempt())
		assert.Equal(t, fmt.Sprintf("order-%d", n), tk.BusinessKey())
		tk.SetLocalVariable("handledBy", camunda7.StringVar(tk.WorkerID()))
		return camunda7.Variables{"doubled": camunda7.LongVar(2 * n)}, nil
	}, tasks.TopicOptions{Variables: []string{"n"}})
	w, stop := f.run(reg, tasks.Config{MaxConcurrency: 4})
	f.waitEnded(ids, time.Minute)
	stop()
	assert.EqualValues(t, 10, calls.Load())
	assert.EqualValues(t, 10, w.Stats().Completed.Load())
	hv, err := f.c.HistoricVariableInstances(f.ctx, url.Values{"processInstanceId": {ids[3]}, "variableName": {"doubled"}})
	require.NoError(t, err)
	require.Len(t, hv, 1)
	n, err := camunda7.Variables{"v": hv[0].Variable()}.Long("v")
	require.NoError(t, err)
	assert.EqualValues(t, 6, n)
}

// The worker never locks more tasks than it has free slots.
func TestWorkerLocksOnlyWhatItCanStart(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(6)
	release := make(chan struct{})
	var running atomic.Int64
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		running.Add(1)
		defer running.Add(-1)
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return nil, nil
	}, tasks.TopicOptions{})
	w, stop := f.run(reg, tasks.Config{MaxConcurrency: 2})
	testenv.Eventually(t, 30*time.Second, "two handlers running", func() (bool, error) { return running.Load() == 2, nil })
	locked, err := f.c.ExternalTasks(f.ctx, camunda7.ExternalTaskQuery{TopicName: f.m.Topic, Locked: true})
	require.NoError(t, err)
	assert.Len(t, locked, 2, "only as many locked as running")
	for _, tk := range locked {
		assert.Equal(t, w.WorkerID(), tk.WorkerID)
	}
	close(release)
	f.waitEnded(ids, time.Minute)
	stop()
	assert.EqualValues(t, 2, w.Stats().MaxInFlight.Load())
}

func TestWorkerPerTopicLimit(t *testing.T) {
	t.Parallel()
	c := testenv.Engine(t)
	ctx := testenv.Context(t, 2*time.Minute)
	a := testenv.Deploy(t, c, testenv.ModelOptions{NoMessageWait: true})
	b := testenv.Deploy(t, c, testenv.ModelOptions{NoMessageWait: true})
	var ids []string
	for i := 0; i < 4; i++ {
		for _, m := range []testenv.Model{a, b} {
			pi, err := c.StartProcess(ctx, m.Key, admin.StartProcessRequest{})
			require.NoError(t, err)
			ids = append(ids, pi.ID)
		}
	}
	var inA, maxA atomic.Int64
	release := make(chan struct{})
	reg := tasks.NewRegistry()
	register(t, reg, a.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		n := inA.Add(1)
		defer inA.Add(-1)
		for m := maxA.Load(); n > m && !maxA.CompareAndSwap(m, n); m = maxA.Load() {
		}
		<-release
		return nil, nil
	}, tasks.TopicOptions{MaxConcurrency: 1})
	register(t, reg, b.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) { return nil, nil }, tasks.TopicOptions{})
	f := &fixture{t: t, c: c, m: a, ctx: ctx}
	_, stop := f.run(reg, tasks.Config{MaxConcurrency: 8})
	testenv.Eventually(t, 30*time.Second, "topic b done while a holds its one slot", func() (bool, error) {
		locked, err := c.ExternalTasks(ctx, camunda7.ExternalTaskQuery{TopicName: a.Topic, Locked: true})
		if err != nil {
			return false, err
		}
		open, err := c.ExternalTasks(ctx, camunda7.ExternalTaskQuery{TopicName: b.Topic})
		return len(locked) == 1 && len(open) == 0, err
	})
	close(release)
	f.waitEnded(ids, time.Minute)
	stop()
	assert.EqualValues(t, 1, maxA.Load())
}

func TestWorkerRetriesThenSucceeds(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(1)
	var attempts []int
	var mu sync.Mutex
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		mu.Lock()
		attempts = append(attempts, tk.Attempt())
		n := len(attempts)
		mu.Unlock()
		if n < 3 {
			return nil, fmt.Errorf("provider busy (try %d)", n)
		}
		return nil, nil
	}, tasks.TopicOptions{Retry: fastRetry})
	_, stop := f.run(reg, tasks.Config{})
	f.waitEnded(ids, time.Minute)
	stop()
	assert.Equal(t, []int{1, 2, 3}, attempts)
	log, err := f.c.ExternalTaskLog(f.ctx, url.Values{"processInstanceId": {ids[0]}, "failureLog": {"true"}, "sortBy": {"timestamp"}, "sortOrder": {"asc"}})
	require.NoError(t, err)
	require.Len(t, log, 2)
	// The log records the retries the task had when the failure arrived: null before the
	// first, then the 2 our first failure seeded from the policy (3 attempts).
	assert.Nil(t, log[0].Retries)
	require.NotNil(t, log[1].Retries)
	assert.Equal(t, 2, *log[1].Retries)
	assert.Contains(t, log[0].ErrorMessage, "retryable: provider busy (try 1) (attempt 1 of 3, retrying in 100ms)")
}

func TestWorkerIncidentWhenRetriesExhausted(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(1)
	var calls atomic.Int64
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		calls.Add(1)
		return nil, errors.New("still down")
	}, tasks.TopicOptions{Retry: failure.RetryPolicy{MaxAttempts: 2, InitialDelay: 50 * time.Millisecond}})
	_, stop := f.run(reg, tasks.Config{})
	inc := f.waitIncident(ids[0], time.Minute)
	stop()
	assert.EqualValues(t, 2, calls.Load())
	assert.Equal(t, admin.IncidentTypeFailedExternalTask, inc.IncidentType)
	assert.Equal(t, "retryable: still down (attempt 2 of 2, retries exhausted)", inc.IncidentMessage)
	details, err := f.c.ExternalTaskErrorDetails(f.ctx, inc.Configuration)
	require.NoError(t, err)
	for _, want := range []string{"extworker: failure report v1", "classification: retryable", "attempt: 2 of 2", "retries left: 0: incident raised",
		"topic: " + f.m.Topic, "external task: " + inc.Configuration, "process instance: " + ids[0], "business key: order-0", "operator action: retries exhausted"} {
		assert.Contains(t, details, want)
	}
}

func TestWorkerOutcomes(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(4)
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		switch tk.BusinessKey() {
		case "order-0":
			return nil, failure.BPMNError("BUSINESS_ERROR", "card declined", map[string]any{"declineCode": "do_not_honor"})
		case "order-1":
			return nil, failure.Permanent(errors.New("invoice has no amount"))
		case "order-2":
			return nil, failure.UnknownOutcome(errors.New("payment request timed out after it was sent"))
		default:
			var m map[string]int
			m["boom"]++ // a nil-map panic
			return nil, nil
		}
	}, tasks.TopicOptions{Retry: failure.RetryPolicy{MaxAttempts: 1}})
	w, stop := f.run(reg, tasks.Config{})

	f.waitEnded(ids[:1], time.Minute)
	acts, err := f.c.HistoricActivityInstances(f.ctx, url.Values{"processInstanceId": {ids[0]}})
	require.NoError(t, err)
	var path []string
	for _, a := range acts {
		path = append(path, a.ActivityID)
	}
	assert.Contains(t, path, "endError", "BPMN error takes the boundary path")

	perm := f.waitIncident(ids[1], time.Minute)
	assert.Equal(t, "permanent: invoice has no amount", perm.IncidentMessage)
	unknown := f.waitIncident(ids[2], time.Minute)
	assert.Equal(t, "unknown-outcome: payment request timed out after it was sent", unknown.IncidentMessage)
	d, err := f.c.ExternalTaskErrorDetails(f.ctx, unknown.Configuration)
	require.NoError(t, err)
	assert.Contains(t, d, "operator action: the side effect may or may not have happened")
	panicked := f.waitIncident(ids[3], time.Minute)
	assert.Contains(t, panicked.IncidentMessage, "handler panicked")
	d, err = f.c.ExternalTaskErrorDetails(f.ctx, panicked.Configuration)
	require.NoError(t, err)
	assert.Contains(t, d, "panic stack:")
	assert.Contains(t, d, "worker_test.go")
	stop()
	assert.EqualValues(t, 1, w.Stats().BPMNErrors.Load())
	assert.EqualValues(t, 3, w.Stats().Incidents.Load())
}

// The lock is kept alive past its duration while the handler runs.
func TestWorkerExtendsLock(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(1)
	reg := tasks.NewRegistry()
	release := make(chan struct{})
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		select {
		case <-release:
			return nil, nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}, tasks.TopicOptions{LockDuration: 1500 * time.Millisecond})
	w, stop := f.run(reg, tasks.Config{})
	var first time.Time
	testenv.Eventually(t, 30*time.Second, "the task locked", func() (bool, error) {
		l, err := f.c.ExternalTasks(f.ctx, camunda7.ExternalTaskQuery{TopicName: f.m.Topic, Locked: true})
		if len(l) == 1 {
			first = l[0].LockExpirationTime.Time
		}
		return len(l) == 1, err
	})
	// Wait until the engine shows an expiry past the first lock's: it was extended.
	testenv.Eventually(t, 20*time.Second, "the lock extended beyond its first expiry", func() (bool, error) {
		l, err := f.c.ExternalTasks(f.ctx, camunda7.ExternalTaskQuery{TopicName: f.m.Topic, Locked: true})
		return len(l) == 1 && l[0].LockExpirationTime.After(first.Add(2*time.Second)), err
	})
	other, err := f.c.FetchAndLock(f.ctx, camunda7.FetchAndLockRequest{WorkerID: "intruder", MaxTasks: 1, Topics: []camunda7.FetchTopic{{TopicName: f.m.Topic, LockDuration: time.Minute}}})
	require.NoError(t, err)
	assert.Empty(t, other, "nobody else can fetch a task whose lock is kept alive")
	close(release)
	f.waitEnded(ids, 30*time.Second)
	stop()
	assert.EqualValues(t, 1, w.Stats().Completed.Load())
}

// When another worker takes the task, the handler's context ends with lock lost and the
// worker does not report.
func TestWorkerCancelsHandlerOnLockLoss(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	f.start(1)
	causes := make(chan error, 1)
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil, ctx.Err()
	}, tasks.TopicOptions{LockDuration: 1500 * time.Millisecond})
	// One slot: the worker cannot fetch the task back itself when it is unlocked.
	w, stop := f.run(reg, tasks.Config{MaxConcurrency: 1})
	var id string
	testenv.Eventually(t, 30*time.Second, "the task locked", func() (bool, error) {
		l, err := f.c.ExternalTasks(f.ctx, camunda7.ExternalTaskQuery{TopicName: f.m.Topic, Locked: true})
		if len(l) == 1 {
			id = l[0].ID
		}
		return len(l) == 1, err
	})
	require.NoError(t, f.c.Unlock(f.ctx, id))
	stolen, err := f.c.FetchAndLock(f.ctx, camunda7.FetchAndLockRequest{WorkerID: "thief", MaxTasks: 1, Topics: []camunda7.FetchTopic{{TopicName: f.m.Topic, LockDuration: time.Minute}}})
	require.NoError(t, err)
	require.Len(t, stolen, 1)
	select {
	case cause := <-causes:
		assert.ErrorIs(t, cause, camunda7.ErrLockLost)
	case <-time.After(20 * time.Second):
		t.Fatal("handler not cancelled after its lock was taken")
	}
	testenv.Eventually(t, 10*time.Second, "the worker to count the lost lock", func() (bool, error) { return w.Stats().LockLost.Load() == 1, nil })
	stop()
	got, err := f.c.ExternalTask(f.ctx, id)
	require.NoError(t, err)
	assert.Equal(t, "thief", got.WorkerID, "the worker did not report over the thief")
	assert.Nil(t, got.Retries, "no failure was reported")
}

// Shutdown: the long poll is aborted at once; a running handler may finish and its
// result is reported.
func TestWorkerGracefulShutdown(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	reg := tasks.NewRegistry()
	started := make(chan struct{})
	finish := make(chan struct{})
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		close(started)
		<-finish
		return camunda7.Variables{"finished": camunda7.BoolVar(true)}, nil
	}, tasks.TopicOptions{})

	ids := f.start(1)
	w, err := tasks.New(f.c, reg, tasks.Config{AsyncResponseTimeout: time.Second, WorkerID: testenv.Unique("w")})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	<-started
	cancel()
	select {
	case <-done:
		t.Fatal("Run returned while a handler was still running")
	default:
	}
	close(finish)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after the handler finished")
	}
	assert.Equal(t, "COMPLETED", f.state(ids[0]), "the result was reported during shutdown")
}

// Past the grace period the handler is cancelled with ErrShutdown and its task unlocked.
func TestWorkerShutdownGraceUnlocks(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(1)
	causes := make(chan error, 1)
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil, ctx.Err()
	}, tasks.TopicOptions{})
	w, stop := f.run(reg, tasks.Config{ShutdownGrace: 200 * time.Millisecond})
	testenv.Eventually(t, 30*time.Second, "the handler running", func() (bool, error) { return w.InFlight() == 1, nil })
	stop()
	assert.ErrorIs(t, <-causes, tasks.ErrShutdown)
	l, err := f.c.ExternalTasks(f.ctx, camunda7.ExternalTaskQuery{ProcessInstanceID: ids[0]})
	require.NoError(t, err)
	require.Len(t, l, 1)
	assert.Empty(t, l[0].WorkerID, "unlocked for the next worker")
	assert.Nil(t, l[0].Retries, "no retry spent")
}

// An unreachable engine: the worker backs off and logs the failure once, not per attempt.
func TestWorkerBacksOffWhileEngineUnreachable(t *testing.T) {
	t.Parallel()
	c, err := camunda7.New(camunda7.Config{BaseURL: "http://127.0.0.1:1/engine-rest"})
	require.NoError(t, err)
	logs := &recordingHandler{}
	reg := tasks.NewRegistry()
	register(t, reg, "t", func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) { return nil, nil }, tasks.TopicOptions{})
	w, err := tasks.New(c, reg, tasks.Config{FetchBackoffInitial: 10 * time.Millisecond, FetchBackoffMax: 50 * time.Millisecond, Logger: newLogger(logs)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	testenv.Eventually(t, 10*time.Second, "several failed fetches", func() (bool, error) { return logs.count("fetching tasks failed again") >= 5, nil })
	cancel()
	require.NoError(t, <-done)
	assert.Equal(t, 1, logs.count("fetching tasks failed; backing off until the engine answers"))
}

func TestRegistryRejectsBadOptions(t *testing.T) {
	reg := tasks.NewRegistry()
	h := func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) { return nil, nil }
	require.NoError(t, reg.Register("a", h, tasks.TopicOptions{}))
	err := reg.Register("a", nil, tasks.TopicOptions{LockDuration: time.Millisecond, MaxConcurrency: -1, Variables: []string{"x"}, AllVariables: true})
	require.Error(t, err)
	for _, want := range []string{"already registered", "nil handler", "LockDuration", "MaxConcurrency", "AllVariables"} {
		assert.Contains(t, err.Error(), want)
	}
	_, err = tasks.New(testenv.Engine(t), tasks.NewRegistry(), tasks.Config{})
	assert.Error(t, err, "a worker needs at least one topic")
	_, err = tasks.New(testenv.Engine(t), reg, tasks.Config{MaxConcurrency: -1, ReportAttempts: -2})
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "MaxConcurrency") && strings.Contains(err.Error(), "ReportAttempts"), err.Error())
}

// A task unlocked while its handler runs, and fetched again by the same worker, is not
// run a second time: the running handler keeps the new lock alive and reports.
func TestWorkerDoesNotRunARedeliveredTaskTwice(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(1)
	var calls atomic.Int64
	release := make(chan struct{})
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		calls.Add(1)
		select {
		case <-release:
			return nil, nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}, tasks.TopicOptions{LockDuration: 3 * time.Second})
	w, stop := f.run(reg, tasks.Config{MaxConcurrency: 4, AsyncResponseTimeout: 20 * time.Second})
	testenv.Eventually(t, 30*time.Second, "the handler running", func() (bool, error) { return calls.Load() == 1, nil })
	l, err := f.c.ExternalTasks(f.ctx, camunda7.ExternalTaskQuery{ProcessInstanceID: ids[0]})
	require.NoError(t, err)
	require.Len(t, l, 1)
	require.NoError(t, f.c.Unlock(f.ctx, l[0].ID)) // wakes the worker's pending long poll
	testenv.Eventually(t, 20*time.Second, "the worker to get the task back", func() (bool, error) { return w.Stats().Redelivered.Load() == 1, nil })
	close(release)
	f.waitEnded(ids, 30*time.Second)
	stop()
	assert.EqualValues(t, 1, calls.Load(), "one handler run")
	assert.EqualValues(t, 1, w.Stats().Completed.Load())
}
