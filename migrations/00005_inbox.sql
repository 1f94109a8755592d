-- +goose Up
-- The inbox (docs/events.md): every message a consumer takes, recorded before it acts,
-- keyed by its source and message id. The body is never stored: its digest tells a
-- redelivery from a conflicting message with the same id.
CREATE TABLE extworker_inbox (
    source              text        NOT NULL,
    message_id          text        NOT NULL,
    type                text        NOT NULL DEFAULT '',
    body_digest         text        NOT NULL,
    correlation_id      text,
    state               text        NOT NULL DEFAULT 'RECEIVED' CHECK (state IN ('RECEIVED', 'PROCESSING', 'PROCESSED',
                            'FAILED_RETRYABLE', 'FAILED_FINAL', 'IGNORED_DUPLICATE', 'UNKNOWN_OUTCOME')),
    -- what the message asked of the engine: "start <process key>" or "correlate <message name>"
    action              text,
    business_key        text,
    process_instance_id text,
    -- why it is in its state: the last failure, why it was ignored, why it was parked
    reason              text,
    deliveries          integer     NOT NULL DEFAULT 1,
    duplicates          integer     NOT NULL DEFAULT 0,
    attempts            integer     NOT NULL DEFAULT 0,
    conflicts           integer     NOT NULL DEFAULT 0,
    replays             integer     NOT NULL DEFAULT 0,
    -- when the last attempt began asking the engine: a request of an attempt whose end
    -- nobody recorded may still land until inbox.Config.InFlightWindow has passed
    attempt_started_at  timestamptz,
    received_at         timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    processed_at        timestamptz,
    parked_at           timestamptz,
    PRIMARY KEY (source, message_id)
);
CREATE INDEX extworker_inbox_parked ON extworker_inbox (parked_at) WHERE parked_at IS NOT NULL;
CREATE INDEX extworker_inbox_settled ON extworker_inbox (updated_at) WHERE state IN ('PROCESSED', 'IGNORED_DUPLICATE');

-- Messages that came with a known id and another body: never acted on, parked.
CREATE TABLE extworker_inbox_conflicts (
    source      text        NOT NULL,
    message_id  text        NOT NULL,
    body_digest text        NOT NULL,
    deliveries  integer     NOT NULL DEFAULT 1,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, message_id, body_digest)
);

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

-- +goose Down
DROP FUNCTION extworker_apply_inbox_grants();
DROP TABLE extworker_inbox_conflicts;
DROP TABLE extworker_inbox;
