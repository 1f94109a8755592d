package tasks

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/lockext"
)

// The decisions of a task's walk are functions of values: these tables drive them
// without an engine.

// planReport: a handler's classified result, the task's retries and the retry policy
// decide the one engine call, its retries and retry timeout, and the outcome.
func TestPlanReport(t *testing.T) {
	policy := failure.RetryPolicy{MaxAttempts: 3, InitialDelay: time.Second, Multiplier: 2, MaxDelay: time.Minute}
	two, one, zero := 2, 1, 0
	cases := []struct {
		name    string
		err     error
		retries *int
		call    engineCall
		outcome Outcome
		class   string
		left    int
		timeout time.Duration
	}{
		{"success completes", nil, nil, callComplete, OutcomeCompleted, "", 0, 0},
		{"a BPMN error is thrown", failure.BPMNError("NO_FUNDS", "no funds", map[string]any{"n": 1}), nil, callBPMNError, OutcomeBPMNError, "", 0, 0},
		{"a BPMN error whose variables cannot be sent is an incident", failure.BPMNError("X", "", map[string]any{"f": func() {}}), nil,
			callFailure, OutcomeIncident, "permanent", 0, 0},
		{"first failure: retries counted down from the policy", errors.New("down"), nil, callFailure, OutcomeRetryable, "retryable", 2, time.Second},
		{"second failure: the engine's retries counted down", errors.New("down"), &two, callFailure, OutcomeRetryable, "retryable", 1, 2 * time.Second},
		{"last retry spent: an incident", errors.New("down"), &one, callFailure, OutcomeIncident, "retryable", 0, 0},
		{"retries 0 from the engine: an incident", errors.New("down"), &zero, callFailure, OutcomeIncident, "retryable", 0, 0},
		{"RetryableAfter sets the timeout", failure.RetryableAfter(errors.New("429"), 42*time.Second), nil, callFailure, OutcomeRetryable, "retryable", 2, 42 * time.Second},
		{"RetryableAfter with no retries left: an incident", failure.RetryableAfter(errors.New("429"), 42*time.Second), &one, callFailure, OutcomeIncident, "retryable", 0, 0},
		{"permanent: an incident at once", failure.Permanent(errors.New("bad iban")), nil, callFailure, OutcomeIncident, "permanent", 0, 0},
		{"unknown outcome: an incident at once", failure.UnknownOutcome(errors.New("timeout")), &two, callFailure, OutcomeIncident, "unknown-outcome", 0, 0},
		{"deferred, never failed: the whole budget kept", failure.Deferred(errors.New("busy"), 5*time.Second), nil, callFailure, OutcomeDeferred, "deferred", 3, 5 * time.Second},
		{"deferred: the engine's retries kept", failure.Deferred(errors.New("busy"), 5*time.Second), &two, callFailure, OutcomeDeferred, "deferred", 2, 5 * time.Second},
		{"deferred at retries 0: one kept", failure.Deferred(errors.New("busy"), 0), &zero, callFailure, OutcomeDeferred, "deferred", 1, time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := planReport(failure.Classify(tc.err), tc.retries, policy)
			assert.Equal(t, tc.call, p.call)
			assert.Equal(t, tc.outcome, p.outcome)
			assert.Equal(t, tc.class, p.class)
			assert.Equal(t, tc.left, p.retries)
			assert.Equal(t, tc.timeout, p.retryTimeout)
			assert.Equal(t, tc.left > 0 && tc.timeout > 0, p.holds(), "the worker holds the task for its retry timeout")
		})
	}
}

// A BPMN error's variables reach the plan converted; a complete carries none of its own.
func TestPlanReportBPMNVariables(t *testing.T) {
	p := planReport(failure.Classify(failure.BPMNError("NO_FUNDS", "m", map[string]any{"amount": int64(5)})), nil, failure.RetryPolicy{}.WithDefaults())
	require.Equal(t, callBPMNError, p.call)
	assert.Equal(t, camunda7.LongVar(5), p.bpmnVars["amount"])
	assert.Equal(t, "NO_FUNDS", p.result.Code)
}

