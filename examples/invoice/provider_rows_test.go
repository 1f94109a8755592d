package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
)

// The provider-side rows (docs/reliability.md, Scenario matrix): answers slower than the
// client, 500s the provider stores, 409 in use, a mismatch that reaches the provider in
// every dialect, retries past the idempotency window with and without a business search,
// the search's index lag, and an instance cancelled while its charge is in flight. Each
// runs a real worker process against the real engine and PostgreSQL, and asserts the
// provider's charges, the ledger's final state and the engine's final state.

// withProvider replaces the fault env's provider with one configured by o.
func withProvider(t *testing.T, f *faultEnv, o fakeprovider.Options) *fakeprovider.Server {
	t.Helper()
	if o.DeclineAboveCents == 0 {
		o.DeclineAboveCents = demoDeclineLimit
	}
	pay, err := fakeprovider.StartWith(o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pay.Close() })
	f.pay = pay
	return pay
}

// completed reports whether every instance completed.
func completed(ctx context.Context, f faultEnv, ids ...string) bool {
	for _, id := range ids {
		if h, err := f.c.HistoricProcessInstance(ctx, id); err != nil || h.State != "COMPLETED" {
			return false
		}
	}
	return true
}

// chargesFor returns the provider's charges for one invoice.
func chargesFor(pay *fakeprovider.Server, invoice string) []fakeprovider.Charge {
	var out []fakeprovider.Charge
	for _, ch := range pay.Charges() {
		if ch.Invoice == invoice {
			out = append(out, ch)
		}
	}
	return out
}

// requestsFor returns the provider's record of the charge requests for one invoice.
func requestsFor(pay *fakeprovider.Server, invoice string) []fakeprovider.Request {
	var out []fakeprovider.Request
	for _, r := range pay.Log() {
		if r.Method == http.MethodPost && r.Path == "/v1/charges" && r.Invoice == invoice {
			out = append(out, r)
		}
	}
	return out
}

func trail(t *testing.T, ctx context.Context, l *idempotency.Ledger, invoice string) []idempotency.Event {
	t.Helper()
	events, err := l.Operations().Events(ctx, "payment.collect", "invoice:"+invoice+":v1")
	require.NoError(t, err)
	return events
}

func hasReason(events []idempotency.Event, part string) bool {
	for _, e := range events {
		if strings.Contains(e.Reason, part) {
			return true
		}
	}
	return false
}

// S1: the provider charges but answers after the client's timeout: the outcome is
// unknown, reconciled by key (found), and the instance completes with that charge.
func TestS1AnswerSlowerThanTheClient(t *testing.T) {
	f := newFaultEnv(t, "s1", 3*time.Minute)
	pay := withProvider(t, &f, fakeprovider.Options{SlowDelay: 3 * time.Second})
	t.Setenv("EXTWORKER_PROVIDER_TIMEOUT", "1s")
	invoice := testenv.Unique("INV-S1")
	pay.Script(invoice, fakeprovider.SlowAnswer)
	id := f.start(t, invoice, 4100)
	assert.Zero(t, supervise(t, f.bin, f.ns, pay.URL(), "", func() bool { return completed(f.ctx, f, id) }))
	oracle(t, f.ctx, f.c, f.ledger, pay, invoice, id)
	row, err := f.ledger.Operations().Get(f.ctx, "payment.collect", "invoice:"+invoice+":v1")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateReconciled, row.State, "unknown, then reconciled (found)")
	assert.Len(t, requestsFor(pay, invoice), 1, "never sent again")
}

