package idempotency

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/extworker/extworker/failure"
)

// Compensation: an intent whose effect undoes another's (a refund for a charge) names it
// in Intent.Compensates. It is an intent like any other, with its own key, request digest
// and lifecycle; when it confirms (or is reconciled), the original becomes compensated in
// the same transaction, with an event on each, and the original is never dispatched
// again.

// compensated returns the id of the intent in.Compensates names, which must be confirmed,
// reconciled, or already compensated (by this intent, on a replay).
func (s *pgStore) compensated(ctx context.Context, l *Ledger, in Intent) (*int64, error) {
	ref := in.Compensates
	var id int64
	var state State
	err := s.pool.QueryRow(ctx, `SELECT id, state FROM extworker_intents WHERE namespace = $1 AND scope = $2 AND intent_key = $3`,
		l.cfg.Namespace, ref.Scope, ref.Key).Scan(&id, &state)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, notRecordedToCompensate(in, l.cfg.Namespace)
	case err != nil:
		l.cfg.Hooks.Observer.DatabaseError("ledger_read", err)
		return nil, failure.Retryable(fmt.Errorf("idempotency: read the intent %s/%s compensates: %w", in.Scope, in.Key, err))
	}
	return compensable(id, state, in)
}

// compensable returns id if an intent in state may be compensated by in: confirmed,
// reconciled, or already compensated (by in, on a replay).
func compensable(id int64, state State, in Intent) (*int64, error) {
	switch state {
	case StateConfirmed, StateReconciled, StateCompensated:
		return &id, nil
	}
	ref := in.Compensates
	return nil, failure.Permanent(fmt.Errorf("%w: %s/%s compensates %s/%s, which is %s (only a confirmed or reconciled effect is compensated); nothing was sent",
		ErrNothingToCompensate, in.Scope, in.Key, ref.Scope, ref.Key, state))
}

// notRecordedToCompensate is the refusal of an intent that compensates one not recorded.
func notRecordedToCompensate(in Intent, namespace string) error {
	ref := in.Compensates
	return failure.Permanent(fmt.Errorf("%w: %s/%s compensates %s/%s, which is not recorded in namespace %s; nothing was sent",
		ErrNothingToCompensate, in.Scope, in.Key, ref.Scope, ref.Key, namespace))
}

// compensateTx marks the original compensated, in the transaction that confirms its
// compensating intent, and appends the original's event.
func (s *pgStore) compensateTx(ctx context.Context, tx pgx.Tx, a *attempt, originalID int64, providerRef string) error {
	reason := a.compensationReason(providerRef)
	_, err := tx.Exec(ctx, `WITH old AS (
			SELECT id, state, attempt FROM extworker_intents WHERE id = $1 FOR UPDATE),
		moved AS (
			UPDATE extworker_intents i SET state = 'compensated', updated_at = now() FROM old
			WHERE i.id = old.id AND old.state IN ('confirmed', 'reconciled') RETURNING old.id, old.state, old.attempt)
		INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, task_id, reason)
		SELECT id, state, 'compensated', attempt, $2, $3, $4 FROM moved`,
		originalID, actorOf(a.in.Task.Actor), nz(a.in.Task.TaskID), reason)
	if err != nil {
		return fmt.Errorf("mark the compensated intent: %w", err)
	}
	return nil
}

// compensationReason is the event of the intent a confirms the compensation of.
func (a *attempt) compensationReason(providerRef string) string {
	reason := fmt.Sprintf("compensated by %s/%s", a.in.Scope, a.in.Key)
	if providerRef != "" {
		reason += " (provider ref " + providerRef + ")"
	}
	return reason
}

// Compensation returns the intents linked to r by compensation: the one r compensates
// (nil if none, or pruned), and those that compensate r.
func (o *Operations) Compensation(ctx context.Context, r Row) (compensates *Row, compensatedBy []Row, err error) {
	if r.CompensatesID != nil {
		c, err := scanRow(o.pool.QueryRow(ctx, `SELECT `+rowColumns+` FROM extworker_intents WHERE id = $1`, *r.CompensatesID))
		switch {
		case err == nil:
			compensates = &c
		case !errors.Is(err, pgx.ErrNoRows):
			return nil, nil, fmt.Errorf("compensated intent: %w", err)
		}
	}
	rows, err := o.pool.Query(ctx, `SELECT `+rowColumns+` FROM extworker_intents WHERE compensates_id = $1 ORDER BY id`, r.ID)
	if err != nil {
		return nil, nil, fmt.Errorf("compensating intents: %w", err)
	}
	compensatedBy, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) { return scanRow(r) })
	if err != nil {
		return nil, nil, fmt.Errorf("compensating intents: %w", err)
	}
	return compensates, compensatedBy, nil
}
