-- +goose Up
-- The two-person rule, enforced by the database (docs/operators.md#the-two-person-rule).
--
-- Before this migration the operator role could UPDATE intents and INSERT/UPDATE
-- resolutions directly, so one person with one login could settle a held intent, or
-- forge a resolution "requested by" somebody else and approve it, with plain SQL. Now
-- operators only read; every verdict, approval, rejection, withdrawal and orphan closing
-- goes through the functions below. They run as the ledger's owner (SECURITY DEFINER,
-- search_path fixed with pg_temp last, so a temporary table cannot shadow a ledger
-- table), take the person from session_user (and, on the console's login only, from the
-- name the console attests), and refuse the same person twice.

-- Who is who. One row per person: the name they carry in the console and in the
-- ledger's trail, and their own database login for the CLI (NULL: console only). Only
-- the ledger's owner writes it (`extworker operators add`); names compare without case.
CREATE TABLE extworker_operators (
    -- Plain ASCII names: a look-alike (a Cyrillic a, a zero-width space) would be a
    -- second person to the ledger and the same one to a reader of the trail.
    name     text        NOT NULL PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,99}$'),
    db_login text        UNIQUE,
    added_at timestamptz NOT NULL DEFAULT now(),
    added_by text        NOT NULL DEFAULT session_user
);
-- Names that read alike (I, l and 1; O and 0; rn and m; vv and w; trailing punctuation)
-- are one name.
-- +goose StatementBegin
CREATE FUNCTION extworker_name_skeleton(p_name text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT replace(replace(translate(regexp_replace(lower(p_name), '[._@-]+$', ''), '01i|', 'olll'), 'rn', 'm'), 'vv', 'w')
$$;
-- +goose StatementEnd
CREATE UNIQUE INDEX extworker_operators_name_ci ON extworker_operators (extworker_name_skeleton(name));

-- The names of the ledger's roles in this database. Roles are cluster-wide: a second
-- ledger database on the same cluster (another tenant) names its own roles, so one
-- tenant's console login is never trusted in another's ledger. `extworker migrate`
-- writes them from EXTWORKER_DATABASE_ROLE_PREFIX.
CREATE TABLE extworker_ledger_roles (
    purpose   text NOT NULL PRIMARY KEY CHECK (purpose IN ('worker', 'operator', 'console')),
    role_name text NOT NULL UNIQUE CHECK (role_name <> '')
);
INSERT INTO extworker_ledger_roles VALUES ('worker', 'extworker_worker'), ('operator', 'extworker_operator'),
    ('console', 'extworker_console');

-- The two-person rule's threshold per namespace, in minor units: a verdict that declares
-- money moved (confirmed) or moves it (retry) on an intent above it, or without an
-- amount, waits for a second person. No row: 0. Only the owner writes it (`extworker
-- migrate` from EXTWORKER_APPROVAL_THRESHOLD).
CREATE TABLE extworker_ledger_settings (
    namespace          text   NOT NULL PRIMARY KEY,
    approval_threshold bigint NOT NULL CHECK (approval_threshold >= 0)
);

-- An orphan's closing verdict (VerdictClose): dealt with outside the ledger; it leaves
-- the orphan queue and may be pruned once settled.
ALTER TABLE extworker_intents ADD COLUMN orphan_closed_at timestamptz;
ALTER TABLE extworker_resolutions DROP CONSTRAINT extworker_resolutions_verdict_check;
ALTER TABLE extworker_resolutions ADD CONSTRAINT extworker_resolutions_verdict_check
    CHECK (verdict IN ('confirmed', 'rejected', 'prepared', 'closed'));

-- +goose StatementBegin
CREATE FUNCTION extworker_role(p_purpose text) RETURNS text LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT role_name FROM extworker_ledger_roles WHERE purpose = p_purpose
$$;
-- +goose StatementEnd

-- Whether the session's user is a member of the role the ledger names for p_purpose
-- (false when that role does not exist). A superuser is a member of nothing here: it is
-- a member of every role to pg_has_role, and must not pass for the console.
-- +goose StatementBegin
CREATE FUNCTION extworker_member(p_purpose text) RETURNS boolean LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT coalesce((SELECT pg_has_role(session_user, r.oid, 'MEMBER') AND NOT s.rolsuper
        FROM pg_roles r, pg_roles s WHERE r.rolname = extworker_role(p_purpose) AND s.rolname = session_user), false)
$$;
-- +goose StatementEnd

-- The person acting, from the session's user. On the console's login (a member of its
-- role) the console authenticates operators itself and attests the name: it must be a
-- registered operator's. On any other login the person is the operator registered for
-- it; a member of the operator role without a registration is refused (else the same
-- person could act once as their console name and once as their login), and a login
-- outside the roles (the owner, a one-user setup) is whom it names, or itself.
-- p_attested, when given on a registered login, must be that person's name.
-- +goose StatementBegin
CREATE FUNCTION extworker_operator_identity(p_attested text) RETURNS text LANGUAGE plpgsql STABLE
    SET search_path FROM CURRENT AS $$
DECLARE
    who text;
    attested text := nullif(btrim(coalesce(p_attested, '')), '');
BEGIN
    IF extworker_member('console') THEN
        IF attested IS NULL THEN
            RAISE EXCEPTION 'the console''s login (%) must name the operator', session_user USING ERRCODE = 'EXW04';
        END IF;
        SELECT name INTO who FROM extworker_operators WHERE lower(name) = lower(attested);
        IF who IS NULL THEN
            RAISE EXCEPTION 'operator "%" is not registered in this ledger: the ledger''s owner registers each person once (extworker operators add NAME [--login LOGIN])',
                left(attested, 100) USING ERRCODE = 'EXW04';
        END IF;
        RETURN who;
    END IF;
    SELECT name INTO who FROM extworker_operators WHERE db_login = session_user;
    IF who IS NULL THEN
        IF extworker_member('operator') THEN
            RAISE EXCEPTION 'database user % is not registered as an operator of this ledger: the ledger''s owner registers each person once with their login (extworker operators add NAME --login %)',
                session_user, session_user USING ERRCODE = 'EXW04';
        END IF;
        -- Outside the roles (the owner, a one-user setup): trusted to name the person,
        -- as it can change anything anyway; extworker_decide still compares the logins.
        RETURN coalesce(attested, session_user);
    END IF;
    IF attested IS NOT NULL AND lower(attested) <> lower(who) THEN
        RAISE EXCEPTION 'database user % is operator "%", not "%": an operator acts under one name',
            session_user, who, left(attested, 100) USING ERRCODE = 'EXW04';
    END IF;
    RETURN who;
END $$;
-- +goose StatementEnd

-- Whether a verdict on intent i needs a second person, and why ('' when not).
-- +goose StatementBegin
CREATE FUNCTION extworker_approval_needed(i extworker_intents, p_verdict text) RETURNS text LANGUAGE plpgsql STABLE
    SET search_path FROM CURRENT AS $$
DECLARE
    threshold bigint := coalesce((SELECT approval_threshold FROM extworker_ledger_settings WHERE namespace = i.namespace), 0);
BEGIN
    IF i.orphaned_at IS NOT NULL THEN
        RETURN 'the intent is orphaned (its task was cancelled after the effect was dispatched)';
    ELSIF p_verdict = 'rejected' THEN
        RETURN '';
    ELSIF i.amount IS NULL OR i.amount < 0 THEN
        RETURN 'the intent records no amount (or a negative one)';
    ELSIF i.amount > threshold THEN
        RETURN format('its amount %s is above the approval threshold %s', i.amount, threshold);
    END IF;
    RETURN '';
END $$;
-- +goose StatementEnd

-- Applies a verdict to intent i (locked by the caller), as a compare-and-set on the
-- state and attempt the verdict was given on, with its event. Returns false when the
-- intent moved since.
-- +goose StatementBegin
CREATE FUNCTION extworker_apply_verdict(p_intent bigint, p_from text, p_attempt integer, r extworker_resolutions,
    p_actor text, p_reason text) RETURNS boolean LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    moved bigint;
BEGIN
    IF r.verdict = 'confirmed' THEN
        UPDATE extworker_intents SET state = 'confirmed', updated_at = now(), lease_owner = NULL, lease_until = NULL,
            provider_ref = r.provider_ref, result = r.result, error_code = NULL, error_message = NULL
        WHERE id = p_intent AND state = p_from AND attempt = p_attempt RETURNING id INTO moved;
    ELSIF r.verdict = 'rejected' THEN
        UPDATE extworker_intents SET state = 'rejected', updated_at = now(), lease_owner = NULL, lease_until = NULL,
            provider_ref = r.provider_ref, error_code = coalesce(nullif(r.error_code, ''), 'REJECTED'), error_message = r.reason
        WHERE id = p_intent AND state = p_from AND attempt = p_attempt RETURNING id INTO moved;
    ELSIF r.verdict = 'prepared' THEN
        UPDATE extworker_intents SET state = 'prepared', updated_at = now(), lease_owner = NULL, lease_until = NULL,
            abandoned_attempts = 0, reconciliations = 0, error_code = NULL, error_message = NULL
        WHERE id = p_intent AND state = p_from AND attempt = p_attempt RETURNING id INTO moved;
    ELSIF r.verdict = 'closed' THEN
        UPDATE extworker_intents SET orphan_closed_at = now(), updated_at = now()
        WHERE id = p_intent AND state = p_from AND attempt = p_attempt AND orphaned_at IS NOT NULL AND orphan_closed_at IS NULL
        RETURNING id INTO moved;
    END IF;
    IF moved IS NULL THEN
        RETURN false;
    END IF;
    INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, reason)
    VALUES (p_intent, p_from, CASE WHEN r.verdict = 'closed' THEN p_from ELSE r.verdict END, p_attempt, p_actor, p_reason);
    RETURN true;
