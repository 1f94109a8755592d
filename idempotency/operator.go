package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file holds what operators use: list, show, resolve and prune intents. Every
// operator change is a compare-and-set that appends an event naming the operator.

// ErrNotFound is an intent that does not exist (in this ledger's namespace).
var ErrNotFound = errors.New("idempotency: no such intent")

// Event is one transition of an intent.
type Event struct {
	ID        int64
	At        time.Time
	FromState *string
	ToState   State
	Attempt   int
	Actor     string
	TaskID    *string
	Reason    string
}

// Filter selects intents for List. Zero fields do not filter.
type Filter struct {
	States    []State
	Scope     string
	Key       string
	OlderThan time.Duration // last change at least this long ago
	Orphaned  bool          // only intents flagged orphaned (MarkOrphaned)
	Limit     int           // default 100
}

// Namespace is the namespace this ledger works in.
func (l *Ledger) Namespace() string { return l.cfg.Namespace }

// Get returns one intent.
func (l *Ledger) Get(ctx context.Context, scope, key string) (Row, error) {
	r, err := scanRow(l.pool.QueryRow(ctx, `SELECT `+rowColumns+` FROM extworker_intents WHERE namespace = $1 AND scope = $2 AND intent_key = $3`,
		l.cfg.Namespace, scope, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("%w: %s/%s", ErrNotFound, scope, key)
	}
	return r, err
}

// List returns intents matching f, most recently changed first.
func (l *Ledger) List(ctx context.Context, f Filter) ([]Row, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	states := make([]string, len(f.States))
	for i, s := range f.States {
		states[i] = string(s)
	}
	rows, err := l.pool.Query(ctx, `SELECT `+rowColumns+` FROM extworker_intents
		WHERE namespace = $1 AND (cardinality($2::text[]) = 0 OR state = ANY($2)) AND ($3 = '' OR scope = $3) AND ($4 = '' OR intent_key = $4)
			AND updated_at <= now() - $5::interval AND (NOT $7 OR orphaned_at IS NOT NULL)
		ORDER BY updated_at DESC LIMIT $6`, l.cfg.Namespace, states, f.Scope, f.Key, f.OlderThan, f.Limit, f.Orphaned)
	if err != nil {
		return nil, fmt.Errorf("list intents: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) { return scanRow(r) })
}

// Events returns an intent's transitions, oldest first.
func (l *Ledger) Events(ctx context.Context, scope, key string) ([]Event, error) {
	rows, err := l.pool.Query(ctx, `SELECT e.id, e.at, e.from_state, e.to_state, e.attempt, e.actor, e.task_id, e.reason
		FROM extworker_intent_events e JOIN extworker_intents i ON i.id = e.intent_id
		WHERE i.namespace = $1 AND i.scope = $2 AND i.intent_key = $3 ORDER BY e.id`, l.cfg.Namespace, scope, key)
	if err != nil {
		return nil, fmt.Errorf("intent events: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		err := r.Scan(&e.ID, &e.At, &e.FromState, &e.ToState, &e.Attempt, &e.Actor, &e.TaskID, &e.Reason)
		return e, err
	})
}

// Resolution is an operator's verdict on an intent in doubt.
type Resolution struct {
	As          State // StateConfirmed or StateRejected
	ProviderRef string
	// Values are the result values the task completes with when confirmed (what Dispatch
	// would have returned), e.g. {"paymentRef": "ch_123"}.
	Values    map[string]any
	ErrorCode string // for StateRejected
	Reason    string
	Operator  string
}

// Resolve settles an intent held for an operator (or still unknown) as confirmed or
// rejected, after the operator has checked with the provider. The next attempt of its
// task then completes (or declines) from the ledger without calling the provider.
func (l *Ledger) Resolve(ctx context.Context, scope, key string, res Resolution) (Row, error) {
	if res.As != StateConfirmed && res.As != StateRejected {
		return Row{}, fmt.Errorf("resolve: --as must be confirmed or rejected, not %q", res.As)
	}
	if res.Operator == "" || res.Reason == "" {
		return Row{}, errors.New("resolve: an operator and a reason are required")
	}
	if res.As == StateConfirmed && res.ProviderRef == "" {
		return Row{}, errors.New("resolve: confirming needs the provider's reference")
	}
	r, err := l.Get(ctx, scope, key)
	if err != nil {
		return r, err
	}
	if r.State != StateOperatorHold && r.State != StateUnknown {
		return r, fmt.Errorf("resolve: intent %s/%s is %s; only unknown or held intents are resolved by an operator", scope, key, r.State)
	}
	a := &attempt{l: l, in: Intent{Scope: scope, Key: key, Task: TaskRef{Actor: "operator:" + res.Operator}}, row: r}
	if res.As == StateConfirmed {
		values, merr := json.Marshal(res.Values)
		if merr != nil {
			return r, fmt.Errorf("resolve: values: %w", merr)
		}
		err = a.move(ctx, r.State, res.As, "operator resolution: "+res.Reason,
			", provider_ref = $5, result = $6, error_code = NULL, error_message = NULL", res.ProviderRef, values)
	} else {
		code := res.ErrorCode
		if code == "" {
			code = "REJECTED"
		}
		err = a.move(ctx, r.State, res.As, "operator resolution: "+res.Reason,
			", provider_ref = $5, error_code = $6, error_message = $7", nz(res.ProviderRef), code, res.Reason)
	}
	if err != nil {
		return r, fmt.Errorf("resolve %s/%s: %w", scope, key, err)
	}
	return l.Get(ctx, scope, key)
}

// Prune deletes terminal intents (confirmed, rejected, reconciled, compensated) whose
// last change is older than retention, with their events. Unknown, held and in-flight
// intents are never pruned.
func (l *Ledger) Prune(ctx context.Context, retention time.Duration) (int64, error) {
	tag, err := l.pool.Exec(ctx, `DELETE FROM extworker_intents WHERE namespace = $1
		AND state IN ('confirmed', 'rejected', 'reconciled', 'compensated') AND updated_at < now() - $2::interval`, l.cfg.Namespace, retention)
	if err != nil {
		return 0, fmt.Errorf("prune intents: %w", err)
	}
	return tag.RowsAffected(), nil
}
