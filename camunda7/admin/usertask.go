package admin

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/extworker/extworker/camunda7"
)

// UserTask is a user task waiting in the engine (GET /task/{id}). LastUpdated is the
// engine's own version-like field (7.20 and later): it changes on claim, assignment and
// identity-link changes, not on variable changes (camunda7's
// TestConformanceUserTaskVersion pins which).
type UserTask struct {
	ID                  string        `json:"id"`
	Name                string        `json:"name"`
	Description         string        `json:"description"`
	Assignee            string        `json:"assignee"`
	Owner               string        `json:"owner"`
	DelegationState     string        `json:"delegationState"`
	Created             camunda7.Time `json:"created"`
	LastUpdated         camunda7.Time `json:"lastUpdated"`
	Due                 camunda7.Time `json:"due"`
	FollowUp            camunda7.Time `json:"followUp"`
	Priority            int           `json:"priority"`
	ProcessDefinitionID string        `json:"processDefinitionId"`
	ProcessInstanceID   string        `json:"processInstanceId"`
	ExecutionID         string        `json:"executionId"`
	TaskDefinitionKey   string        `json:"taskDefinitionKey"`
	Suspended           bool          `json:"suspended"`
	FormKey             string        `json:"formKey"`
	TenantID            string        `json:"tenantId"`
	TaskState           string        `json:"taskState"`
}

// IdentityLink is one of a user task's identity links: a candidate user or group
// ("candidate"), or its assignee or owner as links.
type IdentityLink struct {
	UserID  string `json:"userId"`
	GroupID string `json:"groupId"`
	Type    string `json:"type"`
}

