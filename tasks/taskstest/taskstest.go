// Package taskstest runs a handler against a task without an engine, and reports the
// outcome for a test to assert on. It drives the real tasks.Registry and tasks.Worker,
// over an in-memory engine (Engine), so everything between the handler and the engine
// behaves as in production: the topic's fetch (which variables the handler gets, which
// tasks its filters take), failure classification, retries counted down by the topic's
// RetryPolicy, recovered panics, the errorMessage and errorDetails operators read in
// Cockpit, MaxRunTime.
//
//	func TestCollectPayment(t *testing.T) {
//		res := taskstest.Run(t, collectPayment, taskstest.Task{
//			Topic:       "collect-payment",
//			BusinessKey: "order-7",
//			Variables: camunda7.Variables{
//				"invoiceId":   camunda7.StringVar("INV-1"),
//				"amountCents": camunda7.LongVar(1200),
//			},
//		}, collectOptions) // the TopicOptions the handler is registered with
//
//		require.NotNil(t, res.Completed, "outcome %s: %v", res.Outcome, res.Failure)
//		ref, err := res.Completed.Variables.String("paymentRef")
//		...
//	}
//
// The Result has exactly one of Completed, BPMNError and Failure set (none when the
// worker handed the task back, or never reported: see Outcome), plus what the handler was
// given: Fetch, the topic as fetchAndLock asked for it, and Fetched, the variables the
// handler could read.
//
// Run and RunRegistry fail the test only when the task cannot be handled at all (the
// registry does not fetch it, or the handler is still running when the test's deadline
// nears); the worker's log records go to t.Log. Handle is the same for code without a
// testing.TB, such as examples.
//
// Each call handles one delivery of one task. To test a later attempt, set Task.Retries
// to what the engine would hold (after the first failure of a three-attempt policy, 2)
// and Task.ErrorMessage to the last failure's message.
package taskstest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/tasks"
)

// Task is an external task as the engine would hold it. Only Topic is required; the
// identifiers the engine always has (ID, process instance, definition, activity,
// execution) are made up when left empty.
type Task struct {
	// Topic is the task's topic. Required.
	Topic string
	// ID is the external task id. Default "task-<n>".
	ID string
	// BusinessKey is the process instance's business key.
	BusinessKey string
	// Variables are the variables visible from the task (the process instance's), as
	// the process holds them; fetchAndLock gives the handler those the topic asks for.
	Variables camunda7.Variables
	// LocalVariables are variables local to the task's execution (input mappings). They
	// are visible too, hiding process variables of the same name; a topic with
	// LocalVariables set gets only these.
	LocalVariables camunda7.Variables
	// Retries is the engine's retries field: nil until a failure was reported. A task
	// with retries 0 has an incident, and is never fetched.
	Retries *int
	// ErrorMessage and ErrorDetails are those of the last reported failure.
	ErrorMessage, ErrorDetails string
	// ExtensionProperties are the service task's camunda:properties, sent when the topic
	// sets IncludeExtensionProperties.
	ExtensionProperties map[string]string

	ProcessInstanceID           string // default "process-instance-<n>"
	ProcessDefinitionKey        string // default "process"
	ProcessDefinitionID         string // default "<key>:1:definition"
	ProcessDefinitionVersionTag string
	ActivityID                  string // default "Activity_<topic>"
	ExecutionID                 string // default "execution-<n>"
	TenantID                    string
	Priority                    int64
}

// Result is what became of a task.
type Result struct {
	// Outcome is what became of it, as the worker's "task handled" record, its metrics
	// and its trace say (tasks.OutcomeCompleted, ...). Empty from Engine.Result.
	Outcome tasks.Outcome
	// Classification is the failure's classification: retryable, permanent,
	// unknown-outcome or deferred; "" when the task did not fail. Empty from
	// Engine.Result.
	Classification string

	// Completed is set when the task was completed.
	Completed *Completed
	// BPMNError is set when the handler threw a BPMN error.
	BPMNError *BPMNError
	// Failure is the last failure reported: retryable (retries left), an incident
	// (retries 0) or deferred.
	Failure *Failure
	// Unlocked is set when the worker handed the task back without a result (at
	// shutdown, say).
	Unlocked bool

	// Fetch is the topic as the fetch that locked the task asked for it: its variables,
	// its filters, its lock duration.
	Fetch camunda7.FetchTopic
	// Fetched are the variables the handler was given, and so the only ones it could
	// read: those Fetch asked for, as the engine sends them (File variables without
	// their content).
	Fetched camunda7.Variables
	// Deliveries counts the fetches that locked the task.
	Deliveries int
}

// Completed is a completion: the variables set on the process, and those set on the
// task's own execution (Task.SetLocalVariable).
type Completed struct {
	Variables      camunda7.Variables
	LocalVariables camunda7.Variables
}

// BPMNError is a BPMN error thrown from the task (failure.BPMNError), with its
// variables as they were sent.
type BPMNError struct {
	Code      string
	Message   string
	Variables camunda7.Variables
}

// Failure is a reported failure, as Cockpit shows it.
type Failure struct {
	// Message is the errorMessage: "<classification>: <error> (attempt N of M, ...)".
	Message string
	// Details is the errorDetails: "key: value" lines, the error, its Go types, and for
	// a panic the stack.
	Details string
	// Retries is the retries left; 0 raises an incident.
	Retries int
	// RetryTimeout is how long the task waits before it is fetched again.
	RetryTimeout time.Duration
}

// Incident reports whether the failure raised an incident (no retries left).
func (f *Failure) Incident() bool { return f != nil && f.Retries == 0 }

