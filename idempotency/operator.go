package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Operations is the operator's side of an effect ledger in PostgreSQL, apart from the
// handler's (Ledger.Do): list and inspect intents (List, Get, Events, Compensation,
// Tombstone, Backlog), settle them (Resolve, and Approve or RejectResolution under the
// two-person rule: ApprovalNeeded, Resolution, Resolutions), flag orphans (MarkOrphaned)
// and prune settled intents into tombstones (Prune). Every operator change is a
// compare-and-set that appends an event naming the operator. The extworker binary's
// `effects` command and the console wrap it; docs/operators.md is their runbook.
type Operations struct {
	pool *pgxpool.Pool
	cfg  Config
}

// NewOperations returns the operations of the ledger on pool with cfg (its Namespace,
// ProviderWindow, ApprovalThreshold, WriteTimeout, Logger and Hooks), whose database
// must be migrated (package migrations).
func NewOperations(pool *pgxpool.Pool, cfg Config) (*Operations, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Operations{pool: pool, cfg: cfg}, nil
}

// Operations returns the operations of l: the same database, namespace and hooks. A
// ledger from NewInMemory has none: nil.
func (l *Ledger) Operations() *Operations {
	if l.pool == nil {
		return nil
	}
	return &Operations{pool: l.pool, cfg: l.cfg}
}

// Namespace is the namespace these operations work in.
func (o *Operations) Namespace() string { return o.cfg.Namespace }

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
	TaskID    string        // only intents recorded for this task (Intent.Task.TaskID)
	OlderThan time.Duration // last change at least this long ago
	Orphaned  bool          // only intents flagged orphaned (MarkOrphaned) and not closed (VerdictClose)
	Limit     int           // default 100
}

// Get returns one intent.
func (o *Operations) Get(ctx context.Context, scope, key string) (Row, error) {
	r, err := scanRow(o.pool.QueryRow(ctx, `SELECT `+rowColumns+` FROM extworker_intents WHERE namespace = $1 AND scope = $2 AND intent_key = $3`,
		o.cfg.Namespace, scope, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("%w: %s/%s", ErrNotFound, scope, key)
	}
	return r, err
}

// List returns intents matching f, most recently changed first.
func (o *Operations) List(ctx context.Context, f Filter) ([]Row, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	// Only the filters that are set become conditions, and one state is compared with =:
	// on a ledger of millions, "state = ANY(...)" or "($n = '' OR ...)" made PostgreSQL
	// read every unknown intent (or the whole namespace, for a key without a scope)
	// instead of the first rows of an index (docs/benchmarks.md).
	where, args := []string{"namespace = $1"}, []any{o.cfg.Namespace}
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(cond, len(args)))
	}
	switch len(f.States) {
	case 0:
	case 1:
		add("state = $%d", string(f.States[0]))
	default:
		states := make([]string, len(f.States))
		for i, s := range f.States {
			states[i] = string(s)
		}
		add("state = ANY($%d)", states)
	}
	if f.Scope != "" {
		add("scope = $%d", f.Scope)
	}
	if f.Key != "" {
		add("intent_key = $%d", f.Key)
	}
	if f.TaskID != "" {
		add("task_id = $%d", f.TaskID)
	}
	if f.OlderThan > 0 {
		add("updated_at <= now() - $%d::interval", f.OlderThan)
	}
	if f.Orphaned {
		where = append(where, "orphaned_at IS NOT NULL AND orphan_closed_at IS NULL")
	}
	args = append(args, f.Limit)
	rows, err := o.pool.Query(ctx, `SELECT `+rowColumns+` FROM extworker_intents WHERE `+strings.Join(where, " AND ")+
		fmt.Sprintf(` ORDER BY updated_at DESC LIMIT $%d`, len(args)), args...)
	if err != nil {
		return nil, fmt.Errorf("list intents: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) { return scanRow(r) })
}

// Events returns an intent's transitions, oldest first.
func (o *Operations) Events(ctx context.Context, scope, key string) ([]Event, error) {
	// A pruned intent's events stay, under its tombstone's id.
	rows, err := o.pool.Query(ctx, `SELECT e.id, e.at, e.from_state, e.to_state, e.attempt, e.actor, e.task_id, e.reason, e.db_user
		FROM extworker_intent_events e
		WHERE e.intent_id = (SELECT id FROM extworker_intents WHERE namespace = $1 AND scope = $2 AND intent_key = $3
			UNION ALL SELECT id FROM extworker_intent_tombstones WHERE namespace = $1 AND scope = $2 AND intent_key = $3 LIMIT 1)
		ORDER BY e.id`, o.cfg.Namespace, scope, key)
	if err != nil {
		return nil, fmt.Errorf("intent events: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		err := r.Scan(&e.ID, &e.At, &e.FromState, &e.ToState, &e.Attempt, &e.Actor, &e.TaskID, &e.Reason, &e.DBUser)
		return e, err
	})
}
