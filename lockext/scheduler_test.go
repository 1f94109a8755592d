package lockext_test

// The scheduler's tests: many tasks on one scheduler, in a testing/synctest bubble as
// the extender's tests are, so that every instant asserted is exact. The behaviour of a
// single task (cadence, retries, loss, MaxRunTime, Stop) is tested in
// extender_test.go through Start, which runs on a scheduler of its own.

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/lockext"
)

// sent is one ExtendLock call a manyLocker saw, since its t0.
type sent struct {
	at     time.Duration
	taskID string
}

// manyLocker answers ExtendLock for many tasks: each call takes took, and a task in
// gone is answered camunda7.ErrTaskGone. It records every call and the most calls it
// had in flight at once.
type manyLocker struct {
	t0   time.Time
	took time.Duration

	mu          sync.Mutex
	gone        map[string]bool
	calls       []sent
	inFlight    int
	maxInFlight int
}

func newMany(t0 time.Time, took time.Duration) *manyLocker {
	return &manyLocker{t0: t0, took: took, gone: map[string]bool{}}
}

func (m *manyLocker) ExtendLock(ctx context.Context, taskID, _ string, _ time.Duration) error {
	m.mu.Lock()
	m.calls = append(m.calls, sent{at: time.Since(m.t0), taskID: taskID})
	m.inFlight++
	m.maxInFlight = max(m.maxInFlight, m.inFlight)
	gone := m.gone[taskID]
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.inFlight--
		m.mu.Unlock()
	}()
	if m.took > 0 {
		select {
		case <-time.After(m.took):
		case <-ctx.Done():
			return &camunda7.TransportError{Op: "extend lock", Sent: true, Err: ctx.Err()}
		}
	}
	if gone {
		return fmt.Errorf("extend lock of external task %s: %w", taskID, camunda7.ErrTaskGone)
	}
	return nil
}

func (m *manyLocker) Lock(context.Context, string, string, time.Duration) error { return nil }

func (m *manyLocker) setGone(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gone[id] = true
}

// snapshot returns the calls so far by time, and by task id among calls made at the
// same instant (which run concurrently, in no fixed order).
func (m *manyLocker) snapshot() []sent {
	m.mu.Lock()
	calls := slices.Clone(m.calls)
	m.mu.Unlock()
	slices.SortStableFunc(calls, func(a, b sent) int {
		if a.at != b.at {
			return cmp.Compare(a.at, b.at)
		}
		return strings.Compare(a.taskID, b.taskID)
	})
	return calls
}

// ats returns when the calls were made, in order.
func ats(calls []sent) []time.Duration {
	out := make([]time.Duration, len(calls))
	for i, c := range calls {
		out[i] = c.at
	}
	return out
}

// latenesses records what OnSend is told, safely from the scheduler's goroutine.
type latenesses struct {
	mu sync.Mutex
	ds []time.Duration
}

func (l *latenesses) add(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ds = append(l.ds, d)
}

func (l *latenesses) get() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ds)
}

func newScheduler(t *testing.T, l lockext.Locker, cfg lockext.SchedulerConfig) *lockext.Scheduler {
	t.Helper()
	s, err := lockext.NewScheduler(l, cfg)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

func startOn(t *testing.T, s *lockext.Scheduler, id string, grantedAt time.Time, cfg lockext.Config) *lockext.Extender {
	t.Helper()
	e, err := s.Start(t.Context(), lockext.Task{ID: id, WorkerID: "w1", GrantedAt: grantedAt}, cfg)
	require.NoError(t, err)
	t.Cleanup(e.Stop)
	return e
}

// exact is a scheduler that neither spreads nor paces: every extension at its due time.
var exact = lockext.SchedulerConfig{Spread: -1, Burst: -1}

// Tasks with different grants and intervals are extended in the order their extensions
// fall due, each at its own cadence, from the one goroutine.
func TestSchedulerOrdersByDueTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		m := newMany(t0, 0)
		s := newScheduler(t, m, exact)
		startOn(t, s, "a", t0, lockext.Config{LockDuration: 3 * time.Second, Interval: time.Second})
		startOn(t, s, "b", t0.Add(-700*ms), lockext.Config{LockDuration: 3 * time.Second, Interval: time.Second})
		startOn(t, s, "c", t0, lockext.Config{LockDuration: 6 * time.Second, Interval: 1500 * ms})
		assert.Equal(t, 3, s.Tasks())

		sleepTo(t0, 3200*ms)
		assert.Equal(t, []sent{
			{300 * ms, "b"}, {1000 * ms, "a"}, {1300 * ms, "b"}, {1500 * ms, "c"}, {2000 * ms, "a"},
			{2300 * ms, "b"}, {3000 * ms, "a"}, {3000 * ms, "c"},
		}, m.snapshot())
	})
}

