package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// State is where an intent is in its lifecycle.
type State string

// The lifecycle: prepared -> dispatched -> confirmed | rejected | unknown;
// unknown -> reconciled (found) | prepared (authoritatively not found) | operator_hold;
// operator_hold -> confirmed | rejected by an operator. Compensation is a new intent.
const (
	StatePrepared     State = "prepared"
	StateDispatched   State = "dispatched"
	StateConfirmed    State = "confirmed"
	StateRejected     State = "rejected"
	StateUnknown      State = "unknown"
	StateReconciled   State = "reconciled"
	StateCompensated  State = "compensated"
	StateOperatorHold State = "operator_hold"
)

// VerdictClose is an operator's closing verdict on an orphaned intent (Resolution.As):
// the orphan has been dealt with outside the ledger (compensated, refunded by hand, or
// accepted), so it leaves the orphan queue. The intent keeps its state; it is never a
// state an intent takes. Like every verdict on an orphan it needs a second operator.
const VerdictClose State = "closed"

// Terminal reports whether no attempt will ever change the intent again (only an
// operator can): Do returns what a terminal intent settled as (the recorded outcome, the
// recorded decline, or ErrCompensated) and never dispatches it again.
func (s State) Terminal() bool {
	switch s {
	case StateConfirmed, StateRejected, StateReconciled, StateCompensated:
		return true
	}
	return false
}

// Intent names one side effect of one business command.
type Intent struct {
	// Scope is the kind of effect, e.g. "payment.collect".
	Scope string
	// Key identifies the business command deterministically: invoice id, recipient,
	// semantic version. Never a random value, and never a task id or attempt number alone:
	// every delivery of the same command must compute the same key.
	Key string
	// Request is what would be sent; only its canonical digest is stored. The same key
	// with a different digest is refused (ErrDigestMismatch) and nothing is sent.
	Request any
	// Task identifies who acts, for the ledger's audit trail.
	Task TaskRef
	// Amount is the money the effect moves, in minor units (cents), if it moves any: an
	// operator's verdict that declares it moved (or sends it again) needs a second
	// operator when it is above the namespace's threshold (SetApprovalThreshold), not
	// given (0), or negative.
	Amount int64
	// Compensates names the intent whose effect this one undoes (a refund for a charge).
	// That intent must be confirmed or reconciled; when this one confirms, it becomes
	// compensated in the same transaction, and is never dispatched again. This intent
	// has its own key, request digest and lifecycle.
	Compensates IntentRef
}

// IntentRef names a recorded intent.
type IntentRef struct {
	Scope, Key string
}

// TaskRef is the engine's view of the attempt, as plain values (the ledger knows nothing
// of Camunda).
type TaskRef struct {
	Actor             string // the worker id
	TaskID            string
	ProcessInstanceID string
	BusinessKey       string
}

// Result is what a confirmed effect leaves in the ledger: the provider's reference and
// the values the task completes with. No request or response bodies, no secrets.
//
// Values are stored as JSON: a Receipt returns them decoded from JSON (an object as
// map[string]any, an array as []any, a number as float64, so an integer beyond 2^53
// such as 9007199254740993 comes back rounded: pass it as a string; a number float64
// cannot hold, such as 1E700, comes back as a json.Number). A value JSON cannot encode
// (a NaN or an infinity, a channel, a func, a json.Number that is no number) is left out
// of what is stored, named in the intent's event and logged: the provider has acted, so
// the intent is confirmed, never failed for its values, and the Receipt (the first as
// every replay) has the other values. Text PostgreSQL
// cannot store (a NUL byte, invalid UTF-8), in ProviderRef, in Values' strings and keys,
// and in a Rejection's code and message, is recorded with each such byte or sequence
// replaced by U+FFFD, and returned so by Do.
type Result struct {
	ProviderRef string
	Values      map[string]any
}

