package soak

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/oracle"
)

// The run fails on its own when it made fewer kills than asked or drained too long.
func TestPhaseViolations(t *testing.T) {
	timing := Timing{DrainAllowed: 2 * time.Minute}
	for _, c := range []struct {
		name   string
		res    Result
		expect []string
	}{
		{"kills reached, drained in time", Result{RandomKills: 2, FailpointKills: 1, Drain: time.Minute, Timing: timing}, nil},
		{"short of kills", Result{RandomKills: 2, Drain: time.Minute, Timing: timing},
			[]string{"run: the run reached 2 kills, short of the 3 asked for"}},
		{"drained too long", Result{RandomKills: 3, Drain: 150 * time.Second, Timing: timing, Tier: "short"},
			[]string{"run: the drain took 2m30s, over the 2m0s allowed (short tier)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.expect, phaseViolations(c.res, 3))
		})
	}
}

// Workers named for another seed, or not by the soak at all, that completed or failed
// the run's tasks are foreign; fetches and creations are not reports.
func TestForeignWorkers(t *testing.T) {
	h := engineHistory{ExternalTaskLog: map[string][]camunda7.ExternalTaskLogEntry{
		"p1": {{CreationLog: true}, {SuccessLog: true, WorkerID: "soak-42-0-1"}, {FailureLog: true, WorkerID: "soak-7-0-0"}},
		"p2": {{SuccessLog: true, WorkerID: "demo-worker"}, {SuccessLog: true, WorkerID: "demo-worker"}, {DeletionLog: true, WorkerID: "x"}},
	}}
	assert.Equal(t, map[string]int{"soak-7-0-0": 1, "demo-worker": 2}, foreignWorkers(h, 42))
	assert.Empty(t, foreignWorkers(engineHistory{}, 42))
}

// The paid invoices are the run's payment intents the ledger confirmed or reconciled as
// made; declines, other scopes and other namespaces are not, nor is an earlier run's
// invoice whose task, left on the engine, the run's workers took (seen re-running a
// failed soak's lane: it failed I10 for want of an event the earlier run owed).
func TestPaidInvoices(t *testing.T) {
	rows := []idempotency.Row{
		{Namespace: "ns", Scope: scope, Key: "invoice:R-A:v1", State: idempotency.StateConfirmed},
		{Namespace: "ns", Scope: scope, Key: "invoice:R-B:v1", State: idempotency.StateReconciled},
		{Namespace: "ns", Scope: scope, Key: "invoice:R-C:v1", State: idempotency.StateRejected},
		{Namespace: "ns", Scope: "other", Key: "invoice:R-D:v1", State: idempotency.StateConfirmed},
		{Namespace: "other", Scope: scope, Key: "invoice:R-E:v1", State: idempotency.StateConfirmed},
		{Namespace: "ns", Scope: scope, Key: "invoice:EARLIER-F:v1", State: idempotency.StateConfirmed},
	}
	assert.Equal(t, map[string]bool{"R-A": true, "R-B": true}, paidInvoices(rows, "ns", "R-"))
}

// Held declines: invoices to decline that the provider left undecidable and that hold an
// incident.
func TestHeldDeclined(t *testing.T) {
	assert.Equal(t, 1, heldDeclined([]oracle.Expect{
		{Invoice: "A", Declined: true, MayHold: true, Incident: true},
		{Invoice: "B", Declined: true, MayHold: true},
		{Invoice: "C", MayHold: true, Incident: true},
		{Invoice: "D", Declined: true, Incident: true},
	}))
}

// The provider's faults join the harness's, counted by kind.
func TestWithProviderFaults(t *testing.T) {
	got := withProviderFaults(map[string]int{"random SIGKILL": 3, "provider rate_limited": 1}, []fakeprovider.Request{
		{Fault: "rate_limited"}, {Fault: "lose_answer"}, {Outcome: "created"},
	})
	assert.Equal(t, map[string]int{"random SIGKILL": 3, "provider rate_limited": 2, "provider lose_answer": 1}, got)
}

