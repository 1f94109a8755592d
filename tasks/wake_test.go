package tasks_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/tasks"
)

// The worker's shipped settings (a 20 s long poll and 20 s locks), except the worker id:
// what these tests time is the engine's long-poll hand-over at the defaults.
func shippedDefaults(t *testing.T) tasks.Config {
	cfg := tasks.Config{}.WithDefaults()
	cfg.WorkerID = testenv.Unique("w")
	require.Equal(t, 20*time.Second, cfg.AsyncResponseTimeout)
	return cfg
}

// A quiet worker whose task failed once with the default 1 s retry timeout runs it again
// about a second later, not when its long poll ends: it wakes its own pending poll when
// the retry timeout it reported runs out (the engine wakes none then).
func TestWorkerRetriesWhenItsRetryTimeoutEnds(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(1)
	var failedAt, retriedAt atomic.Int64
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		if tk.Attempt() == 1 {
			defer func() { failedAt.Store(time.Now().UnixNano()) }()
			return nil, errors.New("the provider is briefly unavailable")
		}
		retriedAt.Store(time.Now().UnixNano())
		return nil, nil
	}, tasks.TopicOptions{})
	w, _ := f.run(reg, shippedDefaults(t))
	f.waitEnded(ids, time.Minute)
	after := time.Duration(retriedAt.Load() - failedAt.Load())
	t.Logf("retried %v after the failure (retry timeout 1s, long poll 20s); wakes %d", after, w.Stats().Wakes.Load())
	assert.Less(t, after, 3*time.Second, "picked up when the retry timeout ended, not when the poll did")
	assert.Positive(t, w.Stats().Wakes.Load(), "the worker woke its pending poll")
}

// A task whose worker died holding a 5 s lock is picked up by a worker at the shipped
// defaults within a second of the lock's end: its lock watch saw the lock and woke its
// pending poll when it ended.
func TestWorkerPicksUpADeadPeersTaskWhenItsLockEnds(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	ids := f.start(1)
	peer := testenv.Unique("dead-peer")
	held, err := f.c.FetchAndLock(f.ctx, camunda7.FetchAndLockRequest{WorkerID: peer, MaxTasks: 1,
		Topics: []camunda7.FetchTopic{{TopicName: f.m.Topic, LockDuration: 5 * time.Second}}})
	require.NoError(t, err)
	require.Len(t, held, 1)
	lockEnd := held[0].LockExpirationTime.Time
	var startedAt atomic.Int64
	reg := tasks.NewRegistry()
	register(t, reg, f.m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		startedAt.CompareAndSwap(0, time.Now().UnixNano())
		return nil, nil
	}, tasks.TopicOptions{})
	w, _ := f.run(reg, shippedDefaults(t))
	f.waitEnded(ids, time.Minute)
	after := time.Unix(0, startedAt.Load()).Sub(lockEnd)
	t.Logf("picked up %v after the dead peer's lock ended (lock 5s, long poll 20s); lock watches %d, wakes %d",
		after, w.Stats().LockWatches.Load(), w.Stats().Wakes.Load())
	assert.Less(t, after, time.Second, "picked up within a second of the lock's end")
	assert.Positive(t, w.Stats().Wakes.Load(), "the worker woke its pending poll")
}
