-- +goose Up
-- The effect ledger: one row per business intent (namespace, scope, intent key), with
-- the digest of its request (never the body), the key the provider sees, and where in
-- its lifecycle it is. Every transition is a compare-and-set on (state, attempt) and
-- appends an event.
CREATE TABLE extworker_intents (
    id                  bigserial PRIMARY KEY,
    namespace           text        NOT NULL,
    scope               text        NOT NULL,
    intent_key          text        NOT NULL,
    request_digest      text        NOT NULL,
    provider_key        text        NOT NULL,
    state               text        NOT NULL CHECK (state IN ('prepared', 'dispatched', 'confirmed', 'rejected',
                                                              'unknown', 'reconciled', 'compensated', 'operator_hold')),
    attempt             integer     NOT NULL DEFAULT 0,
    lease_owner         text,
    lease_until         timestamptz,
    dispatches          integer     NOT NULL DEFAULT 0,
    reconciliations     integer     NOT NULL DEFAULT 0,
    provider_ref        text,
    result              jsonb,
    error_code          text,
    error_message       text,
    task_id             text,
    process_instance_id text,
    business_key        text,
    first_dispatched_at timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT extworker_intents_unique UNIQUE (namespace, scope, intent_key)
);

CREATE INDEX extworker_intents_state_idx ON extworker_intents (state, updated_at);

-- Append-only: who moved an intent from which state to which, and why.
CREATE TABLE extworker_intent_events (
    id         bigserial PRIMARY KEY,
    intent_id  bigint      NOT NULL REFERENCES extworker_intents (id) ON DELETE CASCADE,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    from_state text,
    to_state   text        NOT NULL,
    attempt    integer     NOT NULL,
    actor      text        NOT NULL,
    task_id    text,
    reason     text        NOT NULL
);

CREATE INDEX extworker_intent_events_intent_idx ON extworker_intent_events (intent_id, id);

-- +goose Down
DROP TABLE extworker_intent_events;
DROP TABLE extworker_intents;
