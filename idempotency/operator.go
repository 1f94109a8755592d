package idempotency

import (
	"context"
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
	// DBUser is the database user that wrote the event (the session's login).
	DBUser string
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
	// A pruned intent's events stay, under its tombstone's id.
	rows, err := l.pool.Query(ctx, `SELECT e.id, e.at, e.from_state, e.to_state, e.attempt, e.actor, e.task_id, e.reason, e.db_user
		FROM extworker_intent_events e
		WHERE e.intent_id = (SELECT id FROM extworker_intents WHERE namespace = $1 AND scope = $2 AND intent_key = $3
			UNION ALL SELECT id FROM extworker_intent_tombstones WHERE namespace = $1 AND scope = $2 AND intent_key = $3 LIMIT 1)
		ORDER BY e.id`, l.cfg.Namespace, scope, key)
	if err != nil {
		return nil, fmt.Errorf("intent events: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		err := r.Scan(&e.ID, &e.At, &e.FromState, &e.ToState, &e.Attempt, &e.Actor, &e.TaskID, &e.Reason, &e.DBUser)
		return e, err
	})
}
