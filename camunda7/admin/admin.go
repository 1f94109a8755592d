// Package admin is the engine's REST calls that tests, demos and operators need beyond a
// worker's: deployments, process instances, messages, incidents and history. A worker's
// client (package camunda7) has only what a worker does; admin.Client adds these to it.
// Queries take url.Values with the engine's own parameter names, so every filter the
// engine documents is available without a struct field per parameter.
package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"

	"github.com/extworker/extworker/camunda7"
)

// Client is an engine client with the calls beyond a worker's. Its camunda7.Client's
// methods are its own too.
type Client struct {
	*camunda7.Client
}

// New returns c with the calls beyond a worker's.
func New(c *camunda7.Client) *Client { return &Client{Client: c} }

// Resource is one file of a deployment. Name must end in .bpmn (or .bpmn20.xml, .dmn)
// for the engine to parse it.
type Resource struct {
	Name    string
	Content []byte
}

// Deployment is a deployment to create.
type Deployment struct {
	Name                     string
	Source                   string
	TenantID                 string
	EnableDuplicateFiltering bool
	DeployChangedOnly        bool
	Resources                []Resource
}

// ProcessDefinition is a deployed process definition.
type ProcessDefinition struct {
	ID           string `json:"id"`
	Key          string `json:"key"`
	Version      int    `json:"version"`
	VersionTag   string `json:"versionTag"`
	DeploymentID string `json:"deploymentId"`
	TenantID     string `json:"tenantId"`
	Suspended    bool   `json:"suspended"`
}

// DeploymentResult is the engine's answer to a deployment.
type DeploymentResult struct {
	ID                         string                       `json:"id"`
	Name                       string                       `json:"name"`
	DeployedProcessDefinitions map[string]ProcessDefinition `json:"deployedProcessDefinitions"`
}

