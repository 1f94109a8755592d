package camunda7

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Span names are the operation, never an id: an external task's action by its name, any
// other call by its method and its path with every segment that is not one of the REST
// API's words as {id}.
func TestSpanName(t *testing.T) {
	for _, tc := range []struct{ method, path, want string }{
		{"POST", "/external-task/fetchAndLock", "camunda7 fetchAndLock"},
		{"POST", "/external-task/8f0e-11/complete", "camunda7 complete"},
		{"POST", "/external-task/8f0e-11/failure", "camunda7 failure"},
		{"POST", "/external-task/8f0e-11/bpmnError", "camunda7 bpmnError"},
		{"POST", "/external-task/8f0e-11/extendLock", "camunda7 extendLock"},
		{"POST", "/external-task/8f0e-11/unlock", "camunda7 unlock"},
		{"PUT", "/external-task/8f0e-11/retries", "camunda7 retries"},
		{"GET", "/external-task/8f0e-11/errorDetails", "camunda7 errorDetails"},
		{"GET", "/external-task/8f0e-11", "camunda7 GET /external-task/{id}"},
		{"GET", "/external-task", "camunda7 GET /external-task"},
		{"GET", "/history/external-task-log", "camunda7 GET /history/external-task-log"},
		{"GET", "/version", "camunda7 GET /version"},
		{"POST", "/process-definition/key/invoice%3Av2/start", "camunda7 POST /process-definition/key/{id}/start"},
		{"GET", "/process-instance/77/variables/customerEmail/data", "camunda7 GET /process-instance/{id}/variables/{id}/data"},
		{"GET", "/execution/77/localVariables/ssn/data", "camunda7 GET /execution/{id}/localVariables/{id}/data"},
		{"DELETE", "/deployment/abc", "camunda7 DELETE /deployment/{id}"},
		{"POST", "/message", "camunda7 POST /message"},
		{"GET", "/", "camunda7 GET /"},
	} {
		assert.Equal(t, tc.want, spanName(tc.method, tc.path), "%s %s", tc.method, tc.path)
	}
}

// recordSpans installs an SDK TracerProvider recording in memory as the global one for
// the test (testenv.RecordSpans, which this package's internal tests cannot import).
func recordSpans(t *testing.T) *tracetest.InMemoryExporter {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev); _ = tp.Shutdown(context.Background()) })
	return exp
}

// Every request is one client span, child of the caller's, named by its operation, with
// the method, the engine's host, the answer's status and the classified outcome; a
// failure is an Error described by its kind (lock-lost, unknown-outcome, not-sent), never
// by the engine's message. No id, worker name or variable value shows on a span.
func TestEngineCallSpans(t *testing.T) {
	exp := recordSpans(t) // global: not parallel
	const taskID, secret = "task-id-secret-1", "VALUE-SECRET-0815"
	f := newFakeEngine(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/complete"):
			w.WriteHeader(http.StatusNoContent)
		case strings.HasSuffix(r.URL.Path, "/extendLock"):
			jsonAnswer(http.StatusBadRequest, `{"type":"RestException","message":"Cannot extend a lock of external task `+taskID+
				`: It is locked by worker 'other-worker-secret'.","code":0}`)(w, r, nil)
		default:
			answer(http.StatusBadGateway, "text/html", "<html>bad gateway "+secret+"</html>")(w, r, nil)
		}
	})
	c := f.client(t, Config{})
	ctx, parent := otel.Tracer("test").Start(context.Background(), "parent")
	require.NoError(t, c.Complete(ctx, taskID, CompleteRequest{WorkerID: "w1", Variables: Variables{"v": StringVar(secret)}}))
	require.ErrorIs(t, c.ExtendLock(ctx, taskID, "w1", time.Minute), ErrLockLost)
	_, err := c.ExternalTask(ctx, taskID)
	require.ErrorIs(t, err, ErrUnknownOutcome)

	// Nothing listens: the request never leaves.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://" + ln.Addr().String() + "/engine-rest"
	require.NoError(t, ln.Close())
	down := newTestClient(t, Config{BaseURL: closed})
	_, err = down.FetchAndLock(ctx, FetchAndLockRequest{WorkerID: "w1", MaxTasks: 1, Topics: []FetchTopic{{TopicName: "t", LockDuration: time.Minute}}})
	require.ErrorIs(t, err, ErrNotSent)
	parent.End()

	got := map[string]tracetest.SpanStub{}
	for _, sp := range exp.GetSpans() {
		if sp.Parent.SpanID() == parent.SpanContext().SpanID() {
			got[sp.Name] = sp
		}
	}
	type want struct {
		status  int64
		outcome string
		kind    string
	}
	for name, w := range map[string]want{
		"camunda7 complete":                {204, "ok", ""},
		"camunda7 extendLock":              {400, "engine-error", "lock-lost"},
		"camunda7 GET /external-task/{id}": {502, "unknown", "unknown-outcome"},
		"camunda7 fetchAndLock":            {0, "not-sent", "not-sent"},
	} {
		sp, ok := got[name]
		if !assert.True(t, ok, "no span %q under the caller's; got %v", name, got) {
			continue
		}
		attrs := map[string]string{}
		for _, a := range sp.Attributes {
			attrs[string(a.Key)] = a.Value.Emit()
			assert.NotContains(t, a.Value.Emit(), taskID)
			assert.NotContains(t, a.Value.Emit(), secret)
			assert.NotContains(t, a.Value.Emit(), "other-worker-secret")
		}
		assert.Equal(t, "client", sp.SpanKind.String(), name)
		assert.Equal(t, w.outcome, attrs["camunda7.outcome"], name)
		assert.NotEmpty(t, attrs["http.request.method"], name)
		assert.NotEmpty(t, attrs["server.address"], name)
		if w.status > 0 {
			assert.Equal(t, strconv.FormatInt(w.status, 10), attrs["http.response.status_code"], name)
		} else {
			assert.NotContains(t, attrs, "http.response.status_code", name)
		}
		if w.kind == "" {
			assert.Equal(t, codes.Unset, sp.Status.Code, name)
			continue
		}
		assert.Equal(t, codes.Error, sp.Status.Code, name)
		assert.Equal(t, w.kind, sp.Status.Description, name)
		assert.Equal(t, w.kind, attrs["error.type"], name)
	}
}

// With no TracerProvider installed (traces off), an engine call's span costs a few
// hundred nanoseconds and a few allocations: nothing next to the request.
func BenchmarkEngineCallSpanOff(b *testing.B) {
	c := &Client{host: "127.0.0.1:8080"}
	k := call{method: http.MethodPost, path: "/external-task/8f0e-11/complete"}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, span := c.startSpan(ctx, k)
		endSpan(span, 204, 0, nil)
	}
}
