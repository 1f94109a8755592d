package tasks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/sethvargo/go-retry"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/internal/failpoint"
	"github.com/extworker/extworker/lockext"
)

// The last step of a task's walk: its result becomes one engine call. planReport decides
// which, from values alone; report sends it (deliver), falls back to a failure when the
// engine refuses a completion for good, and records the task's outcome (finish).

// engineCall is an engine call that reports a result; its value is the operation's name
// for Observer.EngineError.
type engineCall string

const (
	callComplete  engineCall = "complete"
	callBPMNError engineCall = "bpmn-error"
	callFailure   engineCall = "failure"
)

// reportPlan is the one engine call that reports a handler's result.
type reportPlan struct {
	call engineCall
	// outcome is the task's outcome once the engine accepts the call.
	outcome Outcome
	// class is the failure's classification label (retryable, permanent,
	// unknown-outcome, deferred); "" for complete and bpmnError.
	class string
	// result is what is reported: the handler's, or a permanent failure in place of a
	// BPMN error whose variables cannot be sent.
	result failure.Classification
	// bpmnVars are the BPMN error's variables, converted for the engine.
	bpmnVars camunda7.Variables
	// retries and retryTimeout are a failure's: retries left (0 raises an incident), and
	// when the task comes back.
	retries      int
	retryTimeout time.Duration
}

// holds reports whether the engine keeps the task locked for this worker once the plan
// is reported: a failure with retries left and a retry timeout.
func (p reportPlan) holds() bool { return p.call == callFailure && p.retries > 0 && p.retryTimeout > 0 }

// planReport decides the engine call for a handler's classified result c, given the
// task's retries as the engine sent them (nil before its first failure) and the topic's
// retry policy.
func planReport(c failure.Classification, retries *int, policy failure.RetryPolicy) reportPlan {
	if c.Kind == failure.KindBPMNError {
		vars, err := toVariables(c.Variables)
		if err == nil {
			return reportPlan{call: callBPMNError, outcome: OutcomeBPMNError, result: c, bpmnVars: vars}
		}
		// A BPMN error whose variables cannot be sent is a bug in the handler.
		c = failure.Classify(failure.Permanent(fmt.Errorf("BPMN error %q: %w", c.Code, err)))
	}
	if c.Kind == failure.KindNone {
		return reportPlan{call: callComplete, outcome: OutcomeCompleted, result: c}
	}
	left, delay := failureRetries(c, retries, policy)
	p := reportPlan{call: callFailure, outcome: OutcomeRetryable, class: c.Kind.String(), result: c, retries: left, retryTimeout: delay}
	switch {
	case c.KeepRetries:
		p.outcome, p.class = OutcomeDeferred, "deferred"
	case left == 0:
		p.outcome = OutcomeIncident
	}
	return p
}

// failureRetries returns the retries left and the retry timeout to report with a
// failure: the policy's for a retryable one (the handler's RetryDelay, if any, replacing
// the timeout), the retries unchanged for a deferral, and none (an incident) otherwise.
func failureRetries(c failure.Classification, retries *int, policy failure.RetryPolicy) (left int, delay time.Duration) {
	if c.Kind != failure.KindRetryable {
		return 0, 0
	}
	left, delay = policy.Next(retries)
	if c.KeepRetries {
		// Deferred: waiting, not failing. The retries stay as they are (a task never
		// failed before keeps its whole budget).
		left = policy.MaxAttempts
		if retries != nil {
			left = max(*retries, 1)
		}
		if delay == 0 {
			delay = policy.InitialDelay
		}
	}
	if left > 0 && c.RetryDelay > 0 {
		delay = c.RetryDelay
	}
	return left, delay
}

// logAttrs are the fields of the plan's log records.
func (p reportPlan) logAttrs() []slog.Attr {
	switch p.call {
	case callBPMNError:
		return []slog.Attr{slog.String("error_code", p.result.Code)}
	case callFailure:
		return []slog.Attr{slog.String("classification", p.class), slog.Int("retries_left", p.retries),
			slog.Duration("retry_timeout", p.retryTimeout), slog.String("error", errorText(p.result))}
	}
	return nil
}

