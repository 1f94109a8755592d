package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"pgregory.net/rapid"

	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/oracle"
)

// scriptedProvider honours idempotency keys and fails as the model says.
type scriptedProvider struct {
	mu      sync.Mutex
	effects map[string]string
	next    string // ok | lost (charged, answer lost) | drop (not charged, ambiguous) | notsent | decline
	lookup  string // answer | unknown
}

func (p *scriptedProvider) dispatch(_ context.Context, key string) (idempotency.Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch p.next {
	case "notsent":
		return idempotency.Result{}, idempotency.NotSent(errors.New("connection refused"))
	case "drop":
		return idempotency.Result{}, errors.New("reset before accept")
	case "decline":
		if _, ok := p.effects[key]; !ok {
			return idempotency.Result{}, idempotency.Rejected("DECLINED", "no")
		}
	}
	ref, ok := p.effects[key]
	if !ok {
		ref = fmt.Sprintf("ch_%d", len(p.effects)+1)
		p.effects[key] = ref
	}
	if p.next == "lost" {
		return idempotency.Result{}, errors.New("timeout after send")
	}
	return idempotency.Result{ProviderRef: ref, Values: map[string]any{"ref": ref}}, nil
}

func (p *scriptedProvider) reconcile(_ context.Context, q idempotency.Query) (idempotency.Reconciliation, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lookup == "unknown" {
		return idempotency.StillUnknown("search lagging"), nil
	}
	if ref, ok := p.effects[q.ProviderKey]; ok {
		return idempotency.Found(idempotency.Result{ProviderRef: ref, Values: map[string]any{"ref": ref}}), nil
	}
	return idempotency.Absent(), nil
}

// TestLedgerStateMachine drives random sequences of attempts, provider behaviours and
// operator resolutions through the real ledger and checks after each step: at most one
// provider effect per intent, only legal transitions (replayed from the events), a
// settled intent never changes, and a confirmed one always carries the provider's charge.
func TestLedgerStateMachine(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t, idempotency.Config{MaxReconciliations: 3, MaxAttempts: 6, ReconcileBackoff: 1, ApprovalThreshold: 1000})
	ctx := context.Background()
	run := 0
	rapid.Check(t, func(rt *rapid.T) {
		run++
		p := &scriptedProvider{effects: map[string]string{}}
		in := intent(fmt.Sprintf("MODEL-%d-%s", run, l.Namespace()), 100)
		in.Amount = 100 // under the approval threshold: one operator resolves it
		eff := idempotency.Effect{Dispatch: p.dispatch, Reconcile: p.reconcile}
		var settled idempotency.State
		steps := rapid.IntRange(1, 12).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			switch op := rapid.SampledFrom([]string{"attempt", "attempt", "attempt", "resolve"}).Draw(rt, "op"); op {
			case "attempt":
				p.mu.Lock()
				p.next = rapid.SampledFrom([]string{"ok", "lost", "drop", "notsent", "decline"}).Draw(rt, "dispatch")
				p.lookup = rapid.SampledFrom([]string{"answer", "answer", "unknown"}).Draw(rt, "lookup")
				p.mu.Unlock()
				out, err := l.Do(ctx, in, eff)
				if err == nil && out.ProviderRef != p.effects[idempotency.ProviderKey(l.Namespace(), in.Scope, in.Key)] {
					rt.Fatalf("outcome ref %q, provider has %q", out.ProviderRef, p.effects)
				}
				if err != nil && failure.Classify(err).Kind == failure.KindNone {
					rt.Fatalf("an error classified as success: %v", err)
				}
			case "resolve":
				r, err := l.Operations().Get(ctx, in.Scope, in.Key)
				if err != nil || (r.State != idempotency.StateOperatorHold && r.State != idempotency.StateUnknown) {
					continue
				}
				ref, ok := p.effects[r.ProviderKey]
				res := idempotency.Resolution{As: idempotency.StateRejected, Reason: "checked", Operator: "model"}
				if !ok && rapid.Bool().Draw(rt, "retry") {
					res.As = idempotency.StatePrepared // the provider never got it: send it again
				}
				if ok {
					res = idempotency.Resolution{As: idempotency.StateConfirmed, ProviderRef: ref, Reason: "checked", Operator: "model"}
				}
				if _, err := l.Operations().Resolve(ctx, in.Scope, in.Key, res); err != nil {
					rt.Fatalf("resolve: %v", err)
				}
			}
			if len(p.effects) > 1 {
				rt.Fatalf("%d provider effects for one intent", len(p.effects))
			}
			r, err := l.Operations().Get(ctx, in.Scope, in.Key)
			if err != nil {
				continue // not recorded yet is fine only before the first attempt
			}
			if settled != "" && r.State != settled {
				rt.Fatalf("settled intent moved from %s to %s", settled, r.State)
			}
			if r.State.Terminal() {
				settled = r.State
			}
			if (r.State == idempotency.StateConfirmed || r.State == idempotency.StateReconciled) &&
				(r.ProviderRef == nil || *r.ProviderRef != p.effects[r.ProviderKey]) {
				rt.Fatalf("%s without the provider's charge", r.State)
			}
		}
		events, err := l.Operations().Events(ctx, in.Scope, in.Key)
		if err != nil {
			rt.Fatalf("events: %v", err)
		}
		for _, e := range events {
			from := idempotency.State("")
			if e.FromState != nil {
				from = idempotency.State(*e.FromState)
			}
			if !oracle.Legal(from, e.ToState) {
				rt.Fatalf("illegal transition %s -> %s (%s)", from, e.ToState, e.Reason)
			}
		}
	})
}
