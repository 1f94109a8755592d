package tasks

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/idempotency"
)

func lockedTask(workerID string) *Task {
	raw := camunda7.LockedExternalTask{ExternalTask: camunda7.ExternalTask{ID: "task-1", TopicName: "pay", ExecutionID: "ex-1",
		ProcessInstanceID: "pi-1", BusinessKey: "INV-1"}}
	return newTask(raw, workerID, 2)
}

// Intent fills the intent's TaskRef from the task (the worker id as the actor) and keeps
// scope, key and request as given; nothing of the attempt leaks into the key.
func TestTaskIntent(t *testing.T) {
	req := map[string]any{"invoice": "INV-1", "amountCents": 1999}
	in := lockedTask("worker-7").Intent("payment.collect", "invoice:INV-1:v1", req)
	assert.Equal(t, idempotency.Intent{
		Scope: "payment.collect", Key: "invoice:INV-1:v1", Request: req,
		Task: idempotency.TaskRef{Actor: "worker-7", TaskID: "task-1", ProcessInstanceID: "pi-1", BusinessKey: "INV-1"},
	}, in)

	// Another delivery of the same command (another worker, another attempt) has the same
	// scope, key and request digest: only the audit fields differ.
	again := newTask(camunda7.LockedExternalTask{ExternalTask: camunda7.ExternalTask{ID: "task-2", ProcessInstanceID: "pi-1", BusinessKey: "INV-1"}}, "worker-8", 3).
		Intent("payment.collect", "invoice:INV-1:v1", req)
	assert.Equal(t, in.Scope, again.Scope)
	assert.Equal(t, in.Key, again.Key)
	d1, err := idempotency.Digest(in.Request)
	assert.NoError(t, err)
	d2, err := idempotency.Digest(again.Request)
	assert.NoError(t, err)
	assert.Equal(t, d1, d2)
	assert.Equal(t, idempotency.TaskRef{Actor: "worker-8", TaskID: "task-2", ProcessInstanceID: "pi-1", BusinessKey: "INV-1"}, again.Task)

	// No business key: the field stays empty.
	bare := newTask(camunda7.LockedExternalTask{ExternalTask: camunda7.ExternalTask{ID: "t", ProcessInstanceID: "p"}}, "w", 1)
	assert.Equal(t, idempotency.TaskRef{Actor: "w", TaskID: "t", ProcessInstanceID: "p"}, bare.TaskRef())
}

// A handler names its side effect from the task: the key comes from business data (the
// invoice), the audit trail from the task.
func ExampleTask_Intent() {
	task := lockedTask("worker-7") // in a handler: the *Task it is given
	in := task.Intent("payment.collect", "invoice:INV-1:v1", map[string]any{"invoice": "INV-1", "amountCents": 1999})
	in.Amount = 1999 // then: out, err := ledger.Do(ctx, in, effect)
	fmt.Printf("%s %s %+v\n", in.Scope, in.Key, in.Task)
	// Output: payment.collect invoice:INV-1:v1 {Actor:worker-7 TaskID:task-1 ProcessInstanceID:pi-1 BusinessKey:INV-1}
}
