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
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/internal/failpoint"
	"github.com/extworker/extworker/lockext"
)

// maxErrorMessage keeps errorMessage under the engine's 666-character column.
const maxErrorMessage = 600

// report turns one outcome into one engine call: the only place that does. Reports use
// their own context (never the handler's, which may be cancelled), their own timeout,
// resend only what certainly did not arrive, and resolve a lost answer by asking the
// engine, never by running the handler again. It returns what it told the Observer:
// the outcome (completed, bpmn-error, retryable, incident, deferred, lock-lost,
// report-failed, ...) and the failure's classification ("" for none).
func (w *Worker) report(workCtx context.Context, t *topic, task *Task, o failure.Classification, vars camunda7.Variables, took time.Duration, log *slog.Logger) (string, string) {
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
		switch {
		case o.KeepRetries:
			outcome, class = "deferred", "deferred"
		case left == 0:
			outcome = "incident"
		}
		attrs = append(attrs, slog.String("classification", class), slog.Int("retries_left", left),
			slog.Duration("retry_timeout", delay), slog.String("error", errorText(o)))
	}

	if o.Kind == failure.KindNone {
		failpoint.Inject(failpoint.BeforeComplete)
	}
	err := w.deliver(ctx, id, send, log)
	if o.Kind == failure.KindNone || o.Kind == failure.KindBPMNError {
		if fo, ok := refusedReport(op, err); ok {
			// The engine answered and will answer the same again: report a failure instead,
			// so the task shows in Cockpit rather than cycling through lock expiries.
			log.Warn("the engine refused the report; reporting a failure instead", slog.String("refused", op), slog.Any("error", err))
			return w.report(workCtx, t, task, fo, nil, took, log)
		}
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
		return observed, class
	}
	switch {
	case o.Kind == failure.KindNone:
		w.stats.Completed.Add(1)
	case o.Kind == failure.KindBPMNError:
		w.stats.BPMNErrors.Add(1)
	case outcome == "incident":
		w.stats.Incidents.Add(1)
	case outcome == "deferred":
		w.stats.Deferred.Add(1)
	default:
		w.stats.Failures.Add(1)
	}
	w.obs.Handled(task.Topic(), outcome, class, took)
	level := slog.LevelInfo
	if outcome == "incident" {
		level = slog.LevelWarn
	}
	log.LogAttrs(ctx, level, "task handled", append(attrs, slog.String("outcome", outcome))...)
	return outcome, class
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

// describeFailure renders errorMessage and errorDetails in the one format operators read
// in Cockpit (documented in the package doc): a one-line message, and details as
// "key: value" lines followed by the error and, for a panic, its stack.
func describeFailure(workerID string, t *topic, task *Task, o failure.Classification, left int, delay time.Duration) (string, string) {
	if o.KeepRetries {
		return describeDeferral(workerID, task, o, left, delay)
	}
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
	taskLines(line, workerID, task)
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

// describeDeferral renders a deferred attempt (failure.Deferred: another live attempt
// owns the work, say): not a failure, so no attempt count and no retry spent; the task
// comes back after delay with its retries unchanged.
func describeDeferral(workerID string, task *Task, o failure.Classification, left int, delay time.Duration) (string, string) {
	msg := truncate(strings.ReplaceAll(fmt.Sprintf("deferred: %s (not a failure: retries unchanged at %d, trying again in %v)",
		errorText(o), left, delay), "\n", " "), maxErrorMessage)
	var b strings.Builder
	line := func(k, v string) { fmt.Fprintf(&b, "%s: %s\n", k, v) }
	line("extworker", "failure report v1")
	line("classification", "deferred")
	line("retries left", fmt.Sprintf("%d (unchanged), next attempt in %v", left, delay))
	taskLines(line, workerID, task)
	line("operator action", "none: the task waits for work in progress elsewhere and comes back by itself")
	b.WriteString("\nreason: ")
	b.WriteString(errorText(o))
	return msg, b.String()
}

// taskLines writes the lines that name the task, shared by every report.
func taskLines(line func(k, v string), workerID string, task *Task) {
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
}

func errorText(o failure.Classification) string {
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
