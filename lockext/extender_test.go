package lockext_test

// Timing tests run in a testing/synctest bubble: time is fake and advances only when
// every goroutine in the bubble is blocked, so every instant asserted here is exact.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/lockext"

	"github.com/extworker/extworker/internal/testenv"
)

const ms = time.Millisecond

// step scripts one ExtendLock answer.
type step struct {
	err error
	// took is how long the call takes. The call's context ending cuts it short
	// (returning an unknown-outcome error) unless ignoreCtx is set.
	took      time.Duration
	ignoreCtx bool
}

// fakeCall is what the fake saw of one ExtendLock call, in durations since t0.
type fakeCall struct {
	at, deadline, returned time.Duration
	ctxErr                 error // the call's context error when it returned
	taskID, workerID       string
	newDuration            time.Duration
}

// fakeLocker answers ExtendLock from a script; past its end, every call gets rest. Lock
// answers lockErr and is counted in locks.
type fakeLocker struct {
	t0      time.Time
	rest    step
	mu      sync.Mutex
	script  []step
	calls   []fakeCall
	lockErr error
	locks   []time.Duration // when Lock was called, since t0
}

func (f *fakeLocker) Lock(_ context.Context, _, _ string, _ time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.locks = append(f.locks, time.Since(f.t0))
	return f.lockErr
}

// setRest changes the answer to every call past the script.
func (f *fakeLocker) setRest(s step) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rest = s
}

func newFake(t0 time.Time, rest step, script ...step) *fakeLocker {
	return &fakeLocker{t0: t0, rest: rest, script: script}
}

func (f *fakeLocker) ExtendLock(ctx context.Context, taskID, workerID string, d time.Duration) error {
	c := fakeCall{at: time.Since(f.t0), taskID: taskID, workerID: workerID, newDuration: d}
	if dl, ok := ctx.Deadline(); ok {
		c.deadline = dl.Sub(f.t0)
	}
	f.mu.Lock()
	s := f.rest
	if len(f.script) > 0 {
		s, f.script = f.script[0], f.script[1:]
	}
	f.mu.Unlock()

	err := s.err
	if s.took > 0 {
		timer := time.NewTimer(s.took)
		defer timer.Stop()
		done := ctx.Done()
		if s.ignoreCtx {
			done = nil
		}
		select {
		case <-timer.C:
		case <-done:
			err = &camunda7.TransportError{Op: "extend lock of external task " + taskID, Sent: true, Err: ctx.Err()}
		}
	}
	c.returned, c.ctxErr = time.Since(f.t0), ctx.Err()
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
	return err
}

// snapshot returns the calls that have returned so far.
func (f *fakeLocker) snapshot() []fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeCall(nil), f.calls...)
}

// times returns when each returned call was made, since t0.
func (f *fakeLocker) times() []time.Duration {
	var out []time.Duration
	for _, c := range f.snapshot() {
		out = append(out, c.at)
	}
	return out
}

// Errors as the camunda7 client returns them, by kind.
var (
	errNotSent   = &camunda7.TransportError{Op: "extend lock of external task t1", Err: errors.New("connection refused")}
	errUnknown   = &camunda7.TransportError{Op: "extend lock of external task t1", Sent: true, Err: errors.New("connection reset by peer")}
	err500       = &camunda7.Error{Op: "extend lock of external task t1", StatusCode: 500, Type: "ProcessEngineException", Message: "database down"}
	errProxy     = &camunda7.ResponseError{Op: "extend lock of external task t1", StatusCode: 502, ContentType: "text/html", Err: errors.New("not JSON")}
	errSuspended = fmt.Errorf("extend lock of external task t1: engine answered 400 RestException: ENGINE-03043 ExternalTask with id 't1' is suspended.: %w", camunda7.ErrSuspended)
	errUnauth    = fmt.Errorf("extend lock of external task t1: engine answered 401: %w", camunda7.ErrUnauthorized)
	errGone      = fmt.Errorf("extend lock of external task t1: engine answered 404 RestException: External task with id t1 does not exist: %w", camunda7.ErrTaskGone)
	errOther     = fmt.Errorf("extend lock of external task t1: engine answered 400 RestException: ... It is locked by worker 'other'.: %w", camunda7.ErrLockLost)
	errExpired   = fmt.Errorf("extend lock of external task t1: engine answered 400 RestException: Cannot extend a lock that expired: ...: %w %w", camunda7.ErrLockExpired, camunda7.ErrLockLost)
)

