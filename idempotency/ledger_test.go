package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

// provider is an in-memory payment provider that honours idempotency keys: a second
// request with a key it has seen returns the first answer without a second effect.
type provider struct {
	mu       sync.Mutex
	calls    int               // requests received
	effects  map[string]string // idempotency key -> charge id: effects that happened
	keysSeen []string
	delay    time.Duration
	// lose, when set, makes the next request take effect but answer with an error (the
	// answer lost in flight); drop makes it fail before the provider accepts it.
	lose, drop bool
}

func newProvider() *provider { return &provider{effects: map[string]string{}} }

func (p *provider) charge(ctx context.Context, key string) (idempotency.Result, error) {
	if p.delay > 0 {
		t := time.NewTimer(p.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return idempotency.Result{}, ctx.Err()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	p.keysSeen = append(p.keysSeen, key)
	if p.drop {
		p.drop = false
		return idempotency.Result{}, errors.New("connection reset before the provider accepted the request")
	}
	ref, ok := p.effects[key]
	if !ok {
		ref = fmt.Sprintf("ch_%d", len(p.effects)+1)
		p.effects[key] = ref
	}
	if p.lose {
		p.lose = false
		return idempotency.Result{}, errors.New("read timeout after the request was sent")
	}
	return idempotency.Result{ProviderRef: ref, Values: map[string]any{"chargeId": ref}}, nil
}

func (p *provider) lookup(_ context.Context, q idempotency.Query) (idempotency.Reconciliation, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ref, ok := p.effects[q.ProviderKey]; ok {
		return idempotency.Found(idempotency.Result{ProviderRef: ref, Values: map[string]any{"chargeId": ref}}), nil
	}
	return idempotency.Absent(), nil
}

func (p *provider) effect() idempotency.Effect {
	return idempotency.Effect{Dispatch: p.charge, Reconcile: p.lookup}
}

func (p *provider) stats() (calls, effects int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls, len(p.effects)
}

var migrateOnce sync.Once

func newLedger(t testing.TB, cfg idempotency.Config) (*idempotency.Ledger, *pgxpool.Pool) {
	t.Helper()
	pool := testenv.DB(t)
	migrateOnce.Do(func() {
		db := stdlib.OpenDBFromPool(pool)
		defer db.Close()
		_, err := migrations.Up(context.Background(), db)
		require.NoError(t, err)
	})
	cfg.Namespace = testenv.Unique("ns")
	l, err := idempotency.New(pool, cfg)
	require.NoError(t, err)
	// The database enforces the threshold: record it, as extworker migrate does.
	require.NoError(t, idempotency.SetApprovalThreshold(context.Background(), pool, cfg.Namespace, cfg.ApprovalThreshold))
	return l, pool
}

type invoice struct {
	ID     string `json:"id"`
	Amount int64  `json:"amountCents"`
}

func intent(id string, amount int64) idempotency.Intent {
	return idempotency.Intent{Scope: "payment.collect", Key: "invoice:" + id + ":v1", Request: invoice{id, amount},
		Task: idempotency.TaskRef{Actor: "test-worker", TaskID: "task-" + id, BusinessKey: id}}
}

func kind(err error) failure.Kind { return failure.Classify(err).Kind }

func state(t *testing.T, pool *pgxpool.Pool, l *idempotency.Ledger, in idempotency.Intent) idempotency.State {
	t.Helper()
	r, err := l.Operations().Get(context.Background(), in.Scope, in.Key)
	require.NoError(t, err)
	return r.State
}

func TestConfirmedOnceAndReplayedFromLedger(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t, idempotency.Config{})
	p := newProvider()
	ctx := testenv.Context(t, time.Minute)
	first, err := l.Do(ctx, intent("INV-1", 1200), p.effect())
	require.NoError(t, err)
	assert.False(t, first.Replayed)
	assert.Equal(t, idempotency.StateConfirmed, first.State)
	again, err := l.Do(ctx, intent("INV-1", 1200), p.effect())
	require.NoError(t, err)
	assert.True(t, again.Replayed, "a redelivered task completes from the ledger")
	assert.Equal(t, first.Values, again.Values)
	assert.Equal(t, first.ProviderRef, again.ProviderRef)
	calls, effects := p.stats()
	assert.Equal(t, 1, calls, "zero provider calls on redelivery")
	assert.Equal(t, 1, effects)
	assert.Equal(t, idempotency.StateConfirmed, state(t, pool, l, intent("INV-1", 1200)))
	assert.Regexp(t, `^ew_[a-z2-7]{32}$`, first.ProviderKey)
	assert.NotContains(t, first.ProviderKey, "INV-1", "no business values in the provider key")
}

func TestConcurrentAttemptsDispatchOnce(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t, idempotency.Config{Lease: 5 * time.Second})
	p := newProvider()
	p.delay = 200 * time.Millisecond
	ctx := testenv.Context(t, time.Minute)
	const n = 16
	results := make(chan idempotency.Receipt, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				out, err := l.Do(ctx, intent("INV-RACE", 500), p.effect())
				if err == nil {
					results <- out
					return
				}
				o := failure.Classify(err)
				if !errors.Is(err, idempotency.ErrInProgress) || o.Kind != failure.KindRetryable {
					t.Errorf("unexpected error: %v", err)
					return
				}
				wait := time.NewTimer(min(o.RetryDelay, 100*time.Millisecond)) // back off as told, then ask again
				<-wait.C
			}
		}()
	}
	wg.Wait()
	close(results)
	var refs []string
	for r := range results {
		refs = append(refs, r.ProviderRef)
	}
	require.Len(t, refs, n)
	for _, r := range refs {
		assert.Equal(t, refs[0], r, "all observe the same result")
	}
	calls, effects := p.stats()
	assert.Equal(t, 1, calls, "exactly one dispatch")
	assert.Equal(t, 1, effects)
}