// T2: a 500. Stripe stores it under the key (a same-key retry only replays it): the
// lookup says so, and the intent goes to an operator with an incident at once, without
// looping. The IETF draft does not store it: the charge is sent again with the same key
// and completes.
func TestT2Stored500(t *testing.T) {
	for _, d := range []fakeprovider.Dialect{fakeprovider.DialectStripe, fakeprovider.DialectIETF} {
		t.Run(string(d), func(t *testing.T) {
			f := newFaultEnv(t, "t2", 3*time.Minute)
			pay := withProvider(t, &f, fakeprovider.Options{Dialect: d})
			invoice := testenv.Unique("INV-T2")
			pay.Script(invoice, fakeprovider.Stored500)
			id := f.start(t, invoice, 4200)
			stored := d == fakeprovider.DialectStripe
			assert.Zero(t, supervise(t, f.bin, f.ns, pay.URL(), "", func() bool {
				if !stored {
					return completed(f.ctx, f, id)
				}
				inc, err := f.c.Incidents(f.ctx, url.Values{"processInstanceId": {id}})
				return err == nil && len(inc) == 1
			}))
			row, err := f.ledger.Operations().Get(f.ctx, "payment.collect", "invoice:"+invoice+":v1")
			require.NoError(t, err)
			if stored {
				assert.Equal(t, idempotency.StateOperatorHold, row.State)
				assert.Empty(t, chargesFor(pay, invoice), "no charge")
				assert.Len(t, requestsFor(pay, invoice), 1, "not sent again: the key only replays the 500")
				inc, err := f.c.Incidents(f.ctx, url.Values{"processInstanceId": {id}})
				require.NoError(t, err)
				require.Len(t, inc, 1)
				assert.Contains(t, inc[0].IncidentMessage, "stored a 500")
				return
			}
			oracle(t, f.ctx, f.c, f.ledger, pay, invoice, id)
			assert.Len(t, requestsFor(pay, invoice), 2, "sent again with the same key after the unstored 500")
		})
	}
}

// T4: the provider holds the first request in flight (not yet committed) past the
// client's timeout. The spec's worker would resend and meet 409 in use; ours never
// resends an unknown outcome blindly: it asks by key, and while the request is in flight
// the provider cannot say (in use), so the intent stays unknown until the held request
// commits, and is then reconciled. One request, one charge, no incident. (A 409 answered
// to a send is retried after its Retry-After as not sent: fakeprovider's tests and the
// ledger's NotSent tests.)
func TestT4KeyInUse(t *testing.T) {
	f := newFaultEnv(t, "t4", 3*time.Minute)
	pay := withProvider(t, &f, fakeprovider.Options{SlowDelay: 4 * time.Second})
	t.Setenv("EXTWORKER_PROVIDER_TIMEOUT", "1s")
	invoice := testenv.Unique("INV-T4")
	pay.Script(invoice, fakeprovider.Hold)
	id := f.start(t, invoice, 4300)
	assert.Zero(t, supervise(t, f.bin, f.ns, pay.URL(), "", func() bool { return completed(f.ctx, f, id) }))
	oracle(t, f.ctx, f.c, f.ledger, pay, invoice, id)
	inc, err := f.c.HistoricIncidents(f.ctx, url.Values{"processInstanceId": {id}})
	require.NoError(t, err)
	assert.Empty(t, inc)
	var all []string
	for _, r := range pay.Log() {
		if r.Invoice == invoice || strings.Contains(r.Path, "by-key") || r.Method == http.MethodGet {
			all = append(all, r.Method+" "+r.Outcome)
		}
	}
	t.Logf("provider record for %s: %v", invoice, all)
	assert.Len(t, requestsFor(pay, invoice), 1, "never resent while the first was in flight")
	row, err := f.ledger.Operations().Get(f.ctx, "payment.collect", "invoice:"+invoice+":v1")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateReconciled, row.State)
}