// report turns a handler's result into one engine call: the only place that does, a
// loop over planReport. Reports use their own context (never the handler's, which may be
// cancelled), their own timeout, resend only what certainly did not arrive, and resolve a
// lost answer by asking the engine, never by running the handler again. A completion or
// BPMN error the engine refuses for good is reported as a failure instead (refusedReport:
// one more turn of the loop; a failure is never replaced). It returns the task's outcome
// and the failure's classification ("" for none), as recorded by finish.
func (w *Worker) report(workCtx context.Context, t *topic, task *Task, c failure.Classification, vars camunda7.Variables, took time.Duration, log *slog.Logger) (Outcome, string) {
	ctx := context.WithoutCancel(workCtx)
	for {
		p := planReport(c, task.Retries(), t.opts.Retry)
		err := w.send(ctx, t, task, p, vars, log)
		if p.call != callFailure {
			if instead, ok := refusedReport(string(p.call), err); ok {
				// The engine answered and will answer the same again: report a failure
				// instead, so the task shows in Cockpit rather than cycling through lock
				// expiries.
				log.Warn("the engine refused the report; reporting a failure instead", slog.String("refused", string(p.call)), slog.Any("error", err))
				c, vars = instead, nil
				continue
			}
		}
		return w.reported(ctx, task, p, err, took, log)
	}
}

// send delivers the plan's engine call. A failure with a retry timeout leaves the task
// locked for this worker until the timeout ends: the worker holds it (holdForRetry) so
// that sweepOrphans leaves it alone; the task stays active here until then.
func (w *Worker) send(ctx context.Context, t *topic, task *Task, p reportPlan, vars camunda7.Variables, log *slog.Logger) error {
	id, wid := task.ID(), w.cfg.WorkerID
	var call func(context.Context) error
	switch p.call {
	case callComplete:
		failpoint.Inject(failpoint.BeforeComplete)
		req := camunda7.CompleteRequest{WorkerID: wid, Variables: vars, LocalVariables: task.localVariables()}
		call = func(ctx context.Context) error { return w.c.Complete(ctx, id, req) }
	case callBPMNError:
		req := camunda7.BPMNErrorRequest{WorkerID: wid, ErrorCode: p.result.Code, ErrorMessage: p.result.Message, Variables: p.bpmnVars}
		call = func(ctx context.Context) error { return w.c.BPMNError(ctx, id, req) }
	case callFailure:
		msg, details := describeFailure(wid, t, task, p.result, p.retries, p.retryTimeout)
		req := camunda7.FailureRequest{WorkerID: wid, ErrorMessage: msg, ErrorDetails: details, Retries: p.retries, RetryTimeout: p.retryTimeout}
		call = func(ctx context.Context) error { return w.c.Failure(ctx, id, req) }
	}
	err := w.deliver(ctx, id, call, log)
	if p.holds() {
		w.holdForRetry(id, p.retryTimeout)
		w.wakes.add(time.Now().Add(p.retryTimeout + wakeMargin)) // the engine wakes no poll then
	}
	return err
}

// reported records the task's outcome once its report has been delivered, or not (err):
// in Stats and the Observer (finish), and in the "task handled" record.
func (w *Worker) reported(ctx context.Context, task *Task, p reportPlan, err error, took time.Duration, log *slog.Logger) (Outcome, string) {
	attrs := append(p.logAttrs(), slog.Duration("took", took))
	if err == nil {
		w.finish(ended{topic: task.Topic(), outcome: p.outcome, class: p.class, took: took})
		level := slog.LevelInfo
		if p.outcome == OutcomeIncident {
			level = slog.LevelWarn
		}
		log.LogAttrs(ctx, level, "task handled", append(attrs, slog.String("outcome", p.outcome.String()))...)
		return p.outcome, p.class
	}
	outcome, level := OutcomeReportFailed, slog.LevelError
	if lockext.LostAnswer(err) {
		outcome, level = OutcomeLockLost, slog.LevelWarn
		w.obs.LockLost(task.Topic(), lockLostReason(err))
	} else {
		w.obs.EngineError(string(p.call), err)
	}
	w.finish(ended{topic: task.Topic(), outcome: outcome, class: p.class, took: took, reportFailed: true})
	log.LogAttrs(ctx, level, "reporting the result failed", append(attrs, slog.String("outcome", outcome.String()),
		slog.String("report", string(p.call)), slog.Any("report_error", err))...)
	if errors.Is(err, camunda7.ErrTaskGone) {
		w.taskGone(ctx, task, err, log)
	}
	return outcome, p.class
}

