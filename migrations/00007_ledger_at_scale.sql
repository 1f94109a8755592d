-- +goose NO TRANSACTION
-- +goose Up
-- Two indexes a ledger of millions of intents needs (docs/benchmarks.md, "The effect ledger at 10
-- million intents"), built CONCURRENTLY so that applying this to a large, busy ledger
-- never blocks the workers' writes (hence no transaction). If a concurrent build fails, it
-- leaves an INVALID index: drop it (DROP INDEX CONCURRENTLY <name>) and migrate again.
--
-- extworker_intents_prunable: what extworker_prune selects, in the order it deletes it.
-- Without it every batch of the prune scanned the whole table and sorted every prunable
-- row (4.7 s a batch at 10 M intents, 156 intents/s); with it a batch's rows are the
-- index's first ones (21,700 intents/s). Its predicate must stay the prune's.
CREATE INDEX CONCURRENTLY IF NOT EXISTS extworker_intents_prunable ON extworker_intents (namespace, updated_at)
    WHERE state IN ('confirmed', 'rejected', 'reconciled', 'compensated') AND orphaned_at IS NULL;
-- extworker_intents_key: an intent found by its key alone (`extworker effects show KEY`
-- without --scope), which otherwise reads the whole namespace (1.4 s at 10 M intents).
CREATE INDEX CONCURRENTLY IF NOT EXISTS extworker_intents_key ON extworker_intents (namespace, intent_key);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS extworker_intents_key;
DROP INDEX CONCURRENTLY IF EXISTS extworker_intents_prunable;
