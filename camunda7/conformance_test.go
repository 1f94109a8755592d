package camunda7_test

// The conformance suite: every external-task behaviour extworker relies on, pinned
// against the real engine that `make up` starts (see internal/testenv). Each test
// deploys its own model (unique key and topic) and runs in parallel with the others.
// Messages are compared verbatim: when an engine release changes one, this suite says so.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"regexp"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/testenv"
)

// env is one test's engine, model and worker id.
type env struct {
	t      *testing.T
	c      *admin.Client
	m      testenv.Model
	worker string
	ctx    context.Context
	url    string // the engine's REST root, for clients of a test's own
}

func newEnv(t *testing.T, opts testenv.ModelOptions) *env {
	t.Helper()
	t.Parallel()
	c := testenv.Engine(t)
	return &env{t: t, c: c, m: testenv.Deploy(t, c, opts), worker: testenv.Unique("worker"), ctx: testenv.Context(t, 2*time.Minute), url: testenv.EngineURL()}
}

func (e *env) start(businessKey string, vars camunda7.Variables) *admin.ProcessInstance {
	e.t.Helper()
	pi, err := e.c.StartProcess(e.ctx, e.m.Key, admin.StartProcessRequest{BusinessKey: businessKey, Variables: vars})
	require.NoError(e.t, err)
	return pi
}

func (e *env) topic(lock time.Duration) camunda7.FetchTopic {
	return camunda7.FetchTopic{TopicName: e.m.Topic, LockDuration: lock}
}

func (e *env) fetch(worker string, max int, topics ...camunda7.FetchTopic) []camunda7.LockedExternalTask {
	e.t.Helper()
	if len(topics) == 0 {
		topics = []camunda7.FetchTopic{e.topic(time.Minute)}
	}
	tasks, err := e.c.FetchAndLock(e.ctx, camunda7.FetchAndLockRequest{WorkerID: worker, MaxTasks: max, Topics: topics})
	require.NoError(e.t, err)
	return tasks
}

// startAndLock starts an instance and locks its task for e.worker.
func (e *env) startAndLock(lock time.Duration) (*admin.ProcessInstance, camunda7.LockedExternalTask) {
	e.t.Helper()
	pi := e.start("", nil)
	tasks := e.fetch(e.worker, 1, e.topic(lock))
	require.Len(e.t, tasks, 1)
	require.Equal(e.t, pi.ID, tasks[0].ProcessInstanceID)
	return pi, tasks[0]
}

// engineError asserts err is an *camunda7.Error with status and a message matching pattern.
func engineError(t *testing.T, err error, status int, typ string, pattern string) *camunda7.Error {
	t.Helper()
	var ee *camunda7.Error
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, status, ee.StatusCode, "status")
	assert.Equal(t, typ, ee.Type, "type")
	assert.Regexp(t, "^"+pattern+"$", ee.Message, "message")
	assert.True(t, camunda7.SafeToRetry(err), "an engine answer is never an unknown outcome")
	assert.False(t, errors.Is(err, camunda7.ErrUnknownOutcome))
	return ee
}

// rawPost sends a body the client would refuse to send, to pin the engine's own answer.
func rawPost(t *testing.T, path, body string) (int, map[string]any) {
	t.Helper()
	return rawDo(t, http.MethodPost, path, body)
}

func rawDo(t *testing.T, method, path, body string) (int, map[string]any) {
	t.Helper()
	status, data := rawDoBytes(t, method, path, body)
	var out map[string]any
	if len(data) > 0 {
		require.NoError(t, json.Unmarshal(data, &out), "body %s", data)
	}
	return status, out
}

