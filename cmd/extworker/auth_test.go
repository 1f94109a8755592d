package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/testenv"
)

// These tests run against the second engine `make up` starts: HTTP basic authentication
// on /engine-rest (services/engine, ENGINE_REST_AUTH=true), port 8081.

// Right credentials: the engine answers, and a task can be fetched and locked.
func TestAuthEngineRightCredentials(t *testing.T) {
	eng := testenv.AuthEngine(t)
	ctx := testenv.Context(t, time.Minute)
	m := testenv.Deploy(t, eng, testenv.ModelOptions{NoMessageWait: true})
	_, err := eng.StartProcess(ctx, m.Key, admin.StartProcessRequest{})
	require.NoError(t, err)

	t.Setenv("EXTWORKER_ENGINE_URL", testenv.AuthEngineURL())
	t.Setenv("EXTWORKER_ENGINE_USER", testenv.AuthEngineUser)
	t.Setenv("EXTWORKER_ENGINE_PASSWORD_FILE", testenv.WriteFile(t, "pw", testenv.AuthEnginePassword+"\n"))
	cfg, err := daemon.LoadConfig()
	require.NoError(t, err)
	require.NoError(t, daemon.CheckEngine(ctx, cfg, discardLogger()))
	c, err := daemon.NewClient(cfg, discardLogger())
	require.NoError(t, err)
	locked, err := c.FetchAndLock(ctx, camunda7.FetchAndLockRequest{WorkerID: testenv.Unique("w"), MaxTasks: 1,
		AsyncResponseTimeout: 5 * time.Second, Topics: []camunda7.FetchTopic{{TopicName: m.Topic, LockDuration: time.Minute}}})
	require.NoError(t, err)
	require.Len(t, locked, 1)
	require.NoError(t, c.Complete(ctx, locked[0].ID, camunda7.CompleteRequest{WorkerID: locked[0].WorkerID}))

	var out bytes.Buffer
	require.NoError(t, run([]string{"version"}, &out, &bytes.Buffer{}))
	assert.Regexp(t, `^extworker .*\nengine \d+\.\d+\.\d+\n$`, out.String())
}

// A wrong password is an answer the client classifies: ErrUnauthorized, on every endpoint.
func TestAuthEngineWrongPassword(t *testing.T) {
	testenv.AuthEngine(t)
	ctx := testenv.Context(t, 30*time.Second)
	c, err := camunda7.New(camunda7.Config{BaseURL: testenv.AuthEngineURL(), Username: testenv.AuthEngineUser, Password: "wrong-s3cret"})
	require.NoError(t, err)
	_, err = c.Version(ctx)
	require.ErrorIs(t, err, camunda7.ErrUnauthorized)
	var ce *camunda7.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, 401, ce.StatusCode)
	_, err = c.FetchAndLock(ctx, camunda7.FetchAndLockRequest{WorkerID: "w", MaxTasks: 1,
		Topics: []camunda7.FetchTopic{{TopicName: "t", LockDuration: time.Minute}}})
	require.ErrorIs(t, err, camunda7.ErrUnauthorized)
	assert.NotContains(t, err.Error(), "wrong-s3cret")
}

// `extworker version` with credentials the engine rejects exits 78 (docs/configuration.md:
// rejected credentials are a configuration problem), saying what to check, never the
// password; the program's own version is printed first all the same.
func TestVersionRejectedCredentialsExit78(t *testing.T) {
	testenv.AuthEngine(t)
	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.AuthEngineURL())
	t.Setenv("EXTWORKER_ENGINE_USER", testenv.AuthEngineUser)
	t.Setenv("EXTWORKER_ENGINE_PASSWORD", "wrong-s3cret")
	var out bytes.Buffer
	err := run([]string{"version"}, &out, &bytes.Buffer{})
	require.Error(t, err)
	assert.Equal(t, daemon.ExitConfig, exitCode(err), "%v", err)
	assert.Contains(t, err.Error(), "rejected the credentials")
	assert.Contains(t, err.Error(), "EXTWORKER_ENGINE_USER and EXTWORKER_ENGINE_PASSWORD")
	assert.NotContains(t, err.Error(), "wrong-s3cret")
	assert.Regexp(t, `^extworker `, out.String())
}
