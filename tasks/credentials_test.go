package tasks_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/tasks"
)

// A worker whose credentials the engine keeps rejecting (a rotated password, a revoked
// client) stops, as at shutdown, and says why, instead of backing off forever; rejections
// that stop before CredentialsRejectedFor do not stop it. Two tiers: the shipped defaults
// (a quiet worker, 20s long polls, backoff to 10s, stopped after a minute of rejections),
// and short timeouts.
func TestWorkerStopsWhenCredentialsStayRejected(t *testing.T) {
	for _, tier := range []struct {
		name   string
		cfg    tasks.Config
		within time.Duration
	}{
		{"defaults", tasks.Config{WorkerID: "w"}, time.Minute + 30*time.Second},
		{"short", tasks.Config{WorkerID: "w", AsyncResponseTimeout: tasks.NoLongPoll, IdlePollInterval: 10 * time.Millisecond,
			FetchBackoffInitial: 10 * time.Millisecond, FetchBackoffMax: 20 * time.Millisecond, CredentialsRejectedFor: 300 * time.Millisecond}, 10 * time.Second},
	} {
		t.Run(tier.name, func(t *testing.T) {
			if tier.name == "defaults" && testing.Short() && !testenv.InCI() {
				t.Skip("waits out the shipped minute of rejections (CI always runs it)")
			}
			t.Parallel()
			credentialsStayRejected(t, tier.cfg, tier.within)
		})
	}
}

func credentialsStayRejected(t *testing.T, cfg tasks.Config, within time.Duration) {
	var fetches atomic.Int64
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if n := fetches.Add(1); n <= 3 || n > 5 { // rejected, then accepted twice, then rejected for good
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"type":"AuthenticationException","message":"unauthorized"}`))
			return
		}
		_, _ = w.Write([]byte(`[]`))
	}))
	defer engine.Close()
	c, err := camunda7.New(camunda7.Config{BaseURL: engine.URL})
	require.NoError(t, err)
	reg := tasks.NewRegistry()
	require.NoError(t, reg.Register("t", func(context.Context, *tasks.Task) (camunda7.Variables, error) { return nil, nil },
		tasks.TopicOptions{LockDuration: 20 * time.Second}))
	w, err := tasks.New(c, reg, cfg)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	select {
	case err := <-done:
		require.Error(t, err)
		assert.ErrorIs(t, err, tasks.ErrCredentialsRejected)
		assert.ErrorIs(t, err, camunda7.ErrUnauthorized)
	case <-time.After(within):
		t.Fatalf("the worker went on backing off with rejected credentials for %v", within)
	}
	assert.Greater(t, fetches.Load(), int64(5), "the early rejections, shorter than the bound, did not stop it")
}
