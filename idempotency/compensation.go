package idempotency

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/extworker/extworker/failure"
)

// Compensation: an intent whose effect undoes another's (a refund for a charge) names it
// in Intent.Compensates. It is an intent like any other, with its own key, request digest
// and lifecycle; when it confirms (or is reconciled), the original becomes compensated in
// the same transaction, with an event on each, and the original is never dispatched
// again.

// compensated returns the id of the intent in.Compensates names, which must be confirmed,
// reconciled, or already compensated (by this intent, on a replay), and compensated by
// no other intent that was not declined (ErrCompensationExists). The unique index
// extworker_intents_one_compensation (migration 00012) closes the race of two
// compensating intents recorded at once: the second insert is refused (compensationRace).
func (s *pgStore) compensated(ctx context.Context, l *Ledger, in Intent) (*int64, error) {
	ref := in.Compensates
	var id int64
	var state State
	var other *string
	var self bool
	err := s.pool.QueryRow(ctx, `SELECT o.id, o.state, (SELECT c.scope || '/' || c.intent_key FROM extworker_intents c
			WHERE c.compensates_id = o.id AND c.state <> 'rejected' AND NOT (c.namespace = $1 AND c.scope = $4 AND c.intent_key = $5)
			ORDER BY c.id LIMIT 1),
			EXISTS (SELECT FROM extworker_intents c WHERE c.compensates_id = o.id AND c.namespace = $1 AND c.scope = $4 AND c.intent_key = $5)
		FROM extworker_intents o WHERE o.namespace = $1 AND o.scope = $2 AND o.intent_key = $3`,
		l.cfg.Namespace, ref.Scope, ref.Key, in.Scope, in.Key).Scan(&id, &state, &other, &self)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, notRecordedToCompensate(in, l.cfg.Namespace)
	case err != nil:
		l.cfg.Hooks.Observer.DatabaseError("ledger_read", err)
		return nil, storeFailed(fmt.Errorf("idempotency: read the intent %s/%s compensates: %w", in.Scope, in.Key, err))
	}
	return compensable(id, state, deref(other), self, in)
}

// compensable returns id if an intent in state may be compensated by in: confirmed,
// reconciled, or already compensated by in (self: in is recorded as compensating it, a
// replay), and other (the scope/key of another compensating intent of it that was not
// declined, "" if none) is empty. An original compensated by an intent since pruned is
// not compensated again.
func compensable(id int64, state State, other string, self bool, in Intent) (*int64, error) {
	switch {
	case other != "":
		return nil, compensationExists(in, other)
	case state == StateConfirmed || state == StateReconciled || state == StateCompensated && self:
		return &id, nil
	case state == StateCompensated:
		return nil, compensationExists(in, "an intent since pruned")
	}
	ref := in.Compensates
	return nil, failure.Permanent(fmt.Errorf("%w: %s/%s compensates %s/%s, which is %s (only a confirmed or reconciled effect is compensated); nothing was sent",
		ErrNothingToCompensate, in.Scope, in.Key, ref.Scope, ref.Key, state))
}

// compensationExists is the refusal of a second compensating intent (other: the first's
// scope/key, or "" when a concurrent one was recorded first).
func compensationExists(in Intent, other string) error {
	ref := in.Compensates
	if other == "" {
		other = "another intent recorded concurrently"
	}
	return failure.Permanent(fmt.Errorf("%w: %s/%s compensates %s/%s, which %s already compensates (each effect is undone once; only a declined compensation lets another try); nothing was sent",
		ErrCompensationExists, in.Scope, in.Key, ref.Scope, ref.Key, other))
}

// oneCompensationIndex is the unique index that lets one compensating intent, not
// declined, name an original.
const oneCompensationIndex = "extworker_intents_one_compensation"

// compensationRace is the refusal of a claim whose insert the unique index
// oneCompensationIndex refused (another compensating intent of the same original was
// recorded after this attempt's check), or nil for any other error.
func (a *attempt) compensationRace(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == oneCompensationIndex {
		a.pending = nil
		return compensationExists(a.in, "")
	}
	return nil
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