END $$;
-- +goose StatementEnd

-- What a resolution decides, for events and listings.
-- +goose StatementBegin
CREATE FUNCTION extworker_verdict_text(r extworker_resolutions) RETURNS text LANGUAGE sql IMMUTABLE SET search_path FROM CURRENT AS $$
    SELECT CASE r.verdict
        WHEN 'confirmed' THEN format('confirmed (provider ref %s, values %s)', coalesce(r.provider_ref, ''), coalesce(r.result::text, '{}'))
        WHEN 'rejected' THEN format('rejected (error code %s)', coalesce(nullif(r.error_code, ''), 'REJECTED'))
        WHEN 'prepared' THEN 'retry (send again with the same provider key)'
        WHEN 'closed' THEN 'close the orphan (dealt with outside the ledger)'
        ELSE r.verdict END
$$;
-- +goose StatementEnd

-- The characters a reader cannot see for what they are: controls (C0, DEL, C1), every
-- space but U+0020, zero-width and joiner characters, bidi controls, invisible
-- operators, fillers, the Braille blank, variation selectors and tag characters.
-- +goose StatementBegin
CREATE FUNCTION extworker_unseen_pattern() RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT '[\x01-\x1f\x7f-\xa0\u00ad\u034f\u061c\u115f\u1160\u1680\u17b4\u17b5\u180b-\u180f\u2000-\u200f\u2028-\u202f\u205f-\u206f\u2800\u3000\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffc\U00013430-\U0001343f\U00016fe4\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]'
$$;
-- +goose StatementEnd

