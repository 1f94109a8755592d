package extworker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/humantask"
	"github.com/extworker/extworker/internal/testenv"
)

// A process that serves human tasks only: EXTWORKER_TASKS_ADDR turns the service on, on
// its own listener, with the page under /ui/ (EXTWORKER_TASKS_PAGE) and the business
// rules App.HumanTasks gave it; users are named by the trusted proxy's header. Run
// ends with its context.
func TestAppServesHumanTasks(t *testing.T) {
	addr, opsAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	ns := testenv.Unique("ht")
	app := newChannelsApp(t, map[string]string{"EXTWORKER_TASKS_ADDR": addr, "EXTWORKER_HTTP_ADDR": opsAddr, "EXTWORKER_TASKS_AUTH_HEADER": "X-User",
		"EXTWORKER_TASKS_TRUSTED_PROXIES": "127.0.0.1,::1", "EXTWORKER_TASKS_PAGE": "true", "EXTWORKER_TASKS_NAMESPACE": ns})
	engine := testenv.Engine(t)
	ctx := testenv.Context(t, 2*time.Minute)
	key := testenv.Unique("approval")
	testenv.DeployUserTask(t, engine, testenv.UserTaskProcess{Key: key, TaskID: key + "-approve", CandidateUsers: []string{"alice"}})
	t.Cleanup(func() {
		_, _ = app.Pool().Exec(context.Background(), `DELETE FROM extworker_intents WHERE namespace = $1`, ns)
	})
	require.NoError(t, app.HumanTasks(map[string]humantask.Guard{key + "-approve": func(context.Context, humantask.Task, humantask.Form) error {
		return errors.New("approvals wait for the quarter's close")
	}}))

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- app.Run(runCtx) }()
	base := "http://" + addr
	get := func(path, user string, headers ...string) (int, http.Header, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		require.NoError(t, err)
		if user != "" {
			req.Header.Set("X-User", user)
		}
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			return 0, nil, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	testenv.Eventually(t, 30*time.Second, "the human tasks' listener", func() (bool, error) {
		select {
		case err := <-done:
			return false, fmt.Errorf("Run ended: %v", err)
		default:
		}
		status, _, body := get("/tasks", "")
		if status == 0 {
			return false, errors.New(body)
		}
		return true, nil
	})
	status, _, body := get("/tasks", "")
	assert.Equal(t, http.StatusUnauthorized, status, body)

	pi, err := engine.StartProcess(ctx, key, admin.StartProcessRequest{Variables: camunda7.Variables{"amount": camunda7.LongVar(5)}})
	require.NoError(t, err)
	ts, err := engine.UserTasks(ctx, url.Values{"processInstanceId": {pi.ID}})
	require.NoError(t, err)
	require.Len(t, ts, 1)
	status, header, body := get("/tasks/"+ts[0].ID, "alice")
	require.Equal(t, http.StatusOK, status, body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/tasks/"+ts[0].ID+"/complete", strings.NewReader(`{"approved":true}`))
	require.NoError(t, err)
	req.Header.Set("X-User", "alice")
	req.Header.Set("Idempotency-Key", testenv.Unique("cmd"))
	req.Header.Set("If-Match", header.Get("ETag"))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	assert.Contains(t, string(b), "approvals wait for the quarter's close", "App.HumanTasks' guard")

	// The service's metrics are the App's (an outside tester found none on /metrics).
	resp, err = http.Get("http://" + opsAddr + "/metrics")
	require.NoError(t, err)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(b), `extworker_humantask_commands_total{outcome="refused",status="422"} 1`)
	assert.Regexp(t, `extworker_ledger_transitions_total\{[^}]*scope="humantask.complete"`, string(b), "the commands' ledger transitions")

	status, header, body = get("/ui/tasks/"+ts[0].ID, "alice")
	assert.Equal(t, http.StatusSeeOther, status, "the page mints the form's command id")
	assert.Contains(t, header.Get("Location"), "/ui/tasks/"+ts[0].ID+"?command=")
	status, _, body = get("/ui/", "alice")
	assert.Equal(t, http.StatusOK, status)
	assert.Contains(t, body, ts[0].ID)

	stop()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not end with its context")
	}
}

// HumanTasks without EXTWORKER_TASKS_ADDR is a configuration error, and so is Run then;
// so is a second guard for one task definition.
func TestAppHumanTasksConfigErrors(t *testing.T) {
	twice := newChannelsApp(t, map[string]string{"EXTWORKER_TASKS_ADDR": testenv.FreeAddr(t), "EXTWORKER_TASKS_AUTH_HEADER": "X-User",
		"EXTWORKER_TASKS_TRUSTED_PROXIES": "127.0.0.1"})
	allow := func(context.Context, humantask.Task, humantask.Form) error { return nil }
	require.NoError(t, twice.HumanTasks(map[string]humantask.Guard{"approve": allow}))
	err := twice.HumanTasks(map[string]humantask.Guard{"approve": allow})
	assert.True(t, extworker.IsConfigError(err))
	assert.ErrorContains(t, err, `a second guard for task definition "approve"`)

	app := newChannelsApp(t, map[string]string{"EXTWORKER_TASKS_ADDR": ""})
	err = app.HumanTasks(nil)
	assert.True(t, extworker.IsConfigError(err))
	assert.ErrorContains(t, err, "EXTWORKER_TASKS_ADDR")
	err = app.Run(context.Background())
	assert.True(t, extworker.IsConfigError(err))
	assert.ErrorContains(t, err, "EXTWORKER_TASKS_ADDR")
}