// base is the configuration most timing tests use: lock 3s, extend every 1s.
func base() lockext.Config {
	return lockext.Config{LockDuration: 3 * time.Second, Interval: time.Second}
}

func task(grantedAt time.Time) lockext.Task {
	return lockext.Task{ID: "t1", WorkerID: "w1", GrantedAt: grantedAt}
}

// startExt starts an extender for task t1, granted at t0, and stops it at cleanup.
func startExt(t *testing.T, parent context.Context, l lockext.Locker, t0 time.Time, cfg lockext.Config) *lockext.Extender {
	t.Helper()
	ext, err := lockext.Start(parent, l, task(t0), cfg)
	require.NoError(t, err)
	t.Cleanup(ext.Stop)
	return ext
}

// waitDone waits for the extender's context to end and returns when, since t0.
func waitDone(ext *lockext.Extender, t0 time.Time) time.Duration {
	<-ext.Context().Done()
	return time.Since(t0)
}

// sleepTo sleeps until t0+d and lets the bubble settle.
func sleepTo(t0 time.Time, d time.Duration) {
	time.Sleep(time.Until(t0.Add(d)))
	synctest.Wait()
}

func durations(ds ...time.Duration) []time.Duration { return ds }

func TestCadenceAndDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		f := newFake(t0, step{})
		ext := startExt(t, t.Context(), f, t0, base())
		assert.Equal(t, t0.Add(3*time.Second), ext.Deadline(), "before any extension: GrantedAt+LockDuration")

		for i := 1; i <= 4; i++ {
			sleepTo(t0, time.Duration(i)*time.Second+500*ms)
			assert.Equal(t, i, ext.Extensions())
			assert.Equal(t, t0.Add(time.Duration(i)*time.Second+3*time.Second), ext.Deadline(), "deadline after extension %d", i)
		}
		assert.Equal(t, durations(1*time.Second, 2*time.Second, 3*time.Second, 4*time.Second), f.times())
		for _, c := range f.snapshot() {
			assert.Equal(t, "t1", c.taskID)
			assert.Equal(t, "w1", c.workerID)
			assert.Equal(t, 3*time.Second, c.newDuration, "each extension asks for LockDuration again")
			assert.Equal(t, c.at+time.Second, c.deadline, "RequestTimeout defaults to min(Interval, 10s)")
		}
		require.NoError(t, ext.Context().Err())
		assert.NoError(t, ext.Lost())

		ext.Stop()
		assert.ErrorIs(t, context.Cause(ext.Context()), lockext.ErrStopped)
		assert.NoError(t, ext.Lost())
		sleepTo(t0, 10*time.Second)
		assert.Len(t, f.snapshot(), 4, "no extension after Stop")
	})
}

// The next extension is due Interval after the previous one was SENT (its grant), not
// after it returned; a fetch sent before Start moves the first one earlier.
func TestCadenceMeasuredFromGrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		f := newFake(t0, step{took: 300 * ms})
		granted := t0.Add(-400 * ms) // the fetch went out 400ms before Start
		ext, err := lockext.Start(t.Context(), f, task(granted), base())
		require.NoError(t, err)
		defer ext.Stop()

		sleepTo(t0, 3*time.Second)
		assert.Equal(t, durations(600*ms, 1600*ms, 2600*ms), f.times())
		assert.Equal(t, t0.Add(2600*ms+3*time.Second), ext.Deadline(), "deadline counts from when the extension was sent")
	})
}

func TestDefaultIntervalIsAThirdOfTheLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		f := newFake(t0, step{})
		ext := startExt(t, t.Context(), f, t0, lockext.Config{LockDuration: 90 * time.Second})
		sleepTo(t0, 100*time.Second)
		assert.Equal(t, durations(30*time.Second, 60*time.Second, 90*time.Second), f.times())
		for _, c := range f.snapshot() {
			assert.Equal(t, c.at+10*time.Second, c.deadline, "RequestTimeout capped at 10s")
		}
		assert.Equal(t, 3, ext.Extensions())
	})
}

func TestTransientErrorsRetriedWithBackoff(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"not sent", errNotSent},
		{"outcome unknown", errUnknown},
		{"engine 500", err500},
		{"proxy 502 page", errProxy},
		{"suspended", errSuspended},
		{"unauthorized", errUnauth},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				t0 := time.Now()
				f := newFake(t0, step{}, step{err: tc.err}, step{err: tc.err}, step{err: tc.err})
				ext := startExt(t, t.Context(), f, t0, base())

				sleepTo(t0, 2*time.Second)
				// 1s fails, +100ms fails, +200ms fails, +400ms succeeds; then Interval after that grant.
				assert.Equal(t, durations(1000*ms, 1100*ms, 1300*ms, 1700*ms), f.times())
				assert.Equal(t, 1, ext.Extensions())
				assert.Equal(t, t0.Add(1700*ms+3*time.Second), ext.Deadline())
				sleepTo(t0, 2800*ms)
				assert.Equal(t, durations(1000*ms, 1100*ms, 1300*ms, 1700*ms, 2700*ms), f.times(), "backoff resets after a success")
				assert.NoError(t, ext.Context().Err())
				assert.NoError(t, ext.Lost())
			})
		})
	}
}

// Transient errors never end the lock, however long they last past the local deadline:
// only the engine can say it is lost. Once the engine answers again, extending goes on.
func TestTransientErrorsNeverEndTheLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		f := newFake(t0, step{err: errUnknown})
		ext := startExt(t, t.Context(), f, t0, base())

		sleepTo(t0, 10*time.Second)
		assert.NoError(t, ext.Context().Err(), "still running at 10s, long past the local deadline of 3s")
		assert.NoError(t, ext.Lost())
		// Backoff 100, 200, 400, 800ms, then capped at Interval (1s), past the deadline too.
		assert.Equal(t, durations(1000*ms, 1100*ms, 1300*ms, 1700*ms, 2500*ms, 3500*ms, 4500*ms, 5500*ms, 6500*ms,
			7500*ms, 8500*ms, 9500*ms), f.times())
		assert.Equal(t, 0, ext.Extensions())
		assert.Equal(t, t0.Add(3*time.Second), ext.Deadline(), "the local deadline stays where the last grant put it")

		f.setRest(step{})
		sleepTo(t0, 10500*ms)
		assert.Equal(t, 1, ext.Extensions(), "extended as soon as the engine answers")
		assert.Equal(t, t0.Add(13500*ms), ext.Deadline())
		assert.NoError(t, ext.Context().Err())
	})
}

// An engine that accepts connections but never answers: each call is cut at
// RequestTimeout and retried; the lock is not declared lost.
func TestHangingEngineCutAtRequestTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		f := newFake(t0, step{took: time.Hour})
		ext := startExt(t, t.Context(), f, t0, base())

		sleepTo(t0, 6*time.Second)
		calls := f.snapshot()
		require.GreaterOrEqual(t, len(calls), 3)
		assert.Equal(t, fakeCall{at: 1000 * ms, deadline: 2000 * ms, returned: 2000 * ms, ctxErr: context.DeadlineExceeded,
			taskID: "t1", workerID: "w1", newDuration: 3 * time.Second}, calls[0])
		assert.Equal(t, 2100*ms, calls[1].at)
		assert.Equal(t, 3100*ms, calls[1].deadline, "cut at RequestTimeout, also past the local deadline")
		assert.NoError(t, ext.Context().Err())
		assert.NoError(t, ext.Lost())
	})
}

