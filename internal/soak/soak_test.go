package soak

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/internal/oracle"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The toxic windows act on real traffic through the in-process toxiproxy: during a
// latency window an answer takes at least the latency, during a reset_peer window the
// answer never arrives, and once a window is over the link is clean again.
func TestToxicWindowsOnTheWire(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer srv.Close()
	tox := newToxics()
	defer tox.close()
	p, err := tox.proxy("provider", strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	get := func() (time.Duration, error) {
		t0 := time.Now()
		resp, err := hc.Get("http://" + p.addr() + "/")
		if err != nil {
			return time.Since(t0), err
		}
		defer resp.Body.Close()
		var b [2]byte
		if _, err := resp.Body.Read(b[:]); err != nil && string(b[:]) != "ok" {
			return time.Since(t0), err
		}
		return time.Since(t0), nil
	}
	_, err = get()
	require.NoError(t, err, "a clean link")

	for _, c := range []struct {
		w     window
		check func(time.Duration, error)
	}{
		{window{kind: "latency", toxic: "latency", stream: "downstream", attrs: map[string]any{"latency": 400}},
			func(d time.Duration, err error) {
				require.NoError(t, err)
				assert.GreaterOrEqual(t, d, 400*time.Millisecond)
			}},
		{window{kind: "reset", toxic: "reset_peer", stream: "downstream", attrs: map[string]any{"timeout": 0}},
			func(_ time.Duration, err error) { require.Error(t, err, "the answer is cut off") }},
	} {
		t.Run(c.w.kind, func(t *testing.T) {
			c.w.proxy, c.w.span = p, time.Minute
			ctx, cancel := context.WithCancel(context.Background())
			on := make(chan string, 1)
			done := make(chan struct{})
			go func() {
				defer close(done)
				runWindows(ctx, time.Now(), []window{c.w}, func(kind string) { on <- kind }, t.Logf)
			}()
			select {
			case kind := <-on:
				assert.Equal(t, c.w.kind, kind)
			case <-time.After(10 * time.Second):
				t.Fatal("the window never started")
			}
			c.check(get())
			cancel() // ends the window early and lifts the toxic
			<-done
			d, err := get()
			require.NoError(t, err, "the link is clean after the window")
			assert.Less(t, d, 400*time.Millisecond)
		})
	}
}

// Windows fall inside the kill phase, in the same places for the same seed.
func TestToxicWindowsSchedule(t *testing.T) {
	phase := 50 * time.Second
	p, e := &toxiProxy{}, &toxiProxy{}
	for seed := uint64(1); seed < 50; seed++ {
		ws := toxicWindows(rand.New(rand.NewPCG(seed, 7)), phase, p, e, 15*time.Second)
		again := toxicWindows(rand.New(rand.NewPCG(seed, 7)), phase, p, e, 15*time.Second)
		require.Len(t, ws, 3)
		for i, w := range ws {
			assert.Equal(t, again[i].at, w.at, "seeded")
			assert.GreaterOrEqual(t, w.at, phase/10)
			assert.LessOrEqual(t, w.at+w.span, phase*17/20+time.Second, "%s ends within the kill phase", w.kind)
		}
	}
	assert.Len(t, toxicWindows(rand.New(rand.NewPCG(1, 7)), phase, p, nil, 0), 2, "no engine window unless asked")
}

// A passing run keeps report.txt and the tail of each worker log, nothing else.
func TestPruneKeepsReportAndTail(t *testing.T) {
	dir := t.TempDir()
	var long strings.Builder
	for i := range 100 {
		long.WriteString("line " + string(rune('a'+i%26)) + "\n")
	}
	files := map[string]string{
		reportFile: "soak report\n", "worker-0-000.log": long.String() + "last words\n", "worker-1-000.log": "",
		providerHistoryFile: "{}\n", ledgerIntentsFile: "{}\n", ledgerEventsFile: "{}\n", engineHistoryFile: "{}\n",
	}
	for name, content := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	require.NoError(t, prune(dir))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.ElementsMatch(t, []string{reportFile, tailFile}, names)
	tail, err := os.ReadFile(filepath.Join(dir, tailFile))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(tail), "==> worker-0-000.log <==\n"), "%s", tail)
	assert.Equal(t, tailLines+1, strings.Count(string(tail), "\n"), "header and the last lines")
	assert.Contains(t, string(tail), "last words")
	assert.NotContains(t, string(tail), "worker-1-000.log", "empty logs are left out")
}

