package humantask

import (
	"context"
	"errors"
	"net/http"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/idempotency"
)

// dispatch runs the completion-time checks and completes the task with the marker.
// The checks and the completion are two calls: a claim by another user in the
// milliseconds between them is not seen (the engine's complete checks no assignee).
func (s *Service) dispatch(ctx context.Context, c Command, who Identity) (idempotency.Result, error) {
	t, err := s.load(ctx, c.TaskID)
	switch {
	case taskMissing(err):
		return s.settleRefused(ctx, c, who, nil)
	case engineFault(err) != nil && s.faultAgain(c, who):
		return idempotency.Result{}, rejection(faulted(c.TaskID, engineFault(err)))
	case err != nil:
		return idempotency.Result{}, idempotency.NotSent(err)
	}
	if err := s.allowNow(ctx, t, c, who); err != nil {
		return idempotency.Result{}, err
	}
	vars, err := s.variables(ctx, t, c, who)
	if err != nil {
		return idempotency.Result{}, idempotency.NotSent(err)
	}
	if t.Fields == nil {
		err = s.cfg.Engine.CompleteUserTask(ctx, c.TaskID, vars)
	} else if err = s.cfg.Engine.SubmitUserTaskForm(ctx, c.TaskID, vars); err == nil {
		return s.submitted(ctx, c, who)
	}
	var refused *camunda7.Error
	switch {
	case err == nil:
		return okResult(completed(c.TaskID, c.ID, who.User)), nil
	case errors.As(err, &refused):
		return s.settleRefused(ctx, c, who, refused)
	}
	return idempotency.Result{}, err // the outcome is unknown: reconciled next
}

// submitted settles a command whose form the engine took: completed when the task is
// gone; when it still waits, it was delegated after the checks and the engine resolved
// the delegation instead (a 409 "delegated", the marker sent with it cleared, so that
// no later answer names a command that completed nothing). An error: not known yet.
func (s *Service) submitted(ctx context.Context, c Command, who Identity) (idempotency.Result, error) {
	_, err := s.cfg.Engine.UserTask(ctx, c.TaskID)
	switch {
	case taskMissing(err):
		return okResult(completed(c.TaskID, c.ID, who.User)), nil
	case err != nil:
		return idempotency.Result{}, err
	}
	if err := s.cfg.Engine.SetUserTaskVariable(ctx, c.TaskID, markerName(c.TaskID), camunda7.NullVar()); err != nil {
		return idempotency.Result{}, err
	}
	return idempotency.Result{}, rejection(delegated(c.TaskID))
}

// allowNow is the completion-time decision: nil when who may complete t with c, or the
// recorded refusal (checkCompletion's, or the task's business rule's).
func (s *Service) allowNow(ctx context.Context, t Task, c Command, who Identity) error {
	if a := checkCompletion(t, who, c.IfMatch, c.Form); a != nil {
		return rejection(*a)
	}
	g := s.cfg.Guards[t.TaskDefinitionKey]
	if g == nil {
		return nil
	}
	if err := g(ctx, t, c.Form); err != nil {
		if ctx.Err() != nil {
			return idempotency.NotSent(err)
		}
		return rejection(*refusal(http.StatusUnprocessableEntity, t.ID, "refused by the task's business rule", err.Error()))
	}
	return nil
}

// variables are what completes t for c: the form's variables and the marker. A task
// whose form declares fields is completed through the form (SubmitUserTaskForm: the
// engine applies the fields' types and validations, as Tasklist's submission does), and
// a declared field with a default value that the form leaves out is sent with the
// variable's own value (the engine would set the default over it); other fields left out
// are left as they are.
func (s *Service) variables(ctx context.Context, t Task, c Command, who Identity) (camunda7.Variables, error) {
	vars := engineVariables(c.Form, t.Variables, c.TaskID, c.ID, who.User)
	var current camunda7.Variables
	for _, name := range t.defaulted {
		if _, sent := vars[name]; sent {
			continue
		}
		if current == nil {
			var err error
			if current, err = s.cfg.Engine.UserTaskVariables(ctx, c.TaskID); err != nil {
				return nil, err
			}
		}
		if v, ok := current[name]; ok && !v.IsNull() {
			vars[name] = v
		}
	}
	return vars, nil
}

// settleRefused settles a command the engine refused (refused nil: whose task it no
// longer has) from the engine's state: gone meanwhile (another command won the race) →
// from its history; still waiting, its form's values refused (camunda7.FormRefusal) → 422;
// still waiting, the engine failing for good (engineFault: a listener, an expression) →
// 502; still waiting otherwise (a concurrent change, the database) → sent again later.
func (s *Service) settleRefused(ctx context.Context, c Command, who Identity, refused *camunda7.Error) (idempotency.Result, error) {
	st, err := s.engineState(ctx, c.TaskID, who)
	if err != nil {
		return idempotency.Result{}, idempotency.NotSent(err)
	}
	if refused != nil && st.open && !st.suspended {
		if reason, ok := camunda7.FormRefusal(refused); ok {
			return idempotency.Result{}, rejection(*refusal(http.StatusUnprocessableEntity, c.TaskID, "the engine refused the form's values", reason))
		}
		if f := engineFault(refused); f != nil && s.faultAgain(c, who) {
			return idempotency.Result{}, rejection(faulted(c.TaskID, f))
		}
	}
	a, open := settle(st, c.TaskID, c.ID, who.User)
	switch {
	case open:
		return idempotency.Result{}, idempotency.NotSent(errors.New("the engine did not complete the task; it still waits"))
	case a.Status == http.StatusOK:
		return okResult(a), nil
	}
	return idempotency.Result{}, rejection(a)
}

// engineFault is err when it is the engine failing a call for good: an engine error
// (500) of code 0, the code of the engine's ordinary exceptions (a listener's, an
// expression's, a conversion's), not a concurrent change (camunda7.ErrOptimisticLock,
// retried) nor the database's (codes 10000 and above). nil otherwise.
func engineFault(err error) *camunda7.Error {
	var e *camunda7.Error
	if !errors.As(err, &e) || e == nil || errors.Is(e, camunda7.ErrOptimisticLock) ||
		e.StatusCode != http.StatusInternalServerError || e.Type == "" || e.Code == nil || *e.Code != 0 {
		return nil
	}
	return e
}

// faulted is the answer of a command the engine fails for good while the task waits:
// 502, nothing completed, the engine's exception type named (its message may quote
// values, and is not recorded).
func faulted(taskID string, e *camunda7.Error) Answer {
	return *refusal(http.StatusBadGateway, taskID, "the engine fails to complete this task ("+e.Type+"); nothing was completed: an operator must look at the engine's log, then a new command may be sent", "")
}

// faultAgain reports whether the engine failed c before, in this process: a fault is
// recorded (502) only when it comes again on the command's next attempt. A first one
// may be a concurrent completion not committed yet (the loser's complete fails while the
// winner's transaction is open), which the next attempt settles as a 409; the load test
// met it under CI's load.
//
// A command's entry is forgotten when the command settles (Complete), so the map holds
// the unsettled commands that met a fault once, not every one ever.
func (s *Service) faultAgain(c Command, who Identity) bool {
	key := commandKey(c.TaskID, who.User, c.ID)
	if _, seen := s.faults.LoadOrStore(key, struct{}{}); seen {
		s.faults.Delete(key)
		return true
	}
	return false
}
