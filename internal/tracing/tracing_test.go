package tracing

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
)

func lookup(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

// Traces are off unless the standard variables ask for them; none forces them off; the
// endpoint shown has no credentials; what the exporter cannot do is refused.
func TestRead(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want Settings
		err  string
	}{
		{"nothing set", nil, Settings{Why: "neither OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT nor OTEL_TRACES_EXPORTER=otlp is set",
			ServiceName: "extworker"}, ""},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
			Settings{On: true, Why: "OTEL_EXPORTER_OTLP_ENDPOINT", Endpoint: "http://collector:4318/v1/traces", ServiceName: "extworker"}, ""},
		{"endpoint with a path and credentials", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://user:s3cret@otlp.example.com/otlp/?token=s3cret",
			"OTEL_SERVICE_NAME": "billing-worker"},
			Settings{On: true, Why: "OTEL_EXPORTER_OTLP_ENDPOINT", Endpoint: "https://otlp.example.com/otlp/v1/traces", ServiceName: "billing-worker"}, ""},
		{"traces endpoint as it is", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/custom/traces",
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://ignored:4318"},
			Settings{On: true, Why: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", Endpoint: "http://127.0.0.1:4318/custom/traces", ServiceName: "extworker"}, ""},
		{"exporter otlp, default endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "otlp",
			"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,service.name=shipping%20worker"},
			Settings{On: true, Why: "OTEL_TRACES_EXPORTER=otlp", Endpoint: defaultEndpoint, ServiceName: "shipping worker"}, ""},
		{"none wins", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
			Settings{Why: "OTEL_TRACES_EXPORTER=none", ServiceName: "extworker"}, ""},
		{"SDK disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
			Settings{Why: "OTEL_SDK_DISABLED=true", ServiceName: "extworker"}, ""},
		{"another exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, Settings{}, `OTEL_TRACES_EXPORTER "zipkin": extworker exports traces over OTLP only`},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, Settings{},
			`OTEL_EXPORTER_OTLP_PROTOCOL "grpc": extworker exports traces over OTLP/HTTP only`},
		{"traces protocol wins", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
			Settings{On: true, Why: "OTEL_EXPORTER_OTLP_ENDPOINT", Endpoint: "http://collector:4318/v1/traces", ServiceName: "extworker"}, ""},
		{"no scheme", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, Settings{},
			"OTEL_EXPORTER_OTLP_ENDPOINT: want an http:// or https:// URL with a host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Read(lookup(tc.env))
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				assert.NotContains(t, err.Error(), "s3cret")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			assert.NotContains(t, got.String(), "s3cret")
		})
	}
}

// Start installs a provider that exports over OTLP/HTTP to the endpoint the variables
// name, with service.name from OTEL_SERVICE_NAME, and the W3C propagator; shutdown
// flushes what the batch processor still holds.
func TestStartExportsAndShutdownFlushes(t *testing.T) {
	var mu sync.Mutex
	var bodies [][]byte
	var ctypes []string
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		if r.URL.Path == "/v1/traces" {
			bodies = append(bodies, b)
			ctypes = append(ctypes, r.Header.Get("Content-Type"))
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_SERVICE_NAME", "tracing-test-service")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "60000") // only the shutdown's flush exports

	s, err := Read(os.LookupEnv)
	require.NoError(t, err)
	require.True(t, s.On)
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() { otel.SetTracerProvider(prevTP); otel.SetTextMapPropagator(prevProp) })
	shutdown, err := Start(context.Background(), s, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	_, span := otel.Tracer("test").Start(context.Background(), "span-flushed-at-shutdown")
	span.End()
	assert.Equal(t, []string{"traceparent", "tracestate"}, otel.GetTextMapPropagator().Fields(), "W3C trace context only (no baggage)")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, shutdown(ctx))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, bodies, 1, "one export, at shutdown")
	assert.Equal(t, "application/x-protobuf", ctypes[0])
	assert.True(t, bytes.Contains(bodies[0], []byte("span-flushed-at-shutdown")))
	assert.True(t, bytes.Contains(bodies[0], []byte("tracing-test-service")))
}

// Off, Start installs nothing.
func TestStartOff(t *testing.T) {
	before := otel.GetTracerProvider()
	shutdown, err := Start(context.Background(), Settings{}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	assert.Equal(t, before, otel.GetTracerProvider())
	require.NoError(t, shutdown(context.Background()))
}

// Export failures are logged, at most once a minute.
func TestErrorHandlerLogsOnceAMinute(t *testing.T) {
	var buf bytes.Buffer
	h := &errorHandler{logger: slog.New(slog.NewTextHandler(&buf, nil))}
	for range 5 {
		h.Handle(io.ErrUnexpectedEOF)
	}
	assert.Equal(t, 1, bytes.Count(buf.Bytes(), []byte("exporting spans failed")))
	h.mu.Lock()
	h.last = time.Now().Add(-2 * errorEvery)
	h.mu.Unlock()
	h.Handle(io.ErrUnexpectedEOF)
	assert.Equal(t, 2, bytes.Count(buf.Bytes(), []byte("exporting spans failed")))
	assert.Contains(t, buf.String(), "errors_not_logged=4")
}
