// Package oracle checks the ledger invariants (docs/reliability.md, Invariants), the same
// way for the crash-point scenarios, the model-based test and the soak, and returns
// every violation it finds. Check looks at one business intent (I1, I4-I8): the fake
// provider's record, the ledger row and its events, and the engine's result. The others
// look at a whole run: CheckDigests (I2: every effect performed the request the ledger
// digested), CheckInstances with ReadEngine (I3: no lost instances) and ScanCanaries
// (I9: no canary secret in logs, ledger rows or engine state).
package oracle

import (
	"context"
	"fmt"
	"strings"

	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/idempotency"
)

// legal is the ledger's state machine; a self-edge is an event that changes nothing
// (a refused digest, a reconciliation still unknown).
var legal = map[[2]idempotency.State]bool{
	{"", idempotency.StatePrepared}:                              true,
	{idempotency.StatePrepared, idempotency.StateDispatched}:     true,
	{idempotency.StatePrepared, idempotency.StateConfirmed}:      true, // local-only effects
	{idempotency.StatePrepared, idempotency.StateOperatorHold}:   true, // too many attempts
	{idempotency.StateDispatched, idempotency.StateConfirmed}:    true,
	{idempotency.StateDispatched, idempotency.StateRejected}:     true,
	{idempotency.StateDispatched, idempotency.StateUnknown}:      true,
	{idempotency.StateDispatched, idempotency.StatePrepared}:     true, // certainly not sent
	{idempotency.StateDispatched, idempotency.StateOperatorHold}: true,
	{idempotency.StateUnknown, idempotency.StateReconciled}:      true,
	{idempotency.StateUnknown, idempotency.StateRejected}:        true,
	{idempotency.StateUnknown, idempotency.StatePrepared}:        true, // authoritative not found
	{idempotency.StateUnknown, idempotency.StateOperatorHold}:    true,
	{idempotency.StateUnknown, idempotency.StateConfirmed}:       true, // operator
	{idempotency.StateOperatorHold, idempotency.StateConfirmed}:  true, // operator
	{idempotency.StateOperatorHold, idempotency.StateRejected}:   true, // operator
	{idempotency.StateOperatorHold, idempotency.StatePrepared}:   true, // operator: retry
	{idempotency.StateConfirmed, idempotency.StateCompensated}:   true, // its compensating intent confirmed
	{idempotency.StateReconciled, idempotency.StateCompensated}:  true,
}

// Legal reports whether an event from -> to is a transition of the state machine.
func Legal(from, to idempotency.State) bool {
	return from == to || legal[[2]idempotency.State{from, to}]
}

// Expect is what one intent should have come to.
type Expect struct {
	Scope, Key string
	// Invoice names the provider's charges that belong to this intent.
	Invoice string
	// Declined: the provider declined it; else it was paid.
	Declined bool
	// EngineRef is the payment reference the engine completed the task with ("" when the
	// engine's side is not checked, or the path was a BPMN error).
	EngineRef string
	// MayHold: the provider may have left the intent undecidable (a 500 stored under its
	// key replays forever), so instead of paid it may end unknown or held for an
	// operator, but then only with an open incident on its instance (Incident): the
	// operator queue (I4: unknown at the end implies an incident; I8).
	MayHold bool
	// Incident: the intent's instance holds an open incident (read only with MayHold).
	Incident bool
}

// Check returns the violated invariants for one intent: I1 (at most one effect), I4
// (ledger and provider agree), I5 (ledger and engine agree), I6 (no dispatch after an
// unknown without an authoritative not-found), I7 (legal transitions, fencing tokens that
// never go back) and I8 (nothing left in flight, except for an operator). I2, I3 and I9
// look at a whole run at once: CheckDigests, CheckInstances and ScanCanaries.
func Check(ctx context.Context, l *idempotency.Operations, charges []fakeprovider.Charge, e Expect) []string {
	var v []string
	bad := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	var mine []fakeprovider.Charge
	for _, ch := range charges {
		if ch.Invoice == e.Invoice {
			mine = append(mine, ch)
		}
	}
	if len(mine) > 1 {
		bad("I1: %s charged %d times", e.Invoice, len(mine))
	}
	row, err := l.Get(ctx, e.Scope, e.Key)
	if err != nil {
		return append(v, fmt.Sprintf("I4: %s has no ledger row: %v", e.Key, err))
	}
	// A stored 500 may come before the provider evaluated the charge at all, so an
	// invoice meant to be declined can be held too (with no charge).
	held := e.MayHold && (row.State == idempotency.StateUnknown || row.State == idempotency.StateOperatorHold)
	switch {
	case held && !e.Incident:
		bad("I4: %s left %s without an incident on its instance", e.Key, row.State)
	case held && e.Declined && len(mine) != 0:
		bad("I4: declined %s is held but was charged %d times", e.Key, len(mine))
	case held:
		// The operator queue: whatever the provider did is for an operator to settle (at
		// most one effect, checked above).
	case e.Declined && (row.State != idempotency.StateRejected || len(mine) != 0):
		bad("I4: declined %s: ledger %s, %d charges", e.Key, row.State, len(mine))
	case !e.Declined && len(mine) != 1:
		bad("I4: paid %s has %d charges (ledger %s)", e.Key, len(mine), row.State)
	case !e.Declined && (row.ProviderRef == nil || *row.ProviderRef != mine[0].ID):
		bad("I4: %s: ledger ref %v, provider charge %s", e.Key, deref(row.ProviderRef), mine[0].ID)
	case !e.Declined && row.State != idempotency.StateConfirmed && row.State != idempotency.StateReconciled:
		bad("I4: paid %s is %s in the ledger", e.Key, row.State)
	}
	if !e.Declined && e.EngineRef != "" && row.ProviderRef != nil && *row.ProviderRef != e.EngineRef {
		bad("I5: the engine completed %s with %s, the ledger holds %s", e.Key, e.EngineRef, *row.ProviderRef)
	}
	if !row.State.Terminal() && row.State != idempotency.StateOperatorHold && !(held && e.Incident) {
		bad("I8: %s left %s", e.Key, row.State)
	}
	events, err := l.Events(ctx, e.Scope, e.Key)
	if err != nil {
		return append(v, fmt.Sprintf("I7: events of %s: %v", e.Key, err))
	}
	unknown, attempt := false, 0
	for _, ev := range events {
		from := idempotency.State("")
		if ev.FromState != nil {
			from = idempotency.State(*ev.FromState)
		}
		if !Legal(from, ev.ToState) {
			bad("I7: %s: illegal transition %s -> %s (%s)", e.Key, from, ev.ToState, ev.Reason)
		}
		if ev.Attempt < attempt && !strings.HasPrefix(ev.Actor, "operator:") {
			bad("I7: %s: attempt went back from %d to %d", e.Key, attempt, ev.Attempt)
		}
		attempt = max(attempt, ev.Attempt)
		switch {
		case ev.ToState == idempotency.StateUnknown:
			unknown = true
		case ev.ToState == idempotency.StatePrepared && strings.Contains(ev.Reason, "no record"):
			unknown = false
		case ev.ToState == idempotency.StateDispatched && unknown:
			bad("I6: %s dispatched again after unknown without an authoritative not-found", e.Key)
		}
	}
	return v
}

func deref(s *string) string {
	if s == nil {
		return "<none>"
	}
	return *s
}
