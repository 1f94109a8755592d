package soak

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/idempotency"
)

// report is the Jepsen-style account of one run (docs/reliability.md, The soak): what was
// injected, what the system did, which invariants held, and where the history is.
type report struct {
	res        *Result
	cfg        Config
	version    string
	log        []fakeprovider.Request
	charges    []fakeprovider.Charge
	doubles    int // invoices charged more than once
	rows       []idempotency.Row
	hist       engineHistory
	reconciled reconciliations
	sources    int // I9 sources scanned
	canaries   int // I9 canaries looked for
	control    int // instances whose planted canary the scanner found
}

// reconciliations counts the run's unknown outcomes and how they were resolved, from
// the ledger's events.
type reconciliations struct {
	Unknown, Found, NotFound, Rejected int
}

func reconcileCounts(ctx context.Context, pool *pgxpool.Pool, namespace string) (reconciliations, error) {
	var r reconciliations
	err := pool.QueryRow(ctx, `SELECT
			count(*) FILTER (WHERE e.to_state = 'unknown' AND e.from_state IS DISTINCT FROM 'unknown'),
			count(*) FILTER (WHERE e.from_state = 'unknown' AND e.to_state = 'reconciled'),
			count(*) FILTER (WHERE e.from_state = 'unknown' AND e.to_state = 'prepared'),
			count(*) FILTER (WHERE e.from_state = 'unknown' AND e.to_state = 'rejected')
		FROM extworker_intent_events e JOIN extworker_intents i ON i.id = e.intent_id WHERE i.namespace = $1`, namespace).
		Scan(&r.Unknown, &r.Found, &r.NotFound, &r.Rejected)
	return r, err
}

// write writes the report: the run, the engine's side, the provider's, the ledger's,
// what was injected, the events, and the verdict.
func (r report) write(w io.Writer) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	r.writeRun(p)
	r.writeEngine(p)
	r.writeProvider(p)
	r.writeLedger(p)
	r.writeInjected(&b, p)
	r.writeEvents(p)
	r.writeVerdict(p)
	_, err := io.WriteString(w, b.String())
	return err
}

// linef prints one line of the report.
type linef func(format string, args ...any)

// writeRun is the run: seed, versions, history, timings, workers, tier and settings.
func (r report) writeRun(p linef) {
	res, cfg := r.res, r.cfg
	p("soak report")
	p("seed            %d (replay: -seed %d)", res.Seed, res.Seed)
	p("versions        engine %s, %s, worker binary %s", cmp.Or(r.version, "?"), runtime.Version(), cfg.Binary)
	p("history         %s", res.RunDir)
	p("took            %.1fs: instances started by %.1fs, kills until %.1fs, drain %.1fs; then recording and oracle %.1fs",
		res.Took.Seconds(), res.Starts.Seconds(), res.Kills.Seconds(), res.Drain.Seconds(), res.Check.Seconds())
	p("workers         %d processes, %d restarts", cfg.Workers, res.Restarts)
	overrides := "none: the daemon's shipped defaults"
	if len(res.Settings.Overrides) > 0 {
		overrides = strings.Join(res.Settings.Overrides, " ")
	}
	p("tier            %s (overrides: %s)", res.Tier, overrides)
	p("worker settings %s", res.Settings)
	p("harness timing  a kill every ~%v, provider delay fault %v, drain allowed %v, workers stopped within %v of SIGTERM",
		res.Timing.KillEvery, res.Timing.ProviderDelay, res.Timing.DrainAllowed, res.Timing.StopWithin)
}

// writeEngine is the engine's side: the instances, the invoices paid without an
// operator, the external tasks and the end-to-end times.
func (r report) writeEngine(p linef) {
	res := r.res
	tasks := countTaskLog(r.hist)
	took := completedIn(r.hist)
	p("instances       started %d (%d to pay, %d to decline): completed %d, BPMN-error ended %d, held by incidents %d, lost %d, stuck tasks %d",
		res.Engine.Started, res.Paid, res.Declined, res.Engine.Completed, res.Engine.BPMNErrorEnded, res.Engine.Incidents, res.Engine.Lost, res.Engine.Stuck)
	held := res.Engine.Incidents // only the undecidable may hold an incident (I3)
	toPay := res.Paid - (held - res.HeldDeclined)
	p("without operator %d of %d invoices to pay completed (%.2f%%), not counting %d the provider left undecidable (stored 500)",
		res.Engine.Completed, toPay, 100*float64(res.Engine.Completed)/float64(max(toPay, 1)), held)
	p("external tasks  created %d, completed %d, failures reported %d, deleted %d (BPMN errors: %d), open incidents %d",
		tasks.created, tasks.completed, tasks.failed, tasks.deleted, res.Engine.BPMNErrorEnded, len(r.hist.Incidents))
	p("end-to-end      p50 %v, p99 %v, max %v (start to end of completed instances)", quantile(took, 0.5), quantile(took, 0.99), quantile(took, 1))
}

// writeProvider is the provider's side: requests, charges and its outcomes.
func (r report) writeProvider(p linef) {
	posts, gets, outcomes := countRequests(r.log)
	p("provider        %d charge requests, %d lookups, %d effects (charges) for %d invoices to pay, %d invoices charged twice",
		posts, gets, len(r.charges), r.res.Paid, r.doubles)
	p("provider says   %s", counts(outcomes))
}

