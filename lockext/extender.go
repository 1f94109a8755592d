package lockext

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/extworker/extworker/failpoint"
)

// Extender keeps one task's lock alive while its handler runs, and cancels the
// handler's context with a cause when it cannot. Create it with Start; end it with
// Stop. Its methods are safe for concurrent use.
type Extender struct {
	l    Locker
	task Task
	cfg  Config

	ctx    context.Context // the handler's context: parent + our causes
	cancel context.CancelCauseFunc

	// reqCtx is the base of every extendLock call: parent's values, not its
	// cancellation (the lock must outlive a shutdown until the result is reported);
	// cancelled by Stop so an in-flight call ends at once.
	reqCtx    context.Context
	cancelReq context.CancelFunc

	startedAt time.Time
	stopCh    chan struct{} // closed by Stop
	stopOnce  sync.Once
	done      chan struct{} // closed when the goroutine has exited

	mu         sync.Mutex
	deadline   time.Time
	extensions int
	lost       error
}

// Start begins extending t's lock in a new goroutine and returns at once. The first
// extension goes out at t.GrantedAt+Interval. The returned extender's Context, derived
// from parent, is the one to run the handler with.
//
// parent ending (worker shutdown) cancels Context with parent's cause but does not stop
// the extending: the runtime still needs the lock to report the result. Only Stop, a
// lost lock and MaxRunTime stop it.
//
// The error is only for an invalid cfg (after WithDefaults) or t; then nothing was
// started.
func Start(parent context.Context, l Locker, t Task, cfg Config) (*Extender, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := t.validate(); err != nil {
		return nil, err
	}
	e := &Extender{
		l:         l,
		task:      t,
		cfg:       cfg,
		startedAt: time.Now(),
		stopCh:    make(chan struct{}),
		done:      make(chan struct{}),
		deadline:  t.GrantedAt.Add(cfg.LockDuration),
	}
	e.ctx, e.cancel = context.WithCancelCause(parent)
	e.reqCtx, e.cancelReq = context.WithCancel(context.WithoutCancel(parent))
	go e.run()
	return e, nil
}

// Context returns the handler's context. It is cancelled, with context.Cause telling
// why, by the first of: a lost lock (*LockLostError, errors.Is ErrLockLost), MaxRunTime
// (ErrMaxRunTime), parent ending (parent's cause), or Stop (ErrStopped).
func (e *Extender) Context() context.Context { return e.ctx }

// Deadline returns the current local lock deadline: when the latest successful
// extension (or the fetch) was sent, plus LockDuration. The engine's lock lasts at
// least until then.
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

// Lost returns nil while the lock is held (and after a normal Stop), or the
// *LockLostError or ErrMaxRunTime that ended the extending.
func (e *Extender) Lost() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lost
}

// Stop stops extending, cancelling an extendLock call in flight, waits for the
// goroutine to exit, and then cancels Context with ErrStopped (unless it already ended
// with another cause). The runtime calls it once the result is reported (or abandoned).
// It is safe to call twice, concurrently, after the lock was lost, and on nil.
func (e *Extender) Stop() {
	if e == nil {
		return
	}
	e.stopOnce.Do(func() {
		close(e.stopCh)
		e.cancelReq()
	})
	<-e.done
	e.cancel(ErrStopped)
}

func (e *Extender) stopped() bool {
	select {
	case <-e.stopCh:
		return true
	default:
		return false
	}
}

