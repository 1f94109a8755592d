-- +goose Up
-- The transactional outbox (docs/events.md): events a handler adds in the transaction of
-- its business rows and the ledger's confirm, published by a relay afterwards. The body
-- is kept only until the broker confirms it; then only its digest stays.
CREATE TABLE extworker_outbox (
    id              bigserial   PRIMARY KEY,
    namespace       text        NOT NULL,
    message_id      text        NOT NULL,
    ordering_key    text        NOT NULL,
    exchange        text        NOT NULL,
    routing_key     text        NOT NULL,
    type            text        NOT NULL,
    correlation_id  text,
    body            bytea,
    body_digest     text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz,
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    CONSTRAINT extworker_outbox_message UNIQUE (namespace, message_id)
);
-- The relay's queue: unpublished events, oldest first, and the head of each ordering key.
CREATE INDEX extworker_outbox_pending ON extworker_outbox (namespace, id) WHERE published_at IS NULL;
CREATE INDEX extworker_outbox_key ON extworker_outbox (namespace, ordering_key, id) WHERE published_at IS NULL;

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

-- +goose Down
DROP FUNCTION extworker_apply_outbox_grants();
DROP TABLE extworker_outbox;
