package idempotency_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
)

// errTaskGone is the cause a worker cancels a handler's context with when its lock
// extension gets a 404: the process instance was deleted.
var errTaskGone = errors.New("lock extension: 404, the task is gone (process instance deleted)")

// cancelOnDispatchMark cancels a handler's context as soon as the dispatched mark of
// its intent has committed, before the request leaves.
type cancelOnDispatchMark struct {
	idempotency.NopObserver
	cancel context.CancelCauseFunc
}

func (o cancelOnDispatchMark) Transition(_ string, _, to idempotency.State) {
	if to == idempotency.StateDispatched {
		o.cancel(errTaskGone)
	}
}

// Defect 1: a cancelled context still dispatched (the claim ran on a context that drops
// cancellation, and nothing checked it before the request left), so a cancelled order
// was charged. Cancellation fences an attempt before dispatch: nothing is sent, the
// error wraps the context's cause, and the next attempt proceeds normally, without an
// operator.
func TestCancelledContextDispatchesNothing(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// setup brings the intent where the case starts, with a live context, and
		// returns the provider calls it made.
		setup func(t *testing.T, l *idempotency.Ledger, in idempotency.Intent, p *provider) int
		// ledger returns the ledger the cancelled attempt runs on, and its context.
		ledger func(l *idempotency.Ledger) (*idempotency.Ledger, context.Context)
		eff    func(p *provider, cancel context.CancelCauseFunc) idempotency.Effect
	}{
		{
			name: "already cancelled, new intent",
		},
		{
			name: "already cancelled, prepared intent",
			setup: func(t *testing.T, l *idempotency.Ledger, in idempotency.Intent, p *provider) int {
				eff := p.effect()
				eff.Dispatch = func(context.Context, string) (idempotency.Result, error) {
					return idempotency.Result{}, idempotency.NotSent(errors.New("connection refused"))
				}
				_, err := l.Do(testenv.Context(t, time.Minute), in, eff)
				require.True(t, idempotency.IsNotSent(err), "%v", err)
				return 0
			},
		},
		{
			name: "already cancelled, unknown intent",
			setup: func(t *testing.T, l *idempotency.Ledger, in idempotency.Intent, p *provider) int {
				p.drop = true // ambiguous, and the provider has nothing: a not-found would resend
				_, err := l.Do(testenv.Context(t, time.Minute), in, p.effect())
				require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
				return 1
			},
		},
		{
			name: "cancelled while the dispatched mark commits",
			ledger: func(l *idempotency.Ledger) (*idempotency.Ledger, context.Context) {
				ctx, cancel := context.WithCancelCause(context.Background())
				return l.WithHooks(idempotency.Hooks{Observer: cancelOnDispatchMark{cancel: cancel}}), ctx
			},
		},
		{
			name: "cancelled during reconciliation, before the dispatched mark",
			setup: func(t *testing.T, l *idempotency.Ledger, in idempotency.Intent, p *provider) int {
				p.drop = true
				_, err := l.Do(testenv.Context(t, time.Minute), in, p.effect())
				require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
				return 1
			},
			ledger: func(l *idempotency.Ledger) (*idempotency.Ledger, context.Context) {
				return l, context.Background() // cancelled by the lookup below
			},
			eff: func(p *provider, cancel context.CancelCauseFunc) idempotency.Effect {
				eff := p.effect()
				eff.Reconcile = func(ctx context.Context, q idempotency.Query) (idempotency.Reconciliation, error) {
					cancel(errTaskGone) // the lock extension's 404 arrives while the provider is asked
					return p.lookup(ctx, q)
				}
				return eff
			},
		},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			base, _ := newLedger(t, idempotency.Config{ReconcileBackoff: time.Millisecond})
			p := newProvider()
			in := intent("INV-C1-"+string(rune('a'+i)), 4600)
			before := 0
			if tc.setup != nil {
				before = tc.setup(t, base, in, p)
			}
			l, parent := base, context.Background()
			if tc.ledger != nil {
				l, parent = tc.ledger(base)
			}
			ctx, cancel := context.WithCancelCause(parent)
			defer cancel(nil)
			if tc.ledger == nil {
				cancel(errTaskGone) // the handler's context ended before it reached Do
			}
			eff := p.effect()
			if tc.eff != nil {
				eff = tc.eff(p, cancel)
			}

			out, err := l.Do(ctx, in, eff)
			require.Error(t, err, "a cancelled attempt has no outcome (got %+v)", out)
			assert.ErrorIs(t, err, errTaskGone, "the error wraps the context's cause")
			assert.ErrorIs(t, err, idempotency.ErrCancelled)
			assert.NotEqual(t, failure.KindUnknownOutcome, kind(err), "nothing was sent, so nothing is in doubt: %v", err)
			calls, effects := p.stats()
			assert.Equal(t, before, calls, "no request left after the cancellation")
			assert.Zero(t, effects, "the customer was not charged")

			row, gerr := l.Operations().Get(context.Background(), in.Scope, in.Key)
			if gerr == nil {
				assert.Contains(t, []idempotency.State{idempotency.StatePrepared, idempotency.StateUnknown}, row.State,
					"a state the next attempt proceeds from")
				assert.Nil(t, row.LeaseUntil, "the cancelled attempt's lease is released")
			} else {
				require.ErrorIs(t, gerr, idempotency.ErrNotFound)
			}

			// The next delivery of the task proceeds normally, with no operator.
			next, err := base.Do(testenv.Context(t, time.Minute), in, p.effect())
			require.NoError(t, err)
			assert.Equal(t, idempotency.StateConfirmed, next.State)
			calls, effects = p.stats()
			assert.Equal(t, before+1, calls)
			assert.Equal(t, 1, effects)
		})
	}
}

