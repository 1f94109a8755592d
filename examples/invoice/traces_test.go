package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/testenv"
)

// The demo's worker process, with OTEL_EXPORTER_OTLP_ENDPOINT pointing at a Jaeger of
// the test's own, traces one invoice end to end: a trace for collect-payment (the task,
// its handler with the ledger's steps and the provider call, its report with the engine's
// complete) and another for send-receipt, found in Jaeger's query API by the process
// instance; the invoice's id (its business key, its intent key's part, a variable's
// value) shows on no span.
//
// The demo topics are shared with other tests: the worker has an id and a service.name
// of its own, and an invoice another worker happened to serve is started again.
func TestTracesOfOneInvoiceInJaeger(t *testing.T) {
	c := testenv.Engine(t)
	testenv.DB(t)
	jaeger := testenv.Jaeger(t)
	ctx := testenv.Context(t, 4*time.Minute)
	bin := buildBinary(t)

	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "EXTWORKER_") && !strings.HasPrefix(kv, "OTEL_") || strings.HasPrefix(kv, "EXTWORKER_TEST_") {
			env = append(env, kv)
		}
	}
	env = append(env, "EXTWORKER_ENGINE_URL="+testenv.EngineURL(), "EXTWORKER_DATABASE_URL="+testenv.DBURL())
	migrate := exec.Command(bin, "migrate")
	migrate.Env = env
	out, err := migrate.CombinedOutput()
	require.NoError(t, err, "invoice migrate: %s", out)
	deploy := exec.Command(bin, "demo", "-deploy-only")
	deploy.Env = env
	out, err = deploy.CombinedOutput()
	require.NoError(t, err, "invoice demo -deploy-only: %s", out)

	worker := testenv.Unique("traces")
	service := testenv.Unique("extworker-traces")
	cmd := exec.Command(bin, "run")
	cmd.Env = append(env, "EXTWORKER_WORKER_ID="+worker, "EXTWORKER_LEDGER_NAMESPACE="+testenv.Unique("traces"),
		"EXTWORKER_LONG_POLL=1s", "EXTWORKER_LOG_FORMAT=json", "EXTWORKER_HTTP_ADDR=off",
		"OTEL_EXPORTER_OTLP_ENDPOINT="+jaeger.OTLPEndpoint, "OTEL_SERVICE_NAME="+service, "OTEL_BSP_SCHEDULE_DELAY=200")
	logs := &testenv.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	// One invoice, served by this worker: its two tasks completed under its worker id.
	var invoice, instance string
	for try := 1; invoice == ""; try++ {
		require.LessOrEqual(t, try, 3, "another worker served each invoice; logs:\n%s", logs.String())
		inv := testenv.Unique("INV-TRACE")
		pi, err := c.StartProcess(ctx, demoProcessKey, admin.StartProcessRequest{BusinessKey: inv,
			Variables: camunda7.Variables{"invoiceId": camunda7.StringVar(inv), "amountCents": camunda7.LongVar(1234)}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.DeleteProcessInstance(context.Background(), pi.ID) })
		testenv.Eventually(t, 90*time.Second, "the invoice to be paid", func() (bool, error) {
			fate, err := demoFate(ctx, c, pi.ID)
			if fate != "" && fate != "paid" {
				return false, fmt.Errorf("the invoice ended %s", fate)
			}
			return fate == "paid", err
		})
		done, err := c.ExternalTaskLog(ctx, url.Values{"processInstanceId": {pi.ID}, "successLog": {"true"}})
		require.NoError(t, err)
		ours := len(done) == 2
		for _, e := range done {
			ours = ours && e.WorkerID == worker
		}
		if ours {
			invoice, instance = inv, pi.ID
		} else {
			t.Logf("invoice %s was served (partly) by another worker: %+v; starting another", inv, done)
		}
	}

	// Its traces, in Jaeger: one per task.
	var collect, receipt testenv.JaegerTrace
	testenv.Eventually(t, time.Minute, "both tasks' traces in Jaeger", func() (bool, error) {
		traces, err := jaeger.Traces(ctx, service, map[string]string{"camunda.process_instance_id": instance}, 20)
		if err != nil {
			return false, err
		}
		collect, receipt = testenv.JaegerTrace{}, testenv.JaegerTrace{}
		for _, tr := range traces {
			for _, root := range testenv.Children(tr.Spans, "") {
				switch root.Name {
				case "task " + demoTopicCollect:
					collect = tr
				case "task " + demoTopicReceipt:
					receipt = tr
				}
			}
		}
		// Complete: the report's engine call is the last span to end.
		return hasSpan(collect, "camunda7 complete") && hasSpan(receipt, "camunda7 complete"), nil
	})
	t.Logf("invoice %s (process instance %s), worker %s, service.name %s", invoice, instance, worker, service)
	t.Logf("trace %s:\n%s", collect.TraceID, testenv.SpanTree(collect.Spans))
	t.Logf("trace %s:\n%s", receipt.TraceID, testenv.SpanTree(receipt.Spans))
	assert.NotEqual(t, collect.TraceID, receipt.TraceID, "a trace per task")

	// collect-payment: task > handler > the ledger's steps and the provider call; report >
	// complete.
	root := testenv.Children(collect.Spans, "")[0]
	for k, v := range map[string]string{"camunda.topic": demoTopicCollect, "camunda.process_definition_key": demoProcessKey,
		"camunda.activity_id": "collectPayment", "camunda.process_instance_id": instance, "extworker.worker_id": worker,
		"extworker.attempt": "1", "extworker.outcome": "completed"} {
		assert.Equal(t, v, root.Attrs[k], k)
	}
	assert.Empty(t, root.Status)
	top := testenv.Names(testenv.Children(collect.Spans, root.ID))
	assert.Subset(t, top, []string{"handler", "report"})
	handler := child(t, collect.Spans, root.ID, "handler")
	assert.Equal(t, []string{"ledger claim", "provider call", "ledger confirm"}, testenv.Names(testenv.Children(collect.Spans, handler.ID)))
	for _, n := range testenv.Children(collect.Spans, handler.ID) {
		assert.Equal(t, demoScope, n.Attrs["idempotency.scope"], n.Name)
	}
	assert.Equal(t, "confirmed", child(t, collect.Spans, handler.ID, "ledger confirm").Attrs["idempotency.state"])
	assert.Equal(t, "answered", child(t, collect.Spans, handler.ID, "provider call").Attrs["idempotency.dispatch"])
	report := child(t, collect.Spans, root.ID, "report")
	assert.Equal(t, []string{"camunda7 complete"}, testenv.Names(testenv.Children(collect.Spans, report.ID)))
	complete := child(t, collect.Spans, report.ID, "camunda7 complete")
	assert.Equal(t, "204", complete.Attrs["http.response.status_code"])
	assert.Equal(t, "ok", complete.Attrs["camunda7.outcome"])

	// send-receipt: a trace of its own.
	rroot := testenv.Children(receipt.Spans, "")[0]
	assert.Equal(t, demoTopicReceipt, rroot.Attrs["camunda.topic"])
	assert.Subset(t, testenv.Names(testenv.Children(receipt.Spans, rroot.ID)), []string{"handler", "report"})
	assert.Equal(t, []string{"camunda7 complete"}, testenv.Names(testenv.Children(receipt.Spans, child(t, receipt.Spans, rroot.ID, "report").ID)))

	// The polls are engine calls too, traces of their own.
	polls, err := jaeger.Traces(ctx, service, map[string]string{"http.request.method": "POST"}, 50)
	require.NoError(t, err)
	assert.True(t, slices.ContainsFunc(polls, func(tr testenv.JaegerTrace) bool { return hasSpan(tr, "camunda7 fetchAndLock") }),
		"the fetches' spans reached Jaeger")

	assert.Empty(t, testenv.SpanLeaks(append(slices.Clone(collect.Spans), receipt.Spans...), invoice),
		"the invoice id (business key, intent key, variable) shows on no span")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		stopped = true
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("exit status %d; logs:\n%s", exit.ExitCode(), logs.String())
		}
		require.NoError(t, err)
	case <-time.After(45 * time.Second):
		t.Fatalf("no exit 45s after SIGTERM; logs:\n%s", logs.String())
	}
	assert.Contains(t, logs.String(), `"msg":"traces on"`)
	assert.NotContains(t, logs.String(), "exporting spans failed")
}

func hasSpan(tr testenv.JaegerTrace, name string) bool {
	return slices.ContainsFunc(tr.Spans, func(n testenv.SpanNode) bool { return n.Name == name })
}

// child returns parent's child span named name, or fails the test.
func child(t *testing.T, spans []testenv.SpanNode, parent, name string) testenv.SpanNode {
	t.Helper()
	for _, n := range testenv.Children(spans, parent) {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no span %q under %s: %v", name, parent, testenv.Names(testenv.Children(spans, parent)))
	return testenv.SpanNode{}
}
