package taskstest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/tasks"
)

// Engine is an in-memory Camunda 7 engine for external tasks: enough of fetchAndLock
// (with long polling, every topic filter and the variable selection), complete, failure,
// bpmnError, extendLock, lock, unlock and the task queries to run a real tasks.Worker
// against, with no engine and no network. Its answers and errors are those of a
// *camunda7.Client talking to a real engine, for what it implements:
//
//   - fetchAndLock returns only the variables a topic asks for (none unless named, every
//     one with AllVariables, only the task's local ones with LocalVariables), as they
//     come over the wire (File variables without their content), and only tasks that
//     match every filter of the topic;
//   - a failure with retries left keeps the task locked for the retry timeout; with
//     retries 0 the task has an incident and is not fetched again;
//   - complete and bpmnError remove the task: later calls for it answer 404
//     (camunda7.ErrTaskGone); a call by a worker that does not hold the lock answers 400
//     (camunda7.ErrLockLost), and extending a lock that ran out answers
//     camunda7.ErrLockExpired;
//   - variables that cannot be encoded are refused before "sending", as the client
//     refuses them (camunda7.ErrInvalidArgument);
//   - a String variable the engine's database cannot store (more than
//     tasks.MaxStringLength characters, or a NUL character) is refused as the engine
//     refuses it: 500 ProcessEnginePersistenceException, the task still locked for the
//     worker, nothing of the report applied.
//
// Processes are not modelled: completing a task creates no next task, and a BPMN error
// is recorded, not caught. Use Run (or Handle) to test a handler; use an Engine directly
// to run a worker of your own configuration (tasks.New(engine, reg, cfg)) over several
// tasks added with Add, and read each one's Result. Its methods are safe for concurrent
// use.
type Engine struct {
	mu       sync.Mutex
	tasks    map[string]*engineTask
	order    []*engineTask         // in creation order
	changed  chan struct{}         // closed and replaced whenever a task may have become fetchable
	closed   bool                  // Close: every fetch answers at once, empty
	released map[string]bool       // worker ids whose fetches answer at once, empty
	watches  map[string]*watchTask // tasks Handle waits for, by id
	seq      int
}

var _ tasks.Engine = (*Engine)(nil)

type engineTask struct {
	ext       camunda7.ExternalTask
	details   string
	vars      camunda7.Variables // visible from the task, as the engine stores them
	local     camunda7.Variables // local to the task's execution
	props     map[string]string
	lockUntil time.Time
	gone      bool // completed or a BPMN error thrown
	once      bool // delivered at most once (Handle)
	log       []camunda7.ExternalTaskLogEntry
	res       Result
}

// watchTask tells Handle that no topic of its worker's fetch matches the task.
type watchTask struct {
	mismatch chan string // buffered 1
}

// NewEngine returns an empty engine.
func NewEngine() *Engine {
	return &Engine{tasks: map[string]*engineTask{}, changed: make(chan struct{}), released: map[string]bool{}, watches: map[string]*watchTask{}}
}

// Add creates an external task and returns its id (t.ID, or one made up). It fails for
// a task without a topic, a duplicate id, or variables that could not be sent to an
// engine (the error names the variable).
func (e *Engine) Add(t Task) (string, error) {
	return e.add(t, false)
}