// K2: a request with the intent's key but a different body reaches the provider (the
// ledger's own check bypassed: the key was used before by something else). Every dialect
// answers its mismatch status, and every one is classified permanent: an incident, no
// retry, no charge for this request.
func TestK2MismatchAtTheProvider(t *testing.T) {
	for _, d := range []fakeprovider.Dialect{fakeprovider.DialectStripe, fakeprovider.DialectIETF, fakeprovider.DialectBrandur} {
		t.Run(string(d), func(t *testing.T) {
			f := newFaultEnv(t, "k2", 3*time.Minute)
			pay := withProvider(t, &f, fakeprovider.Options{Dialect: d})
			invoice := testenv.Unique("INV-K2")
			key := idempotency.ProviderKey(f.ns, "payment.collect", "invoice:"+invoice+":v1")
			// Somebody else used the key first, with another amount.
			_, err := (&fakeprovider.Client{BaseURL: pay.URL()}).Charge(f.ctx, key, invoice, 1)
			require.NoError(t, err)
			id := f.start(t, invoice, 4400)
			assert.Zero(t, supervise(t, f.bin, f.ns, pay.URL(), "", func() bool {
				inc, err := f.c.Incidents(f.ctx, url.Values{"processInstanceId": {id}})
				return err == nil && len(inc) == 1
			}))
			reqs := requestsFor(pay, invoice)
			require.Len(t, reqs, 2, "the first use, and one refused request: no retry")
			assert.Equal(t, "mismatch", reqs[1].Outcome)
			assert.Len(t, chargesFor(pay, invoice), 1, "only the other request's charge")
			inc, err := f.c.Incidents(f.ctx, url.Values{"processInstanceId": {id}})
			require.NoError(t, err)
			require.Len(t, inc, 1)
			t.Logf("%s: incident %q", d, inc[0].IncidentMessage)
		})
	}
}

// R1, R2, R3, R4: retries around the provider's idempotency window. The worker's window
// is 1s (EXTWORKER_PROVIDER_WINDOW) and the provider's clock is moved a day ahead once it
// has the first request, so its key is forgotten for real: a same-key resend past the
// window would make a second charge.
func TestRetentionWindow(t *testing.T) {
	type row struct {
		name    string
		fault   fakeprovider.Fault
		search  bool
		lag     time.Duration // the provider's index lag (virtual clock) and the worker's margin
		advance bool          // move the provider's clock past its retention
		window  string
	}
	rows := []row{
		// R1: charged, answer lost, worker back past the window: found by business search.
		{name: "R1", fault: fakeprovider.LoseAnswer, search: true, advance: true, window: "1s"},
		// R2: the same without a business search: operator, incident.
		{name: "R2", fault: fakeprovider.LoseAnswer, search: false, advance: true, window: "1s"},
		// R3: not charged (dropped), past the window: search says not found, trusted
		// only after the index lag; then sent again, one charge.
		{name: "R3", fault: fakeprovider.DropBeforeAccept, search: true, lag: 3 * time.Second, advance: true, window: "1s"},
		// R4: inside the window the key is asked, not the lagging search.
		{name: "R4", fault: fakeprovider.LoseAnswer, search: true, lag: time.Minute, window: "24h"},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			f := newFaultEnv(t, strings.ToLower(r.name), 3*time.Minute)
			pay := withProvider(t, &f, fakeprovider.Options{SearchLag: r.lag})
			t.Setenv("EXTWORKER_PROVIDER_WINDOW", r.window)
			t.Setenv("EXTWORKER_PROVIDER_SEARCH", fmt.Sprint(r.search))
			t.Setenv("EXTWORKER_PROVIDER_SEARCH_LAG", r.lag.String())
			invoice := testenv.Unique("INV-" + r.name)
			pay.Script(invoice, r.fault)
			id := f.start(t, invoice, 4500)
			advanced := false
			start := time.Now()
			assert.Zero(t, supervise(t, f.bin, f.ns, pay.URL(), "", func() bool {
				if r.advance && !advanced && len(requestsFor(pay, invoice)) > 0 {
					pay.Advance(25 * time.Hour) // the provider forgets the key
					advanced = true
				}
				if !r.search {
					inc, err := f.c.Incidents(f.ctx, url.Values{"processInstanceId": {id}})
					return err == nil && len(inc) == 1
				}
				return completed(f.ctx, f, id)
			}))
			took := time.Since(start)
			events := trail(t, f.ctx, f.ledger, invoice)
			row, err := f.ledger.Operations().Get(f.ctx, "payment.collect", "invoice:"+invoice+":v1")
			require.NoError(t, err)
			switch r.name {
			case "R1":
				oracle(t, f.ctx, f.c, f.ledger, pay, invoice, id)
				assert.Equal(t, idempotency.StateReconciled, row.State)
				assert.True(t, hasReason(events, "business search"), "reconciled by search, not by the forgotten key")
				assert.Len(t, requestsFor(pay, invoice), 1, "no dispatch after the window")
			case "R2":
				assert.Equal(t, idempotency.StateOperatorHold, row.State)
				assert.Len(t, chargesFor(pay, invoice), 1)
				assert.Len(t, requestsFor(pay, invoice), 1, "unknown never auto-retried past the window")
				inc, err := f.c.Incidents(f.ctx, url.Values{"processInstanceId": {id}})
				require.NoError(t, err)
				require.Len(t, inc, 1)
				assert.Contains(t, inc[0].IncidentMessage, "idempotency window")
			case "R3":
				oracle(t, f.ctx, f.c, f.ledger, pay, invoice, id)
				assert.Equal(t, idempotency.StateConfirmed, row.State)
				require.Len(t, requestsFor(pay, invoice), 2, "dropped once, then sent again")
				require.NotNil(t, row.LastDispatchedAt)
				require.NotNil(t, row.FirstDispatchedAt)
				assert.GreaterOrEqual(t, row.LastDispatchedAt.Sub(*row.FirstDispatchedAt), r.lag,
					"the second dispatch waited for the index lag to pass")
			case "R4":
				oracle(t, f.ctx, f.c, f.ledger, pay, invoice, id)
				assert.Equal(t, idempotency.StateReconciled, row.State)
				assert.False(t, hasReason(events, "business search"), "inside the window the key is asked")
				assert.Less(t, took, r.lag, "no wait for the search index inside the window")
			}
		})
	}
}

