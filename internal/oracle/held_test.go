package oracle_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/oracle"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

// Regression (long soak, seed 20261129): an invoice meant to be declined whose first
// request met a 500 the provider stored is held for an operator with no charge; the
// oracle accepted holds only for invoices to pay and reported six false I4 violations.
// Held and declined is fine with an incident and no charge; charged, it is a violation.
func TestHeldDeclinedInvoice(t *testing.T) {
	pool := testenv.DB(t)
	ctx := testenv.Context(t, time.Minute)
	db := stdlib.OpenDBFromPool(pool)
	_, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	db.Close()
	l, err := idempotency.New(pool, idempotency.Config{Namespace: testenv.Unique("oracle"), ReconcileBackoff: time.Millisecond})
	require.NoError(t, err)
	eff := idempotency.Effect{
		Dispatch: func(context.Context, string) (idempotency.Result, error) {
			return idempotency.Result{}, errors.New("500 api_error")
		},
		Reconcile: func(context.Context, idempotency.Query) (idempotency.Reconciliation, error) {
			return idempotency.Hold("the provider stored a 500 under this key"), nil
		},
	}
	in := idempotency.Intent{Scope: "payment.collect", Key: "invoice:D:v1", Request: map[string]any{"invoice": "D"}}
	_, err = l.Do(ctx, in, eff)
	require.Error(t, err)
	_, err = l.Do(ctx, in, eff)
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)

	e := oracle.Expect{Scope: in.Scope, Key: in.Key, Invoice: "D", Declined: true, MayHold: true, Incident: true}
	assert.Empty(t, oracle.Check(ctx, l.Operations(), nil, e), "held, declined, no charge, with an incident")
	charged := []fakeprovider.Charge{{ID: "ch_1", Invoice: "D"}}
	assert.NotEmpty(t, oracle.Check(ctx, l.Operations(), charged, e), "held and declined, yet charged")
	e.Incident = false
	assert.NotEmpty(t, oracle.Check(ctx, l.Operations(), nil, e), "held without an incident")
}
