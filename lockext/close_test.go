package lockext_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/lockext"
)

// gateLocker holds every ExtendLock until open is closed (or the call's context ends),
// and records which tasks it was asked for.
type gateLocker struct {
	open chan struct{}
	mu   sync.Mutex
	ids  []string
	in   chan string // each call, as it arrives
}

func (g *gateLocker) ExtendLock(ctx context.Context, taskID, _ string, _ time.Duration) error {
	g.mu.Lock()
	g.ids = append(g.ids, taskID)
	g.mu.Unlock()
	g.in <- taskID
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gateLocker) Lock(context.Context, string, string, time.Duration) error { return nil }

func (g *gateLocker) asked() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.ids...)
}

// startResult is what a Scheduler.Start returned.
type startResult struct {
	ext *lockext.Extender
	err error
}

// A late task (handed over with its local lock spent) waits in Scheduler.Start for its
// first extension's answer. When every call slot was busy and the scheduler was closed
// meanwhile (the worker shutting down), nothing would ever send that extension, and
// Start blocked forever: a goroutine leaked and the task was never unlocked. Start now
// returns ErrClosed at once, with the task's context ended, and nothing sent for it, so
// that the caller unlocks the task as at any shutdown.
func TestLateStartReturnsWhenClosedWhileWaitingForASlot(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	g := &gateLocker{open: make(chan struct{}), in: make(chan string, 4)}
	s, err := lockext.NewScheduler(g, lockext.SchedulerConfig{Concurrency: 1, Spread: -1, Burst: -1})
	require.NoError(t, err)
	cfg := lockext.Config{LockDuration: 3 * time.Second, RequestTimeout: time.Minute}
	late := time.Now().Add(-time.Hour) // its whole local lock spent: extended before it may start

	start := func(id string) <-chan startResult {
		ch := make(chan startResult, 1)
		go func() {
			ext, err := s.Start(context.Background(), lockext.Task{ID: id, WorkerID: "w", GrantedAt: late}, cfg)
			ch <- startResult{ext, err}
		}()
		return ch
	}
	first := start("first")
	require.Equal(t, "first", <-g.in, "the first late task's extension holds the only call slot")
	second := start("second")
	testenv.Eventually(t, 10*time.Second, "the second task queued behind the first", func() (bool, error) {
		return s.Tasks() == 2, nil
	})

	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	var res startResult
	select {
	case res = <-second:
	case <-time.After(5 * time.Second):
		close(g.open) // let Close and the first Start go, for the report's sake
		t.Fatal("Scheduler.Start of a late task still blocked 5s after Close")
	}
	assert.Nil(t, res.ext)
	assert.True(t, errors.Is(res.err, lockext.ErrClosed), "Start returns ErrClosed: %v", res.err)

	// The first task's extension is in flight: Close waits for it, as it always did, and
	// its Start returns with the answer.
	close(g.open)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	r1 := <-first
	require.NoError(t, r1.err)
	r1.ext.Stop()
	assert.Equal(t, []string{"first"}, g.asked(), "nothing was sent for the task that never got a slot")
}
