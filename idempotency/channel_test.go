package idempotency_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/tasks"
)

// N1 (docs/reliability.md, Scenario matrix): an email sent, its answer lost. Whether it
// may be sent again is a choice per effect type, made explicit by the Effect:
//
//   - the provider dedupes by Idempotency-Key: the ledger reconciles by replaying the
//     same request under the same key (a replay answers what the first did, without a
//     second email): at least once, delivered once;
//   - the channel has no keys (dedupe off): no Reconcile, so the unknown email goes to an
//     operator with an incident: at most once, never a second email.
//
// Real engine, real ledger, the fake provider's /v1/emails.
func TestN1EmailChannelChoosesAtMostOrAtLeastOnce(t *testing.T) {
	for _, dedupe := range []bool{true, false} {
		name := map[bool]string{true: "deduped-at-least-once", false: "no-keys-at-most-once"}[dedupe]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l, _ := newLedger(t, idempotency.Config{ReconcileBackoff: 50 * time.Millisecond})
			c := testenv.Engine(t)
			m := testenv.Deploy(t, c, testenv.ModelOptions{NoMessageWait: true})
			ctx := testenv.Context(t, 2*time.Minute)
			pay, err := fakeprovider.StartWith(fakeprovider.Options{EmailDedupeOff: !dedupe})
			require.NoError(t, err)
			t.Cleanup(func() { _ = pay.Close() })
			client := &fakeprovider.Client{BaseURL: pay.URL()}
			invoiceID := testenv.Unique("INV-N1")
			pay.Script(invoiceID, fakeprovider.LoseAnswer) // sent, answer lost
			pi, err := c.StartProcess(ctx, m.Key, admin.StartProcessRequest{BusinessKey: invoiceID})
			require.NoError(t, err)

			const to = "billing@example.invalid"
			reg := tasks.NewRegistry()
			require.NoError(t, reg.Register(m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
				send := func(ctx context.Context, key string) (idempotency.Result, error) {
					e, err := client.Email(ctx, key, tk.BusinessKey(), to, "receipt")
					if errors.Is(err, fakeprovider.ErrNotSent) {
						return idempotency.Result{}, idempotency.NotSent(err)
					}
					if err != nil {
						return idempotency.Result{}, err
					}
					return idempotency.Result{ProviderRef: e.ID, Values: map[string]any{"emailId": e.ID}}, nil
				}
				eff := idempotency.Effect{Dispatch: send}
				if dedupe {
					// The replay is the lookup: same key, same request, the first answer.
					eff.Reconcile = func(ctx context.Context, q idempotency.Query) (idempotency.Reconciliation, error) {
						r, err := send(ctx, q.ProviderKey)
						if err != nil {
							return idempotency.StillUnknown(err.Error()), nil
						}
						return idempotency.Found(r), nil
					}
				}
				out, err := l.Do(ctx, idempotency.Intent{Scope: "receipt.email", Key: "invoice:" + tk.BusinessKey() + ":receipt:v1",
					Request: map[string]any{"invoice": tk.BusinessKey(), "template": "receipt"},
					Task:    idempotency.TaskRef{Actor: tk.WorkerID(), TaskID: tk.ID(), ProcessInstanceID: tk.ProcessInstanceID(), BusinessKey: tk.BusinessKey()}}, eff)
				if err != nil {
					return nil, err
				}
				return camunda7.Variables{"emailId": camunda7.StringVar(out.ProviderRef)}, nil
			}, tasks.TopicOptions{Retry: failure.RetryPolicy{MaxAttempts: 3, InitialDelay: 50 * time.Millisecond}}))
			w, err := tasks.New(c, reg, tasks.Config{WorkerID: testenv.Unique("w"), AsyncResponseTimeout: time.Second})
			require.NoError(t, err)
			wctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- w.Run(wctx) }()
			testenv.Eventually(t, time.Minute, "the instance to complete or hold an incident", func() (bool, error) {
				if dedupe {
					h, err := c.HistoricProcessInstance(ctx, pi.ID)
					return err == nil && h.State == "COMPLETED", err
				}
				inc, err := c.Incidents(ctx, url.Values{"processInstanceId": {pi.ID}})
				return err == nil && len(inc) == 1, err
			})
			cancel()
			require.NoError(t, <-done)

			var emails, posts int
			for _, e := range pay.Emails() {
				if e.Invoice == invoiceID {
					emails++
				}
			}
			for _, r := range pay.Log() {
				if r.Invoice == invoiceID && r.Method == "POST" {
					posts++
				}
			}
			row, err := l.Operations().Get(ctx, "receipt.email", "invoice:"+invoiceID+":receipt:v1")
			require.NoError(t, err)
			assert.Equal(t, 1, emails, "exactly one email either way")
			if dedupe {
				assert.Equal(t, idempotency.StateReconciled, row.State)
				assert.Equal(t, 2, posts, "sent, then replayed under the same key")
				return
			}
			assert.Equal(t, idempotency.StateOperatorHold, row.State)
			assert.Equal(t, 1, posts, "never sent again without keys")
			inc, err := c.Incidents(ctx, url.Values{"processInstanceId": {pi.ID}})
			require.NoError(t, err)
			require.Len(t, inc, 1)
			assert.Contains(t, inc[0].IncidentMessage, "neither Reconcile nor Search")
			assert.NotContains(t, inc[0].IncidentMessage, to, "no recipient in the incident")
		})
	}
}