// Tasks fetched together are not extended together: each extension goes out at a
// random moment up to Spread × Interval before it is due, and never later than due.
func TestSchedulerSpreadsTasksFetchedTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		m := newMany(t0, 0)
		var lateness latenesses
		s := newScheduler(t, m, lockext.SchedulerConfig{Spread: 0.5, Burst: -1,
			OnSend: lateness.add})
		const n = 200
		for i := range n {
			startOn(t, s, fmt.Sprint(i), t0, lockext.Config{LockDuration: 30 * time.Second, Interval: 10 * time.Second})
		}
		sleepTo(t0, 10*time.Second)

		first := ats(m.snapshot())
		require.Len(t, first, n, "every task extended once by its due time")
		assert.GreaterOrEqual(t, first[0], 5*time.Second, "not earlier than Spread × Interval before due")
		// Spread over 5s, no second holds more than a small share: uniform would put 40
		// in each, a burst all 200 in one.
		perSecond := map[time.Duration]int{}
		for _, at := range first {
			perSecond[at.Truncate(time.Second)]++
		}
		for sec, k := range perSecond {
			assert.Less(t, k, 80, "second %v", sec)
		}
		assert.Len(t, lateness.get(), n)
		for _, d := range lateness.get() {
			assert.LessOrEqual(t, d, time.Duration(0), "sent early or on time, never late")
		}
	})
}

// Extensions due at the same moment, not spread, go out one after another at the pace
// Burst allows: Burst times the rate the tasks need on average.
func TestSchedulerPacesASimultaneousBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		m := newMany(t0, 0)
		var lateness latenesses
		s := newScheduler(t, m, lockext.SchedulerConfig{Spread: -1, Burst: 4,
			OnSend: lateness.add})
		const n = 100 // 100 tasks extended every 10s need 10/s: paced at 40/s, 25ms apart
		for i := range n {
			startOn(t, s, fmt.Sprint(i), t0, lockext.Config{LockDuration: 30 * time.Second, Interval: 10 * time.Second})
		}
		sleepTo(t0, 15*time.Second)

		at := ats(m.snapshot())
		require.Len(t, at, n)
		for i := range at {
			assert.Equal(t, 10*time.Second+time.Duration(i)*25*ms, at[i], "call %d", i)
		}
		assert.Equal(t, 99*25*ms, slices.Max(lateness.get()), "the last of the burst waited its turn")

		sleepTo(t0, 25*time.Second)
		at = ats(m.snapshot())
		require.Len(t, at, 2*n)
		for i := n; i < 2*n; i++ {
			assert.Equal(t, at[i-n]+10*time.Second, at[i], "each task again Interval after its own grant: still paced, not late")
		}
	})
}

// Pacing never leaves more than 50ms between two extensions, however few tasks there
// are.
func TestSchedulerPaceHasAFloor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		m := newMany(t0, 0)
		s := newScheduler(t, m, lockext.SchedulerConfig{Spread: -1, Burst: 1})
		// Two tasks extended every 100s need 0.02/s; at Burst 1 that would be 50s apart.
		startOn(t, s, "a", t0, lockext.Config{LockDuration: 300 * time.Second, Interval: 100 * time.Second})
		startOn(t, s, "b", t0, lockext.Config{LockDuration: 300 * time.Second, Interval: 100 * time.Second})
		sleepTo(t0, 101*time.Second)
		assert.Equal(t, durations(100*time.Second, 100*time.Second+50*ms), ats(m.snapshot()))
	})
}