// Effect is how to perform and check one side effect.
type Effect struct {
	// Dispatch performs the effect, sending providerKey as the provider's
	// Idempotency-Key. It returns the result, a *Rejection (Rejected) for a definitive
	// decline, an error wrapped with NotSent when the request certainly did not leave, a
	// failure.Permanent error when the provider refused it without acting (operator
	// hold), or any other error when the outcome is unknown (the request may have been
	// acted on; the intent becomes unknown). Nil for a purely local effect (Local only).
	Dispatch func(ctx context.Context, providerKey string) (Result, error)
	// Reconcile asks the provider what became of an unknown dispatch: by key, by
	// reference, or by business search. Nil: unknown intents go to operator hold.
	Reconcile func(ctx context.Context, q Query) (Reconciliation, error)
	// Search looks an unknown dispatch up by business key (invoice, order) rather than by
	// the provider key. The ledger asks it when Reconcile cannot be trusted: once the
	// first dispatch is older than Config.ProviderWindow (the provider may have forgotten
	// the key, so "not found by key" means nothing and a same-key resend would make a new
	// effect), or when there is no Reconcile. Nil: such intents go to operator hold.
	Search func(ctx context.Context, q Query) (Reconciliation, error)
	// SearchLag is how long the provider's search index may lag behind its writes. An
	// Absent from Search is trusted only once SearchLag has passed since the last
	// dispatch, by the database's clock when Search was asked; before that it counts as
	// StillUnknown, retried when the lag has passed.
	SearchLag time.Duration
	// Local runs in the transaction that confirms the intent, so local business state and
	// the ledger commit together or not at all.
	Local func(ctx context.Context, tx pgx.Tx, r Result) error
	// OnRejected turns a decline into the handler's error. Default: a BPMN error with the
	// rejection's code and message.
	OnRejected func(*Rejection) error
	// Timeout is the longest one provider call of Dispatch, Reconcile or Search takes
	// before it gives up: its client's timeout (httpeffect sets it from Spec.Timeout). Do
	// refuses, before anything is written or sent, an effect whose Timeout the ledger's
	// lease cannot leave whole (ErrLeaseTooShort, a permanent failure). 0: not checked.
	Timeout time.Duration
}

// Query is what Reconcile gets to look an effect up.
type Query struct {
	Scope, Key        string
	ProviderKey       string
	ProviderRef       string // when a previous answer carried one
	FirstDispatchedAt time.Time
	LastDispatchedAt  time.Time
	// BusinessKey is the task's business key, for Search.
	BusinessKey string
}

// Reconciliation is the provider's answer about an unknown dispatch; build it with
// Found, Absent, StillUnknown, ReconciledRejected or Hold.
type Reconciliation struct {
	kind      reconKind
	result    Result
	rejection *Rejection
	reason    string
}

type reconKind int

const (
	reconStillUnknown reconKind = iota
	reconFound
	reconAbsent
	reconRejected
	reconHold
)

// reconResults name the kinds as Observer.Reconciled reports them.
var reconResults = [...]string{reconStillUnknown: "still-unknown", reconFound: "found", reconAbsent: "absent",
	reconRejected: "rejected", reconHold: "hold"}

// Found: the provider has the effect; the intent becomes reconciled with this result.
func Found(r Result) Reconciliation { return Reconciliation{kind: reconFound, result: r} }

// Absent: the provider authoritatively has no such effect (within its idempotency
// window and past its index lag); dispatching again with the same key is allowed.
func Absent() Reconciliation { return Reconciliation{kind: reconAbsent} }

// StillUnknown: the provider cannot tell yet; reconciliation is retried with backoff and
// ends in operator hold past the limit.
func StillUnknown(reason string) Reconciliation {
	return Reconciliation{kind: reconStillUnknown, reason: reason}
}

// ReconciledRejected: the provider has the request, and declined it.
func ReconciledRejected(code, message string) Reconciliation {
	return Reconciliation{kind: reconRejected, rejection: &Rejection{Code: code, Message: message}}
}

