package idempotency_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
)

// R1: past the provider's idempotency window a lookup by key proves nothing (the provider
// may have forgotten the key; a same-key resend would be a second effect), so the ledger
// asks the business search instead, and reconciles from what it finds.
func TestPastWindowReconcilesBySearchNotByKey(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t, idempotency.Config{ProviderWindow: time.Nanosecond, ReconcileBackoff: time.Millisecond})
	p := newProvider()
	p.lose = true
	var byKey, bySearch atomic.Int32
	eff := p.effect()
	eff.Reconcile = func(context.Context, idempotency.Query) (idempotency.Reconciliation, error) {
		byKey.Add(1)
		return idempotency.Absent(), nil // the key expired: a lie past the window
	}
	eff.Search = func(ctx context.Context, q idempotency.Query) (idempotency.Reconciliation, error) {
		bySearch.Add(1)
		assert.Equal(t, "INV-R1", q.BusinessKey, "search by business key")
		return p.lookup(ctx, q)
	}
	ctx := testenv.Context(t, time.Minute)
	in := intent("INV-R1", 100)
	_, err := l.Do(ctx, in, eff)
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	out, err := l.Do(ctx, in, eff)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateReconciled, out.State)
	assert.Equal(t, int32(0), byKey.Load(), "the by-key lookup is not asked past the window")
	assert.Equal(t, int32(1), bySearch.Load())
	calls, effects := p.stats()
	assert.Equal(t, 1, calls, "no dispatch after the window")
	assert.Equal(t, 1, effects)
	events, err := l.Operations().Events(ctx, in.Scope, in.Key)
	require.NoError(t, err)
	assert.Contains(t, events[len(events)-1].Reason, "business search")
	_ = pool
}

// R2: past the window with no business search, an unknown outcome is never retried: it
// goes to an operator at once.
func TestPastWindowWithoutSearchGoesToOperator(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t, idempotency.Config{ProviderWindow: time.Nanosecond, ReconcileBackoff: time.Millisecond})
	p := newProvider()
	p.lose = true
	ctx := testenv.Context(t, time.Minute)
	in := intent("INV-R2", 100)
	_, err := l.Do(ctx, in, p.effect())
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	_, err = l.Do(ctx, in, p.effect())
	require.Error(t, err)
	assert.Equal(t, failure.KindUnknownOutcome, kind(err), "an incident for the operator")
	assert.Contains(t, err.Error(), "has no Search")
	assert.Equal(t, idempotency.StateOperatorHold, state(t, pool, l, in))
	calls, _ := p.stats()
	assert.Equal(t, 1, calls)
}

// R3/R4: a search's "not found" is trusted only once the index lag has passed since the
// last dispatch; until then the intent stays unknown (nothing is sent) and the retry is
// scheduled for when the lag ends. Then it is dispatched again with the same key.
func TestSearchNotFoundIsTrustedOnlyAfterTheIndexLag(t *testing.T) {
	t.Parallel()
	const lag = 400 * time.Millisecond
	l, pool := newLedger(t, idempotency.Config{ReconcileBackoff: time.Millisecond})
	p := newProvider()
	p.drop = true // the first request never reached the provider: no effect
	eff := idempotency.Effect{Dispatch: p.charge, SearchLag: lag,
		Search: func(ctx context.Context, q idempotency.Query) (idempotency.Reconciliation, error) {
			return p.lookup(ctx, q)
		}}
	ctx := testenv.Context(t, time.Minute)
	in := intent("INV-R3", 100)
	start := time.Now()
	_, err := l.Do(ctx, in, eff)
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	dispatched := time.Now() // the dispatch was before this: the lag is over once lag has passed since

	_, err = l.Do(ctx, in, eff)
	require.Error(t, err)
	elapsed := time.Since(start)
	if elapsed < lag {
		o := failure.Classify(err)
		assert.Equal(t, failure.KindRetryable, o.Kind)
		assert.GreaterOrEqual(t, o.RetryDelay, lag-elapsed-50*time.Millisecond, "the retry waits for the lag to end")
		assert.Contains(t, err.Error(), "index lag")
		assert.Equal(t, idempotency.StateUnknown, state(t, pool, l, in))
		calls, _ := p.stats()
		assert.Equal(t, 1, calls, "nothing sent inside the lag")
	}

	// The engine would hold the task for the retry delay; here the test waits for the lag
	// to have passed on the clock, then runs the next attempt.
	testenv.Eventually(t, 10*time.Second, "the index lag passed", func() (bool, error) { return time.Since(dispatched) > lag, nil })
	out, err := l.Do(ctx, in, eff)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateConfirmed, out.State)
	calls, effects := p.stats()
	assert.Equal(t, 2, calls)
	assert.Equal(t, 1, effects)
	assert.Equal(t, []string{p.keysSeen[0], p.keysSeen[0]}, p.keysSeen, "the same key both times")
}