// No more calls are in flight at once than Concurrency; the others wait their turn.
func TestSchedulerBoundsConcurrentCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		m := newMany(t0, 100*ms)
		s := newScheduler(t, m, lockext.SchedulerConfig{Concurrency: 3, Spread: -1, Burst: -1})
		for i := range 9 {
			startOn(t, s, fmt.Sprint(i), t0, base())
		}
		sleepTo(t0, 1500*ms)
		m.mu.Lock()
		assert.Equal(t, 3, m.maxInFlight)
		m.mu.Unlock()
		assert.Equal(t, durations(1000*ms, 1000*ms, 1000*ms, 1100*ms, 1100*ms, 1100*ms, 1200*ms, 1200*ms, 1200*ms), ats(m.snapshot()))
	})
}

// A lost lock ends that task only: its context is cancelled with the engine's answer,
// and the others are extended as before.
func TestSchedulerLossEndsOnlyThatTask(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		m := newMany(t0, 0)
		s := newScheduler(t, m, exact)
		var ends []error
		cfg := base()
		cfg.OnEnd = func(cause error) { ends = append(ends, cause) }
		a := startOn(t, s, "a", t0, cfg)
		b := startOn(t, s, "b", t0, cfg)
		m.setGone("b")

		assert.Equal(t, time.Second, waitDone(b, t0))
		var lost *lockext.LockLostError
		require.ErrorAs(t, context.Cause(b.Context()), &lost)
		assert.Equal(t, "b", lost.TaskID)
		assert.ErrorIs(t, b.Lost(), camunda7.ErrTaskGone)
		require.Len(t, ends, 1)
		assert.Same(t, b.Lost(), ends[0])

		sleepTo(t0, 3500*ms)
		assert.NoError(t, a.Context().Err())
		assert.Equal(t, 3, a.Extensions())
		assert.Equal(t, 1, s.Tasks(), "b is off the books")
		assert.Equal(t, []sent{{1000 * ms, "a"}, {1000 * ms, "b"}, {2000 * ms, "a"}, {3000 * ms, "a"}}, m.snapshot())
	})
}

// MaxRunTime needs no timer of its own: the scheduler ends the task at the exact
// moment, between its extensions.
func TestSchedulerMaxRunTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		m := newMany(t0, 0)
		s := newScheduler(t, m, exact)
		cfg := base()
		cfg.MaxRunTime = 1700 * ms
		e := startOn(t, s, "a", t0, cfg)
		other := startOn(t, s, "b", t0, base())
		assert.Equal(t, 1700*ms, waitDone(e, t0))
		assert.ErrorIs(t, context.Cause(e.Context()), lockext.ErrMaxRunTime)
		sleepTo(t0, 2500*ms)
		assert.Equal(t, 1, e.Extensions())
		assert.Equal(t, 2, other.Extensions())
		assert.NoError(t, other.Context().Err())
	})
}

// Stop takes one task off the shared scheduler, also with its call in flight; Close
// ends the scheduler, after which nothing is sent and Start fails.
func TestSchedulerStopAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		m := newMany(t0, 300*ms)
		s, err := lockext.NewScheduler(m, exact)
		require.NoError(t, err)
		a := startOn(t, s, "a", t0, base())
		b := startOn(t, s, "b", t0, base())
		c := startOn(t, s, "c", t0, base())

		a.Stop()
		assert.ErrorIs(t, context.Cause(a.Context()), lockext.ErrStopped)
		sleepTo(t0, 1100*ms) // b's and c's calls in flight
		b.Stop()
		assert.Equal(t, 1100*ms, time.Since(t0), "the call in flight was cancelled, not waited out")
		assert.ErrorIs(t, context.Cause(b.Context()), lockext.ErrStopped)
		assert.NoError(t, b.Lost())
		assert.Equal(t, 1, s.Tasks())

		s.Close()
		assert.Equal(t, 1300*ms, time.Since(t0), "Close waits for the call in flight")
		s.Close()
		sleepTo(t0, 10*time.Second)
		assert.Len(t, m.snapshot(), 2, "nothing sent after Close")
		assert.Equal(t, 1, c.Extensions())
		assert.NoError(t, c.Context().Err(), "an extender left running keeps its context; its lock runs out")
		c.Stop()
		assert.ErrorIs(t, context.Cause(c.Context()), lockext.ErrStopped)

		_, err = s.Start(t.Context(), lockext.Task{ID: "d", WorkerID: "w1", GrantedAt: time.Now()}, base())
		assert.ErrorIs(t, err, lockext.ErrClosed)
	})
}

