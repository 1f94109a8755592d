package camunda7_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/testenv"
)

// startUserTask deploys the model, starts an instance with vars and returns its task.
func startUserTask(t *testing.T, c *admin.Client, vars camunda7.Variables) admin.UserTask {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	key := testenv.DeployUserTask(t, c, testenv.UserTaskProcess{Key: testenv.Unique("usertask"),
		CandidateUsers: []string{"alice", "bob"}, CandidateGroups: []string{"approvers"}}).Key
	pi, err := c.StartProcess(ctx, key, admin.StartProcessRequest{Variables: vars})
	require.NoError(t, err)
	ts, err := c.UserTasks(ctx, url.Values{"processInstanceId": {pi.ID}})
	require.NoError(t, err)
	require.Len(t, ts, 1)
	return ts[0]
}

// What the engine exposes of a user task as a version (package humantask's ETag rests
// on it): lastUpdated is null until the first update, moves on claim, assignment and
// identity-link changes, and does not move when a variable changes (so the ETag digests
// the form's variables too). Identity links list the model's candidates.
func TestConformanceUserTaskVersion(t *testing.T) {
	t.Parallel()
	c := testenv.Engine(t)
	ctx := testenv.Context(t, time.Minute)
	task := startUserTask(t, c, camunda7.Variables{"amount": camunda7.LongVar(5)})
	assert.True(t, task.LastUpdated.IsZero(), "lastUpdated is null before any update")

	links, err := c.UserTaskIdentityLinks(ctx, task.ID)
	require.NoError(t, err)
	assert.ElementsMatch(t, []admin.IdentityLink{{UserID: "alice", Type: "candidate"}, {UserID: "bob", Type: "candidate"},
		{GroupID: "approvers", Type: "candidate"}}, links)
	vars, err := c.UserTaskFormVariables(ctx, task.ID)
	require.NoError(t, err)
	assert.Equal(t, json.RawMessage("5"), vars["amount"].Value, "a task without form fields shows every visible variable")

	lastUpdated := func() time.Time {
		t.Helper()
		ut, err := c.UserTask(ctx, task.ID)
		require.NoError(t, err)
		return ut.LastUpdated.Time
	}
	// lastUpdated has millisecond precision: wait for the clock to pass it before each
	// change, so that "moved" is not hidden by an equal millisecond.
	passed := func(since time.Time) {
		testenv.Eventually(t, 5*time.Second, "the clock to pass "+since.String(), func() (bool, error) {
			return time.Since(since) > 2*time.Millisecond, nil
		})
	}
	require.NoError(t, c.ClaimUserTask(ctx, task.ID, "alice"))
	claimed := lastUpdated()
	assert.False(t, claimed.IsZero(), "a claim sets lastUpdated")

	passed(claimed)
	require.NoError(t, c.SetUserTaskVariable(ctx, task.ID, "amount", camunda7.LongVar(6)))
	assert.Equal(t, claimed, lastUpdated(), "a variable change leaves lastUpdated")

	require.NoError(t, c.AddUserTaskIdentityLink(ctx, task.ID, admin.IdentityLink{GroupID: "auditors", Type: "candidate"}))
	linked := lastUpdated()
	assert.True(t, linked.After(claimed), "an identity-link change moves lastUpdated")

	passed(linked)
	require.NoError(t, c.SetUserTaskAssignee(ctx, task.ID, "bob"))
	assert.True(t, lastUpdated().After(linked), "an assignment moves lastUpdated")
}

