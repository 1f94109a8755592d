package tasks

import "time"

// Outcome is what became of a task this worker started: one word, the same in the
// "task handled" log record (field outcome), the metrics (label outcome of
// extworker_tasks_handled_total), the task's trace (attribute extworker.outcome) and
// taskstest's Result. Its String is that word.
type Outcome string

// The outcomes of a task, each the word logs, metrics and traces carry.
const (
	// OutcomeCompleted: the engine accepted the completion.
	OutcomeCompleted Outcome = "completed"
	// OutcomeBPMNError: the engine accepted the BPMN error (the model's error path).
	OutcomeBPMNError Outcome = "bpmn-error"
	// OutcomeRetryable: a failure reported with retries left.
	OutcomeRetryable Outcome = "retryable"
	// OutcomeIncident: a failure reported with retries 0, which raises an incident.
	OutcomeIncident Outcome = "incident"
	// OutcomeDeferred: the attempt waits for work in progress elsewhere
	// (failure.Deferred): reported with the retries unchanged; not a failure.
	OutcomeDeferred Outcome = "deferred"
	// OutcomeUnlocked: the worker handed the task back without a result (at shutdown, or
	// when its lock could not be kept).
	OutcomeUnlocked Outcome = "unlocked"
	// OutcomeLockLost: the engine said the lock is no longer this worker's, before, while
	// or after the handler ran: nothing was (or could be) reported.
	OutcomeLockLost Outcome = "lock-lost"
	// OutcomeReportFailed: the report did not reach the engine (given up after
	// Config.ReportRetryFor).
	OutcomeReportFailed Outcome = "report-failed"
)

// Outcomes lists every outcome, in the order above.
func Outcomes() []Outcome {
	return []Outcome{OutcomeCompleted, OutcomeBPMNError, OutcomeRetryable, OutcomeIncident, OutcomeDeferred,
		OutcomeUnlocked, OutcomeLockLost, OutcomeReportFailed}
}

// String returns the outcome's word.
func (o Outcome) String() string { return string(o) }

// Failed reports whether the outcome is a failure: the task did not get its result, or
// got a failure. A BPMN error is a business outcome, a deferral waits for work
// elsewhere, an unlock hands the task back: none is a failure.
func (o Outcome) Failed() bool {
	switch o {
	case OutcomeCompleted, OutcomeBPMNError, OutcomeDeferred, OutcomeUnlocked, "":
		return false
	}
	return true
}

// ended is the one event of a task's end: the worker's Stats and its Observer are both
// fed from it (Worker.finish), and the log record and the trace carry the same outcome.
type ended struct {
	topic   string
	outcome Outcome
	class   string // the failure's classification, "" for none
	took    time.Duration
	// reportFailed: a report was sent and did not get through (outcome report-failed, or
	// lock-lost found by the report).
	reportFailed bool
}

// finish records a task's end once: in Stats and through the Observer.
func (w *Worker) finish(e ended) {
	w.stats.count(e)
	w.obs.Handled(e.topic, e.outcome, e.class, e.took)
}

// count adds a task's end to the counters.
func (s *Stats) count(e ended) {
	if e.reportFailed {
		s.ReportErrors.Add(1)
	}
	switch e.outcome {
	case OutcomeCompleted:
		s.Completed.Add(1)
	case OutcomeBPMNError:
		s.BPMNErrors.Add(1)
	case OutcomeRetryable:
		s.Failures.Add(1)
	case OutcomeIncident:
		s.Incidents.Add(1)
	case OutcomeDeferred:
		s.Deferred.Add(1)
	case OutcomeLockLost:
		s.LockLost.Add(1)
	}
}