// The engine answers "Cannot extend a lock that expired": the lock ran out (the engine
// was unreachable for longer than it) but nobody took the task, so the extender locks it
// again and the handler never notices.
func TestExpiredLockLockedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		var logs testenv.Buffer
		cfg := base()
		cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		f := newFake(t0, step{}, step{err: errExpired})
		ext := startExt(t, t.Context(), f, t0, cfg)

		sleepTo(t0, 1500*ms)
		assert.Equal(t, durations(1000*ms), f.locks, "locked again right after the refusal")
		assert.NoError(t, ext.Context().Err())
		assert.NoError(t, ext.Lost())
		assert.Equal(t, 1, ext.Extensions())
		assert.Equal(t, 1, ext.Relocks())
		assert.Equal(t, t0.Add(4*time.Second), ext.Deadline())
		assert.Contains(t, logs.String(), "locked it again")

		sleepTo(t0, 2500*ms)
		assert.Equal(t, 2, ext.Extensions(), "extending goes on as before")
		assert.Len(t, f.locks, 1)
	})
}

// The lock expired and another worker took the task before the extender could lock it
// again: that is a loss, with the engine's answer to the lock.
func TestExpiredLockTakenMeanwhile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		f := newFake(t0, step{err: errExpired})
		f.lockErr = errOther
		ext := startExt(t, t.Context(), f, t0, base())

		assert.Equal(t, time.Second, waitDone(ext, t0))
		var lost *lockext.LockLostError
		require.ErrorAs(t, context.Cause(ext.Context()), &lost)
		assert.Same(t, errOther, lost.Err)
		assert.ErrorIs(t, ext.Lost(), camunda7.ErrLockLost)
		assert.NotErrorIs(t, ext.Lost(), camunda7.ErrLockExpired)
		assert.Equal(t, 0, ext.Relocks())
	})
}

func TestLostAnswerEndsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		is   error
	}{
		{"task gone", errGone, camunda7.ErrTaskGone},
		{"locked by another worker", errOther, camunda7.ErrLockLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				t0 := time.Now()
				var logs testenv.Buffer
				cfg := base()
				cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
				f := newFake(t0, step{err: tc.err}, step{}) // one success, then the answer
				ext := startExt(t, t.Context(), f, t0, cfg)

				assert.Equal(t, 2*time.Second, waitDone(ext, t0), "lost on the first such answer, without retrying")
				cause := context.Cause(ext.Context())
				assert.ErrorIs(t, cause, camunda7.ErrLockLost)
				assert.ErrorIs(t, cause, tc.is)
				var lost *lockext.LockLostError
				require.ErrorAs(t, cause, &lost)
				assert.Same(t, tc.err, lost.Err)
				assert.Equal(t, cause, ext.Lost())
				assert.Equal(t, 1, ext.Extensions())
				assert.Equal(t, t0.Add(4*time.Second), ext.Deadline(), "deadline of the last successful extension")

				sleepTo(t0, 10*time.Second)
				assert.Len(t, f.snapshot(), 2, "no extension after the lock is lost")

				var rec map[string]any
				require.NoError(t, json.Unmarshal(logs.Bytes(), &rec), "exactly one log record: %s", logs.Bytes())
				assert.Equal(t, "WARN", rec["level"])
				assert.Equal(t, "t1", rec["task_id"])
				assert.Equal(t, "w1", rec["worker_id"])
				assert.Equal(t, cause.Error(), rec["reason"])
			})
		})
	}
}

func TestMaxRunTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		f := newFake(t0, step{})
		cfg := base()
		cfg.MaxRunTime = 2500 * ms
		ext := startExt(t, t.Context(), f, t0, cfg)

		assert.Equal(t, 2500*ms, waitDone(ext, t0))
		assert.ErrorIs(t, context.Cause(ext.Context()), lockext.ErrMaxRunTime)
		assert.NotErrorIs(t, context.Cause(ext.Context()), camunda7.ErrLockLost)
		assert.Equal(t, lockext.ErrMaxRunTime, ext.Lost())
		sleepTo(t0, 10*time.Second)
		assert.Equal(t, durations(1*time.Second, 2*time.Second), f.times(), "no extension past MaxRunTime: the lock runs out")
		assert.Equal(t, t0.Add(5*time.Second), ext.Deadline())
	})
}