func rawDoBytes(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, testenv.EngineURL()+path, bytes.NewBufferString(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, data
}

var q = regexp.QuoteMeta

func TestConformanceVersion(t *testing.T) {
	t.Parallel()
	c := testenv.Engine(t)
	v, err := c.Version(testenv.Context(t, 10*time.Second))
	require.NoError(t, err)
	assert.Regexp(t, `^\d+\.\d+\.\d+`, v)
	t.Logf("engine version %s", v)
}

// The engine keeps its data in PostgreSQL: a lock taken over REST is a row there.
func TestConformanceEngineStoresInPostgreSQL(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	_, task := e.startAndLock(time.Minute)
	db := testenv.EngineDB(t)
	var worker, topic string
	err := db.QueryRow(e.ctx, `SELECT worker_id_, topic_name_ FROM act_ru_ext_task WHERE id_ = $1`, task.ID).Scan(&worker, &topic)
	require.NoError(t, err)
	assert.Equal(t, e.worker, worker)
	assert.Equal(t, e.m.Topic, topic)
}

func TestConformanceFetchAndLockFields(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{ExtensionProperties: map[string]string{"provider": "fake-pay", "sla": "5m"}, Priority: 7, VersionTag: "v1.2"})
	before := time.Now()
	pi := e.start("order-4711", camunda7.Variables{
		"wanted":   camunda7.StringVar("yes"),
		"unwanted": camunda7.StringVar("no"),
	})
	topic := e.topic(90 * time.Second)
	topic.Variables = []string{"wanted"}
	topic.IncludeExtensionProperties = true
	tasks := e.fetch(e.worker, 5, topic)
	require.Len(t, tasks, 1)
	tk := tasks[0]
	assert.NotEmpty(t, tk.ID)
	assert.Equal(t, e.m.Topic, tk.TopicName)
	assert.Equal(t, e.worker, tk.WorkerID)
	assert.Equal(t, "task", tk.ActivityID)
	assert.NotEmpty(t, tk.ActivityInstanceID)
	assert.NotEmpty(t, tk.ExecutionID)
	assert.Equal(t, pi.ID, tk.ProcessInstanceID)
	assert.Equal(t, e.m.Key, tk.ProcessDefinitionKey)
	assert.Equal(t, e.m.DefinitionID, tk.ProcessDefinitionID)
	assert.Equal(t, "v1.2", tk.ProcessDefinitionVersionTag)
	assert.Equal(t, "order-4711", tk.BusinessKey)
	assert.Empty(t, tk.TenantID)
	assert.Nil(t, tk.Retries, "retries stay null until the first failure")
	assert.EqualValues(t, 7, tk.Priority)
	assert.False(t, tk.Suspended)
	assert.Empty(t, tk.ErrorMessage)
	assert.Equal(t, map[string]string{"provider": "fake-pay", "sla": "5m"}, tk.ExtensionProperties)
	assert.Equal(t, []string{"wanted"}, keys(tk.Variables))
	// The lock runs from the engine's now; allow for clock skew of the same host.
	assert.WithinDuration(t, before.Add(90*time.Second), tk.LockExpirationTime.Time, 15*time.Second)
	if createTimeInFetchAndLock(t, e.c.Client) {
		assert.WithinDuration(t, before, tk.CreateTime.Time, 15*time.Second)
	} else {
		assert.True(t, tk.CreateTime.IsZero(), "7.20 sends no createTime with a locked task, got %v", tk.CreateTime)
	}

	got, err := e.c.ExternalTask(e.ctx, tk.ID)
	require.NoError(t, err)
	assert.Equal(t, e.worker, got.WorkerID)
	assert.True(t, got.LockExpirationTime.Equal(tk.LockExpirationTime.Time))
}

func keys(vs camunda7.Variables) []string {
	out := make([]string, 0, len(vs))
	for k := range vs {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Our FetchTopic returns no variables unless named; AllVariables gets the engine's "all".
func TestConformanceFetchVariablesSelection(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	e.start("", camunda7.Variables{"a": camunda7.StringVar("1"), "b": camunda7.StringVar("2")})
	none := e.fetch(e.worker, 1, e.topic(time.Minute))
	require.Len(t, none, 1)
	assert.Empty(t, none[0].Variables)
	require.NoError(t, e.c.Unlock(e.ctx, none[0].ID))

	all := e.topic(time.Minute)
	all.AllVariables = true
	got := e.fetch(e.worker, 1, all)
	require.Len(t, got, 1)
	assert.Equal(t, []string{"a", "b"}, keys(got[0].Variables))
}

func TestConformanceFetchFilters(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{VersionTag: "release-3"})
	pA := e.start("bk-a", camunda7.Variables{"region": camunda7.StringVar("eu")})
	pB := e.start("bk-b", camunda7.Variables{"region": camunda7.StringVar("us")})

	cases := []struct {
		name   string
		filter func(*camunda7.FetchTopic)
		want   []string
	}{
		{"business key", func(f *camunda7.FetchTopic) { f.BusinessKey = "bk-b" }, []string{pB.ID}},
		{"process variables", func(f *camunda7.FetchTopic) { f.ProcessVariables = map[string]any{"region": "eu"} }, []string{pA.ID}},
		{"other definition key", func(f *camunda7.FetchTopic) { f.ProcessDefinitionKey = "no-such-key" }, nil},
		{"definition key in", func(f *camunda7.FetchTopic) {
			f.ProcessDefinitionKeyIn = []string{"x", e.m.Key}
			f.BusinessKey = "bk-a"
		}, []string{pA.ID}},
		{"definition id", func(f *camunda7.FetchTopic) { f.ProcessDefinitionID = e.m.DefinitionID; f.BusinessKey = "bk-a" }, []string{pA.ID}},
		{"definition id in", func(f *camunda7.FetchTopic) { f.ProcessDefinitionIDIn = []string{"nope"} }, nil},
		{"version tag mismatch", func(f *camunda7.FetchTopic) { f.ProcessDefinitionVersionTag = "release-4" }, nil},
		{"tenant in", func(f *camunda7.FetchTopic) { f.TenantIDIn = []string{"tenant-x"} }, nil},
	}
	for _, tc := range cases {
		topic := e.topic(time.Minute)
		tc.filter(&topic)
		tasks := e.fetch(e.worker, 10, topic)
		var got []string
		for _, tk := range tasks {
			got = append(got, tk.ProcessInstanceID)
			require.NoError(t, e.c.Unlock(e.ctx, tk.ID))
		}
		assert.ElementsMatch(t, tc.want, got, tc.name)
	}
	// Without a tenant, and with the matching version tag, both instances qualify.
	topic := e.topic(time.Minute)
	topic.WithoutTenantID = true
	topic.ProcessDefinitionVersionTag = "release-3"
	assert.Len(t, e.fetch(e.worker, 10, topic), 2)
}

func TestConformancePriorityAndSorting(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	var ids []string
	for i := 0; i < 3; i++ {
		pi := e.start(fmt.Sprintf("bk-%d", i), nil)
		ids = append(ids, pi.ID)
	}
	tasks, err := e.c.ExternalTasks(e.ctx, camunda7.ExternalTaskQuery{TopicName: e.m.Topic})
	require.NoError(t, err)
	require.Len(t, tasks, 3)
	byInstance := map[string]string{}
	for _, tk := range tasks {
		byInstance[tk.ProcessInstanceID] = tk.ID
	}
	require.NoError(t, e.c.SetExternalTaskPriority(e.ctx, byInstance[ids[1]], 50))

	got, err := e.c.FetchAndLock(e.ctx, camunda7.FetchAndLockRequest{WorkerID: e.worker, MaxTasks: 1, UsePriority: true, Topics: []camunda7.FetchTopic{e.topic(time.Minute)}})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, ids[1], got[0].ProcessInstanceID, "highest priority first")
	assert.EqualValues(t, 50, got[0].Priority)

	got, err = e.c.FetchAndLock(e.ctx, camunda7.FetchAndLockRequest{WorkerID: e.worker, MaxTasks: 2,
		Sorting: []camunda7.Sorting{{SortBy: camunda7.SortByCreateTime, SortOrder: camunda7.SortDesc}},
		Topics:  []camunda7.FetchTopic{e.topic(time.Minute)}})
	require.NoError(t, err)
	require.Len(t, got, 2)
	if !createTimeInFetchAndLock(t, e.c.Client) {
		// 7.20 ignores sorting (and sends no createTime to check it by): pinned in
		// TestConformanceErrorMatrix.
		return
	}
	assert.False(t, got[0].CreateTime.Before(got[1].CreateTime.Time), "newest first")
}

