package tasks_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/tasks"
)

// A worker whose credentials the engine keeps rejecting (a rotated password, a revoked
// client) stops, as at shutdown, and says why, instead of backing off forever; rejections
// that stop before CredentialsRejectedFor do not stop it.
func TestWorkerStopsWhenCredentialsStayRejected(t *testing.T) {
	var fetches, rejecting atomic.Int64
	rejecting.Store(3) // then accepted, then rejected for good
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := fetches.Add(1)
		if n <= rejecting.Load() || n > 5 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"type":"AuthenticationException","message":"unauthorized"}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`[]`))
	}))
	defer engine.Close()
	c, err := camunda7.New(camunda7.Config{BaseURL: engine.URL})
	require.NoError(t, err)
	reg := tasks.NewRegistry()
	require.NoError(t, reg.Register("t", func(context.Context, *tasks.Task) (camunda7.Variables, error) { return nil, nil },
		tasks.TopicOptions{LockDuration: time.Second}))
	w, err := tasks.New(c, reg, tasks.Config{WorkerID: "w", AsyncResponseTimeout: tasks.NoLongPoll, IdlePollInterval: 10 * time.Millisecond,
		FetchBackoffInitial: 10 * time.Millisecond, FetchBackoffMax: 20 * time.Millisecond, CredentialsRejectedFor: 300 * time.Millisecond})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	select {
	case err := <-done:
		require.Error(t, err)
		assert.ErrorIs(t, err, tasks.ErrCredentialsRejected)
		assert.ErrorIs(t, err, camunda7.ErrUnauthorized)
		assert.True(t, errors.Is(err, tasks.ErrCredentialsRejected))
	case <-time.After(10 * time.Second):
		t.Fatal("the worker went on backing off with rejected credentials")
	}
	assert.Greater(t, fetches.Load(), int64(5), "the early rejections, shorter than the bound, did not stop it")
}
