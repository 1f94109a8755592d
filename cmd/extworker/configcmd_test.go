package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/testenv"
)

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// `extworker config` prints every variable, defaults applied, with its source; secrets
// are masked, including passwords inside URLs.
func TestConfigCommand(t *testing.T) {
	t.Setenv("EXTWORKER_ENGINE_URL", "https://bpm.example.com/engine-rest")
	t.Setenv("EXTWORKER_ENGINE_USER", "worker")
	t.Setenv("EXTWORKER_ENGINE_PASSWORD_FILE", testenv.WriteFile(t, "pw", "pw-s3cret\n"))
	t.Setenv("EXTWORKER_DATABASE_URL", "postgres://extworker:db-s3cret@db:5432/extworker?sslmode=require&application_name=worker")
	var out bytes.Buffer
	require.NoError(t, run([]string{"config"}, &out, io.Discard))
	text := out.String()
	assert.NotContains(t, text, "s3cret")
	assert.Regexp(t, `EXTWORKER_ENGINE_URL\s+https://bpm.example.com/engine-rest\s+env`, text)
	assert.Regexp(t, `EXTWORKER_ENGINE_PASSWORD\s+\*\*\*\s+file /`, text)
	assert.Regexp(t, `EXTWORKER_DATABASE_URL\s+postgres://extworker:\*\*\*@db:5432/extworker\?sslmode=require&application_name=worker\s+env`, text)
	assert.Regexp(t, `EXTWORKER_ENGINE_TIMEOUT\s+30s\s+default`, text)
	assert.Regexp(t, `EXTWORKER_ENGINE_TOKEN\s+default`, text, "an empty secret shows as empty")

	out.Reset()
	require.NoError(t, run([]string{"config", "--json"}, &out, io.Discard))
	assert.NotContains(t, out.String(), "s3cret")
	var m map[string]string
	require.NoError(t, json.Unmarshal(out.Bytes(), &m))
	assert.Equal(t, "***", m["EXTWORKER_ENGINE_PASSWORD"])
	assert.Equal(t, "16", m["EXTWORKER_MAX_CONCURRENCY"])
	assert.Contains(t, m, "EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET")
}

// With an invalid configuration `config` still prints what it read, then lists every
// problem, secrets masked there too.
func TestConfigCommandInvalid(t *testing.T) {
	t.Setenv("EXTWORKER_ENGINE_TOKEN", "tok-s3cret")
	t.Setenv("EXTWORKER_ENGINE_USER", "worker")
	t.Setenv("EXTWORKER_LOG_FORMAT", "yaml")
	var out bytes.Buffer
	err := run([]string{"config"}, &out, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "EXTWORKER_LOG_FORMAT")
	assert.Contains(t, err.Error(), "engine authentication: choose one of")
	assert.NotContains(t, err.Error()+out.String(), "tok-s3cret")
	assert.Contains(t, out.String(), "EXTWORKER_LOG_FORMAT")
}

// `config` lists the operations endpoint's variables too, shows a value that did not
// parse as given (marked invalid), never a secret's, and the derived and new defaults.
func TestConfigCommandShowsInvalidAndOpsVariables(t *testing.T) {
	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_LOCK_DURATION", "abc")
	t.Setenv("EXTWORKER_HTTP_ADDR", "off")
	t.Setenv("EXTWORKER_SHUTDOWN_GRACE", "40s")
	var out bytes.Buffer
	err := run([]string{"config"}, &out, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `EXTWORKER_LOCK_DURATION "abc": not a duration`)
	text := out.String()
	assert.Regexp(t, `EXTWORKER_LOCK_DURATION\s+abc\s+env \(invalid\)`, text)
	assert.Regexp(t, `EXTWORKER_HTTP_ADDR\s+off\s+env`, text)
	assert.Regexp(t, `EXTWORKER_READY_TIMEOUT\s+2s\s+default`, text)
	assert.Regexp(t, `EXTWORKER_SHUTDOWN_TIMEOUT\s+55s\s+default`, text, "the grace plus 15s")
	assert.Regexp(t, `EXTWORKER_LEDGER_MAX_CONNS\s+10\s+default`, text)
	assert.Regexp(t, `EXTWORKER_REPORT_RETRY_FOR\s+5m0s\s+default`, text)
	assert.Regexp(t, `EXTWORKER_IDLE_POLL_INTERVAL\s+1s\s+default`, text)

	masked := daemon.EffectiveConfig([]daemon.VarSet{{Vars: daemon.SpecVars(&daemon.Config{}), Invalid: map[string]string{"EXTWORKER_ENGINE_TOKEN": "tok-s3cret"}}}, func(string) (string, bool) { return "", false })
	for _, e := range masked {
		if e.Name == "EXTWORKER_ENGINE_TOKEN" {
			assert.Equal(t, daemon.Effective{Name: "EXTWORKER_ENGINE_TOKEN", Value: "***", Source: "env (invalid)"}, e)
		}
	}
}