// Defect 2: an answer that arrived after the handler's context ended was not recorded
// (the outcome's statements ran on that context and failed with "context canceled"), so
// a decline, a not-sent or an ambiguous answer left the row dispatched. Once a dispatch
// has started, its outcome is recorded whatever becomes of the handler's context.
func TestAnswerAfterCancellationIsRecorded(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		answer func(p *provider, ctx context.Context, key string) (idempotency.Result, error)
		want   idempotency.State
		check  func(t *testing.T, out idempotency.Receipt, err error)
	}{
		{
			name: "success",
			answer: func(p *provider, ctx context.Context, key string) (idempotency.Result, error) {
				return p.charge(ctx, key)
			},
			want: idempotency.StateConfirmed,
			check: func(t *testing.T, out idempotency.Receipt, err error) {
				require.NoError(t, err)
				assert.Equal(t, "ch_1", out.ProviderRef)
			},
		},
		{
			name: "decline",
			answer: func(*provider, context.Context, string) (idempotency.Result, error) {
				return idempotency.Result{}, idempotency.Rejected("CARD_DECLINED", "insufficient funds")
			},
			want: idempotency.StateRejected,
			check: func(t *testing.T, _ idempotency.Receipt, err error) {
				o := failure.Classify(err)
				assert.Equal(t, failure.KindBPMNError, o.Kind, "%v", err)
				assert.Equal(t, "CARD_DECLINED", o.Code)
			},
		},
		{
			name: "not sent",
			answer: func(*provider, context.Context, string) (idempotency.Result, error) {
				return idempotency.Result{}, idempotency.NotSent(errors.New("connection refused"))
			},
			want: idempotency.StatePrepared,
			check: func(t *testing.T, _ idempotency.Receipt, err error) {
				assert.True(t, idempotency.IsNotSent(err), "%v", err)
				assert.Equal(t, failure.KindRetryable, kind(err))
			},
		},
		{
			name: "ambiguous",
			answer: func(*provider, context.Context, string) (idempotency.Result, error) {
				return idempotency.Result{}, errors.New("read timeout after the request was sent")
			},
			want: idempotency.StateUnknown,
			check: func(t *testing.T, _ idempotency.Receipt, err error) {
				assert.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l, _ := newLedger(t, idempotency.Config{})
			p := newProvider()
			ctx, cancel := context.WithCancelCause(testenv.Context(t, time.Minute))
			defer cancel(nil)
			var sent bool
			eff := p.effect()
			eff.Dispatch = func(dctx context.Context, key string) (idempotency.Result, error) {
				sent = true
				// The instance is deleted while the request is at the provider: the handler's
				// context ends, then the provider answers.
				cancel(errTaskGone)
				require.NoError(t, dctx.Err(), "an in-flight dispatch is not abandoned")
				return tc.answer(p, dctx, key)
			}
			in := intent("INV-C2-"+tc.name, 4600)
			out, err := l.Do(ctx, in, eff)
			require.True(t, sent)
			require.Error(t, ctx.Err())
			tc.check(t, out, err)
			row, gerr := l.Operations().Get(context.Background(), in.Scope, in.Key)
			require.NoError(t, gerr)
			assert.Equal(t, tc.want, row.State, "the answer is recorded, not left dispatched")
			assert.Nil(t, row.LeaseUntil, "and the lease released")
		})
	}
}