// settleOf: how the handler's context ended decides whether its result is reported.
func TestSettleOf(t *testing.T) {
	herr := errors.New("handler failed")
	lost := &lockext.LockLostError{TaskID: "t", Err: camunda7.ErrTaskGone}
	cases := []struct {
		name            string
		ctxErr, cause   error
		herr            error
		want            settlement
		wraps, mentions error
	}{
		{"context alive: report", nil, nil, herr, settleReport, herr, nil},
		{"context alive, success: report", nil, nil, nil, settleReport, nil, nil},
		{"lock lost: nothing to report", errors.New("canceled"), lost, herr, settleLockLost, herr, nil},
		{"lock lost after success: nothing to report", errors.New("canceled"), lost, nil, settleLockLost, nil, nil},
		{"shutdown cancelled the handler: unlock", errors.New("canceled"), ErrShutdown, herr, settleUnlock, herr, nil},
		{"shutdown, but the handler succeeded: report", errors.New("canceled"), ErrShutdown, nil, settleReport, nil, nil},
		{"max run time: report the error naming it", errors.New("canceled"), lockext.ErrMaxRunTime, herr, settleReport, herr, lockext.ErrMaxRunTime},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := settleOf(tc.ctxErr, tc.cause, tc.herr)
			assert.Equal(t, tc.want, got)
			if tc.wraps == nil {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, tc.wraps)
			}
			if tc.mentions != nil {
				assert.ErrorIs(t, err, tc.mentions)
			}
		})
	}
}

