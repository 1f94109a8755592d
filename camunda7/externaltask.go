package camunda7

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// FetchAndLockRequest is the body of POST /external-task/fetchAndLock.
type FetchAndLockRequest struct {
	// WorkerID is the id the tasks are locked for. Required.
	WorkerID string
	// MaxTasks is the most tasks to lock. Required, > 0.
	MaxTasks int
	// UsePriority orders tasks by priority, highest first.
	UsePriority bool
	// AsyncResponseTimeout turns on long polling: the engine holds the request until a
	// task is available or this much time has passed, then answers an empty list.
	// Zero answers at once. At most MaxAsyncResponseTimeout. Millisecond precision.
	AsyncResponseTimeout time.Duration
	// Sorting orders the result; the engine supports only SortByCreateTime.
	Sorting []Sorting
	// Topics to fetch from. Required.
	Topics []FetchTopic
}

// Sorting is one sort criterion of a fetchAndLock request.
type Sorting struct {
	SortBy    string `json:"sortBy"`
	SortOrder string `json:"sortOrder"`
}

// Sort criteria and orders the engine accepts.
const (
	SortByCreateTime = "createTime"
	SortAsc          = "asc"
	SortDesc         = "desc"
)

// FetchTopic is one topic of a fetchAndLock request, with its filters.
type FetchTopic struct {
	TopicName string
	// LockDuration is how long fetched tasks stay locked. Required, > 0; millisecond precision.
	LockDuration time.Duration
	// Variables names the variables to return. Unlike the engine's own default, a nil
	// slice returns none: fetching every variable must be asked for with AllVariables,
	// never happen by accident (large or sensitive variables travel with every task).
	Variables []string
	// AllVariables returns every variable visible from the task (the engine's null).
	AllVariables bool
	// LocalVariables returns only variables local to the task's execution.
	LocalVariables bool

	BusinessKey                 string
	ProcessDefinitionID         string
	ProcessDefinitionIDIn       []string
	ProcessDefinitionKey        string
	ProcessDefinitionKeyIn      []string
	ProcessDefinitionVersionTag string
	TenantIDIn                  []string
	WithoutTenantID             bool
	// ProcessVariables filters on process-instance variables equal to these values.
	ProcessVariables map[string]any
	// DeserializeValues asks the engine to deserialize Object values with their Java
	// class; keep it false for Go workers (the class must be on the engine's classpath).
	DeserializeValues bool
	// IncludeExtensionProperties fills LockedExternalTask.ExtensionProperties.
	IncludeExtensionProperties bool
}

// wire forms, with the engine's field names and milliseconds.
type fetchTopicDto struct {
	TopicName                   string         `json:"topicName"`
	LockDuration                int64          `json:"lockDuration"`
	Variables                   []string       `json:"variables"`
	LocalVariables              bool           `json:"localVariables,omitempty"`
	BusinessKey                 string         `json:"businessKey,omitempty"`
	ProcessDefinitionID         string         `json:"processDefinitionId,omitempty"`
	ProcessDefinitionIDIn       []string       `json:"processDefinitionIdIn,omitempty"`
	ProcessDefinitionKey        string         `json:"processDefinitionKey,omitempty"`
	ProcessDefinitionKeyIn      []string       `json:"processDefinitionKeyIn,omitempty"`
	ProcessDefinitionVersionTag string         `json:"processDefinitionVersionTag,omitempty"`
	TenantIDIn                  []string       `json:"tenantIdIn,omitempty"`
	WithoutTenantID             bool           `json:"withoutTenantId,omitempty"`
	ProcessVariables            map[string]any `json:"processVariables,omitempty"`
	DeserializeValues           bool           `json:"deserializeValues"`
	IncludeExtensionProperties  bool           `json:"includeExtensionProperties,omitempty"`
}

type fetchAndLockDto struct {
	WorkerID             string          `json:"workerId"`
	MaxTasks             int             `json:"maxTasks"`
	UsePriority          bool            `json:"usePriority"`
	AsyncResponseTimeout *int64          `json:"asyncResponseTimeout,omitempty"`
	Sorting              []Sorting       `json:"sorting,omitempty"`
	Topics               []fetchTopicDto `json:"topics"`
}

