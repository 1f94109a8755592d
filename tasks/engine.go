package tasks

import (
	"context"
	"net/url"
	"reflect"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/lockext"
)

// Engine is every engine call a Worker makes, its lock extension (lockext) included:
// exactly these and no others. *camunda7.Client implements it against a real Camunda 7
// engine; taskstest.Engine is an in-memory one, so that a handler can be tested without
// an engine.
//
// The worker decides what to do from the errors, so an implementation must report them
// as *camunda7.Client does, matched with errors.Is: camunda7.ErrNotSent for a request
// that certainly had no effect (camunda7.ErrInvalidArgument too, when it was refused
// before sending), camunda7.ErrUnknownOutcome for one that may have, camunda7.ErrTaskGone
// for a task that no longer exists, camunda7.ErrLockLost for a task locked by another
// worker (or by nobody), camunda7.ErrLockExpired for an extension of a lock that ran out,
// camunda7.ErrOptimisticLock, camunda7.ErrThrottled; and other engine answers as a
// *camunda7.Error with the HTTP status.
type Engine interface {
	// ExtendLock and Lock keep a running task's lock alive (lockext.Locker).
	lockext.Locker
	// FetchAndLock locks up to r.MaxTasks tasks for r.WorkerID, long-polling for
	// r.AsyncResponseTimeout when none is available.
	FetchAndLock(ctx context.Context, r camunda7.FetchAndLockRequest) ([]camunda7.LockedExternalTask, error)
	// Complete, Failure and BPMNError report a handler's outcome.
	Complete(ctx context.Context, taskID string, r camunda7.CompleteRequest) error
	Failure(ctx context.Context, taskID string, r camunda7.FailureRequest) error
	BPMNError(ctx context.Context, taskID string, r camunda7.BPMNErrorRequest) error
	// Unlock hands a task back (at shutdown, or a task the worker will not run).
	Unlock(ctx context.Context, taskID string) error
	// ExternalTask resolves a report whose answer was lost: is the task still there,
	// and whose lock is it?
	ExternalTask(ctx context.Context, taskID string) (*camunda7.ExternalTask, error)
	// ExternalTasks finds tasks locked for this worker that no handler here runs (what
	// a fetch whose answer never arrived locked).
	ExternalTasks(ctx context.Context, q camunda7.ExternalTaskQuery) ([]camunda7.ExternalTask, error)
	// ExternalTaskLog tells a cancelled task from one completed elsewhere
	// (Config.OnTaskGone); the worker asks only for externalTaskId.
	ExternalTaskLog(ctx context.Context, q url.Values) ([]camunda7.ExternalTaskLogEntry, error)
}

// *camunda7.Client is the Engine of production workers.
var _ Engine = (*camunda7.Client)(nil)

// isNil reports whether e is nil, or an interface holding a nil pointer (a nil
// *camunda7.Client passed to New).
func isNil(e Engine) bool {
	if e == nil {
		return true
	}
	v := reflect.ValueOf(e)
	switch v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return v.IsNil()
	}
	return false
}
