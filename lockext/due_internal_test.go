package lockext

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/extworker/extworker/camunda7"
)

// The scheduler's next-due computation and its reading of answers are functions of
// values: these tables drive them without an engine or a clock.

func TestFirstDue(t *testing.T) {
	granted := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	due, late := firstDue(granted, granted.Add(time.Second), 10*time.Second)
	assert.Equal(t, granted.Add(10*time.Second), due)
	assert.False(t, late)
	now := granted.Add(10 * time.Second)
	due, late = firstDue(granted, now, 10*time.Second)
	assert.Equal(t, now, due, "handed over at its due time: extended at once")
	assert.True(t, late)
	now = granted.Add(time.Minute)
	due, late = firstDue(granted, now, 10*time.Second)
	assert.Equal(t, now, due, "handed over late in a long poll: extended at once")
	assert.True(t, late)
}

func TestDueAt(t *testing.T) {
	nominal := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	interval := 10 * time.Second
	cases := []struct {
		name   string
		maxAt  time.Time
		spread float64
		r      float64
		want   time.Time
	}{
		{"no spread: at its due time", time.Time{}, 0, 0.9, nominal},
		{"negative spread: none", time.Time{}, -1, 0.9, nominal},
		{"spread, r 0: at its due time", time.Time{}, 0.25, 0, nominal},
		{"spread, r 0.5: an eighth of the interval early", time.Time{}, 0.25, 0.5, nominal.Add(-1250 * time.Millisecond)},
		{"spread, r near 1: up to a quarter early", time.Time{}, 0.25, 0.999, nominal.Add(-time.Duration(0.999 * 0.25 * float64(interval)))},
		{"never after MaxRunTime", nominal.Add(-3 * time.Second), 0.25, 0, nominal.Add(-3 * time.Second)},
		{"MaxRunTime later: no effect", nominal.Add(time.Hour), 0, 0, nominal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, dueAt(nominal, tc.maxAt, interval, tc.spread, tc.r))
		})
	}
}

func TestNextStep(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name      string
		at, maxAt time.Time
		lastSend  time.Time
		gap       time.Duration
		want      step
		wait      time.Duration
	}{
		{"not due: wait for it", now.Add(2 * time.Second), time.Time{}, time.Time{}, 0, stepWait, 2 * time.Second},
		{"due: send", now, time.Time{}, time.Time{}, 0, stepSend, 0},
		{"overdue: send", now.Add(-time.Second), time.Time{}, time.Time{}, 0, stepSend, 0},
		{"MaxRunTime passed: expire", now, now, time.Time{}, 0, stepExpire, 0},
		{"MaxRunTime ahead: send", now, now.Add(time.Second), time.Time{}, 0, stepSend, 0},
		{"paced: wait out the gap", now, time.Time{}, now.Add(-10 * time.Millisecond), 50 * time.Millisecond, stepWait, 40 * time.Millisecond},
		{"gap passed: send", now, time.Time{}, now.Add(-50 * time.Millisecond), 50 * time.Millisecond, stepSend, 0},
		{"expiry before pacing", now, now, now, 50 * time.Millisecond, stepExpire, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, wait := nextStep(now, tc.at, tc.maxAt, tc.lastSend, tc.gap)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.wait, wait)
		})
	}
}

func TestPaceGap(t *testing.T) {
	assert.Zero(t, paceGap(-1, 100), "no pacing")
	assert.Zero(t, paceGap(5, 0), "nothing to extend")
	assert.Equal(t, 2*time.Millisecond, paceGap(5, 100), "5 times the 100 extensions a second needed")
	assert.Equal(t, minPaceGap, paceGap(5, 0.1), "never more than minPaceGap")
}

func TestCallDeadline(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	assert.Equal(t, now.Add(5*time.Second), callDeadline(now, 5*time.Second, time.Time{}))
	assert.Equal(t, now.Add(time.Second), callDeadline(now, 5*time.Second, now.Add(time.Second)), "never after MaxRunTime")
}

func TestVerdictAndNextNominal(t *testing.T) {
	lost := fmt.Errorf("extend: %w", camunda7.ErrTaskGone)
	transient := errors.New("connection refused")
	cases := []struct {
		name    string
		err     error
		maxOver bool
		want    verdict
	}{
		{"granted", nil, false, verdictExtended},
		{"transient error: retry", transient, false, verdictRetry},
		{"the engine's answer: lost", lost, false, verdictLost},
		{"lost wins over MaxRunTime", lost, true, verdictLost},
		{"MaxRunTime passed during a granted call", nil, true, verdictMaxRunTime},
		{"MaxRunTime passed during a failed call", transient, true, verdictMaxRunTime},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, verdictOf(tc.err, LostAnswer(tc.err), tc.maxOver))
		})
	}
	sent := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	now := sent.Add(300 * time.Millisecond)
	assert.Equal(t, sent.Add(10*time.Second), nextNominal(verdictExtended, sent, now, 10*time.Second, time.Second), "an interval after the grant was sent")
	assert.Equal(t, now.Add(time.Second), nextNominal(verdictRetry, sent, now, 10*time.Second, time.Second), "the backoff after the failure")
}
