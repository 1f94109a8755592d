package idempotency

import "context"

// store is where a Ledger keeps its intents: PostgreSQL (pgStore, New) or memory
// (memStore, NewInMemory). Do's steps (attempt.go) are written once over it; every write
// is a compare-and-set on the intent's state and attempt that appends its event, and
// reports its transitions to the attempt (transitioned, committed).
type store interface {
	// claim records the intent if it is new and takes its lease for a, as decideClaim
	// decides: it sets a.row (and a.claimed, a.leaseEnd, a.dbNow and a.readAt), and
	// returns the refusal (claimRefusal, a pruned intent's, a hold's) or nil.
	claim(ctx context.Context, a *attempt) error
	// move changes the intent from from to to at a's attempt, setting what ch says, and
	// appends the event (reason); ErrFenced if the intent is not in from at that attempt.
	// It releases the lease when to is not prepared or dispatched.
	move(ctx context.Context, a *attempt, from, to State, reason string, ch change) error
	// confirm moves the intent to to with the result (values is res.Values as JSON), runs
	// Effect.Local, and marks the intent it compensates, all or nothing.
	confirm(ctx context.Context, a *attempt, from, to State, res Result, values []byte, reason string) error
	// inconclusive records a reconciliation that settled nothing (counted: 1 if it counts
	// towards MaxReconciliations) and releases the lease.
	inconclusive(ctx context.Context, a *attempt, counted int) error
	// releaseLease gives up a's lease if it still holds it.
	releaseLease(ctx context.Context, a *attempt)
	// compensated returns the id of the intent in.Compensates names, which must be
	// confirmed, reconciled, or already compensated (by in, on a replay).
	compensated(ctx context.Context, l *Ledger, in Intent) (*int64, error)
}

// change is what a transition sets besides the state.
type change struct {
	// dispatchMark counts a dispatch: dispatches + 1, first_dispatched_at if unset,
	// last_dispatched_at now.
	dispatchMark bool
	// undoDispatchMark takes back a dispatch mark whose request never left.
	undoDispatchMark bool
	// errorCode and errorMessage, when set, are recorded (a decline, a hold's reason).
	errorCode, errorMessage *string
	// result, when set, records a confirmed effect's result.
	result *storedResult
	// reconciled counts an inconclusive reconciliation: reconciliations + 1 (the one
	// that reached MaxReconciliations and holds the intent).
	reconciled bool
}

// storedResult is a Result as a confirm records it: the provider's reference and the
// values as JSON.
type storedResult struct {
	providerRef string
	values      []byte
}

// leaseKept reports whether an intent moving to to keeps its lease (it is still in
// flight in this attempt).
func leaseKept(to State) bool { return to == StateDispatched || to == StatePrepared }
