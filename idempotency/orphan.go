package idempotency

import (
	"context"
	"fmt"
	"log/slog"
)

// MarkOrphaned flags the intents a cancelled task left behind: the engine deleted the
// task (its process instance was cancelled, or a boundary event interrupted the
// activity) while, or after, its handler ran, so nobody will ever complete it with the
// effect's result. An intent that was dispatched (confirmed, reconciled, unknown,
// dispatched, operator hold) may have moved money without a process; it is flagged with
// orphaned_at and reason, an event records it, and operators find it with
// Filter{Orphaned: true} (extworker effects list --orphaned) to compensate or close it.
// Intents never dispatched (prepared) and already flagged ones are left alone. It
// returns how many intents it flagged.
func (o *Operations) MarkOrphaned(ctx context.Context, processInstanceID, taskID, reason string) (int, error) {
	wctx, cancel := context.WithTimeout(ctx, o.cfg.WriteTimeout)
	defer cancel()
	rows, err := o.pool.Query(wctx, `WITH o AS (
			UPDATE extworker_intents SET orphaned_at = now(), orphan_reason = $4, updated_at = now()
			WHERE namespace = $1 AND process_instance_id = $2 AND task_id = $3 AND orphaned_at IS NULL
				AND state IN ('dispatched', 'unknown', 'confirmed', 'reconciled', 'operator_hold')
			RETURNING id, scope, intent_key, state, attempt),
		ev AS (
			INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, task_id, reason)
			SELECT id, state, state, attempt, 'worker', $3, 'orphaned: ' || $4 FROM o)
		SELECT scope, intent_key, state FROM o`, o.cfg.Namespace, processInstanceID, taskID, reason)
	if err != nil {
		o.cfg.Hooks.Observer.DatabaseError("ledger-write", err)
		return 0, fmt.Errorf("idempotency: mark orphaned intents of task %s: %w", taskID, err)
	}
	defer rows.Close()
	log := o.cfg.logger(ctx)
	n := 0
	for rows.Next() {
		var scope, key, state string
		if err := rows.Scan(&scope, &key, &state); err != nil {
			return n, err
		}
		n++
		log.Warn("intent orphaned: its task was cancelled after the effect was dispatched; an operator must compensate or close it",
			slog.String("idempotency_scope", scope), slog.String("idempotency_key", key), slog.String("ledger_state", state),
			slog.String("reason", reason))
	}
	if err := rows.Err(); err != nil {
		return n, fmt.Errorf("idempotency: mark orphaned intents of task %s: %w", taskID, err)
	}
	return n, nil
}
