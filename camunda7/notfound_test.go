package camunda7

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Bodies of a 404 that is not the engine's answer about a task: what a servlet
// container, a proxy or a gateway in front of the engine answers while /engine-rest is
// being redeployed or is routed nowhere.
var foreign404s = []struct {
	name, ctype, body string
}{
	{"Tomcat's HTML page (the web app being redeployed)", "text/html;charset=utf-8",
		`<!doctype html><html lang="en"><head><title>HTTP Status 404 – Not Found</title></head><body><h1>HTTP Status 404 – Not Found</h1>` +
			`<hr class="line" /><p><b>Type</b> Status Report</p><p><b>Description</b> The origin server did not find a current representation ` +
			`for the target resource or is not willing to disclose that one exists.</p><hr class="line" /><h3>Apache Tomcat/9.0.83</h3></body></html>`},
	{"nginx's HTML page", "text/html",
		"<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not Found</h1></center>\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n"},
	{"empty body", "", ""},
	{"plain text", "text/plain", "404 page not found"},
	{"not JSON under a JSON content type", "application/json", "<html>404</html>"},
	{"Spring Boot's JSON (an unknown context path)", "application/json",
		`{"timestamp":"2026-12-02T18:01:09.880+00:00","status":404,"error":"Not Found","path":"/engine-rest/external-task/1/complete"}`},
	{"the engine's JSON for a path it does not serve", "application/json",
		`{"type":"NotFoundException","message":"HTTP 404 Not Found","code":null}`},
	{"a gateway's JSON with a type and another message", "application/json",
		`{"type":"RouteNotFound","message":"no route for /engine-rest"}`},
	{"the gone message as text/plain", "text/plain",
		`{"type":"RestException","message":"External task with id 1 does not exist","code":0}`},
}

// taskCalls are the per-task calls a worker makes, by the endpoint they reach.
var taskCalls = map[string]func(context.Context, *Client) error{
	"complete": func(ctx context.Context, c *Client) error {
		return c.Complete(ctx, "1", CompleteRequest{WorkerID: "a"})
	},
	"failure": func(ctx context.Context, c *Client) error {
		return c.Failure(ctx, "1", FailureRequest{WorkerID: "a", Retries: 1})
	},
	"bpmnError": func(ctx context.Context, c *Client) error {
		return c.BPMNError(ctx, "1", BPMNErrorRequest{WorkerID: "a", ErrorCode: "X"})
	},
	"extendLock": func(ctx context.Context, c *Client) error { return c.ExtendLock(ctx, "1", "a", time.Minute) },
	"lock":       func(ctx context.Context, c *Client) error { return c.Lock(ctx, "1", "a", time.Minute) },
	"unlock":     func(ctx context.Context, c *Client) error { return c.Unlock(ctx, "1") },
	"get": func(ctx context.Context, c *Client) error {
		_, err := c.ExternalTask(ctx, "1")
		return err
	},
}

// A 404 on a task endpoint that is not the engine's own answer (an HTML page, no body,
// JSON of another shape or message) does not say the task is gone: the request reached
// no engine that could act on it, so it is safe, and right, to send it again. Only the
// engine's JSON "External task with id ... does not exist" is ErrTaskGone.
func TestForeign404IsNotTaskGone(t *testing.T) {
	for _, b := range foreign404s {
		for name, call := range taskCalls {
			t.Run(b.name+"/"+name, func(t *testing.T) {
				f := newFakeEngine(t, answer(http.StatusNotFound, b.ctype, b.body))
				err := call(t.Context(), f.client(t, Config{}))
				require.Error(t, err)
				assert.NotErrorIs(t, err, ErrTaskGone)
				assert.NotErrorIs(t, err, ErrLockLost)
				assert.NotErrorIs(t, err, ErrUnknownOutcome, "a 404 proves nothing was done")
				assert.ErrorIs(t, err, ErrNotSent, "to be sent again")
				assert.True(t, SafeToRetry(err))
			})
		}
	}
	for name, call := range taskCalls {
		t.Run("the engine's own answer/"+name, func(t *testing.T) {
			f := newFakeEngine(t, jsonAnswer(http.StatusNotFound, `{"type":"RestException","message":"External task with id 1 does not exist","code":0}`))
			err := call(t.Context(), f.client(t, Config{}))
			assert.ErrorIs(t, err, ErrTaskGone)
			assert.NotErrorIs(t, err, ErrNotSent)
		})
	}
}

// TestTaskGoneAnswer pins the one function that decides "task gone", message by message:
// the engine's answers (as the conformance suite pins them against the real engine) and
// the answers that look like them but are not.
func TestTaskGoneAnswer(t *testing.T) {
	cases := []struct {
		name   string
		status int
		typ    string
		msg    string
		want   bool
	}{
		{"complete, failure, bpmnError, extendLock, lock, unlock (RestException)", 404, "RestException",
			"External task with id 5e730467-ee7b-11f1-b45a-02fc00000001 does not exist", true},
		{"the same as InvalidRequestException", 404, "InvalidRequestException", "External task with id 1 does not exist", true},
		{"the same as NotFoundException", 404, "NotFoundException", "External task with id 1 does not exist", true},
		{"the engine's NotFoundException passed on", 404, "NotFoundException", "Cannot find external task with id 1: externalTask is null", true},
		{"the engine's NotFoundException as RestException", 404, "RestException", "Cannot find external task with id 1", true},
		{"errorDetails of an unknown task (a 500)", 500, "NullValueException", "No external task found with id 1: externalTask is null", true},

		{"a path the engine does not serve", 404, "NotFoundException", "HTTP 404 Not Found", false},
		{"no message", 404, "RestException", "", false},
		{"no task id in the message", 404, "RestException", "External task with id  does not exist", false},
		{"another resource", 404, "InvalidRequestException", "Process instance with id 1 does not exist", false},
		{"the gone message under an unknown type", 404, "GatewayError", "External task with id 1 does not exist", false},
		{"the gone message without a type", 404, "", "External task with id 1 does not exist", false},
		{"the gone message with another status", 400, "RestException", "External task with id 1 does not exist", false},
		{"the gone message as a 500", 500, "RestException", "External task with id 1 does not exist", false},
		{"errorDetails' message as a 404", 404, "NullValueException", "No external task found with id 1: externalTask is null", false},
		{"another null value", 500, "NullValueException", "workerId is null", false},
		{"a lock message", 400, "RestException", "External Task 1 cannot be completed by worker 'a'. It is locked by worker 'b'.", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, taskGoneAnswer(tc.status, tc.typ, tc.msg))
		})
	}
}

// TestForeign404 pins which answers on which endpoints are a 404 to send again.
func TestForeign404(t *testing.T) {
	const gone = "External task with id 1 does not exist"
	cases := []struct {
		name         string
		taskEndpoint bool
		status       int
		engine       bool // the body is the engine's JSON error
		typ, msg     string
		want         bool
	}{
		{"the engine's gone answer", true, 404, true, "RestException", gone, false},
		{"HTML, empty or not JSON", true, 404, false, "", "", true},
		{"JSON of another shape", true, 404, false, "", "", true},
		{"the engine's JSON, another message", true, 404, true, "NotFoundException", "HTTP 404 Not Found", true},
		{"not a task endpoint", false, 404, false, "", "", false},
		{"not a 404", true, 502, false, "", "", false},
		{"the engine's 400", true, 400, true, "RestException", "lockTime is not greater than 0", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, foreign404(tc.taskEndpoint, tc.status, tc.engine, tc.typ, tc.msg))
		})
	}
}
