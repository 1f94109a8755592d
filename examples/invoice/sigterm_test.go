package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/testenv"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildOut  []byte
)

// buildBinary builds the extworker binary once per test run, with the failpoints the
// fault matrix kills workers at (a test build: the production binary has none).
func buildBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "extworker-bin")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "extworker")
		buildOut, buildErr = exec.Command("go", "build", "-tags", "failpoints", "-o", binPath, ".").CombinedOutput()
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
		pi, err := c.StartProcess(ctx, demoProcessKey, admin.StartProcessRequest{BusinessKey: fmt.Sprintf("SIGTERM-%d", i),
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

// A second SIGTERM or SIGINT, while the first one's graceful stop waits for a busy
// handler, exits the real binary at once with 128+signal (143, 130), long before
// EXTWORKER_SHUTDOWN_GRACE ends, with one record saying so. The handler is kept busy by a
// payment provider that never answers: its charge is in flight when the signals come.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
		code int
	}{{"SIGTERM", syscall.SIGTERM, 143}, {"SIGINT", syscall.SIGINT, 130}} {
		t.Run(tc.name, func(t *testing.T) { secondSignalExits(t, tc.sig, tc.code) })
	}
}

func secondSignalExits(t *testing.T, sig syscall.Signal, code int) {
	c := testenv.Engine(t)
	testenv.DB(t)
	ctx := testenv.Context(t, 3*time.Minute)
	bin := buildBinary(t)
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	require.NoError(t, run([]string{"migrate"}, io.Discard, io.Discard))
	require.NoError(t, deployDemo(ctx, c))

	// The provider: every request hangs until the test ends (or its caller leaves).
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
	}))
	t.Cleanup(provider.Close)
	t.Cleanup(func() { close(release) }) // runs first

	invoice := testenv.Unique("INV-2SIG")
	pi, err := c.StartProcess(ctx, demoProcessKey, admin.StartProcessRequest{BusinessKey: invoice,
		Variables: camunda7.Variables{"invoiceId": camunda7.StringVar(invoice), "amountCents": camunda7.LongVar(1000)}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.DeleteProcessInstance(context.Background(), pi.ID) })

	const grace = 2 * time.Minute
	cmd := exec.Command(bin, "run")
	cmd.Env = append(os.Environ(), "EXTWORKER_ENGINE_URL="+testenv.EngineURL(), "EXTWORKER_DATABASE_URL="+testenv.DBURL(),
		"EXTWORKER_LEDGER_NAMESPACE="+testenv.Unique("2sig"), "EXTWORKER_PROVIDER_URL="+provider.URL,
		"EXTWORKER_WORKER_ID="+testenv.Unique("2sig"), "EXTWORKER_LONG_POLL=1s", "EXTWORKER_LOG_FORMAT=json",
		"EXTWORKER_HTTP_ADDR=off", "EXTWORKER_SHUTDOWN_GRACE="+grace.String(),
		// The charge stays in flight through the grace: neither its timeout nor the lease ends it.
		"EXTWORKER_PROVIDER_TIMEOUT="+grace.String(), "EXTWORKER_LEDGER_LEASE=5m")
	logs := &testenv.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	var waitErr error // once exited is closed
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	select {
	case <-arrived:
	case <-exited:
		t.Fatalf("exited (%v) before a charge reached the provider; logs:\n%s", waitErr, logs.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("no charge reached the provider within 90s; logs:\n%s", logs.String())
	}

	require.NoError(t, cmd.Process.Signal(sig))
	first := time.Now()
	testenv.Eventually(t, 30*time.Second, "the worker to stop fetching and wait for its handler", func() (bool, error) {
		return strings.Contains(logs.String(), `"msg":"worker stopping"`), nil
	})
	assert.Contains(t, logs.String(), `"msg":"signal received: stopping gracefully; send it again to exit at once"`)
	require.Regexp(t, `"msg":"worker stopping"[^\n]*"running_handlers":[1-9]`, logs.String(), "a handler is busy")
	select {
	case <-exited:
		t.Fatalf("exited (%v) on the first signal while a handler was busy; logs:\n%s", waitErr, logs.String())
	default:
	}

	require.NoError(t, cmd.Process.Signal(sig))
	second := time.Now()
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		t.Fatalf("no exit 15s after the second %v; logs:\n%s", sig, logs.String())
	}
	t.Logf("exited %v after the second %v, %v after the first (grace %v)", time.Since(second), sig, time.Since(first), grace)
	var exit *exec.ExitError
	require.True(t, errors.As(waitErr, &exit), "want an exit status, got %v; logs:\n%s", waitErr, logs.String())
	assert.Equal(t, code, exit.ExitCode(), logs.String())
	assert.Less(t, time.Since(first), grace/2, "well before the grace ends")
	assert.Contains(t, logs.String(), `"msg":"second signal: exiting at once, without waiting for running handlers"`)
	assert.Contains(t, logs.String(), fmt.Sprintf(`"exit_code":%d`, code))
	assert.NotContains(t, logs.String(), `"msg":"worker stopped"`, "it did not wait for the handler")
}

func TestSignalExitCode(t *testing.T) {
	assert.Equal(t, 130, daemon.SignalExitCode(os.Interrupt))
	assert.Equal(t, 130, daemon.SignalExitCode(syscall.SIGINT))
	assert.Equal(t, 143, daemon.SignalExitCode(syscall.SIGTERM))
}