// I10 over the outbox, the tap and the ledger.
func TestCheckOutbox(t *testing.T) {
	for _, c := range []struct {
		name   string
		events map[string]bool
		seen   map[string]int
		differ []string
		paid   map[string]bool
		expect []string
		counts eventCounts
	}{
		{"every event published, tapped, for a charge",
			map[string]bool{"invoice.paid:A": true, "invoice.paid:B": true}, map[string]int{"invoice.paid:A": 1, "invoice.paid:B": 3}, nil,
			map[string]bool{"A": true, "B": true}, nil, eventCounts{Events: 2, Tapped: 2, TapDeliveries: 4}},
		{"unpublished and never tapped",
			map[string]bool{"invoice.paid:A": false}, map[string]int{}, nil, map[string]bool{"A": true},
			[]string{"I10: invoice.paid:A was never published (the broker never confirmed it)", "I10: invoice.paid:A never reached the broker's tap"},
			eventCounts{Events: 1, Unpublished: 1}},
		{"two bodies",
			map[string]bool{"invoice.paid:A": true}, map[string]int{"invoice.paid:A": 2}, []string{"invoice.paid:A"}, map[string]bool{"A": true},
			[]string{"I10: invoice.paid:A was delivered with two different bodies"}, eventCounts{Events: 1, Tapped: 1, TapDeliveries: 2}},
		{"a charge without its event, an event without its charge",
			map[string]bool{"invoice.paid:B": true}, map[string]int{"invoice.paid:B": 1}, nil, map[string]bool{"A": true},
			[]string{"I10: invoice A was charged (the ledger confirmed it) but has no invoice.paid in the outbox",
				"I10: invoice.paid:B announces an invoice the ledger did not confirm as charged"},
			eventCounts{Events: 1, Tapped: 1, TapDeliveries: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var n eventCounts
			assert.ElementsMatch(t, c.expect, checkOutbox(c.events, c.seen, c.differ, c.paid, &n))
			assert.Equal(t, c.counts, n)
		})
	}
}

// I11's inbox half: processed or recognised duplicates pass; parked, unsettled and
// missing rows do not.
func TestCheckInbox(t *testing.T) {
	events := map[string]bool{"invoice.paid:A": true, "invoice.paid:B": true, "invoice.paid:C": true}
	rows := []inboxRow{
		{id: "invoice.paid:A", state: string(inbox.StateProcessed), deliveries: 2, duplicates: 1, reason: "reconciled: started"},
		{id: "invoice.paid:B", state: string(inbox.StateIgnoredDuplicate), deliveries: 1},
	}
	var n eventCounts
	assert.Equal(t, []string{"I11: invoice.paid:C never reached the inbox"}, checkInbox(rows, events, &n))
	assert.Equal(t, eventCounts{InboxStates: map[string]int{"processed": 1, "ignored_duplicate": 1}, Deliveries: 3, Duplicates: 1, Reconcd: 1}, n)
	assert.Equal(t, 2, n.inboxRows())

	rows = append(rows,
		inboxRow{id: "invoice.paid:C", state: string(inbox.StateFailedFinal), deliveries: 1, reason: "rejected"},
		inboxRow{id: "invoice.paid:D", state: string(inbox.StateFailedRetryable), deliveries: 1, reason: "early"})
	n = eventCounts{}
	assert.Equal(t, []string{"I11: invoice.paid:C was parked: rejected", "I11: invoice.paid:D was left failed_retryable: early"},
		checkInbox(rows, events, &n))
}

// I11's engine half: one shipping instance per event, none without one.
func TestCheckShipping(t *testing.T) {
	events := map[string]bool{"invoice.paid:A": true, "invoice.paid:B": true, "invoice.paid:C": true}
	his := []admin.HistoricProcessInstance{{BusinessKey: "A"}, {BusinessKey: "B"}, {BusinessKey: "B"}, {BusinessKey: "X"}}
	var n eventCounts
	assert.ElementsMatch(t, []string{
		"I11: invoice B was shipped 2 times (one event acted on more than once)",
		"I11: invoice X was shipped without an invoice.paid event",
		"I11: invoice.paid:C started no shipping instance (an event lost)",
	}, checkShipping(his, events, &n))
	assert.Equal(t, eventCounts{Shipping: 4, ShippedTwice: 1}, n)
	n = eventCounts{}
	assert.Empty(t, checkShipping(his[:2], map[string]bool{"invoice.paid:A": true, "invoice.paid:B": true}, &n))
}