// `config` says whether traces are on (the standard OTEL_* variables) and where they
// go, the endpoint without its credentials, and lists a tracing variable it cannot honour
// with the other problems.
func TestConfigCommandShowsTraces(t *testing.T) {
	testenv.ClearConfigEnv(t)
	var out bytes.Buffer
	require.NoError(t, run([]string{"config"}, &out, io.Discard))
	assert.Contains(t, out.String(), "\ntraces: off (neither OTEL_EXPORTER_OTLP_ENDPOINT")

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://otel:otel-s3cret@collector.example.com:4318")
	t.Setenv("OTEL_SERVICE_NAME", "billing")
	out.Reset()
	require.NoError(t, run([]string{"config"}, &out, io.Discard))
	assert.Contains(t, out.String(), `traces: on: OTLP/HTTP to https://collector.example.com:4318/v1/traces as service.name "billing" (OTEL_EXPORTER_OTLP_ENDPOINT)`)
	out.Reset()
	require.NoError(t, run([]string{"config", "--json"}, &out, io.Discard))
	var m map[string]string
	require.NoError(t, json.Unmarshal(out.Bytes(), &m))
	assert.Equal(t, `on: OTLP/HTTP to https://collector.example.com:4318/v1/traces as service.name "billing" (OTEL_EXPORTER_OTLP_ENDPOINT)`, m["traces"])
	assert.NotContains(t, out.String(), "s3cret")

	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	out.Reset()
	require.NoError(t, run([]string{"config"}, &out, io.Discard))
	assert.Contains(t, out.String(), "traces: off (OTEL_TRACES_EXPORTER=none)")

	t.Setenv("OTEL_TRACES_EXPORTER", "zipkin")
	out.Reset()
	err := run([]string{"config"}, &out, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `OTEL_TRACES_EXPORTER "zipkin"`)
	var ce daemon.ConfigError
	assert.True(t, errors.As(err, &ce), "exit status 78")
	assert.Contains(t, out.String(), "traces: invalid: ")
}

// `config` shows the Cockpit URL the console links to when EXTWORKER_CONSOLE_COCKPIT_URL
// is unset, marked as derived from the engine's URL (without its credentials), and the
// variable's own value when set.
func TestConfigCommandShowsDerivedCockpitURL(t *testing.T) {
	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_ENGINE_URL", "https://bpm.example.com/engine-rest")
	var out bytes.Buffer
	require.NoError(t, run([]string{"config"}, &out, io.Discard))
	assert.NotContains(t, out.String(), "s3cret")
	assert.Regexp(t, `EXTWORKER_CONSOLE_COCKPIT_URL\s+https://bpm.example.com/camunda\s+derived from EXTWORKER_ENGINE_URL\n`, out.String())

	out.Reset()
	require.NoError(t, run([]string{"config", "--json"}, &out, io.Discard))
	var m map[string]string
	require.NoError(t, json.Unmarshal(out.Bytes(), &m))
	assert.Equal(t, "https://bpm.example.com/camunda", m["EXTWORKER_CONSOLE_COCKPIT_URL"])

	t.Setenv("EXTWORKER_CONSOLE_COCKPIT_URL", "https://cockpit.example.com/camunda")
	out.Reset()
	require.NoError(t, run([]string{"config"}, &out, io.Discard))
	assert.Regexp(t, `EXTWORKER_CONSOLE_COCKPIT_URL\s+https://cockpit.example.com/camunda\s+env\n`, out.String())
}
