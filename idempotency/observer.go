package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// Observer receives what the ledger does, for metrics. Methods are called synchronously
// and must be safe for concurrent use and quick. Scopes are the intents' scopes (a small,
// fixed set chosen by the handlers' authors); keys are never passed.
//
// Embed NopObserver to implement part of it. Hooks.Observer nil observes nothing.
type Observer interface {
	// Transition is called for every committed state change of an intent: from "" when
	// an intent is first recorded (to prepared).
	Transition(scope string, from, to State)
	// DuplicateSuppressed is called when an attempt was kept from dispatching an effect
	// again: reason "replayed" (the outcome came from the ledger, the provider was not
	// called) or "in-progress" (another live attempt owns the intent).
	DuplicateSuppressed(scope, reason string)
	// Reconciled is called for every reconciliation with the provider: result found,
	// absent, still-unknown or rejected.
	Reconciled(scope, result string)
	// DigestMismatch is called when an intent key came with a different request: an
	// idempotency conflict, nothing sent.
	DigestMismatch(scope string)
	// DatabaseError is called when a ledger write failed in the database (not when an
	// attempt was fenced off by another): operation "ledger-write".
	DatabaseError(operation string, err error)
}

// NopObserver does nothing; embed it to implement part of Observer.
type NopObserver struct{}

var _ Observer = NopObserver{}

func (NopObserver) Transition(string, State, State)    {}
func (NopObserver) DuplicateSuppressed(string, string) {}
func (NopObserver) Reconciled(string, string)          {}
func (NopObserver) DigestMismatch(string)              {}
func (NopObserver) DatabaseError(string, error)        {}

// Hooks connects a ledger to metrics and to the logger of the task running an effect.
// The zero value connects nothing.
type Hooks struct {
	// Observer receives counts for metrics (package metrics implements it).
	Observer Observer
	// ContextLogger, if set, returns the logger for records about an effect run with ctx
	// (nil: use Config.Logger). With tasks.Logger, the ledger's records carry the task's
	// fields (worker id, topic, external task id, process instance, business key, ...).
	ContextLogger func(ctx context.Context) *slog.Logger
	// Annotate, if set, is told idempotency_scope, idempotency_key and ledger_state when
	// Do ends, so the caller's later records carry them. With tasks.AddLogAttrs, the
	// worker's "task handled" record names the intent and its state.
	Annotate func(ctx context.Context, attrs ...slog.Attr)
}

// WithHooks returns a ledger on the same pool and configuration that reports to h. The
// receiver is unchanged.
func (l *Ledger) WithHooks(h Hooks) *Ledger {
	c := *l
	if h.Observer == nil {
		h.Observer = NopObserver{}
	}
	c.cfg.Hooks = h
	return &c
}

// logger returns the logger for records about an effect run with ctx: the task's
// (ContextLogger) or the ledger's.
func (l *Ledger) logger(ctx context.Context) *slog.Logger { return l.cfg.logger(ctx) }

// logger returns the logger for records about ctx: Hooks.ContextLogger's, or Logger.
func (c Config) logger(ctx context.Context) *slog.Logger {
	if f := c.Hooks.ContextLogger; f != nil {
		if tl := f(ctx); tl != nil {
			return tl
		}
	}
	return c.Logger
}

// logger returns the ledger's logger for this attempt, with idempotency_scope and
// idempotency_key.
func (a *attempt) logger(ctx context.Context) *slog.Logger {
	return a.l.logger(ctx).With(slog.String("idempotency_scope", a.in.Scope), slog.String("idempotency_key", a.in.Key))
}

// transitioned notes a state change of the transaction in progress, reported to the
// Observer once it commits, and logs it.
func (a *attempt) transitioned(ctx context.Context, from, to State) {
	a.pending = append(a.pending, transition{from, to})
	a.logger(ctx).Debug("intent transition", slog.String("ledger_state", string(to)),
		slog.String("from", string(from)), slog.String("to", string(to)), slog.Int("ledger_attempt", a.row.Attempt))
}

// transition is a state change made in the current transaction, reported to the
// Observer once it commits.
type transition struct{ from, to State }

// committed reports the transitions of a committed transaction; failed drops them and
// counts a database error (unless another attempt fenced this one off).
func (a *attempt) committed(err error) {
	pending := a.pending
	a.pending = nil
	if err != nil {
		if !errors.Is(err, ErrFenced) && !errors.Is(err, errLocal) {
			a.l.cfg.Hooks.Observer.DatabaseError("ledger-write", err)
		}
		return
	}
	for _, t := range pending {
		a.l.cfg.Hooks.Observer.Transition(a.in.Scope, t.from, t.to)
	}
}

// errLocal marks an error of Effect.Local, which is not the database's.
var errLocal = errors.New("local effect")

// BacklogRow counts the intents of one scope in one state that need attention.
type BacklogRow struct {
	Scope string
	State State
	Count int64
	// OldestAge is how long the oldest of them has been waiting, on the database's clock:
	// for unknown intents since their first dispatch, for the others since their last
	// change.
	OldestAge time.Duration
}

// Backlog counts, per scope, the intents of this namespace that are unknown, held for an
// operator, or dispatched (in flight, or left behind by a worker that died), with the age
// of the oldest. One indexed aggregate query; for metrics.
func (o *Operations) Backlog(ctx context.Context) ([]BacklogRow, error) {
	rows, err := o.pool.Query(ctx, `SELECT scope, state, count(*),
			extract(epoch FROM now() - min(CASE WHEN state = 'unknown' THEN coalesce(first_dispatched_at, updated_at) ELSE updated_at END))::float8
		FROM extworker_intents
		WHERE namespace = $1 AND state IN ('unknown', 'operator_hold', 'dispatched')
		GROUP BY scope, state ORDER BY scope, state`, o.cfg.Namespace)
	if err != nil {
		return nil, fmt.Errorf("ledger backlog: %w", err)
	}
	out, err := collectBacklog(rows)
	if err != nil {
		return nil, fmt.Errorf("ledger backlog: %w", err)
	}
	return out, nil
}

func collectBacklog(rows pgx.Rows) ([]BacklogRow, error) {
	defer rows.Close()
	var out []BacklogRow
	for rows.Next() {
		var r BacklogRow
		var age float64
		if err := rows.Scan(&r.Scope, &r.State, &r.Count, &age); err != nil {
			return nil, err
		}
		r.OldestAge = time.Duration(age * float64(time.Second))
		out = append(out, r)
	}
	return out, rows.Err()
}
