// Package operate is what an operator does to an intent across the effect ledger and the
// engine: it reads the engine's view of an intent's task, its open incidents and its
// process instance, and, once a verdict is applied in the ledger, gives a task that ran
// out of retries one more, so that the workflow completes (or declines) from the ledger
// without calling the provider again. The operator's CLI (`extworker effects`) and the
// operator console (internal/console) share it, so both say and do the same.
package operate

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/humantask"
	"github.com/extworker/extworker/idempotency"
)

// Engine is the engine an operator's actions reach.
type Engine struct {
	// URL is the engine's REST address without credentials, for messages.
	URL string
	// Dial returns the client, called only when the engine is needed; its error is
	// reported in the view or action, never returned.
	Dial func() (*camunda7.Client, error)
}

// View is what the engine says about an intent's task.
type View struct {
	URL      string `json:"url"`
	TaskID   string `json:"task_id,omitempty"`
	Task     *Task  `json:"task,omitempty"`
	TaskGone bool   `json:"task_gone,omitempty"`
	// UserTask is the user task of a human-task completion's intent (humantask.Scope),
	// whose TaskID names a user task, not an external one.
	UserTask  *UserTask  `json:"user_task,omitempty"`
	Incidents []Incident `json:"incidents,omitempty"`
	Error     string     `json:"error,omitempty"`
}

// ProcessInstanceID is the intent's process instance as the ledger recorded it, or
// as the task names it.
func (v View) ProcessInstanceID(row idempotency.Row) string {
	if row.ProcessInstanceID != nil && *row.ProcessInstanceID != "" {
		return *row.ProcessInstanceID
	}
	if v.Task != nil {
		return v.Task.ProcessInstanceID
	}
	return ""
}

// Task is an external task as the engine reports it.
type Task struct {
	ID                 string     `json:"id"`
	TopicName          string     `json:"topic"`
	WorkerID           string     `json:"worker_id,omitempty"`
	Retries            *int       `json:"retries"`
	LockExpirationTime *time.Time `json:"lock_expiration_time,omitempty"`
	ErrorMessage       string     `json:"error_message,omitempty"`
	ProcessInstanceID  string     `json:"process_instance_id"`
	ActivityID         string     `json:"activity_id"`
	Suspended          bool       `json:"suspended,omitempty"`
}

// UserTask is a user task as the engine reports it: waiting, or ended (from history:
// DeleteReason "completed", or another; Ended with a zero EndTime when history has none).
type UserTask struct {
	ID                string    `json:"id"`
	Name              string    `json:"name,omitempty"`
	Assignee          string    `json:"assignee,omitempty"`
	ProcessInstanceID string    `json:"process_instance_id,omitempty"`
	Suspended         bool      `json:"suspended,omitempty"`
	Ended             bool      `json:"ended,omitempty"`
	DeleteReason      string    `json:"delete_reason,omitempty"`
	EndTime           time.Time `json:"end_time,omitzero"`
}

// Incident is an open incident of the intent's process instance.
type Incident struct {
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	Message   string    `json:"message,omitempty"`
	At        time.Time `json:"at"`
	Activity  string    `json:"activity_id,omitempty"`
	Configure string    `json:"configuration,omitempty"`
}

// Action is what ResumeTask did in the engine.
type Action struct {
	// Action is retries_set, task_gone, no_task, not_needed or failed.
	Action  string `json:"action"`
	TaskID  string `json:"task_id,omitempty"`
	Message string `json:"message"`
}

// Actions ResumeTask reports.
const (
	RetriesSet = "retries_set"
	TaskGone   = "task_gone"
	NoTask     = "no_task"
	NotNeeded  = "not_needed"
	Failed     = "failed"
)

// NewTask is the engine's task as View reports it.
func NewTask(t *camunda7.ExternalTask) *Task {
	j := &Task{ID: t.ID, TopicName: t.TopicName, WorkerID: t.WorkerID, Retries: t.Retries, ErrorMessage: t.ErrorMessage,
		ProcessInstanceID: t.ProcessInstanceID, ActivityID: t.ActivityID, Suspended: t.Suspended}
	if !t.LockExpirationTime.IsZero() {
		lt := t.LockExpirationTime.Time
		j.LockExpirationTime = &lt
	}
	return j
}

