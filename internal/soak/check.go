package soak

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/oracle"
)

// Canaries planted in each run (I9, docs/reliability.md, Invariants): the engine password
// (the engine on 8080 ignores it, so it only travels), a provider API token in the
// provider URL, a password in the ledger database URL (sslpassword, unused without a
// client key), and personal data in a process variable no handler fetches. None of them
// may appear in the worker logs, the ledger rows or the engine's incidents, errorDetails,
// task log or the variables the workers write.
const (
	canaryEngine   = "sk_test_CANARY_soak_engine_pw_5e1d"
	canaryProvider = "sk_test_CANARY_soak_provider_tok_a07c"
	canaryDatabase = "sk_test_CANARY_soak_db_pw_c3b9"
	canaryPII      = "canary+pii@example.invalid"
	canaryVariable = "customerEmail" // carries canaryPII
)

var canaries = []string{canaryEngine, canaryProvider, canaryDatabase, canaryPII}

// plantedVariables are the variables the soak itself starts instances with: not written
// by a worker, so not I9's business.
var plantedVariables = map[string]bool{"invoiceId": true, "amountCents": true, canaryVariable: true}

// expectations decides what each invoice should have come to. Declines are planted by
// amount. An invoice may instead end unsettled with an incident (the operator queue)
// only if the provider stored a 500 under its key: that key then replays the 500 until
// the provider forgets it, so nobody can learn or change the outcome (matrix row T2).
func expectations(invoices []invoice, log []fakeprovider.Request, h engineHistory) []oracle.Expect {
	stored500 := map[string]bool{}
	for _, r := range log {
		if r.Outcome == "stored_500" {
			stored500[r.Invoice] = true
		}
	}
	incident := map[string]bool{}
	for _, in := range h.Incidents {
		incident[in.ProcessInstanceID] = true
	}
	paymentRef := map[string]string{}
	for _, v := range h.Variables {
		if v.Name == "paymentRef" {
			if s, err := (camunda7.Variables{"v": v.Variable()}).String("v"); err == nil {
				paymentRef[v.ProcessInstanceID] = s
			}
		}
	}
	out := make([]oracle.Expect, 0, len(invoices))
	for _, in := range invoices {
		out = append(out, oracle.Expect{Scope: scope, Key: intentKey(in.id), Invoice: in.id, Declined: in.declined,
			EngineRef: paymentRef[in.instance], MayHold: stored500[in.id], Incident: incident[in.instance]})
	}
	return out
}

// allowedIncident accepts an incident of an invoice the provider left undecidable (see
// expectations) and nothing else.
func allowedIncident(invoices []invoice, mayHold map[string]bool) func(admin.Incident) bool {
	byInstance := map[string]string{}
	for _, in := range invoices {
		byInstance[in.instance] = in.id
	}
	return func(i admin.Incident) bool { return mayHold[byInstance[i.ProcessInstanceID]] }
}

// effects are the provider's charges as I2 compares them with the ledger: each with the
// request the demo handler builds for it (cmd/extworker/demo.go).
func effects(charges []fakeprovider.Charge) []oracle.Effect {
	out := make([]oracle.Effect, 0, len(charges))
	for _, ch := range charges {
		out = append(out, oracle.Effect{ID: ch.ID, Key: ch.Key,
			Request: map[string]any{"invoice": ch.Invoice, "amountCents": ch.AmountCents}})
	}
	return out
}

