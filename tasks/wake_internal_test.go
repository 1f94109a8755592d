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

func TestDecideWatch(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	const period = 20 * time.Second
	lock := func(id, worker string, end time.Duration) camunda7.ExternalTask {
		return camunda7.ExternalTask{ID: id, WorkerID: worker, LockExpirationTime: camunda7.Time{Time: now.Add(end)}}
	}

	wake, next, woken := decideWatch(nil, false, "me", nil, now, period)
	assert.False(t, wake)
	assert.Equal(t, now.Add(period), next, "no lock: the next watch after the period")
	assert.Empty(t, woken)

	wake, next, _ = decideWatch([]camunda7.ExternalTask{lock("a", "me", time.Second), lock("b", "me", -time.Second)}, false, "me", nil, now, period)
	assert.False(t, wake, "our own locks are kept alive or scheduled already")
	assert.Equal(t, now.Add(period), next)

	// A dead worker's five locks ending one after the other: the watch comes back at the
	// first end, not after the period, and wakes once it has ended.
	dead := []camunda7.ExternalTask{lock("t1", "dead", 2*time.Second), lock("t2", "dead", 4*time.Second), lock("t3", "dead", 6*time.Second)}
	wake, next, woken = decideWatch(dead, false, "me", nil, now, period)
	assert.False(t, wake, "nothing has ended yet")
	assert.Equal(t, now.Add(2*time.Second+wakeMargin), next, "watch again when the earliest lock ends")
	// at t1's end: t1 ended (not yet taken), t2 and t3 to come
	at := now.Add(2*time.Second + wakeMargin)
	wake, next, woken = decideWatch(dead, false, "me", nil, at, period)
	assert.True(t, wake, "t1's lock ended: wake the poll")
	assert.Equal(t, at.Add(watchGap), next, "look again soon: taken, or wake again")
	assert.Equal(t, 1, woken["t1"].tries)

	// A live worker extends its lock before it ends: the watch sees the new end and does
	// not wake.
	wake, next, _ = decideWatch([]camunda7.ExternalTask{lock("busy", "live", 13*time.Second)}, false, "me", nil, now, period)
	assert.False(t, wake)
	assert.Equal(t, now.Add(13*time.Second+wakeMargin), next)

	// An ended lock whose task this worker's polls never take (another tenant, a clock
	// ahead of the engine's): woken for at most maxWakeTries times, then left alone.
	stale := []camunda7.ExternalTask{lock("stale", "gone", -time.Minute)}
	woken = nil
	for i := 1; i <= maxWakeTries+2; i++ {
		wake, next, woken = decideWatch(stale, false, "me", woken, now.Add(time.Duration(i)*time.Second), period)
		assert.Equal(t, i <= maxWakeTries, wake, "watch %d", i)
	}
	assert.Equal(t, now.Add(time.Duration(maxWakeTries+2)*time.Second).Add(period), next, "no more soon watches for it")

	// An answer cut at its limit by ended locks: the watch comes back when they are too
	// old to be read again, to see the locks behind them.
	tried := map[string]wokenLock{"old": {end: now.Add(-time.Second), tries: maxWakeTries}}
	_, next, _ = decideWatch([]camunda7.ExternalTask{lock("old", "gone", -time.Second)}, true, "me", tried, now, period)
	assert.Equal(t, now.Add(staleLock-time.Second), next)

	// Locks about to end are not watched more often than every watchGap.
	_, next, _ = decideWatch([]camunda7.ExternalTask{lock("x", "dead", 10*time.Millisecond)}, false, "me", nil, now, period)
	assert.Equal(t, now.Add(watchGap), next)
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
