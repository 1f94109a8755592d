// Package inboxtest holds an engine in memory for tests of the inbox (package inbox)
// and of a consumer's Decide: Engine is an inbox.Engine whose processes, instances and
// waiting message events are values a test sets up and reads, so that a message's
// handling (start once, correlate once, duplicate, late, early, reconciled) is exercised
// without Camunda. It answers as the engine's REST API does where the inbox looks: a
// process not deployed is a 404 (camunda7.ErrNotFound), a message nothing waits for a
// 400 "Cannot correlate message", and the marks the inbox sets are process variables
// its history queries find. RunEngineSuite is the behaviour suite that holds it to the
// real engine: package inbox runs it against an *admin.Client, this package against
// Engine.
//
// The inbox still records its rows in PostgreSQL: inboxtest replaces the engine, not the
// database.
package inboxtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
)

// Instance is a process instance the Engine holds.
type Instance struct {
	ID, ProcessKey, BusinessKey string
	// Waiting lists the message names it waits for, in any order; a correlation of one
	// takes it off (the instance moves past the wait state).
	Waiting []string
	// Ended: the instance has ended (it is in the history only).
	Ended bool
	// Variables are its process variables: the start's, the correlations', and the
	// inbox's marks (inbox.StartMarkVariable, extworkerMessage_<name>).
	Variables camunda7.Variables
}

// Engine is an engine in memory. The zero value is not usable: call New.
type Engine struct {
	mu        sync.Mutex
	timeout   time.Duration
	processes map[string][]string // process key → the messages its instances wait for
	instances []*Instance
	next      int
	err       error
	calls     int
}

// New returns an engine without processes, whose client times out after timeout (what
// inbox.ClientTimeout reads; 0 is camunda7.DefaultTimeout, the client's default).
func New(timeout time.Duration) *Engine {
	if timeout <= 0 {
		timeout = camunda7.DefaultTimeout
	}
	return &Engine{timeout: timeout, processes: map[string][]string{}}
}

var _ inbox.Engine = (*Engine)(nil)

// Deploy deploys processKey: each instance started of it waits for the messages named.
func (e *Engine) Deploy(processKey string, waitsFor ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.processes[processKey] = slices.Clone(waitsFor)
}

// Run starts an instance of processKey with businessKey as someone other than the inbox
// would, and returns its id. The process need not be deployed.
func (e *Engine) Run(processKey, businessKey string, waitsFor ...string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.add(processKey, businessKey, slices.Clone(waitsFor), nil).ID
}

// End ends the instance id, as reaching its end event would: its history state is
// COMPLETED (the real engine's, for an instance deleted, is EXTERNALLY_TERMINATED; the
// inbox reads both as ended).
func (e *Engine) End(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, pi := range e.instances {
		if pi.ID == id {
			pi.Ended, pi.Waiting = true, nil
		}
	}
}

// Fail makes every call answer err from now on (nil: answer again): a
// camunda7.ErrNotSent engine is down, a *camunda7.Error answers with a status.
func (e *Engine) Fail(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.err = err
}

// Instances returns copies of the instances of processKey with businessKey, running and
// ended, in the order they were started.
func (e *Engine) Instances(processKey, businessKey string) []Instance {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Instance
	for _, pi := range e.instances {
		if pi.ProcessKey == processKey && pi.BusinessKey == businessKey {
			c := *pi
			c.Waiting, c.Variables = slices.Clone(pi.Waiting), maps.Clone(pi.Variables)
			out = append(out, c)
		}
	}
	return out
}

// Calls counts the calls the engine answered (or failed).
func (e *Engine) Calls() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls
}

func (e *Engine) add(processKey, businessKey string, waiting []string, vars camunda7.Variables) *Instance {
	e.next++
	pi := &Instance{ID: fmt.Sprintf("pi-%d", e.next), ProcessKey: processKey, BusinessKey: businessKey, Waiting: waiting,
		Variables: camunda7.Variables{}}
	maps.Copy(pi.Variables, vars)
	e.instances = append(e.instances, pi)
	return pi
}

// begin counts a call and says whether it fails.
func (e *Engine) begin() error {
	e.calls++
	return e.err
}

// StartProcess implements inbox.Engine.
func (e *Engine) StartProcess(_ context.Context, key string, r admin.StartProcessRequest) (*admin.ProcessInstance, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.begin(); err != nil {
		return nil, err
	}
	waits, ok := e.processes[key]
	if !ok {
		return nil, &camunda7.Error{Op: "start process " + key, StatusCode: http.StatusNotFound, Type: "RestException",
			Message: "No matching process definition with key: " + key + " and no tenant-id"}
	}
	pi := e.add(key, r.BusinessKey, slices.Clone(waits), r.Variables)
	return &admin.ProcessInstance{ID: pi.ID, DefinitionKey: key, BusinessKey: pi.BusinessKey}, nil
}

