package idempotency

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/extworker/extworker/failure"
)

// The claim's decision, from the stored row alone: no database.
func TestDecideClaim(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	live, expired := now.Add(30*time.Second), now.Add(-time.Second)
	req := claimRequest{digest: "d1", dispatch: true, lease: time.Minute, inProgressBackoff: time.Second, maxAttempts: 3}
	local := req
	local.dispatch = false
	row := func(state State, attempt int, lease *time.Time, abandoned int) *Row {
		return &Row{Digest: "d1", State: state, Attempt: attempt, LeaseUntil: lease, AbandonedAttempts: abandoned}
	}
	for _, tc := range []struct {
		name string
		row  *Row
		req  claimRequest
		want claimDecision
	}{
		{"new intent with a dispatch: recorded dispatched", nil, req, claimDecision{kind: claimRecord, to: StateDispatched}},
		{"new local intent: recorded prepared", nil, local, claimDecision{kind: claimRecord, to: StatePrepared}},
		{"another request under the key: refused", &Row{Digest: "d2", State: StateConfirmed}, req, claimDecision{kind: claimMismatch}},
		{"mismatch wins over a live lease", &Row{Digest: "d2", State: StateDispatched, LeaseUntil: &live}, req, claimDecision{kind: claimMismatch}},
		{"confirmed: replayed", row(StateConfirmed, 1, nil, 0), req, claimDecision{kind: claimSettled}},
		{"rejected: replayed", row(StateRejected, 1, nil, 0), req, claimDecision{kind: claimSettled}},
		{"reconciled: replayed", row(StateReconciled, 2, nil, 0), req, claimDecision{kind: claimSettled}},
		{"compensated: settled", row(StateCompensated, 1, nil, 0), req, claimDecision{kind: claimSettled}},
		{"operator hold: refused", row(StateOperatorHold, 2, nil, 0), req, claimDecision{kind: claimHeld}},
		{"live lease: wait at most the backoff", row(StateDispatched, 1, &live, 0), req,
			claimDecision{kind: claimWait, leaseLeft: 30 * time.Second, wait: time.Second}},
		{"lease ending sooner than the backoff: wait it out", row(StateDispatched, 1, ptr(now.Add(200*time.Millisecond)), 0), req,
			claimDecision{kind: claimWait, leaseLeft: 200 * time.Millisecond, wait: 200 * time.Millisecond}},
		{"lease ending exactly now: taken over", row(StateUnknown, 1, ptr(now), 0), req,
			claimDecision{kind: claimTake, to: StateUnknown, abandoned: 1}},
		{"expired lease after the dispatched mark: taken over as unknown", row(StateDispatched, 1, &expired, 0), req,
			claimDecision{kind: claimTake, to: StateUnknown, abandoned: 1, reason: "attempt 1 ended after dispatch without recording an outcome"}},
		{"dispatched without a lease (a crash's lease released): unknown, abandoned", row(StateDispatched, 2, nil, 0), req,
			claimDecision{kind: claimTake, to: StateUnknown, abandoned: 1, reason: "attempt 2 ended after dispatch without recording an outcome"}},
		{"released prepared: marked dispatched with the claim, not abandoned", row(StatePrepared, 1, nil, 0), req,
			claimDecision{kind: claimTake, to: StateDispatched, reason: "dispatching with the provider key"}},
		{"released prepared, local effect: claimed as it is", row(StatePrepared, 1, nil, 0), local,
			claimDecision{kind: claimTake, to: StatePrepared}},
		{"released unknown: claimed to reconcile", row(StateUnknown, 3, nil, 2), req,
			claimDecision{kind: claimTake, to: StateUnknown}},
		{"expired prepared lease: abandoned, marked dispatched", row(StatePrepared, 1, &expired, 0), req,
			claimDecision{kind: claimTake, to: StateDispatched, abandoned: 1, reason: "dispatching with the provider key"}},
		{"the abandoned attempt that reaches MaxAttempts: hold", row(StateDispatched, 3, &expired, 2), req,
			claimDecision{kind: claimTooManyTries, attempts: 3}},
		{"past MaxAttempts by released attempts alone: hold", row(StateUnknown, 5, nil, 3), req,
			claimDecision{kind: claimTooManyTries, attempts: 3}},
		{"one short of MaxAttempts: taken", row(StateDispatched, 2, &expired, 1), req,
			claimDecision{kind: claimTake, to: StateUnknown, abandoned: 1, reason: "attempt 2 ended after dispatch without recording an outcome"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, decideClaim(tc.row, tc.req, now))
		})
	}
}

func ptr[T any](v T) *T { return &v }

type retryAfterErr struct{ d time.Duration }

