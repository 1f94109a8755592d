package tasks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sethvargo/go-retry"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failpoint"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/lockext"
)

// maxErrorMessage keeps errorMessage under the engine's 666-character column.
const maxErrorMessage = 600

// report turns one outcome into one engine call: the only place that does. Reports use
// their own context (never the handler's, which may be cancelled), their own timeout,
// resend only what certainly did not arrive, and resolve a lost answer by asking the
// engine, never by running the handler again.
func (w *Worker) report(workCtx context.Context, t *topic, task *Task, o failure.Outcome, vars camunda7.Variables, took time.Duration, log *slog.Logger) {
	ctx := context.WithoutCancel(workCtx)
	id := task.ID()
	var (
		send    func(context.Context) error
		outcome string
		op      string // the engine call, for Observer.EngineError
		class   string // the failure's classification, for Observer.Handled
		attrs   []slog.Attr
	)
	if o.Kind == failure.KindBPMNError {
		bv, err := toVariables(o.Variables)
		if err != nil {
			// A BPMN error whose variables cannot be sent is a bug in the handler.
			o = failure.Classify(failure.Permanent(fmt.Errorf("BPMN error %q: %w", o.Code, err)))
		} else {
			send = func(ctx context.Context) error {
				return w.c.BPMNError(ctx, id, camunda7.BPMNErrorRequest{WorkerID: w.cfg.WorkerID, ErrorCode: o.Code, ErrorMessage: o.Message, Variables: bv})
			}
			outcome, op = "bpmn-error", "bpmn_error"
			attrs = append(attrs, slog.String("error_code", o.Code))
		}
	}
	switch o.Kind {
	case failure.KindNone:
		send = func(ctx context.Context) error {
			return w.c.Complete(ctx, id, camunda7.CompleteRequest{WorkerID: w.cfg.WorkerID, Variables: vars, LocalVariables: task.localVariables()})
		}
		outcome, op = "completed", "complete"
	case failure.KindRetryable, failure.KindPermanent, failure.KindUnknownOutcome:
		left, delay := 0, time.Duration(0)
		if o.Kind == failure.KindRetryable {
			left, delay = t.opts.Retry.Next(task.Retries())
			if o.KeepRetries {
				// Deferred: waiting, not failing. The retries stay as they are (a task
				// never failed before keeps its whole budget).
				left = t.opts.Retry.MaxAttempts
				if r := task.Retries(); r != nil {
					left = max(*r, 1)
				}
				if delay == 0 {
					delay = t.opts.Retry.InitialDelay
				}
			}
			if left > 0 && o.RetryDelay > 0 {
				delay = o.RetryDelay
			}
		}
		msg, details := describeFailure(w.cfg.WorkerID, t, task, o, left, delay)
		send = func(ctx context.Context) error {
			if left > 0 && delay > 0 {
				w.holdForRetry(id, delay)
			}
			return w.c.Failure(ctx, id, camunda7.FailureRequest{WorkerID: w.cfg.WorkerID, ErrorMessage: msg, ErrorDetails: details, Retries: left, RetryTimeout: delay})
		}
		outcome, op, class = o.Kind.String(), "failure", o.Kind.String()
		if left == 0 {
			outcome = "incident"
		}
		attrs = append(attrs, slog.String("classification", o.Kind.String()), slog.Int("retries_left", left),
			slog.Duration("retry_timeout", delay), slog.String("error", errorText(o)))
	}

	if o.Kind == failure.KindNone {
		failpoint.Inject(failpoint.BeforeComplete)
	}
	err := w.deliver(ctx, id, send, log)
	var ee *camunda7.Error
	if err != nil && o.Kind == failure.KindNone && errors.As(err, &ee) && ee.StatusCode >= 500 && !errors.Is(err, camunda7.ErrOptimisticLock) {
		// The engine rolled the completion back (e.g. a following synchronous step threw):
		// the task is still ours. Report it as a retryable failure so it shows in Cockpit.
		log.Warn("complete rejected by the engine; reporting a failure instead", slog.Any("error", err))
		w.report(workCtx, t, task, failure.Classify(fmt.Errorf("complete rejected by the engine: %w", err)), nil, took, log)
		return
	}
	attrs = append(attrs, slog.Duration("took", took))
	if err != nil {
		w.stats.ReportErrors.Add(1)
		level := slog.LevelError
		observed := "report-failed"
		if lockext.LostAnswer(err) {
			w.stats.LockLost.Add(1)
			level = slog.LevelWarn
			observed = "lock-lost"
			w.obs.LockLost(task.Topic(), lockLostReason(err))
		} else {
			w.obs.EngineError(op, err)
		}
		w.obs.Handled(task.Topic(), observed, class, took)
		log.LogAttrs(ctx, level, "reporting the result failed", append(attrs, slog.String("outcome", outcome), slog.Any("report_error", err))...)
		if errors.Is(err, camunda7.ErrTaskGone) {
			w.taskGone(ctx, task, err, log)
		}
		return
	}
	switch {
	case o.Kind == failure.KindNone:
		w.stats.Completed.Add(1)
	case o.Kind == failure.KindBPMNError:
		w.stats.BPMNErrors.Add(1)
	case outcome == "incident":
		w.stats.Incidents.Add(1)
	default:
		w.stats.Failures.Add(1)
	}
	w.obs.Handled(task.Topic(), outcome, class, took)
	level := slog.LevelInfo
	if outcome == "incident" {
		level = slog.LevelWarn
	}
	log.LogAttrs(ctx, level, "task handled", append(attrs, slog.String("outcome", outcome))...)
}