// View asks the engine about the intent's task and its process instance's open
// incidents. Engine trouble is recorded in the view, never returned: the ledger is
// worth showing on its own.
func (e Engine) View(ctx context.Context, row idempotency.Row) View {
	v := View{URL: e.URL, TaskID: deref(row.TaskID)}
	piID := deref(row.ProcessInstanceID)
	if v.TaskID == "" && piID == "" {
		return v
	}
	c, err := e.Dial()
	if err != nil {
		v.Error = err.Error()
		return v
	}
	if v.TaskID != "" && row.Scope == humantask.Scope {
		if v.UserTask, err = userTask(ctx, admin.New(c), v.TaskID); err != nil {
			v.Error = EngineError(err)
			return v
		}
		if piID == "" {
			piID = v.UserTask.ProcessInstanceID
		}
	} else if v.TaskID != "" {
		t, err := c.ExternalTask(ctx, v.TaskID)
		switch {
		case errors.Is(err, camunda7.ErrTaskGone):
			v.TaskGone = true
		case err != nil:
			v.Error = EngineError(err)
			return v // the incidents query would fail the same way
		default:
			v.Task = NewTask(t)
			if piID == "" {
				piID = t.ProcessInstanceID
			}
		}
	}
	if piID != "" {
		incs, err := admin.New(c).Incidents(ctx, url.Values{"processInstanceId": {piID}})
		if err != nil {
			v.Error = EngineError(err)
			return v
		}
		for _, in := range incs {
			v.Incidents = append(v.Incidents, Incident{ID: in.ID, Type: in.IncidentType, Message: in.IncidentMessage,
				At: in.IncidentTimestamp.Time, Activity: in.ActivityID, Configure: in.Configuration})
		}
	}
	return v
}

// userTask is the user task id as the engine reports it: waiting, else from history.
func userTask(ctx context.Context, c *admin.Client, id string) (*UserTask, error) {
	t, err := c.UserTask(ctx, id)
	if err == nil {
		return &UserTask{ID: t.ID, Name: t.Name, Assignee: t.Assignee, ProcessInstanceID: t.ProcessInstanceID, Suspended: t.Suspended}, nil
	}
	if !errors.Is(err, camunda7.ErrNotFound) {
		return nil, err
	}
	hs, err := c.HistoricUserTasks(ctx, url.Values{"taskId": {id}})
	if err != nil {
		return nil, err
	}
	u := &UserTask{ID: id, Ended: true}
	if len(hs) > 0 {
		h := hs[0]
		u.Assignee, u.ProcessInstanceID, u.DeleteReason = h.Assignee, h.ProcessInstanceID, h.DeleteReason
		u.EndTime = h.EndTime.Time
	}
	return u, nil
}

// EngineError describes an engine call's failure, saying "unreachable" when no answer
// came back at all.
func EngineError(err error) string {
	msg := err.Error()
	if errors.Is(err, camunda7.ErrNotSent) || errors.Is(err, camunda7.ErrUnknownOutcome) || errors.Is(err, camunda7.ErrMalformedResponse) {
		return "unreachable: " + msg
	}
	return msg
}

// ResumeTask gives the resolved intent's task a retry if it ran out of them (the handler
// then completes, or declines, from the ledger without calling the provider). A task
// that still has retries, or has never failed, resumes on its own and is left alone:
// setting its retries would cut its remaining budget or race the worker holding it.
func (e Engine) ResumeTask(ctx context.Context, row idempotency.Row) Action {
	taskID := deref(row.TaskID)
	if taskID == "" {
		return Action{Action: NoTask, Message: "no task recorded for this intent; nothing to do in the engine"}
	}
	act := Action{TaskID: taskID}
	gone := func() Action {
		act.Action, act.Message = TaskGone, fmt.Sprintf("task %s gone; nothing to do in the engine", taskID)
		return act
	}
	failed := func(what string, err error) Action {
		act.Action = Failed
		act.Message = fmt.Sprintf("%s task %s at %s: %s; give the task a retry in Cockpit (or PUT /external-task/%s/retries {\"retries\":1})",
			what, taskID, e.URL, EngineError(err), taskID)
		return act
	}
	c, err := e.Dial()
	if err != nil {
		return failed("could not reach", err)
	}
	t, err := c.ExternalTask(ctx, taskID)
	switch {
	case errors.Is(err, camunda7.ErrTaskGone):
		return gone()
	case err != nil:
		return failed("could not read", err)
	case t.Retries != nil && *t.Retries > 0:
		act.Action, act.Message = NotNeeded, fmt.Sprintf("task %s still has %d retries; it resumes on its own, nothing to do in the engine", taskID, *t.Retries)
		return act
	case t.Retries == nil:
		act.Action, act.Message = NotNeeded, fmt.Sprintf("task %s has not failed (no retries set); it resumes on its own, nothing to do in the engine", taskID)
		return act
	}
	if err := c.SetExternalTaskRetries(ctx, taskID, 1); err != nil {
		if errors.Is(err, camunda7.ErrTaskGone) {
			return gone()
		}
		return failed("could not set retries on", err)
	}
	act.Action, act.Message = RetriesSet, fmt.Sprintf("retries set to 1 on task %s", taskID)
	return act
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
