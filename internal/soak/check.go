package soak

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
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
