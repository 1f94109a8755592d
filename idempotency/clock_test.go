package idempotency_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
)

// skewedLedger returns a ledger whose worker clock is off from the database's by skew
// (positive: the worker's clock is ahead). The ledger has no clock hook, and needs none:
// the test moves the database's clock instead, by a now() function in a schema of its
// own, placed before pg_catalog in the search path of the ledger's connections only.
// The worker keeps the real clock; every timestamp the ledger stores and every now() it
// compares with is then skew behind (or ahead of) the worker's time.Now.
func skewedLedger(t *testing.T, cfg idempotency.Config, skew time.Duration) (*idempotency.Ledger, *pgxpool.Pool) {
	t.Helper()
	_, shared := newLedger(t, idempotency.Config{}) // migrated
	ctx := testenv.Context(t, time.Minute)
	schema := strings.ReplaceAll(testenv.Unique("ew_skew"), "-", "_")
	_, err := shared.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %[1]s;
		CREATE FUNCTION %[1]s.now() RETURNS timestamptz LANGUAGE sql STABLE AS $$ SELECT pg_catalog.now() - %[2]d * interval '1 microsecond' $$`,
		schema, skew.Microseconds()))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = shared.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`) })

	pc, err := pgxpool.ParseConfig(testenv.DBURL())
	require.NoError(t, err)
	pc.ConnConfig.RuntimeParams["search_path"] = schema + ", public, pg_catalog"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var dbNow time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT now()`).Scan(&dbNow))
	require.InDelta(t, skew.Seconds(), time.Since(dbNow).Seconds(), 5, "the database's clock is off by the skew")

	cfg.Namespace = testenv.Unique("ns")
	l, err := idempotency.New(pool, cfg)
	require.NoError(t, err)
	return l, pool
}

// Defect 4: the provider window and the search lag compared the worker's clock with
// timestamps the database wrote. Every comparison with a stored timestamp uses the
// database's clock, so a worker clock far off changes nothing.
func TestWorkerClockSkewDoesNotMoveWindowOrSearchLag(t *testing.T) {
	t.Parallel()

	// A worker clock two minutes fast must not trust a business search's "not found"
	// right after an ambiguous dispatch, inside a one-minute index lag: sending again
	// there could be a second charge the index has not shown yet.
	t.Run("fast worker clock, search lag", func(t *testing.T) {
		t.Parallel()
		const lag = time.Minute
		l, _ := skewedLedger(t, idempotency.Config{ReconcileBackoff: time.Millisecond}, 2*time.Minute)
		p := newProvider()
		p.drop = true // ambiguous; the search will find nothing
		eff := idempotency.Effect{Dispatch: p.charge, SearchLag: lag,
			Search: func(ctx context.Context, q idempotency.Query) (idempotency.Reconciliation, error) {
				return p.lookup(ctx, q)
			}}
		ctx := testenv.Context(t, time.Minute)
		in := intent("INV-SKEW-LAG", 100)
		_, err := l.Do(ctx, in, eff)
		require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)

		_, err = l.Do(ctx, in, eff)
		require.Error(t, err)
		calls, _ := p.stats()
		assert.Equal(t, 1, calls, "nothing sent again inside the index lag")
		o := failure.Classify(err)
		assert.Equal(t, failure.KindRetryable, o.Kind)
		assert.Contains(t, err.Error(), "index lag")
		assert.Greater(t, o.RetryDelay, lag-10*time.Second, "the retry waits for the lag, as the database counts it")
		r, err := l.Operations().Get(ctx, in.Scope, in.Key)
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateUnknown, r.State)
	})

	// A worker clock two minutes slow must not think a dispatch is still inside the
	// provider's idempotency window when it is not: past it, a "not found by key" proves
	// nothing, and only the business search may be asked.
	t.Run("slow worker clock, provider window", func(t *testing.T) {
		t.Parallel()
		l, pool := skewedLedger(t, idempotency.Config{ProviderWindow: time.Millisecond, ReconcileBackoff: time.Millisecond}, -2*time.Minute)
		p := newProvider()
		p.lose = true
		var byKey, bySearch atomic.Int32
		eff := idempotency.Effect{Dispatch: p.charge,
			Reconcile: func(context.Context, idempotency.Query) (idempotency.Reconciliation, error) {
				byKey.Add(1)
				return idempotency.Absent(), nil // the provider forgot the key
			},
			Search: func(ctx context.Context, q idempotency.Query) (idempotency.Reconciliation, error) {
				bySearch.Add(1)
				return p.lookup(ctx, q)
			}}
		ctx := testenv.Context(t, time.Minute)
		in := intent("INV-SKEW-WINDOW", 100)
		_, err := l.Do(ctx, in, eff)
		require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
		var pastWindow bool
		testenv.Eventually(t, 10*time.Second, "the window to pass on the database's clock", func() (bool, error) {
			err := pool.QueryRow(ctx, `SELECT now() - first_dispatched_at > interval '1 millisecond' FROM extworker_intents
				WHERE namespace = $1 AND intent_key = $2`, l.Namespace(), in.Key).Scan(&pastWindow)
			return pastWindow, err
		})

		out, err := l.Do(ctx, in, eff)
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateReconciled, out.State)
		assert.Equal(t, int32(0), byKey.Load(), "the by-key lookup is not asked past the window")
		assert.Equal(t, int32(1), bySearch.Load())
		calls, effects := p.stats()
		assert.Equal(t, 1, calls, "no second dispatch")
		assert.Equal(t, 1, effects)
	})
}