func (e *Engine) add(t Task, once bool) (string, error) {
	if t.Topic == "" {
		return "", errors.New("taskstest: the task has no Topic")
	}
	vars, err := wire(t.Variables)
	if err != nil {
		return "", fmt.Errorf("taskstest: task Variables: %w", err)
	}
	local, err := wire(t.LocalVariables)
	if err != nil {
		return "", fmt.Errorf("taskstest: task LocalVariables: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq++
	n := strconv.Itoa(e.seq)
	or := cmp.Or[string]
	id := or(t.ID, "task-"+n)
	if _, dup := e.tasks[id]; dup {
		return "", fmt.Errorf("taskstest: a task with id %q exists already", id)
	}
	pdKey := or(t.ProcessDefinitionKey, "process")
	et := &engineTask{
		ext: camunda7.ExternalTask{
			ID: id, TopicName: t.Topic,
			ActivityID: or(t.ActivityID, "Activity_"+t.Topic), ActivityInstanceID: "Activity_" + t.Topic + ":" + n,
			ExecutionID: or(t.ExecutionID, "execution-"+n), ProcessInstanceID: or(t.ProcessInstanceID, "process-instance-"+n),
			ProcessDefinitionKey: pdKey, ProcessDefinitionID: or(t.ProcessDefinitionID, pdKey+":1:definition"),
			ProcessDefinitionVersionTag: t.ProcessDefinitionVersionTag,
			BusinessKey:                 t.BusinessKey, TenantID: t.TenantID, Priority: t.Priority,
			Retries: t.Retries, ErrorMessage: t.ErrorMessage,
			CreateTime: camunda7.Time{Time: time.Now()},
		},
		details: t.ErrorDetails, vars: vars, local: local, props: maps.Clone(t.ExtensionProperties), once: once,
	}
	et.logEntry(func(l *camunda7.ExternalTaskLogEntry) { l.CreationLog = true })
	e.tasks[id] = et
	e.order = append(e.order, et)
	e.wake()
	return id, nil
}

// Result returns what the engine has seen of the task: its outcome, and what its last
// fetch asked for and gave the handler. Outcome and Classification, which only the
// worker knows, are empty. ok is false for an unknown id.
func (e *Engine) Result(id string) (res Result, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t, ok := e.tasks[id]
	if !ok {
		return Result{}, false
	}
	return t.res, true
}

// Close makes every pending and later fetchAndLock answer at once with no tasks, so that
// a worker stops without waiting out its long poll. The other calls still work.
func (e *Engine) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	e.wake()
}

// release is Close for one worker id.
func (e *Engine) release(workerID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.released[workerID] = true
	e.wake()
}

// wake tells pending long polls that something changed. e.mu must be held.
func (e *Engine) wake() {
	close(e.changed)
	e.changed = make(chan struct{})
}

func (e *Engine) watch(id string) *watchTask {
	e.mu.Lock()
	defer e.mu.Unlock()
	w := &watchTask{mismatch: make(chan string, 1)}
	e.watches[id] = w
	return w
}

// FetchAndLock locks up to r.MaxTasks tasks of r's topics that match the topics'
// filters, higher priority first with r.UsePriority, and returns them with the variables
// each topic asks for. With none available it waits for one for r.AsyncResponseTimeout.
func (e *Engine) FetchAndLock(ctx context.Context, r camunda7.FetchAndLockRequest) ([]camunda7.LockedExternalTask, error) {
	const op = "fetch and lock external tasks"
	if err := checkFetch(r); err != nil {
		return nil, invalid(op, "%v", err)
	}
	deadline := time.Now().Add(r.AsyncResponseTimeout)
	for {
		e.mu.Lock()
		if e.closed || e.released[r.WorkerID] {
			e.mu.Unlock()
			return []camunda7.LockedExternalTask{}, nil
		}
		got, next := e.lock(r)
		changed := e.changed
		e.mu.Unlock()
		wait := time.Until(deadline)
		if len(got) > 0 || wait <= 0 {
			return got, nil
		}
		if !next.IsZero() {
			wait = min(wait, time.Until(next)+time.Millisecond)
		}
		timer := time.NewTimer(wait)
		select {
		case <-changed:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, &lostAnswer{op: op, err: ctx.Err()}
		}
		timer.Stop()
	}
}

// lock locks the tasks r gets. It returns them, and the earliest time a task of r's
// topics that is locked now unlocks (zero if none). e.mu must be held.
func (e *Engine) lock(r camunda7.FetchAndLockRequest) ([]camunda7.LockedExternalTask, time.Time) {
	now := time.Now()
	var next time.Time
	type candidate struct {
		t     *engineTask
		topic camunda7.FetchTopic
	}
	var cands []candidate
	for _, t := range e.order {
		if t.gone || (t.ext.Retries != nil && *t.ext.Retries == 0) || (t.once && t.res.Deliveries > 0) {
			continue
		}
		var matched *camunda7.FetchTopic
		var why []string
		for i := range r.Topics {
			if ok, reason := matches(r.Topics[i], t); ok {
				matched = &r.Topics[i]
				break
			} else if reason != "" {
				why = append(why, reason)
			}
		}
		if matched == nil {
			if w := e.watches[t.ext.ID]; w != nil && t.lockUntil.Before(now) {
				reason := fmt.Sprintf("no topic of the worker's fetch is named %q", t.ext.TopicName)
				if len(why) > 0 {
					reason = why[0]
				}
				select {
				case w.mismatch <- reason:
				default:
				}
			}
			continue
		}
		if now.Before(t.lockUntil) {
			if next.IsZero() || t.lockUntil.Before(next) {
				next = t.lockUntil
			}
			continue
		}
		cands = append(cands, candidate{t, *matched})
	}
	if r.UsePriority {
		slices.SortStableFunc(cands, func(a, b candidate) int { return cmp.Compare(b.t.ext.Priority, a.t.ext.Priority) })
	}
	var out []camunda7.LockedExternalTask
	for _, c := range cands[:min(len(cands), r.MaxTasks)] {
		t := c.t
		t.ext.WorkerID = r.WorkerID
		t.lockUntil = now.Add(c.topic.LockDuration)
		t.ext.LockExpirationTime = camunda7.Time{Time: t.lockUntil}
		vars := t.selectVariables(c.topic)
		t.res.Deliveries++
		t.res.Fetch = c.topic
		t.res.Fetched = vars
		lt := camunda7.LockedExternalTask{ExternalTask: t.ext, ErrorDetails: t.details, Variables: maps.Clone(vars)}
		if c.topic.IncludeExtensionProperties {
			lt.ExtensionProperties = maps.Clone(t.props)
			if lt.ExtensionProperties == nil {
				lt.ExtensionProperties = map[string]string{}
			}
		}
		out = append(out, lt)
	}
	return out, next
}

// matches reports whether topic fetches t and, when it has t's name but a filter
// excludes t, which filter.
func matches(topic camunda7.FetchTopic, t *engineTask) (bool, string) {
	x := t.ext
	if topic.TopicName != x.TopicName {
		return false, ""
	}
	differs := func(filter string, want any, got string) (bool, string) {
		return false, fmt.Sprintf("topic %q: filter %s %v does not match the task's %q", topic.TopicName, filter, want, got)
	}
	switch {
	case topic.BusinessKey != "" && topic.BusinessKey != x.BusinessKey:
		return differs("BusinessKey", strconv.Quote(topic.BusinessKey), x.BusinessKey)
	case topic.ProcessDefinitionID != "" && topic.ProcessDefinitionID != x.ProcessDefinitionID:
		return differs("ProcessDefinitionID", strconv.Quote(topic.ProcessDefinitionID), x.ProcessDefinitionID)
	case len(topic.ProcessDefinitionIDIn) > 0 && !slices.Contains(topic.ProcessDefinitionIDIn, x.ProcessDefinitionID):
		return differs("ProcessDefinitionIDIn", topic.ProcessDefinitionIDIn, x.ProcessDefinitionID)
	case topic.ProcessDefinitionKey != "" && topic.ProcessDefinitionKey != x.ProcessDefinitionKey:
		return differs("ProcessDefinitionKey", strconv.Quote(topic.ProcessDefinitionKey), x.ProcessDefinitionKey)
	case len(topic.ProcessDefinitionKeyIn) > 0 && !slices.Contains(topic.ProcessDefinitionKeyIn, x.ProcessDefinitionKey):
		return differs("ProcessDefinitionKeyIn", topic.ProcessDefinitionKeyIn, x.ProcessDefinitionKey)
	case topic.ProcessDefinitionVersionTag != "" && topic.ProcessDefinitionVersionTag != x.ProcessDefinitionVersionTag:
		return differs("ProcessDefinitionVersionTag", strconv.Quote(topic.ProcessDefinitionVersionTag), x.ProcessDefinitionVersionTag)
	case len(topic.TenantIDIn) > 0 && !slices.Contains(topic.TenantIDIn, x.TenantID):
		return differs("TenantIDIn", topic.TenantIDIn, x.TenantID)
	case topic.WithoutTenantID && x.TenantID != "":
		return differs("WithoutTenantID", true, x.TenantID)
	}
	for _, name := range slices.Sorted(maps.Keys(topic.ProcessVariables)) {
		if !sameValue(t.vars[name], topic.ProcessVariables[name]) {
			return false, fmt.Sprintf("topic %q: filter ProcessVariables[%q] does not match the task's variable", topic.TopicName, name)
		}
	}
	return true, ""
}

// sameValue reports whether a process variable equals a ProcessVariables filter value,
// compared as JSON.
func sameValue(v camunda7.Variable, want any) bool {
	if v.Type == "" {
		return false
	}
	got, err := v.Decode()
	if err != nil {
		return false
	}
	a, errA := json.Marshal(got)
	b, errB := json.Marshal(want)
	return errA == nil && errB == nil && bytes.Equal(a, b)
}

// selectVariables returns the variables topic asks for, as fetchAndLock sends them.
func (t *engineTask) selectVariables(topic camunda7.FetchTopic) camunda7.Variables {
	visible := t.local
	if !topic.LocalVariables {
		visible = maps.Clone(t.vars)
		if visible == nil {
			visible = camunda7.Variables{}
		}
		maps.Copy(visible, t.local) // a local variable hides one of the same name further out
	}
	out := camunda7.Variables{}
	for name, v := range visible {
		if topic.AllVariables || slices.Contains(topic.Variables, name) {
			if strings.EqualFold(v.Type, camunda7.TypeFile) {
				v.Value = nil // the engine sends a File's metadata, never its content
			}
			out[name] = v
		}
	}
	return out
}

func (t *engineTask) logEntry(set func(*camunda7.ExternalTaskLogEntry)) {
	l := camunda7.ExternalTaskLogEntry{ID: fmt.Sprintf("%s-log-%d", t.ext.ID, len(t.log)+1), ExternalTaskID: t.ext.ID,
		TopicName: t.ext.TopicName, WorkerID: t.ext.WorkerID, Retries: t.ext.Retries, ErrorMessage: t.ext.ErrorMessage,
		Timestamp: camunda7.Time{Time: time.Now()}}
	set(&l)
	t.log = append(t.log, l)
}

// Complete completes the task, if r.WorkerID holds its lock.
func (e *Engine) Complete(ctx context.Context, taskID string, r camunda7.CompleteRequest) error {
	op := "complete external task " + taskID
	vars, local, err := checkReport(op, taskID, r.WorkerID, r.Variables, r.LocalVariables)
	if err != nil {
		return err
	}
	return e.report(op, taskID, r.WorkerID, unstorable(op, vars, local), func(t *engineTask) {
		t.gone = true
		t.res.Completed = &Completed{Variables: vars, LocalVariables: local}
		t.logEntry(func(l *camunda7.ExternalTaskLogEntry) { l.SuccessLog = true })
	})
}

// BPMNError throws a BPMN error from the task, if r.WorkerID holds its lock: the task
// ends.
func (e *Engine) BPMNError(ctx context.Context, taskID string, r camunda7.BPMNErrorRequest) error {
	op := "report BPMN error of external task " + taskID
	if err := checkTask(op, taskID, r.WorkerID); err != nil {
		return err
	}
	if r.ErrorCode == "" {
		return invalid(op, "ErrorCode is empty")
	}
	vars, _, err := checkReport(op, taskID, r.WorkerID, r.Variables, nil)
	if err != nil {
		return err
	}
	return e.report(op, taskID, r.WorkerID, unstorable(op, vars, nil), func(t *engineTask) {
		t.gone = true
		t.res.BPMNError = &BPMNError{Code: r.ErrorCode, Message: r.ErrorMessage, Variables: vars}
	})
}

// Failure reports a failure, if r.WorkerID holds the task's lock: with retries left the
// task stays locked for r.RetryTimeout; with none it has an incident.
func (e *Engine) Failure(ctx context.Context, taskID string, r camunda7.FailureRequest) error {
	op := "report failure of external task " + taskID
	if r.Retries < 0 || r.RetryTimeout < 0 {
		return invalid(op, "Retries %d and RetryTimeout %v must not be negative", r.Retries, r.RetryTimeout)
	}
	vars, local, err := checkReport(op, taskID, r.WorkerID, r.Variables, r.LocalVariables)
	if err != nil {
		return err
	}
	return e.report(op, taskID, r.WorkerID, unstorable(op, vars, local), func(t *engineTask) {
		retries := r.Retries
		t.ext.Retries = &retries
		t.ext.ErrorMessage = r.ErrorMessage
		t.details = r.ErrorDetails
		t.lockUntil = time.Now().Add(r.RetryTimeout)
		t.ext.LockExpirationTime = camunda7.Time{Time: t.lockUntil}
		t.vars = merge(t.vars, vars)
		t.local = merge(t.local, local)
		t.res.Failure = &Failure{Message: r.ErrorMessage, Details: r.ErrorDetails, Retries: r.Retries, RetryTimeout: r.RetryTimeout}
		t.logEntry(func(l *camunda7.ExternalTaskLogEntry) { l.FailureLog = true })
	})
}

// report applies a report by workerID to the task, or answers refused (the engine's
// answer when the report cannot be stored) if the task is there and workerID holds it.
func (e *Engine) report(op, taskID, workerID string, refused error, apply func(*engineTask)) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	t, err := e.find(op, taskID)
	if err != nil {
		return err
	}
	if t.ext.WorkerID != workerID {
		return lockedBy(op, t, workerID, "cannot be reported by")
	}
	if refused != nil {
		return refused
	}
	apply(t)
	e.wake()
	return nil
}