// scanCanaries checks I9 over the run directory's worker logs and ledger dump and over
// the engine's incidents, errorDetails, task log messages and the variables workers
// wrote, for the given canaries. It returns the leaks and how many sources it read.
func scanCanaries(ctx context.Context, dir string, h engineHistory, canaries []string) ([]oracle.Leak, int, error) {
	var sources []oracle.Source
	files, err := filepath.Glob(filepath.Join(dir, workerLogGlob))
	if err != nil {
		return nil, 0, err
	}
	slices.Sort(files)
	files = append(files, filepath.Join(dir, ledgerIntentsFile), filepath.Join(dir, ledgerEventsFile))
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, 0, err
		}
		defer f.Close()
		sources = append(sources, oracle.Source{Name: name, R: f})
	}
	var incidents, details, taskLog, vars bytes.Buffer
	for _, in := range h.Incidents {
		fmt.Fprintf(&incidents, "%s %s: %s\n", in.ProcessInstanceID, in.IncidentType, in.IncidentMessage)
	}
	for id, d := range h.ErrorDetails {
		fmt.Fprintf(&details, "== external task %s\n%s\n", id, d)
	}
	for id, entries := range h.ExternalTaskLog {
		for _, e := range entries {
			if e.ErrorMessage != "" {
				fmt.Fprintf(&taskLog, "%s %s: %s\n", id, e.ExternalTaskID, e.ErrorMessage)
			}
		}
	}
	for _, v := range h.Variables {
		if !plantedVariables[v.Name] {
			fmt.Fprintf(&vars, "%s %s %s: %s %s\n", v.ProcessInstanceID, v.Name, v.Type, v.Value, v.ValueInfo.ObjectTypeName)
		}
	}
	sources = append(sources,
		oracle.Source{Name: "engine incident messages", R: &incidents},
		oracle.Source{Name: "engine errorDetails", R: &details},
		oracle.Source{Name: "engine external task log errorMessages", R: &taskLog},
		oracle.Source{Name: "engine variables written by workers", R: &vars})
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	leaks, err := oracle.ScanCanaries(canaries, sources...)
	return leaks, len(sources), err
}

// plantedCanaries is I9's positive control: how many of the run's instances hold the
// canary variable the soak planted, as the scanner finds it in the engine's variables.
// Fewer than the instances started means the canary never reached the engine, or the
// scan cannot see it, and a clean I9 would prove nothing.
func plantedCanaries(h engineHistory) (int, error) {
	var planted bytes.Buffer
	for _, v := range h.Variables {
		if v.Name == canaryVariable {
			fmt.Fprintf(&planted, "%s %s\n", v.ProcessInstanceID, v.Value)
		}
	}
	hits, err := oracle.ScanCanaries([]string{canaryPII}, oracle.Source{Name: "planted variables", R: &planted})
	return len(hits), err
}

// intentKey is the demo's intent key for an invoice (cmd/extworker/demo.go).
func intentKey(invoice string) string { return "invoice:" + invoice + ":v1" }

// scope is the demo's payment scope.
const scope = "payment.collect"

// invariantOf names the invariant a violation is about ("I4"), from its prefix.
func invariantOf(v string) string {
	if i := strings.IndexByte(v, ':'); i > 0 && i <= 3 && v[0] == 'I' {
		return v[:i]
	}
	return "run"
}

// checkInput is what the recorder and the oracle need of a finished run.
type checkInput struct {
	c        *admin.Client
	pool     *pgxpool.Pool
	ledger   *idempotency.Ledger
	pay      *fakeprovider.Server
	ns, run  string
	invoices []invoice
	start    time.Time
	faults   map[string]int
	canaries []string
	// events is the broker's tap (nil: no events); eventsDrain how long they took to
	// settle after the invoices had.
	events      *tap
	eventsDrain time.Duration
}

