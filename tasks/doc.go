// Package tasks is the worker runtime: topic handlers, the registry that maps topics to
// them, the fetch loop that locks only as many tasks as it can start, and the one place
// that turns a handler's outcome into an engine call.
//
// # Writing a handler
//
// A handler binds its input from the task's variables into a struct (Task.Bind, by the
// fields' var tags), and the topic fetches exactly those variables (VariablesOf):
//
//	type collectIn struct {
//		InvoiceID string `var:"invoiceId"`
//		Amount    int64  `var:"amountCents"`
//		Note      string `var:"note,optional"`
//	}
//
//	reg := tasks.NewRegistry()
//	err := reg.Register("collect-payment", func(ctx context.Context, t *tasks.Task) (camunda7.Variables, error) {
//		var in collectIn
//		if err := t.Bind(&in); err != nil {
//			return nil, err // bad input: a permanent error, an incident naming the variable
//		}
//		ref, err := charge(ctx, t.BusinessKey(), in.Amount)
//		switch {
//		case errors.Is(err, errDeclined):
//			return nil, failure.BPMNError("PAYMENT_DECLINED", "card declined", nil)
//		case err != nil:
//			return nil, err // retryable, by the topic's retry policy
//		}
//		return camunda7.Variables{"paymentRef": camunda7.StringVar(ref)}, nil
//	}, tasks.TopicOptions{LockDuration: time.Minute, Variables: tasks.VariablesOf[collectIn](), MaxConcurrency: 4})
//
//	w, err := tasks.New(client, reg, tasks.Config{MaxConcurrency: 16, Logger: logger})
//	err = w.Run(ctx) // until ctx ends; then drains
//
// Bind reads strings, booleans, integers (within the field's range), floats, time.Time
// (Date), []byte (Bytes), and Json variables into structs, maps and slices; `,optional`
// lets a variable be missing or null. Its error lists every variable that is missing or
// does not fit, without their values, and is marked failure.Permanent. The typed
// accessors of Variables() (String, Long, JSON, ...) remain for handlers that read
// variables one by one.
//
// TopicOptions carries every fetch setting of camunda7.FetchTopic (the variables, the
// filters on business key, process definition, version tag, tenant and process
// variables, DeserializeValues, IncludeExtensionProperties) under the same names, and
// passes them to fetchAndLock unchanged.
//
// # Testing a handler
//
// Package taskstest runs a handler against a task with no engine: through this package's
// real Registry and Worker, over an in-memory engine, so that the result is what
// production would report (retries by the topic's policy, classification, recovered
// panics, errorMessage and errorDetails) and what the handler was given (only the
// variables the topic fetches):
//
//	res := taskstest.Run(t, collect, taskstest.Task{Topic: "collect-payment", BusinessKey: "B-1",
//		Variables: camunda7.Variables{"invoiceId": camunda7.StringVar("INV-1"), "amountCents": camunda7.LongVar(1200)}},
//		collectOptions)
//	// res.Completed.Variables, res.BPMNError.Code, res.Failure.Retries, res.Outcome ...
//
// # The engine
//
// A Worker makes its engine calls through Engine: fetchAndLock, complete, failure,
// bpmnError, unlock, extendLock and lock (lockext.Locker), and the task and history
// queries it needs to resolve lost answers and orphaned locks. *camunda7.Client
// implements it for a real engine, taskstest.Engine in memory.
//
// # How a task travels
//
//  1. Fetch: one fetchAndLock long poll for all topics asks for as many tasks as there
//     are free slots, globally and per topic; it never locks a task it cannot start.
//     A freed slot triggers the next poll. Fetch errors back off with jitter, logged
//     once when they start and once when they end; an empty result is not an error.
//  2. Run: each task gets a slot and a lockext extender that renews its lock, counted
//     from when the fetch was sent on the local monotonic clock. One lockext.Scheduler
//     per worker sends every task's extensions (Config.LockExtension), spread and paced,
//     so a task in flight costs its handler's goroutine and no goroutine or timer more. A task handed over late
//     in a long poll, with little of that local lock left, is extended before its handler
//     starts. The handler's context ends if the engine says the lock is lost
//     (context.Cause is a *lockext.LockLostError; the local clock never decides that), the
//     topic's MaxRunTime passes (lockext.ErrMaxRunTime), or the worker's shutdown grace
//     runs out (ErrShutdown). A panic is recovered and reported as a failure with its
//     stack.
//  3. Report: the outcome (package failure) becomes exactly one call: complete;
//     bpmnError; failure with retries counted down from the topic's RetryPolicy (the
//     engine sends retries null until the first failure); or failure with retries 0, an
//     incident, for permanent errors, exhausted retries and unknown outcomes (an unknown
//     outcome is never retried blindly); a deferred attempt (failure.Deferred) is
//     reported with its retries unchanged, as outcome deferred. Reports use their own
//     timeout, resend what certainly did not arrive (or was throttled, honouring
//     Retry-After, or met a 404 that is not the engine's answer about the task, such as
//     a proxy's page while the engine is redeployed: only the engine's own "does not
//     exist" drops a result as lock-lost) and resolve a lost answer by asking the
//     engine, for up to Config.ReportRetryFor, so a report outlasts an engine restart
//     or redeploy; the lock is kept
//     alive and the task is not run again meanwhile. A complete the engine refuses (4xx)
//     becomes an incident with the engine's message; one it rolls back (5xx), a
//     retryable failure.
//  4. Release: the extender stops, the slot frees, the loop polls again.
//
// At shutdown the worker stops polling but waits for a long poll pending on the engine
// (which would otherwise go on locking tasks for a worker that is gone) and unlocks what
// it returns. A handler cancelled by shutdown has its task unlocked, so another worker
// takes it at once without spending a retry; Config.ShutdownTimeout bounds it all. A result whose lock was taken by another worker is
// dropped (the other worker owns the task now).
//
// # Log fields
//
// Every record about a task carries worker_id, topic, external_task_id,
// process_instance_id, process_definition_key, activity_id, business_key and attempt;
// records about its result add outcome (an Outcome: completed, bpmn-error, retryable,
// incident, deferred, unlocked, lock-lost, report-failed) and, for failures,
// classification, retries_left, retry_timeout and error.
//
// A handler's context carries the task's logger: Logger(ctx) returns it, and
// AddLogAttrs(ctx, ...) adds fields to every later record about the task, including the
// final one. The effect ledger uses both (idempotency.Hooks) so that its records carry
// the task's fields and the task's records name idempotency_scope, idempotency_key and
// ledger_state.
//
// # Metrics
//
// Config.Observer receives fetches, outcomes, slot changes, lock extensions, lost locks
// and engine errors; package metrics implements it on Prometheus. A task's end is one
// event: the Observer's Handled and Worker.Stats are both fed from it, with the same
// Outcome the log record and the task's span carry.
//
// # Traces
//
// The worker traces every task through OpenTelemetry's global TracerProvider, which
// does nothing until a program installs one (package extworker does, when the standard
// OTEL_* variables ask for traces). Each task is a trace of its own:
//
//	task <topic>        from the handling of a fetched task to the end of its report
//	  handler           the handler's call; its ctx carries the span, so the handler's
//	                    own spans (and the effect ledger's) nest under it
//	  report            complete, failure or bpmnError, resends included
//	    camunda7 ...    the engine calls (package camunda7), here and for the lock's
//	                    extensions under the task's span
//
// The task's span carries camunda.topic, camunda.process_definition_key,
// camunda.activity_id, camunda.process_instance_id, camunda.external_task_id,
// extworker.worker_id, extworker.attempt and extworker.outcome (as in the records
// above); a failure sets its status to Error, described by the failure's kind only
// (retryable, permanent, unknown-outcome, lock-lost, report-failed). No span carries
// the business key, a variable's value or an error's text.
//
// # errorMessage and errorDetails
//
// A failure's errorMessage is one line, at most 600 characters (the engine keeps 666):
// "<classification>: <error> (attempt N of M, retrying in D)". Its errorDetails, shown in
// Cockpit, start with "key: value" lines (extworker: failure report v1, classification,
// attempt, retries left, worker, topic, external task, process instance, process
// definition, activity, business key, reported at, operator action), then "error:", the
// Go types of the error chain, and for a panic the stack.
package tasks