// dto validates r and returns its wire form.
func (r FetchAndLockRequest) dto(op string) (fetchAndLockDto, error) {
	d := fetchAndLockDto{WorkerID: r.WorkerID, MaxTasks: r.MaxTasks, UsePriority: r.UsePriority, Sorting: r.Sorting}
	switch {
	case r.WorkerID == "":
		return d, invalid(op, "WorkerID is empty")
	case r.MaxTasks <= 0:
		return d, invalid(op, "MaxTasks %d: must be > 0", r.MaxTasks)
	case len(r.Topics) == 0:
		return d, invalid(op, "no topics")
	case r.AsyncResponseTimeout < 0 || r.AsyncResponseTimeout > MaxAsyncResponseTimeout:
		return d, invalid(op, "AsyncResponseTimeout %v: must be between 0 and %v", r.AsyncResponseTimeout, MaxAsyncResponseTimeout)
	}
	if r.AsyncResponseTimeout > 0 {
		ms := r.AsyncResponseTimeout.Milliseconds()
		d.AsyncResponseTimeout = &ms
	}
	for _, s := range r.Sorting {
		if s.SortBy != SortByCreateTime || (s.SortOrder != SortAsc && s.SortOrder != SortDesc) {
			return d, invalid(op, "sorting %+v: only createTime asc|desc is supported", s)
		}
	}
	for _, t := range r.Topics {
		if t.TopicName == "" {
			return d, invalid(op, "a topic has an empty TopicName")
		}
		if t.LockDuration.Milliseconds() <= 0 {
			return d, invalid(op, "topic %q: LockDuration %v must be at least 1ms", t.TopicName, t.LockDuration)
		}
		vars := t.Variables
		switch {
		case t.AllVariables:
			vars = nil
		case vars == nil:
			vars = []string{}
		}
		d.Topics = append(d.Topics, fetchTopicDto{
			TopicName: t.TopicName, LockDuration: t.LockDuration.Milliseconds(), Variables: vars,
			LocalVariables: t.LocalVariables, BusinessKey: t.BusinessKey,
			ProcessDefinitionID: t.ProcessDefinitionID, ProcessDefinitionIDIn: t.ProcessDefinitionIDIn,
			ProcessDefinitionKey: t.ProcessDefinitionKey, ProcessDefinitionKeyIn: t.ProcessDefinitionKeyIn,
			ProcessDefinitionVersionTag: t.ProcessDefinitionVersionTag, TenantIDIn: t.TenantIDIn,
			WithoutTenantID: t.WithoutTenantID, ProcessVariables: t.ProcessVariables,
			DeserializeValues: t.DeserializeValues, IncludeExtensionProperties: t.IncludeExtensionProperties,
		})
	}
	return d, nil
}

// LockedExternalTask is a task returned by fetchAndLock, locked for the worker: the
// task as ExternalTask describes it, plus what only fetchAndLock returns.
type LockedExternalTask struct {
	ExternalTask
	// ErrorDetails of the last failure; only fetchAndLock returns it.
	ErrorDetails        string            `json:"errorDetails"`
	Variables           Variables         `json:"variables"`
	ExtensionProperties map[string]string `json:"extensionProperties"`
}

// ExternalTask is a task as GET /external-task/{id} and the task query return it.
type ExternalTask struct {
	ID                          string `json:"id"`
	TopicName                   string `json:"topicName"`
	WorkerID                    string `json:"workerId"`
	ActivityID                  string `json:"activityId"`
	ActivityInstanceID          string `json:"activityInstanceId"`
	ExecutionID                 string `json:"executionId"`
	ProcessDefinitionID         string `json:"processDefinitionId"`
	ProcessDefinitionKey        string `json:"processDefinitionKey"`
	ProcessDefinitionVersionTag string `json:"processDefinitionVersionTag"`
	ProcessInstanceID           string `json:"processInstanceId"`
	BusinessKey                 string `json:"businessKey"`
	TenantID                    string `json:"tenantId"`
	// Retries is nil until a failure has been reported for the task: the engine does not
	// count attempts itself.
	Retries            *int   `json:"retries"`
	Priority           int64  `json:"priority"`
	Suspended          bool   `json:"suspended"`
	ErrorMessage       string `json:"errorMessage"`
	LockExpirationTime Time   `json:"lockExpirationTime"`
	CreateTime         Time   `json:"createTime"`
}