// createTimeInFetchAndLock reports whether the engine sorts fetchAndLock by createTime
// and sends each locked task's createTime: Camunda 7.20 does neither (measured on
// 7.20.0: no createTime field, and "sorting" ignored, even an invalid one), 7.22.0 and
// 7.24.0 do both; 7.21 is not run here. The worker never sorts and never reads
// createTime, so it works the same on both (docs/engine-facts.md).
func createTimeInFetchAndLock(t *testing.T, c *camunda7.Client) bool {
	return testenv.EngineAtLeast(t, c, "7.21")
}

// Two workers fetching at once never both get a task.
func TestConformanceConcurrentFetchesNeverShareATask(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	const n = 20
	for i := 0; i < n; i++ {
		e.start("", nil)
	}
	type result struct {
		tasks []camunda7.LockedExternalTask
		err   error
	}
	results := make(chan result, 4)
	for w := 0; w < 4; w++ {
		go func(w int) {
			tasks, err := e.c.FetchAndLock(e.ctx, camunda7.FetchAndLockRequest{WorkerID: fmt.Sprintf("%s-%d", e.worker, w), MaxTasks: n, Topics: []camunda7.FetchTopic{e.topic(time.Minute)}})
			results <- result{tasks, err}
		}(w)
	}
	seen := map[string]bool{}
	for w := 0; w < 4; w++ {
		r := <-results
		require.NoError(t, r.err)
		for _, tk := range r.tasks {
			assert.False(t, seen[tk.ID], "task %s delivered twice", tk.ID)
			seen[tk.ID] = true
		}
	}
	assert.Len(t, seen, n)
}

func TestConformanceCompleteAndMessage(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	pi, task := e.startAndLock(time.Minute)
	require.NoError(t, e.c.Complete(e.ctx, task.ID, camunda7.CompleteRequest{
		WorkerID:       e.worker,
		Variables:      camunda7.Variables{"result": camunda7.StringVar("done")},
		LocalVariables: camunda7.Variables{"local": camunda7.BoolVar(true)},
	}))
	vars, err := e.c.ProcessInstanceVariables(e.ctx, pi.ID)
	require.NoError(t, err)
	s, err := vars.String("result")
	require.NoError(t, err)
	assert.Equal(t, "done", s)
	assert.False(t, vars.Has("local"), "local variables stay on the task's execution")

	require.NoError(t, e.c.CorrelateMessage(e.ctx, admin.MessageCorrelation{MessageName: e.m.MessageName, ProcessInstanceID: pi.ID}))
	h, err := e.c.HistoricProcessInstance(e.ctx, pi.ID)
	require.NoError(t, err)
	assert.Equal(t, "COMPLETED", h.State)
	acts, err := e.c.HistoricActivityInstances(e.ctx, url.Values{"processInstanceId": {pi.ID}})
	require.NoError(t, err)
	assert.Contains(t, activityIDs(acts), "endOk")

	_, err = e.c.ProcessInstance(e.ctx, pi.ID)
	ee := engineError(t, err, 404, "InvalidRequestException", q("Process instance with id "+pi.ID+" does not exist"))
	assert.ErrorIs(t, ee, camunda7.ErrNotFound)
	assert.NotErrorIs(t, ee, camunda7.ErrTaskGone)

	err = e.c.CorrelateMessage(e.ctx, admin.MessageCorrelation{MessageName: e.m.MessageName, ProcessInstanceID: pi.ID})
	// The engine prefixes this message with the Java exception's class name.
	engineError(t, err, 400, "RestException", q("org.camunda.bpm.engine.MismatchingMessageCorrelationException: Cannot correlate message '"+e.m.MessageName+"': No process definition or execution matches the parameters"))
}

