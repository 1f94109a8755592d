package tasks_test

// Regression tests for defects found at the shipped defaults and by review, each named
// for what it proves, against the real engine (internal/testenv). The worker-level
// reliability tiers at the daemon's defaults live in cmd/extworker (defaults_test.go).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
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

// lossObserver counts polls, outcomes and lost locks.
type lossObserver struct {
	countingObserver
	lost atomic.Int64
}

func newLossObserver() *lossObserver {
	return &lossObserver{countingObserver: countingObserver{counts: map[string]int{}}}
}

func (o *lossObserver) LockLost(string, string) { o.lost.Add(1) }

// A task whose lock ran out while another worker's long poll was pending is handed to
// that poll only when the poll ends (the engine has no notification for a lock expiry),
// with a fresh lock but with the whole local lock already spent. The handler used to be
// cancelled at once ("expired locally before it could be extended"), spending a retry
// each time; now the lock is extended on arrival and the handler runs to completion.
func TestTaskHandedOverLateInALongPollRuns(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(1)
	// A worker that locks the task for 1s and is gone.
	got, err := f.c.FetchAndLock(f.ctx, camunda7.FetchAndLockRequest{WorkerID: testenv.Unique("gone"), MaxTasks: 1,
		Topics: []camunda7.FetchTopic{{TopicName: f.m.Topic, LockDuration: time.Second}}})
	require.NoError(t, err)
	require.Len(t, got, 1)

	var runs atomic.Int64
	var handlerErr atomic.Value
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		runs.Add(1)
		select { // a little work, long enough to be cancelled if the lock were declared lost
		case <-time.After(300 * time.Millisecond):
		case <-ctx.Done():
			handlerErr.Store(context.Cause(ctx))
			return nil, context.Cause(ctx)
		}
		return nil, nil
	}, tasks.TopicOptions{LockDuration: 3 * time.Second, Retry: fastRetry})
	obs := newLossObserver()
	// The long poll (6s) is longer than the lock (3s), as with the daemon's defaults (20s
	// and 20s), so the task arrives with its local lock already spent.
	w, stop := f.run(reg, tasks.Config{AsyncResponseTimeout: 6 * time.Second, Observer: obs})
	f.waitEnded(ids, time.Minute)
	stop()
	assert.Nil(t, handlerErr.Load(), "the handler was not cancelled")
	assert.EqualValues(t, 1, runs.Load(), "ran once")
	assert.EqualValues(t, 0, w.Stats().LockLost.Load())
	assert.EqualValues(t, 0, w.Stats().Failures.Load(), "no retry spent")
	assert.Zero(t, obs.lost.Load())
}

