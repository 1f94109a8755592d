package daemon

import (
	"context"
	"log/slog"
	"time"

	"github.com/extworker/extworker/idempotency"
)

// PrunePeriodically deletes settled intents older than retention, every interval, until
// ctx ends.
func PrunePeriodically(ctx context.Context, l *idempotency.Ledger, retention, every time.Duration, logger *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		n, err := l.Prune(ctx, retention)
		switch {
		case err != nil && ctx.Err() == nil:
			logger.Warn("pruning the ledger failed; will try again", slog.Any("error", err))
		case n > 0:
			logger.Info("pruned settled intents", slog.Int64("deleted", n), slog.Duration("retention", retention))
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}