func activityIDs(acts []admin.HistoricActivityInstance) []string {
	var out []string
	for _, a := range acts {
		out = append(out, a.ActivityID)
	}
	return out
}

func TestConformanceBPMNErrorTakesBoundaryPath(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	pi, task := e.startAndLock(time.Minute)
	require.NoError(t, e.c.BPMNError(e.ctx, task.ID, camunda7.BPMNErrorRequest{
		WorkerID: e.worker, ErrorCode: "BUSINESS_ERROR", ErrorMessage: "card declined",
		Variables: camunda7.Variables{"declineReason": camunda7.StringVar("insufficient_funds")},
	}))
	h, err := e.c.HistoricProcessInstance(e.ctx, pi.ID)
	require.NoError(t, err)
	assert.Equal(t, "COMPLETED", h.State)
	acts, err := e.c.HistoricActivityInstances(e.ctx, url.Values{"processInstanceId": {pi.ID}})
	require.NoError(t, err)
	ids := activityIDs(acts)
	assert.Contains(t, ids, "onBusinessError")
	assert.Contains(t, ids, "endError")
	assert.NotContains(t, ids, "endOk")
	hv, err := e.c.HistoricVariableInstances(e.ctx, url.Values{"processInstanceId": {pi.ID}, "variableName": {"declineReason"}})
	require.NoError(t, err)
	require.Len(t, hv, 1, "variables sent with the BPMN error are set")

	// A second report for the same task: it is gone.
	err = e.c.Complete(e.ctx, task.ID, camunda7.CompleteRequest{WorkerID: e.worker})
	ee := engineError(t, err, 404, "RestException", q("External task with id "+task.ID+" does not exist"))
	assert.ErrorIs(t, ee, camunda7.ErrTaskGone)
}

// An error code with no catching boundary event simply ends the activity.
func TestConformanceBPMNErrorWithoutCatch(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{NoMessageWait: true})
	pi, task := e.startAndLock(time.Minute)
	require.NoError(t, e.c.BPMNError(e.ctx, task.ID, camunda7.BPMNErrorRequest{WorkerID: e.worker, ErrorCode: "NOBODY_CATCHES"}))
	acts, err := e.c.HistoricActivityInstances(e.ctx, url.Values{"processInstanceId": {pi.ID}})
	require.NoError(t, err)
	ids := activityIDs(acts)
	assert.NotContains(t, ids, "endError")
	assert.NotContains(t, ids, "endOk")
	h, err := e.c.HistoricProcessInstance(e.ctx, pi.ID)
	require.NoError(t, err)
	assert.Equal(t, "COMPLETED", h.State, "the activity ends and, with nothing after it, so does the instance")
}

func TestConformanceFailureRetriesAndIncident(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	pi, task := e.startAndLock(time.Minute)

	// retries 2, no timeout: fetchable again at once, with the failure's fields.
	require.NoError(t, e.c.Failure(e.ctx, task.ID, camunda7.FailureRequest{
		WorkerID: e.worker, ErrorMessage: "provider timeout", ErrorDetails: "details line 1\nline 2", Retries: 2,
	}))
	again := e.fetch(e.worker, 1)
	require.Len(t, again, 1)
	require.NotNil(t, again[0].Retries)
	assert.Equal(t, 2, *again[0].Retries)
	assert.Equal(t, "provider timeout", again[0].ErrorMessage)
	assert.Equal(t, "details line 1\nline 2", again[0].ErrorDetails)
	details, err := e.c.ExternalTaskErrorDetails(e.ctx, task.ID)
	require.NoError(t, err)
	assert.Equal(t, "details line 1\nline 2", details)

	// retries 0: an incident, and the task is no longer fetchable.
	require.NoError(t, e.c.Failure(e.ctx, task.ID, camunda7.FailureRequest{WorkerID: e.worker, ErrorMessage: "permanent: card blocked", Retries: 0}))
	inc, err := e.c.Incidents(e.ctx, url.Values{"processInstanceId": {pi.ID}, "incidentType": {admin.IncidentTypeFailedExternalTask}})
	require.NoError(t, err)
	require.Len(t, inc, 1)
	assert.Equal(t, task.ID, inc[0].Configuration)
	assert.Equal(t, "permanent: card blocked", inc[0].IncidentMessage)
	assert.Equal(t, "task", inc[0].ActivityID)
	assert.Empty(t, e.fetch(e.worker, 1), "a task with 0 retries is never fetched")

	// PUT retries resolves the incident and makes the task fetchable.
	require.NoError(t, e.c.SetExternalTaskRetries(e.ctx, task.ID, 1))
	inc, err = e.c.Incidents(e.ctx, url.Values{"processInstanceId": {pi.ID}})
	require.NoError(t, err)
	assert.Empty(t, inc)
	hist, err := e.c.HistoricIncidents(e.ctx, url.Values{"processInstanceId": {pi.ID}})
	require.NoError(t, err)
	require.Len(t, hist, 1)
	assert.True(t, hist[0].Resolved)
	assert.Len(t, e.fetch(e.worker, 1), 1)

	log, err := e.c.ExternalTaskLog(e.ctx, url.Values{"externalTaskId": {task.ID}, "failureLog": {"true"}})
	require.NoError(t, err)
	assert.Len(t, log, 2, "two failures in the external task log")
}

