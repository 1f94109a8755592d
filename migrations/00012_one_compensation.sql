-- +goose Up
-- One compensation per original: at most one compensating intent that was not declined
-- (state rejected) names an original (compensates_id), from the moment it is recorded,
-- so two refunds of one charge cannot both be dispatched, even when recorded at once
-- (the second insert is refused: idempotency.ErrCompensationExists). A declined refund
-- leaves the place free for another.
--
-- A database that already holds more than one such intent for an original (recorded
-- before this rule, all of which the provider may have acted on) keeps them as they are:
-- the index leaves out every one but the first of each original, by id, and a warning
-- names them for an operator. The first still takes the place, so no new compensating
-- intent of those originals is recorded.
-- +goose StatementBegin
DO $$
DECLARE
    extra text;
BEGIN
    SELECT string_agg(id::text, ', ' ORDER BY id) INTO extra FROM (
        SELECT id, row_number() OVER (PARTITION BY compensates_id ORDER BY id) AS n
        FROM extworker_intents WHERE compensates_id IS NOT NULL AND state <> 'rejected') d
    WHERE n > 1;
    IF extra IS NULL THEN
        CREATE UNIQUE INDEX extworker_intents_one_compensation ON extworker_intents (compensates_id)
            WHERE compensates_id IS NOT NULL AND state <> 'rejected';
    ELSE
        RAISE WARNING 'extworker: intents % compensate an original another intent already compensates; left out of extworker_intents_one_compensation, check them with the provider', extra;
        EXECUTE format('CREATE UNIQUE INDEX extworker_intents_one_compensation ON extworker_intents (compensates_id)
            WHERE compensates_id IS NOT NULL AND state <> %L AND id NOT IN (%s)', 'rejected', extra);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP INDEX extworker_intents_one_compensation;