// T2 (Stripe stores a 500 under the key): the provider's answer about the key settles
// nothing an automaton may act on, so Hold sends the intent to an operator at once.
func TestHoldReconciliationGoesToOperatorAtOnce(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t, idempotency.Config{ReconcileBackoff: time.Millisecond})
	p := newProvider()
	p.lose = true
	eff := p.effect()
	eff.Reconcile = func(context.Context, idempotency.Query) (idempotency.Reconciliation, error) {
		return idempotency.Hold("the provider stored a 500 under this key; a same-key retry only replays it"), nil
	}
	ctx := testenv.Context(t, time.Minute)
	in := intent("INV-T2", 100)
	_, err := l.Do(ctx, in, eff)
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	_, err = l.Do(ctx, in, eff)
	require.Error(t, err)
	assert.Equal(t, failure.KindUnknownOutcome, kind(err))
	assert.Contains(t, err.Error(), "stored a 500")
	assert.Equal(t, idempotency.StateOperatorHold, state(t, pool, l, in))
}

// X1: a task cancelled after its effect was dispatched leaves money moved without a
// process: its intents are flagged orphaned, once, with an event, and listed for operators.
func TestMarkOrphaned(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t, idempotency.Config{})
	p := newProvider()
	ctx := testenv.Context(t, time.Minute)
	paid := intent("INV-X1", 100)
	paid.Task.ProcessInstanceID = "pi-1"
	_, err := l.Do(ctx, paid, p.effect())
	require.NoError(t, err)
	other := intent("INV-X1b", 100) // another instance's intent
	other.Task.ProcessInstanceID = "pi-2"
	_, err = l.Do(ctx, other, p.effect())
	require.NoError(t, err)

	n, err := l.Operations().MarkOrphaned(ctx, "pi-1", paid.Task.TaskID, "instance deleted while the charge was in flight")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	r, err := l.Operations().Get(ctx, paid.Scope, paid.Key)
	require.NoError(t, err)
	require.NotNil(t, r.OrphanedAt)
	assert.Equal(t, "instance deleted while the charge was in flight", *r.OrphanReason)
	assert.Equal(t, idempotency.StateConfirmed, r.State, "the state is what the provider did; the flag says nobody will use it")
	events, err := l.Operations().Events(ctx, paid.Scope, paid.Key)
	require.NoError(t, err)
	last := events[len(events)-1]
	assert.Equal(t, idempotency.StateConfirmed, last.ToState)
	assert.Contains(t, last.Reason, "orphaned")

	n, err = l.Operations().MarkOrphaned(ctx, "pi-1", paid.Task.TaskID, "again")
	require.NoError(t, err)
	assert.Equal(t, 0, n, "flagged once")
	rows, err := l.Operations().List(ctx, idempotency.Filter{Orphaned: true})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	assert.Equal(t, paid.Key, rows[0].Key)
}