// The engine does not count down: after failure with retryTimeout the task stays
// unfetchable until the timeout passes.
func TestConformanceFailureRetryTimeout(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	_, task := e.startAndLock(time.Minute)
	require.NoError(t, e.c.Failure(e.ctx, task.ID, camunda7.FailureRequest{WorkerID: e.worker, ErrorMessage: "later", Retries: 3, RetryTimeout: 2 * time.Second}))
	assert.Empty(t, e.fetch(e.worker, 1), "locked during retryTimeout")
	testenv.Eventually(t, 15*time.Second, "task fetchable after retryTimeout", func() (bool, error) {
		return len(e.fetch(e.worker, 1)) == 1, nil
	})
}

func TestConformanceErrorMatrix(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	_, task := e.startAndLock(time.Minute)
	other := "someone-else"
	id := task.ID

	t.Run("complete by another worker", func(t *testing.T) {
		err := e.c.Complete(e.ctx, id, camunda7.CompleteRequest{WorkerID: other})
		ee := engineError(t, err, 400, "RestException", q(fmt.Sprintf("External Task %s cannot be completed by worker '%s'. It is locked by worker '%s'.", id, other, e.worker)))
		assert.ErrorIs(t, ee, camunda7.ErrLockLost)
	})
	t.Run("failure by another worker", func(t *testing.T) {
		err := e.c.Failure(e.ctx, id, camunda7.FailureRequest{WorkerID: other, Retries: 1})
		engineError(t, err, 400, "RestException", q(fmt.Sprintf("Failure of External Task %s cannot be reported by worker '%s'. It is locked by worker '%s'.", id, other, e.worker)))
		assert.ErrorIs(t, err, camunda7.ErrLockLost)
	})
	t.Run("bpmnError by another worker", func(t *testing.T) {
		err := e.c.BPMNError(e.ctx, id, camunda7.BPMNErrorRequest{WorkerID: other, ErrorCode: "X"})
		engineError(t, err, 400, "RestException", q(fmt.Sprintf("Bpmn error of External Task %s cannot be reported by worker '%s'. It is locked by worker '%s'.", id, other, e.worker)))
		assert.ErrorIs(t, err, camunda7.ErrLockLost)
	})
	t.Run("extendLock by another worker", func(t *testing.T) {
		err := e.c.ExtendLock(e.ctx, id, other, time.Minute)
		engineError(t, err, 400, "RestException", q(fmt.Sprintf("The lock of the External Task %s cannot be extended by worker '%s''. It is locked by worker '%s'.", id, other, e.worker)))
		assert.ErrorIs(t, err, camunda7.ErrLockLost)
	})
	t.Run("lock held by another worker", func(t *testing.T) {
		err := e.c.Lock(e.ctx, id, other, time.Minute)
		engineError(t, err, 400, "RestException", q(fmt.Sprintf("External Task %s cannot be locked by worker '%s'. It is locked by worker '%s'.", id, other, e.worker)))
		assert.ErrorIs(t, err, camunda7.ErrLockLost)
	})
	t.Run("extendLock by owner moves the expiry to now plus newDuration", func(t *testing.T) {
		before := time.Now()
		require.NoError(t, e.c.ExtendLock(e.ctx, id, e.worker, 5*time.Minute))
		got, err := e.c.ExternalTask(e.ctx, id)
		require.NoError(t, err)
		assert.WithinDuration(t, before.Add(5*time.Minute), got.LockExpirationTime.Time, 15*time.Second)
	})
	t.Run("lock by owner acts as extendLock", func(t *testing.T) {
		require.NoError(t, e.c.Lock(e.ctx, id, e.worker, 2*time.Minute))
	})
	t.Run("engine rejects lockTime and lockDuration <= 0", func(t *testing.T) {
		status, body := rawPost(t, "/external-task/"+id+"/extendLock", fmt.Sprintf(`{"workerId":%q,"newDuration":0}`, e.worker))
		assert.Equal(t, 400, status)
		assert.Equal(t, "lockTime is not greater than 0", body["message"])
		status, body = rawPost(t, "/external-task/"+id+"/lock", fmt.Sprintf(`{"workerId":%q,"lockDuration":0}`, e.worker))
		assert.Equal(t, 400, status)
		assert.Equal(t, "lockDuration is not greater than 0", body["message"])
	})
	t.Run("missing workerId", func(t *testing.T) {
		status, body := rawPost(t, "/external-task/"+id+"/complete", `{}`)
		t.Logf("complete without workerId: %d %v", status, body)
		assert.Equal(t, 500, status)
		assert.Equal(t, "NullValueException", body["type"])
		assert.Equal(t, "workerId is null", body["message"])
	})
	t.Run("negative retries on failure", func(t *testing.T) {
		status, body := rawPost(t, "/external-task/"+id+"/failure", fmt.Sprintf(`{"workerId":%q,"retries":-1}`, e.worker))
		t.Logf("failure with retries -1: %d %v", status, body)
		assert.Equal(t, 500, status)
		assert.Equal(t, "retries is not greater than or equal to 0", body["message"])
	})
	t.Run("set retries null and negative", func(t *testing.T) {
		status, body := rawDo(t, http.MethodPut, "/external-task/"+id+"/retries", `{"retries":null}`)
		assert.Equal(t, 400, status)
		assert.Equal(t, "The number of retries cannot be null.", body["message"])
		err := e.c.SetExternalTaskRetries(e.ctx, id, -1)
		engineError(t, err, 400, "BadUserRequestException", q("The number of retries cannot be negative: retries is not greater than or equal to 0"))
	})
	t.Run("long poll timeout above 30 minutes", func(t *testing.T) {
		status, body := rawPost(t, "/external-task/fetchAndLock", `{"workerId":"w","maxTasks":1,"asyncResponseTimeout":1800001,"topics":[]}`)
		assert.Equal(t, 400, status)
		assert.Equal(t, "InvalidRequestException", body["type"])
		assert.Equal(t, "The asynchronous response timeout cannot be set to a value greater than 1800000 milliseconds", body["message"])
	})
	t.Run("sorting by anything but createTime", func(t *testing.T) {
		if !createTimeInFetchAndLock(t, e.c.Client) {
			status, data := rawDoBytes(t, http.MethodPost, "/external-task/fetchAndLock", `{"workerId":"w","maxTasks":1,"sorting":[{"sortBy":"priority","sortOrder":"asc"}],"topics":[]}`)
			assert.Equal(t, 200, status, "7.20 ignores sorting")
			assert.JSONEq(t, `[]`, string(data))
			return
		}
		status, body := rawPost(t, "/external-task/fetchAndLock", `{"workerId":"w","maxTasks":1,"sorting":[{"sortBy":"priority","sortOrder":"asc"}],"topics":[]}`)
		assert.Equal(t, 400, status)
		assert.Equal(t, "InvalidRequestException", body["type"])
		assert.Contains(t, body["message"], "Cannot set query sortBy parameter to value priority")
	})
	t.Run("errorDetails of an unknown task", func(t *testing.T) {
		_, err := e.c.ExternalTaskErrorDetails(e.ctx, "no-such-task")
		ee := engineError(t, err, 500, "NullValueException", q("No external task found with id no-such-task: externalTask is null"))
		assert.ErrorIs(t, ee, camunda7.ErrTaskGone)
	})
	t.Run("errorDetails of a task without failure", func(t *testing.T) {
		d, err := e.c.ExternalTaskErrorDetails(e.ctx, id)
		require.NoError(t, err)
		assert.Empty(t, d)
	})
	t.Run("start an unknown process", func(t *testing.T) {
		_, err := e.c.StartProcess(e.ctx, "no-such-process", admin.StartProcessRequest{})
		ee := engineError(t, err, 404, "RestException", q("No matching process definition with key: no-such-process and no tenant-id"))
		assert.ErrorIs(t, ee, camunda7.ErrNotFound)
	})
	t.Run("invalid variables", func(t *testing.T) {
		err := e.c.Complete(e.ctx, id, camunda7.CompleteRequest{WorkerID: e.worker, Variables: camunda7.Variables{"x": {Type: "Foo", Value: json.RawMessage(`1`)}}})
		ee := engineError(t, err, 400, "RestException", ".*"+q("Unsupported value type 'Foo'"))
		assert.ErrorIs(t, ee, camunda7.ErrBadRequest)
		err = e.c.Complete(e.ctx, id, camunda7.CompleteRequest{WorkerID: e.worker, Variables: camunda7.Variables{"d": {Type: "Date", Value: json.RawMessage(`"2024-05-01T12:00:00+02:00"`)}}})
		engineError(t, err, 400, "InvalidRequestException", ".*"+q("Cannot convert value '2024-05-01T12:00:00+02:00' of type 'Date' to java type java.util.Date"))
		// The task is still locked by us and can be completed.
		_, err = e.c.ExternalTask(e.ctx, id)
		require.NoError(t, err)
	})
}

