package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/testenv"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildOut  []byte
)

// buildBinary builds the extworker binary once per test run.
func buildBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "extworker-bin")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "extworker")
		buildOut, buildErr = exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
	})
	require.NoError(t, buildErr, "go build: %s", buildOut)
	return binPath
}

// SIGTERM to the real binary while it works: it stops fetching, lets running handlers
// finish, exits 0, and leaves no task locked for its worker id.
func TestSIGTERMDrainsAndLeavesNothingLocked(t *testing.T) {
	c := testenv.Engine(t)
	ctx := testenv.Context(t, 3*time.Minute)
	bin := buildBinary(t)

	require.NoError(t, deployDemo(ctx, c))
	var ids []string
	for i := 0; i < 40; i++ {
		pi, err := c.StartProcess(ctx, demoProcessKey, camunda7.StartProcessRequest{BusinessKey: fmt.Sprintf("SIGTERM-%d", i),
			Variables: camunda7.Variables{"invoiceId": camunda7.StringVar(fmt.Sprintf("SIG-%d", i)), "amountCents": camunda7.LongVar(1000)}})
		require.NoError(t, err)
		ids = append(ids, pi.ID)
	}
	t.Cleanup(func() {
		for _, id := range ids {
			_ = c.DeleteProcessInstance(context.Background(), id) // ended ones answer 404
		}
	})

	worker := testenv.Unique("sigterm")
	cmd := exec.Command(bin, "run")
	cmd.Env = append(os.Environ(), "EXTWORKER_ENGINE_URL="+testenv.EngineURL(), "EXTWORKER_WORKER_ID="+worker,
		"EXTWORKER_MAX_CONCURRENCY=4", "EXTWORKER_LONG_POLL=2s", "EXTWORKER_LOG_FORMAT=json", "EXTWORKER_SHUTDOWN_GRACE=20s",
		"EXTWORKER_HTTP_ADDR=127.0.0.1:0")
	logs := &testenv.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	testenv.Eventually(t, time.Minute, "the worker to complete a few tasks", func() (bool, error) {
		done, err := c.ExternalTaskLog(ctx, url.Values{"workerId": {worker}, "successLog": {"true"}})
		return len(done) >= 5, err
	})
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	sent := time.Now()
	select {
	case err := <-exited:
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("exit status %d; logs:\n%s", exit.ExitCode(), logs.String())
		}
		require.NoError(t, err)
	case <-time.After(45 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("no exit 45s after SIGTERM; logs:\n%s", logs.String())
	}
	t.Logf("exited %v after SIGTERM", time.Since(sent))
	locked, err := c.ExternalTasks(ctx, camunda7.ExternalTaskQuery{WorkerID: worker, Locked: true})
	require.NoError(t, err)
	assert.Empty(t, locked, "nothing left locked by the stopped worker")
	assert.Contains(t, logs.String(), `"msg":"worker stopped"`)
	assert.NotContains(t, logs.String(), `"level":"ERROR"`)
}
