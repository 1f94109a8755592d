package humantask_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/metrics"
)

// commandCounts reads extworker_humantask_commands_total from reg, by "outcome/status".
func commandCounts(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "extworker_humantask_commands_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if v := m.GetCounter().GetValue(); v > 0 {
				out[l["outcome"]+"/"+l["status"]] = v
			}
		}
	}
	return out
}

// TestMetricsCountCompletionsReplaysConflictsAndRefusals: real commands against the
// engine, each kind of answer once or more; the counter says which were first answers
// (completed, conflict, refused) and which were given again from the ledger (replayed),
// and a command whose outcome was not settled in time is counted unsettled, then completed
// once it is (settled from the engine's history).
func TestMetricsCountCompletionsReplaysConflictsAndRefusals(t *testing.T) {
	e := newEnv(t, nil)
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.NewHumanTaskMetrics(reg)
	require.NoError(t, err)
	e.observer = m
	e.start(t, e.engine)

	// completed, replayed 200, conflict, replayed 409
	task := e.startInstance(t, nil)
	tag := e.etag(t, task, "alice")
	require.Equal(t, http.StatusOK, e.complete(t, task, "alice", "m-1", tag, `{}`).status)
	require.Equal(t, http.StatusOK, e.complete(t, task, "alice", "m-1", tag, `{}`).status)
	require.Equal(t, http.StatusOK, e.complete(t, task, "alice", "m-1", tag, `{}`).status)
	require.Equal(t, http.StatusConflict, e.complete(t, task, "bob", "m-2", tag, `{}`).status)
	require.Equal(t, http.StatusConflict, e.complete(t, task, "bob", "m-2", tag, `{}`).status)

	// refused: a stale If-Match (recorded; replayed when sent again), no Idempotency-Key,
	// a key reused with another form, no identity, a task nobody has
	stale := e.startInstance(t, camunda7.Variables{"amount": camunda7.LongVar(1)})
	old := e.etag(t, stale, "alice")
	require.NoError(t, e.engine.SetUserTaskVariable(testenv.Context(t, 10*time.Second), stale, "amount", camunda7.LongVar(2)))
	require.Equal(t, http.StatusPreconditionFailed, e.complete(t, stale, "alice", "m-3", old, `{}`).status)
	require.Equal(t, http.StatusPreconditionFailed, e.complete(t, stale, "alice", "m-3", old, `{}`).status)
	path := "/tasks/" + stale + "/complete"
	require.Equal(t, http.StatusPreconditionRequired, e.do(t, http.MethodPost, path, "alice", "", []byte(`{}`), "If-Match", old).status)
	require.Equal(t, http.StatusUnprocessableEntity, e.complete(t, stale, "alice", "m-3", old, `{"other": 1}`).status)
	require.Equal(t, http.StatusUnauthorized, e.do(t, http.MethodPost, path, "", "", []byte(`{}`), "Idempotency-Key", "m-4", "If-Match", old).status)
	require.Equal(t, http.StatusNotFound, e.complete(t, "no-such-task", "alice", "m-5", old, `{}`).status)

	assert.Equal(t, map[string]float64{
		"completed/200": 1, "replayed/200": 2, "conflict/409": 1, "replayed/409": 1,
		"refused/412": 1, "replayed/412": 1, "refused/428": 1, "refused/422": 1, "refused/401": 1, "refused/404": 1,
	}, commandCounts(t, reg))

	// unsettled: the engine completes the task and its answer is held; the same command
	// sent meanwhile is not settled within AnswerWithin (503). Once the answer is lost,
	// the first request settles it from the engine's history: completed, counted once.
	reg = prometheus.NewPedanticRegistry()
	m, err = metrics.NewHumanTaskMetrics(reg)
	require.NoError(t, err)
	e.observer, e.answerWithin = m, 300*time.Millisecond
	held := e.startInstance(t, nil)
	heldTag := e.etag(t, held, "alice")
	release := make(chan struct{})
	lossy, completes := answerLosingEngine(t, release)
	e.start(t, lossy)
	first := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, e.srv.URL+"/tasks/"+held+"/complete", strings.NewReader(`{}`))
		req.Header.Set("X-User", "alice")
		req.Header.Set("Idempotency-Key", "m-6")
		req.Header.Set("If-Match", heldTag)
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	testenv.Eventually(t, 10*time.Second, "the first request to reach the engine", func() (bool, error) {
		return completes.Load() == 1, nil
	})
	r := e.complete(t, held, "alice", "m-6", heldTag, `{}`)
	require.Equal(t, http.StatusServiceUnavailable, r.status, string(r.body))
	assert.NotEmpty(t, r.header.Get("Retry-After"))
	close(release)
	unsettled := 1.0
	select {
	case status := <-first:
		// the lost answer is settled within the first request's AnswerWithin, or not
		require.Contains(t, []int{http.StatusOK, http.StatusServiceUnavailable}, status)
		if status == http.StatusServiceUnavailable {
			unsettled++
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first request did not end within 30s")
	}
	settled := map[string]float64{"unsettled/503": unsettled, "completed/200": 1}
	if unsettled == 2 { // sent again, as a client does after a 503: settled now, from the engine
		testenv.Eventually(t, 30*time.Second, "the command settled", func() (bool, error) {
			r := e.complete(t, held, "alice", "m-6", heldTag, `{}`)
			if r.status == http.StatusServiceUnavailable {
				settled["unsettled/503"]++
			}
			return r.status == http.StatusOK, nil
		})
	}
	assert.Equal(t, int32(1), completes.Load(), "the engine was asked to complete once")
	assert.Equal(t, settled, commandCounts(t, reg))
}