// A report that cannot be sent (the engine is out of reach) is sent again until it
// lands, for longer than the lock: the lock is kept (locked again once the engine is
// back, as nobody took the task), the handler is not run again, and no failure or retry
// is recorded.
func TestReportOutlastsAnEngineOutageLongerThanTheLock(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	u, err := url.Parse(testenv.EngineURL())
	require.NoError(t, err)
	proxy := testenv.NewProxy(t, u.Host)
	c, err := camunda7.New(camunda7.Config{BaseURL: strings.Replace(testenv.EngineURL(), u.Host, proxy.Addr(), 1), Timeout: 2 * time.Second})
	require.NoError(t, err)
	ids := f.start(1)

	const lock = 2 * time.Second
	var runs atomic.Int64
	cut := make(chan struct{})
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		if runs.Add(1) == 1 {
			proxy.Cut() // the engine goes away just before the result is reported
			close(cut)
		}
		return camunda7.Variables{"done": camunda7.BoolVar(true)}, nil
	}, tasks.TopicOptions{LockDuration: lock, Retry: fastRetry})
	w, err := tasks.New(c, reg, tasks.Config{WorkerID: testenv.Unique("w"), AsyncResponseTimeout: time.Second,
		FetchBackoffMax: time.Second, ReportTimeout: time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	<-cut
	// Down for 2.5 locks: the engine's lock runs out meanwhile.
	testenv.Eventually(t, 30*time.Second, "the engine's lock expired", func() (bool, error) {
		l, err := f.c.ExternalTasks(f.ctx, camunda7.ExternalTaskQuery{ProcessInstanceID: ids[0]})
		return err == nil && len(l) == 1 && !l[0].LockExpirationTime.Time.IsZero() && time.Since(l[0].LockExpirationTime.Time) > lock/2, err
	})
	assert.EqualValues(t, 0, w.Stats().Completed.Load())
	proxy.Restore()
	f.waitEnded(ids, time.Minute)
	// The engine ends the instance in the complete's transaction, before the worker reads
	// its answer and counts it: in CI the instance was seen ended with Completed still 0.
	testenv.Eventually(t, 30*time.Second, "the worker counted the completion", func() (bool, error) {
		return w.Stats().Completed.Load() == 1, nil
	})
	assert.EqualValues(t, 1, runs.Load(), "the handler ran once")
	assert.EqualValues(t, 1, w.Stats().Completed.Load())
	assert.EqualValues(t, 0, w.Stats().ReportErrors.Load())
	assert.EqualValues(t, 0, w.Stats().Failures.Load())
	log, err := f.c.ExternalTaskLog(f.ctx, url.Values{"processInstanceId": {ids[0]}, "failureLog": {"true"}})
	require.NoError(t, err)
	assert.Empty(t, log, "no failure reported")
}

// A complete the engine refuses with a 400 (here a badly formatted Date variable) used to
// be given up on, so the task cycled through lock expiries forever; it is now reported
// as a permanent failure carrying the engine's message: an incident.
func TestRefusedCompleteBecomesAnIncident(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(1)
	var runs atomic.Int64
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		runs.Add(1)
		return camunda7.Variables{"due": {Type: "Date", Value: json.RawMessage(`"next tuesday"`)}}, nil
	}, tasks.TopicOptions{Retry: fastRetry})
	w, stop := f.run(reg, tasks.Config{})
	inc := f.waitIncident(ids[0], time.Minute)
	stop()
	assert.EqualValues(t, 1, runs.Load())
	assert.EqualValues(t, 1, w.Stats().Incidents.Load())
	assert.True(t, strings.HasPrefix(inc.IncidentMessage, "permanent: complete refused by the engine:"), inc.IncidentMessage)
	assert.Contains(t, inc.IncidentMessage, "engine answered 400")
	t.Logf("incident: %s", inc.IncidentMessage)
}

// throttlingProxy forwards to the engine but answers the first n completes with a 429
// carrying Retry-After, as a rate-limiting proxy would, and records when completes came.
type throttlingProxy struct {
	n     atomic.Int64
	mu    sync.Mutex
	times []time.Time
}

func (p *throttlingProxy) start(t *testing.T, n int64) string {
	t.Helper()
	p.n.Store(n)
	u, err := url.Parse(testenv.EngineURL())
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Director = func(r *http.Request) { r.URL.Scheme, r.URL.Host = u.Scheme, u.Host }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/complete") {
			p.mu.Lock()
			p.times = append(p.times, time.Now())
			p.mu.Unlock()
			if p.n.Add(-1) >= 0 {
				w.Header().Set("Retry-After", "1")
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(http.StatusTooManyRequests)
				fmt.Fprint(w, "<html>slow down</html>")
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + u.Path
}

// A 429 from a proxy in front of the engine is sent again after its Retry-After, not
// given up on, and not turned into a failure.
func TestThrottledCompleteRetriedAfterRetryAfter(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	var p throttlingProxy
	c, err := camunda7.New(camunda7.Config{BaseURL: p.start(t, 2)})
	require.NoError(t, err)
	ids := f.start(1)
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) { return nil, nil }, tasks.TopicOptions{})
	w, err := tasks.New(c, reg, tasks.Config{WorkerID: testenv.Unique("w"), AsyncResponseTimeout: time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	f.waitEnded(ids, time.Minute)
	cancel()
	require.NoError(t, <-done)
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Len(t, p.times, 3, "two throttled completes, then the one that landed")
	for i := 1; i < 3; i++ {
		assert.GreaterOrEqual(t, p.times[i].Sub(p.times[i-1]), 900*time.Millisecond, "Retry-After: 1 honoured")
	}
	assert.EqualValues(t, 0, w.Stats().Failures.Load())
	assert.EqualValues(t, 1, w.Stats().Completed.Load())
}

// An answer larger than the client accepts used to make the loop spin (unlock, refetch,
// the same answer again). The worker now asks for fewer tasks at a time, and the one
// task whose variables alone exceed the limit is failed with an incident naming the
// limit.
func TestOversizedAnswerShrinksTheFetchThenFailsTheTask(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	c, err := camunda7.New(camunda7.Config{BaseURL: testenv.EngineURL(), MaxResponseBytes: 16 << 10})
	require.NoError(t, err)
	var ids, names []string
	for i := range 14 {
		names = append(names, fmt.Sprintf("payload%d", i))
	}
	for i := range 5 {
		vars := camunda7.Variables{"payload0": camunda7.StringVar(strings.Repeat("x", 2000))}
		if i == 2 { // alone over the limit: 14 strings of 3,000 characters (the engine's cap is 4,000)
			for _, n := range names {
				vars[n] = camunda7.StringVar(strings.Repeat("y", 3000))
			}
		}
		pi, err := f.c.StartProcess(f.ctx, f.m.Key, admin.StartProcessRequest{BusinessKey: fmt.Sprintf("order-%d", i), Variables: vars})
		require.NoError(t, err)
		ids = append(ids, pi.ID)
	}
	var runs atomic.Int64
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		runs.Add(1)
		return nil, nil
	}, tasks.TopicOptions{Variables: names})
	obs := newLossObserver()
	w, err := tasks.New(c, reg, tasks.Config{WorkerID: testenv.Unique("w"), AsyncResponseTimeout: time.Second, MaxConcurrency: 8, Observer: obs})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	inc := f.waitIncident(ids[2], time.Minute)
	f.waitEnded(append(ids[:2:2], ids[3:]...), time.Minute)
	cancel()
	require.NoError(t, <-done)
	assert.EqualValues(t, 4, runs.Load(), "every task that fits ran once")
	assert.Contains(t, inc.IncidentMessage, "MaxResponseBytes")
	assert.Less(t, obs.get("polled"), 40, "no spinning")
	t.Logf("%d polls; incident: %s", obs.get("polled"), inc.IncidentMessage)
}

