package tasks

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/lockext"
)

// Observer receives what the worker does, for metrics. Every method is called
// synchronously from the worker's goroutines, so implementations must be safe for
// concurrent use and quick (increment a counter, set a gauge; never block). Label values
// passed in are bounded: topics, the outcomes (Outcome), failure
// classifications and fixed operation names; never task ids or business keys.
//
// Embed NopObserver to implement only some methods. Config.Observer nil observes nothing.
type Observer interface {
	// Polled is called after every fetchAndLock: how many tasks it returned, how long it
	// took (including the long poll's wait), and its error (nil on success; a poll aborted
	// by shutdown is not reported).
	Polled(tasks int, latency time.Duration, err error)
	// Fetched is called once per task a poll returned, with the task's topic.
	Fetched(topic string)
	// Handled is called once per task this worker started, when its outcome is known
	// (one of Outcomes(), the word its log record and trace carry too); classification is
	// the failure's (retryable, permanent, unknown-outcome, deferred) for retryable,
	// incident and deferred, else ""; took is the handler's run time. It is the one
	// count of a task's end: Worker.Stats is kept from the same event.
	Handled(topic string, outcome Outcome, classification string, took time.Duration)
	// Slots is called whenever a task starts or ends: the topic's running handlers, and
	// the worker's free slots (MaxConcurrency minus all running handlers).
	Slots(topic string, inFlight, free int)
	// LockExtended is called after every extendLock call for a running task: err nil on
	// success.
	LockExtended(topic string, err error)
	// LockLost is called when a running task's lock is lost: reason "gone" (the task no
	// longer exists), "taken" (locked by another worker, or by nobody) or
	// "max-run-time". The engine says which; the local clock never declares a lock lost.
	LockLost(topic, reason string)
	// EngineError is called for every failed engine call the worker makes on its own
	// behalf: operation fetch-and-lock, complete, failure, bpmn-error, unlock,
	// extend-lock or query.
	EngineError(operation string, err error)
}

// NopObserver does nothing; embed it to implement part of Observer.
type NopObserver struct{}

var _ Observer = NopObserver{}

func (NopObserver) Polled(int, time.Duration, error)               {}
func (NopObserver) Fetched(string)                                 {}
func (NopObserver) Handled(string, Outcome, string, time.Duration) {}
func (NopObserver) Slots(string, int, int)                         {}
func (NopObserver) LockExtended(string, error)                     {}
func (NopObserver) LockLost(string, string)                        {}
func (NopObserver) EngineError(string, error)                      {}

// lockLostReason names why a lock ended, for Observer.LockLost.
func lockLostReason(cause error) string {
	switch {
	case errors.Is(cause, lockext.ErrMaxRunTime):
		return "max-run-time"
	case errors.Is(cause, camunda7.ErrTaskGone):
		return "gone"
	}
	return "taken"
}

// taskHandler is the handler of a task's logger: the worker's handler with the task's
// fields (topic, external_task_id, process_instance_id, process_definition_key,
// activity_id, business_key, attempt), which it adds only when the first record is
// written. slog's With formats the fields at once (about 1.5 KB a task with the JSON
// handler), and most tasks in flight log nothing until they are handled: with
// thousands of long-running tasks in flight that memory would be held for nothing.
type taskHandler struct {
	base slog.Handler
	task *Task
	once sync.Once
	h    slog.Handler // base with the task's fields, once built
}

func newTaskHandler(base slog.Handler, t *Task) *taskHandler {
	return &taskHandler{base: base, task: t}
}

func (h *taskHandler) get() slog.Handler {
	h.once.Do(func() {
		r := &h.task.raw
		h.h = h.base.WithAttrs([]slog.Attr{
			slog.String("topic", r.TopicName),
			slog.String("external_task_id", r.ID),
			slog.String("process_instance_id", r.ProcessInstanceID),
			slog.String("process_definition_key", r.ProcessDefinitionKey),
			slog.String("activity_id", r.ActivityID),
			slog.String("business_key", r.BusinessKey),
			slog.Int("attempt", h.task.Attempt()),
		})
	})
	return h.h
}

// Enabled asks the worker's handler: a record the level leaves out builds nothing.
func (h *taskHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.base.Enabled(ctx, l)
}

func (h *taskHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.get().Handle(ctx, r)
}

func (h *taskHandler) WithAttrs(attrs []slog.Attr) slog.Handler { return h.get().WithAttrs(attrs) }

func (h *taskHandler) WithGroup(name string) slog.Handler { return h.get().WithGroup(name) }

// taskLog is the per-task logger a handler's context carries: the worker's logger with
// every task field, plus what the handler (or the effect ledger) added with AddLogAttrs.
type taskLog struct {
	mu    sync.Mutex
	base  *slog.Logger
	extra []slog.Attr  // in order of first addition; a later value replaces an earlier one
	log   *slog.Logger // base with extra, rebuilt on change
}

type taskLogKey struct{}

func withTaskLog(ctx context.Context, l *slog.Logger) (context.Context, *taskLog) {
	tl := &taskLog{base: l, log: l}
	return context.WithValue(ctx, taskLogKey{}, tl), tl
}

func (tl *taskLog) get() *slog.Logger {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.log
}

// Logger returns the logger of the task whose handler ctx belongs to: the worker's
// logger with the task's fields (worker_id, topic, external_task_id,
// process_instance_id, process_definition_key, activity_id, business_key, attempt) and
// whatever AddLogAttrs added. Outside a handler it returns nil, so a caller can fall back
// to its own logger. Its signature fits idempotency.Config.ContextLogger.
func Logger(ctx context.Context) *slog.Logger {
	if tl, ok := ctx.Value(taskLogKey{}).(*taskLog); ok {
		return tl.get()
	}
	return nil
}

// AddLogAttrs adds fields to every later record about the task whose handler ctx belongs
// to, including the worker's "task handled" record: the effect ledger adds
// idempotency_scope, idempotency_key and ledger_state this way. A field added again
// replaces its earlier value. Outside a handler it does nothing. Its signature fits
// idempotency.Config.Annotate.
func AddLogAttrs(ctx context.Context, attrs ...slog.Attr) {
	tl, ok := ctx.Value(taskLogKey{}).(*taskLog)
	if !ok || len(attrs) == 0 {
		return
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
next:
	for _, a := range attrs {
		for i := range tl.extra {
			if tl.extra[i].Key == a.Key {
				tl.extra[i] = a
				continue next
			}
		}
		tl.extra = append(tl.extra, a)
	}
	args := make([]any, len(tl.extra))
	for i, a := range tl.extra {
		args[i] = a
	}
	tl.log = tl.base.With(args...)
}