func TestDigestMismatchSendsNothing(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t, idempotency.Config{})
	p := newProvider()
	ctx := testenv.Context(t, time.Minute)
	_, err := l.Do(ctx, intent("INV-2", 1000), p.effect())
	require.NoError(t, err)
	_, err = l.Do(ctx, intent("INV-2", 9999), p.effect())
	require.ErrorIs(t, err, idempotency.ErrDigestMismatch)
	assert.Equal(t, failure.KindPermanent, kind(err), "an incident")
	calls, _ := p.stats()
	assert.Equal(t, 1, calls, "zero requests with the new digest")
	events, err := l.Operations().Events(ctx, "payment.collect", "invoice:INV-2:v1")
	require.NoError(t, err)
	assert.Contains(t, events[len(events)-1].Reason, "refused: same key, different request digest")
}

func TestUnknownIsReconciledNotResent(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t, idempotency.Config{ReconcileBackoff: 10 * time.Millisecond})
	p := newProvider()
	p.lose = true // the charge happens, the answer is lost
	ctx := testenv.Context(t, time.Minute)
	in := intent("INV-3", 700)
	_, err := l.Do(ctx, in, p.effect())
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	assert.Equal(t, failure.KindRetryable, kind(err))
	assert.Equal(t, idempotency.StateUnknown, state(t, pool, l, in))
	out, err := l.Do(ctx, in, p.effect())
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateReconciled, out.State)
	assert.Equal(t, "ch_1", out.ProviderRef)
	calls, effects := p.stats()
	assert.Equal(t, 1, calls, "reconciled with the provider, not sent again")
	assert.Equal(t, 1, effects)
}

func TestNotFoundDispatchesAgainWithTheSameKey(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t, idempotency.Config{})
	p := newProvider()
	p.drop = true // never reached the provider, but we cannot know that
	ctx := testenv.Context(t, time.Minute)
	in := intent("INV-4", 300)
	_, err := l.Do(ctx, in, p.effect())
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	out, err := l.Do(ctx, in, p.effect())
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateConfirmed, out.State)
	calls, effects := p.stats()
	assert.Equal(t, 2, calls)
	assert.Equal(t, 1, effects)
	assert.Equal(t, p.keysSeen[0], p.keysSeen[1], "the same provider key both times")
}