// With long polling off, polls that find nothing wait IdlePollInterval instead of
// following each other at once.
func TestIdlePollsWaitWithoutLongPolling(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) { return nil, nil }, tasks.TopicOptions{})
	obs := newLossObserver()
	_, stop := f.run(reg, tasks.Config{AsyncResponseTimeout: tasks.NoLongPoll, IdlePollInterval: 500 * time.Millisecond, Observer: obs})
	start := time.Now()
	testenv.Eventually(t, 30*time.Second, "some polls", func() (bool, error) { return obs.get("polled") >= 4, nil })
	took := time.Since(start)
	stop()
	n := obs.get("polled")
	assert.LessOrEqual(t, float64(n), took.Seconds()/0.5+2, "%d polls in %v: paced by IdlePollInterval", n, took)
}

// A handler that ignores its context no longer holds the shutdown forever: Run returns
// ErrShutdownTimeout at ShutdownTimeout.
func TestShutdownBoundedWithAHandlerIgnoringItsContext(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	f.start(1)
	release := make(chan struct{})
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		<-release // ignores ctx
		return nil, nil
	}, tasks.TopicOptions{})
	w, err := tasks.New(f.c, reg, tasks.Config{WorkerID: testenv.Unique("w"), AsyncResponseTimeout: time.Second,
		ShutdownGrace: 200 * time.Millisecond, ShutdownTimeout: time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	testenv.Eventually(t, 30*time.Second, "the handler running", func() (bool, error) { return w.InFlight() == 1, nil })
	cancel()
	t0 := time.Now()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, tasks.ErrShutdownTimeout)
		assert.Less(t, time.Since(t0), 5*time.Second)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return at its shutdown timeout")
	}
	close(release)
	testenv.Eventually(t, 30*time.Second, "the abandoned handler to finish", func() (bool, error) { return w.InFlight() == 0, nil })
}

// pollWatch counts the fetchAndLock requests in flight through a client.
type pollWatch struct {
	next    http.RoundTripper
	pending atomic.Int64
}

func (p *pollWatch) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(r.URL.Path, "/fetchAndLock") {
		return p.next.RoundTrip(r)
	}
	p.pending.Add(1)
	defer p.pending.Add(-1)
	return p.next.RoundTrip(r)
}