// check records the run's history under res.RunDir, runs the oracle over it, writes
// report.txt (and prints it), and prunes a passing run's history unless asked to keep
// it. The error sums up the violations.
func check(ctx context.Context, cfg Config, res *Result, in checkInput, out io.Writer) error {
	began := time.Now()
	violate := func(format string, args ...any) {
		res.Violations = append(res.Violations, fmt.Sprintf(format, args...))
	}
	res.Violations = append(res.Violations, phaseViolations(*res, cfg.MinKills)...)
	st, hist := record(ctx, res.RunDir, in, violate)
	// The demo topics are fixed: any other worker serving them on this engine takes some
	// of the run's tasks with its own ledger and provider, and the oracle would blame
	// this run's workers. Say so plainly.
	if foreign := foreignWorkers(hist, cfg.Seed); len(foreign) > 0 {
		violate("run: workers not of this run reported on its tasks (%s): another worker serves the demo topics on this engine, so this run proves nothing; run the soak alone",
			counts(foreign))
	}
	log, charges := in.pay.Log(), in.pay.Charges()
	mayHold, rows := checkInvoices(ctx, res, in, log, charges, hist, violate)
	// I10 and I11 over the run's events.
	if in.events != nil {
		ev := checkEvents(ctx, in.c, in.pool, in.events, in.ns, in.run, paidInvoices(rows, in.ns, in.run), violate)
		ev.BrokerRestarts, ev.Drain = res.BrokerRestarts, in.eventsDrain
		if ev.Drain >= eventsDrainAllowed {
			violate("run: the events did not settle within %v of the invoices", eventsDrainAllowed)
		}
		res.Events = &ev
	}
	// I3 over the run's instances.
	var iv []string
	res.Engine, iv = oracle.CheckInstances(instancesOf(in.invoices), st, allowedIncident(in.invoices, mayHold), time.Now())
	res.Violations = append(res.Violations, iv...)
	sources, control := checkCanaries(ctx, res, in, hist, violate)

	res.Faults = withProviderFaults(in.faults, log)
	res.Check = time.Since(began)
	rep := report{res: res, cfg: cfg, log: log, charges: charges, doubles: in.pay.DoubleCharges(), rows: rows, hist: hist, sources: sources, canaries: len(in.canaries), control: control}
	rep.version, _ = in.c.Version(ctx)
	rep.reconciled, _ = reconcileCounts(ctx, in.pool, in.ns)
	if err := writeFile(filepath.Join(res.RunDir, reportFile), rep.write); err != nil {
		fmt.Fprintf(out, "soak: write the report: %v\n", err)
	}
	_ = rep.write(out)
	if len(res.Violations) > 0 {
		fmt.Fprintf(out, "soak: FAILED; the run's whole history is in %s\n", res.RunDir)
		return fmt.Errorf("soak: %d invariant violations (seed %d); history in %s", len(res.Violations), cfg.Seed, res.RunDir)
	}
	if !cfg.KeepHistory {
		if err := prune(res.RunDir); err != nil {
			return fmt.Errorf("soak: prune %s: %w", res.RunDir, err)
		}
	}
	return nil
}

// phaseViolations are the run's own failures before any history is read: fewer kills
// than asked for, a drain longer than the tier allows.
func phaseViolations(res Result, minKills int) []string {
	var v []string
	if k := res.RandomKills + res.FailpointKills; k < minKills {
		v = append(v, fmt.Sprintf("run: the run reached %d kills, short of the %d asked for", k, minKills))
	}
	if res.Drain > res.Timing.DrainAllowed {
		v = append(v, fmt.Sprintf("run: the drain took %v, over the %v allowed (%s tier)", res.Drain.Round(time.Second), res.Timing.DrainAllowed, res.Tier))
	}
	return v
}

// record saves the provider's history and the ledger's rows under dir, reads the
// engine's state and history of the run's instances, and saves the history too.
func record(ctx context.Context, dir string, in checkInput, violate func(string, ...any)) (oracle.EngineState, engineHistory) {
	if err := recordProvider(dir, in.pay); err != nil {
		violate("run: record the provider's history: %v", err)
	}
	if err := recordLedger(ctx, dir, in.pool, in.ns); err != nil {
		violate("run: record the ledger: %v", err)
	}
	st, err := oracle.ReadEngine(ctx, in.c, oracle.EngineQuery{ProcessDefinitionKey: processKey, BusinessKeyPrefix: in.run,
		ErrorEndActivities: []string{errorEndEvent}, Since: in.start.Add(-time.Minute)})
	if err != nil {
		violate("run: read the engine's state: %v", err)
	}
	hist, err := readEngineHistory(ctx, in.c, st)
	if err != nil {
		violate("run: read the engine's history: %v", err)
	}
	if err := recordEngine(dir, hist); err != nil {
		violate("run: record the engine's history: %v", err)
	}
	return st, hist
}