func (e retryAfterErr) Error() string             { return "429" }
func (e retryAfterErr) RetryAfter() time.Duration { return e.d }

func TestClassifyDispatch(t *testing.T) {
	rej := &Rejection{Code: "card_declined", Message: "no"}
	for _, tc := range []struct {
		name       string
		err        error
		want       dispatchVerdict
		rej        *Rejection
		retryAfter time.Duration
	}{
		{"answered", nil, dispatchConfirmed, nil, 0},
		{"declined, wrapped", fmt.Errorf("provider: %w", rej), dispatchRejected, rej, 0},
		{"refused outright", failure.Permanent(errors.New("key held for another request")), dispatchKeyRefused, nil, 0},
		{"certainly not sent", NotSent(errors.New("connection refused")), dispatchNotSent, nil, 0},
		{"not sent with Retry-After", NotSent(retryAfterErr{3 * time.Second}), dispatchNotSent, nil, 3 * time.Second},
		{"not sent with a negative Retry-After", NotSent(retryAfterErr{-time.Second}), dispatchNotSent, nil, 0},
		{"a timeout after the request was written", errors.New("read timeout"), dispatchUnknown, nil, 0},
		{"a Retry-After without NotSent is still unknown", retryAfterErr{time.Second}, dispatchUnknown, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, rej, ra := classifyDispatch(tc.err)
			assert.Equal(t, tc.want, v)
			assert.Equal(t, tc.rej, rej)
			assert.Equal(t, tc.retryAfter, ra)
		})
	}
}

func TestPlanLookup(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	young, old := now.Add(-time.Hour), now.Add(-25*time.Hour)
	for _, tc := range []struct {
		name              string
		reconcile, search bool
		first             *time.Time
		want              lookupPlan
	}{
		{"within the window: by key", true, true, &young, lookupPlan{}},
		{"never dispatched: by key", true, false, nil, lookupPlan{}},
		{"past the window: only search", true, true, &old, lookupPlan{bySearch: true, pastWindow: true}},
		{"past the window without Search: nobody to ask", true, false, &old, lookupPlan{bySearch: true, none: true, pastWindow: true}},
		{"no Reconcile: search", false, true, &young, lookupPlan{bySearch: true}},
		{"neither: nobody to ask", false, false, &young, lookupPlan{bySearch: true, none: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, planLookup(tc.reconcile, tc.search, tc.first, now, 24*time.Hour))
		})
	}
}

func TestJudgeReconciliation(t *testing.T) {
	found := Found(Result{ProviderRef: "ch_1"})
	for _, tc := range []struct {
		name string
		ans  reconAnswer
		want reconDecision
	}{
		{"found", reconAnswer{rec: found}, reconDecision{rec: found}},
		{"absent by key", reconAnswer{rec: Absent()}, reconDecision{rec: Absent()}},
		{"absent by search past the lag", reconAnswer{rec: Absent(), bySearch: true, searchLag: time.Second, sinceDispatch: 2 * time.Second},
			reconDecision{rec: Absent()}},
		{"absent by search within the lag: waits the rest, not counted",
			reconAnswer{rec: Absent(), bySearch: true, searchLag: 10 * time.Second, sinceDispatch: 4 * time.Second},
			reconDecision{rec: StillUnknown("search found nothing, but the last dispatch was 4s ago, within the search index lag of 10s"),
				backoff: 6 * time.Second}},
		{"absent by search within the lag at the limit: not held",
			reconAnswer{rec: Absent(), bySearch: true, searchLag: 10 * time.Second, sinceDispatch: 4 * time.Second, reconciliations: 4},
			reconDecision{rec: StillUnknown("search found nothing, but the last dispatch was 4s ago, within the search index lag of 10s"),
				n: 4, backoff: 16 * time.Second}},
		{"still unknown: counted, backoff doubles", reconAnswer{rec: StillUnknown("busy"), reconciliations: 2},
			reconDecision{rec: StillUnknown("busy"), n: 3, counted: 1, backoff: 8 * time.Second}},
		{"a failed lookup is still unknown", reconAnswer{err: errors.New("503")},
			reconDecision{rec: StillUnknown("503"), n: 1, counted: 1, backoff: 2 * time.Second}},
		{"the last allowed: hold", reconAnswer{rec: StillUnknown("busy"), reconciliations: 4},
			reconDecision{rec: StillUnknown("busy"), n: 5, counted: 1, hold: true, reason: "still unknown after 5 reconciliations: busy"}},
		{"hold asked by the provider", reconAnswer{rec: Hold("stored a failure")}, reconDecision{rec: Hold("stored a failure")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, judgeReconciliation(tc.ans, 5, 2*time.Second))
		})
	}
}