-- An operator's verdict on an intent: applied at once when one person may give it
-- (status 'applied'), else recorded for a second person (status 'pending', with why).
-- +goose StatementBegin
CREATE FUNCTION extworker_resolve(p_namespace text, p_scope text, p_key text, p_verdict text, p_provider_ref text,
    p_result jsonb, p_error_code text, p_reason text, p_operator text,
    OUT resolution_id bigint, OUT status text, OUT why text)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    v_me text := extworker_operator_identity(p_operator);
    v_reason text := btrim(coalesce(p_reason, ''));
    i extworker_intents;
    r extworker_resolutions;
BEGIN
    IF p_verdict IS NULL OR p_verdict NOT IN ('confirmed', 'rejected', 'prepared', 'closed') THEN
        RAISE EXCEPTION 'the verdict must be confirmed, rejected, retry (prepared) or closed, not "%"', left(p_verdict, 40) USING ERRCODE = 'EXW05';
    ELSIF v_reason = '' THEN
        RAISE EXCEPTION 'a verdict needs a reason' USING ERRCODE = 'EXW05';
    ELSIF p_verdict = 'confirmed' AND coalesce(btrim(p_provider_ref), '') = '' THEN
        RAISE EXCEPTION 'confirming needs the provider''s reference' USING ERRCODE = 'EXW05';
    ELSIF p_verdict <> 'confirmed' AND (p_result IS NOT NULL OR (p_verdict <> 'rejected' AND (coalesce(p_provider_ref, '') <> '' OR coalesce(p_error_code, '') <> ''))) THEN
        RAISE EXCEPTION 'a % verdict writes no provider reference, values or error code beyond its own', p_verdict USING ERRCODE = 'EXW05';
    ELSIF p_verdict = 'confirmed' AND coalesce(p_error_code, '') <> '' THEN
        RAISE EXCEPTION 'a confirmation has no error code' USING ERRCODE = 'EXW05';
    ELSIF concat(p_provider_ref, p_error_code, p_result::text) ~ extworker_unseen_pattern() THEN
        -- What the approver reads must be what is written: no character that is
        -- invisible, looks like a space, reorders the text around it, or moves the cursor.
        RAISE EXCEPTION 'the provider reference, error code and values may not hold control, format, invisible or space-like characters other than the space (found U+%)',
            (SELECT upper(lpad(h, greatest(4, length(h)), '0'))
             FROM to_hex(ascii(substring(concat(p_provider_ref, p_error_code, p_result::text) FROM extworker_unseen_pattern()))) AS h)
            USING ERRCODE = 'EXW05';
    ELSIF p_provider_ref <> btrim(p_provider_ref) OR p_provider_ref LIKE '%  %' THEN
        RAISE EXCEPTION 'the provider reference may not begin or end with a space, nor hold two in a row' USING ERRCODE = 'EXW05';
    END IF;
    SELECT * INTO i FROM extworker_intents WHERE namespace = p_namespace AND scope = p_scope AND intent_key = p_key FOR UPDATE;
    IF i.id IS NULL THEN
        RAISE EXCEPTION 'no intent %/% in namespace %', p_scope, p_key, p_namespace USING ERRCODE = 'no_data_found';
    END IF;
    IF p_verdict = 'closed' THEN
        IF i.orphaned_at IS NULL OR i.orphan_closed_at IS NOT NULL THEN
            RAISE EXCEPTION 'intent %/% is not an open orphan: only orphaned intents are closed', p_scope, p_key USING ERRCODE = 'EXW05';
        END IF;
    ELSIF i.state NOT IN ('unknown', 'operator_hold') THEN
        RAISE EXCEPTION 'intent %/% is %; only unknown or held intents are resolved by an operator', p_scope, p_key, i.state
            USING ERRCODE = 'EXW05';
    END IF;
    IF EXISTS (SELECT FROM extworker_resolutions x WHERE x.intent_id = i.id AND x.status = 'pending') THEN
        RAISE EXCEPTION 'a resolution is already pending for %/%: approve or reject it first', p_scope, p_key USING ERRCODE = 'EXW03';
    END IF;
    INSERT INTO extworker_resolutions (intent_id, namespace, scope, intent_key, from_state, attempt, verdict, provider_ref,
        result, error_code, reason, requested_by)
    VALUES (i.id, p_namespace, p_scope, p_key, i.state, i.attempt, p_verdict, nullif(p_provider_ref, ''), p_result,
        nullif(p_error_code, ''), v_reason, v_me)
    RETURNING * INTO r;
    resolution_id := r.id;
    why := extworker_approval_needed(i, p_verdict);
    IF why <> '' THEN
        status := 'pending';
        INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, reason)
        VALUES (i.id, i.state, i.state, i.attempt, 'operator:' || v_me,
            format('resolution #%s requested: %s; waits for a second operator (%s): %s', r.id, extworker_verdict_text(r), why, v_reason));
        RETURN;
    END IF;
    -- One person's call: applied now, and kept as a request its requester decided.
    PERFORM extworker_apply_verdict(i.id, i.state, i.attempt, r, 'operator:' || v_me, 'operator resolution: ' || v_reason);
    UPDATE extworker_resolutions SET status = 'approved', decided_by = v_me, decided_db_user = session_user, decided_at = now(),
        decision_reason = 'one operator''s call: no second operator needed' WHERE id = r.id;
    status := 'applied';