// X1: the process instance is deleted while its charge is in flight. The charge is not
// abandoned: its answer is recorded (confirmed), the worker sees the task gone (lock
// extension 404), the engine's history shows it deleted, and the intent is flagged
// orphaned for an operator: money moved without a process.
func TestX1InstanceCancelledMidDispatch(t *testing.T) {
	f := newFaultEnv(t, "x1", 3*time.Minute)
	// The answer comes after the deletion is seen (lock extensions every 2s/3) and within
	// the ledger lease's dispatch deadline (2s less a margin).
	pay := withProvider(t, &f, fakeprovider.Options{SlowDelay: 1200 * time.Millisecond})
	invoice := testenv.Unique("INV-X1")
	pay.Script(invoice, fakeprovider.SlowAnswer)
	id := f.start(t, invoice, 4600)
	key := "invoice:" + invoice + ":v1"
	deleted := false
	assert.Zero(t, supervise(t, f.bin, f.ns, pay.URL(), "", func() bool {
		if !deleted && len(requestsFor(pay, invoice)) > 0 {
			require.NoError(t, f.c.DeleteProcessInstance(f.ctx, id))
			deleted = true
		}
		row, err := f.ledger.Operations().Get(f.ctx, "payment.collect", key)
		return deleted && err == nil && row.OrphanedAt != nil
	}))
	for _, e := range trail(t, f.ctx, f.ledger, invoice) {
		t.Logf("ledger: %v -> %s (attempt %d): %s", e.FromState, e.ToState, e.Attempt, e.Reason)
	}
	for _, r := range pay.Log() {
		if r.Invoice == invoice {
			t.Logf("provider: %s %s %s %s", r.Method, r.Outcome, r.Fault, r.Fate)
		}
	}
	row, err := f.ledger.Operations().Get(f.ctx, "payment.collect", key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateConfirmed, row.State, "the in-flight charge's answer was recorded")
	assert.Contains(t, *row.OrphanReason, "cancelled")
	assert.Len(t, chargesFor(pay, invoice), 1)
	h, err := f.c.HistoricProcessInstance(f.ctx, id)
	require.NoError(t, err)
	assert.Equal(t, "EXTERNALLY_TERMINATED", h.State)
	rows, err := f.ledger.Operations().List(f.ctx, idempotency.Filter{Orphaned: true})
	require.NoError(t, err)
	require.Len(t, rows, 1, "the operator's list")
	assert.Equal(t, key, rows[0].Key)
}
