package camunda7_test

import (
	"io"
	"mime"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/testenv"
)

// The engine's own answer to every per-task call on a task id it does not know, pinned
// verbatim (status, content type, the whole JSON body): the one answer the client reads
// as ErrTaskGone (a lost lock, a result to drop), while any other 404 (a proxy's or a
// servlet container's page during a redeploy) is sent again. If an engine release
// changes one of these bodies, the client would start resending a gone task's report
// until ReportRetryFor: this test says so first.
func TestConformanceUnknownTaskAnswers(t *testing.T) {
	t.Parallel()
	c := testenv.Engine(t)
	ctx := testenv.Context(t, time.Minute)
	id := testenv.Unique("no-such-task")
	gone := `{"type":"RestException","message":"External task with id ` + id + ` does not exist","code":0}`
	cases := []struct {
		name, method, path, body string
		want                     string
		call                     func() error
	}{
		{"complete", http.MethodPost, "/complete", `{"workerId":"w"}`, gone,
			func() error { return c.Complete(ctx, id, camunda7.CompleteRequest{WorkerID: "w"}) }},
		{"extendLock", http.MethodPost, "/extendLock", `{"workerId":"w","newDuration":60000}`, gone,
			func() error { return c.ExtendLock(ctx, id, "w", time.Minute) }},
		{"failure", http.MethodPost, "/failure", `{"workerId":"w","retries":1,"retryTimeout":0}`, gone,
			func() error { return c.Failure(ctx, id, camunda7.FailureRequest{WorkerID: "w", Retries: 1}) }},
		{"bpmnError", http.MethodPost, "/bpmnError", `{"workerId":"w","errorCode":"X"}`, gone,
			func() error {
				return c.BPMNError(ctx, id, camunda7.BPMNErrorRequest{WorkerID: "w", ErrorCode: "X"})
			}},
		{"unlock", http.MethodPost, "/unlock", ``, gone,
			func() error { return c.Unlock(ctx, id) }},
		{"lock", http.MethodPost, "/lock", `{"workerId":"w","lockDuration":60000}`, gone,
			func() error { return c.Lock(ctx, id, "w", time.Minute) }},
		{"get (code null)", http.MethodGet, "", ``,
			`{"type":"RestException","message":"External task with id ` + id + ` does not exist","code":null}`,
			func() error { _, err := c.ExternalTask(ctx, id); return err }},
		{"errorDetails (a 500)", http.MethodGet, "/errorDetails", ``,
			`{"type":"NullValueException","message":"No external task found with id ` + id + `: externalTask is null","code":0}`,
			func() error { _, err := c.ExternalTaskErrorDetails(ctx, id); return err }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, ctype, data := rawAnswer(t, tc.method, "/external-task/"+id+tc.path, tc.body)
			wantStatus := http.StatusNotFound
			if tc.path == "/errorDetails" {
				wantStatus = http.StatusInternalServerError
			}
			assert.Equal(t, wantStatus, status)
			mt, _, err := mime.ParseMediaType(ctype)
			require.NoError(t, err)
			assert.Equal(t, "application/json", mt)
			assert.JSONEq(t, tc.want, string(data))

			err = tc.call()
			assert.ErrorIs(t, err, camunda7.ErrTaskGone, "the client reads the engine's answer as gone")
			assert.NotErrorIs(t, err, camunda7.ErrNotSent)
		})
	}
}

// rawAnswer sends a request without the client and returns the engine's status, content
// type and body.
func rawAnswer(t *testing.T, method, path, body string) (int, string, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, testenv.EngineURL()+path, strings.NewReader(body))
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if strings.HasSuffix(path, "/errorDetails") {
		req.Header.Set("Accept", "text/plain, application/json") // as the client asks: text/plain
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header.Get("Content-Type"), data
}