END $$;
-- +goose StatementEnd

-- A second person's decision on a pending resolution. p_approve: apply it (refused to
-- its requester: by person, and by database user outside the console's login); else
-- reject it (its requester may withdraw it). Returns the resolution's new status:
-- 'approved', 'rejected', or 'stale' when the intent moved since the request (the
-- verdict is not applied).
-- +goose StatementBegin
CREATE FUNCTION extworker_decide(p_namespace text, p_id bigint, p_approve boolean, p_reason text, p_operator text)
    RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    v_me text := extworker_operator_identity(p_operator);
    v_reason text := btrim(coalesce(p_reason, ''));
    r extworker_resolutions;
    outcome text;
BEGIN
    IF v_reason = '' THEN
        RAISE EXCEPTION 'a decision needs a reason' USING ERRCODE = 'EXW05';
    ELSIF p_approve IS NULL THEN
        RAISE EXCEPTION 'a decision approves (true) or rejects (false)' USING ERRCODE = 'EXW05';
    END IF;
    SELECT * INTO r FROM extworker_resolutions WHERE id = p_id AND namespace = p_namespace FOR UPDATE;
    IF r.id IS NULL THEN
        RAISE EXCEPTION 'no resolution #% in namespace %', p_id, p_namespace USING ERRCODE = 'no_data_found';
    ELSIF r.status <> 'pending' THEN
        RAISE EXCEPTION 'resolution #% is %', p_id, r.status USING ERRCODE = 'EXW01';
    ELSIF p_approve AND (lower(r.requested_by) = lower(v_me) OR (r.requested_db_user = session_user AND NOT extworker_member('console'))) THEN
        RAISE EXCEPTION 'resolution #% was requested by % (database user %), and % (database user %) may not approve it; a second operator does',
            p_id, r.requested_by, r.requested_db_user, v_me, session_user USING ERRCODE = 'EXW02';
    END IF;
    PERFORM FROM extworker_intents WHERE id = r.intent_id FOR UPDATE;
    IF NOT p_approve THEN
        outcome := 'rejected';
        INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, reason)
        VALUES (r.intent_id, r.from_state, r.from_state, r.attempt, 'operator:' || v_me,
            format('resolution #%s (%s, requested by %s) %s by %s (database user %s): %s; the intent is unchanged',
                r.id, extworker_verdict_text(r), r.requested_by,
                CASE WHEN lower(r.requested_by) = lower(v_me) THEN 'withdrawn' ELSE 'rejected' END, v_me, session_user, v_reason));
    ELSIF extworker_apply_verdict(r.intent_id, r.from_state, r.attempt, r, 'operator:' || v_me,
            format('operator resolution #%s: %s, requested by %s (database user %s) at %s: %s; approved by %s (database user %s): %s',
                r.id, extworker_verdict_text(r), r.requested_by, r.requested_db_user,
                to_char(r.requested_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), r.reason, v_me, session_user, v_reason)) THEN
        outcome := 'approved';
    ELSE
        outcome := 'stale';
        INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, reason)
        SELECT id, state, state, attempt, 'operator:' || v_me,
            format('resolution #%s went stale at approval by %s: the intent moved since the request', r.id, v_me)
        FROM extworker_intents WHERE id = r.intent_id;
    END IF;
    UPDATE extworker_resolutions SET status = outcome, decided_by = v_me, decided_db_user = session_user, decided_at = now(),
        decision_reason = v_reason WHERE id = r.id;
    RETURN outcome;
