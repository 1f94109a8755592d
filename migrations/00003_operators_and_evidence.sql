-- +goose Up
-- Operators, evidence and compensation (docs/operators.md).
--
-- abandoned_attempts: attempts that took the intent and ended without releasing it
-- (a worker died, or lost its lock mid-dispatch). Only these count towards MaxAttempts:
-- an attempt that ended cleanly as "not sent" (429, connection refused) does not.
-- amount: the money the effect moves, in minor units, when the handler says (the
-- two-person rule's threshold); NULL when unknown.
-- compensates_id: a compensating intent's original; when it confirms, the original
-- becomes compensated in the same transaction.
ALTER TABLE extworker_intents
    ADD COLUMN abandoned_attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN amount             bigint,
    ADD COLUMN compensates_id     bigint;
CREATE INDEX extworker_intents_compensates ON extworker_intents (compensates_id) WHERE compensates_id IS NOT NULL;

-- The events are evidence: append-only for everyone (the trigger holds for the table's
-- owner too; archiving them is a DBA's deliberate act, see docs/operators.md), kept when
-- their intent is pruned (the intent leaves a tombstone with the same id), and each one
-- names the database user that wrote it besides the actor the application names.
ALTER TABLE extworker_intent_events DROP CONSTRAINT extworker_intent_events_intent_id_fkey;
ALTER TABLE extworker_intent_events ADD COLUMN db_user text NOT NULL DEFAULT session_user;

-- +goose StatementBegin
CREATE FUNCTION extworker_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'extworker_intent_events is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;
-- +goose StatementEnd
CREATE TRIGGER extworker_intent_events_append_only BEFORE UPDATE OR DELETE ON extworker_intent_events
    FOR EACH ROW EXECUTE FUNCTION extworker_events_append_only();
CREATE TRIGGER extworker_intent_events_no_truncate BEFORE TRUNCATE ON extworker_intent_events
    FOR EACH STATEMENT EXECUTE FUNCTION extworker_events_append_only();

-- What prune leaves of an intent: enough to refuse dispatching the same intent again
-- once its row is gone (and its provider's key window with it).
CREATE TABLE extworker_intent_tombstones (
    id             bigint      PRIMARY KEY, -- the pruned intent's id, which its events keep
    namespace      text        NOT NULL,
    scope          text        NOT NULL,
    intent_key     text        NOT NULL,
    request_digest text        NOT NULL,
    provider_key   text        NOT NULL,
    state          text        NOT NULL,
    provider_ref   text,
    settled_at     timestamptz NOT NULL,
    pruned_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT extworker_intent_tombstones_unique UNIQUE (namespace, scope, intent_key)
);

-- Operator resolutions that wait for a second operator (the two-person rule). The intent
-- changes only when a different operator approves; every request and decision is kept.
CREATE TABLE extworker_resolutions (
    id                bigserial   PRIMARY KEY,
    intent_id         bigint      NOT NULL,
    namespace         text        NOT NULL,
    scope             text        NOT NULL,
    intent_key        text        NOT NULL,
    from_state        text        NOT NULL,
    attempt           integer     NOT NULL,
    verdict           text        NOT NULL CHECK (verdict IN ('confirmed', 'rejected', 'prepared')),
    provider_ref      text,
    result            jsonb,
    error_code        text,
    reason            text        NOT NULL,
    requested_by      text        NOT NULL,
    requested_db_user text        NOT NULL DEFAULT session_user,
    requested_at      timestamptz NOT NULL DEFAULT now(),
    status            text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'approved', 'rejected', 'stale')),
    decided_by        text,
    decided_db_user   text,
    decided_at        timestamptz,
    decision_reason   text
);
CREATE UNIQUE INDEX extworker_resolutions_one_pending ON extworker_resolutions (intent_id) WHERE status = 'pending';
CREATE INDEX extworker_resolutions_status ON extworker_resolutions (namespace, status, id);

-- A member of the worker role who is not an operator never takes an intent out of
-- operator hold: that is an operator's verdict (effects resolve / approve).
-- +goose StatementBegin
CREATE FUNCTION extworker_guard_operator_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state = 'operator_hold' AND NEW.state <> 'operator_hold'
        AND EXISTS (SELECT FROM pg_roles WHERE rolname = 'extworker_worker')
        AND EXISTS (SELECT FROM pg_roles WHERE rolname = 'extworker_operator')
        AND pg_has_role(session_user, 'extworker_worker', 'MEMBER')
        AND NOT pg_has_role(session_user, 'extworker_operator', 'MEMBER') THEN
        RAISE EXCEPTION 'database user % (extworker_worker) may not settle intent % held for an operator', session_user, OLD.id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $$;
-- +goose StatementEnd
-- The WHEN clause keeps the function off the workers' hot path: it runs only for rows
-- leaving operator hold.
CREATE TRIGGER extworker_intents_guard_operator_hold BEFORE UPDATE OF state ON extworker_intents
    FOR EACH ROW WHEN (OLD.state = 'operator_hold' AND NEW.state <> 'operator_hold')
    EXECUTE FUNCTION extworker_guard_operator_hold();

-- Prune, in one batch: settled intents (never orphaned ones, never unsettled ones) last
-- changed before p_older_than ago become tombstones; their events stay. It runs with its
-- owner's rights, so neither role needs DELETE; and it refuses retentions under a day
-- whatever the caller says (the ledger refuses anything under its provider window plus
-- a day).
-- +goose StatementBegin
CREATE FUNCTION extworker_prune(p_namespace text, p_older_than interval, p_batch integer) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    n integer;
BEGIN
    IF p_older_than < interval '1 day' THEN
        RAISE EXCEPTION 'extworker_prune: retention % is under a day', p_older_than USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH victims AS (
        SELECT id FROM extworker_intents
        WHERE namespace = p_namespace AND state IN ('confirmed', 'rejected', 'reconciled', 'compensated')
            AND orphaned_at IS NULL AND updated_at < now() - p_older_than
        ORDER BY updated_at LIMIT p_batch FOR UPDATE SKIP LOCKED),
    gone AS (
        DELETE FROM extworker_intents i USING victims v WHERE i.id = v.id
        RETURNING i.id, i.namespace, i.scope, i.intent_key, i.request_digest, i.provider_key, i.state, i.provider_ref, i.updated_at),
    tomb AS (
        INSERT INTO extworker_intent_tombstones (id, namespace, scope, intent_key, request_digest, provider_key, state, provider_ref, settled_at)
        SELECT id, namespace, scope, intent_key, request_digest, provider_key, state, provider_ref, updated_at FROM gone
        ON CONFLICT (namespace, scope, intent_key) DO UPDATE SET id = EXCLUDED.id, request_digest = EXCLUDED.request_digest,
            provider_key = EXCLUDED.provider_key, state = EXCLUDED.state, provider_ref = EXCLUDED.provider_ref,
            settled_at = EXCLUDED.settled_at, pruned_at = now()
        RETURNING 1)
    SELECT count(*) INTO n FROM tomb;
    RETURN n;
END $$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION extworker_prune(text, interval, integer) FROM PUBLIC;

-- The grants of the two roles, when a DBA has created them (docs/operators.md):
-- extworker_worker runs the workers, extworker_operator the operators' `extworker
-- effects`. Neither may update or delete an event; only operators record resolutions.
-- `extworker migrate` calls it after every migration run, so roles created later get
-- their grants at the next one.
-- +goose StatementBegin
CREATE FUNCTION extworker_apply_grants() RETURNS text LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    done text := '';
BEGIN
    -- Concurrent GRANTs on one object fail ("tuple concurrently updated"): one at a time.
    PERFORM pg_advisory_xact_lock(hashtext('extworker_apply_grants'));
    REVOKE UPDATE, DELETE, TRUNCATE ON extworker_intent_events FROM PUBLIC;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'extworker_worker') THEN
        GRANT SELECT, INSERT, UPDATE ON extworker_intents TO extworker_worker;
        GRANT SELECT, INSERT ON extworker_intent_events TO extworker_worker;
        REVOKE UPDATE, DELETE, TRUNCATE ON extworker_intent_events FROM extworker_worker;
        REVOKE DELETE, TRUNCATE ON extworker_intents FROM extworker_worker;
        GRANT SELECT ON extworker_intent_tombstones TO extworker_worker;
        GRANT SELECT ON extworker_schema_migrations TO extworker_worker;
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO extworker_worker', current_schema());
        GRANT USAGE ON SEQUENCE extworker_intents_id_seq, extworker_intent_events_id_seq TO extworker_worker;
        GRANT EXECUTE ON FUNCTION extworker_prune(text, interval, integer) TO extworker_worker;
        done := done || 'extworker_worker ';
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'extworker_operator') THEN
        GRANT SELECT, UPDATE ON extworker_intents TO extworker_operator;
        GRANT SELECT, INSERT ON extworker_intent_events TO extworker_operator;
        REVOKE UPDATE, DELETE, TRUNCATE ON extworker_intent_events FROM extworker_operator;
        GRANT SELECT ON extworker_intent_tombstones TO extworker_operator;
        GRANT SELECT ON extworker_schema_migrations TO extworker_operator;
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO extworker_operator', current_schema());
        GRANT SELECT, INSERT, UPDATE ON extworker_resolutions TO extworker_operator;
        GRANT USAGE ON SEQUENCE extworker_intent_events_id_seq, extworker_resolutions_id_seq TO extworker_operator;
        GRANT EXECUTE ON FUNCTION extworker_prune(text, interval, integer) TO extworker_operator;
        done := done || 'extworker_operator ';
    END IF;
    RETURN trim(done);
END $$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION extworker_apply_grants();
DROP FUNCTION extworker_prune(text, interval, integer);
DROP TRIGGER extworker_intents_guard_operator_hold ON extworker_intents;
DROP FUNCTION extworker_guard_operator_hold();
DROP TABLE extworker_resolutions;
DROP TABLE extworker_intent_tombstones;
DROP TRIGGER extworker_intent_events_no_truncate ON extworker_intent_events;
DROP TRIGGER extworker_intent_events_append_only ON extworker_intent_events;
DROP FUNCTION extworker_events_append_only();
ALTER TABLE extworker_intent_events DROP COLUMN db_user;
DELETE FROM extworker_intent_events e WHERE NOT EXISTS (SELECT FROM extworker_intents i WHERE i.id = e.intent_id);
ALTER TABLE extworker_intent_events ADD CONSTRAINT extworker_intent_events_intent_id_fkey
    FOREIGN KEY (intent_id) REFERENCES extworker_intents (id) ON DELETE CASCADE;
DROP INDEX extworker_intents_compensates;
ALTER TABLE extworker_intents DROP COLUMN compensates_id, DROP COLUMN amount, DROP COLUMN abandoned_attempts;
