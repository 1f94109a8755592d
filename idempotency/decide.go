package idempotency

import (
	"errors"
	"fmt"
	"time"

	"github.com/extworker/extworker/failure"
)

// This file holds the ledger's decisions as functions of plain values: what a claim does
// with the intent's stored row, what a provider's answer to a dispatch means, and what a
// reconciliation's answer leads to. The attempt (attempt.go) and the stores
// (store_pg.go, store_memory.go) carry them out; decide_test.go drives them alone.

// claimRequest is what an attempt brings to the claim of an intent.
type claimRequest struct {
	digest string // the request's digest
	// dispatch: the effect has a Dispatch, so a claim of a prepared intent marks it
	// dispatched in the same commit.
	dispatch          bool
	lease             time.Duration // Config.Lease
	inProgressBackoff time.Duration // Config.InProgressBackoff
	maxAttempts       int           // Config.MaxAttempts
}

// claimKind is what a claim does.
type claimKind int

const (
	claimRecord       claimKind = iota // no row: record the intent, claimed by this attempt
	claimMismatch                      // recorded with another request digest: refuse, send nothing
	claimSettled                       // terminal: replay what it settled as
	claimHeld                          // operator hold: refuse with the hold
	claimWait                          // another attempt's lease is live: back off
	claimTooManyTries                  // too many attempts ended without releasing it: hold it
	claimTake                          // take the lease for this attempt (fencing the previous one off)
)

// claimDecision is what decideClaim decides.
type claimDecision struct {
	kind claimKind
	// to is the state the intent is recorded in (claimRecord) or moves to when taken
	// (claimTake; the row's own state when the claim is not a transition).
	to State
	// reason is the event of a claim that moves the intent ("" when to is the row's state).
	reason string
	// abandoned is 1 when the previous attempt ended without releasing the intent (its
	// lease ran out, or it died after the dispatched mark), counted towards MaxAttempts.
	abandoned int
	// attempts is, for claimTooManyTries, how many attempts were abandoned.
	attempts int
	// leaseLeft is, for claimWait, how long the other attempt's lease still runs, and wait
	// how long this attempt backs off (at most InProgressBackoff).
	leaseLeft, wait time.Duration
}

// decideClaim decides the claim of an intent whose stored row is row (nil: not
// recorded) at now, on the clock that wrote the row's lease.
func decideClaim(row *Row, req claimRequest, now time.Time) claimDecision {
	if row == nil {
		if req.dispatch {
			return claimDecision{kind: claimRecord, to: StateDispatched}
		}
		return claimDecision{kind: claimRecord, to: StatePrepared}
	}
	switch {
	case row.Digest != req.digest:
		return claimDecision{kind: claimMismatch}
	case row.State.Terminal():
		return claimDecision{kind: claimSettled}
	case row.State == StateOperatorHold:
		return claimDecision{kind: claimHeld}
	case row.LeaseUntil != nil && row.LeaseUntil.After(now):
		left := row.LeaseUntil.Sub(now)
		return claimDecision{kind: claimWait, leaseLeft: left, wait: min(left, req.inProgressBackoff)}
	}
	// The previous attempt ended without releasing the intent (its lease ran out, or it
	// died after the dispatched mark): it may have dispatched, or died. Attempts that
	// ended cleanly (not sent, cancelled, waiting to reconcile) released it and do not
	// count.
	d := claimDecision{kind: claimTake, to: row.State}
	if row.Attempt > 0 && (row.LeaseUntil != nil || row.State == StateDispatched) {
		d.abandoned = 1
	}
	if n := row.AbandonedAttempts + d.abandoned; n >= req.maxAttempts {
		return claimDecision{kind: claimTooManyTries, attempts: n}
	}
	switch {
	case row.State == StateDispatched:
		d.to, d.reason = StateUnknown, fmt.Sprintf("attempt %d ended after dispatch without recording an outcome", row.Attempt)
	case row.State == StatePrepared && req.dispatch:
		// Claim and mark dispatched in one commit: it is still committed before the
		// request leaves, one transaction sooner.
		d.to, d.reason = StateDispatched, "dispatching with the provider key"
	}
	return d
}

// tooManyTriesReason is the hold's reason for claimTooManyTries.
func tooManyTriesReason(n int) string {
	return fmt.Sprintf("%d attempts took this intent and ended without an outcome or releasing it (workers dying or losing their locks)", n)
}

// dispatchVerdict is what a provider's answer to a dispatch means.
type dispatchVerdict int

const (
	dispatchConfirmed  dispatchVerdict = iota // answered: the effect happened
	dispatchRejected                          // a definitive decline (*Rejection)
	dispatchKeyRefused                        // refused outright without acting (failure.Permanent): operator hold
	dispatchNotSent                           // certainly not sent (NotSent): back to prepared
	dispatchUnknown                           // anything else: the outcome is unknown
)

