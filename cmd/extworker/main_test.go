package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/testenv"
)

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