// FetchAndLock locks up to r.MaxTasks tasks for r.WorkerID. With AsyncResponseTimeout
// set it long-polls, and its HTTP timeout is LongPollTimeout(AsyncResponseTimeout).
// An empty result is not an error.
//
// An error that matches ErrUnknownOutcome means tasks may have been locked and not
// delivered; they become fetchable again when their lock expires.
func (c *Client) FetchAndLock(ctx context.Context, r FetchAndLockRequest) ([]LockedExternalTask, error) {
	const op = "fetch and lock external tasks"
	d, err := r.dto(op)
	if err != nil {
		return nil, err
	}
	var out []LockedExternalTask
	err = c.do(ctx, call{op: op, method: http.MethodPost, path: "/external-task/fetchAndLock",
		body: d, out: &out, timeout: c.LongPollTimeout(r.AsyncResponseTimeout)})
	return out, err
}

// CompleteRequest is the body of POST /external-task/{id}/complete.
type CompleteRequest struct {
	WorkerID string `json:"workerId"`
	// Variables are set where they already exist up the scope hierarchy, otherwise on
	// the process instance.
	Variables Variables `json:"variables,omitempty"`
	// LocalVariables are set on the task's execution only.
	LocalVariables Variables `json:"localVariables,omitempty"`
}

// Complete completes a task locked by r.WorkerID. A File variable without content (as
// fetchAndLock returns Files) is refused before sending, with ErrNoContent.
func (c *Client) Complete(ctx context.Context, taskID string, r CompleteRequest) error {
	op := "complete external task " + taskID
	if err := checkTask(op, taskID, r.WorkerID); err != nil {
		return err
	}
	if err := checkContent(op, r.Variables, r.LocalVariables); err != nil {
		return err
	}
	return c.taskPost(ctx, op, taskID, "complete", r)
}

// FailureRequest is the body of POST /external-task/{id}/failure.
type FailureRequest struct {
	WorkerID     string
	ErrorMessage string
	ErrorDetails string
	// Retries is the number of retries left; it is always sent. The engine never counts
	// down itself, and 0 creates a failedExternalTask incident.
	Retries int
	// RetryTimeout keeps the task locked (unfetchable) for this long; millisecond precision.
	RetryTimeout   time.Duration
	Variables      Variables
	LocalVariables Variables
}

type failureDto struct {
	WorkerID       string    `json:"workerId"`
	ErrorMessage   string    `json:"errorMessage,omitempty"`
	ErrorDetails   string    `json:"errorDetails,omitempty"`
	Retries        int       `json:"retries"`
	RetryTimeout   int64     `json:"retryTimeout"`
	Variables      Variables `json:"variables,omitempty"`
	LocalVariables Variables `json:"localVariables,omitempty"`
}

// Failure reports a failure. With Retries > 0 the task is fetchable again after
// RetryTimeout; with Retries 0 it gets an incident.
func (c *Client) Failure(ctx context.Context, taskID string, r FailureRequest) error {
	op := "report failure of external task " + taskID
	if err := checkTask(op, taskID, r.WorkerID); err != nil {
		return err
	}
	if r.Retries < 0 || r.RetryTimeout < 0 {
		return invalid(op, "Retries %d and RetryTimeout %v must not be negative", r.Retries, r.RetryTimeout)
	}
	if err := checkContent(op, r.Variables, r.LocalVariables); err != nil {
		return err
	}
	return c.taskPost(ctx, op, taskID, "failure", failureDto{
		WorkerID: r.WorkerID, ErrorMessage: r.ErrorMessage, ErrorDetails: r.ErrorDetails,
		Retries: r.Retries, RetryTimeout: r.RetryTimeout.Milliseconds(),
		Variables: r.Variables, LocalVariables: r.LocalVariables,
	})
}

// BPMNErrorRequest is the body of POST /external-task/{id}/bpmnError.
type BPMNErrorRequest struct {
	WorkerID     string    `json:"workerId"`
	ErrorCode    string    `json:"errorCode"`
	ErrorMessage string    `json:"errorMessage,omitempty"`
	Variables    Variables `json:"variables,omitempty"`
}

// BPMNError throws a BPMN error from the task. Without a matching catch event the
// activity simply ends.
func (c *Client) BPMNError(ctx context.Context, taskID string, r BPMNErrorRequest) error {
	op := "report BPMN error of external task " + taskID
	if err := checkTask(op, taskID, r.WorkerID); err != nil {
		return err
	}
	if r.ErrorCode == "" {
		return invalid(op, "ErrorCode is empty")
	}
	if err := checkContent(op, r.Variables); err != nil {
		return err
	}
	return c.taskPost(ctx, op, taskID, "bpmnError", r)
}