func TestStillUnknownEndsInOperatorHold(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t, idempotency.Config{MaxReconciliations: 3, ReconcileBackoff: time.Millisecond})
	p := newProvider()
	p.lose = true
	eff := p.effect()
	eff.Reconcile = func(context.Context, idempotency.Query) (idempotency.Reconciliation, error) {
		return idempotency.StillUnknown("provider search index lagging"), nil
	}
	ctx := testenv.Context(t, time.Minute)
	in := intent("INV-5", 100)
	_, err := l.Do(ctx, in, eff)
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	for i := 1; i < 3; i++ {
		_, err = l.Do(ctx, in, eff)
		require.Error(t, err)
		assert.Equal(t, failure.KindRetryable, kind(err), "reconciliation %d", i)
	}
	_, err = l.Do(ctx, in, eff)
	require.Error(t, err)
	assert.Equal(t, failure.KindUnknownOutcome, kind(err), "an incident for the operator")
	assert.Contains(t, err.Error(), "extworker effects resolve")
	assert.Equal(t, idempotency.StateOperatorHold, state(t, pool, l, in))
	_, err = l.Do(ctx, in, eff)
	assert.ErrorIs(t, err, idempotency.ErrOperatorHold)
	calls, _ := p.stats()
	assert.Equal(t, 1, calls, "never sent again while unknown")
}

func TestRejectedIsFinal(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t, idempotency.Config{})
	calls := 0
	eff := idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		calls++
		return idempotency.Result{}, idempotency.Rejected("CARD_DECLINED", "insufficient funds")
	}}
	ctx := testenv.Context(t, time.Minute)
	for i := 0; i < 2; i++ {
		_, err := l.Do(ctx, intent("INV-6", 100), eff)
		o := failure.Classify(err)
		assert.Equal(t, failure.KindBPMNError, o.Kind)
		assert.Equal(t, "CARD_DECLINED", o.Code)
	}
	assert.Equal(t, 1, calls)
}

func TestNotSentGoesBackToPrepared(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t, idempotency.Config{})
	p := newProvider()
	first := true
	eff := p.effect()
	eff.Dispatch = func(ctx context.Context, key string) (idempotency.Result, error) {
		if first {
			first = false
			return idempotency.Result{}, idempotency.NotSent(errors.New("429 rate limited"))
		}
		return p.charge(ctx, key)
	}
	ctx := testenv.Context(t, time.Minute)
	in := intent("INV-7", 100)
	_, err := l.Do(ctx, in, eff)
	assert.Equal(t, failure.KindRetryable, kind(err))
	assert.Equal(t, idempotency.StatePrepared, state(t, pool, l, in))
	_, err = l.Do(ctx, in, eff)
	require.NoError(t, err)
}

// A worker that keeps dying without an outcome ends in operator hold, not a loop: each
// attempt takes the intent, dispatches, and dies before recording anything or releasing
// it (its goroutine exits), so the next one finds it abandoned once its lease runs out.
func TestAttemptsCountedAcrossFailures(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t, idempotency.Config{MaxAttempts: 2, Lease: time.Second})
	p := newProvider()
	ctx := testenv.Context(t, time.Minute)
	in := intent("INV-8", 100)
	eff := p.effect()
	eff.Dispatch = func(context.Context, string) (idempotency.Result, error) {
		runtime.Goexit() // the worker dies mid-dispatch: nothing recorded, nothing released
		return idempotency.Result{}, nil
	}
	dies := func() {
		t.Helper()
		done := make(chan struct{})
		go func() { defer close(done); _, _ = l.Do(ctx, in, eff) }()
		<-done
		testenv.Eventually(t, 10*time.Second, "the dead attempt's lease runs out", func() (bool, error) {
			r, err := l.Operations().Get(ctx, in.Scope, in.Key)
			return err == nil && r.LeaseUntil != nil && time.Until(*r.LeaseUntil) < -100*time.Millisecond, err
		})
	}
	dies()                              // attempt 1
	dies()                              // attempt 2: reconciled (not found), dispatched again, dies again
	_, err := l.Do(ctx, in, p.effect()) // attempt 3: two abandoned, over the limit
	assert.ErrorIs(t, err, idempotency.ErrTooManyTries)
	assert.Equal(t, failure.KindUnknownOutcome, kind(err))
	assert.Equal(t, idempotency.StateOperatorHold, state(t, pool, l, in))
	calls, _ := p.stats()
	assert.Zero(t, calls, "the held intent is not sent")
}

