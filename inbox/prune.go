package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Prune deletes the rows of messages settled (processed or ignored_duplicate) more than
// olderThan ago, in batches, and returns how many it deleted; and the start claims
// (extworker_inbox_starts) last changed more than olderThan ago, long past the in-flight
// window in which they make a start of the same key wait. Parked, retrying and
// in-flight rows are never pruned. A message redelivered after its row was pruned is
// still acted on at most once: a start finds its instance by business key, a
// correlation finds its mark on the instance; keep olderThan above how long a producer
// or the broker may redeliver (the ledger's retention, EXTWORKER_LEDGER_RETENTION, by
// default).
func Prune(ctx context.Context, pool *pgxpool.Pool, olderThan time.Duration) (int64, error) {
	var total int64
	for {
		tag, err := pool.Exec(ctx, `DELETE FROM extworker_inbox WHERE (source, message_id) IN (SELECT source, message_id FROM extworker_inbox
			WHERE state IN ('processed', 'ignored_duplicate') AND updated_at < now() - $1::bigint * interval '1 microsecond' LIMIT 1000)`,
			olderThan.Microseconds())
		if err != nil {
			return total, fmt.Errorf("inbox: prune: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 1000 {
			break
		}
	}
	for {
		tag, err := pool.Exec(ctx, `DELETE FROM extworker_inbox_starts WHERE (process_key, business_key) IN (SELECT process_key, business_key
			FROM extworker_inbox_starts WHERE updated_at < now() - $1::bigint * interval '1 microsecond' LIMIT 1000)`, olderThan.Microseconds())
		if err != nil {
			return total, fmt.Errorf("inbox: prune the start claims: %w", err)
		}
		if tag.RowsAffected() < 1000 {
			return total, nil
		}
	}
}