// MaxRunTime counts from Start, and cuts an extension in flight.
func TestMaxRunTimeDuringCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		f := newFake(t0, step{}, step{}, step{took: time.Hour}) // 0.5s ok, 1.5s hangs
		cfg := base()
		cfg.MaxRunTime = 2200 * ms
		ext, err := lockext.Start(t.Context(), f, task(t0.Add(-500*ms)), cfg)
		require.NoError(t, err)
		defer ext.Stop()

		assert.Equal(t, 2200*ms, waitDone(ext, t0))
		assert.ErrorIs(t, context.Cause(ext.Context()), lockext.ErrMaxRunTime)
		calls := f.snapshot()
		require.Len(t, calls, 2)
		assert.Equal(t, 500*ms, calls[0].at)
		assert.Equal(t, fakeCall{at: 1500 * ms, deadline: 2200 * ms, returned: 2200 * ms, ctxErr: context.DeadlineExceeded,
			taskID: "t1", workerID: "w1", newDuration: 3 * time.Second}, calls[1])
		assert.Equal(t, 1, ext.Extensions())
	})
}

// Worker shutdown cancels the handler's context with its cause, but the lock is still
// needed to report the result: extending goes on, with calls that are not cancelled.
func TestParentCancelDoesNotStopExtending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		errShutdown := errors.New("worker shutting down")
		parent, cancel := context.WithCancelCause(context.WithValue(t.Context(), ctxKey{}, "v"))
		defer cancel(nil)
		f := newFake(t0, step{})
		ext := startExt(t, parent, f, t0, base())

		sleepTo(t0, 1500*ms)
		cancel(errShutdown)
		assert.Equal(t, 1500*ms, waitDone(ext, t0))
		assert.ErrorIs(t, context.Cause(ext.Context()), errShutdown)
		assert.NoError(t, ext.Lost())

		sleepTo(t0, 4500*ms)
		assert.Equal(t, durations(1*time.Second, 2*time.Second, 3*time.Second, 4*time.Second), f.times())
		for _, c := range f.snapshot() {
			assert.NoError(t, c.ctxErr, "extendLock calls do not inherit the parent's cancellation")
		}
		assert.Equal(t, 4, ext.Extensions())
		assert.Equal(t, t0.Add(7*time.Second), ext.Deadline())

		ext.Stop()
		assert.ErrorIs(t, context.Cause(ext.Context()), errShutdown, "the first cause stays")
		sleepTo(t0, 10*time.Second)
		assert.Len(t, f.snapshot(), 4)
	})
}

type ctxKey struct{}

// valueLocker checks that the parent's values reach ExtendLock (trace ids, loggers).
type valueLocker struct{ got chan any }

func (v valueLocker) ExtendLock(ctx context.Context, _, _ string, _ time.Duration) error {
	select {
	case v.got <- ctx.Value(ctxKey{}):
	default:
	}
	return nil
}

func (valueLocker) Lock(context.Context, string, string, time.Duration) error { return nil }

func TestCallsKeepParentValues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		l := valueLocker{got: make(chan any, 1)}
		startExt(t, context.WithValue(t.Context(), ctxKey{}, "trace-1"), l, t0, base())
		assert.Equal(t, "trace-1", <-l.got)
	})
}

func TestStopBeforeAnyExtension(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		f := newFake(t0, step{})
		ext, err := lockext.Start(t.Context(), f, task(t0), base())
		require.NoError(t, err)
		ext.Stop()
		assert.Equal(t, time.Duration(0), time.Since(t0), "Stop returns at once")
		assert.ErrorIs(t, context.Cause(ext.Context()), lockext.ErrStopped)
		assert.NoError(t, ext.Lost())
		sleepTo(t0, 10*time.Second)
		assert.Empty(t, f.snapshot())
		assert.Equal(t, 0, ext.Extensions())
	})
}