func TestConformanceUnlockThenComplete(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	_, task := e.startAndLock(time.Minute)
	require.NoError(t, e.c.Unlock(e.ctx, task.ID))
	err := e.c.Complete(e.ctx, task.ID, camunda7.CompleteRequest{WorkerID: e.worker})
	engineError(t, err, 400, "RestException", q(fmt.Sprintf("External Task %s cannot be completed by worker '%s'. It is locked by worker 'null'.", task.ID, e.worker)))
	assert.ErrorIs(t, err, camunda7.ErrLockLost)
	err = e.c.ExtendLock(e.ctx, task.ID, e.worker, time.Minute)
	engineError(t, err, 400, "RestException", q(fmt.Sprintf("The lock of the External Task %s cannot be extended by worker '%s''. It is locked by worker 'null'.", task.ID, e.worker)))
	// Lock without fetching takes it back.
	require.NoError(t, e.c.Lock(e.ctx, task.ID, e.worker, time.Minute))
	require.NoError(t, e.c.Complete(e.ctx, task.ID, camunda7.CompleteRequest{WorkerID: e.worker}))
}

// The engine checks the worker id, not the lock's expiry: a worker whose lock expired can
// still complete while nobody else has fetched the task; extendLock cannot revive it.
func TestConformanceExpiredLock(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	_, t1 := e.startAndLock(time.Second)
	_, t2 := e.startAndLock(time.Second)
	testenv.Eventually(t, 20*time.Second, "locks to expire", func() (bool, error) {
		got, err := e.c.ExternalTask(e.ctx, t2.ID)
		return err == nil && time.Now().After(got.LockExpirationTime.Add(200*time.Millisecond)), err
	})

	err := e.c.ExtendLock(e.ctx, t1.ID, e.worker, time.Minute)
	ee := engineError(t, err, 400, "RestException", q("Cannot extend a lock that expired: lockExpirationTime is not greater than or equal to ")+`\d+`)
	assert.ErrorIs(t, ee, camunda7.ErrLockLost)
	require.NoError(t, e.c.Complete(e.ctx, t1.ID, camunda7.CompleteRequest{WorkerID: e.worker}), "complete after own lock expired, nobody refetched")

	// Once another worker refetches, the original worker has lost it.
	thief := e.fetch("thief", 5, e.topic(time.Minute))
	require.Len(t, thief, 1)
	require.Equal(t, t2.ID, thief[0].ID)
	err = e.c.Complete(e.ctx, t2.ID, camunda7.CompleteRequest{WorkerID: e.worker})
	engineError(t, err, 400, "RestException", q(fmt.Sprintf("External Task %s cannot be completed by worker '%s'. It is locked by worker 'thief'.", t2.ID, e.worker)))
	assert.ErrorIs(t, err, camunda7.ErrLockLost)
}