// ExtendLock sets the lock of a task workerID holds to expire newDuration from now.
func (e *Engine) ExtendLock(ctx context.Context, taskID, workerID string, newDuration time.Duration) error {
	op := "extend lock of external task " + taskID
	if err := checkTask(op, taskID, workerID); err != nil {
		return err
	}
	if newDuration.Milliseconds() <= 0 {
		return invalid(op, "newDuration %v must be at least 1ms", newDuration)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	t, err := e.find(op, taskID)
	if err != nil {
		return err
	}
	switch {
	case t.ext.WorkerID != workerID:
		return lockedBy(op, t, workerID, "cannot be extended by")
	case t.lockUntil.Before(time.Now()):
		return answer(op, http.StatusBadRequest, "Cannot extend a lock that expired", camunda7.ErrLockExpired)
	}
	t.lockUntil = time.Now().Add(newDuration)
	t.ext.LockExpirationTime = camunda7.Time{Time: t.lockUntil}
	return nil
}

// Lock locks the task for workerID, unless another worker holds a lock on it that has
// not expired.
func (e *Engine) Lock(ctx context.Context, taskID, workerID string, lockDuration time.Duration) error {
	op := "lock external task " + taskID
	if err := checkTask(op, taskID, workerID); err != nil {
		return err
	}
	if lockDuration.Milliseconds() <= 0 {
		return invalid(op, "lockDuration %v must be at least 1ms", lockDuration)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	t, err := e.find(op, taskID)
	if err != nil {
		return err
	}
	if t.ext.WorkerID != "" && t.ext.WorkerID != workerID && time.Now().Before(t.lockUntil) {
		return lockedBy(op, t, workerID, "cannot be locked by")
	}
	t.ext.WorkerID = workerID
	t.lockUntil = time.Now().Add(lockDuration)
	t.ext.LockExpirationTime = camunda7.Time{Time: t.lockUntil}
	return nil
}

// Unlock releases the task's lock, whoever holds it.
func (e *Engine) Unlock(ctx context.Context, taskID string) error {
	op := "unlock external task " + taskID
	if taskID == "" {
		return invalid(op, "task id is empty")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	t, err := e.find(op, taskID)
	if err != nil {
		return err
	}
	t.ext.WorkerID = ""
	t.lockUntil = time.Time{}
	t.ext.LockExpirationTime = camunda7.Time{}
	t.res.Unlocked = true
	e.wake()
	return nil
}

// ExternalTask returns the task; camunda7.ErrTaskGone once it is completed or a BPMN
// error was thrown.
func (e *Engine) ExternalTask(ctx context.Context, taskID string) (*camunda7.ExternalTask, error) {
	op := "get external task " + taskID
	if taskID == "" {
		return nil, invalid(op, "task id is empty")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	t, err := e.find(op, taskID)
	if err != nil {
		return nil, err
	}
	x := t.current()
	return &x, nil
}

// ExternalTasks returns the tasks that exist and match q.
func (e *Engine) ExternalTasks(ctx context.Context, q camunda7.ExternalTaskQuery) ([]camunda7.ExternalTask, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	out := []camunda7.ExternalTask{}
	for _, t := range e.order {
		x := t.current()
		locked := now.Before(t.lockUntil)
		noRetries := x.Retries != nil && *x.Retries == 0
		switch {
		case t.gone,
			q.ExternalTaskID != "" && q.ExternalTaskID != x.ID,
			q.TopicName != "" && q.TopicName != x.TopicName,
			q.WorkerID != "" && q.WorkerID != x.WorkerID,
			q.ActivityID != "" && q.ActivityID != x.ActivityID,
			q.ProcessInstanceID != "" && q.ProcessInstanceID != x.ProcessInstanceID,
			q.ProcessDefinitionKey != "" && q.ProcessDefinitionKey != x.ProcessDefinitionKey,
			q.Locked && !locked, q.NotLocked && locked,
			q.WithRetriesLeft && noRetries, q.NoRetriesLeft && !noRetries:
			continue
		}
		out = append(out, x)
		if q.MaxResults > 0 && len(out) == q.MaxResults {
			break
		}
	}
	return out, nil
}

// ExternalTaskLog returns the history of the tasks, filtered by externalTaskId if q has
// it: a creation entry, and one per failure (failureLog) and completion (successLog).
func (e *Engine) ExternalTaskLog(ctx context.Context, q url.Values) ([]camunda7.ExternalTaskLogEntry, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := []camunda7.ExternalTaskLogEntry{}
	for _, t := range e.order {
		if id := q.Get("externalTaskId"); id == "" || id == t.ext.ID {
			out = append(out, t.log...)
		}
	}
	return out, nil
}

// current returns the task as the task query shows it now.
func (t *engineTask) current() camunda7.ExternalTask {
	x := t.ext
	if x.Retries != nil {
		r := *x.Retries
		x.Retries = &r
	}
	return x
}

// find returns the task, or the engine's 404 answer. e.mu must be held.
func (e *Engine) find(op, taskID string) (*engineTask, error) {
	t, ok := e.tasks[taskID]
	if !ok || t.gone {
		return nil, answer(op, http.StatusNotFound, fmt.Sprintf("External task with id %s does not exist", taskID), camunda7.ErrTaskGone)
	}
	return t, nil
}

func lockedBy(op string, t *engineTask, workerID, verb string) error {
	return answer(op, http.StatusBadRequest, fmt.Sprintf("External Task %s %s worker '%s'. It is locked by worker '%s'.",
		t.ext.ID, verb, workerID, t.ext.WorkerID), camunda7.ErrLockLost)
}

func checkFetch(r camunda7.FetchAndLockRequest) error {
	switch {
	case r.WorkerID == "":
		return errors.New("WorkerID is empty")
	case r.MaxTasks <= 0:
		return fmt.Errorf("MaxTasks %d: must be > 0", r.MaxTasks)
	case len(r.Topics) == 0:
		return errors.New("no topics")
	case r.AsyncResponseTimeout < 0 || r.AsyncResponseTimeout > camunda7.MaxAsyncResponseTimeout:
		return fmt.Errorf("AsyncResponseTimeout %v: must be between 0 and %v", r.AsyncResponseTimeout, camunda7.MaxAsyncResponseTimeout)
	}
	for _, t := range r.Topics {
		if t.TopicName == "" {
			return errors.New("a topic has an empty TopicName")
		}
		if t.LockDuration.Milliseconds() <= 0 {
			return fmt.Errorf("topic %q: LockDuration %v must be at least 1ms", t.TopicName, t.LockDuration)
		}
	}
	return nil
}

func checkTask(op, taskID, workerID string) error {
	if taskID == "" {
		return invalid(op, "task id is empty")
	}
	if workerID == "" {
		return invalid(op, "WorkerID is empty")
	}
	return nil
}

// checkReport checks a report's ids and encodes its variables as the client would,
// returning them as the engine would store them.
func checkReport(op, taskID, workerID string, vars, local camunda7.Variables) (camunda7.Variables, camunda7.Variables, error) {
	if err := checkTask(op, taskID, workerID); err != nil {
		return nil, nil, err
	}
	var out [2]camunda7.Variables
	for i, vs := range []camunda7.Variables{vars, local} {
		for _, name := range slices.Sorted(maps.Keys(vs)) {
			if v := vs[name]; strings.EqualFold(v.Type, camunda7.TypeFile) && isNull(v.Value) {
				return nil, nil, invalid(op, "encode request: %w", &camunda7.VariableError{Name: name, Type: v.Type,
					Err: errors.New("File variable has no content (fetched Files carry only their metadata)")})
			}
		}
		w, err := wire(vs)
		if err != nil {
			return nil, nil, invalid(op, "encode request: %w", err)
		}
		out[i] = w
	}
	return out[0], out[1], nil
}

// unstorable is the engine's answer to a report with a String variable its database
// refuses (camunda7's conformance suite pins it: a varchar(4000) column, in characters,
// in PostgreSQL, which stores no NUL), or nil.
func unstorable(op string, vss ...camunda7.Variables) error {
	for _, vs := range vss {
		for _, name := range slices.Sorted(maps.Keys(vs)) {
			if !strings.EqualFold(vs[name].Type, camunda7.TypeString) {
				continue
			}
			var s string
			if json.Unmarshal(vs[name].Value, &s) == nil && (utf8.RuneCountInString(s) > tasks.MaxStringLength || strings.ContainsRune(s, 0)) {
				return &engineError{err: &camunda7.Error{Op: op, StatusCode: http.StatusInternalServerError, Type: "ProcessEnginePersistenceException",
					Message: "An exception occurred in the persistence layer. Please check the server logs for a detailed message and the entire exception stack trace."}}
			}
		}
	}
	return nil
}

// merge returns dst with src's variables set on it.
func merge(dst, src camunda7.Variables) camunda7.Variables {
	if len(src) == 0 {
		return dst
	}
	if dst == nil {
		dst = camunda7.Variables{}
	}
	maps.Copy(dst, src)
	return dst
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// wire returns vs as it arrives after a trip through JSON, as variables travel to and
// from the engine; nil stays nil.
func wire(vs camunda7.Variables) (camunda7.Variables, error) {
	if vs == nil {
		return nil, nil
	}
	b, err := json.Marshal(vs)
	if err != nil {
		return nil, err
	}
	var out camunda7.Variables
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// engineError is an engine answer, classified as the client classifies it: errors.As
// finds the *camunda7.Error, errors.Is the sentinel.
type engineError struct {
	err  *camunda7.Error
	kind error
}

func answer(op string, status int, msg string, kind error) error {
	return &engineError{err: &camunda7.Error{Op: op, StatusCode: status, Type: "RestException", Message: msg}, kind: kind}
}

func (e *engineError) Error() string { return e.err.Error() }
func (e *engineError) Unwrap() error { return e.err }
func (e *engineError) Is(target error) bool {
	return target == e.kind || (e.kind == camunda7.ErrLockExpired && target == camunda7.ErrLockLost)
}

// argError is a request refused before sending, as the client refuses it.
type argError struct {
	op  string
	err error
}

func invalid(op, format string, args ...any) error {
	return &argError{op: op, err: fmt.Errorf(format, args...)}
}

func (e *argError) Error() string { return e.op + ": " + e.err.Error() }
func (e *argError) Unwrap() error { return e.err }
func (e *argError) Is(target error) bool {
	return target == camunda7.ErrInvalidArgument || target == camunda7.ErrNotSent
}

// lostAnswer is a request whose answer never came (its context ended while it waited).
type lostAnswer struct {
	op  string
	err error
}

func (e *lostAnswer) Error() string        { return e.op + ": sent, no answer: " + e.err.Error() }
func (e *lostAnswer) Unwrap() error        { return e.err }
func (e *lostAnswer) Is(target error) bool { return target == camunda7.ErrUnknownOutcome }
