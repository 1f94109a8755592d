package tasks

import "github.com/extworker/extworker/idempotency"

// Intent returns the intent of one side effect of this task, for idempotency.Ledger.Do:
// scope names the kind of effect ("payment.collect"), key the business command
// ("invoice:INV-1:v1", computed from the task's variables the same way on every
// delivery: never from the task id or the attempt), and request is what will be sent
// (only its digest is stored). Its Task is filled from the task (TaskRef). Set Amount or
// Compensates on the result when they apply.
func (t *Task) Intent(scope, key string, request any) idempotency.Intent {
	return idempotency.Intent{Scope: scope, Key: key, Request: request, Task: t.TaskRef()}
}

// TaskRef identifies this attempt in the effect ledger's audit trail: the worker id as
// the actor, the external task, its process instance and business key.
func (t *Task) TaskRef() idempotency.TaskRef {
	return idempotency.TaskRef{Actor: t.WorkerID(), TaskID: t.ID(), ProcessInstanceID: t.ProcessInstanceID(), BusinessKey: t.BusinessKey()}
}
