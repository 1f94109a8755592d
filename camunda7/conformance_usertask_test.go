package camunda7_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/testenv"
)

// userTaskBPMN waits in one user task "approve" with candidate users alice and bob and
// candidate group approvers.
const userTaskBPMN = `<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn"
  id="defs-%[1]s" targetNamespace="http://extworker.dev/test">
  <bpmn:process id="%[1]s" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="approve"/>
    <bpmn:userTask id="approve" camunda:candidateUsers="alice,bob" camunda:candidateGroups="approvers"/>
    <bpmn:sequenceFlow id="f2" sourceRef="approve" targetRef="end"/>
    <bpmn:endEvent id="end"/>
  </bpmn:process>
</bpmn:definitions>`

// startUserTask deploys the model, starts an instance with vars and returns its task.
func startUserTask(t *testing.T, c *admin.Client, vars camunda7.Variables) admin.UserTask {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	key := testenv.Unique("usertask")
	res, err := c.Deploy(ctx, admin.Deployment{Name: key, Resources: []admin.Resource{{Name: key + ".bpmn", Content: fmt.Appendf(nil, userTaskBPMN, key)}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.DeleteDeployment(testenv.Context(t, 30*time.Second), res.ID, true) })
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