func TestConformanceTaskGone(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	_, done := e.startAndLock(time.Minute)
	require.NoError(t, e.c.Complete(e.ctx, done.ID, camunda7.CompleteRequest{WorkerID: e.worker}))
	pi, cancelled := e.startAndLock(time.Minute)
	require.NoError(t, e.c.DeleteProcessInstance(e.ctx, pi.ID))

	for _, id := range []string{done.ID, cancelled.ID} {
		msg := q("External task with id " + id + " does not exist")
		calls := map[string]error{
			"complete":    e.c.Complete(e.ctx, id, camunda7.CompleteRequest{WorkerID: e.worker}),
			"failure":     e.c.Failure(e.ctx, id, camunda7.FailureRequest{WorkerID: e.worker, Retries: 1}),
			"bpmnError":   e.c.BPMNError(e.ctx, id, camunda7.BPMNErrorRequest{WorkerID: e.worker, ErrorCode: "X"}),
			"extendLock":  e.c.ExtendLock(e.ctx, id, e.worker, time.Minute),
			"lock":        e.c.Lock(e.ctx, id, e.worker, time.Minute),
			"unlock":      e.c.Unlock(e.ctx, id),
			"set retries": e.c.SetExternalTaskRetries(e.ctx, id, 1),
		}
		_, calls["get"] = e.c.ExternalTask(e.ctx, id)
		for name, err := range calls {
			ee := engineError(t, err, 404, "RestException", msg)
			assert.ErrorIs(t, ee, camunda7.ErrTaskGone, name)
		}
	}
}

func TestConformanceSuspended(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	pi, task := e.startAndLock(time.Minute)
	require.NoError(t, e.c.SuspendProcessInstance(e.ctx, pi.ID, true))
	msg := q(fmt.Sprintf("ENGINE-03043 ExternalTask with id '%s' is suspended.", task.ID))
	for name, err := range map[string]error{
		"complete":   e.c.Complete(e.ctx, task.ID, camunda7.CompleteRequest{WorkerID: e.worker}),
		"failure":    e.c.Failure(e.ctx, task.ID, camunda7.FailureRequest{WorkerID: e.worker, Retries: 1}),
		"bpmnError":  e.c.BPMNError(e.ctx, task.ID, camunda7.BPMNErrorRequest{WorkerID: e.worker, ErrorCode: "X"}),
		"extendLock": e.c.ExtendLock(e.ctx, task.ID, e.worker, time.Minute),
	} {
		ee := engineError(t, err, 400, "RestException", msg)
		assert.ErrorIs(t, ee, camunda7.ErrSuspended, name)
		assert.NotErrorIs(t, ee, camunda7.ErrLockLost, name)
	}
	got, err := e.c.ExternalTask(e.ctx, task.ID)
	require.NoError(t, err)
	assert.True(t, got.Suspended)
	require.NoError(t, e.c.SuspendProcessInstance(e.ctx, pi.ID, false))
	require.NoError(t, e.c.Complete(e.ctx, task.ID, camunda7.CompleteRequest{WorkerID: e.worker}))
}