END $$;
-- +goose StatementEnd

-- What identifies an intent, what it moves and whether it was orphaned are fixed once
-- recorded, for everyone (the owner disables the trigger deliberately): a worker login
-- could otherwise lower the amount or clear the orphan flag under the two-person rule, or
-- swap the intent a pending resolution names. The WHEN clause keeps it off the hot path.
-- +goose StatementBegin
CREATE FUNCTION extworker_intents_fixed() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    -- The ledger's owner: who the verdict functions run as, and the DBA.
    owner boolean := current_user = (SELECT r.rolname FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE c.oid = TG_RELID);
BEGIN
    IF OLD.namespace IS DISTINCT FROM NEW.namespace OR OLD.scope IS DISTINCT FROM NEW.scope
        OR OLD.intent_key IS DISTINCT FROM NEW.intent_key OR OLD.provider_key IS DISTINCT FROM NEW.provider_key
        OR OLD.request_digest IS DISTINCT FROM NEW.request_digest OR OLD.amount IS DISTINCT FROM NEW.amount
        OR OLD.compensates_id IS DISTINCT FROM NEW.compensates_id
        OR (OLD.orphaned_at IS NOT NULL AND NEW.orphaned_at IS DISTINCT FROM OLD.orphaned_at)
        OR (OLD.orphan_closed_at IS NOT NULL AND NEW.orphan_closed_at IS DISTINCT FROM OLD.orphan_closed_at) THEN
        RAISE EXCEPTION 'intent %: its namespace, scope, key, provider key, request digest, amount and compensated intent are fixed once recorded, and an orphan stays flagged', OLD.id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- Closing an orphan is two people's verdict (extworker_decide, as the owner), and the
    -- last change's time, which prune reads, is the database's.
    IF NOT owner AND NEW.orphan_closed_at IS DISTINCT FROM OLD.orphan_closed_at THEN
        RAISE EXCEPTION 'intent %: an orphan is closed by two operators (extworker effects resolve --as close), not by %', OLD.id, session_user
            USING ERRCODE = 'insufficient_privilege';
    ELSIF NOT owner AND NEW.updated_at IS DISTINCT FROM OLD.updated_at AND NEW.updated_at IS DISTINCT FROM now() THEN
        RAISE EXCEPTION 'intent %: its last change is the database''s time (now()), not %', OLD.id, NEW.updated_at
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $$;
-- +goose StatementEnd
CREATE TRIGGER extworker_intents_fixed BEFORE UPDATE ON extworker_intents FOR EACH ROW
    WHEN (OLD.namespace IS DISTINCT FROM NEW.namespace OR OLD.scope IS DISTINCT FROM NEW.scope
        OR OLD.intent_key IS DISTINCT FROM NEW.intent_key OR OLD.provider_key IS DISTINCT FROM NEW.provider_key
        OR OLD.request_digest IS DISTINCT FROM NEW.request_digest OR OLD.amount IS DISTINCT FROM NEW.amount
        OR OLD.compensates_id IS DISTINCT FROM NEW.compensates_id
        OR (OLD.orphaned_at IS NOT NULL AND NEW.orphaned_at IS DISTINCT FROM OLD.orphaned_at)
        OR NEW.orphan_closed_at IS DISTINCT FROM OLD.orphan_closed_at
        OR (NEW.updated_at IS DISTINCT FROM OLD.updated_at AND NEW.updated_at IS DISTINCT FROM now()))
    EXECUTE FUNCTION extworker_intents_fixed();