// run is the extender's one goroutine: wait until the next extension is due, send it,
// and classify the answer, until Stop, a lost lock or MaxRunTime.
func (e *Extender) run() {
	defer close(e.done)
	defer e.cancelReq()

	var (
		deadline = e.Deadline()
		next     = e.task.GrantedAt.Add(e.cfg.Interval)
		backoff  = time.Duration(0) // 0: the last attempt succeeded (or none was made)
		lastErr  error
		failures int
		maxAt    time.Time // zero: no MaxRunTime
		maxC     <-chan time.Time
	)
	if e.cfg.MaxRunTime > 0 {
		maxAt = e.startedAt.Add(e.cfg.MaxRunTime)
		maxTimer := time.NewTimer(time.Until(maxAt))
		defer maxTimer.Stop()
		maxC = maxTimer.C
	}
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()

	for {
		select {
		case <-e.stopCh:
			return
		case <-maxC:
			e.end(ErrMaxRunTime, slog.Int("extensions", e.Extensions()))
			return
		case <-timer.C:
		}
		if e.stopped() {
			return
		}
		now := time.Now()
		if !maxAt.IsZero() && !now.Before(maxAt) {
			e.end(ErrMaxRunTime, slog.Int("extensions", e.Extensions()))
			return
		}
		if !now.Before(deadline) {
			e.end(&LockLostError{TaskID: e.task.ID, Err: lastErr, Expired: true}, slog.Int("failures", failures))
			return
		}

		// The call ends by RequestTimeout, and never after the local deadline (an answer
		// after it comes too late to save the handler) or MaxRunTime.
		sentAt := time.Now()
		callEnd := earliest(sentAt.Add(e.cfg.RequestTimeout), deadline)
		if !maxAt.IsZero() {
			callEnd = earliest(callEnd, maxAt)
		}
		ctx, cancel := context.WithDeadline(e.reqCtx, callEnd)
		failpoint.Inject(failpoint.InExtension)
		err := e.l.ExtendLock(ctx, e.task.ID, e.task.WorkerID, e.cfg.LockDuration)
		cancel()

		if !e.stopped() && e.cfg.OnExtend != nil {
			e.cfg.OnExtend(err)
		}
		switch {
		case e.stopped():
			return
		case err != nil && LostAnswer(err):
			e.end(&LockLostError{TaskID: e.task.ID, Err: err}, slog.Int("failures", failures))
			return
		case !maxAt.IsZero() && !time.Now().Before(maxAt):
			e.end(ErrMaxRunTime, slog.Int("extensions", e.Extensions()))
			return
		case err == nil:
			deadline = sentAt.Add(e.cfg.LockDuration)
			next = sentAt.Add(e.cfg.Interval)
			backoff, lastErr, failures = 0, nil, 0
			e.mu.Lock()
			e.deadline = deadline
			e.extensions++
			e.mu.Unlock()
		default:
			lastErr = err
			failures++
			if backoff == 0 {
				backoff = e.cfg.RetryInitial
			} else {
				backoff = min(2*backoff, e.cfg.Interval)
			}
			next = earliest(time.Now().Add(backoff), deadline)
			e.cfg.Logger.LogAttrs(e.reqCtx, slog.LevelDebug, "lockext: extend lock failed, retrying",
				slog.String("task_id", e.task.ID), slog.String("worker_id", e.task.WorkerID),
				slog.Int("failures", failures), slog.Duration("retry_in", time.Until(next)),
				slog.Time("deadline", deadline), slog.Any("error", err))
		}
		timer.Reset(time.Until(next))
	}
}

// end records why the extending ended, logs it and cancels the handler's context.
func (e *Extender) end(cause error, attrs ...slog.Attr) {
	e.mu.Lock()
	e.lost = cause
	e.mu.Unlock()
	attrs = append([]slog.Attr{
		slog.String("task_id", e.task.ID), slog.String("worker_id", e.task.WorkerID),
		slog.String("reason", cause.Error()),
	}, attrs...)
	msg := "lockext: lock lost, cancelling handler"
	if cause == ErrMaxRunTime {
		msg = "lockext: maximum run time exceeded, cancelling handler and letting the lock run out"
		attrs = append(attrs, slog.Duration("max_run_time", e.cfg.MaxRunTime))
	}
	e.cfg.Logger.LogAttrs(e.reqCtx, slog.LevelWarn, msg, attrs...)
	if e.cfg.OnEnd != nil {
		e.cfg.OnEnd(cause)
	}
	e.cancel(cause)
}

// earliest returns the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