// deliver sends a report, resending what certainly did not arrive and resolving a lost
// answer by asking the engine. Resending a report is safe: a second complete or
// bpmnError finds the task gone (404), a second failure sets the same values.
func (w *Worker) deliver(ctx context.Context, id string, send func(context.Context) error, log *slog.Logger) error {
	return retry.Do(ctx, w.reportBackoff(), func(ctx context.Context) error {
		rctx, cancel := context.WithTimeout(ctx, w.cfg.ReportTimeout)
		w.changes.Add(1)
		err := send(rctx)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, camunda7.ErrNotSent), errors.Is(err, camunda7.ErrOptimisticLock):
			return retry.RetryableError(err)
		case errors.Is(err, camunda7.ErrOutcomeUnknown):
			return w.resolve(ctx, id, err, log)
		}
		return err
	})
}

// resolve finds out what became of a report whose answer was lost.
func (w *Worker) resolve(ctx context.Context, id string, sendErr error, log *slog.Logger) error {
	rctx, cancel := context.WithTimeout(ctx, w.cfg.ReportTimeout)
	defer cancel()
	t, err := w.c.ExternalTask(rctx, id)
	switch {
	case errors.Is(err, camunda7.ErrTaskGone):
		log.Info("report answer was lost; the task is gone, so the report took effect", slog.Any("lost_answer", sendErr))
		return nil
	case err != nil:
		return retry.RetryableError(fmt.Errorf("%w; asking the engine failed too: %w", sendErr, err))
	case t.WorkerID == w.cfg.WorkerID:
		return retry.RetryableError(sendErr) // still ours: sending again is safe
	default:
		return fmt.Errorf("%w; the task is now locked by %q", sendErr, t.WorkerID)
	}
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

// describeFailure renders errorMessage and errorDetails in the one format operators read
// in Cockpit (documented in the package doc): a one-line message, and details as
// "key: value" lines followed by the error and, for a panic, its stack.
func describeFailure(workerID string, t *topic, task *Task, o failure.Outcome, left int, delay time.Duration) (string, string) {
	msg := fmt.Sprintf("%s: %s", o.Kind, errorText(o))
	if left > 0 {
		msg += fmt.Sprintf(" (attempt %d of %d, retrying in %v)", task.Attempt(), t.opts.Retry.MaxAttempts, delay)
	} else if o.Kind == failure.KindRetryable {
		msg += fmt.Sprintf(" (attempt %d of %d, retries exhausted)", task.Attempt(), t.opts.Retry.MaxAttempts)
	}
	msg = truncate(strings.ReplaceAll(msg, "\n", " "), maxErrorMessage)

	var b strings.Builder
	line := func(k, v string) { fmt.Fprintf(&b, "%s: %s\n", k, v) }
	line("extworker", "failure report v1")
	line("classification", o.Kind.String())
	line("attempt", fmt.Sprintf("%d of %d", task.Attempt(), t.opts.Retry.MaxAttempts))
	if left > 0 {
		line("retries left", fmt.Sprintf("%d, next attempt in %v", left, delay))
	} else {
		line("retries left", "0: incident raised")
	}
	line("worker", workerID)
	line("topic", task.Topic())
	line("external task", task.ID())
	line("process instance", task.ProcessInstanceID())
	line("process definition", task.ProcessDefinitionKey())
	line("activity", task.ActivityID())
	if bk := task.BusinessKey(); bk != "" {
		line("business key", bk)
	}
	line("reported at", time.Now().UTC().Format(time.RFC3339Nano))
	switch o.Kind {
	case failure.KindUnknownOutcome:
		line("operator action", "the side effect may or may not have happened: check with the provider before retrying (set retries > 0 to run the handler again)")
	case failure.KindPermanent:
		line("operator action", "fix the cause, then set retries > 0 to run the handler again")
	case failure.KindRetryable:
		if left == 0 {
			line("operator action", "retries exhausted: fix the cause, then set retries > 0")
		}
	}
	b.WriteString("\nerror: ")
	b.WriteString(errorText(o))
	b.WriteString("\nerror chain:")
	for e := o.Err; e != nil; e = errors.Unwrap(e) {
		fmt.Fprintf(&b, "\n  %s", reflect.TypeOf(e))
	}
	if o.Panic != nil {
		b.WriteString("\n\npanic stack:\n")
		b.Write(o.Panic.Stack)
	}
	return msg, b.String()
}

func errorText(o failure.Outcome) string {
	if o.Err != nil {
		return o.Err.Error()
	}
	return o.Message
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// toVariables converts BPMN error variables (failure is standard-library only, so it
// carries plain values) into typed engine variables. A camunda7.Variable passes as is.
func toVariables(in map[string]any) (camunda7.Variables, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := camunda7.Variables{}
	for k, v := range in {
		var err error
		switch x := v.(type) {
		case camunda7.Variable:
			out[k] = x
		case nil:
			out[k] = camunda7.NullVar()
		case string:
			out[k] = camunda7.StringVar(x)
		case bool:
			out[k] = camunda7.BoolVar(x)
		case int:
			out[k] = camunda7.LongVar(int64(x))
		case int32:
			out[k] = camunda7.IntegerVar(x)
		case int64:
			out[k] = camunda7.LongVar(x)
		case float64:
			out[k] = camunda7.DoubleVar(x)
		case time.Time:
			out[k] = camunda7.DateVar(x)
		case []byte:
			out[k] = camunda7.BytesVar(x)
		default:
			out[k], err = camunda7.JSONVar(x)
		}
		if err != nil {
			return nil, fmt.Errorf("variable %q: %w", k, err)
		}
	}
	return out, nil
}