// UserTask returns a waiting user task; an error matching camunda7.ErrNotFound when the
// engine has no such task (completed, deleted or never there).
func (c *Client) UserTask(ctx context.Context, id string) (*UserTask, error) {
	var out UserTask
	err := c.Do(ctx, camunda7.Request{Op: "get user task " + id, Method: http.MethodGet, Path: "/task/" + url.PathEscape(id), Out: &out})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// UserTasks queries waiting user tasks (GET /task) with the engine's parameters
// (assignee, candidateUser, candidateGroups, processInstanceId, maxResults, ...).
func (c *Client) UserTasks(ctx context.Context, q url.Values) ([]UserTask, error) {
	var out []UserTask
	err := c.Do(ctx, camunda7.Request{Op: "query user tasks", Method: http.MethodGet, Path: "/task", Query: q, Out: &out})
	return out, err
}

// UserTaskIdentityLinks returns a waiting task's identity links. The engine answers an
// unknown task with a 500 (a NullValueException), not a 404: ask UserTask first.
func (c *Client) UserTaskIdentityLinks(ctx context.Context, id string) ([]IdentityLink, error) {
	var out []IdentityLink
	err := c.Do(ctx, camunda7.Request{Op: "get identity links of user task " + id, Method: http.MethodGet,
		Path: "/task/" + url.PathEscape(id) + "/identity-links", Out: &out})
	return out, err
}

// AddUserTaskIdentityLink adds an identity link (a candidate user or group) to a task.
func (c *Client) AddUserTaskIdentityLink(ctx context.Context, id string, l IdentityLink) error {
	body := map[string]string{"type": l.Type}
	if l.UserID != "" {
		body["userId"] = l.UserID
	}
	if l.GroupID != "" {
		body["groupId"] = l.GroupID
	}
	return c.Do(ctx, camunda7.Request{Op: "add identity link to user task " + id, Method: http.MethodPost,
		Path: "/task/" + url.PathEscape(id) + "/identity-links", Body: body})
}

// UserTaskFormVariables returns the variables a task's form shows (its form fields',
// or every variable visible from the task when it has none), serialized form. The
// engine answers an unknown task with a 400: ask UserTask first.
func (c *Client) UserTaskFormVariables(ctx context.Context, id string) (camunda7.Variables, error) {
	var out camunda7.Variables
	err := c.Do(ctx, camunda7.Request{Op: "get form variables of user task " + id, Method: http.MethodGet,
		Path: "/task/" + url.PathEscape(id) + "/form-variables", Query: url.Values{"deserializeValues": {"false"}}, Out: &out})
	return out, err
}

// UserTaskVariables returns the variables visible from a task's scope (GET
// /task/{id}/variables), serialized form, each with its own type.
func (c *Client) UserTaskVariables(ctx context.Context, id string) (camunda7.Variables, error) {
	var out camunda7.Variables
	err := c.Do(ctx, camunda7.Request{Op: "get variables of user task " + id, Method: http.MethodGet,
		Path: "/task/" + url.PathEscape(id) + "/variables", Query: url.Values{"deserializeValues": {"false"}}, Out: &out})
	return out, err
}

// SetUserTaskVariable sets a variable from a task's scope (PUT /task/{id}/variables/{name}).
func (c *Client) SetUserTaskVariable(ctx context.Context, id, name string, v camunda7.Variable) error {
	return c.Do(ctx, camunda7.Request{Op: "set variable " + name + " of user task " + id, Method: http.MethodPut,
		Path: "/task/" + url.PathEscape(id) + "/variables/" + url.PathEscape(name), Body: v})
}

// ClaimUserTask assigns an unassigned task to userID; SetUserTaskAssignee assigns it
// whoever holds it.
func (c *Client) ClaimUserTask(ctx context.Context, id, userID string) error {
	return c.Do(ctx, camunda7.Request{Op: "claim user task " + id, Method: http.MethodPost,
		Path: "/task/" + url.PathEscape(id) + "/claim", Body: map[string]string{"userId": userID}})
}

// SetUserTaskAssignee assigns a task to userID, whoever held it.
func (c *Client) SetUserTaskAssignee(ctx context.Context, id, userID string) error {
	return c.Do(ctx, camunda7.Request{Op: "set assignee of user task " + id, Method: http.MethodPost,
		Path: "/task/" + url.PathEscape(id) + "/assignee", Body: map[string]string{"userId": userID}})
}

// CompleteUserTask completes a task with variables, set from the task's scope in the
// completion's own transaction. The engine answers a task that is gone (completed by
// someone else, deleted) with a 500 ("Cannot find task with id"), not a 404.
func (c *Client) CompleteUserTask(ctx context.Context, id string, vars camunda7.Variables) error {
	body := map[string]any{}
	if len(vars) > 0 {
		body["variables"] = vars
	}
	return c.Do(ctx, camunda7.Request{Op: "complete user task " + id, Method: http.MethodPost,
		Path: "/task/" + url.PathEscape(id) + "/complete", Body: body})
}

// SubmitUserTaskForm completes a task through its form (POST /task/{id}/submit-form):
// the engine applies the form's declared fields first (their types, readonly, required,
// min/max, enum values, date formats) and refuses the submission with a 500
// RestException "Cannot submit task form <id>: …" when one fails, completing nothing;
// variables the form does not declare are set as complete sets them.
func (c *Client) SubmitUserTaskForm(ctx context.Context, id string, vars camunda7.Variables) error {
	body := map[string]any{"variables": vars}
	if vars == nil {
		body["variables"] = camunda7.Variables{}
	}
	return c.Do(ctx, camunda7.Request{Op: "submit the form of user task " + id, Method: http.MethodPost,
		Path: "/task/" + url.PathEscape(id) + "/submit-form", Body: body})
}

// HistoricUserTask is a user task from history (GET /history/task): DeleteReason is
// "completed" for a completed task, "deleted" (or another reason) for one removed
// otherwise; EndTime is zero while it waits.
type HistoricUserTask struct {
	ID                string        `json:"id"`
	ProcessInstanceID string        `json:"processInstanceId"`
	TaskDefinitionKey string        `json:"taskDefinitionKey"`
	Assignee          string        `json:"assignee"`
	Owner             string        `json:"owner"`
	DeleteReason      string        `json:"deleteReason"`
	StartTime         camunda7.Time `json:"startTime"`
	EndTime           camunda7.Time `json:"endTime"`
	TaskState         string        `json:"taskState"`
}

// HistoricUserTasks queries GET /history/task (taskId, processInstanceId, finished, ...).
func (c *Client) HistoricUserTasks(ctx context.Context, q url.Values) ([]HistoricUserTask, error) {
	var out []HistoricUserTask
	err := c.Do(ctx, camunda7.Request{Op: "query historic user tasks", Method: http.MethodGet, Path: "/history/task", Query: q, Out: &out})
	return out, err
}

// HistoricIdentityLink is one entry of the history's identity-link log (GET
// /history/identity-link-log): a candidate, assignee or owner link added to or
// deleted from a task (OperationType "add" or "delete"). The engine writes the log at
// history level full only; below it, the log is empty.
type HistoricIdentityLink struct {
	TaskID        string        `json:"taskId"`
	Type          string        `json:"type"`
	UserID        string        `json:"userId"`
	GroupID       string        `json:"groupId"`
	OperationType string        `json:"operationType"`
	Time          camunda7.Time `json:"time"`
}

// HistoricIdentityLinks queries GET /history/identity-link-log (taskId, userId,
// groupId, type, operationType, ...).
func (c *Client) HistoricIdentityLinks(ctx context.Context, q url.Values) ([]HistoricIdentityLink, error) {
	var out []HistoricIdentityLink
	err := c.Do(ctx, camunda7.Request{Op: "query historic identity links", Method: http.MethodGet, Path: "/history/identity-link-log", Query: q, Out: &out})
	return out, err
}

// ProcessDefinitionXML returns a process definition's BPMN XML (GET
// /process-definition/{id}/xml).
func (c *Client) ProcessDefinitionXML(ctx context.Context, id string) (string, error) {
	var out struct {
		BPMN20XML string `json:"bpmn20Xml"`
	}
	err := c.Do(ctx, camunda7.Request{Op: "get the XML of process definition " + id, Method: http.MethodGet,
		Path: "/process-definition/" + url.PathEscape(id) + "/xml", Out: &out})
	return out.BPMN20XML, err
}

// QueryUserTasks queries waiting user tasks with a JSON body (POST /task): the
// parameters of GET /task as JSON (candidateGroups as an array, sorting as
// [{"sortBy":…,"sortOrder":…}]), with no URL to outgrow however many groups it names;
// at most maxResults.
func (c *Client) QueryUserTasks(ctx context.Context, q map[string]any, maxResults int) ([]UserTask, error) {
	var out []UserTask
	err := c.Do(ctx, camunda7.Request{Op: "query user tasks", Method: http.MethodPost, Path: "/task",
		Query: url.Values{"maxResults": {strconv.Itoa(maxResults)}}, Body: q, Out: &out})
	return out, err
}