// Deploy creates a deployment (multipart POST /deployment/create).
func (c *Client) Deploy(ctx context.Context, d Deployment) (*DeploymentResult, error) {
	const op = "create deployment"
	if len(d.Resources) == 0 {
		return nil, camunda7.InvalidArgument(op, "no resources")
	}
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fields := [][2]string{{"deployment-name", d.Name}, {"deployment-source", d.Source}, {"tenant-id", d.TenantID}}
	if d.EnableDuplicateFiltering {
		fields = append(fields, [2]string{"enable-duplicate-filtering", "true"})
	}
	if d.DeployChangedOnly {
		fields = append(fields, [2]string{"deploy-changed-only", "true"})
	}
	for _, f := range fields {
		if f[1] != "" {
			if err := mw.WriteField(f[0], f[1]); err != nil {
				return nil, camunda7.InvalidArgument(op, "write field %s: %v", f[0], err)
			}
		}
	}
	for i, r := range d.Resources {
		if r.Name == "" {
			return nil, camunda7.InvalidArgument(op, "resource %d has no name", i)
		}
		w, err := mw.CreateFormFile(fmt.Sprintf("resource-%d", i), r.Name)
		if err == nil {
			_, err = w.Write(r.Content)
		}
		if err != nil {
			return nil, camunda7.InvalidArgument(op, "write resource %s: %v", r.Name, err)
		}
	}
	if err := mw.Close(); err != nil {
		return nil, camunda7.InvalidArgument(op, "close multipart Body: %v", err)
	}
	var out DeploymentResult
	err := c.Do(ctx, camunda7.Request{Op: op, Method: http.MethodPost, Path: "/deployment/create",
		Body: camunda7.RawBody{ContentType: mw.FormDataContentType(), Data: buf.Bytes()}, Out: &out})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteDeployment deletes a deployment; cascade also deletes its process instances.
func (c *Client) DeleteDeployment(ctx context.Context, id string, cascade bool) error {
	return c.Do(ctx, camunda7.Request{Op: "delete deployment " + id, Method: http.MethodDelete, Path: "/deployment/" + url.PathEscape(id),
		Query: url.Values{"cascade": {strconv.FormatBool(cascade)}}})
}

// StartProcessRequest is the body of POST /process-definition/key/{key}/start.
type StartProcessRequest struct {
	BusinessKey string             `json:"businessKey,omitempty"`
	Variables   camunda7.Variables `json:"variables,omitempty"`
}

// ProcessInstance is a running (or just ended) process instance.
type ProcessInstance struct {
	ID            string `json:"id"`
	DefinitionID  string `json:"definitionId"`
	DefinitionKey string `json:"definitionKey"`
	BusinessKey   string `json:"businessKey"`
	TenantID      string `json:"tenantId"`
	Ended         bool   `json:"ended"`
	Suspended     bool   `json:"suspended"`
}

// StartProcess starts the latest version (without tenant) of the process with key.
func (c *Client) StartProcess(ctx context.Context, key string, r StartProcessRequest) (*ProcessInstance, error) {
	op := "start process " + key
	if key == "" {
		return nil, camunda7.InvalidArgument(op, "process definition key is empty")
	}
	var out ProcessInstance
	err := c.Do(ctx, camunda7.Request{Op: op, Method: http.MethodPost, Path: "/process-definition/key/" + url.PathEscape(key) + "/start", Body: r, Out: &out})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// MessageCorrelation is the body of POST /message.
type MessageCorrelation struct {
	MessageName       string             `json:"messageName"`
	BusinessKey       string             `json:"businessKey,omitempty"`
	ProcessInstanceID string             `json:"processInstanceId,omitempty"`
	TenantID          string             `json:"tenantId,omitempty"`
	WithoutTenantID   bool               `json:"withoutTenantId,omitempty"`
	CorrelationKeys   camunda7.Variables `json:"correlationKeys,omitempty"`
	ProcessVariables  camunda7.Variables `json:"processVariables,omitempty"`
	All               bool               `json:"all,omitempty"`
}

// CorrelateMessage delivers a message to the waiting execution(s) it matches.
func (c *Client) CorrelateMessage(ctx context.Context, m MessageCorrelation) error {
	op := "correlate message " + m.MessageName
	if m.MessageName == "" {
		return camunda7.InvalidArgument(op, "MessageName is empty")
	}
	return c.Do(ctx, camunda7.Request{Op: op, Method: http.MethodPost, Path: "/message", Body: m})
}

// CorrelationResult is what a correlation did (POST /message with resultEnabled): it
// triggered a waiting execution ("Execution") or started an instance through a message
// start event ("ProcessDefinition").
type CorrelationResult struct {
	ResultType      string           `json:"resultType"`
	Execution       *Execution       `json:"execution"`
	ProcessInstance *ProcessInstance `json:"processInstance"`
}

// Execution is a path of execution in a process instance.
type Execution struct {
	ID                string `json:"id"`
	ProcessInstanceID string `json:"processInstanceId"`
}

// InstanceID is the process instance the correlation reached.
func (r CorrelationResult) InstanceID() string {
	switch {
	case r.Execution != nil:
		return r.Execution.ProcessInstanceID
	case r.ProcessInstance != nil:
		return r.ProcessInstance.ID
	}
	return ""
}

// CorrelateMessageResult is CorrelateMessage, returning what the correlation reached.
func (c *Client) CorrelateMessageResult(ctx context.Context, m MessageCorrelation) ([]CorrelationResult, error) {
	op := "correlate message " + m.MessageName
	if m.MessageName == "" {
		return nil, camunda7.InvalidArgument(op, "MessageName is empty")
	}
	body := struct {
		MessageCorrelation
		ResultEnabled bool `json:"resultEnabled"`
	}{m, true}
	var out []CorrelationResult
	err := c.Do(ctx, camunda7.Request{Op: op, Method: http.MethodPost, Path: "/message", Body: body, Out: &out})
	return out, err
}

// ProcessInstance returns a running process instance; ErrNotFound once it has ended.
func (c *Client) ProcessInstance(ctx context.Context, id string) (*ProcessInstance, error) {
	var out ProcessInstance
	err := c.Do(ctx, camunda7.Request{Op: "get process instance " + id, Method: http.MethodGet, Path: "/process-instance/" + url.PathEscape(id), Out: &out})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// ProcessInstances queries running process instances (GET /process-instance).
func (c *Client) ProcessInstances(ctx context.Context, q url.Values) ([]ProcessInstance, error) {
	var out []ProcessInstance
	err := c.Do(ctx, camunda7.Request{Op: "query process instances", Method: http.MethodGet, Path: "/process-instance", Query: q, Out: &out})
	return out, err
}

// DeleteProcessInstance deletes a running process instance, cancelling its external tasks.
func (c *Client) DeleteProcessInstance(ctx context.Context, id string) error {
	return c.Do(ctx, camunda7.Request{Op: "delete process instance " + id, Method: http.MethodDelete, Path: "/process-instance/" + url.PathEscape(id)})
}

// SuspendProcessInstance suspends (or with suspended false, activates) a process instance.
func (c *Client) SuspendProcessInstance(ctx context.Context, id string, suspended bool) error {
	return c.Do(ctx, camunda7.Request{Op: "suspend process instance " + id, Method: http.MethodPut,
		Path: "/process-instance/" + url.PathEscape(id) + "/suspended", Body: map[string]bool{"suspended": suspended}})
}

// ProcessInstanceVariables returns a running instance's variables, serialized form.
func (c *Client) ProcessInstanceVariables(ctx context.Context, id string) (camunda7.Variables, error) {
	var out camunda7.Variables
	err := c.Do(ctx, camunda7.Request{Op: "get variables of process instance " + id, Method: http.MethodGet,
		Path: "/process-instance/" + url.PathEscape(id) + "/variables", Query: url.Values{"deserializeValues": {"false"}}, Out: &out})
	return out, err
}

// Incident is an open incident.
type Incident struct {
	ID                string        `json:"id"`
	IncidentType      string        `json:"incidentType"`
	IncidentMessage   string        `json:"incidentMessage"`
	IncidentTimestamp camunda7.Time `json:"incidentTimestamp"`
	ProcessInstanceID string        `json:"processInstanceId"`
	ExecutionID       string        `json:"executionId"`
	ActivityID        string        `json:"activityId"`
	FailedActivityID  string        `json:"failedActivityId"`
	// Configuration is the external task id for failedExternalTask incidents.
	Configuration string `json:"configuration"`
	TenantID      string `json:"tenantId"`
}

// IncidentTypeFailedExternalTask is the type of an incident raised by a failure with no
// retries left.
const IncidentTypeFailedExternalTask = "failedExternalTask"

// Incidents queries open incidents (GET /incident), e.g. processInstanceId, incidentType.
func (c *Client) Incidents(ctx context.Context, q url.Values) ([]Incident, error) {
	var out []Incident
	err := c.Do(ctx, camunda7.Request{Op: "query incidents", Method: http.MethodGet, Path: "/incident", Query: q, Out: &out})
	return out, err
}

// HistoricProcessInstance is a process instance from history, ended or not.
type HistoricProcessInstance struct {
	ID                   string `json:"id"`
	BusinessKey          string `json:"businessKey"`
	ProcessDefinitionKey string `json:"processDefinitionKey"`
	// State is ACTIVE, SUSPENDED, COMPLETED, EXTERNALLY_TERMINATED or INTERNALLY_TERMINATED.
	State     string        `json:"state"`
	StartTime camunda7.Time `json:"startTime"`
	EndTime   camunda7.Time `json:"endTime"`
}

// HistoricProcessInstance returns one process instance from history.
func (c *Client) HistoricProcessInstance(ctx context.Context, id string) (*HistoricProcessInstance, error) {
	var out HistoricProcessInstance
	err := c.Do(ctx, camunda7.Request{Op: "get historic process instance " + id, Method: http.MethodGet, Path: "/history/process-instance/" + url.PathEscape(id), Out: &out})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// HistoricProcessInstances queries GET /history/process-instance (e.g. processDefinitionKey,
// processInstanceBusinessKeyLike, finished, firstResult, maxResults).
func (c *Client) HistoricProcessInstances(ctx context.Context, q url.Values) ([]HistoricProcessInstance, error) {
	var out []HistoricProcessInstance
	err := c.Do(ctx, camunda7.Request{Op: "query historic process instances", Method: http.MethodGet, Path: "/history/process-instance", Query: q, Out: &out})
	return out, err
}

// HistoricProcessInstanceCount counts GET /history/process-instance/count.
func (c *Client) HistoricProcessInstanceCount(ctx context.Context, q url.Values) (int, error) {
	var out struct {
		Count int `json:"count"`
	}
	err := c.Do(ctx, camunda7.Request{Op: "count historic process instances", Method: http.MethodGet, Path: "/history/process-instance/count", Query: q, Out: &out})
	return out.Count, err
}

// HistoricActivityInstance is one activity an instance passed through.
type HistoricActivityInstance struct {
	ID                string        `json:"id"`
	ActivityID        string        `json:"activityId"`
	ActivityType      string        `json:"activityType"`
	ProcessInstanceID string        `json:"processInstanceId"`
	Canceled          bool          `json:"canceled"`
	StartTime         camunda7.Time `json:"startTime"`
	EndTime           camunda7.Time `json:"endTime"`
}

// HistoricActivityInstances queries GET /history/activity-instance.
func (c *Client) HistoricActivityInstances(ctx context.Context, q url.Values) ([]HistoricActivityInstance, error) {
	var out []HistoricActivityInstance
	err := c.Do(ctx, camunda7.Request{Op: "query historic activity instances", Method: http.MethodGet, Path: "/history/activity-instance", Query: q, Out: &out})
	return out, err
}

// HistoricIncident is an incident from history, open or resolved.
type HistoricIncident struct {
	ID                string `json:"id"`
	IncidentType      string `json:"incidentType"`
	IncidentMessage   string `json:"incidentMessage"`
	ProcessInstanceID string `json:"processInstanceId"`
	ActivityID        string `json:"activityId"`
	Configuration     string `json:"configuration"`
	Open              bool   `json:"open"`
	Resolved          bool   `json:"resolved"`
	Deleted           bool   `json:"deleted"`
}

// HistoricIncidents queries GET /history/incident.
func (c *Client) HistoricIncidents(ctx context.Context, q url.Values) ([]HistoricIncident, error) {
	var out []HistoricIncident
	err := c.Do(ctx, camunda7.Request{Op: "query historic incidents", Method: http.MethodGet, Path: "/history/incident", Query: q, Out: &out})
	return out, err
}

// HistoricVariableInstance is a variable from history.
type HistoricVariableInstance struct {
	ID                string `json:"id"`
	Name              string `json:"name"`
	ProcessInstanceID string `json:"processInstanceId"`
	// Type, Value and ValueInfo are the typed value (a camunda7.Variable is not embedded: its JSON
	// methods would hide these fields).
	Type      string             `json:"type"`
	Value     json.RawMessage    `json:"value"`
	ValueInfo camunda7.ValueInfo `json:"valueInfo"`
}

// Variable returns the typed value, for decoding with camunda7.Variables' accessors.
func (h HistoricVariableInstance) Variable() camunda7.Variable {
	return camunda7.Variable{Type: h.Type, Value: h.Value, ValueInfo: h.ValueInfo}
}

// HistoricVariableInstances queries GET /history/variable-instance (serialized values).
func (c *Client) HistoricVariableInstances(ctx context.Context, q url.Values) ([]HistoricVariableInstance, error) {
	q2 := url.Values{"deserializeValues": {"false"}}
	maps.Copy(q2, q)
	var out []HistoricVariableInstance
	err := c.Do(ctx, camunda7.Request{Op: "query historic variable instances", Method: http.MethodGet, Path: "/history/variable-instance", Query: q2, Out: &out})
	return out, err
}
