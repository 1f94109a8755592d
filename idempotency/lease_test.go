package idempotency_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
)

// A lease must leave an effect's call its whole timeout plus the ledger's margin (a
// tenth of the lease, at most 5s); a timeout of 0 is not checked.
func TestCheckLease(t *testing.T) {
	for _, tc := range []struct {
		name           string
		lease, timeout time.Duration
		want           string // a substring of the error; "": none
	}{
		{"lease within the timeout plus the margin", 15 * time.Second, 14 * time.Second, "lease (EXTWORKER_LEDGER_LEASE, Config.Lease) 15s must be longer than the effect's timeout (Effect.Timeout, httpeffect.Spec.Timeout) 14s plus 1.5s"},
		{"lease shorter than the timeout", 5 * time.Second, 10 * time.Second, "5s must be longer than the effect's timeout (Effect.Timeout, httpeffect.Spec.Timeout) 10s plus 500ms"},
		{"the margin is at most 5s", 2 * time.Minute, 115 * time.Second, "2m0s must be longer than the effect's timeout (Effect.Timeout, httpeffect.Spec.Timeout) 1m55s plus 5s"},
		{"lease just long enough", 16 * time.Second, 14 * time.Second, ""},
		{"short lease, short timeout", 2 * time.Second, time.Second, ""},
		{"no timeout given", time.Second, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := idempotency.CheckLease(tc.lease, tc.timeout)
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorIs(t, err, idempotency.ErrLeaseTooShort)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// Do refuses an effect whose timeout the lease cannot leave whole, as a permanent
// failure, before anything is recorded or sent; the same effect with a timeout the lease
// leaves whole runs.
func TestDoRefusesAnEffectTheLeaseCannotWaitFor(t *testing.T) {
	l, _ := newLedger(t, idempotency.Config{Lease: 5 * time.Second})
	ctx := context.Background()
	calls := 0
	eff := idempotency.Effect{Timeout: 10 * time.Second, Dispatch: func(context.Context, string) (idempotency.Result, error) {
		calls++
		return idempotency.Result{ProviderRef: "ch_1"}, nil
	}}
	in := idempotency.Intent{Scope: "payment.collect", Key: "invoice:lease", Request: map[string]any{"invoice": "lease"}}
	_, err := l.Do(ctx, in, eff)
	require.ErrorIs(t, err, idempotency.ErrLeaseTooShort)
	assert.Equal(t, failure.KindPermanent, failure.Classify(err).Kind, "a configuration to fix: an incident, not retries")
	assert.Zero(t, calls, "nothing sent")
	_, err = l.Operations().Get(ctx, in.Scope, in.Key)
	assert.ErrorIs(t, err, idempotency.ErrNotFound, "nothing recorded")

	eff.Timeout = 4 * time.Second // 4s + 500ms < 5s
	out, err := l.Do(ctx, in, eff)
	require.NoError(t, err)
	assert.Equal(t, "ch_1", out.ProviderRef)
	assert.Equal(t, 1, calls)
}
