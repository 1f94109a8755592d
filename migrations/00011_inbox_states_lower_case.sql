-- +goose Up
-- The inbox's states in lower-case snake_case, as the ledger's are (docs/glossary.md):
-- RECEIVED → received, PROCESSING → processing, PROCESSED → processed, FAILED_RETRYABLE
-- → failed_retryable, FAILED_FINAL → failed_final, IGNORED_DUPLICATE → ignored_duplicate,
-- and UNKNOWN_OUTCOME → unknown (the ledger's word for an outcome the engine's lost answer
-- left unknown). The rows are rewritten in place, with the state's CHECK, its default and
-- the settled rows' index predicate. Stop the consumers of the old binary first: they
-- write the upper-case names, which the new CHECK refuses.
ALTER TABLE extworker_inbox DROP CONSTRAINT IF EXISTS extworker_inbox_state_check;
UPDATE extworker_inbox SET state = CASE state
        WHEN 'RECEIVED' THEN 'received'
        WHEN 'PROCESSING' THEN 'processing'
        WHEN 'PROCESSED' THEN 'processed'
        WHEN 'FAILED_RETRYABLE' THEN 'failed_retryable'
        WHEN 'FAILED_FINAL' THEN 'failed_final'
        WHEN 'IGNORED_DUPLICATE' THEN 'ignored_duplicate'
        WHEN 'UNKNOWN_OUTCOME' THEN 'unknown'
        ELSE state END
    WHERE state IN ('RECEIVED', 'PROCESSING', 'PROCESSED', 'FAILED_RETRYABLE', 'FAILED_FINAL', 'IGNORED_DUPLICATE', 'UNKNOWN_OUTCOME');
ALTER TABLE extworker_inbox
    ALTER COLUMN state SET DEFAULT 'received',
    ADD CONSTRAINT extworker_inbox_state_check CHECK (state IN ('received', 'processing', 'processed',
        'failed_retryable', 'failed_final', 'ignored_duplicate', 'unknown'));
DROP INDEX IF EXISTS extworker_inbox_settled;
CREATE INDEX extworker_inbox_settled ON extworker_inbox (updated_at) WHERE state IN ('processed', 'ignored_duplicate');

-- +goose Down
ALTER TABLE extworker_inbox DROP CONSTRAINT IF EXISTS extworker_inbox_state_check;
UPDATE extworker_inbox SET state = CASE state
        WHEN 'received' THEN 'RECEIVED'
        WHEN 'processing' THEN 'PROCESSING'
        WHEN 'processed' THEN 'PROCESSED'
        WHEN 'failed_retryable' THEN 'FAILED_RETRYABLE'
        WHEN 'failed_final' THEN 'FAILED_FINAL'
        WHEN 'ignored_duplicate' THEN 'IGNORED_DUPLICATE'
        WHEN 'unknown' THEN 'UNKNOWN_OUTCOME'
        ELSE state END
    WHERE state IN ('received', 'processing', 'processed', 'failed_retryable', 'failed_final', 'ignored_duplicate', 'unknown');
ALTER TABLE extworker_inbox
    ALTER COLUMN state SET DEFAULT 'RECEIVED',
    ADD CONSTRAINT extworker_inbox_state_check CHECK (state IN ('RECEIVED', 'PROCESSING', 'PROCESSED',
        'FAILED_RETRYABLE', 'FAILED_FINAL', 'IGNORED_DUPLICATE', 'UNKNOWN_OUTCOME'));
DROP INDEX IF EXISTS extworker_inbox_settled;
CREATE INDEX extworker_inbox_settled ON extworker_inbox (updated_at) WHERE state IN ('PROCESSED', 'IGNORED_DUPLICATE');
