package humantask

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/extworker/extworker/idempotency"
)

// ErrNoSuchTask is a task the engine has no waiting task of (completed, deleted, or
// never there).
var ErrNoSuchTask = errors.New("humantask: no such waiting task")

// ErrNotAllowed is a task who is neither the assignee nor, while nobody is assigned, a
// candidate of.
var ErrNotAllowed = errors.New("humantask: not the assignee or a candidate of this task")

// Tasks lists who's tasks from Go, as GET /tasks does: assigned to who, or unassigned
// with who or one of its groups as a candidate; each with its ETag. Tasks the engine
// could not show in time are counted (TaskList.Unavailable), not listed; an error when it
// could show none of those it found.
func (s *Service) Tasks(ctx context.Context, who Identity) (TaskList, error) {
	return s.tasksOf(ctx, who)
}

// Task reads one waiting task for who from Go, as GET /tasks/{id} does: ErrNoSuchTask
// when the engine has no such waiting task, ErrNotAllowed when who may not see it.
func (s *Service) Task(ctx context.Context, who Identity, id string) (Task, error) {
	if err := checkID("the task id", id, maxTaskID); err != nil {
		return Task{}, ErrNoSuchTask
	}
	t, err := s.load(ctx, id)
	switch {
	case taskMissing(err):
		return Task{}, ErrNoSuchTask
	case err != nil:
		return Task{}, err
	case !allowed(t, who):
		return Task{}, ErrNotAllowed
	}
	return t, nil
}

// Answer is the recorded answer of who's command on task, from Go, without the form:
// what Complete answered it (ok false while it has none: never sent, not settled yet,
// or sent by another user). It lets a page that lost the form (a form page loaded
// again after its command was sent) show the command's answer again, to its sender
// only.
func (s *Service) Answer(ctx context.Context, who Identity, taskID, command string) (a Answer, ok bool, err error) {
	if checkID("the task id", taskID, maxTaskID) != nil || checkID("the command", command, maxCommand) != nil {
		return Answer{}, false, nil
	}
	row, err := s.ledger.Operations().Get(ctx, Scope, commandKey(taskID, who.User, command))
	switch {
	case errors.Is(err, idempotency.ErrNotFound):
		return Answer{}, false, nil
	case err != nil:
		return Answer{}, false, err
	}
	switch row.State {
	case idempotency.StateConfirmed, idempotency.StateReconciled, idempotency.StateRejected:
	default:
		return Answer{}, false, nil
	}
	if row.ErrorCode != nil && row.ErrorMessage != nil {
		status, err := strconv.Atoi(*row.ErrorCode)
		if err != nil {
			return Answer{}, false, nil // an operator's resolution: Complete answers it from the engine
		}
		return Answer{Status: status, Body: []byte(*row.ErrorMessage)}, true, nil
	}
	var values struct {
		Body string `json:"body"`
	}
	if json.Unmarshal(row.Result, &values) != nil || values.Body == "" {
		return Answer{}, false, nil
	}
	return Answer{Status: http.StatusOK, Body: []byte(values.Body)}, true, nil
}