// A rolling restart: the old worker stops while its long poll is pending, and a task is
// created right then. The engine locks it for that pending poll, that is for a worker
// that is going away. It used to sit locked for a whole lock duration before the new
// worker could have it; now the stopping worker waits for its poll and unlocks what it
// returns, so the new worker picks the task up at once. At the daemon's defaults (20s
// long poll, 20s lock).
func TestRollingRestartPickupDelay(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	const lock, poll = 20 * time.Second, 20 * time.Second
	started := make(chan time.Time, 1)
	regB := tasks.NewRegistry()
	register(t, regB, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		started <- time.Now()
		return nil, nil
	}, tasks.TopicOptions{LockDuration: lock})
	regA := tasks.NewRegistry()
	register(t, regA, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		return nil, errors.New("worker A must not run anything")
	}, tasks.TopicOptions{LockDuration: lock})

	// The old worker A polls first, then the new worker B: both polls wait on the engine,
	// A's first in its queue, as in a rolling restart.
	watchA, watchB := &pollWatch{next: http.DefaultTransport}, &pollWatch{next: http.DefaultTransport}
	cA, err := camunda7.New(camunda7.Config{BaseURL: testenv.EngineURL(), HTTPClient: &http.Client{Transport: watchA}})
	require.NoError(t, err)
	cB, err := camunda7.New(camunda7.Config{BaseURL: testenv.EngineURL(), HTTPClient: &http.Client{Transport: watchB}})
	require.NoError(t, err)
	a, err := tasks.New(cA, regA, tasks.Config{WorkerID: testenv.Unique("old"), AsyncResponseTimeout: poll})
	require.NoError(t, err)
	ctxA, stopA := context.WithCancel(context.Background())
	doneA := make(chan error, 1)
	go func() { doneA <- a.Run(ctxA) }()
	testenv.Eventually(t, 10*time.Second, "worker A's long poll pending", func() (bool, error) { return watchA.pending.Load() == 1, nil })
	time.Sleep(200 * time.Millisecond) // let A's request reach the engine and queue there first
	b, err := tasks.New(cB, regB, tasks.Config{WorkerID: testenv.Unique("new"), AsyncResponseTimeout: poll})
	require.NoError(t, err)
	ctxB, stopB := context.WithCancel(context.Background())
	doneB := make(chan error, 1)
	go func() { doneB <- b.Run(ctxB) }()
	defer func() { stopB(); require.NoError(t, <-doneB) }()
	testenv.Eventually(t, 10*time.Second, "worker B's long poll pending", func() (bool, error) { return watchB.pending.Load() == 1, nil })
	time.Sleep(200 * time.Millisecond)

	stopA()
	ids := f.start(1)
	created := time.Now()
	var pickedUp time.Time
	select {
	case pickedUp = <-started:
	case <-time.After(lock + poll + 10*time.Second):
		t.Fatal("the new worker never got the task")
	}
	delay := pickedUp.Sub(created)
	select {
	case err := <-doneA:
		require.NoError(t, err)
	case <-time.After(poll + 10*time.Second):
		t.Fatal("worker A did not stop")
	}
	f.waitEnded(ids, time.Minute)
	t.Logf("pickup delay of a task created while the old worker stopped: %v (lock %v, long poll %v); old worker fetched %d, unlocked %d",
		delay.Round(time.Millisecond), lock, poll, a.Stats().Fetched.Load(), a.Stats().Unlocked.Load())
	assert.Less(t, delay, 5*time.Second, "not left locked for the worker that stopped")
	assert.EqualValues(t, 0, a.Stats().Completed.Load()+a.Stats().Failures.Load())
}

// A deferred attempt (another live attempt owns the work) used to show as a retryable
// failure "attempt 1 of 4" in the engine, the logs and tasks_failed_total. It is its own
// outcome now, with the retries unchanged.
func TestDeferredAttemptIsNotAFailure(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(1)
	var runs atomic.Int64
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		if runs.Add(1) == 1 {
			return nil, failure.Deferred(errors.New("charge in progress under another attempt"), 200*time.Millisecond)
		}
		return nil, nil
	}, tasks.TopicOptions{Retry: fastRetry})
	obs := newLossObserver()
	w, stop := f.run(reg, tasks.Config{Observer: obs})
	f.waitEnded(ids, time.Minute)
	stop()
	assert.EqualValues(t, 1, w.Stats().Deferred.Load())
	assert.EqualValues(t, 0, w.Stats().Failures.Load())
	assert.Equal(t, 1, obs.get("handled deferred deferred"))
	assert.Equal(t, 0, obs.get("handled retryable retryable"))
	log, err := f.c.ExternalTaskLog(f.ctx, url.Values{"processInstanceId": {ids[0]}, "failureLog": {"true"}})
	require.NoError(t, err)
	require.Len(t, log, 1)
	assert.True(t, strings.HasPrefix(log[0].ErrorMessage, "deferred: charge in progress under another attempt (not a failure: retries unchanged at 3"), log[0].ErrorMessage)
	assert.NotContains(t, log[0].ErrorMessage, "attempt 1 of")
}