// ExtendLock sets the lock to expire newDuration from now (not from the old expiry).
// A lock that already expired cannot be extended: ErrLockExpired (which also matches
// ErrLockLost) while nobody else has taken the task, and Lock can then take it back.
func (c *Client) ExtendLock(ctx context.Context, taskID, workerID string, newDuration time.Duration) error {
	op := "extend lock of external task " + taskID
	if err := checkTask(op, taskID, workerID); err != nil {
		return err
	}
	if newDuration.Milliseconds() <= 0 {
		return invalid(op, "newDuration %v must be at least 1ms", newDuration)
	}
	return c.taskPost(ctx, op, taskID, "extendLock", map[string]any{"workerId": workerID, "newDuration": newDuration.Milliseconds()})
}

// Lock locks a task without fetching it: allowed when it is unlocked, its lock has
// expired, or workerID already holds it (then it acts as ExtendLock). Engine 7.15+.
func (c *Client) Lock(ctx context.Context, taskID, workerID string, lockDuration time.Duration) error {
	op := "lock external task " + taskID
	if err := checkTask(op, taskID, workerID); err != nil {
		return err
	}
	if lockDuration.Milliseconds() <= 0 {
		return invalid(op, "lockDuration %v must be at least 1ms", lockDuration)
	}
	return c.taskPost(ctx, op, taskID, "lock", map[string]any{"workerId": workerID, "lockDuration": lockDuration.Milliseconds()})
}

// Unlock releases a task's lock, whoever holds it, and wakes pending long polls.
func (c *Client) Unlock(ctx context.Context, taskID string) error {
	op := "unlock external task " + taskID
	if taskID == "" {
		return invalid(op, "task id is empty")
	}
	return c.taskPost(ctx, op, taskID, "unlock", nil)
}

// ExternalTask returns one task. ErrTaskGone once it is completed or cancelled.
func (c *Client) ExternalTask(ctx context.Context, taskID string) (*ExternalTask, error) {
	op := "get external task " + taskID
	if taskID == "" {
		return nil, invalid(op, "task id is empty")
	}
	var t ExternalTask
	err := c.do(ctx, call{op: op, method: http.MethodGet, path: taskPath(taskID, ""), out: &t, taskEndpoint: true})
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// ExternalTaskErrorDetails returns the errorDetails of the task's last failure, or ""
// when it has none. The engine answers an unknown id with a 500, mapped to ErrTaskGone.
func (c *Client) ExternalTaskErrorDetails(ctx context.Context, taskID string) (string, error) {
	op := "get error details of external task " + taskID
	if taskID == "" {
		return "", invalid(op, "task id is empty")
	}
	var s string
	// The engine's quirk, "No external task found with id ...: externalTask is null", is
	// one of the answers classify reads as ErrTaskGone (taskGoneAnswer).
	err := c.do(ctx, call{op: op, method: http.MethodGet, path: taskPath(taskID, "errorDetails"), out: &s, taskEndpoint: true})
	return s, err
}

// SetExternalTaskRetries sets a task's retries. 0 creates an incident; a positive value
// after 0 resolves it and makes the task fetchable again.
func (c *Client) SetExternalTaskRetries(ctx context.Context, taskID string, retries int) error {
	op := "set retries of external task " + taskID
	if taskID == "" {
		return invalid(op, "task id is empty")
	}
	return c.do(ctx, call{op: op, method: http.MethodPut, path: taskPath(taskID, "retries"),
		body: map[string]int{"retries": retries}, taskEndpoint: true})
}

// SetExternalTaskPriority sets a task's priority.
func (c *Client) SetExternalTaskPriority(ctx context.Context, taskID string, priority int64) error {
	op := "set priority of external task " + taskID
	if taskID == "" {
		return invalid(op, "task id is empty")
	}
	return c.do(ctx, call{op: op, method: http.MethodPut, path: taskPath(taskID, "priority"),
		body: map[string]int64{"priority": priority}, taskEndpoint: true})
}

// ExternalTaskQuery filters GET /external-task. Zero fields do not filter.
type ExternalTaskQuery struct {
	ExternalTaskID       string
	TopicName            string
	WorkerID             string
	ActivityID           string
	ProcessInstanceID    string
	ProcessDefinitionKey string
	Locked               bool
	NotLocked            bool
	WithRetriesLeft      bool
	NoRetriesLeft        bool
	// Active leaves out the tasks of suspended process instances.
	Active bool
	// LockExpirationBefore and LockExpirationAfter, if set, keep only tasks whose lock
	// ends (or ended) before, or after, them: tasks never locked, or unlocked, have no
	// lock end and are left out.
	LockExpirationBefore, LockExpirationAfter time.Time
	// ByLockExpiration sorts the result by lock end, earliest first.
	ByLockExpiration bool
	// MaxResults caps the result; 0 means the engine's default (all).
	MaxResults int
}

func (q ExternalTaskQuery) values() url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	flag := func(k string, b bool) {
		if b {
			v.Set(k, "true")
		}
	}
	set("externalTaskId", q.ExternalTaskID)
	set("topicName", q.TopicName)
	set("workerId", q.WorkerID)
	set("activityId", q.ActivityID)
	set("processInstanceId", q.ProcessInstanceID)
	set("processDefinitionKey", q.ProcessDefinitionKey)
	flag("locked", q.Locked)
	flag("notLocked", q.NotLocked)
	flag("withRetriesLeft", q.WithRetriesLeft)
	flag("noRetriesLeft", q.NoRetriesLeft)
	flag("active", q.Active)
	if !q.LockExpirationBefore.IsZero() {
		v.Set("lockExpirationBefore", FormatDate(q.LockExpirationBefore))
	}
	if !q.LockExpirationAfter.IsZero() {
		v.Set("lockExpirationAfter", FormatDate(q.LockExpirationAfter))
	}
	if q.ByLockExpiration {
		v.Set("sortBy", "lockExpirationTime")
		v.Set("sortOrder", "asc")
	}
	if q.MaxResults > 0 {
		v.Set("maxResults", strconv.Itoa(q.MaxResults))
	}
	return v
}