func TestStopTwiceAndConcurrently(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		f := newFake(t0, step{})
		ext := startExt(t, t.Context(), f, t0, base())
		sleepTo(t0, 1500*ms)

		var wg sync.WaitGroup
		for range 4 {
			wg.Go(ext.Stop)
		}
		wg.Wait()
		ext.Stop()
		assert.ErrorIs(t, context.Cause(ext.Context()), lockext.ErrStopped)
		assert.Equal(t, 1, ext.Extensions())
		sleepTo(t0, 10*time.Second)
		assert.Len(t, f.snapshot(), 1)

		var nilExt *lockext.Extender
		nilExt.Stop() // a runtime's deferred Stop on an extender that never started
	})
}

// Stop returns only once the goroutine has exited: an extendLock call in flight is
// cancelled and waited for, so no call outlives Stop.
func TestStopWaitsForInFlightCall(t *testing.T) {
	t.Run("call honours its context", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			t0 := time.Now()
			f := newFake(t0, step{took: time.Hour})
			ext := startExt(t, t.Context(), f, t0, base())
			sleepTo(t0, 1200*ms)
			require.Empty(t, f.snapshot(), "call in flight")

			ext.Stop()
			assert.Equal(t, 1200*ms, time.Since(t0))
			calls := f.snapshot()
			require.Len(t, calls, 1, "the call returned before Stop did")
			assert.ErrorIs(t, calls[0].ctxErr, context.Canceled)
			assert.ErrorIs(t, context.Cause(ext.Context()), lockext.ErrStopped)
			assert.NoError(t, ext.Lost(), "an error caused by Stop is not a lost lock")
		})
	})
	t.Run("call ignores its context", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			t0 := time.Now()
			f := newFake(t0, step{}, step{took: 500 * ms, ignoreCtx: true, err: errGone})
			ext := startExt(t, t.Context(), f, t0, base())
			sleepTo(t0, 1200*ms)

			ext.Stop()
			assert.Equal(t, 1500*ms, time.Since(t0), "Stop waited for the call")
			require.Len(t, f.snapshot(), 1)
			assert.ErrorIs(t, context.Cause(ext.Context()), lockext.ErrStopped)
			assert.NoError(t, ext.Lost(), "an answer after Stop is ignored")
		})
	})
}

// A task handed over late in a long poll (its local deadline already passed, though the
// engine's lock is fresh) is extended at once, and Start returns only after the answer:
// the handler starts on a confirmed lock.
func TestLateTaskExtendedBeforeStartReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		f := newFake(t0, step{took: 50 * ms})
		ext, err := lockext.Start(t.Context(), f, task(t0.Add(-4*time.Second)), base())
		require.NoError(t, err)
		defer ext.Stop()

		assert.Equal(t, 50*ms, time.Since(t0), "Start waited for the first extension's answer")
		assert.Equal(t, durations(0), f.times())
		assert.Equal(t, 1, ext.Extensions())
		assert.NoError(t, ext.Context().Err())
		assert.Equal(t, t0.Add(3*time.Second), ext.Deadline(), "counted from the extension, not the fetch")

		sleepTo(t0, 1500*ms)
		assert.Equal(t, durations(0, 1000*ms), f.times(), "then the usual cadence from the extension")
	})
}

// A late task whose first extension the engine refuses: Start returns with the context
// already cancelled, so the handler never runs.
func TestLateTaskRefusedOnArrival(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		f := newFake(t0, step{err: errOther})
		ext, err := lockext.Start(t.Context(), f, task(t0.Add(-2*time.Second)), base())
		require.NoError(t, err)
		defer ext.Stop()

		require.Error(t, ext.Context().Err(), "cancelled before Start returned")
		assert.ErrorIs(t, ext.Lost(), camunda7.ErrLockLost)
	})
}

