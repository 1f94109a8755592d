package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/testenv"
)

// An invalid configuration fails at start with every problem listed at once.
func TestConfigListsEveryProblem(t *testing.T) {
	t.Setenv("EXTWORKER_LOG_FORMAT", "yaml")
	t.Setenv("EXTWORKER_LOG_LEVEL", "loud")
	t.Setenv("EXTWORKER_MAX_CONCURRENCY", "0")
	t.Setenv("EXTWORKER_ENGINE_CERT_FILE", "/tmp/cert.pem")
	t.Setenv("EXTWORKER_LONG_POLL", "31m")
	err := run([]string{"run"}, &bytes.Buffer{}, &bytes.Buffer{})
	require.Error(t, err)
	for _, want := range []string{"EXTWORKER_LOG_FORMAT", "EXTWORKER_LOG_LEVEL", "EXTWORKER_MAX_CONCURRENCY", "EXTWORKER_ENGINE_CERT_FILE", "EXTWORKER_LONG_POLL"} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestConfigRejectsMalformedValues(t *testing.T) {
	t.Setenv("EXTWORKER_MAX_CONCURRENCY", "many")
	err := run([]string{"run"}, &bytes.Buffer{}, &bytes.Buffer{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "MAX_CONCURRENCY")
}

func TestUsageAndUnknownCommand(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(nil, &out, &bytes.Buffer{}))
	assert.Contains(t, out.String(), "usage: extworker")
	err := run([]string{"frobnicate"}, &bytes.Buffer{}, &bytes.Buffer{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `unknown command "frobnicate"`)
}

func TestRedactedURL(t *testing.T) {
	assert.Equal(t, "https://***@bpm.example.com/engine-rest", daemon.RedactURL("https://user:s3cret@bpm.example.com/engine-rest"))
	assert.Equal(t, "http://127.0.0.1:8080/engine-rest", daemon.RedactURL("http://127.0.0.1:8080/engine-rest"))
}

// The demo runs end to end against the real engine and PostgreSQL: invoices paid through
// the effect ledger (a double submission charged once, lost answers reconciled), declined
// on the BPMN error path, and incidents for the ones without an amount.
func TestDemo(t *testing.T) {
	testenv.Engine(t)
	testenv.DB(t)
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	t.Setenv("EXTWORKER_LOG_LEVEL", "warn")
	var out, logs bytes.Buffer
	require.NoError(t, run([]string{"demo", "-instances", "20"}, &out, &logs), "output:\n%s\nlogs:\n%s", out.String(), logs.String())
	assert.Contains(t, out.String(), "demo OK")
	assert.Regexp(t, `paid\s+17\s+17`, out.String(), "16 invoices, one of them submitted twice")
	assert.Contains(t, out.String(), "0 double charges")
	// Exact counts of replays depend on whoever else serves the demo topics meanwhile.
	assert.Regexp(t, `ledger: [1-9]\d* duplicate deliveries completed from the ledger`, out.String())
	assert.Contains(t, out.String(), "ledger: 16 paid invoices settled, one intent each")
	assert.Regexp(t, `declined\s+2\s+2`, out.String())
	assert.Regexp(t, `incident\s+2\s+2`, out.String())
	assert.False(t, strings.Contains(logs.String(), `"level":"ERROR"`), logs.String())
}

func TestVersionCommand(t *testing.T) {
	testenv.Engine(t)
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	var out bytes.Buffer
	require.NoError(t, run([]string{"version"}, &out, &bytes.Buffer{}))
	assert.Regexp(t, `^\d+\.\d+\.\d+`, out.String())

	t.Setenv("EXTWORKER_ENGINE_URL", "http://user:hunter2@127.0.0.1:1/engine-rest")
	err := run([]string{"version"}, &bytes.Buffer{}, &bytes.Buffer{})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "hunter2", "credentials never appear in errors")
}

// `run` refuses an unmigrated ledger database and says what to run; `migrate` fixes it.
func TestRunRefusesUnmigratedDatabase(t *testing.T) {
	testenv.Engine(t)
	admin := testenv.DB(t)
	ctx := testenv.Context(t, time.Minute)
	schema := "empty_" + testenv.Unique("s")[2:]
	_, err := admin.Exec(ctx, `CREATE SCHEMA `+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`) })
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL()+"?search_path="+schema)

	err = run([]string{"run"}, &bytes.Buffer{}, &bytes.Buffer{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "run `extworker migrate`")
	assert.NotContains(t, err.Error(), "extworker:extworker@", "no credentials in the message")

	var out bytes.Buffer
	require.NoError(t, run([]string{"migrate"}, &out, &bytes.Buffer{}))
	assert.Contains(t, out.String(), "applied migrations [1 2 3]")
	out.Reset()
	require.NoError(t, run([]string{"migrate"}, &out, &bytes.Buffer{}))
	assert.Contains(t, out.String(), "up to date")
}

// An engine that does not answer at start is not a configuration error: the worker starts
// and its fetch loop backs off until the engine is back, instead of exiting into a
// supervisor's restart loop. Rejected credentials still stop it (auth_test.go).
func TestCheckEngineUnreachableStartsAnyway(t *testing.T) {
	c := daemon.Config{EngineURL: "http://127.0.0.1:1/engine-rest", EngineTimeout: 2 * time.Second}
	logs := &testenv.Buffer{}
	err := daemon.CheckEngine(context.Background(), c, daemon.NewLogger(daemon.Config{LogFormat: "json", LogLevel: "info"}, logs))
	require.NoError(t, err)
	assert.Contains(t, logs.String(), "engine not reachable at start; the worker will keep trying")
}
