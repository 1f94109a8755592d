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
// the test's own and EXTWORKER_AMQP_URL at the broker, traces one invoice end to end: a
// trace for collect-payment (the task, its handler with the ledger's steps and the
// provider call, its report with the engine's complete), which goes on from the ledger's
// confirm (where invoice.paid is added to the outbox) to the relay's publish and the
// inbox's handling with the engine's start of the shipping instance; and another for
// send-receipt; found in Jaeger's query API by the process instance. The invoice's id
// (its business key, its intent key's part, a variable's value, the event's message
// and correlation ids) shows on no span.
//
// The demo topics and the invoice.paid queue are shared with other tests: the worker has
// an id, a ledger namespace (the outbox's) and a service.name of its own, and an invoice
// another worker happened to serve, or whose event another consumer of the queue took,
// is started again.
func TestTracesOfOneInvoiceInJaeger(t *testing.T) {
	c := testenv.Engine(t)
	testenv.DB(t)
	testenv.AMQP(t)
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
		"EXTWORKER_AMQP_URL="+testenv.AMQPURL(), "EXTWORKER_AMQP_ALLOW_PLAINTEXT=true",
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
		if t.Failed() {
			t.Logf("the worker's logs:\n%s", logs.String())
		}
	})

	// One invoice, served by this worker: its two tasks completed under its worker id, its
	// invoice.paid handled by this worker's consumer. Its traces, in Jaeger: one per task.
	var invoice, instance string
	var collect, receipt testenv.JaegerTrace
	for try := 1; invoice == ""; try++ {
		require.LessOrEqual(t, try, 3, "another worker served each invoice, or another consumer took its event; logs:\n%s", logs.String())
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
		if !ours {
			t.Logf("invoice %s was served (partly) by another worker: %+v; starting another", inv, done)
			continue
		}
		testenv.Eventually(t, time.Minute, "the invoice's shipping instance", func() (bool, error) {
			n, err := c.HistoricProcessInstanceCount(ctx, url.Values{"processDefinitionKey": {demoShippingKey}, "processInstanceBusinessKey": {inv}})
			return n == 1, err
		})
		testenv.Eventually(t, time.Minute, "both tasks' traces in Jaeger", func() (bool, error) {
			collect, receipt, err = invoiceTraces(ctx, jaeger, service, pi.ID)
			// Complete: the report's engine call is the last span of a task to end.
			return hasSpan(collect, "camunda7 complete") && hasSpan(receipt, "camunda7 complete"), err
		})
		// The shipping instance is there: the handling's span ends right after the
		// start, and reaches Jaeger with the next batch; unless another consumer of the
		// shared queue took the event.
		// Both the start and the handling around it: the handling ends after the start, and
		// CI once read the trace between the two batches.
		handled := func() bool {
			return hasSpan(collect, "camunda7 POST /process-definition/key/{id}/start") && hasSpan(collect, "inbox handle")
		}
		deadline := time.Now().Add(20 * time.Second)
		for !handled() && time.Now().Before(deadline) {
			time.Sleep(250 * time.Millisecond)
			if collect, receipt, err = invoiceTraces(ctx, jaeger, service, pi.ID); err != nil {
				t.Logf("jaeger: %v", err)
			}
		}
		if !handled() {
			t.Logf("invoice %s: no inbox handling with the shipping start in its trace (another consumer of %s took the event?):\n%s; starting another",
				inv, demoPaidQueue, testenv.SpanTree(collect.Spans))
			continue
		}
		invoice, instance = inv, pi.ID
	}
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
	confirm := child(t, collect.Spans, handler.ID, "ledger confirm")
	assert.Equal(t, "confirmed", confirm.Attrs["idempotency.state"])
	assert.Equal(t, "answered", child(t, collect.Spans, handler.ID, "provider call").Attrs["idempotency.dispatch"])
	report := child(t, collect.Spans, root.ID, "report")
	assert.Equal(t, []string{"camunda7 complete"}, testenv.Names(testenv.Children(collect.Spans, report.ID)))
	complete := child(t, collect.Spans, report.ID, "camunda7 complete")
	assert.Equal(t, "204", complete.Attrs["http.response.status_code"])
	assert.Equal(t, "ok", complete.Attrs["camunda7.outcome"])

	// invoice.paid, added in the confirm's transaction: the relay's publish under the
	// confirm, the inbox's handling under the publish, the shipping instance's start
	// under the handling. A publish or a handling that failed (the broker or the database
	// briefly away) is a sibling of its own before the one that got through.
	publish := outcomeChild(t, collect.Spans, confirm.ID, "outbox publish", "published")
	for k, v := range map[string]string{"messaging.system": "rabbitmq", "messaging.operation.type": "send",
		"messaging.destination.name": demoExchange, "extworker.event_type": demoPaidType} {
		assert.Equal(t, v, publish.Attrs[k], k)
	}
	assert.Empty(t, publish.Status)
	handle := outcomeChild(t, collect.Spans, publish.ID, "inbox handle", "started")
	for k, v := range map[string]string{"messaging.system": "rabbitmq", "messaging.operation.type": "process",
		"messaging.destination.name": demoPaidQueue, "extworker.inbox.source": demoPaidEventSource,
		"extworker.event_type": demoPaidType, "extworker.inbox.state": "processed"} {
		assert.Equal(t, v, handle.Attrs[k], k)
	}
	assert.Empty(t, handle.Status)
	// The business key is looked for (running, then ended instances) before the start.
	assert.Equal(t, []string{"camunda7 GET /process-instance", "camunda7 GET /history/process-instance", "camunda7 POST /process-definition/key/{id}/start"},
		testenv.Names(testenv.Children(collect.Spans, handle.ID)))
	start := child(t, collect.Spans, handle.ID, "camunda7 POST /process-definition/key/{id}/start")
	assert.Equal(t, "200", start.Attrs["http.response.status_code"])
	assert.Equal(t, "ok", start.Attrs["camunda7.outcome"])

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

// invoiceTraces returns, from Jaeger, the traces of the demo invoice's process instance
// rooted at its collect-payment and send-receipt tasks.
func invoiceTraces(ctx context.Context, jaeger *testenv.JaegerServer, service, instance string) (collect, receipt testenv.JaegerTrace, err error) {
	traces, err := jaeger.Traces(ctx, service, map[string]string{"camunda.process_instance_id": instance}, 20)
	if err != nil {
		return collect, receipt, err
	}
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
	return collect, receipt, nil
}

func hasSpan(tr testenv.JaegerTrace, name string) bool {
	return slices.ContainsFunc(tr.Spans, func(n testenv.SpanNode) bool { return n.Name == name })
}

// outcomeChild returns parent's child span named name whose extworker.outcome is
// outcome, or fails the test; every child of parent must be named name.
func outcomeChild(t *testing.T, spans []testenv.SpanNode, parent, name, outcome string) testenv.SpanNode {
	t.Helper()
	var found []testenv.SpanNode
	for _, n := range testenv.Children(spans, parent) {
		assert.Equal(t, name, n.Name, "a child of %s", parent)
		if n.Attrs["extworker.outcome"] == outcome {
			found = append(found, n)
		}
	}
	require.Len(t, found, 1, "one %q span with outcome %s under %s", name, outcome, parent)
	return found[0]
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