// A task handed over late waits on a shared scheduler too: its Start returns after the
// first answer, while other tasks' extensions go on.
func TestSchedulerLateTask(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		m := newMany(t0, 50*ms)
		s := newScheduler(t, m, lockext.SchedulerConfig{})
		e := startOn(t, s, "late", t0.Add(-5*time.Second), base())
		assert.Equal(t, 50*ms, time.Since(t0))
		assert.Equal(t, 1, e.Extensions())

		m.setGone("refused")
		r := startOn(t, s, "refused", t0.Add(-5*time.Second), base())
		assert.ErrorIs(t, r.Lost(), camunda7.ErrLockLost, "lost before Start returned")
		assert.Error(t, r.Context().Err())
	})
}

// Ten thousand tasks on one scheduler, fetched in batches of a hundred, kept for three
// lock periods: every lock held, every task extended on time, the calls spread out, and
// the tasks whose engine answer says gone lost and only those.
func TestSchedulerManyTasks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		m := newMany(t0, 5*ms)
		var lateness latenesses
		s := newScheduler(t, m, lockext.SchedulerConfig{OnSend: lateness.add})
		cfg := lockext.Config{LockDuration: 30 * time.Second}
		const n, batch = 10_000, 100
		exts := make([]*lockext.Extender, 0, n)
		for i := range n / batch {
			sleepTo(t0, time.Duration(i)*100*ms) // a fetch every 100ms
			grant := time.Now()
			for j := range batch {
				exts = append(exts, startOn(t, s, fmt.Sprint(i*batch+j), grant, cfg))
			}
		}
		for i := 0; i < n; i += 1000 {
			m.setGone(fmt.Sprint(i))
		}
		sleepTo(t0, 100*time.Second)

		for i, e := range exts {
			if i%1000 == 0 {
				assert.ErrorIs(t, e.Lost(), camunda7.ErrTaskGone, "task %d", i)
				continue
			}
			require.NoError(t, e.Context().Err(), "task %d", i)
			require.GreaterOrEqual(t, e.Extensions(), 9, "task %d: about one extension per 10s", i)
			require.True(t, e.Deadline().After(time.Now()), "task %d: local deadline ahead", i)
		}
		assert.Equal(t, n-n/1000, s.Tasks())
		assert.LessOrEqual(t, slices.Max(lateness.get()), 100*ms, "never more than pacing's delay late")
		perSecond := map[time.Duration]int{}
		for _, c := range m.snapshot() {
			perSecond[c.at.Truncate(time.Second)]++
		}
		// 10,000 tasks every 10s (a little less, spread early) need about 1,100 a second.
		for sec, k := range perSecond {
			assert.Less(t, k, 2000, "second %v", sec)
		}
		for _, e := range exts {
			e.Stop()
		}
		assert.Equal(t, 0, s.Tasks())
	})
}

func TestSchedulerConfigValidate(t *testing.T) {
	t.Parallel()
	d := lockext.SchedulerConfig{}.WithDefaults()
	assert.Equal(t, 16, d.Concurrency)
	assert.InDelta(t, 0.25, d.Spread, 1e-9)
	assert.InDelta(t, 5, d.Burst, 1e-9)
	err := lockext.SchedulerConfig{Concurrency: -1, Spread: 1}.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Concurrency")
	assert.Contains(t, err.Error(), "Spread")
	_, err = lockext.NewScheduler(newMany(time.Now(), 0), lockext.SchedulerConfig{Spread: 2})
	assert.Error(t, err)
}
