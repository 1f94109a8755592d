-- +goose Up
-- The inbox at its edges (docs/events.md):
--   queue            the queue the message was consumed from: `extworker inbox show` prints
--                    the replay command with it;
--   must_reconcile   an attempt's outcome at the engine is unknown: the next attempt asks
--                    the engine before it sends anything. Kept through retries that fail
--                    for other reasons, parking and replays, until the engine answers;
--   engine_failures  5xx answers of the engine to this message; parked after
--                    inbox.Config.MaxEngineFailures;
--   retry_due_at     when the retry copy of a waiting message comes back: other copies of
--                    it are acknowledged as duplicates meanwhile, one retry chain a message;
--   park_kind        why it was parked, as a word (`inbox show` says whether a replay helps).
ALTER TABLE extworker_inbox
    ADD COLUMN queue           text,
    ADD COLUMN must_reconcile  boolean NOT NULL DEFAULT false,
    ADD COLUMN engine_failures integer NOT NULL DEFAULT 0,
    ADD COLUMN retry_due_at    timestamptz,
    ADD COLUMN park_kind       text;
UPDATE extworker_inbox SET must_reconcile = true WHERE state IN ('PROCESSING', 'UNKNOWN_OUTCOME');

-- One start per process definition and business key, whichever messages (and sources)
-- ask for it: the last start sent to the engine for the key, by which message, and
-- whether its outcome is still unknown (pending). Another message for the key waits until
-- a pending start can no longer land (inbox.Config.InFlightWindow), then asks the engine
-- before it starts anything.
CREATE TABLE extworker_inbox_starts (
    process_key         text        NOT NULL,
    business_key        text        NOT NULL,
    source              text        NOT NULL,
    message_id          text        NOT NULL,
    pending             boolean     NOT NULL DEFAULT true,
    process_instance_id text,
    attempt_started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (process_key, business_key)
);
CREATE INDEX extworker_inbox_starts_updated ON extworker_inbox_starts (updated_at);

-- The inbox's grants (00009's, for the role names the ledger records) cover the new table.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION extworker_apply_inbox_grants() RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    w text := extworker_role('worker');
    o text := extworker_role('operator');
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('extworker_apply_grants'));
    REVOKE ALL ON extworker_inbox, extworker_inbox_conflicts, extworker_inbox_starts FROM PUBLIC;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = w) THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON extworker_inbox, extworker_inbox_conflicts, extworker_inbox_starts TO %I', w);
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = o) THEN
        EXECUTE format('GRANT SELECT, UPDATE ON extworker_inbox TO %I', o);
        EXECUTE format('REVOKE INSERT, DELETE, TRUNCATE ON extworker_inbox FROM %I', o);
        EXECUTE format('GRANT SELECT ON extworker_inbox_conflicts, extworker_inbox_starts TO %I', o);
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON extworker_inbox_conflicts, extworker_inbox_starts FROM %I', o);
    END IF;
END $$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION extworker_apply_inbox_grants() RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    w text := extworker_role('worker');
    o text := extworker_role('operator');
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('extworker_apply_grants'));
    REVOKE ALL ON extworker_inbox, extworker_inbox_conflicts FROM PUBLIC;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = w) THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON extworker_inbox, extworker_inbox_conflicts TO %I', w);
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = o) THEN
        EXECUTE format('GRANT SELECT, UPDATE ON extworker_inbox TO %I', o);
        EXECUTE format('REVOKE INSERT, DELETE, TRUNCATE ON extworker_inbox FROM %I', o);
        EXECUTE format('GRANT SELECT ON extworker_inbox_conflicts TO %I', o);
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON extworker_inbox_conflicts FROM %I', o);
    END IF;
END $$;
-- +goose StatementEnd
DROP TABLE extworker_inbox_starts;
ALTER TABLE extworker_inbox
    DROP COLUMN queue,
    DROP COLUMN must_reconcile,
    DROP COLUMN engine_failures,
    DROP COLUMN retry_due_at,
    DROP COLUMN park_kind;
