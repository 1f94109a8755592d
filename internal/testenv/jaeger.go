package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// JaegerServer is a Jaeger all-in-one of the test's own (Jaeger): traces sent over
// OTLP/HTTP to OTLPEndpoint are kept in memory and read back through its query API.
type JaegerServer struct {
	// OTLPEndpoint is the OTLP/HTTP receiver's base URL, for OTEL_EXPORTER_OTLP_ENDPOINT.
	OTLPEndpoint string
	// QueryURL is the query service's base URL (its UI, and /api/traces).
	QueryURL string
}

// jaegerConfig is the collector's configuration (Jaeger v2, an OpenTelemetry collector:
// `bin/jaeger --config FILE`): the OTLP/HTTP receiver, in-memory storage and the query
// service, each on loopback and a port of its own; nothing else (no other receiver, no
// sampling or health endpoints, no metrics or traces of its own: the query service
// would send its traces to localhost:4317), so that no fixed port is taken.
const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: info
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
  jaeger_query:
    storage:
      traces: memstore
    enable_tracing: false
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
processors:
  batch:
    timeout: 200ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// jaegerStartTimeout bounds a start, from the process to a query API that answers.
const jaegerStartTimeout = time.Minute

// Jaeger starts bin/jaeger (which `make up` builds, services/tools-up.sh) for the
// test, on free loopback ports with in-memory storage, and returns once its query API
// answers and its OTLP receiver accepts connections; it logs how long that took. It is
// stopped (SIGTERM, then SIGKILL) at cleanup, its log shown if the test failed. Where
// the binary is missing the test fails in CI and is skipped elsewhere.
func Jaeger(t testing.TB) *JaegerServer {
	t.Helper()
	needServices(t, "a Jaeger of the test's own")
	bin := filepath.Join(repoRoot(t), "bin", "jaeger")
	if _, err := os.Stat(bin); err != nil {
		unavailable(t, "bin/jaeger (services/tools-up.sh builds it from tools/jaeger)", err)
	}
	var ports [3]int
	for i := range ports {
		for {
			p, err := freePort()
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 || (p != ports[0] && (i == 1 || p != ports[1])) {
				ports[i] = p
				break
			}
		}
	}
	query, grpc, otlp := ports[0], ports[1], ports[2]
	dir := t.TempDir()
	cfg := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, jaegerConfig, query, grpc, otlp), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &Buffer{}
	began := time.Now()
	cmd := exec.Command(bin, "--config", cfg)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("jaeger's log:\n%s", logs.String())
		}
	})
	j := &JaegerServer{OTLPEndpoint: fmt.Sprintf("http://127.0.0.1:%d", otlp), QueryURL: fmt.Sprintf("http://127.0.0.1:%d", query)}
	deadline := time.Now().Add(jaegerStartTimeout)
	for {
		select {
		case <-exited:
			t.Fatalf("jaeger exited at start; its log:\n%s", logs.String())
		default:
		}
		if j.ready() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("jaeger not ready %v after its start; its log:\n%s", jaegerStartTimeout, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("jaeger started in %v: OTLP/HTTP on %s, query on %s", time.Since(began).Round(time.Millisecond), j.OTLPEndpoint, j.QueryURL)
	return j
}

// ready reports whether the query API answers and the OTLP receiver accepts connections.
func (j *JaegerServer) ready() bool {
	resp, err := http.Get(j.QueryURL + "/api/services")
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(j.OTLPEndpoint, "http://"), time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// JaegerTrace is one trace as the query API returns it.
type JaegerTrace struct {
	TraceID string
	Spans   []SpanNode
}

// jaegerAnswer is the query API's answer to GET /api/traces.
type jaegerAnswer struct {
	Data []struct {
		TraceID string `json:"traceID"`
		Spans   []struct {
			SpanID        string `json:"spanID"`
			OperationName string `json:"operationName"`
			References    []struct {
				RefType string `json:"refType"`
				SpanID  string `json:"spanID"`
			} `json:"references"`
			StartTime int64 `json:"startTime"` // microseconds since the epoch
			Tags      []struct {
				Key   string `json:"key"`
				Value any    `json:"value"`
			} `json:"tags"`
			Logs []struct {
				Fields []struct {
					Key   string `json:"key"`
					Value any    `json:"value"`
				} `json:"fields"`
			} `json:"logs"`
		} `json:"spans"`
	} `json:"data"`
	Errors []struct {
		Msg string `json:"msg"`
	} `json:"errors"`
}

// Traces returns the traces of service whose spans match tags (span attributes, all of
// them; nil matches any), at most limit, from the last hour. A span's tags are its
// attributes (Jaeger's own, such as span.kind and otel.status_code, left out); an Error
// status shows as SpanNode.Status.
func (j *JaegerServer) Traces(ctx context.Context, service string, tags map[string]string, limit int) ([]JaegerTrace, error) {
	q := url.Values{"service": {service}, "limit": {strconv.Itoa(limit)}, "lookback": {"1h"}}
	if len(tags) > 0 {
		b, err := json.Marshal(tags)
		if err != nil {
			return nil, err
		}
		q.Set("tags", string(b))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.QueryURL+"/api/traces?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil // no trace of the service yet
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("jaeger /api/traces: %d: %s", resp.StatusCode, bytes.TrimSpace(body))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var a jaegerAnswer
	if err := dec.Decode(&a); err != nil {
		return nil, fmt.Errorf("jaeger /api/traces: %w", err)
	}
	if len(a.Errors) > 0 {
		return nil, errors.New("jaeger /api/traces: " + a.Errors[0].Msg)
	}
	var out []JaegerTrace
	for _, tr := range a.Data {
		jt := JaegerTrace{TraceID: tr.TraceID}
		for _, sp := range tr.Spans {
			n := SpanNode{ID: sp.SpanID, Name: sp.OperationName, Start: time.UnixMicro(sp.StartTime), Attrs: map[string]string{}}
			for _, r := range sp.References {
				if r.RefType == "CHILD_OF" {
					n.Parent = r.SpanID
				}
			}
			for _, tag := range sp.Tags {
				v := fmt.Sprint(tag.Value)
				switch {
				case tag.Key == "otel.status_code":
					if v == "ERROR" {
						n.Status = "Error"
					}
				case tag.Key == "otel.status_description" || tag.Key == "error":
					if tag.Key == "otel.status_description" {
						n.StatusDescription = v
					}
				case tag.Key == "span.kind" || strings.HasPrefix(tag.Key, "otel.scope.") || tag.Key == "internal.span.format":
				default:
					n.Attrs[tag.Key] = v
				}
			}
			for _, l := range sp.Logs {
				var parts []string
				for _, f := range l.Fields {
					parts = append(parts, f.Key+"="+fmt.Sprint(f.Value))
				}
				n.Events = append(n.Events, strings.Join(parts, " "))
			}
			jt.Spans = append(jt.Spans, n)
		}
		out = append(out, jt)
	}
	return out, nil
}
