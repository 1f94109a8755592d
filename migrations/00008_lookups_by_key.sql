-- +goose NO TRANSACTION
-- +goose Up
-- Lookups by intent key at scale. One index finds an intent by its key, with or without its scope: the unique constraint's
-- index now orders its columns (namespace, intent_key, scope), so a lookup by key alone
-- (`extworker effects show KEY`) reads a prefix of it, and migration 00007's
-- extworker_intents_key (namespace, intent_key) goes. At 10 million intents the two
-- indexes made a replay read two different index pages that were rarely cached (the
-- conflict check used one, the read-back the other), and every new intent and every state
-- change wrote both (docs/benchmarks.md, "The effect ledger at 10 million intents").
--
-- Built CONCURRENTLY so that a large, busy ledger keeps taking writes (hence no
-- transaction); the swap is one ALTER TABLE, so the ledger is never without its unique
-- constraint. If the concurrent build fails it leaves an INVALID index: drop it
-- (DROP INDEX CONCURRENTLY extworker_intents_unique_by_key) and migrate again.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS extworker_intents_unique_by_key ON extworker_intents (namespace, intent_key, scope);
ALTER TABLE extworker_intents
    DROP CONSTRAINT extworker_intents_unique,
    ADD CONSTRAINT extworker_intents_unique UNIQUE USING INDEX extworker_intents_unique_by_key;
DROP INDEX CONCURRENTLY IF EXISTS extworker_intents_key;
-- extworker_resolutions_key: an intent's resolution requests (`extworker effects show`, the
-- console's intent page), newest first, which otherwise read every request of the
-- namespace: one per intent an operator ever resolved.
CREATE INDEX CONCURRENTLY IF NOT EXISTS extworker_resolutions_key ON extworker_resolutions (namespace, intent_key, id);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS extworker_resolutions_key;
CREATE INDEX CONCURRENTLY IF NOT EXISTS extworker_intents_key ON extworker_intents (namespace, intent_key);
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS extworker_intents_unique_by_scope ON extworker_intents (namespace, scope, intent_key);
ALTER TABLE extworker_intents
    DROP CONSTRAINT extworker_intents_unique,
    ADD CONSTRAINT extworker_intents_unique UNIQUE USING INDEX extworker_intents_unique_by_scope;
