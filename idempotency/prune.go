package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/extworker/extworker/failure"
)

// Pruning keeps the evidence. Only settled intents (confirmed, rejected, reconciled,
// compensated) go, never orphaned or unsettled ones, and only once they are older than
// the provider's key window plus a day. Each one leaves a tombstone (scope, key, digest,
// state, provider key and reference) that refuses to dispatch the same intent again, and
// its events stay: a charge confirmed, its task's incident fixed weeks later, is refused
// with the charge's reference instead of being sent under a key the provider forgot.

// PruneMargin is what a retention must exceed the provider's key window by.
const PruneMargin = 24 * time.Hour

// pruneBatch is how many intents one prune transaction removes.
const pruneBatch = 1000

// MinRetention is the shortest retention Prune accepts with a provider key window of
// window: window plus PruneMargin.
func MinRetention(window time.Duration) time.Duration { return window + PruneMargin }

// ErrRetentionTooShort: a retention under MinRetention(Config.ProviderWindow).
var ErrRetentionTooShort = errors.New("idempotency: retention too short")

// Prune turns settled intents last changed more than retention ago into tombstones, in
// batches, and returns how many it pruned. Orphaned intents and intents not settled are
// kept; events are kept. A retention under MinRetention(Config.ProviderWindow) is
// refused with ErrRetentionTooShort.
func (o *Operations) Prune(ctx context.Context, retention time.Duration) (int64, error) {
	if min := MinRetention(o.cfg.ProviderWindow); retention < min {
		return 0, fmt.Errorf("%w: %v is under the provider's key window (%v) plus %v; settled intents younger than %v are kept",
			ErrRetentionTooShort, retention, o.cfg.ProviderWindow, PruneMargin, min)
	}
	var total int64
	for {
		var n int64
		err := o.pool.QueryRow(ctx, `SELECT extworker_prune($1, $2::bigint * interval '1 microsecond', $3)`,
			o.cfg.Namespace, retention.Microseconds(), pruneBatch).Scan(&n)
		if err != nil {
			return total, fmt.Errorf("prune intents: %w", err)
		}
		total += n
		if n < pruneBatch {
			return total, nil
		}
	}
}

// Tombstone is what prune leaves of a settled intent.
type Tombstone struct {
	ID          int64
	Scope, Key  string
	Digest      string
	ProviderKey string
	State       State
	ProviderRef *string
	SettledAt   time.Time
	PrunedAt    time.Time
}

// Tombstone returns the tombstone of a pruned intent, or ErrNotFound.
func (o *Operations) Tombstone(ctx context.Context, scope, key string) (Tombstone, error) {
	return readTombstone(ctx, o.pool, o.cfg.Namespace, scope, key)
}

// readTombstone reads a tombstone with q (the pool, or the claim's transaction).
func readTombstone(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, namespace, scope, key string) (Tombstone, error) {
	var t Tombstone
	err := q.QueryRow(ctx, `SELECT id, scope, intent_key, request_digest, provider_key, state, provider_ref, settled_at, pruned_at
		FROM extworker_intent_tombstones WHERE namespace = $1 AND scope = $2 AND intent_key = $3`, namespace, scope, key).
		Scan(&t.ID, &t.Scope, &t.Key, &t.Digest, &t.ProviderKey, &t.State, &t.ProviderRef, &t.SettledAt, &t.PrunedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, fmt.Errorf("%w: %s/%s", ErrNotFound, scope, key)
	}
	return t, err
}

// tombstoned is the claim of an intent neither recorded nor recordable: its tombstone
// says how it settled, and the attempt is refused without sending anything. The error
// returned is a transaction error; the refusal is the outcome.
func (a *attempt) tombstoned(ctx context.Context, tx pgx.Tx) (error, error) {
	in := a.in
	t, err := readTombstone(ctx, tx, a.l.cfg.Namespace, in.Scope, in.Key)
	if err != nil {
		return nil, err
	}
	a.l.cfg.Hooks.Observer.DuplicateSuppressed(in.Scope, "replayed")
	return failure.Permanent(fmt.Errorf("%w: intent %s/%s settled as %s at %s (provider key %s, provider ref %s) and was pruned at %s; it is never dispatched again (nothing was sent); a new effect needs a new intent key",
		ErrPruned, in.Scope, in.Key, t.State, t.SettledAt.Format(time.RFC3339), t.ProviderKey, deref(t.ProviderRef), t.PrunedAt.Format(time.RFC3339))), nil
}
