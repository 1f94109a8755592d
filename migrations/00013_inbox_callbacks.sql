-- +goose Up
-- Provider callbacks that wait (package inbox/callback, docs/callbacks.md): the body of a
-- callback no process instance waits for yet, held ONLY while its inbox row waits, and
-- deleted as soon as the row settles (processed, ignored_duplicate, failed_final). The
-- inbox row itself keeps only the body's digest, as for every transport.
--   message_id  the webhook-id as received (the inbox row's is inbox.StoredID of it);
--   due_at      when a Run handles it again (pushed on by a lease while one does);
--   attempts    how often a Run took it.
CREATE TABLE extworker_inbox_callbacks (
    source      text        NOT NULL,
    message_id  text        NOT NULL,
    type        text        NOT NULL DEFAULT '',
    body        bytea       NOT NULL,
    due_at      timestamptz NOT NULL DEFAULT now(),
    attempts    integer     NOT NULL DEFAULT 0,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, message_id)
);
CREATE INDEX extworker_inbox_callbacks_due ON extworker_inbox_callbacks (due_at);

-- The inbox's grants (00010's) cover the new table for the worker. Operators get nothing
-- of it: it holds bodies, which they never read (the inbox row says what they need).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION extworker_apply_inbox_grants() RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    w text := extworker_role('worker');
    o text := extworker_role('operator');
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('extworker_apply_grants'));
    REVOKE ALL ON extworker_inbox, extworker_inbox_conflicts, extworker_inbox_starts, extworker_inbox_callbacks FROM PUBLIC;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = w) THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON extworker_inbox, extworker_inbox_conflicts, extworker_inbox_starts, extworker_inbox_callbacks TO %I', w);
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = o) THEN
        EXECUTE format('GRANT SELECT, UPDATE ON extworker_inbox TO %I', o);
        EXECUTE format('REVOKE INSERT, DELETE, TRUNCATE ON extworker_inbox FROM %I', o);
        EXECUTE format('GRANT SELECT ON extworker_inbox_conflicts, extworker_inbox_starts TO %I', o);
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON extworker_inbox_conflicts, extworker_inbox_starts FROM %I', o);
        EXECUTE format('REVOKE ALL ON extworker_inbox_callbacks FROM %I', o);
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
DROP TABLE extworker_inbox_callbacks;