// Pacing of report resends: doubling from reportRetryInitial up to reportRetryMax, with
// 20% jitter, or the engine's (a proxy's) Retry-After when it is longer.
const (
	reportRetryInitial = 100 * time.Millisecond
	reportRetryMax     = 5 * time.Second
)

// deliver sends a report until the engine answers it, resending what certainly did not
// arrive (not sent, a concurrent modification, throttled) and resolving a lost answer by
// asking the engine, for as long as the report can still take effect: ReportRetryFor in
// all (and at least ReportAttempts sends). The caller's extender keeps the lock alive
// meanwhile, and the task stays active here, so it is not run again. Resending a report
// is safe: a second complete or bpmnError finds the task gone (404), a second failure
// sets the same values. It returns the last error when it gives up.
func (w *Worker) deliver(ctx context.Context, id string, send func(context.Context) error, log *slog.Logger) error {
	start := time.Now()
	pauses := retry.WithJitterPercent(20, retry.WithCappedDuration(reportRetryMax, retry.NewExponential(reportRetryInitial)))
	for attempt := 1; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, w.cfg.ReportTimeout)
		w.changes.Add(1)
		err := send(rctx)
		cancel()
		again, wait := false, time.Duration(0)
		switch {
		case err == nil:
			if attempt > 1 {
				log.Info("report delivered", slog.Int("attempts", attempt), slog.Duration("after", time.Since(start).Round(time.Millisecond)))
			}
			return nil
		case errors.Is(err, camunda7.ErrInvalidArgument):
			// Refused by the client before sending (a variable that cannot be encoded, a
			// fetched File sent on without its content): it would be refused again.
			return err
		case errors.Is(err, camunda7.ErrNotSent), errors.Is(err, camunda7.ErrOptimisticLock):
			again = true
		case errors.Is(err, camunda7.ErrThrottled):
			again = true
			wait, _ = camunda7.RetryAfter(err)
		case errors.Is(err, camunda7.ErrUnknownOutcome):
			var done bool
			done, again, err = w.resolve(ctx, id, err, log)
			if done {
				return nil
			}
		}
		if !again {
			return err
		}
		if attempt >= w.cfg.ReportAttempts && time.Since(start) >= w.cfg.ReportRetryFor {
			return fmt.Errorf("gave up after %d attempts over %v (ReportRetryFor %v): %w", attempt,
				time.Since(start).Round(time.Millisecond), w.cfg.ReportRetryFor, err)
		}
		if attempt == 1 {
			log.Warn("reporting the result failed; sending it again until the engine answers",
				slog.Duration("for_at_most", w.cfg.ReportRetryFor), slog.Any("error", err))
		} else {
			log.Debug("reporting the result failed again", slog.Int("attempts", attempt), slog.Any("error", err))
		}
		pause, _ := pauses.Next() // never stops: the bound is ReportRetryFor
		t := time.NewTimer(max(pause, wait))
		<-t.C // ctx never ends (the caller detached it): a report outlasts a shutdown
	}
}

