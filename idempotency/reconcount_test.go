package idempotency_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
)

// An intent held after MaxReconciliations inconclusive ones records that many: the row's
// count (what effects show prints) agrees with the hold's reason.
func TestHoldCountsTheLastReconciliation(t *testing.T) {
	t.Parallel()
	const maxRecon = 4
	l, _ := newLedger(t, idempotency.Config{MaxReconciliations: maxRecon, ReconcileBackoff: time.Millisecond})
	p := newProvider()
	p.lose = true
	eff := p.effect()
	eff.Reconcile = func(context.Context, idempotency.Query) (idempotency.Reconciliation, error) {
		return idempotency.StillUnknown("provider search index lagging"), nil
	}
	ctx := testenv.Context(t, time.Minute)
	in := intent("INV-RC", 100)
	_, err := l.Do(ctx, in, eff) // the dispatch, its outcome lost
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	for range maxRecon {
		_, err = l.Do(ctx, in, eff)
		require.Error(t, err)
	}
	row, err := l.Operations().Get(ctx, in.Scope, in.Key)
	require.NoError(t, err)
	require.Equal(t, idempotency.StateOperatorHold, row.State)
	require.NotNil(t, row.ErrorMessage)
	assert.Contains(t, *row.ErrorMessage, fmt.Sprintf("still unknown after %d reconciliations", maxRecon))
	assert.Equal(t, maxRecon, row.Reconciliations)
}