func stringVar(t *testing.T, pid, name, value string) admin.HistoricVariableInstance {
	t.Helper()
	v := camunda7.StringVar(value)
	return admin.HistoricVariableInstance{Name: name, ProcessInstanceID: pid, Type: v.Type, Value: v.Value}
}

// What each invoice should come to: declines planted by amount; the engine's payment
// reference; an unsettled end allowed only where the provider stored a 500.
func TestExpectations(t *testing.T) {
	invoices := []invoice{{id: "A", instance: "pA"}, {id: "B", instance: "pB", declined: true}, {id: "C", instance: "pC"}}
	log := []fakeprovider.Request{
		{Method: "POST", Invoice: "A", Outcome: "created", EffectID: "ch_1"},
		{Method: "POST", Invoice: "B", Outcome: "declined"},
		{Method: "POST", Invoice: "C", Fault: "stored_500", Outcome: "stored_500"},
	}
	h := engineHistory{
		Incidents: []admin.Incident{{ProcessInstanceID: "pC", IncidentMessage: "unknown-outcome: held"}},
		Variables: []admin.HistoricVariableInstance{stringVar(t, "pA", "paymentRef", "ch_1"), stringVar(t, "pA", "receiptId", "rcpt_1")},
	}
	got := expectations(invoices, log, h)
	assert.Equal(t, []oracle.Expect{
		{Scope: scope, Key: "invoice:A:v1", Invoice: "A", EngineRef: "ch_1"},
		{Scope: scope, Key: "invoice:B:v1", Invoice: "B", Declined: true},
		{Scope: scope, Key: "invoice:C:v1", Invoice: "C", MayHold: true, Incident: true},
	}, got)
	allowed := allowedIncident(invoices, map[string]bool{"C": true})
	assert.True(t, allowed(admin.Incident{ProcessInstanceID: "pC"}))
	assert.False(t, allowed(admin.Incident{ProcessInstanceID: "pA"}))
	assert.Equal(t, []oracle.Effect{{ID: "ch_1", Key: "k", Request: map[string]any{"invoice": "A", "amountCents": int64(5)}}},
		effects([]fakeprovider.Charge{{ID: "ch_1", Key: "k", Invoice: "A", AmountCents: 5}}))
}

// I9 over a run directory: a canary in a worker log, in a ledger row, in a variable a
// worker wrote and in an incident is found with where; the variables the soak planted
// are the positive control, not a leak.
func TestScanCanariesOverARun(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	write("worker-0-000.log", `{"msg":"worker started"}`+"\n"+`{"msg":"oops","url":"http://token:`+canaryProvider+`@127.0.0.1"}`+"\n")
	write("worker-0-001.log", `{"msg":"clean"}`+"\n")
	write(ledgerIntentsFile, `{"id":1,"error_message":"declined"}`+"\n")
	write(ledgerEventsFile, `{"id":1,"reason":"db `+canaryDatabase+`"}`+"\n")
	h := engineHistory{
		Incidents:       []admin.Incident{{ProcessInstanceID: "p1", IncidentMessage: "retryable: password " + canaryEngine}},
		ErrorDetails:    map[string]string{"t1": "clean"},
		ExternalTaskLog: map[string][]camunda7.ExternalTaskLogEntry{"p1": {{ExternalTaskID: "t1", ErrorMessage: "clean"}}},
		Variables: []admin.HistoricVariableInstance{stringVar(t, "p1", canaryVariable, canaryPII), stringVar(t, "p2", canaryVariable, canaryPII),
			stringVar(t, "p1", "receiptId", "rcpt for "+canaryPII)},
	}
	leaks, sources, err := scanCanaries(context.Background(), dir, h, canaries)
	require.NoError(t, err)
	assert.Equal(t, 8, sources)
	var where []string
	for _, l := range leaks {
		where = append(where, filepath.Base(l.Source)+":"+l.Canary)
	}
	assert.Equal(t, []string{"worker-0-000.log:" + canaryProvider, ledgerEventsFile + ":" + canaryDatabase,
		"engine incident messages:" + canaryEngine, "engine variables written by workers:" + canaryPII}, where)
	assert.Equal(t, 2, leaks[0].Line)

	control, err := plantedCanaries(h)
	require.NoError(t, err)
	assert.Equal(t, 2, control)
}

