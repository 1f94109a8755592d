-- +goose Up
-- Operators write nothing of the inbox but through extworker_inbox_reopen: with UPDATE on
-- extworker_inbox (00005 to 00013), one operator's plain SQL could mark a message handled
-- that never was (a payment's notice dropped), or put a handled one back to received and
-- send it again (a second shipment started). `extworker inbox replay` and `reopen` only
-- ever put a parked row (failed_final) back to received, with its own body, counted and
-- signed with the operator's login: that is all the function does. It runs as the
-- inbox's owner; the reason names session_user, the login that called it.
-- +goose StatementBegin
CREATE FUNCTION extworker_inbox_reopen(p_source text, p_message_id text, p_body_digest text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    c text := extworker_role('console');
BEGIN
    -- The console's login is every console operator's: a reopen by it names no person.
    -- (The console does not replay; pg_has_role holds any role for a superuser.)
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = c) AND pg_has_role(session_user, c, 'MEMBER')
            AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = session_user) THEN
        RAISE EXCEPTION 'extworker_inbox_reopen: % is the console''s login, which names no person: replay with your own login', session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- Only a parked row: reopening a waiting one would clear its retry chain and its
    -- engine failures, and stack the reason, each time it is called.
    UPDATE extworker_inbox SET state = 'received', attempts = 0, engine_failures = 0, parked_at = NULL,
            park_kind = NULL, retry_due_at = NULL, received_at = now(), updated_at = now(), replays = replays + 1,
            reason = 'replayed by ' || session_user || ' (was: ' || coalesce(reason, '') || ')'
        WHERE source = p_source AND message_id = p_message_id AND body_digest = p_body_digest AND state = 'failed_final';
    RETURN FOUND;
END $$;
-- +goose StatementEnd
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION extworker_inbox_reopen(text, text, text) SET search_path = pg_catalog, %I, pg_temp', current_schema());
END $$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION extworker_inbox_reopen(text, text, text) FROM PUBLIC;

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
        EXECUTE format('GRANT EXECUTE ON FUNCTION extworker_inbox_reopen(text, text, text) TO %I', w);
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = o) THEN
        EXECUTE format('GRANT SELECT ON extworker_inbox, extworker_inbox_conflicts, extworker_inbox_starts TO %I', o);
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON extworker_inbox, extworker_inbox_conflicts, extworker_inbox_starts FROM %I', o);
        EXECUTE format('REVOKE ALL ON extworker_inbox_callbacks FROM %I', o);
        EXECUTE format('GRANT EXECUTE ON FUNCTION extworker_inbox_reopen(text, text, text) TO %I', o);
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
DROP FUNCTION extworker_inbox_reopen(text, text, text);
