-- +goose Up
-- last_dispatched_at: when the request last left, so that a business search's "not found"
-- is only trusted once the provider's index lag has passed since then (reconciliation
-- past the idempotency window, rows R1-R4).
-- orphaned_at / orphan_reason: the effect happened (or may have) but the task it was for
-- was cancelled (instance deleted, activity interrupted): nobody will complete it, so an
-- operator (or a compensating intent) must look at it (row X1).
ALTER TABLE extworker_intents
    ADD COLUMN last_dispatched_at timestamptz,
    ADD COLUMN orphaned_at        timestamptz,
    ADD COLUMN orphan_reason      text;
UPDATE extworker_intents SET last_dispatched_at = first_dispatched_at WHERE first_dispatched_at IS NOT NULL;
CREATE INDEX extworker_intents_orphaned ON extworker_intents (namespace, orphaned_at) WHERE orphaned_at IS NOT NULL;
CREATE INDEX extworker_intents_task ON extworker_intents (namespace, process_instance_id, task_id);

-- +goose Down
DROP INDEX extworker_intents_task;
DROP INDEX extworker_intents_orphaned;
ALTER TABLE extworker_intents DROP COLUMN orphan_reason, DROP COLUMN orphaned_at, DROP COLUMN last_dispatched_at;