// foreignWorkers counts, by worker id, the successes and failures on the run's tasks
// that workers of another run (or another program) reported.
func foreignWorkers(h engineHistory, seed uint64) map[string]int {
	foreign := map[string]int{}
	for _, entries := range h.ExternalTaskLog {
		for _, e := range entries {
			if (e.SuccessLog || e.FailureLog) && !strings.HasPrefix(e.WorkerID, fmt.Sprintf("soak-%d-", seed)) {
				foreign[e.WorkerID]++
			}
		}
	}
	return foreign
}

// checkInvoices checks I1 and I4-I8 per invoice and I2 over every effect and every
// intent of the run. It returns which invoices may hold an incident (expectations) and
// the ledger's rows.
func checkInvoices(ctx context.Context, res *Result, in checkInput, log []fakeprovider.Request, charges []fakeprovider.Charge,
	hist engineHistory, violate func(string, ...any)) (map[string]bool, []idempotency.Row) {
	exps := expectations(in.invoices, log, hist)
	mayHold := map[string]bool{}
	for _, e := range exps {
		mayHold[e.Invoice] = e.MayHold
		res.Violations = append(res.Violations, oracle.Check(ctx, in.ledger.Operations(), charges, e)...)
	}
	res.HeldDeclined = heldDeclined(exps)
	rows, err := in.ledger.Operations().List(ctx, idempotency.Filter{Limit: 2*len(in.invoices) + 100})
	if err != nil {
		violate("run: list the ledger: %v", err)
	}
	res.Violations = append(res.Violations, oracle.CheckDigests(rows, effects(charges))...)
	return mayHold, rows
}

// heldDeclined counts the invoices to decline that may hold an incident and do: the
// provider stored a 500 under their key before it could decline.
func heldDeclined(exps []oracle.Expect) int {
	n := 0
	for _, e := range exps {
		if e.Declined && e.MayHold && e.Incident {
			n++
		}
	}
	return n
}

// paidInvoices are the run's invoices (their ids begin with run) whose charge the ledger
// confirmed (confirmed, or reconciled as made), by invoice id, from the rows of namespace
// ns. An earlier run's invoice is not the run's, though its task, left on the engine, was
// taken and charged in ns: the run's outbox has no event of it to hold against it.
func paidInvoices(rows []idempotency.Row, ns, run string) map[string]bool {
	paid := map[string]bool{}
	for _, r := range rows {
		if r.Namespace == ns && r.Scope == scope && strings.HasPrefix(r.Key, "invoice:"+run) &&
			(r.State == idempotency.StateConfirmed || r.State == idempotency.StateReconciled) {
			paid[strings.TrimSuffix(strings.TrimPrefix(r.Key, "invoice:"), ":v1")] = true
		}
	}
	return paid
}

// instancesOf is the instance ids the invoices started.
func instancesOf(invoices []invoice) []string {
	started := make([]string, 0, len(invoices))
	for _, inv := range invoices {
		started = append(started, inv.instance)
	}
	return started
}

// checkCanaries checks I9 over the recorded logs, the ledger dump and the engine's
// state, with its positive control. It returns how many sources it scanned and in how
// many instances the control found the planted canary.
func checkCanaries(ctx context.Context, res *Result, in checkInput, hist engineHistory, violate func(string, ...any)) (sources, control int) {
	leaks, sources, err := scanCanaries(ctx, res.RunDir, hist, in.canaries)
	if err != nil {
		violate("run: I9 scan: %v", err)
	}
	res.Leaks = len(leaks)
	for _, l := range leaks {
		violate("%s", l)
	}
	control, err = plantedCanaries(hist)
	if err != nil || control < len(in.invoices) {
		violate("run: I9's control found the planted canary variable in %d of %d instances (%v)", control, len(in.invoices), err)
	}
	return sources, control
}

// withProviderFaults adds the provider's faults, from its request log, to the faults
// the harness injected (by kind); it returns injected, counted into.
func withProviderFaults(injected map[string]int, log []fakeprovider.Request) map[string]int {
	for _, r := range log {
		if r.Fault != "" {
			injected["provider "+r.Fault]++
		}
	}
	return injected
}