-- An event names the database user that wrote it and the database's time: a login other
-- than the owner may not write another's name or another time into the evidence.
-- +goose StatementBegin
CREATE FUNCTION extworker_events_signed() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    -- The owner (a DBA restoring or seeding a ledger) writes what it means to.
    IF current_user = (SELECT r.rolname FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE c.oid = TG_RELID) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'an event records the database user that wrote it (%) and the database''s time, not % at %', session_user, NEW.db_user, NEW.at
        USING ERRCODE = 'insufficient_privilege';
END $$;
-- +goose StatementEnd
CREATE TRIGGER extworker_intent_events_signed BEFORE INSERT ON extworker_intent_events FOR EACH ROW
    WHEN (NEW.db_user IS DISTINCT FROM session_user OR NEW.at < clock_timestamp() - interval '5 seconds' OR NEW.at > clock_timestamp())
    EXECUTE FUNCTION extworker_events_signed();

-- The hold guard reads the role names of this ledger.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION extworker_guard_operator_hold() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF OLD.state = 'operator_hold' AND NEW.state <> 'operator_hold'
        AND EXISTS (SELECT FROM pg_roles WHERE rolname = extworker_role('worker'))
        AND EXISTS (SELECT FROM pg_roles WHERE rolname = extworker_role('operator'))
        AND pg_has_role(session_user, extworker_role('worker'), 'MEMBER')
        AND NOT pg_has_role(session_user, extworker_role('operator'), 'MEMBER') THEN
        RAISE EXCEPTION 'database user % (%) may not settle intent % held for an operator', session_user, extworker_role('worker'), OLD.id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $$;
-- +goose StatementEnd