// A late task while the engine is unreachable: Start returns after the first attempt's
// timeout, the handler may run (the engine's lock is likely fresh), and extending goes on.
func TestLateTaskEngineUnreachable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		f := newFake(t0, step{took: time.Hour})
		ext, err := lockext.Start(t.Context(), f, task(t0.Add(-4*time.Second)), base())
		require.NoError(t, err)
		defer ext.Stop()

		assert.Equal(t, time.Second, time.Since(t0), "one RequestTimeout")
		assert.NoError(t, ext.Context().Err())
		f.setRest(step{})
		sleepTo(t0, 1500*ms)
		assert.Equal(t, 1, ext.Extensions())
	})
}

func TestConfigDefaultsAndValidate(t *testing.T) {
	t.Parallel()
	d := lockext.Config{LockDuration: 60 * time.Second}.WithDefaults()
	assert.Equal(t, 20*time.Second, d.Interval)
	assert.Equal(t, 10*time.Second, d.RequestTimeout)
	assert.Equal(t, 100*ms, d.RetryInitial)
	assert.Equal(t, time.Duration(0), d.MaxRunTime)
	require.NotNil(t, d.Logger)
	assert.Equal(t, 2*time.Second, lockext.Config{LockDuration: 6 * time.Second}.WithDefaults().RequestTimeout, "min(Interval, 10s)")

	for _, tc := range []struct {
		name string
		cfg  lockext.Config
		want []string // each bad field named
	}{
		{"zero", lockext.Config{}, []string{"LockDuration"}},
		{"sub-millisecond lock", lockext.Config{LockDuration: 999 * time.Microsecond}, []string{"LockDuration"}},
		{"interval not shorter than lock", lockext.Config{LockDuration: time.Second, Interval: time.Second}, []string{"Interval"}},
		{"negatives", lockext.Config{LockDuration: time.Second, Interval: -1, MaxRunTime: -1, RequestTimeout: -1, RetryInitial: -1},
			[]string{"Interval", "MaxRunTime", "RequestTimeout", "RetryInitial"}},
	} {
		err := tc.cfg.Validate()
		require.Error(t, err, tc.name)
		for _, field := range tc.want {
			assert.Contains(t, err.Error(), field, tc.name)
		}
		_, err = lockext.Start(context.Background(), newFake(time.Now(), step{}), task(time.Now()), tc.cfg)
		assert.Error(t, err, tc.name)
	}
	assert.NoError(t, lockext.Config{LockDuration: time.Second}.Validate(), "zero fields with defaults are fine before WithDefaults")
	assert.NoError(t, base().WithDefaults().Validate())
}

func TestStartRejectsIncompleteTask(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		task  lockext.Task
		field string
	}{
		{lockext.Task{WorkerID: "w", GrantedAt: time.Now()}, "ID"},
		{lockext.Task{ID: "t", GrantedAt: time.Now()}, "WorkerID"},
		{lockext.Task{ID: "t", WorkerID: "w"}, "GrantedAt"},
	} {
		ext, err := lockext.Start(context.Background(), newFake(time.Now(), step{}), tc.task, base())
		require.Error(t, err, tc.field)
		assert.Nil(t, ext)
		assert.Contains(t, err.Error(), tc.field+" is")
	}
}

func TestLockLostErrorMatching(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("handle task t1: %w", &lockext.LockLostError{TaskID: "t1", Err: errGone})
	assert.ErrorIs(t, err, camunda7.ErrLockLost)
	assert.ErrorIs(t, err, camunda7.ErrTaskGone)
	assert.NotErrorIs(t, err, lockext.ErrMaxRunTime)
	assert.Equal(t, "handle task t1: lockext: lock of task t1 lost: "+errGone.Error(), err.Error())
	assert.False(t, lockext.LostAnswer(errExpired), "one's own expired lock is not lost: nobody took the task")
	assert.True(t, lockext.LostAnswer(errOther))
	assert.True(t, lockext.LostAnswer(errGone))
	assert.False(t, lockext.LostAnswer(errUnknown))
}
