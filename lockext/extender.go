package lockext

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/extworker/extworker/camunda7"
)

// Extender keeps one task's lock alive while its handler runs, and cancels the
// handler's context with a cause when it cannot. Create it with Start, or with
// Scheduler.Start to share one scheduler among many tasks; end it with Stop. Its
// methods are safe for concurrent use.
//
// An extender has no goroutine or timer of its own: it is an entry in its scheduler's
// queue, and only what a task needs (its ids, its configuration, its context and its
// counters) is kept per task.
type Extender struct {
	s      *Scheduler
	task   Task
	cfg    Config
	parent context.Context // the base of every extendLock call: its values, not its cancellation

	ctx    context.Context // the handler's context: parent + our causes
	cancel context.CancelCauseFunc

	startedAt time.Time
	maxAt     time.Time     // zero: no MaxRunTime
	ready     chan struct{} // a late task only: closed once Start may return, after its first answer
	readyOnce sync.Once

	// Guarded by s.mu: the extender's place in the scheduler.
	nominal    time.Time          // when the next extension is due
	at         time.Time          // when it goes out: nominal, spread earlier, or maxAt
	index      int                // in s.queue; -1 when not queued
	counted    bool               // counted in s.live and s.need
	stopped    bool               // Stop was called
	ended      bool               // lost, or MaxRunTime passed
	callCancel context.CancelFunc // the call in flight, if any
	callDone   chan struct{}      // closed when the call in flight has been dealt with
	anyAnswer  bool               // an extension's answer has been dealt with (s.mu)

	// Only the call in flight touches these, and calls of one extender never overlap.
	backoff  time.Duration // 0: the last attempt succeeded (or none was made)
	failures int

	mu         sync.Mutex
	deadline   time.Time
	extensions int
	relocks    int
	lost       error
}

// Start begins extending t's lock, through l, on a scheduler of its own (one goroutine
// for this task); Scheduler.Start does the same on a scheduler shared by many tasks.
// The first extension goes out at t.GrantedAt+Interval. When that moment has already
// passed (the engine handed the task over late in a long poll, so little or none of the
// local lock is left), Start sends it at once and returns only after its answer, so the
// handler never starts on a lock nobody has confirmed: if the engine answers that the
// lock is lost, Context is already cancelled (check Lost) when Start returns; if the
// engine cannot be reached, the extending goes on in the background and Start returns
// after one RequestTimeout at most. The returned extender's Context, derived from
// parent, is the one to run the handler with.
//
// parent ending (worker shutdown) cancels Context with parent's cause but does not stop
// the extending: the runtime still needs the lock to report the result. Only Stop, a
// lost lock and MaxRunTime stop it.
//
// The error is only for an invalid cfg (after WithDefaults) or t; then nothing was
// started.
func Start(parent context.Context, l Locker, t Task, cfg Config) (*Extender, error) {
	// Validated here, so that an invalid cfg or t starts no goroutine.
	if err := cfg.WithDefaults().Validate(); err != nil {
		return nil, err
	}
	if err := t.validate(); err != nil {
		return nil, err
	}
	// One task: nothing to spread or pace, every extension at its due time.
	s, err := NewScheduler(l, SchedulerConfig{Concurrency: 1, Spread: -1, Burst: -1})
	if err != nil {
		return nil, err
	}
	s.own = true
	e, err := s.Start(parent, t, cfg)
	if err != nil {
		s.Close()
		return nil, err
	}
	e.mu.Lock()
	ended := e.lost != nil
	e.mu.Unlock()
	if ended {
		s.Close() // refused on arrival: nothing more to extend
	}
	return e, nil
}

// Context returns the handler's context. It is cancelled, with context.Cause telling
// why, by the first of: a lost lock (*LockLostError, errors.Is camunda7.ErrLockLost), MaxRunTime
// (ErrMaxRunTime), parent ending (parent's cause), or Stop (ErrStopped).
func (e *Extender) Context() context.Context { return e.ctx }

// Deadline returns the current local lock deadline: when the latest successful
// extension (or the fetch) was sent, plus LockDuration. The engine's lock lasts at
// least until then. A deadline in the past does not mean the lock is lost: only the
// engine says that (Lost).
func (e *Extender) Deadline() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.deadline
}

// Extensions returns the number of successful extensions so far.
func (e *Extender) Extensions() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.extensions
}

// Relocks returns how often the lock had expired (the engine was unreachable for longer
// than the lock, or the task arrived late) and was locked again with Lock, nobody else
// having taken the task meanwhile. Relocks are also counted in Extensions.
func (e *Extender) Relocks() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.relocks
}

// Lost returns nil while the lock is held (and after a normal Stop), or the
// *LockLostError or ErrMaxRunTime that ended the extending.
func (e *Extender) Lost() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lost
}

