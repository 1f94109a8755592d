package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/testenv"
)

// promtoolPath returns promtool's path (services/tools-up.sh installs it): missing, the
// test fails in CI and is skipped elsewhere.

// freeAddr returns a local address nothing listens on, for a server to listen on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// refusedAddr returns a local address that refuses connections for the test's life: a
// socket bound to it and never listening. A port merely closed again is free for
// anything meanwhile, a client's own connection included (a connect to a free port in
// the ephemeral range can be given that port as its source and meet itself): a
// "database down" check in a loaded clean-clone CI waited out its 2 s and said
// "context deadline exceeded", not "refused".
func refusedAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// /readyz is 200 with the engine and a migrated database reachable, and 503 naming the
// failed check when the engine (or the database) is not; /healthz stays 200; pprof is
// served only when switched on.
func TestOpsReadiness(t *testing.T) {
	testenv.Engine(t)
	testenv.DB(t)
	ctx := testenv.Context(t, time.Minute)
	require.NoError(t, daemon.Migrate(ctx, daemon.Config{DatabaseURL: testenv.DBURL(), DatabaseRolePrefix: "extworker"}, io.Discard))
	logger := slog.New(slog.DiscardHandler)

	for _, tc := range []struct {
		name             string
		engineURL, dbURL string
		pprof            bool
		wantStatus       int
		wantChecks       map[string]string // "ok", or a substring of the failure
		wantPprofStatus  int
	}{
		{name: "ready", engineURL: testenv.EngineURL(), dbURL: testenv.DBURL(), wantStatus: 200,
			wantChecks: map[string]string{"engine": "ok", "database": "ok", "migrations": "ok"}, wantPprofStatus: 404},
		{name: "engine down", engineURL: "http://" + refusedAddr(t) + "/engine-rest", dbURL: testenv.DBURL(), pprof: true, wantStatus: 503,
			wantChecks: map[string]string{"engine": "refused", "database": "ok", "migrations": "ok"}, wantPprofStatus: 200},
		{name: "database down", engineURL: testenv.EngineURL(), dbURL: "postgres://extworker:extworker@" + refusedAddr(t) + "/extworker", wantStatus: 503,
			wantChecks: map[string]string{"engine": "ok", "database": "refused", "migrations": "not checked"}, wantPprofStatus: 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := camunda7.New(camunda7.Config{BaseURL: tc.engineURL})
			require.NoError(t, err)
			pool, err := daemon.OpenOpsPool(ctx, tc.dbURL)
			require.NoError(t, err)
			defer pool.Close()
			addr, stop, err := daemon.StartOps(ctx, daemon.OpsConfig{HTTPAddr: "127.0.0.1:0", Pprof: tc.pprof, ReadyTimeout: 2 * time.Second},
				daemon.NewOpsRegistry(), c, pool, nil, logger)
			require.NoError(t, err)
			defer stop()

			status, body := get(t, "http://"+addr+"/healthz")
			assert.Equal(t, 200, status)
			assert.Equal(t, "ok\n", body)

			status, body = get(t, "http://"+addr+"/readyz")
			assert.Equal(t, tc.wantStatus, status, body)
			var res daemon.Readiness
			require.NoError(t, json.Unmarshal([]byte(body), &res), body)
			for check, want := range tc.wantChecks {
				if want == "ok" {
					assert.Equal(t, "ok", res.Checks[check], "check %s", check)
				} else {
					assert.Contains(t, res.Checks[check], want, "check %s", check)
				}
			}
			if tc.wantStatus == 200 {
				assert.Equal(t, "ready", res.Status)
			} else {
				assert.Equal(t, "not ready", res.Status)
			}
			status, _ = get(t, "http://"+addr+"/debug/pprof/")
			assert.Equal(t, tc.wantPprofStatus, status)
			stop()
			stop() // safe twice
		})
	}
}

// An address that is taken is a start-up error naming the variable.
func TestOpsAddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	_, _, err = daemon.StartOps(context.Background(), daemon.OpsConfig{HTTPAddr: ln.Addr().String()}, daemon.NewOpsRegistry(), nil, nil, nil, slog.New(slog.DiscardHandler))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "EXTWORKER_HTTP_ADDR")
}