func TestConformanceLongPollEmptyAtTimeout(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	start := time.Now()
	tasks, err := e.c.FetchAndLock(e.ctx, camunda7.FetchAndLockRequest{WorkerID: e.worker, MaxTasks: 1, AsyncResponseTimeout: 1500 * time.Millisecond, Topics: []camunda7.FetchTopic{e.topic(time.Minute)}})
	took := time.Since(start)
	require.NoError(t, err)
	assert.NotNil(t, tasks, "an empty JSON list, not null")
	assert.Empty(t, tasks)
	assert.GreaterOrEqual(t, took, 1400*time.Millisecond, "the engine held the request")
	assert.Less(t, took, 1500*time.Millisecond+10*time.Second)
	t.Logf("long poll of 1.5s answered [] after %v", took)
}

// longPoll starts a fetchAndLock long poll on its own client and returns once the
// request has been written to the engine and a probe round trip has passed (the engine
// runs a poll's first attempt synchronously before queueing it), with a channel for
// its result and the time it answered. It fails the test if the poll answered already.
func (e *env) longPoll(ctx context.Context, timeout time.Duration) <-chan pollResult {
	e.t.Helper()
	written := make(chan struct{}, 1)
	c, err := camunda7.New(camunda7.Config{BaseURL: testenv.EngineURL(), HTTPClient: &http.Client{Transport: wroteSignal{written}}})
	require.NoError(e.t, err)
	ch := make(chan pollResult, 1)
	go func() {
		tasks, err := c.FetchAndLock(ctx, camunda7.FetchAndLockRequest{WorkerID: e.worker + "-poller", MaxTasks: 1, AsyncResponseTimeout: timeout, Topics: []camunda7.FetchTopic{e.topic(time.Minute)}})
		ch <- pollResult{tasks, err, time.Now()}
	}()
	select {
	case <-written:
	case <-time.After(10 * time.Second):
		e.t.Fatal("long poll request was not written within 10s")
	}
	require.Empty(e.t, e.fetch(e.worker+"-probe", 1), "probe")
	select {
	case r := <-ch:
		e.t.Fatalf("long poll answered before anything happened: %+v", r)
	default:
	}
	return ch
}

// wroteSignal is a transport that signals once a request has been written in full.
type wroteSignal struct{ ch chan struct{} }

func (w wroteSignal) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{WroteRequest: func(info httptrace.WroteRequestInfo) {
		if info.Err == nil {
			select {
			case w.ch <- struct{}{}:
			default:
			}
		}
	}})
	return http.DefaultTransport.RoundTrip(req.WithContext(ctx))
}

type pollResult struct {
	tasks []camunda7.LockedExternalTask
	err   error
	at    time.Time
}

// A new task wakes a pending long poll at once (not at the 30 s re-poll).
func TestConformanceLongPollWokenByNewTask(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	const poll = 25 * time.Second
	ch := e.longPoll(e.ctx, poll)
	pi := e.start("", nil)
	started := time.Now()
	r := <-ch
	require.NoError(t, r.err)
	require.Len(t, r.tasks, 1)
	assert.Equal(t, pi.ID, r.tasks[0].ProcessInstanceID)
	wake := r.at.Sub(started)
	assert.Less(t, wake, 5*time.Second, "woken by the new task, far before the %v timeout", poll)
	t.Logf("new task woke the pending long poll %v after the start call returned", wake)
}

// Unlock wakes a pending long poll too.
func TestConformanceLongPollWokenByUnlock(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	_, task := e.startAndLock(time.Minute)
	const poll = 25 * time.Second
	ch := e.longPoll(e.ctx, poll)
	require.NoError(t, e.c.Unlock(e.ctx, task.ID))
	unlocked := time.Now()
	r := <-ch
	require.NoError(t, r.err)
	require.Len(t, r.tasks, 1)
	assert.Equal(t, task.ID, r.tasks[0].ID)
	wake := r.at.Sub(unlocked)
	assert.Less(t, wake, 5*time.Second)
	t.Logf("unlock woke the pending long poll %v after the unlock returned", wake)
}

// Shutdown of the long poll on our side: cancelling the context ends it at once.
func TestConformanceLongPollCancelled(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	ctx, cancel := context.WithCancel(e.ctx)
	ch := e.longPoll(ctx, 30*time.Second)
	cancel()
	select {
	case r := <-ch:
		assert.ErrorIs(t, r.err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("cancelled long poll did not return")
	}
}