// How the engine tells which command completed a user task: a variable sent with the
// completion is written in the completion's transaction, and history keeps it with the
// task's end (deleteReason "completed", endTime). A second completion, and every
// per-task read of a gone task, is answered as pinned here (a 500 for complete and
// identity links, a 400 for form variables, a 404 only for GET /task/{id}).
func TestConformanceUserTaskCompletionRecordsTheCommand(t *testing.T) {
	t.Parallel()
	c := testenv.Engine(t)
	ctx := testenv.Context(t, time.Minute)
	task := startUserTask(t, c, nil)
	name := "extworker_completion_" + task.ID
	require.NoError(t, c.CompleteUserTask(ctx, task.ID, camunda7.Variables{name: camunda7.StringVar(`{"command":"c-1","user":"alice"}`)}))

	hs, err := c.HistoricUserTasks(ctx, url.Values{"taskId": {task.ID}})
	require.NoError(t, err)
	require.Len(t, hs, 1)
	assert.Equal(t, "completed", hs[0].DeleteReason)
	assert.False(t, hs[0].EndTime.IsZero())
	vs, err := c.HistoricVariableInstances(ctx, url.Values{"processInstanceId": {task.ProcessInstanceID}, "variableName": {name}})
	require.NoError(t, err)
	require.Len(t, vs, 1)
	assert.JSONEq(t, `"{\"command\":\"c-1\",\"user\":\"alice\"}"`, string(vs[0].Value))

	var e *camunda7.Error
	err = c.CompleteUserTask(ctx, task.ID, nil)
	require.True(t, errors.As(err, &e), "%v", err)
	assert.Equal(t, http.StatusInternalServerError, e.StatusCode, "a second completion")
	assert.Equal(t, "RestException", e.Type)
	assert.Contains(t, e.Message, "Cannot find task with id "+task.ID)

	_, err = c.UserTask(ctx, task.ID)
	require.True(t, errors.As(err, &e), "%v", err)
	assert.Equal(t, http.StatusNotFound, e.StatusCode)
	assert.Equal(t, "InvalidRequestException", e.Type)
	assert.Equal(t, "No matching task with id "+task.ID, e.Message)

	_, err = c.UserTaskIdentityLinks(ctx, task.ID)
	require.True(t, errors.As(err, &e), "%v", err)
	assert.Equal(t, http.StatusInternalServerError, e.StatusCode, "identity links of a gone task")
	_, err = c.UserTaskFormVariables(ctx, task.ID)
	require.True(t, errors.As(err, &e), "%v", err)
	assert.Equal(t, http.StatusBadRequest, e.StatusCode, "form variables of a gone task")
}

// What the engine exposes of a user task's declared form (package humantask's field
// allow-list and its "who had a right" rests on it): form-variables answers the declared
// fields (a default value, or null) and every other variable visible from the task
// besides; the definition's XML (GET /process-definition/{id}/xml) holds the
// camunda:formField declarations; the history's identity-link log keeps the candidates
// and the assignee of a completed task.
func TestConformanceUserTaskFormFieldsAndIdentityLog(t *testing.T) {
	t.Parallel()
	c := testenv.Engine(t)
	ctx := testenv.Context(t, time.Minute)
	p := testenv.DeployUserTask(t, c, testenv.UserTaskProcess{CandidateUsers: []string{"alice"}, CandidateGroups: []string{"approvers"},
		FormFields: []testenv.FormField{{ID: "approved", Type: "boolean"}, {ID: "comment", Type: "string", Default: "none"}}})
	pi, err := c.StartProcess(ctx, p.Key, admin.StartProcessRequest{Variables: camunda7.Variables{"amount": camunda7.LongVar(5)}})
	require.NoError(t, err)
	ts, err := c.UserTasks(ctx, url.Values{"processInstanceId": {pi.ID}})
	require.NoError(t, err)
	require.Len(t, ts, 1)
	task := ts[0]

	vars, err := c.UserTaskFormVariables(ctx, task.ID)
	require.NoError(t, err)
	assert.Equal(t, camunda7.TypeBoolean, vars["approved"].Type, "a declared field without a value: its type")
	assert.JSONEq(t, `null`, string(vars["approved"].Value))
	assert.JSONEq(t, `"none"`, string(vars["comment"].Value), "a declared field's default value")
	assert.Equal(t, camunda7.TypeLong, vars["amount"].Type, "a variable the form does not declare is answered too")

	doc, err := c.ProcessDefinitionXML(ctx, task.ProcessDefinitionID)
	require.NoError(t, err)
	assert.Contains(t, doc, `<camunda:formField id="approved" type="boolean"`)

	require.NoError(t, c.ClaimUserTask(ctx, task.ID, "alice"))
	require.NoError(t, c.CompleteUserTask(ctx, task.ID, nil))
	log, err := c.HistoricIdentityLinks(ctx, url.Values{"taskId": {task.ID}})
	require.NoError(t, err)
	var seen []string
	for _, l := range log {
		seen = append(seen, l.Type+" "+l.UserID+l.GroupID+" "+l.OperationType)
	}
	assert.Subset(t, seen, []string{"candidate alice add", "candidate approvers add", "assignee alice add"},
		"the log of a completed task (history level full)")
}