-- Prune: as 00003's, and a closed orphan is pruned like any settled intent.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION extworker_prune(p_namespace text, p_older_than interval, p_batch integer) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    n integer;
BEGIN
    -- The cutoff itself, not the interval: '-100 years 36001 days' compares equal to a
    -- day, and lands in the future.
    IF p_older_than IS NULL OR now() - p_older_than > now() - interval '1 day' THEN
        RAISE EXCEPTION 'extworker_prune: retention % is under a day', p_older_than USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH victims AS (
        SELECT id FROM extworker_intents
        WHERE namespace = p_namespace AND state IN ('confirmed', 'rejected', 'reconciled', 'compensated')
            AND (orphaned_at IS NULL OR orphan_closed_at IS NOT NULL) AND updated_at < now() - p_older_than
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

-- Every function here, 00003's prune among them, resolves names in pg_catalog, then the
-- ledger's schema, then pg_temp, last: a temporary table named like a ledger table can
-- no longer stand in for it (pg_temp is searched first when a search_path leaves it out,
-- which "SET search_path FROM CURRENT" did).
-- +goose StatementBegin
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['extworker_role(text)', 'extworker_member(text)', 'extworker_operator_identity(text)',
        'extworker_approval_needed(extworker_intents, text)',
        'extworker_apply_verdict(bigint, text, integer, extworker_resolutions, text, text)',
        'extworker_verdict_text(extworker_resolutions)', 'extworker_unseen_pattern()',
        'extworker_resolve(text, text, text, text, text, jsonb, text, text, text)',
        'extworker_decide(text, bigint, boolean, text, text)', 'extworker_guard_operator_hold()',
        'extworker_prune(text, interval, integer)', 'extworker_events_append_only()', 'extworker_intents_fixed()',
        'extworker_events_signed()', 'extworker_name_skeleton(text)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, current_schema());
    END LOOP;
END $$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION extworker_resolve(text, text, text, text, text, jsonb, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION extworker_decide(text, bigint, boolean, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION extworker_apply_verdict(bigint, text, integer, extworker_resolutions, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION extworker_operator_identity(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION extworker_prune(text, interval, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION extworker_approval_needed(extworker_intents, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION extworker_verdict_text(extworker_resolutions) FROM PUBLIC;

-- The grants, for the roles this ledger names (extworker_ledger_roles), when a DBA has
-- created them. Operators read; they write nothing but through the functions. Nobody
-- but the owner writes the registry, the role names or the settings.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION extworker_apply_grants() RETURNS text LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    done text := '';
    w text := extworker_role('worker');
    o text := extworker_role('operator');
    s text := current_schema();
BEGIN
    -- Concurrent GRANTs on one object fail ("tuple concurrently updated"): one at a time.
    PERFORM pg_advisory_xact_lock(hashtext('extworker_apply_grants'));
    REVOKE ALL ON extworker_intents, extworker_intent_events, extworker_intent_tombstones, extworker_resolutions,
        extworker_operators, extworker_ledger_roles, extworker_ledger_settings FROM PUBLIC;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = w) THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON extworker_intents TO %I', w);
        EXECUTE format('REVOKE DELETE, TRUNCATE ON extworker_intents FROM %I', w);
        EXECUTE format('GRANT SELECT, INSERT ON extworker_intent_events TO %I', w);
        EXECUTE format('REVOKE UPDATE, DELETE, TRUNCATE ON extworker_intent_events FROM %I', w);
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON extworker_resolutions, extworker_intent_tombstones FROM %I', w);
        EXECUTE format('GRANT SELECT ON extworker_intent_tombstones, extworker_schema_migrations, extworker_ledger_roles, extworker_ledger_settings TO %I', w);
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', s, w);
        EXECUTE format('GRANT USAGE ON SEQUENCE extworker_intents_id_seq, extworker_intent_events_id_seq TO %I', w);
        EXECUTE format('GRANT EXECUTE ON FUNCTION extworker_prune(text, interval, integer) TO %I', w);
        done := done || w || ' ';
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = o) THEN
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON extworker_intents, extworker_intent_events, extworker_resolutions, extworker_intent_tombstones FROM %I', o);
        EXECUTE format('GRANT SELECT ON extworker_intents, extworker_intent_events, extworker_intent_tombstones, extworker_resolutions, extworker_operators, extworker_ledger_roles, extworker_ledger_settings, extworker_schema_migrations TO %I', o);
        EXECUTE format('REVOKE USAGE ON SEQUENCE extworker_intent_events_id_seq, extworker_resolutions_id_seq FROM %I', o);
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', s, o);
        EXECUTE format('GRANT EXECUTE ON FUNCTION extworker_prune(text, interval, integer), extworker_resolve(text, text, text, text, text, jsonb, text, text, text), extworker_decide(text, bigint, boolean, text, text) TO %I', o);
        done := done || o || ' ';
    END IF;
    RETURN btrim(done);
END $$;
-- +goose StatementEnd

-- What a role the ledger no longer names held on its schema (migrations.SetRoles).
-- +goose StatementBegin
CREATE FUNCTION extworker_revoke_all(p_role text) RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = p_role) THEN
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA %I FROM %I', current_schema(), p_role);
        EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA %I FROM %I', current_schema(), p_role);
        EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA %I FROM %I', current_schema(), p_role);
        EXECUTE format('REVOKE ALL ON SCHEMA %I FROM %I', current_schema(), p_role);
    END IF;
END $$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION extworker_revoke_all(text) FROM PUBLIC;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION extworker_apply_outbox_grants() RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    w text := extworker_role('worker');
    o text := extworker_role('operator');
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('extworker_apply_grants'));
    REVOKE ALL ON extworker_outbox FROM PUBLIC;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = w) THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON extworker_outbox TO %I', w);
        EXECUTE format('GRANT USAGE ON SEQUENCE extworker_outbox_id_seq TO %I', w);
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = o) THEN
        EXECUTE format('GRANT SELECT ON extworker_outbox TO %I', o);
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON extworker_outbox FROM %I', o);
    END IF;
END $$;
-- +goose StatementEnd

-- Operators keep UPDATE on the inbox: `extworker inbox replay` puts a parked row back to
-- RECEIVED. An inbox row moves no money; the replayed message goes through the inbox
-- again, duplicates suppressed.
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
REVOKE ALL ON FUNCTION extworker_apply_grants() FROM PUBLIC;
REVOKE ALL ON FUNCTION extworker_apply_outbox_grants() FROM PUBLIC;
REVOKE ALL ON FUNCTION extworker_apply_inbox_grants() FROM PUBLIC;

-- +goose Down
DROP FUNCTION extworker_revoke_all(text);
DROP TRIGGER extworker_intents_fixed ON extworker_intents;
DROP TRIGGER extworker_intent_events_signed ON extworker_intent_events;
DROP FUNCTION extworker_events_signed();
DROP FUNCTION extworker_intents_fixed();
DROP FUNCTION extworker_decide(text, bigint, boolean, text, text);
DROP FUNCTION extworker_resolve(text, text, text, text, text, jsonb, text, text, text);
DROP FUNCTION extworker_verdict_text(extworker_resolutions);
DROP FUNCTION extworker_unseen_pattern();
DROP FUNCTION extworker_apply_verdict(bigint, text, integer, extworker_resolutions, text, text);
DROP FUNCTION extworker_approval_needed(extworker_intents, text);
DROP FUNCTION extworker_operator_identity(text);
ALTER TABLE extworker_resolutions DROP CONSTRAINT extworker_resolutions_verdict_check;
DELETE FROM extworker_resolutions WHERE verdict = 'closed';
ALTER TABLE extworker_resolutions ADD CONSTRAINT extworker_resolutions_verdict_check CHECK (verdict IN ('confirmed', 'rejected', 'prepared'));
ALTER TABLE extworker_intents DROP COLUMN orphan_closed_at;
-- 00003's, 00004's and 00005's functions as they were.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION extworker_guard_operator_hold() RETURNS trigger LANGUAGE plpgsql AS $$
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
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION extworker_prune(p_namespace text, p_older_than interval, p_batch integer) RETURNS integer
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
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION extworker_apply_grants() RETURNS text LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION extworker_apply_outbox_grants() RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('extworker_apply_grants'));
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'extworker_worker') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON extworker_outbox TO extworker_worker;
        GRANT USAGE ON SEQUENCE extworker_outbox_id_seq TO extworker_worker;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'extworker_operator') THEN
        GRANT SELECT ON extworker_outbox TO extworker_operator;
    END IF;
END $$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION extworker_apply_inbox_grants() RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('extworker_apply_grants'));
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'extworker_worker') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON extworker_inbox, extworker_inbox_conflicts TO extworker_worker;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'extworker_operator') THEN
        GRANT SELECT, UPDATE ON extworker_inbox TO extworker_operator;
        GRANT SELECT ON extworker_inbox_conflicts TO extworker_operator;
    END IF;
END $$;
-- +goose StatementEnd
ALTER FUNCTION extworker_events_append_only() RESET search_path;
DROP FUNCTION extworker_member(text);
DROP FUNCTION extworker_role(text);
DROP TABLE extworker_ledger_roles;
DROP TABLE extworker_ledger_settings;
DROP TABLE extworker_operators;
DROP FUNCTION extworker_name_skeleton(text);
