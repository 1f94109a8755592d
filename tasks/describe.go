package tasks

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/extworker/extworker/failure"
)

// maxErrorMessage keeps errorMessage under the engine's 666-character column.
const maxErrorMessage = 600

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