// Run registers h for task.Topic with opts (at most one; without it, the topic fetches
// every variable) and handles the task once, as RunRegistry does. Pass the TopicOptions
// the handler is registered with in production to test what it gets there: which
// variables (TopicOptions.Variables), which retries (TopicOptions.Retry).
func Run(t testing.TB, h tasks.Handler, task Task, opts ...tasks.TopicOptions) Result {
	t.Helper()
	reg, err := registry(h, task, opts)
	if err != nil {
		t.Fatal(err)
	}
	return RunRegistry(t, reg, task)
}

// RunRegistry handles the task once with the registry's handler for task.Topic, through
// a tasks.Worker over a new Engine, and returns the result. The worker's log records go
// to t.Log. It fails the test if the registry does not fetch the task (no such topic, or
// a filter excludes it: the message says which) or if the handler is still running
// shortly before the test's deadline.
func RunRegistry(t testing.TB, reg *tasks.Registry, task Task) Result {
	t.Helper()
	ctx := context.Background()
	if dl, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if d, ok := dl.Deadline(); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, d.Add(-min(5*time.Second, time.Until(d)/10)))
			defer cancel()
		}
	}
	w := &tbWriter{t: t}
	defer w.close()
	logger := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	res, err := NewEngine().handle(ctx, reg, task, logger)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// Handle is RunRegistry for code without a testing.TB: it returns an error instead of
// failing a test, discards the worker's log, and gives up when ctx ends.
func Handle(ctx context.Context, reg *tasks.Registry, task Task) (Result, error) {
	return NewEngine().Handle(ctx, reg, task)
}

// Handle adds the task to e and handles it once, as the package's Handle does, with a
// worker of its own. Use it when the handler needs the engine itself; e should hold no
// other task the registry fetches.
func (e *Engine) Handle(ctx context.Context, reg *tasks.Registry, task Task) (Result, error) {
	return e.handle(ctx, reg, task, slog.New(slog.DiscardHandler))
}

func registry(h tasks.Handler, task Task, opts []tasks.TopicOptions) (*tasks.Registry, error) {
	if len(opts) > 1 {
		return nil, fmt.Errorf("taskstest.Run: at most one TopicOptions, got %d", len(opts))
	}
	o := tasks.TopicOptions{AllVariables: true}
	if len(opts) == 1 {
		o = opts[0]
	}
	reg := tasks.NewRegistry()
	if err := reg.Register(task.Topic, h, o); err != nil {
		return nil, fmt.Errorf("taskstest.Run: %w", err)
	}
	return reg, nil
}

// Shutdown bounds of the worker Handle runs: a handler still running when ctx ends is
// cancelled (tasks.ErrShutdown) after handleGrace.
const (
	handleGrace   = time.Second
	handleTimeout = 5 * time.Second
)

func (e *Engine) handle(ctx context.Context, reg *tasks.Registry, task Task, logger *slog.Logger) (Result, error) {
	if reg == nil {
		return Result{}, errors.New("taskstest: nil registry")
	}
	if task.Retries != nil && *task.Retries <= 0 {
		return Result{}, fmt.Errorf("taskstest: task with retries %d: it has an incident, and the engine does not hand it out", *task.Retries)
	}
	id, err := e.add(task, true)
	if err != nil {
		return Result{}, err
	}
	watch := e.watch(id)
	obs := &observer{handled: make(chan handled, 1)}
	workerID := "taskstest-worker-" + id
	w, err := tasks.New(e, reg, tasks.Config{WorkerID: workerID, MaxConcurrency: 1, Logger: logger, Observer: obs,
		ShutdownGrace: handleGrace, ShutdownTimeout: handleTimeout})
	if err != nil {
		return Result{}, fmt.Errorf("taskstest: %w", err)
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()

	var (
		h       handled
		failErr error
		runErr  error
		ran     bool
	)
	select {
	case h = <-obs.handled:
	case why := <-watch.mismatch:
		failErr = fmt.Errorf("taskstest: the registry does not fetch task %s of topic %q: %s", id, task.Topic, why)
	case <-ctx.Done():
		failErr = fmt.Errorf("taskstest: task %s of topic %q not handled when the context ended (%w); is the handler waiting for something that never happens?",
			id, task.Topic, context.Cause(ctx))
	case runErr = <-done:
		ran = true
	}
	stop()
	e.release(workerID) // a pending long poll answers at once
	if !ran {
		runErr = <-done
	}
	if h.outcome == "" {
		select {
		case h = <-obs.handled: // handled during the shutdown (unlocked, say)
		default:
		}
	}
	res, _ := e.Result(id)
	res.Outcome, res.Classification = h.outcome, h.class
	switch {
	case failErr != nil:
		return res, failErr
	case runErr != nil:
		return res, fmt.Errorf("taskstest: the worker failed: %w", runErr)
	case h.outcome == "":
		return res, fmt.Errorf("taskstest: the worker stopped before handling task %s", id)
	}
	return res, nil
}

type handled struct {
	outcome tasks.Outcome
	class   string
}

// observer tells Handle when the worker has handled the task.
type observer struct {
	tasks.NopObserver
	handled chan handled
}

func (o *observer) Handled(_ string, outcome tasks.Outcome, class string, _ time.Duration) {
	select {
	case o.handled <- handled{outcome, class}:
	default:
	}
}

// tbWriter writes each log record to t.Log, until close (t.Log after a test has ended
// panics).
type tbWriter struct {
	mu     sync.Mutex
	t      testing.TB
	closed bool
}

var _ io.Writer = (*tbWriter)(nil)

func (w *tbWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

func (w *tbWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
}