// Hold: the provider's answer settles nothing an automaton may act on (it stored a
// failure under the key, so the key can only ever replay it; it reports a state the
// effect has no rule for): the intent goes to operator hold at once, with reason.
func Hold(reason string) Reconciliation { return Reconciliation{kind: reconHold, reason: reason} }

// Rejection is a provider's definitive decline (card declined, recipient unknown).
type Rejection struct {
	Code    string
	Message string
}

func (r *Rejection) Error() string {
	return fmt.Sprintf("rejected by the provider: %s: %s", r.Code, r.Message)
}

// Rejected returns a *Rejection for Dispatch to return.
func Rejected(code, message string) error { return &Rejection{Code: code, Message: message} }

// notSent marks a dispatch error as certainly not sent.
type notSent struct{ err error }

func (e *notSent) Error() string { return "not sent: " + e.err.Error() }
func (e *notSent) Unwrap() error { return e.err }

// NotSent marks a Dispatch error as certainly not sent (connection refused, a 429 or a
// 4xx the provider did not store): the intent goes back to prepared and may be sent again.
// If err (or an error it wraps) has a RetryAfter() time.Duration method, as a 429 with
// Retry-After should, the task's retry waits at least that long.
func NotSent(err error) error { return &notSent{err} }

// IsNotSent reports whether err was marked with NotSent.
func IsNotSent(err error) bool {
	var ns *notSent
	return errors.As(err, &ns)
}

// Sentinel errors, wrapped in the failure outcome Do returns.
var (
	ErrDigestMismatch = errors.New("idempotency: same intent key, different request")
	ErrInProgress     = errors.New("idempotency: intent in progress in another attempt")
	ErrUnknownOutcome = errors.New("idempotency: outcome of the dispatch is unknown")
	ErrOperatorHold   = errors.New("idempotency: intent held for an operator")
	ErrTooManyTries   = errors.New("idempotency: too many attempts without an outcome")
	ErrFenced         = errors.New("idempotency: another attempt took the intent over")
	// ErrKeyRefused: Dispatch returned a permanent error (failure.Permanent), e.g. the
	// provider holds the key for a different request; the intent goes to an operator.
	ErrKeyRefused = errors.New("idempotency: the provider refused the request under this key")
	// ErrCancelled: the handler's context ended before the request left, so the attempt
	// sent nothing; the error also wraps context.Cause of that context. The intent stays
	// where the next attempt proceeds from.
	ErrCancelled = errors.New("idempotency: attempt cancelled before dispatch; nothing was sent")
	// ErrCompensated: the intent's effect was performed and then undone by a compensating
	// intent; it is never dispatched again (doing it again is a new intent, with a new key).
	ErrCompensated = errors.New("idempotency: intent compensated")
	// ErrNothingToCompensate: Intent.Compensates names an intent that does not exist or
	// whose effect is not confirmed; nothing was sent.
	ErrNothingToCompensate = errors.New("idempotency: no confirmed intent to compensate")
	// ErrCompensationExists: Intent.Compensates names an intent that another compensating
	// intent already compensates, or is compensating (recorded, in flight, unknown or
	// held: from the moment it is recorded), so this one is refused before anything is
	// sent: one original is undone once (no double refund). Only a compensating intent
	// that was declined (rejected) lets another one try. The same compensating intent
	// replaying is not refused.
	ErrCompensationExists = errors.New("idempotency: the intent is already compensated by another intent")
	// ErrPruned: the intent settled long ago and was pruned; its tombstone refuses to
	// dispatch it again. Nothing was sent.
	ErrPruned = errors.New("idempotency: intent settled and pruned")
)

// Receipt is a confirmed (or reconciled) intent.
type Receipt struct {
	State       State
	ProviderKey string
	ProviderRef string
	Values      map[string]any
	// Replayed: the result came from the ledger; the provider was not called this time.
	Replayed bool
	Attempt  int
}
