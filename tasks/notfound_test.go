package tasks_test

import (
	"context"
	"errors"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/tasks"
)

// nginx404 is nginx's own page for a location it routes nowhere (the engine's upstream
// being swapped, say): a 404 that is not the engine's answer about any task.
const nginx404 = "<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not Found</h1></center>\r\n" +
	"<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n"

// runVia starts a worker on c and returns a stop function that cancels it and waits.
func runVia(t *testing.T, c *camunda7.Client, reg *tasks.Registry, cfg tasks.Config) (*tasks.Worker, func()) {
	t.Helper()
	cfg.WorkerID = testenv.Unique("w")
	cfg.AsyncResponseTimeout = time.Second
	w, err := tasks.New(c, reg, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			require.NoError(t, <-done)
		}
	}
	t.Cleanup(stop)
	return w, stop
}

// A 404 that is not the engine's answer (a proxy's or servlet container's HTML page while
// the engine is redeployed) used to count as "task gone" wherever the worker met it: the
// handler was cancelled, or its result (complete, failure, BPMN error) dropped as
// lock-lost, or an unlock taken as done. It is a transient failure now, sent again until
// the engine answers: the result lands once, the handler runs once, nothing is lost.
func TestForeign404IsRetriedNotTaskGone(t *testing.T) {
	const lock = 2 * time.Second
	t.Run("complete", func(t *testing.T) {
		f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
		p, c := redeployClient(t, "/complete", 2)
		ids := f.start(1)
		var runs atomic.Int64
		reg := tasks.NewRegistry()
		register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
			runs.Add(1)
			return nil, nil
		}, tasks.TopicOptions{LockDuration: lock, Retry: fastRetry})
		w, stop := runVia(t, c, reg, tasks.Config{})
		f.waitEnded(ids, time.Minute)
		stop()
		assert.EqualValues(t, 2, p.Injected.Load())
		assert.EqualValues(t, 1, runs.Load(), "the handler ran once")
		assert.EqualValues(t, 1, w.Stats().Completed.Load())
		assert.Zero(t, w.Stats().LockLost.Load())
	})
	t.Run("failure", func(t *testing.T) {
		f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
		p, c := redeployClient(t, "/failure", 2)
		ids := f.start(1)
		var runs atomic.Int64
		reg := tasks.NewRegistry()
		register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
			if runs.Add(1) == 1 {
				return nil, errors.New("the provider timed out")
			}
			return nil, nil
		}, tasks.TopicOptions{LockDuration: lock, Retry: fastRetry})
		w, stop := runVia(t, c, reg, tasks.Config{})
		f.waitEnded(ids, time.Minute)
		stop()
		assert.EqualValues(t, 2, p.Injected.Load())
		assert.EqualValues(t, 2, runs.Load(), "the failure landed, then the retry completed")
		assert.EqualValues(t, 1, w.Stats().Failures.Load())
		assert.Zero(t, w.Stats().LockLost.Load())
		log, err := f.c.ExternalTaskLog(f.ctx, url.Values{"processInstanceId": {ids[0]}, "failureLog": {"true"}})
		require.NoError(t, err)
		require.Len(t, log, 1, "the failure reached the engine")
		assert.Contains(t, log[0].ErrorMessage, "the provider timed out")
	})
	t.Run("bpmnError", func(t *testing.T) {
		f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
		p, c := redeployClient(t, "/bpmnError", 2)
		ids := f.start(1)
		var runs atomic.Int64
		reg := tasks.NewRegistry()
		register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
			runs.Add(1)
			return nil, failure.BPMNError("BUSINESS_ERROR", "declined", nil)
		}, tasks.TopicOptions{LockDuration: lock, Retry: fastRetry})
		w, stop := runVia(t, c, reg, tasks.Config{})
		f.waitEnded(ids, time.Minute)
		stop()
		assert.EqualValues(t, 2, p.Injected.Load())
		assert.EqualValues(t, 1, runs.Load(), "the BPMN error landed the first time")
		assert.EqualValues(t, 1, w.Stats().BPMNErrors.Load())
		assert.Zero(t, w.Stats().LockLost.Load())
	})
	t.Run("extendLock", func(t *testing.T) {
		f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
		p, c := redeployClient(t, "/extendLock", 3)
		ids := f.start(1)
		var cause atomic.Value
		reg := tasks.NewRegistry()
		register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
			// Runs until three extensions met a 404 and one more reached the engine.
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for p.Injected.Load() < 3 || p.Passed.Load() < 1 {
				select {
				case <-ctx.Done():
					cause.Store(context.Cause(ctx))
					return nil, context.Cause(ctx)
				case <-tick.C:
				}
			}
			return nil, nil
		}, tasks.TopicOptions{LockDuration: 1500 * time.Millisecond, Retry: fastRetry})
		w, stop := runVia(t, c, reg, tasks.Config{})
		f.waitEnded(ids, time.Minute)
		stop()
		assert.Nil(t, cause.Load(), "the handler was not cancelled")
		assert.EqualValues(t, 1, w.Stats().Completed.Load())
		assert.Zero(t, w.Stats().LockLost.Load())
	})
	t.Run("unlock", func(t *testing.T) {
		f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
		p, c := redeployClient(t, "/unlock", 2)
		f.start(1)
		started := make(chan struct{})
		reg := tasks.NewRegistry()
		register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
			close(started)
			<-ctx.Done() // until the shutdown cancels it: the task is to be unlocked
			return nil, context.Cause(ctx)
		}, tasks.TopicOptions{LockDuration: time.Minute})
		w, stop := runVia(t, c, reg, tasks.Config{ShutdownGrace: 100 * time.Millisecond})
		<-started
		stop()
		assert.EqualValues(t, 2, p.Injected.Load())
		// At least once: the unlock wakes the worker's own pending long poll, which may
		// take the task again, to be unlocked again at once.
		assert.GreaterOrEqual(t, w.Stats().Unlocked.Load(), int64(1))
		left, err := f.c.ExternalTasks(f.ctx, camunda7.ExternalTaskQuery{ProcessDefinitionKey: f.m.Key, Locked: true})
		require.NoError(t, err)
		assert.Empty(t, left, "the unlock reached the engine: nothing stays locked for a minute")
	})
}

// redeployClient returns an engine client going through a new testenv.RedeployProxy
// that serves nginx's 404 page.
func redeployClient(t *testing.T, suffix string, n int64) (*testenv.RedeployProxy, *camunda7.Client) {
	t.Helper()
	p, root := testenv.NewRedeployProxy(t, suffix, nginx404, n)
	c, err := camunda7.New(camunda7.Config{BaseURL: root})
	require.NoError(t, err)
	return p, c
}
