package tasks

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/extworker/extworker/camunda7"
)

func TestScheduleWake(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	due, earliest := scheduleWake(nil, at(1000))
	assert.True(t, earliest)
	due, earliest = scheduleWake(due, at(3000))
	assert.False(t, earliest, "a later moment re-arms nothing")
	due, earliest = scheduleWake(due, at(1050))
	assert.False(t, earliest, "within wakeMargin of a wake already due: the same wake")
	due, earliest = scheduleWake(due, at(2950))
	assert.False(t, earliest)
	due, earliest = scheduleWake(due, at(500))
	assert.True(t, earliest, "an earlier moment re-arms the loop's timer")
	assert.Equal(t, []time.Time{at(500), at(1000), at(3000)}, due)

	assert.Equal(t, 0, dueCount(due, at(499)))
	assert.Equal(t, 1, dueCount(due, at(500)), "a moment at now is due")
	assert.Equal(t, 2, dueCount(due, at(2999)))
	assert.Equal(t, 3, dueCount(due, at(9999)))
}

func TestLockWatchPeriod(t *testing.T) {
	locks := []time.Duration{20 * time.Second, 5 * time.Second}
	for _, c := range []struct {
		name string
		cfg  Config
		want time.Duration
	}{
		{"the shortest lock when shorter than the long poll", Config{AsyncResponseTimeout: 20 * time.Second}, 5 * time.Second},
		{"the long poll when shorter than every lock", Config{AsyncResponseTimeout: 2 * time.Second}, 2 * time.Second},
		{"at least a second", Config{AsyncResponseTimeout: 200 * time.Millisecond}, time.Second},
		{"as configured", Config{AsyncResponseTimeout: 20 * time.Second, LockWatch: 30 * time.Second}, 30 * time.Second},
		{"off when negative", Config{AsyncResponseTimeout: 20 * time.Second, LockWatch: -1}, 0},
		{"off without a long poll to wake", Config{AsyncResponseTimeout: NoLongPoll}, 0},
	} {
		assert.Equal(t, c.want, lockWatchPeriod(c.cfg, locks), c.name)
	}
	assert.Equal(t, 20*time.Second, lockWatchPeriod(Config{}.WithDefaults(), []time.Duration{DefaultLockDuration}), "the shipped defaults")
}

func TestForeignLockEnd(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	task := func(worker string, end time.Time) camunda7.ExternalTask {
		return camunda7.ExternalTask{WorkerID: worker, LockExpirationTime: camunda7.Time{Time: end}}
	}
	_, ok := foreignLockEnd(nil, "me")
	assert.False(t, ok)
	_, ok = foreignLockEnd([]camunda7.ExternalTask{task("me", t0), task("me", t0.Add(time.Second))}, "me")
	assert.False(t, ok, "our own locks are kept alive or scheduled already")
	end, ok := foreignLockEnd([]camunda7.ExternalTask{task("me", t0), task("peer", t0.Add(time.Second)), task("other", t0.Add(2*time.Second))}, "me")
	assert.True(t, ok)
	assert.Equal(t, t0.Add(time.Second), end, "the earliest lock another worker holds")
}

func TestNextWakeEvent(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	wake, watch := now.Add(2*time.Second), now.Add(5*time.Second)
	at, ok := nextWakeEvent(time.Time{}, time.Time{}, false, now)
	assert.False(t, ok, "nothing due, no poll pending: the loop waits for a signal")
	at, ok = nextWakeEvent(wake, watch, true, now)
	assert.True(t, ok)
	assert.Equal(t, wake, at)
	at, _ = nextWakeEvent(wake.Add(time.Minute), watch, true, now)
	assert.Equal(t, watch, at, "the watch when it comes first")
	at, _ = nextWakeEvent(wake, time.Time{}, true, now)
	assert.Equal(t, now, at, "the first watch at once")
	at, ok = nextWakeEvent(wake, time.Time{}, false, now)
	assert.True(t, ok)
	assert.Equal(t, wake, at, "no watch while no poll is pending")
}