// writeLedger is the ledger's side: the intents by state, the unknown outcomes and how
// they were resolved.
func (r report) writeLedger(p linef) {
	states := map[string]int{}
	for _, row := range r.rows {
		states[string(row.State)]++
	}
	p("ledger          %d intents: %s", len(r.rows), counts(states))
	p("outcome classes unknown outcomes %d: reconciled found %d, not found (sent again, same key) %d, declined %d",
		r.reconciled.Unknown, r.reconciled.Found, r.reconciled.NotFound, r.reconciled.Rejected)
}

// writeInjected is what was injected: the faults by kind, the kills and the restarts.
func (r report) writeInjected(b io.Writer, p linef) {
	res := r.res
	p("faults injected by kind (provider mix: %s)", providerFaults)
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	for _, k := range slices.Sorted(maps.Keys(res.Faults)) {
		fmt.Fprintf(tw, "  %s\t%d\n", k, res.Faults[k])
	}
	tw.Flush()
	p("kills           %d random, %d at failpoints; %d PostgreSQL restarts, %d engine restarts, %d broker restarts",
		res.RandomKills, res.FailpointKills, res.PGRestarts, res.EngineRestarts, res.BrokerRestarts)
}

// writeEvents is what the events did, with a broker.
func (r report) writeEvents(p linef) {
	ev := r.res.Events
	if ev == nil {
		return
	}
	in := ev.Broker
	if ev.Broker == "Kafka" {
		in = fmt.Sprintf("Kafka (group %s, %d rebalances seen)", shippingGroup, ev.Rebalances)
	}
	p("events out      %s: %d invoice.paid in the outbox, %d unpublished; %d reached the broker's tap, %d copies in all (relays that died before their mark, and the duplicator's %d)",
		ev.Broker, ev.Events, ev.Unpublished, ev.Tapped, ev.TapDeliveries, ev.DuplicatesSent)
	p("events in       %s: %d inbox rows (%s): %d deliveries, %d duplicates suppressed, %d reconciled with the engine after a consumer died; %d shipping instances, %d invoices shipped twice; settled %.1fs after the invoices",
		in, ev.inboxRows(), counts(ev.InboxStates), ev.Deliveries, ev.Duplicates, ev.Reconcd, ev.Shipping, ev.ShippedTwice, ev.Drain.Seconds())
}

// writeVerdict is the verdict per invariant, I9's control, and the violations (the first
// 50).
func (r report) writeVerdict(p linef) {
	res := r.res
	p("invariants      %s", strings.Join(verdicts(res.Violations, res.Events != nil), ", "))
	p("I9              %d canaries in %d sources: %d found (control: the planted variable canary found in %d of %d instances)",
		r.canaries, r.sources, res.Leaks, r.control, res.Instances)
	p("violations      %d", len(res.Violations))
	for _, v := range res.Violations[:min(len(res.Violations), 50)] {
		p("VIOLATION %s", v)
	}
	if len(res.Violations) > 50 {
		p("... and %d more", len(res.Violations)-50)
	}
}

// verdicts is the verdict per invariant: "I4 ok", or "I4 FAILED (n)" with the number of
// its violations, for I1-I9 and, with events, I10 and I11; then "run FAILED (n)" when
// the run itself failed (violations not of an invariant).
func verdicts(violations []string, events bool) []string {
	by := map[string]int{}
	for _, v := range violations {
		by[invariantOf(v)]++
	}
	invariants := []string{"I1", "I2", "I3", "I4", "I5", "I6", "I7", "I8", "I9"}
	if events {
		invariants = append(invariants, "I10", "I11")
	}
	var out []string
	for _, inv := range invariants {
		if n := by[inv]; n > 0 {
			out = append(out, fmt.Sprintf("%s FAILED (%d)", inv, n))
		} else {
			out = append(out, inv+" ok")
		}
	}
	if n := by["run"]; n > 0 {
		out = append(out, fmt.Sprintf("run FAILED (%d)", n))
	}
	return out
}

// taskLogCounts counts the external task log's entries by kind.
type taskLogCounts struct{ created, completed, failed, deleted int }

func countTaskLog(h engineHistory) taskLogCounts {
	var n taskLogCounts
	for _, entries := range h.ExternalTaskLog {
		for _, e := range entries {
			switch {
			case e.CreationLog:
				n.created++
			case e.SuccessLog:
				n.completed++
			case e.FailureLog:
				n.failed++
			case e.DeletionLog:
				n.deleted++
			}
		}
	}
	return n
}

// completedIn is how long each completed instance took from start to end, sorted.
func completedIn(h engineHistory) []time.Duration {
	var took []time.Duration
	for _, pi := range h.ProcessInstances {
		if pi.State == "COMPLETED" && !pi.EndTime.IsZero() {
			took = append(took, pi.EndTime.Sub(pi.StartTime.Time))
		}
	}
	slices.Sort(took)
	return took
}

// countRequests counts the provider's charge requests (POST) and lookups, and the
// requests by outcome ("unfinished" for those without one).
func countRequests(log []fakeprovider.Request) (posts, gets int, outcomes map[string]int) {
	outcomes = map[string]int{}
	for _, q := range log {
		if q.Method == "POST" {
			posts++
		} else {
			gets++
		}
		outcomes[cmp.Or(q.Outcome, "unfinished")]++
	}
	return posts, gets, outcomes
}

// quantile is the q-quantile of sorted durations, rounded to the millisecond.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := min(int(q*float64(len(sorted))), len(sorted)-1)
	return sorted[i].Round(time.Millisecond)
}

// counts renders a tally as "a 3, b 1", largest first.
func counts(m map[string]int) string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b)) })
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// lockedWriter serialises writes to the run's output from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
