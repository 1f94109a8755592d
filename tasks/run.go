package tasks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/sethvargo/go-retry"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/lockext"
)

// The middle of a task's walk: start takes a slot, handle keeps the lock alive
// (keepLock), runs the handler (runHandler) and settles its result (settle), which hands
// it to report (report.go); release frees the slot.

// start takes a slot for the task and runs it.
func (w *Worker) start(workCtx context.Context, raw camunda7.LockedExternalTask, sentAt time.Time) {
	t, ok := w.reg.topics[raw.TopicName]
	if !ok {
		// Never asked for; give it back at once rather than hold it until the lock expires.
		w.log.Error("engine returned a task for an unregistered topic; unlocking it", slog.String("topic", raw.TopicName), slog.String("task_id", raw.ID))
		w.unlock(workCtx, raw.ID, w.log)
		return
	}
	w.mu.Lock()
	if w.active[raw.ID] {
		// Locked again for our own worker id while its handler runs here: the running
		// handler's extender keeps the new lock alive; a second run would duplicate work.
		w.mu.Unlock()
		w.stats.Redelivered.Add(1)
		w.log.Warn("task redelivered while its handler is still running here; not starting it twice",
			slog.String("topic", raw.TopicName), slog.String("external_task_id", raw.ID))
		return
	}
	w.active[raw.ID] = true
	delete(w.held, raw.ID) // back from its retry timeout
	w.inflight++
	w.perTopic[t.name]++
	if n := int64(w.inflight); n > w.stats.MaxInFlight.Load() {
		w.stats.MaxInFlight.Store(n)
	}
	inTopic, free := w.perTopic[t.name], w.cfg.MaxConcurrency-w.inflight
	w.mu.Unlock()
	w.obs.Slots(t.name, inTopic, free)
	// The task is built here, so that the goroutine holds one copy of what was fetched.
	task := newTask(raw, w.cfg.WorkerID, t.opts.Retry.Attempt(raw.Retries))
	task.fetch = &t.fetch
	w.handlers.Add(1)
	go func() {
		defer w.handlers.Done()
		defer w.release(t.name, task.ID())
		w.handle(workCtx, t, task, sentAt)
	}()
}

// handle runs one task from lock to report. Its frame, and so the stack of a goroutine
// whose handler waits, is kept small: what comes before and after the handler is in
// functions of their own, whose frames are gone while it runs.
func (w *Worker) handle(workCtx context.Context, t *topic, task *Task, sentAt time.Time) {
	log := slog.New(newTaskHandler(w.log.Handler(), task))
	// The task's span: its trace's root, ended (after the lock extender stops) with the
	// outcome set below.
	workCtx, span := w.startTaskSpan(workCtx, &task.raw, task.Attempt())
	var (
		outcome Outcome
		class   string
	)
	defer func() { endOutcomeSpan(span, outcome, class) }()
	ext, outcome := w.keepLock(workCtx, t, task, sentAt, log)
	if ext == nil {
		return
	}
	defer ext.Stop() // after the report: the lock stays alive while the result is reported

	start := time.Now()
	log.Debug("handler started") // formats the task's fields only if Debug is on
	hctx, tl := withTaskLog(ext.Context(), log)
	sctx, hspan := startHandlerSpan(hctx) // the handler's ctx carries its span: its own spans nest under it
	vars, herr := runHandler(sctx, t.handler, task)
	endHandlerSpan(hspan, herr)
	took := time.Since(start)
	// Waits here, with a small stack, for a turn to report (ReportConcurrency).
	w.reporting <- struct{}{}
	defer func() { <-w.reporting }()
	// With what the handler added to its logger (AddLogAttrs).
	outcome, class = w.settle(workCtx, t, task, ext, hctx, vars, herr, took, tl.get())
}

// keepLock starts keeping the task's lock alive. When the handler must not run, it
// returns a nil extender and the task's outcome: the lock cannot be kept (the task is
// unlocked), or it was lost before the handler started.
func (w *Worker) keepLock(workCtx context.Context, t *topic, task *Task, sentAt time.Time, log *slog.Logger) (*lockext.Extender, Outcome) {
	raw := &task.raw
	extCfg := w.extend[t.name]
	extCfg.Logger = log
	ext, err := w.locks.Start(workCtx, lockext.Task{ID: raw.ID, WorkerID: w.cfg.WorkerID, GrantedAt: sentAt}, extCfg)
	if err != nil {
		// The scheduler closed while the task waited to be extended (lockext.ErrClosed: Run
		// returned at its shutdown timeout), or a bug: the task goes back to the engine.
		log.Log(workCtx, startFailureLevel(err), "cannot keep the lock alive; unlocking the task", slog.Any("error", err),
			slog.String("outcome", OutcomeUnlocked.String()))
		w.unlock(workCtx, raw.ID, log)
		w.finish(ended{topic: raw.TopicName, outcome: OutcomeUnlocked})
		return nil, OutcomeUnlocked
	}
	if cause := ext.Lost(); cause != nil {
		// Handed over late in a long poll, and the extension sent at once on arrival was
		// refused: another worker has it, or it is gone. Nothing ran, nothing to report.
		ext.Stop()
		log.Warn("lock lost before the handler started; not running it", slog.String("outcome", OutcomeLockLost.String()), slog.Any("cause", cause))
		w.finish(ended{topic: raw.TopicName, outcome: OutcomeLockLost})
		return nil, OutcomeLockLost
	}
	return ext, ""
}

