package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
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
	assert.Regexp(t, `^extworker .*\nengine \d+\.\d+\.\d+\n$`, out.String())

	t.Setenv("EXTWORKER_ENGINE_URL", "http://127.0.0.1:1/engine-rest")
	t.Setenv("EXTWORKER_ENGINE_USER", "user")
	t.Setenv("EXTWORKER_ENGINE_PASSWORD", "hunter2")
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

// The real binary exits 78 (EX_CONFIG) on invalid variables, and `config` shows the
// invalid values as given. (A worker program's `run` does too: examples/invoice.)
func TestConfigInvalidVariablesExit78(t *testing.T) {
	bin := buildCLI(t)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "EXTWORKER_") {
			env = append(env, kv)
		}
	}
	env = append(env, "EXTWORKER_LOCK_DURATION=abc", "EXTWORKER_READY_TIMEOUT=soon", "EXTWORKER_MAX_CONCURRENCY=0")
	for _, tc := range []struct {
		cmd  string
		vars []string
	}{
		{"config", []string{"EXTWORKER_LOCK_DURATION", "EXTWORKER_READY_TIMEOUT", "EXTWORKER_MAX_CONCURRENCY"}},
		{"version", []string{"EXTWORKER_LOCK_DURATION", "EXTWORKER_MAX_CONCURRENCY"}},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			cmd := exec.Command(bin, tc.cmd)
			cmd.Env = env
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "want an exit status, got %v; stderr:\n%s", err, stderr.String())
			assert.Equal(t, daemon.ExitConfig, exit.ExitCode(), stderr.String())
			for _, v := range tc.vars {
				assert.Contains(t, stderr.String(), v)
			}
			if tc.cmd == "config" {
				assert.Regexp(t, `EXTWORKER_LOCK_DURATION\s+abc\s+env \(invalid\)`, stdout.String())
				assert.Regexp(t, `EXTWORKER_READY_TIMEOUT\s+soon\s+env \(invalid\)`, stdout.String())
			}
		})
	}
}

// OAuth2 client credentials: one token fetched, cached, and sent as the bearer token.
func TestOAuthClientCredentials(t *testing.T) {
	var fetched atomic.Int32
	idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.NoError(t, r.ParseForm())
		id, secret, _ := r.BasicAuth()
		if id != "worker" || secret != "client-s3cret" || r.Form.Get("grant_type") != "client_credentials" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"invalid_client"}`))
			return
		}
		assert.Equal(t, "engine-rest tasks", r.Form.Get("scope"))
		fetched.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "at-1", "token_type": "Bearer", "expires_in": 3600})
	}))
	defer idp.Close()
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer at-1" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"version":"7.24.0"}`))
	}))
	defer engine.Close()

	t.Setenv("EXTWORKER_ENGINE_URL", engine.URL+"/engine-rest")
	t.Setenv("EXTWORKER_ENGINE_OAUTH_TOKEN_URL", idp.URL+"/token")
	t.Setenv("EXTWORKER_ENGINE_OAUTH_CLIENT_ID", "worker")
	t.Setenv("EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET_FILE", testenv.WriteFile(t, "cs", "client-s3cret\n"))
	t.Setenv("EXTWORKER_ENGINE_OAUTH_SCOPES", "engine-rest,tasks")
	var out bytes.Buffer
	for range 3 {
		out.Reset()
		require.NoError(t, run([]string{"version"}, &out, &bytes.Buffer{}))
		assert.Regexp(t, `\nengine 7\.24\.0\n$`, out.String())
	}
	c, err := daemon.LoadConfig()
	require.NoError(t, err)
	client, err := daemon.NewClient(c, nil)
	require.NoError(t, err)
	for range 3 {
		_, err := client.Version(context.Background())
		require.NoError(t, err)
	}
	assert.Equal(t, int32(4), fetched.Load(), "one token per process, reused by its requests")

	// A client the token endpoint rejects: a clear error at start, no secret in it.
	t.Setenv("EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET_FILE", testenv.WriteFile(t, "cs2", "wrong-s3cret"))
	c, err = daemon.LoadConfig()
	require.NoError(t, err)
	err = daemon.CheckEngine(context.Background(), c, discardLogger())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the token endpoint rejected the client: check EXTWORKER_ENGINE_OAUTH_TOKEN_URL")
	assert.Contains(t, err.Error(), "invalid_client")
	assert.NotContains(t, err.Error(), "s3cret")
	var ce daemon.ConfigError
	assert.ErrorAs(t, err, &ce)
	assert.False(t, strings.Contains(err.Error(), "at-1"))
	_ = camunda7.ErrUnauthorized
}
