package tasks_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/tasks"
	"github.com/extworker/extworker/tasks/taskstest"
)

// Each task is a trace of its own: "task <topic>" from its handling to the end of its
// report, with the handler's span (which the handler's ctx carries, so the handler's own
// spans nest under it) and the report's, through the real worker (taskstest). The task's
// span names the task and its outcome; a failure is an Error described by its kind only;
// neither the business key nor a variable's value nor an error's text shows anywhere.
func TestTaskTraces(t *testing.T) {
	spans := testenv.RecordSpans(t) // global: not parallel
	const (
		businessKey = "BK-SECRET-4711"
		secretValue = "VALUE-SECRET-0815"
	)
	for _, tc := range []struct {
		name      string
		err       error  // what the handler returns
		outcome   string // extworker.outcome of the task's span
		status    string // its status description, "" for none
		handlerOK bool   // the handler's span has no Error status
	}{
		{"completed", nil, "completed", "", true},
		{"retryable", errors.New("provider timeout for " + businessKey), "retryable", "retryable", false},
		{"bpmn-error", failure.BPMNError("DECLINED", "declined: "+businessKey, nil), "bpmn-error", "", true},
		{"incident", failure.Permanent(errors.New("no amount for " + businessKey)), "incident", "permanent", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topic := testenv.Unique("trace")
			var handlerSpan trace.SpanContext
			res := taskstest.Run(t, func(ctx context.Context, task *tasks.Task) (camunda7.Variables, error) {
				handlerSpan = trace.SpanContextFromContext(ctx)
				_, own := otel.Tracer("handler-code").Start(ctx, "charge")
				own.End()
				return camunda7.Variables{"paymentRef": camunda7.StringVar("ch_1")}, tc.err
			}, taskstest.Task{Topic: topic, BusinessKey: businessKey, ProcessDefinitionKey: "invoice", ActivityID: "collectPayment",
				ProcessInstanceID: "pi-42", ID: "task-42-" + tc.name,
				Variables: camunda7.Variables{"secret": camunda7.StringVar(secretValue)}})
			require.Equal(t, tc.outcome, res.Outcome.String())

			nodes, ok := spans.Trace("task "+topic, nil)
			require.True(t, ok, "no span named %q", "task "+topic)
			t.Logf("spans:\n%s", testenv.SpanTree(nodes))
			roots := testenv.Children(nodes, "")
			require.Len(t, roots, 1, "one trace per task, rooted at its span")
			task := roots[0]
			assert.Equal(t, "task "+topic, task.Name)
			assert.Equal(t, map[string]string{
				"camunda.topic": topic, "camunda.process_definition_key": "invoice", "camunda.activity_id": "collectPayment",
				"camunda.process_instance_id": "pi-42", "camunda.external_task_id": "task-42-" + tc.name,
				"extworker.worker_id": "taskstest-worker-task-42-" + tc.name, "extworker.attempt": "1", "extworker.outcome": tc.outcome,
			}, task.Attrs)
			if tc.status == "" {
				assert.Empty(t, task.Status)
			} else {
				assert.Equal(t, "Error", task.Status)
				assert.Equal(t, tc.status, task.StatusDescription, "the failure's kind, not its message")
			}

			assert.Equal(t, []string{"handler", "report"}, testenv.Names(testenv.Children(nodes, task.ID)))
			handler := testenv.Children(nodes, task.ID)[0]
			assert.Equal(t, handler.ID, handlerSpan.SpanID().String(), "the handler's ctx carries its span")
			assert.Equal(t, []string{"charge"}, testenv.Names(testenv.Children(nodes, handler.ID)), "the handler's own spans nest under it")
			assert.Equal(t, tc.handlerOK, handler.Status == "", "handler status %q", handler.StatusDescription)
			report := testenv.Children(nodes, task.ID)[1]
			assert.Equal(t, tc.outcome, report.Attrs["extworker.outcome"])
			assert.Empty(t, report.Status, "the report got through")

			assert.Empty(t, testenv.SpanLeaks(nodes, businessKey, secretValue, "provider timeout", "declined:", "no amount"))
		})
	}
}
