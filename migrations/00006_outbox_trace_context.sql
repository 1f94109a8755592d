-- +goose Up
-- The W3C trace context of the span an event was added in (docs/events.md, Traces): the
-- relay's publish continues that trace and sends it along in the message's traceparent
-- and tracestate headers. NULL for an event added outside a trace, or with traces off.
-- Both are nullable without a default: adding them rewrites no row. The table's grants
-- (extworker_apply_outbox_grants, table-wide) cover them.
ALTER TABLE extworker_outbox
    ADD COLUMN traceparent text,
    ADD COLUMN tracestate  text;

-- +goose Down
ALTER TABLE extworker_outbox
    DROP COLUMN tracestate,
    DROP COLUMN traceparent;