// CorrelateMessageResult implements inbox.Engine: the message goes to the running
// instance that waits for r.MessageName and matches r's instance id, business key and
// correlation keys (each one of its variables, by type and value), where r names them.
// None is the engine's 400 "Cannot correlate message"; more than one (r.All is not
// supported) its 400 "... Cannot correlate a message with name ... to a single
// execution", which is not the inbox's mismatch.
func (e *Engine) CorrelateMessageResult(_ context.Context, r admin.MessageCorrelation) ([]admin.CorrelationResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.begin(); err != nil {
		return nil, err
	}
	op := "correlate message " + r.MessageName
	var waiting []*Instance
	for _, pi := range e.instances {
		if !pi.Ended && slices.Contains(pi.Waiting, r.MessageName) && (r.ProcessInstanceID == "" || pi.ID == r.ProcessInstanceID) &&
			(r.BusinessKey == "" || pi.BusinessKey == r.BusinessKey) && holds(pi.Variables, r.CorrelationKeys) {
			waiting = append(waiting, pi)
		}
	}
	switch len(waiting) {
	case 0:
		return nil, &camunda7.Error{Op: op, StatusCode: http.StatusBadRequest, Type: "RestException",
			Message: "Cannot correlate message '" + r.MessageName + "': No process definition or execution matches the parameters"}
	case 1:
	default:
		return nil, &camunda7.Error{Op: op, StatusCode: http.StatusBadRequest, Type: "RestException",
			Message: fmt.Sprintf("org.camunda.bpm.engine.MismatchingMessageCorrelationException: ENGINE-13031 Cannot correlate a "+
				"message with name '%s' to a single execution. %d executions match the correlation keys: CorrelationSet [businessKey=%s, "+
				"processInstanceId=%s]", r.MessageName, len(waiting), r.BusinessKey, r.ProcessInstanceID)}
	}
	pi := waiting[0]
	i := slices.Index(pi.Waiting, r.MessageName)
	pi.Waiting = slices.Delete(pi.Waiting, i, i+1)
	maps.Copy(pi.Variables, r.ProcessVariables)
	return []admin.CorrelationResult{{ResultType: "Execution", Execution: &admin.Execution{ID: pi.ID, ProcessInstanceID: pi.ID}}}, nil
}

// holds reports whether vars hold every correlation key: a variable of its name, type
// and JSON value.
func holds(vars, keys camunda7.Variables) bool {
	for name, k := range keys {
		v, ok := vars[name]
		if !ok || !strings.EqualFold(v.Type, k.Type) || !sameJSON(v.Value, k.Value) {
			return false
		}
	}
	return true
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	return reflect.DeepEqual(x, y)
}

// ProcessInstances implements inbox.Engine: the running instances, by
// processDefinitionKey and businessKey.
func (e *Engine) ProcessInstances(_ context.Context, q url.Values) ([]admin.ProcessInstance, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.begin(); err != nil {
		return nil, err
	}
	var out []admin.ProcessInstance
	for _, pi := range e.instances {
		if !pi.Ended && matches(q, "processDefinitionKey", pi.ProcessKey) && matches(q, "businessKey", pi.BusinessKey) {
			out = append(out, admin.ProcessInstance{ID: pi.ID, DefinitionKey: pi.ProcessKey, BusinessKey: pi.BusinessKey})
		}
	}
	return out, nil
}

// HistoricProcessInstances implements inbox.Engine: every instance, by
// processDefinitionKey and processInstanceBusinessKey.
func (e *Engine) HistoricProcessInstances(_ context.Context, q url.Values) ([]admin.HistoricProcessInstance, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.begin(); err != nil {
		return nil, err
	}
	var out []admin.HistoricProcessInstance
	for _, pi := range e.instances {
		if matches(q, "processDefinitionKey", pi.ProcessKey) && matches(q, "processInstanceBusinessKey", pi.BusinessKey) {
			state := "ACTIVE"
			if pi.Ended {
				state = "COMPLETED"
			}
			out = append(out, admin.HistoricProcessInstance{ID: pi.ID, ProcessDefinitionKey: pi.ProcessKey, BusinessKey: pi.BusinessKey, State: state})
		}
	}
	return out, nil
}

// HistoricVariableInstances implements inbox.Engine: the variables, by variableName and
// processInstanceIdIn.
func (e *Engine) HistoricVariableInstances(_ context.Context, q url.Values) ([]admin.HistoricVariableInstance, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.begin(); err != nil {
		return nil, err
	}
	ids := strings.Split(q.Get("processInstanceIdIn"), ",")
	var out []admin.HistoricVariableInstance
	for _, pi := range e.instances {
		if q.Has("processInstanceIdIn") && !slices.Contains(ids, pi.ID) {
			continue
		}
		for _, name := range slices.Sorted(maps.Keys(pi.Variables)) {
			if matches(q, "variableName", name) {
				v := pi.Variables[name]
				out = append(out, admin.HistoricVariableInstance{ID: pi.ID + "/" + name, Name: name, ProcessInstanceID: pi.ID,
					Type: v.Type, Value: v.Value, ValueInfo: v.ValueInfo})
			}
		}
	}
	return out, nil
}

// LongPollTimeout implements inbox.Engine as a camunda7.Client whose Timeout is the
// timeout New was given and whose LongPollMargin is the shorter of it and
// camunda7.DefaultLongPollMargin: LongPollTimeout(0) is that timeout, and a long poll's
// is longer than the poll.
func (e *Engine) LongPollTimeout(asyncResponseTimeout time.Duration) time.Duration {
	return max(asyncResponseTimeout+min(e.timeout, camunda7.DefaultLongPollMargin), e.timeout)
}

// matches reports whether q asks for nothing under key, or for value.
func matches(q url.Values, key, value string) bool { return !q.Has(key) || q.Get(key) == value }
