package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Parked is what of the inbox waits: for an operator (parked in a dead-letter queue) or
// for a retry. ReadParked reads it; package metrics exposes it (metrics.InboxCollector).
type Parked struct {
	// Messages counts the parked messages (state failed_final): each waits in its queue's
	// dead-letter queue for an operator to fix the cause and replay it.
	Messages int
	// Conflicts counts the copies parked because their message id came with another
	// body (extworker_inbox_conflicts, each delivery counted). They stay in the
	// dead-letter queue, whatever the state of the message they conflict with: the
	// producer has to send them under a new message id.
	Conflicts int
	// OldestAge is how long the oldest parked message has been parked; 0 when none is.
	OldestAge time.Duration
	// Retrying counts the messages waiting in a retry queue to be handled again (early, or
	// the engine unreachable: failed_retryable; its answer lost: unknown).
	Retrying int
}

// ReadParked counts what waits in the inbox of source; an empty source counts every
// source's. db is a pool, a connection or a transaction.
//
// The parked rows are found through their index (parked_at); counting the retrying ones
// reads the source's rows.
func ReadParked(ctx context.Context, db Querier, source string) (Parked, error) {
	var (
		p                           Parked
		parked, conflicts, retrying int64
		age                         *float64
	)
	rows, err := db.Query(ctx, `SELECT p.n, p.age, c.n, r.n
		FROM (SELECT count(*) AS n, extract(epoch FROM now() - min(parked_at)) AS age FROM extworker_inbox
				WHERE parked_at IS NOT NULL AND state = 'failed_final' AND ($1 = '' OR source = $1)) p,
			(SELECT coalesce(sum(deliveries), 0) AS n FROM extworker_inbox_conflicts WHERE $1 = '' OR source = $1) c,
			(SELECT count(*) AS n FROM extworker_inbox
				WHERE state IN ('failed_retryable', 'unknown') AND ($1 = '' OR source = $1)) r`, source)
	if err != nil {
		return p, fmt.Errorf("inbox: read parked: %w", err)
	}
	n := 0
	if _, err := pgx.ForEachRow(rows, []any{&parked, &age, &conflicts, &retrying}, func() error { n++; return nil }); err != nil {
		return p, fmt.Errorf("inbox: read parked: %w", err)
	}
	if n != 1 {
		return p, fmt.Errorf("inbox: read parked: %d rows, want 1", n)
	}
	p.Messages, p.Conflicts, p.Retrying = int(parked), int(conflicts), int(retrying)
	if age != nil && *age > 0 {
		p.OldestAge = time.Duration(*age * float64(time.Second))
	}
	return p, nil
}