// startFailureLevel is the level of the record about a lock that could not be kept: Info
// at shutdown (the scheduler closed), Error otherwise.
func startFailureLevel(err error) slog.Level {
	if errors.Is(err, lockext.ErrClosed) {
		return slog.LevelInfo
	}
	return slog.LevelError
}

// settlement is what becomes of a handler's result once it has returned.
type settlement int

const (
	settleReport   settlement = iota // report it (report.go)
	settleLockLost                   // the lock was lost while it ran: nothing to report
	settleUnlock                     // cancelled by the shutdown: hand the task back, no retry spent
)

// settleOf decides what becomes of a handler's result: herr, the handler's error, with
// the cause its context ended with, if it ended (ctxErr). The error to report is herr,
// naming the context's end when the handler's error does not.
func settleOf(ctxErr, cause, herr error) (settlement, error) {
	var lost *lockext.LockLostError
	switch {
	case ctxErr != nil && errors.As(cause, &lost):
		return settleLockLost, herr
	case ctxErr != nil && errors.Is(cause, ErrShutdown) && herr != nil:
		return settleUnlock, herr
	case ctxErr != nil && herr != nil && cause != nil && !errors.Is(herr, cause):
		return settleReport, fmt.Errorf("%w (context ended: %w)", herr, cause)
	}
	return settleReport, herr
}

// settle reports what the handler returned, unless its lock was lost or the shutdown
// cancelled it (settleOf), and returns the task's outcome and failure class.
func (w *Worker) settle(workCtx context.Context, t *topic, task *Task, ext *lockext.Extender, hctx context.Context,
	vars camunda7.Variables, herr error, took time.Duration, log *slog.Logger) (Outcome, string) {
	raw := &task.raw
	cause := context.Cause(hctx)
	what, herr := settleOf(hctx.Err(), cause, herr)
	switch what {
	case settleLockLost:
		// The engine said another worker has the task, or it is gone: nothing to report.
		log.Warn("lock lost while the handler ran; result discarded", slog.String("outcome", OutcomeLockLost.String()),
			slog.Any("cause", cause), slog.Duration("took", took))
		w.finish(ended{topic: raw.TopicName, outcome: OutcomeLockLost, took: took})
		if errors.Is(cause, camunda7.ErrTaskGone) {
			w.taskGone(workCtx, task, cause, log)
		}
		return OutcomeLockLost, ""
	case settleUnlock:
		log.Info("handler cancelled by shutdown; unlocking the task", slog.String("outcome", OutcomeUnlocked.String()), slog.Duration("took", took))
		ext.Stop() // an extension racing the unlock makes the engine refuse one of them
		w.unlock(workCtx, raw.ID, log)
		w.finish(ended{topic: raw.TopicName, outcome: OutcomeUnlocked, took: took})
		return OutcomeUnlocked, ""
	}
	rctx, rspan := startReportSpan(workCtx)
	outcome, class := w.report(rctx, t, task, failure.Classify(herr), vars, took, log)
	endReportSpan(rspan, outcome)
	return outcome, class
}

// runHandler calls the handler, turning a panic into a failure.
func runHandler(ctx context.Context, h Handler, t *Task) (vars camunda7.Variables, err error) {
	defer func() {
		if v := recover(); v != nil {
			vars, err = nil, failure.FromPanic(v, debug.Stack())
		}
	}()
	return h(ctx, t)
}

func (w *Worker) release(topic, id string) {
	w.mu.Lock()
	delete(w.active, id)
	w.inflight--
	w.perTopic[topic]--
	inTopic, free := w.perTopic[topic], w.cfg.MaxConcurrency-w.inflight
	w.mu.Unlock()
	w.obs.Slots(topic, inTopic, free)
	select {
	case w.freed <- struct{}{}:
	default:
	}
}

func (w *Worker) unlock(workCtx context.Context, id string, log *slog.Logger) {
	ctx := context.WithoutCancel(workCtx)
	err := retry.Do(ctx, w.reportBackoff(), func(ctx context.Context) error {
		rctx, cancel := context.WithTimeout(ctx, w.cfg.ReportTimeout)
		defer cancel()
		w.changes.Add(1)
		err := w.c.Unlock(rctx, id)
		if errors.Is(err, camunda7.ErrNotSent) || errors.Is(err, camunda7.ErrOptimisticLock) || errors.Is(err, camunda7.ErrUnknownOutcome) {
			return retry.RetryableError(err) // unlocking twice is harmless
		}
		return err
	})
	if err != nil && !errors.Is(err, camunda7.ErrTaskGone) {
		w.obs.EngineError("unlock", err)
		log.Warn("unlock failed; the task returns when its lock expires", slog.Any("error", err))
		return
	}
	w.stats.Unlocked.Add(1)
}

// reportBackoff paces the resending of an unlock: ReportAttempts tries in all. (Reports
// are resent for up to ReportRetryFor: deliver.)
func (w *Worker) reportBackoff() retry.Backoff {
	return retry.WithMaxRetries(uint64(w.cfg.ReportAttempts-1), retry.WithJitterPercent(20, retry.NewExponential(100*time.Millisecond)))
}