// The verdict per invariant: ok or FAILED with the count, I10 and I11 only with events,
// and the run's own failures last.
func TestVerdicts(t *testing.T) {
	all := func(events bool) []string {
		v := []string{"I1 ok", "I2 ok", "I3 ok", "I4 ok", "I5 ok", "I6 ok", "I7 ok", "I8 ok", "I9 ok"}
		if events {
			v = append(v, "I10 ok", "I11 ok")
		}
		return v
	}
	with := func(v []string, i int, s string) []string { v = slices.Clone(v); v[i] = s; return v }
	for _, c := range []struct {
		name       string
		violations []string
		events     bool
		expect     []string
	}{
		{"clean", nil, false, all(false)},
		{"clean with events", nil, true, all(true)},
		{"an invariant twice", []string{"I4: x", "I4: y"}, false, with(all(false), 3, "I4 FAILED (2)")},
		{"I10 and I11", []string{"I10: a", "I11: b", "I11: c"}, true, with(with(all(true), 9, "I10 FAILED (1)"), 10, "I11 FAILED (2)")},
		{"the run itself", []string{"run: short of kills", "no prefix"}, false, append(all(false), "run FAILED (2)")},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.expect, verdicts(c.violations, c.events))
		})
	}
}

// The report's numbers come from the history: task log entries by kind, the completed
// instances' durations, the provider's requests, the invoices paid without an operator,
// and at most fifty violations spelled out.
func TestReportWrite(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pi := func(id, state string, took time.Duration) admin.HistoricProcessInstance {
		h := admin.HistoricProcessInstance{ID: id, State: state}
		h.StartTime.Time = t0
		if took > 0 {
			h.EndTime.Time = t0.Add(took)
		}
		return h
	}
	hist := engineHistory{
		ProcessInstances: []admin.HistoricProcessInstance{pi("a", "COMPLETED", 3*time.Second), pi("b", "COMPLETED", time.Second), pi("c", "ACTIVE", 0)},
		ExternalTaskLog: map[string][]camunda7.ExternalTaskLogEntry{
			"a": {{CreationLog: true}, {FailureLog: true}, {SuccessLog: true}},
			"b": {{CreationLog: true}, {DeletionLog: true}},
		},
		Incidents: []admin.Incident{{ProcessInstanceID: "c"}},
	}
	assert.Equal(t, taskLogCounts{created: 2, completed: 1, failed: 1, deleted: 1}, countTaskLog(hist))
	assert.Equal(t, []time.Duration{time.Second, 3 * time.Second}, completedIn(hist))
	log := []fakeprovider.Request{{Method: "POST", Outcome: "created"}, {Method: "GET", Outcome: "found"}, {Method: "POST"}}
	posts, gets, outcomes := countRequests(log)
	assert.Equal(t, 2, posts)
	assert.Equal(t, 1, gets)
	assert.Equal(t, map[string]int{"created": 1, "found": 1, "unfinished": 1}, outcomes)

	violations := make([]string, 52)
	for i := range violations {
		violations[i] = "I4: bad"
	}
	res := &Result{Seed: 42, Instances: 3, Paid: 10, Declined: 1, Violations: violations,
		Engine: oracle.InstanceCounts{Started: 11, Completed: 8, Incidents: 2}, HeldDeclined: 1}
	var b strings.Builder
	assert.NoError(t, report{res: res, hist: hist, log: log}.write(&b))
	lines := strings.Split(b.String(), "\n")
	has := func(prefix string) string {
		for _, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		t.Errorf("no line %q in\n%s", prefix, b.String())
		return ""
	}
	// Two held, one of them a decline: 10 - (2-1) = 9 invoices to pay without an operator.
	assert.Equal(t, "without operator 8 of 9 invoices to pay completed (88.89%), not counting 2 the provider left undecidable (stored 500)",
		has("without operator"))
	assert.Contains(t, has("external tasks"), "created 2, completed 1, failures reported 1, deleted 1")
	assert.Contains(t, has("end-to-end"), "p50 3s, p99 3s, max 3s")
	assert.Contains(t, has("provider "), "2 charge requests, 1 lookups")
	assert.Contains(t, has("invariants"), "I4 FAILED (52)")
	assert.Equal(t, 50, strings.Count(b.String(), "VIOLATION I4: bad\n"))
	assert.Equal(t, "... and 2 more", has("... and"))
	assert.NotContains(t, b.String(), "events out", "no events without a broker")
}
