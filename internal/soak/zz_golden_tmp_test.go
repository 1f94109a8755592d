package soak

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/internal/oracle"
)

func goldenReport(events bool, viol int) string {
	res := &Result{Seed: 42, Instances: 60, Paid: 57, Declined: 3, RandomKills: 3, FailpointKills: 2, Restarts: 5,
		PGRestarts: 1, BrokerRestarts: 1, Took: 74 * time.Second, Starts: 10 * time.Second, Kills: 15 * time.Second,
		Drain: 3 * time.Second, Check: time.Second, Faults: map[string]int{"random SIGKILL": 3, "failpoint kill after-confirm": 2, "provider rate_limited": 1},
		Engine: oracle.InstanceCounts{Started: 60, Completed: 56, BPMNErrorEnded: 3, Incidents: 1}, HeldDeclined: 0,
		Tier: "short", Settings: Settings{LockDuration: 3 * time.Second, Overrides: shortOverrides}, Timing: Timing{KillEvery: 2 * time.Second},
		RunDir: "/tmp/x"}
	for i := 0; i < viol; i++ {
		res.Violations = append(res.Violations, []string{"I4: bad", "run: meh", "I10: x", "I2: y"}[i%4])
	}
	if events {
		res.Events = &eventCounts{Events: 57, Tapped: 57, TapDeliveries: 59, DuplicatesSent: 2, InboxStates: map[string]int{"PROCESSED": 56, "FAILED_FINAL": 1}, Deliveries: 70, Duplicates: 2, Shipping: 57, Drain: 5 * time.Second}
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	hist := engineHistory{
		ProcessInstances: []admin.HistoricProcessInstance{{ID: "a", State: "COMPLETED"}, {ID: "b", State: "COMPLETED"}, {ID: "c", State: "ACTIVE"}},
		ExternalTaskLog: map[string][]camunda7.ExternalTaskLogEntry{"a": {{CreationLog: true}, {SuccessLog: true}}, "b": {{CreationLog: true}, {FailureLog: true}, {DeletionLog: true}}},
		Incidents:       []admin.Incident{{ProcessInstanceID: "c"}},
	}
	hist.ProcessInstances[0].StartTime.Time = t0
	hist.ProcessInstances[0].EndTime.Time = t0.Add(3 * time.Second)
	hist.ProcessInstances[1].StartTime.Time = t0
	hist.ProcessInstances[1].EndTime.Time = t0.Add(5 * time.Second)
	r := report{res: res, cfg: Config{Binary: "bin/invoice", Workers: 2}, version: "7.24.0",
		log:     []fakeprovider.Request{{Method: "POST", Outcome: "created"}, {Method: "GET", Outcome: "found"}, {Method: "POST"}},
		charges: []fakeprovider.Charge{{ID: "c1"}}, doubles: 0,
		rows:    []idempotency.Row{{State: idempotency.StateConfirmed}, {State: idempotency.StateReconciled}, {State: idempotency.StateConfirmed}},
		hist:    hist, reconciled: reconciliations{Unknown: 3, Found: 2, NotFound: 1}, sources: 11, canaries: 4, control: 60}
	var b strings.Builder
	_ = r.write(&b)
	return b.String()
}

func TestZZGolden(t *testing.T) {
	var all strings.Builder
	for _, ev := range []bool{false, true} {
		for _, v := range []int{0, 3, 57} {
			all.WriteString(goldenReport(ev, v))
			all.WriteString("\n=====\n")
		}
	}
	path := os.Getenv("GOLDEN")
	if path == "" {
		t.Skip()
	}
	if os.Getenv("GOLDEN_WRITE") != "" {
		os.WriteFile(path, []byte(all.String()), 0o644)
		return
	}
	want, _ := os.ReadFile(path)
	if string(want) != all.String() {
		os.WriteFile(path+".got", []byte(all.String()), 0o644)
		t.Fatal("report differs")
	}
}