// Stop stops extending: it takes the task out of its scheduler's queue, or cancels the
// extendLock call in flight and waits for it, so that no call outlives Stop; then it
// cancels Context with ErrStopped (unless it already ended with another cause). The
// runtime calls it once the result is reported (or abandoned). It is safe to call
// twice, concurrently, after the lock was lost, after the scheduler was closed, and on
// nil.
func (e *Extender) Stop() {
	if e == nil {
		return
	}
	s := e.s
	s.mu.Lock()
	e.stopped = true
	s.forget(e)
	if e.callCancel != nil {
		e.callCancel()
	}
	done := e.callDone
	s.mu.Unlock()
	if done != nil {
		<-done
	}
	if s.own {
		s.Close()
	}
	e.cancel(ErrStopped)
}

// answered applies the verdict on a call's answer (err) and returns the cause that ends
// the extending, if it ends.
func (e *Extender) answered(v verdict, err error, sentAt time.Time, relocked bool) error {
	if e.cfg.OnExtend != nil {
		e.cfg.OnExtend(err)
	}
	switch v {
	case verdictLost:
		return &LockLostError{TaskID: e.task.ID, Err: err}
	case verdictMaxRunTime:
		return ErrMaxRunTime
	case verdictExtended:
		e.succeeded(sentAt, relocked)
	default:
		e.failed(err)
	}
	return nil
}

// succeeded records an extension sent at sentAt that the engine granted.
func (e *Extender) succeeded(sentAt time.Time, relocked bool) {
	e.backoff, e.failures = 0, 0
	e.mu.Lock()
	e.deadline = sentAt.Add(e.cfg.LockDuration)
	e.extensions++
	if relocked {
		e.relocks++
	}
	e.mu.Unlock()
	if relocked {
		e.cfg.Logger.LogAttrs(e.parent, slog.LevelInfo, "lockext: the lock had expired and nobody had taken the task; locked it again",
			slog.String("task_id", e.task.ID), slog.String("worker_id", e.task.WorkerID))
	}
}

// failed records a transient error and sets the pause before the next attempt: it
// doubles with every failure in a row, up to Interval.
func (e *Extender) failed(err error) {
	e.failures++
	if e.backoff == 0 {
		e.backoff = e.cfg.RetryInitial
	} else {
		e.backoff = min(2*e.backoff, e.cfg.Interval)
	}
	e.cfg.Logger.LogAttrs(e.parent, slog.LevelDebug, "lockext: extend lock failed, retrying",
		slog.String("task_id", e.task.ID), slog.String("worker_id", e.task.WorkerID),
		slog.Int("failures", e.failures), slog.Duration("retry_in", e.backoff),
		slog.Time("local_deadline", e.Deadline()), slog.Any("error", err))
}

// extend sends one extendLock. When the engine answers that this worker's own lock has
// expired (it cannot extend an expired lock), nobody else has taken the task yet: lock
// it again, which fails only if another worker holds it by now.
func (e *Extender) extend(ctx context.Context) (relocked bool, err error) {
	err = e.s.l.ExtendLock(ctx, e.task.ID, e.task.WorkerID, e.cfg.LockDuration)
	if !errors.Is(err, camunda7.ErrLockExpired) {
		return false, err
	}
	if err := e.s.l.Lock(ctx, e.task.ID, e.task.WorkerID, e.cfg.LockDuration); err != nil {
		return false, err
	}
	return true, nil
}

// setReady lets a late task's Start return.
func (e *Extender) setReady() {
	if e.ready != nil {
		e.readyOnce.Do(func() { close(e.ready) })
	}
}

// end records why the extending ended, logs it and cancels the handler's context. The
// extender is already out of its scheduler's queue.
func (e *Extender) end(cause error) {
	e.mu.Lock()
	e.lost = cause
	extensions := e.extensions
	e.mu.Unlock()
	attrs := []slog.Attr{
		slog.String("task_id", e.task.ID), slog.String("worker_id", e.task.WorkerID),
		slog.String("reason", cause.Error()),
	}
	msg := "lockext: lock lost, cancelling handler"
	if cause == ErrMaxRunTime {
		msg = "lockext: maximum run time exceeded, cancelling handler and letting the lock run out"
		attrs = append(attrs, slog.Int("extensions", extensions), slog.Duration("max_run_time", e.cfg.MaxRunTime))
	} else {
		attrs = append(attrs, slog.Int("failures", e.failures))
	}
	e.cfg.Logger.LogAttrs(e.parent, slog.LevelWarn, msg, attrs...)
	if e.cfg.OnEnd != nil {
		e.cfg.OnEnd(cause)
	}
	e.cancel(cause)
	e.setReady()
	if e.s.own {
		// The scheduler was this extender's alone: let its goroutine go now, not at Stop.
		e.s.closeAsync()
	}
}

// earliest returns the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