// The engine's refusals of a form's values on submit-form (ErrFormRefused, FormRefusal's
// reasons): a 500 RestException of code 0, "Cannot submit task form <id>: …", for a field's
// failed validation, a value outside an enum field's, a date not in the field's format.
// The enum and date messages quote the value; the reasons do not. A refused form leaves
// the task waiting; an expression that fails on submit is code 0 too, and no refusal.
func TestConformanceFormRefusals(t *testing.T) {
	t.Parallel()
	c := testenv.Engine(t)
	ctx := testenv.Context(t, time.Minute)
	key := testenv.Unique("refusals")
	bpmn := `<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn" id="defs-` + key + `" targetNamespace="http://extworker.dev/test">
  <bpmn:process id="` + key + `" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="approve"/>
    <bpmn:userTask id="approve"><bpmn:extensionElements><camunda:formData>
      <camunda:formField id="amount" type="long"><camunda:validation><camunda:constraint name="max" config="1000"/></camunda:validation></camunda:formField>
      <camunda:formField id="kind" type="enum"><camunda:value id="a" name="A"/></camunda:formField>
      <camunda:formField id="due" type="date"/>
    </camunda:formData>
    <camunda:taskListener event="complete" expression="${kind == 'a' ? nosuchbean : true}"/>
    </bpmn:extensionElements></bpmn:userTask>
    <bpmn:sequenceFlow id="f2" sourceRef="approve" targetRef="end"/>
    <bpmn:endEvent id="end"/>
  </bpmn:process>
</bpmn:definitions>`
	dep, err := c.Deploy(ctx, admin.Deployment{Name: key, Resources: []admin.Resource{{Name: key + ".bpmn", Content: []byte(bpmn)}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.DeleteDeployment(testenv.Context(t, 30*time.Second), dep.ID, true) })
	pi, err := c.StartProcess(ctx, key, admin.StartProcessRequest{})
	require.NoError(t, err)
	ts, err := c.UserTasks(ctx, url.Values{"processInstanceId": {pi.ID}})
	require.NoError(t, err)
	require.Len(t, ts, 1)
	task := ts[0].ID

	for _, r := range []struct {
		vars   camunda7.Variables
		reason string
	}{
		{camunda7.Variables{"amount": camunda7.LongVar(5000)}, `form field "amount": validation of max(1000) failed`},
		{camunda7.Variables{"kind": camunda7.StringVar("secret-z")}, "a value is not one of its enum field's values"},
		{camunda7.Variables{"due": camunda7.StringVar("secret, no date")}, "a date is not in its field's format (dd/MM/yyyy unless the engine is configured otherwise)"},
	} {
		err := c.SubmitUserTaskForm(ctx, task, r.vars)
		require.ErrorIs(t, err, camunda7.ErrFormRefused, "%v", r.vars)
		var e *camunda7.Error
		require.ErrorAs(t, err, &e)
		assert.Equal(t, http.StatusInternalServerError, e.StatusCode)
		assert.Equal(t, "RestException", e.Type)
		require.NotNil(t, e.Code)
		assert.Zero(t, *e.Code)
		assert.Contains(t, e.Message, "Cannot submit task form "+task+": ")
		reason, ok := camunda7.FormRefusal(err)
		assert.True(t, ok)
		assert.Equal(t, r.reason, reason)
	}
	// the listener's expression fails: code 0, the same prefix, no refusal of the values
	err = c.SubmitUserTaskForm(ctx, task, camunda7.Variables{"kind": camunda7.StringVar("a")})
	var e *camunda7.Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, http.StatusInternalServerError, e.StatusCode)
	require.NotNil(t, e.Code)
	assert.Zero(t, *e.Code)
	assert.NotErrorIs(t, err, camunda7.ErrFormRefused, "%v", err)
	_, err = c.UserTask(ctx, task)
	require.NoError(t, err, "the task still waits")
}

// A delegated task (delegationState PENDING: its owner delegated it to its assignee) is
// resolved by submit-form, back to its owner, not completed: package humantask answers a
// command on it 409 "delegated" rather than send it (an outside tester's delegate got
// 200 "completed" for a task only resolved; in 7.24, complete did complete it, which the
// service does not rely on: it sends neither).
func TestConformanceDelegatedTaskSubmitResolves(t *testing.T) {
	t.Parallel()
	c := testenv.Engine(t)
	ctx := testenv.Context(t, time.Minute)
	delegate := func() admin.UserTask {
		t.Helper()
		task := startUserTask(t, c, nil)
		require.NoError(t, c.SetUserTaskAssignee(ctx, task.ID, "alice"))
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, testenv.EngineURL()+"/task/"+task.ID+"/delegate",
			strings.NewReader(`{"userId":"bob"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNoContent, resp.StatusCode)
		got, err := c.UserTask(ctx, task.ID)
		require.NoError(t, err)
		assert.Equal(t, "PENDING", got.DelegationState)
		assert.Equal(t, "bob", got.Assignee)
		assert.Equal(t, "alice", got.Owner)
		return *got
	}

	task := delegate()
	require.NoError(t, c.SubmitUserTaskForm(ctx, task.ID, camunda7.Variables{"approved": camunda7.BoolVar(true)}))
	after, err := c.UserTask(ctx, task.ID)
	require.NoError(t, err, "submit-form of a delegated task leaves it waiting")
	assert.Equal(t, "RESOLVED", after.DelegationState)
	assert.Equal(t, "alice", after.Assignee, "resolved back to its owner")

}
