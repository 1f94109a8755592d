package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/metrics"
	"github.com/extworker/extworker/tasks"
)

// Nothing secret leaks: canaries planted in the engine password, a provider token, a
// variable marked sensitive and the database URL never appear in the logs, errorMessage,
// errorDetails, incidents, variables written by the worker, ledger rows or metrics, after
// a run with a success, a permanent failure and an unknown outcome parked for an operator.
func TestCanarySecretsNeverLeak(t *testing.T) {
	const (
		engineCanary   = "sk_test_CANARY_engine_pw_7f3a"
		providerCanary = "sk_test_CANARY_provider_tok_19c2"
		variableCanary = "canary+pii@example.invalid"
		databaseCanary = "sk_test_CANARY_db_pw_44d0"
	)
	canaries := []string{engineCanary, providerCanary, variableCanary, databaseCanary}
	ctx := testenv.Context(t, 3*time.Minute)
	testenv.DB(t)
	m := testenv.Deploy(t, testenv.Engine(t), testenv.ModelOptions{NoMessageWait: true})

	logs := &testenv.Buffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	// The engine on 8080 has no authentication and ignores the credentials we send.
	cc, err := camunda7.New(camunda7.Config{BaseURL: testenv.EngineURL(), Username: "worker", Password: engineCanary, Logger: logger})
	require.NoError(t, err)
	c := admin.New(cc)
	// sslpassword is unused without a client key; it stands for a secret in the URL.
	pool, err := pgxpool.New(ctx, testenv.DBURL()+"?sslpassword="+databaseCanary)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	promReg := prometheus.NewRegistry()
	mx, err := metrics.New(promReg, metrics.Options{MaxConcurrency: 4})
	require.NoError(t, err)
	ledger, err := idempotency.New(pool, idempotency.Config{Namespace: testenv.Unique("canary"), MaxReconciliations: 1, Logger: logger,
		Hooks: idempotency.Hooks{Observer: mx, ContextLogger: tasks.Logger, Annotate: tasks.AddLogAttrs}})
	require.NoError(t, err)
	promReg.MustRegister(metrics.NewBacklogCollector(ledger.Operations(), 2*time.Second, mx, logger))

	pay, err := fakeprovider.Start(demoDeclineLimit)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pay.Close() })
	u, _ := url.Parse(pay.URL())
	u.User = url.UserPassword("token", providerCanary) // the provider's API token
	payc := &fakeprovider.Client{BaseURL: u.String(), HTTP: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}

	reg := tasks.NewRegistry()
	require.NoError(t, reg.Register(m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		card, err := tk.Variables().String("cardToken") // sensitive: goes to the provider only
		if err != nil {
			return nil, failure.Permanent(err)
		}
		amount, err := tk.Variables().Long("amountCents")
		if err != nil {
			return nil, failure.Permanent(err)
		}
		out, err := ledger.Do(ctx, idempotency.Intent{Scope: "payment.collect", Key: "invoice:" + tk.BusinessKey(),
			Request: map[string]any{"card": card, "amount": amount},
			Task:    idempotency.TaskRef{Actor: tk.WorkerID(), TaskID: tk.ID(), ProcessInstanceID: tk.ProcessInstanceID(), BusinessKey: tk.BusinessKey()},
		}, idempotency.Effect{
			Dispatch: func(ctx context.Context, key string) (idempotency.Result, error) {
				ch, err := payc.Charge(ctx, key, tk.BusinessKey(), amount)
				if err != nil {
					return idempotency.Result{}, err
				}
				return idempotency.Result{ProviderRef: ch.ID, Values: map[string]any{"paymentRef": ch.ID}}, nil
			},
			Reconcile: func(ctx context.Context, q idempotency.Query) (idempotency.Reconciliation, error) {
				return idempotency.StillUnknown("provider search unavailable"), nil
			},
		})
		if err != nil {
			return nil, err
		}
		return camunda7.Variables{"paymentRef": camunda7.StringVar(out.ProviderRef)}, nil
	}, tasks.TopicOptions{Variables: []string{"cardToken", "amountCents"}, Retry: failure.RetryPolicy{MaxAttempts: 3, InitialDelay: 50 * time.Millisecond}}))

	var ids []string
	for i, amount := range []int64{1200, -1, 3400} {
		bk := fmt.Sprintf("%s-%d", m.Key, i)
		vars := camunda7.Variables{"cardToken": camunda7.StringVar(variableCanary)}
		if amount > 0 {
			vars["amountCents"] = camunda7.LongVar(amount) // the second has none: a permanent failure
		}
		if i == 2 {
			pay.Script(bk, fakeprovider.LoseAnswer) // charged, answer lost, never reconcilable: operator hold
		}
		pi, err := c.StartProcess(ctx, m.Key, admin.StartProcessRequest{BusinessKey: bk, Variables: vars})
		require.NoError(t, err)
		ids = append(ids, pi.ID)
	}
	w, err := tasks.New(c, reg, tasks.Config{WorkerID: testenv.Unique("canary"), AsyncResponseTimeout: time.Second, Logger: logger, Observer: mx})
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	testenv.Eventually(t, time.Minute, "a success and two incidents", func() (bool, error) {
		h, err := c.HistoricProcessInstance(ctx, ids[0])
		if err != nil || h.State != "COMPLETED" {
			return false, err
		}
		for _, id := range ids[1:] {
			inc, err := c.Incidents(ctx, url.Values{"processInstanceId": {id}})
			if err != nil || len(inc) == 0 {
				return false, err
			}
		}
		return true, nil
	})
	cancel()
	require.NoError(t, <-done)

	// Gather every place a secret could end up.
	places := map[string]string{"logs": logs.String()}
	var incidents, details, written strings.Builder
	for _, id := range ids {
		inc, err := c.Incidents(ctx, url.Values{"processInstanceId": {id}})
		require.NoError(t, err)
		for _, i := range inc {
			fmt.Fprintln(&incidents, i.IncidentMessage)
			d, err := c.ExternalTaskErrorDetails(ctx, i.Configuration)
			require.NoError(t, err)
			fmt.Fprintln(&details, d)
		}
		hv, err := c.HistoricVariableInstances(ctx, url.Values{"processInstanceId": {id}})
		require.NoError(t, err)
		for _, v := range hv {
			if v.Name != "cardToken" { // planted by the test, not written by the worker
				fmt.Fprintf(&written, "%s=%s\n", v.Name, v.Value)
			}
		}
	}
	places["incidents and errorMessage"] = incidents.String()
	places["errorDetails"] = details.String()
	places["variables written by the worker"] = written.String()
	var ledgerRows strings.Builder
	rows, err := pool.Query(ctx, `SELECT row_to_json(i)::text FROM extworker_intents i WHERE namespace = $1
		UNION ALL SELECT row_to_json(e)::text FROM extworker_intent_events e JOIN extworker_intents i ON i.id = e.intent_id WHERE i.namespace = $1`, ledger.Namespace())
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		ledgerRows.WriteString(s + "\n")
	}
	require.NoError(t, rows.Err())
	places["ledger rows"] = ledgerRows.String()
	var exposition bytes.Buffer
	mfs, err := promReg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		_, err := expfmt.MetricFamilyToText(&exposition, mf)
		require.NoError(t, err)
	}
	places["metrics"] = exposition.String()

	// The run did what it should, so the places are not empty by accident.
	assert.Contains(t, places["incidents and errorMessage"], "permanent:")
	assert.Contains(t, places["errorDetails"], "classification: unknown-outcome")
	assert.Contains(t, places["ledger rows"], "operator_hold")
	assert.Contains(t, places["metrics"], "extworker_tasks_completed_total")
	for where, text := range places {
		for _, canary := range canaries {
			assert.NotContains(t, text, canary, "a canary secret leaked into %s", where)
		}
	}
	t.Logf("canary check: %d places, %d bytes of logs, %d ledger rows, %d metric families; no canary found",
		len(places), len(places["logs"]), strings.Count(places["ledger rows"], "\n"), len(mfs))
}