// `invoice run` serves /metrics: after a short real run (invoices paid through the
// ledger, one declined) the exposition carries the main metrics with the run's counts,
// and the real promtool's linter accepts it.
func TestOpsMetricsOfALiveWorker(t *testing.T) {
	c := testenv.Engine(t)
	testenv.DB(t)
	bin := testenv.Promtool(t)
	ctx := testenv.Context(t, 2*time.Minute)
	addr := freeAddr(t)
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	t.Setenv("EXTWORKER_LEDGER_NAMESPACE", testenv.Unique("ops"))
	t.Setenv("EXTWORKER_HTTP_ADDR", addr)
	t.Setenv("EXTWORKER_LONG_POLL", "1s")
	t.Setenv("EXTWORKER_PROVIDER_URL", "")
	require.NoError(t, extworker.Migrate(ctx, extworker.Options{}, io.Discard))
	pc, err := loadProviderConfig()
	require.NoError(t, err)
	require.NoError(t, deployDemo(ctx, c))
	var ids []string
	for i, amount := range []int64{1200, 3400, 25_000_00} { // the last is declined
		invoice := testenv.Unique(fmt.Sprintf("OPS-%d", i))
		pi, err := c.StartProcess(ctx, demoProcessKey, admin.StartProcessRequest{BusinessKey: invoice,
			Variables: camunda7.Variables{"invoiceId": camunda7.StringVar(invoice), "amountCents": camunda7.LongVar(amount)}})
		require.NoError(t, err)
		ids = append(ids, pi.ID)
	}

	logs := &testenv.Buffer{}
	app, err := extworker.New(ctx, extworker.Options{Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	require.NoError(t, err)
	defer app.Close()
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runWorker(wctx, app, pc, eventsConfig{Broker: eventsAMQP}) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()
	testenv.Eventually(t, time.Minute, "the invoices to finish", func() (bool, error) {
		for _, id := range ids {
			h, err := c.HistoricProcessInstance(ctx, id)
			if err != nil || h.State != "COMPLETED" {
				return false, err
			}
		}
		return true, nil
	})
	status, body := get(t, "http://"+addr+"/readyz")
	assert.Equal(t, 200, status, body)

	var exposition string
	testenv.Eventually(t, 10*time.Second, "the last reports to be counted", func() (bool, error) {
		_, exposition = get(t, "http://"+addr+"/metrics")
		return strings.Contains(exposition, `extworker_tasks_bpmn_errors_total{topic="`+demoTopicCollect+`"}`), nil
	})
	for _, want := range []string{
		`extworker_tasks_fetched_total{topic="` + demoTopicCollect + `"}`,
		`extworker_tasks_completed_total{topic="` + demoTopicReceipt + `"}`,
		`extworker_tasks_handled_total{outcome="completed",topic="` + demoTopicCollect + `"}`,
		`extworker_handler_duration_seconds_bucket{outcome="completed",topic="` + demoTopicCollect + `",le="+Inf"}`,
		`extworker_fetch_duration_seconds_bucket{le="+Inf"}`,
		`extworker_fetch_polls_total`,
		`extworker_slots_free`,
		`extworker_slots_max 16`,
		`extworker_tasks_in_flight{topic="` + demoTopicCollect + `"}`,
		`extworker_ledger_transitions_total{scope="payment.collect",state="confirmed"}`,
		`extworker_ledger_transitions_total{scope="payment.collect",state="rejected"}`,
		`extworker_ledger_backlog_up 1`,
		`extworker_engine_errors_total{operation="fetch-and-lock"} 0`,
		`extworker_database_errors_total{operation="ledger-write"} 0`,
		`go_goroutines`,
		`process_cpu_seconds_total`,
	} {
		assert.Contains(t, exposition, want)
	}
	assert.NotContains(t, exposition, ids[0], "no ids as label values")

	lint := exec.Command(bin, "check", "metrics")
	lint.Stdin = strings.NewReader(exposition)
	out, err := lint.CombinedOutput()
	assert.NoError(t, err, "promtool check metrics:\n%s", out)
	if t.Failed() {
		t.Logf("exposition:\n%s\nworker logs:\n%s", exposition, logs.String())
	}
}