// fetchState: what follows a failed or successful poll.
func TestFetchStateAfterError(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	cfg := Config{AsyncResponseTimeout: 20 * time.Second, CredentialsRejectedFor: time.Minute}
	unauthorized := fmt.Errorf("fetch: %w", camunda7.ErrUnauthorized)
	notSent := fmt.Errorf("fetch: %w", camunda7.ErrNotSent)
	lostAnswer := fmt.Errorf("fetch: %w", camunda7.ErrUnknownOutcome)
	tooLarge := fmt.Errorf("fetch: %w", camunda7.ErrResponseTooLarge)
	cases := []struct {
		name     string
		st       fetchState
		err      error
		maxTasks int
		cfg      Config
		verdict  fetchVerdict
		want     fetchState
	}{
		{"first failure, not sent: back off, nothing pending", fetchState{}, notSent, 16, cfg, fetchBackOff,
			fetchState{failures: 1, failSince: now}},
		{"answer lost: sweep once the poll has surely ended", fetchState{}, lostAnswer, 16, cfg, fetchBackOff,
			fetchState{failures: 1, failSince: now, sweepAt: now.Add(21 * time.Second)}},
		{"no long poll: sweep a second later", fetchState{}, lostAnswer, 16, Config{AsyncResponseTimeout: NoLongPoll}, fetchBackOff,
			fetchState{failures: 1, failSince: now, sweepAt: now.Add(time.Second)}},
		{"another failure keeps its start", fetchState{failures: 2, failSince: now.Add(-time.Minute)}, notSent, 16, cfg, fetchBackOff,
			fetchState{failures: 3, failSince: now.Add(-time.Minute)}},
		{"too large: ask for half", fetchState{}, tooLarge, 16, cfg, fetchFewer, fetchState{limit: 8}},
		{"too large at 3: ask for 1", fetchState{limit: 3}, tooLarge, 3, cfg, fetchFewer, fetchState{limit: 1}},
		{"too large at 1: fail the task", fetchState{limit: 1}, tooLarge, 1, cfg, fetchOversized, fetchState{limit: 1}},
		{"credentials refused: the clock starts", fetchState{}, unauthorized, 16, cfg, fetchBackOff,
			fetchState{failures: 1, failSince: now, rejected: now, sweepAt: now.Add(21 * time.Second)}},
		{"credentials refused for CredentialsRejectedFor: stop", fetchState{failures: 9, rejected: now.Add(-time.Minute)}, unauthorized, 16, cfg, fetchStop,
			fetchState{failures: 9, rejected: now.Add(-time.Minute)}},
		{"credentials refused, forever allowed: back off", fetchState{failures: 9, failSince: now.Add(-time.Hour), rejected: now.Add(-time.Hour)}, unauthorized, 16,
			Config{CredentialsRejectedFor: -1}, fetchBackOff,
			fetchState{failures: 10, failSince: now.Add(-time.Hour), rejected: now.Add(-time.Hour), sweepAt: now.Add(time.Second)}},
		{"another error resets the credentials clock", fetchState{failures: 1, failSince: now, rejected: now.Add(-time.Minute)}, notSent, 16, cfg, fetchBackOff,
			fetchState{failures: 2, failSince: now}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, verdict := tc.st.afterError(tc.err, tc.maxTasks, now, tc.cfg)
			assert.Equal(t, tc.verdict, verdict)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestFetchStateAfterSuccess(t *testing.T) {
	now := time.Now()
	failing := fetchState{failures: 3, failSince: now, rejected: now, sweepAt: now}
	assert.Equal(t, fetchState{sweepAt: now}, failing.afterSuccess(0, 16), "a success ends the failures and keeps the sweep due")
	assert.Equal(t, fetchState{limit: 4}, fetchState{limit: 2}.afterSuccess(2, 16), "a cap doubles with tasks")
	assert.Equal(t, fetchState{limit: 2}, fetchState{limit: 2}.afterSuccess(0, 16), "an empty poll keeps the cap")
	assert.Equal(t, fetchState{}, fetchState{limit: 8}.afterSuccess(1, 16), "the cap goes at MaxConcurrency")
	assert.True(t, fetchState{sweepAt: now}.sweepDue(now.Add(time.Millisecond)))
	assert.False(t, fetchState{sweepAt: now}.sweepDue(now))
	assert.False(t, fetchState{}.sweepDue(now))
}

func TestFetchBackoff(t *testing.T) {
	initial, maxWait := 500*time.Millisecond, 10*time.Second
	cases := []struct {
		failures int
		jitter   float64
		want     time.Duration
	}{
		{1, 0, 500 * time.Millisecond},
		{2, 0, time.Second},
		{3, 0, 2 * time.Second},
		{5, 0, 8 * time.Second},
		{6, 0, 10 * time.Second},
		{1000, 0, 10 * time.Second},
		{1, -1, 400 * time.Millisecond},
		{1, 0.5, 550 * time.Millisecond},
		{5, 0.99, 9584 * time.Millisecond},
		{6, 0.99, 10 * time.Second}, // jitter never passes the maximum
		{6, -1, 8 * time.Second},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, fetchBackoff(tc.failures, initial, maxWait, tc.jitter), "failures %d, jitter %v", tc.failures, tc.jitter)
	}
}

func TestFetchSizing(t *testing.T) {
	assert.Equal(t, 16, fetchSize(16, 0, 0))
	assert.Equal(t, 6, fetchSize(16, 10, 0))
	assert.Equal(t, 4, fetchSize(16, 10, 4), "a cap after answers too large")
	assert.Equal(t, 0, fetchSize(16, 16, 0))
	assert.Equal(t, 0, fetchSize(16, 17, 0), "never negative")
	assert.Equal(t, 6, topicFree(6, 0, 3), "no topic cap: the global count")
	assert.Equal(t, 2, topicFree(6, 5, 3), "the topic's cap")
	assert.Equal(t, 6, topicFree(6, 10, 3), "the smaller of the two")
	assert.Equal(t, 0, topicFree(6, 3, 3), "a full topic")

	sent := time.Now()
	assert.Equal(t, 700*time.Millisecond, idleWait(sent, sent.Add(300*time.Millisecond), time.Second))
	assert.Zero(t, idleWait(sent, sent.Add(2*time.Second), time.Second))
	assert.Zero(t, idleWait(sent, sent, 0))
	assert.True(t, pendingUntil(camunda7.ErrNotSent, sent, 20*time.Second).IsZero(), "a poll never sent is not pending")
	assert.Equal(t, sent.Add(20500*time.Millisecond), pendingUntil(camunda7.ErrUnknownOutcome, sent, 20*time.Second))
}

// One event, one count: Stats and the Observer are fed from the same ended event.
func TestStatsCountEachEndOnce(t *testing.T) {
	var s Stats
	for _, o := range Outcomes() {
		s.count(ended{outcome: o})
	}
	s.count(ended{outcome: OutcomeReportFailed, reportFailed: true})
	s.count(ended{outcome: OutcomeLockLost, reportFailed: true})
	assert.EqualValues(t, 1, s.Completed.Load())
	assert.EqualValues(t, 1, s.BPMNErrors.Load())
	assert.EqualValues(t, 1, s.Failures.Load())
	assert.EqualValues(t, 1, s.Incidents.Load())
	assert.EqualValues(t, 1, s.Deferred.Load())
	assert.EqualValues(t, 2, s.LockLost.Load())
	assert.EqualValues(t, 2, s.ReportErrors.Load())
	assert.Zero(t, s.Unlocked.Load(), "Unlocked counts unlock calls, not outcomes")
}

func TestOutcomeFailed(t *testing.T) {
	failed := map[Outcome]bool{OutcomeRetryable: true, OutcomeIncident: true, OutcomeLockLost: true, OutcomeReportFailed: true}
	for _, o := range Outcomes() {
		assert.Equal(t, failed[o], o.Failed(), "%s", o)
		assert.Equal(t, string(o), o.String())
	}
}