// Local effects commit with the ledger, or not at all.
func TestLocalTransaction(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t, idempotency.Config{})
	ctx := testenv.Context(t, time.Minute)
	table := "ew_test_orders_" + testenv.Unique("t")[2:]
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (invoice text PRIMARY KEY, status text NOT NULL)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE `+table) })
	fail := true
	eff := idempotency.Effect{Local: func(ctx context.Context, tx pgx.Tx, _ idempotency.Result) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ('INV-9', 'paid')`); err != nil {
			return err
		}
		if fail {
			return errors.New("business rule violated")
		}
		return nil
	}}
	in := intent("INV-9", 100)
	_, err = l.Do(ctx, in, eff)
	require.Error(t, err)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
	assert.Zero(t, n, "business row rolled back with the ledger")
	assert.Equal(t, idempotency.StatePrepared, state(t, pool, l, in))
	fail = false
	out, err := l.Do(ctx, in, eff)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateConfirmed, out.State)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
	assert.Equal(t, 1, n)
	out, err = l.Do(ctx, in, eff)
	require.NoError(t, err)
	assert.True(t, out.Replayed, "exactly once for local effects")
}

func TestDigestIsCanonical(t *testing.T) {
	a, err := idempotency.Digest(map[string]any{"b": 1, "a": []any{"x", 2.5}})
	require.NoError(t, err)
	b, err := idempotency.Digest(struct {
		A []any `json:"a"`
		B int   `json:"b"`
	}{[]any{"x", 2.5}, 1})
	require.NoError(t, err)
	assert.Equal(t, a, b)
	c, err := idempotency.Digest(map[string]any{"b": 2, "a": []any{"x", 2.5}})
	require.NoError(t, err)
	assert.NotEqual(t, a, c)
	assert.Equal(t, idempotency.ProviderKey("ns", "s", "k"), idempotency.ProviderKey("ns", "s", "k"))
	assert.NotEqual(t, idempotency.ProviderKey("ns", "s", "k"), idempotency.ProviderKey("ns2", "s", "k"))
}

// Defect 3: a compensated intent was dispatched again on every attempt (only confirmed,
// reconciled and rejected short-circuited Do). Every terminal state is final: the
// provider is never called again, and the row does not move.
func TestCompensatedIntentIsNeverDispatchedAgain(t *testing.T) {
	t.Parallel()
	l, pool := newLedger(t, idempotency.Config{})
	p := newProvider()
	ctx := testenv.Context(t, time.Minute)
	in := intent("INV-COMP", 1200)
	_, err := l.Do(ctx, in, p.effect())
	require.NoError(t, err)
	// A compensating intent refunded the charge, and marked this one compensated.
	_, err = pool.Exec(ctx, `UPDATE extworker_intents SET state = 'compensated' WHERE namespace = $1 AND scope = $2 AND intent_key = $3`,
		l.Namespace(), in.Scope, in.Key)
	require.NoError(t, err)
	before, err := l.Operations().Get(ctx, in.Scope, in.Key)
	require.NoError(t, err)
	for i := 0; i < 2; i++ {
		out, err := l.Do(ctx, in, p.effect())
		require.Error(t, err, "a compensated effect is not an outcome to complete the task with (got %+v)", out)
		assert.Equal(t, failure.KindPermanent, kind(err), "an incident, not a retry: %v", err)
		assert.ErrorIs(t, err, idempotency.ErrCompensated)
	}
	calls, effects := p.stats()
	assert.Equal(t, 1, calls, "never dispatched again")
	assert.Equal(t, 1, effects)
	after, err := l.Operations().Get(ctx, in.Scope, in.Key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompensated, after.State)
	assert.Equal(t, before.Attempt, after.Attempt, "not even claimed")
	assert.Equal(t, before.Dispatches, after.Dispatches)
}