// ExternalTasks queries tasks (GET /external-task).
func (c *Client) ExternalTasks(ctx context.Context, q ExternalTaskQuery) ([]ExternalTask, error) {
	var out []ExternalTask
	err := c.do(ctx, call{op: "query external tasks", method: http.MethodGet, path: "/external-task", query: q.values(), out: &out})
	return out, err
}

// WakeLongPolls wakes the engine's long-poll handler, which then fetches again for every
// long poll pending on it, of every client. A task whose lock or retry timeout ran out
// wakes nothing on the engine (docs/engine-facts.md): without a wake it waits for the
// next poll to end. The wake is a fetchAndLock for no task (maxTasks 0) that has to
// wait a millisecond: it locks nothing and answers at once. Only the engine node that
// receives it is woken.
func (c *Client) WakeLongPolls(ctx context.Context, workerID string) error {
	const op = "wake long polls"
	if workerID == "" {
		return invalid(op, "WorkerID is empty")
	}
	var out []LockedExternalTask
	return c.do(ctx, call{op: op, method: http.MethodPost, path: "/external-task/fetchAndLock",
		body: wakeDto{WorkerID: workerID, AsyncResponseTimeout: 1, Topics: []fetchTopicDto{}}, out: &out})
}

// wakeDto is WakeLongPolls' body: maxTasks 0 is written, not left out.
type wakeDto struct {
	WorkerID             string          `json:"workerId"`
	MaxTasks             int             `json:"maxTasks"`
	AsyncResponseTimeout int64           `json:"asyncResponseTimeout"`
	Topics               []fetchTopicDto `json:"topics"`
}

// checkTask rejects a per-task call missing its identifiers before anything is sent.
func checkTask(op, taskID, workerID string) error {
	if taskID == "" {
		return invalid(op, "task id is empty")
	}
	if workerID == "" {
		return invalid(op, "WorkerID is empty")
	}
	return nil
}

func (c *Client) taskPost(ctx context.Context, op, taskID, action string, body any) error {
	return c.do(ctx, call{op: op, method: http.MethodPost, path: taskPath(taskID, action), body: body, taskEndpoint: true})
}

// taskPath is the path of one external task, or of its sub-resource action when set.
func taskPath(taskID, action string) string {
	p := "/external-task/" + url.PathEscape(taskID)
	if action != "" {
		p += "/" + action
	}
	return p
}
