package lockext

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/failpoint"
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
	ready     chan struct{} // closed once Start may return: at once, or after a late task's first extension
	readyOnce sync.Once

	mu         sync.Mutex
	deadline   time.Time
	extensions int
	relocks    int
	lost       error
}

// Start begins extending t's lock in a new goroutine. The first extension goes out at
// t.GrantedAt+Interval. When that moment has already passed (the engine handed the task
// over late in a long poll, so little or none of the local lock is left), Start sends
// it at once and returns only after its answer, so the handler never starts on a lock
// nobody has confirmed: if the engine answers that the lock is lost, Context is already
// cancelled (check Lost) when Start returns; if the engine cannot be reached, the
// extending goes on in the background and Start returns after one RequestTimeout at
// most. The returned extender's Context, derived from parent, is the one to run the
// handler with.
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
		ready:     make(chan struct{}),
		deadline:  t.GrantedAt.Add(cfg.LockDuration),
	}
	e.ctx, e.cancel = context.WithCancelCause(parent)
	e.reqCtx, e.cancelReq = context.WithCancel(context.WithoutCancel(parent))
	late := !e.startedAt.Before(t.GrantedAt.Add(cfg.Interval))
	if !late {
		e.setReady()
	}
	go e.run()
	<-e.ready
	return e, nil
}

// Context returns the handler's context. It is cancelled, with context.Cause telling
// why, by the first of: a lost lock (*LockLostError, errors.Is ErrLockLost), MaxRunTime
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
// and classify the answer, until Stop, a lost lock or MaxRunTime. Only the engine's
// answer ends it as lost; transient errors are retried with backoff for as long as it
// takes, whatever the local deadline says.
func (e *Extender) run() {
	defer close(e.done)
	defer e.cancelReq()
	defer e.setReady()

	var (
		next     = e.task.GrantedAt.Add(e.cfg.Interval)
		backoff  = time.Duration(0) // 0: the last attempt succeeded (or none was made)
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
		if !maxAt.IsZero() && !time.Now().Before(maxAt) {
			e.end(ErrMaxRunTime, slog.Int("extensions", e.Extensions()))
			return
		}

		// The call ends by RequestTimeout, and never after MaxRunTime.
		sentAt := time.Now()
		callEnd := sentAt.Add(e.cfg.RequestTimeout)
		if !maxAt.IsZero() {
			callEnd = earliest(callEnd, maxAt)
		}
		ctx, cancel := context.WithDeadline(e.reqCtx, callEnd)
		failpoint.Inject(failpoint.InExtension)
		relocked, err := e.extend(ctx)
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
			next = sentAt.Add(e.cfg.Interval)
			backoff, failures = 0, 0
			e.mu.Lock()
			e.deadline = sentAt.Add(e.cfg.LockDuration)
			e.extensions++
			if relocked {
				e.relocks++
			}
			e.mu.Unlock()
			if relocked {
				e.cfg.Logger.LogAttrs(e.reqCtx, slog.LevelInfo, "lockext: the lock had expired and nobody had taken the task; locked it again",
					slog.String("task_id", e.task.ID), slog.String("worker_id", e.task.WorkerID))
			}
		default:
			failures++
			if backoff == 0 {
				backoff = e.cfg.RetryInitial
			} else {
				backoff = min(2*backoff, e.cfg.Interval)
			}
			next = time.Now().Add(backoff)
			e.cfg.Logger.LogAttrs(e.reqCtx, slog.LevelDebug, "lockext: extend lock failed, retrying",
				slog.String("task_id", e.task.ID), slog.String("worker_id", e.task.WorkerID),
				slog.Int("failures", failures), slog.Duration("retry_in", backoff),
				slog.Time("local_deadline", e.Deadline()), slog.Any("error", err))
		}
		e.setReady() // a late task's first answer is in: its handler may start
		timer.Reset(time.Until(next))
	}
}

// extend sends one extendLock. When the engine answers that this worker's own lock has
// expired (it cannot extend an expired lock), nobody else has taken the task yet: lock
// it again, which fails only if another worker holds it by now.
func (e *Extender) extend(ctx context.Context) (relocked bool, err error) {
	err = e.l.ExtendLock(ctx, e.task.ID, e.task.WorkerID, e.cfg.LockDuration)
	if !errors.Is(err, camunda7.ErrLockExpired) {
		return false, err
	}
	if err := e.l.Lock(ctx, e.task.ID, e.task.WorkerID, e.cfg.LockDuration); err != nil {
		return false, err
	}
	return true, nil
}

func (e *Extender) setReady() { e.readyOnce.Do(func() { close(e.ready) }) }

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