// resolve finds out what became of a report whose answer was lost: done when the task is
// gone (the report took effect, or the task ended otherwise), again when it is still
// locked for this worker (or the engine cannot be asked): sending it again is safe.
func (w *Worker) resolve(ctx context.Context, id string, sendErr error, log *slog.Logger) (done, again bool, err error) {
	rctx, cancel := context.WithTimeout(ctx, w.cfg.ReportTimeout)
	defer cancel()
	t, err := w.c.ExternalTask(rctx, id)
	switch {
	case errors.Is(err, camunda7.ErrTaskGone):
		log.Info("report answer was lost; the task is gone, so the report took effect", slog.Any("lost_answer", sendErr))
		return true, false, nil
	case err != nil:
		return false, true, fmt.Errorf("%w; asking the engine failed too: %w", sendErr, err)
	case t.WorkerID == w.cfg.WorkerID:
		return false, true, sendErr // still ours (its lock may have run out, but nobody took it)
	default:
		return false, false, fmt.Errorf("%w; the task is now locked by %q", sendErr, t.WorkerID)
	}
}

// refusedReport turns the engine's refusal of a complete or bpmnError into the failure
// to report instead, if the refusal is one that sending again cannot change:
//   - a 5xx answer from the engine (not a concurrent modification): it rolled the
//     completion back, e.g. a following synchronous step threw; retryable, as a later
//     attempt may pass;
//   - a 4xx refusal of the request itself (a badly formatted Date variable, a variable
//     the engine cannot deserialize): permanent, with the engine's message, for an
//     operator to fix the handler or the data;
//   - throttling (429 or 413 from a proxy) that outlasted ReportRetryFor: retryable;
//   - a request the client refused to send (camunda7.ErrInvalidArgument: a variable the
//     handler returned cannot be encoded, or is a fetched File without its content):
//     permanent, naming the variable.
//
// A lost or taken lock, a gone task, a suspended instance, refused credentials and
// answers never received are not turned into failures (the failure would meet the same).
func refusedReport(op string, err error) (failure.Classification, bool) {
	var ee *camunda7.Error
	switch {
	case err == nil, lockext.LostAnswer(err), errors.Is(err, camunda7.ErrSuspended), errors.Is(err, camunda7.ErrUnauthorized):
		return failure.Classification{}, false
	case errors.Is(err, camunda7.ErrInvalidArgument):
		return failure.Classify(failure.Permanent(fmt.Errorf("%s refused before sending: %w", op, err))), true
	case errors.Is(err, camunda7.ErrThrottled):
		return failure.Classify(fmt.Errorf("%s throttled by the engine or a proxy: %w", op, err)), true
	case errors.As(err, &ee) && ee.StatusCode >= 500 && !errors.Is(err, camunda7.ErrOptimisticLock):
		return failure.Classify(fmt.Errorf("%s rejected by the engine: %w", op, err)), true
	case errors.As(err, &ee) && ee.StatusCode >= 400 && ee.StatusCode < 500:
		return failure.Classify(failure.Permanent(fmt.Errorf("%s refused by the engine: %w", op, err))), true
	}
	return failure.Classification{}, false
}

// taskGone tells Config.OnTaskGone about a task that answered 404 if the engine's history
// shows it was deleted (cancelled) rather than completed by another worker.
func (w *Worker) taskGone(ctx context.Context, task *Task, cause error, log *slog.Logger) {
	if w.cfg.OnTaskGone == nil {
		return
	}
	ctx = context.WithoutCancel(ctx)
	qctx, cancel := context.WithTimeout(ctx, w.cfg.ReportTimeout)
	defer cancel()
	entries, err := w.c.ExternalTaskLog(qctx, url.Values{"externalTaskId": {task.ID()}})
	if err != nil {
		log.Warn("task gone; cannot tell from the engine's history whether it was cancelled", slog.Any("error", err))
		return
	}
	deleted := false
	for _, e := range entries {
		if e.SuccessLog {
			return // completed (by another worker after this one's lock expired): not cancelled
		}
		deleted = deleted || e.DeletionLog
	}
	if !deleted {
		return // no history (history level none) or not deleted: nothing proves a cancellation
	}
	w.cfg.OnTaskGone(ctx, Gone{TaskID: task.ID(), ProcessInstanceID: task.ProcessInstanceID(), Topic: task.Topic(), BusinessKey: task.BusinessKey(),
		Reason: fmt.Sprintf("the engine cancelled task %s (deleted in its history; %v)", task.ID(), cause)})
}
