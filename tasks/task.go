package tasks

import (
	"sync"
	"time"

	"github.com/extworker/extworker/camunda7"
)

// Task is a locked external task as a handler sees it: its identifiers, its typed
// variables, and a place to put local variables for the completion.
type Task struct {
	raw      camunda7.LockedExternalTask
	workerID string
	attempt  int
	fetch    *camunda7.FetchTopic // what the topic asked the engine for (Bind's hints), shared by its tasks; nil: unknown

	mu    sync.Mutex
	local camunda7.Variables
}

func newTask(raw camunda7.LockedExternalTask, workerID string, attempt int) *Task {
	return &Task{raw: raw, workerID: workerID, attempt: attempt}
}

// ID is the external task id.
func (t *Task) ID() string { return t.raw.ID }

// Topic is the task's topic.
func (t *Task) Topic() string { return t.raw.TopicName }

// WorkerID is the id the task is locked for.
func (t *Task) WorkerID() string { return t.workerID }

// BusinessKey is the process instance's business key ("" when it has none).
func (t *Task) BusinessKey() string { return t.raw.BusinessKey }

// ProcessInstanceID identifies the process instance.
func (t *Task) ProcessInstanceID() string { return t.raw.ProcessInstanceID }

// ProcessDefinitionKey is the key of the task's process definition.
func (t *Task) ProcessDefinitionKey() string { return t.raw.ProcessDefinitionKey }

// ProcessDefinitionID identifies the process definition version.
func (t *Task) ProcessDefinitionID() string { return t.raw.ProcessDefinitionID }

// ActivityID is the BPMN id of the service task.
func (t *Task) ActivityID() string { return t.raw.ActivityID }

// ExecutionID is the execution the task belongs to.
func (t *Task) ExecutionID() string { return t.raw.ExecutionID }

// TenantID is the task's tenant ("" without one).
func (t *Task) TenantID() string { return t.raw.TenantID }

// Priority is the task's priority.
func (t *Task) Priority() int64 { return t.raw.Priority }

// Retries is the engine's retries field: nil until a failure has been reported.
func (t *Task) Retries() *int { return t.raw.Retries }

// Attempt is the 1-based attempt this delivery is, by the topic's retry policy. A
// delivery after a silent lock expiry has the same attempt number as the one before:
// the engine counts only reported failures.
func (t *Task) Attempt() int { return t.attempt }

// LastError is the errorMessage of the last reported failure ("" if none).
func (t *Task) LastError() string { return t.raw.ErrorMessage }

// LockExpiration is the lock expiry the engine reported at fetch time (engine clock).
func (t *Task) LockExpiration() time.Time { return t.raw.LockExpirationTime.Time }

// ExtensionProperty returns a camunda:property of the service task; the topic must set
// IncludeExtensionProperties.
func (t *Task) ExtensionProperty(name string) (string, bool) {
	v, ok := t.raw.ExtensionProperties[name]
	return v, ok
}

// Variables are the variables fetched for the task, with typed accessors
// (Variables().String("invoiceId"), .Long("amount"), .JSON("order", &o), ...). Bind
// reads them into a struct instead.
func (t *Task) Variables() camunda7.Variables { return t.raw.Variables }

// Raw returns the task as the engine sent it.
func (t *Task) Raw() camunda7.LockedExternalTask { return t.raw }

// SetLocalVariable sets a variable to be written on the task's own execution when it
// completes (camunda7.CompleteRequest.LocalVariables), rather than on the process.
func (t *Task) SetLocalVariable(name string, v camunda7.Variable) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.local == nil {
		t.local = camunda7.Variables{}
	}
	t.local[name] = v
}

func (t *Task) localVariables() camunda7.Variables {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.local
}