// The engine history round-trips through its JSON file (what a failed run leaves).
func TestRecordEngine(t *testing.T) {
	dir := t.TempDir()
	h := engineHistory{ProcessInstances: []admin.HistoricProcessInstance{{ID: "p1", State: "COMPLETED"}},
		ExternalTaskLog: map[string][]camunda7.ExternalTaskLogEntry{"p1": {{ExternalTaskID: "t1", SuccessLog: true, WorkerID: "soak-1-0-0"}}},
		ErrorDetails:    map[string]string{}}
	require.NoError(t, recordEngine(dir, h))
	b, err := os.ReadFile(filepath.Join(dir, engineHistoryFile))
	require.NoError(t, err)
	var back engineHistory
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, "soak-1-0-0", back.ExternalTaskLog["p1"][0].WorkerID)
	assert.Equal(t, "COMPLETED", back.ProcessInstances[0].State)
}

// The harness's timing follows the workers' settings: the short tier keeps the timing it
// always had (a delay fault of 4 s past the 3 s lock and lease, the two-minute drain),
// and the shipped defaults stretch it (the delay outlasts the 20 s lock and so the 10 s
// provider timeout; the drain allows a crashed attempt's 2 min lease, its 20 s lock and
// a 20 s long poll).
func TestDeriveTiming(t *testing.T) {
	short := Settings{LockDuration: 3 * time.Second, LongPoll: time.Second, LedgerLease: 3 * time.Second,
		ProviderTimeout: 2500 * time.Millisecond, ShutdownGrace: 5 * time.Second}
	assert.Equal(t, Timing{KillEvery: 2 * time.Second, ProviderDelay: 4 * time.Second, DrainAllowed: 2 * time.Minute,
		StopWithin: 20 * time.Second}, deriveTiming(short, 2*time.Second))
	assert.Equal(t, 1500*time.Millisecond, deriveTiming(short, 0).KillEvery, "half the lock unless asked")

	defaults := Settings{LockDuration: 20 * time.Second, LongPoll: 20 * time.Second, LedgerLease: 2 * time.Minute,
		ProviderTimeout: 10 * time.Second, ShutdownGrace: 30 * time.Second}
	assert.Equal(t, Timing{KillEvery: 10 * time.Second, ProviderDelay: 21 * time.Second, DrainAllowed: 3*time.Minute + 50*time.Second,
		StopWithin: 45 * time.Second}, deriveTiming(defaults, 0))
	defaults.ShutdownTimeout = 45 * time.Second
	assert.Equal(t, time.Minute, deriveTiming(defaults, 0).StopWithin, "the shutdown timeout bounds the stop when the binary has one")
}

// The workers' environment inherits no EXTWORKER_ setting from the shell, and the
// defaults tier sets none beyond what it is given.
func TestWorkerEnv(t *testing.T) {
	t.Setenv("EXTWORKER_LOCK_DURATION", "1s")
	t.Setenv("EXTWORKER_FAILPOINTS", "after-confirm")
	has := func(env []string, prefix string) bool {
		for _, kv := range env {
			if strings.HasPrefix(kv, prefix) {
				return true
			}
		}
		return false
	}
	d := workerEnv(true, "EXTWORKER_LOG_FORMAT=json")
	assert.False(t, has(d, "EXTWORKER_LOCK_DURATION="), "inherited settings dropped")
	assert.False(t, has(d, "EXTWORKER_FAILPOINTS="))
	var ours []string
	for _, kv := range d {
		if strings.HasPrefix(kv, "EXTWORKER_") {
			ours = append(ours, kv)
		}
	}
	assert.Equal(t, []string{"EXTWORKER_LOG_FORMAT=json"}, ours)
	s := workerEnv(false)
	for _, o := range shortOverrides {
		assert.Contains(t, s, o)
	}
}
