package idempotency_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/idempotency/httpeffect"
	"github.com/extworker/extworker/internal/testenv"
)

// The ledger's steps are spans under the caller's (a task's handler span, in a worker),
// against the real PostgreSQL: a dispatch whose answer is lost (claim, provider call,
// unknown), the next attempt reconciling it (claim, reconcile with its lookup, mark
// dispatched, provider call, confirm), and a replay (claim only). httpeffect sends the
// provider the W3C trace context of the "provider call" (and "provider lookup") span.
// No span carries the intent key, the business key or the request.
func TestLedgerTraces(t *testing.T) {
	spans := testenv.RecordSpans(t) // global: not parallel
	l, _ := newLedger(t, idempotency.Config{})
	ctx := testenv.Context(t, time.Minute)

	// The provider: the first charge fails with a 500 after the request arrived (an
	// unknown outcome), the lookup finds nothing, the second charge succeeds.
	var mu sync.Mutex
	var seen []string // method and traceparent of each request
	posts := 0
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, r.Method+" "+r.Header.Get("traceparent"))
		switch r.Method {
		case http.MethodGet:
			http.Error(w, `{"error":"no such key"}`, http.StatusNotFound)
		default:
			if posts++; posts == 1 {
				http.Error(w, "internal error", http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = fmt.Fprint(w, `{"id":"ch_1"}`)
		}
	}))
	t.Cleanup(provider.Close)

	invoice := testenv.Unique("INV-SECRET")
	businessKey := testenv.Unique("BK-SECRET")
	in := idempotency.Intent{Scope: "payment.collect", Key: "invoice:" + invoice + ":v1",
		Request: map[string]any{"invoice": invoice, "amountCents": 1200},
		Task:    idempotency.TaskRef{Actor: "trace-test", TaskID: "task-1", BusinessKey: businessKey}}
	body, err := json.Marshal(in.Request)
	require.NoError(t, err)
	eff, err := httpeffect.New(httpeffect.Spec{URL: provider.URL + "/charges", Body: body,
		LookupURL: func(q idempotency.Query) string {
			return provider.URL + "/charges?key=" + url.QueryEscape(q.ProviderKey)
		},
		Decode: func(_ int, _ http.Header, b []byte) (idempotency.Result, error) {
			var ch struct{ ID string }
			err := json.Unmarshal(b, &ch)
			return idempotency.Result{ProviderRef: ch.ID}, err
		}})
	require.NoError(t, err)

	// do runs one attempt under a span of its own, as a handler's, and returns that span's
	// children.
	do := func(name string) ([]testenv.SpanNode, []testenv.SpanNode, error) {
		hctx, handler := otel.Tracer("test").Start(ctx, name)
		_, err := l.Do(hctx, in, eff)
		handler.End()
		nodes, ok := spans.Trace(name, nil)
		require.True(t, ok)
		t.Logf("%s:\n%s", name, testenv.SpanTree(nodes))
		return nodes, testenv.Children(nodes, handler.SpanContext().SpanID().String()), err
	}
	byName := func(nodes []testenv.SpanNode, name string) testenv.SpanNode {
		t.Helper()
		for _, n := range nodes {
			if n.Name == name {
				return n
			}
		}
		t.Fatalf("no span %q in %v", name, testenv.Names(nodes))
		return testenv.SpanNode{}
	}
	var all []testenv.SpanNode

	// 1. The answer is lost: unknown.
	nodes, steps, err := do("handler 1")
	all = append(all, nodes...)
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	assert.Equal(t, []string{"ledger claim", "provider call", "ledger unknown"}, testenv.Names(steps))
	claim := byName(steps, "ledger claim")
	assert.Equal(t, map[string]string{"idempotency.scope": "payment.collect", "idempotency.state": "dispatched", "idempotency.attempt": "1"}, claim.Attrs)
	call := byName(steps, "provider call")
	assert.Equal(t, "unknown", call.Attrs["idempotency.dispatch"])
	assert.Equal(t, "Error", call.Status)
	assert.Equal(t, "unknown", call.StatusDescription)
	assert.Equal(t, "unknown", byName(steps, "ledger unknown").Attrs["idempotency.state"])
	firstCall := call

	// 2. The next attempt reconciles (not found) and sends it again, same key.
	nodes, steps, err = do("handler 2")
	all = append(all, nodes...)
	require.NoError(t, err)
	assert.Equal(t, []string{"ledger claim", "ledger reconcile", "ledger mark dispatched", "provider call", "ledger confirm"}, testenv.Names(steps))
	assert.Equal(t, "2", byName(steps, "ledger claim").Attrs["idempotency.attempt"])
	reconcile := byName(steps, "ledger reconcile")
	assert.Equal(t, "absent", reconcile.Attrs["idempotency.reconciliation"])
	assert.Equal(t, "prepared", reconcile.Attrs["idempotency.state"])
	lookups := testenv.Children(nodes, reconcile.ID)
	require.Equal(t, []string{"provider lookup"}, testenv.Names(lookups))
	assert.Equal(t, "reconcile", lookups[0].Attrs["idempotency.lookup"])
	assert.Equal(t, "dispatched", byName(steps, "ledger mark dispatched").Attrs["idempotency.state"])
	call = byName(steps, "provider call")
	assert.Equal(t, "answered", call.Attrs["idempotency.dispatch"])
	assert.Empty(t, call.Status)
	assert.Equal(t, map[string]string{"idempotency.scope": "payment.collect", "idempotency.state": "confirmed", "idempotency.attempt": "2"},
		byName(steps, "ledger confirm").Attrs)

	// 3. A replay: the claim finds it settled; the provider is not called.
	nodes, steps, err = do("handler 3")
	all = append(all, nodes...)
	require.NoError(t, err)
	assert.Equal(t, []string{"ledger claim"}, testenv.Names(steps))
	assert.Equal(t, "settled", steps[0].Attrs["idempotency.result"])

	// The provider got each request with the trace context of its span.
	mu.Lock()
	defer mu.Unlock()
	traceID := func(n testenv.SpanNode) string {
		for _, sp := range spans.Ended() {
			if sp.SpanContext.SpanID().String() == n.ID {
				return sp.SpanContext.TraceID().String()
			}
		}
		return "?"
	}
	assert.Equal(t, []string{
		"POST 00-" + traceID(firstCall) + "-" + firstCall.ID + "-01",
		"GET 00-" + traceID(lookups[0]) + "-" + lookups[0].ID + "-01",
		"POST 00-" + traceID(call) + "-" + call.ID + "-01",
	}, seen)

	assert.Empty(t, testenv.SpanLeaks(all, in.Key, invoice, businessKey), "the intent key, the business key and the request show on no span")
}