// dispatchResults name the verdicts on the provider call's span.
var dispatchResults = [...]string{dispatchConfirmed: "answered", dispatchRejected: "declined", dispatchKeyRefused: "refused",
	dispatchNotSent: "not-sent", dispatchUnknown: "unknown"}

// classifyDispatch reads Effect.Dispatch's error: its verdict, the decline (for
// dispatchRejected) and how long the provider asked to wait (for dispatchNotSent: a
// RetryAfter() method anywhere in the chain, as a 429 with Retry-After has).
func classifyDispatch(derr error) (v dispatchVerdict, rej *Rejection, retryAfter time.Duration) {
	switch {
	case derr == nil:
		return dispatchConfirmed, nil, 0
	case errors.As(derr, &rej):
		return dispatchRejected, rej, 0
	case failure.Classify(derr).Kind == failure.KindPermanent:
		return dispatchKeyRefused, nil, 0
	case IsNotSent(derr):
		var ra interface{ RetryAfter() time.Duration }
		if errors.As(derr, &ra) {
			retryAfter = max(ra.RetryAfter(), 0)
		}
		return dispatchNotSent, nil, retryAfter
	}
	return dispatchUnknown, nil, 0
}

// lookupPlan is which lookup a reconciliation asks.
type lookupPlan struct {
	bySearch   bool // Effect.Search, not Effect.Reconcile
	none       bool // neither can be trusted: operator hold
	pastWindow bool // the first dispatch is older than the provider's key window
}

// planLookup decides how an unknown dispatch is looked up. Within the provider's
// idempotency window the effect's Reconcile (by key) is asked; past it, a "not found by
// key" proves nothing (the provider may have forgotten the key, and a same-key resend
// would make a second effect), so only Search (by business key) is asked. The age is
// measured at now on the clock that wrote firstDispatched.
func planLookup(hasReconcile, hasSearch bool, firstDispatched *time.Time, now time.Time, window time.Duration) lookupPlan {
	p := lookupPlan{pastWindow: firstDispatched != nil && now.Sub(*firstDispatched) > window}
	if p.pastWindow || !hasReconcile {
		p.bySearch = true
		p.none = !hasSearch
	}
	return p
}

// reconAnswer is what a reconciliation's lookup returned, and what it is judged against.
type reconAnswer struct {
	rec      Reconciliation
	err      error // the lookup failed: still unknown
	bySearch bool
	// searchLag is Effect.SearchLag, sinceDispatch the time from the last dispatch to when
	// the lookup was asked: a search's "not found" within the lag proves nothing yet.
	searchLag, sinceDispatch time.Duration
	// reconciliations is how many ended still unknown before this one.
	reconciliations int
}

// reconDecision is what a reconciliation leads to.
type reconDecision struct {
	rec Reconciliation // the answer as judged (a lookup error or a not-found within the lag: still unknown)
	// hold: MaxReconciliations reached without an answer (reason is the hold's).
	hold   bool
	reason string
	// For a still-unknown answer: counted (0 or 1) is what it adds to the row's
	// reconciliations, n the reconciliation's number, backoff the wait before the next.
	counted, n int
	backoff    time.Duration
}

// judgeReconciliation decides what an answer to a reconciliation leads to, with at most
// maxRecon inconclusive answers and a backoff doubling from backoff.
func judgeReconciliation(ans reconAnswer, maxRecon int, backoff time.Duration) reconDecision {
	d := reconDecision{rec: ans.rec}
	if ans.err != nil {
		d.rec = StillUnknown(ans.err.Error())
	}
	var lagLeft time.Duration
	if ans.bySearch && d.rec.kind == reconAbsent && ans.sinceDispatch < ans.searchLag {
		lagLeft = ans.searchLag - ans.sinceDispatch
		d.rec = StillUnknown(fmt.Sprintf("search found nothing, but the last dispatch was %v ago, within the search index lag of %v",
			ans.sinceDispatch.Round(time.Millisecond), ans.searchLag))
	}
	if d.rec.kind != reconStillUnknown {
		return d
	}
	// Waiting out the index lag is not an inconclusive answer: it does not count towards
	// MaxReconciliations (the lag bounds it).
	d.n, d.counted = ans.reconciliations+1, 1
	if lagLeft > 0 {
		d.n, d.counted = ans.reconciliations, 0
	}
	if d.counted == 1 && d.n >= maxRecon {
		d.hold, d.reason = true, fmt.Sprintf("still unknown after %d reconciliations: %s", d.n, d.rec.reason)
		return d
	}
	d.backoff = max(backoff<<min(max(d.n-1, 0), 10), lagLeft)
	return d
}
