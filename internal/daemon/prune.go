package daemon

import (
	"context"
	"log/slog"
	"time"
)

// PrunePeriodically calls prune (the ledger's Prune, the outbox's) now and then every
// interval until ctx ends, logging what it deleted or why it failed; what names it in
// the records ("settled intents", "published outbox events").
func PrunePeriodically(ctx context.Context, what string, prune func(context.Context) (int64, error), every time.Duration, logger *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		n, err := prune(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			logger.Warn("pruning "+what+" failed; will try again", slog.Any("error", err))
		case n > 0:
			logger.Info("pruned "+what, slog.Int64("deleted", n))
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}
