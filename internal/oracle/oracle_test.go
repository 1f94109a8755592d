package oracle_test

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/oracle"
)

func chargeRequest(invoice string, amount int64) any {
	return map[string]any{"invoice": invoice, "amountCents": amount}
}

func row(t *testing.T, key, providerKey string, request any) idempotency.Row {
	t.Helper()
	d, err := idempotency.Digest(request)
	require.NoError(t, err)
	return idempotency.Row{Scope: "payment.collect", Key: key, ProviderKey: providerKey, Digest: d}
}

// I2: an effect whose request digests to the ledger's digest for its key passes; a
// different amount under the same key, an effect under a key no intent owns, an effect
// without a key and two intents sharing a provider key are each reported.
func TestCheckDigests(t *testing.T) {
	rows := []idempotency.Row{
		row(t, "invoice:A:v1", "pk-a", chargeRequest("A", 1200)),
		row(t, "invoice:B:v1", "pk-b", chargeRequest("B", 3400)),
	}
	t.Run("agree", func(t *testing.T) {
		// Field order and the number's Go type do not matter: the digest is canonical.
		v := oracle.CheckDigests(rows, []oracle.Effect{
			{ID: "ch_1", Key: "pk-a", Request: struct {
				AmountCents int    `json:"amountCents"`
				Invoice     string `json:"invoice"`
			}{1200, "A"}},
			{ID: "ch_2", Key: "pk-b", Request: chargeRequest("B", 3400)},
		})
		assert.Empty(t, v)
	})
	cases := []struct {
		name   string
		rows   []idempotency.Row
		effect oracle.Effect
		want   string
	}{
		{"other amount", rows, oracle.Effect{ID: "ch_3", Key: "pk-b", Request: chargeRequest("B", 3401)}, "I2: effect ch_3 (invoice:B:v1) performed a request with digest"},
		{"other invoice", rows, oracle.Effect{ID: "ch_4", Key: "pk-a", Request: chargeRequest("B", 1200)}, "I2: effect ch_4 (invoice:A:v1)"},
		{"no intent", rows, oracle.Effect{ID: "ch_5", Key: "pk-zzz", Request: chargeRequest("A", 1200)}, "I2: effect ch_5 under key pk-zzz has no ledger intent"},
		{"no key", rows, oracle.Effect{ID: "ch_6", Request: chargeRequest("A", 1200)}, "I2: effect ch_6 has no idempotency key recorded"},
		{"shared provider key", append([]idempotency.Row{row(t, "invoice:C:v1", "pk-a", chargeRequest("C", 1))}, rows...),
			oracle.Effect{ID: "ch_7", Key: "pk-b", Request: chargeRequest("B", 3400)}, "I2: provider key pk-a belongs to two intents"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := oracle.CheckDigests(c.rows, []oracle.Effect{c.effect})
			require.Len(t, v, 1, "%v", v)
			assert.Contains(t, v[0], c.want)
		})
	}
}

func retries(n int) *int { return &n }

// I3: started == completed + BPMN-error ended + allowed incidents; everything else
// (still running, a disallowed incident, terminated, unknown to history, an unlocked
// task with retries left) is named.
func TestCheckInstances(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	hist := func(id, state string) admin.HistoricProcessInstance {
		return admin.HistoricProcessInstance{ID: id, BusinessKey: "bk-" + id, State: state}
	}
	allowed := func(in admin.Incident) bool { return strings.HasPrefix(in.IncidentMessage, "unknown-outcome:") }
	good := oracle.EngineState{
		Instances: []admin.HistoricProcessInstance{hist("p1", "COMPLETED"), hist("p2", "COMPLETED"), hist("p3", "ACTIVE"),
			hist("other", "ACTIVE")},
		ErrorEnded: map[string]bool{"p2": true},
		Incidents: []admin.Incident{{ProcessInstanceID: "p3", IncidentType: "failedExternalTask", IncidentMessage: "unknown-outcome: held"},
			{ProcessInstanceID: "other", IncidentMessage: "permanent: not ours"}},
		Tasks: []camunda7.ExternalTask{
			{ID: "t3", ProcessInstanceID: "p3", Retries: retries(0)},                                           // the incident's task
			{ID: "t9", ProcessInstanceID: "other", Retries: retries(3)},                                        // not the run's
			{ID: "t1", ProcessInstanceID: "p1", LockExpirationTime: camunda7.Time{Time: now.Add(time.Minute)}}, // locked: in progress
		},
	}
	n, v := oracle.CheckInstances([]string{"p1", "p2", "p3"}, good, allowed, now)
	assert.Empty(t, v)
	assert.Equal(t, oracle.InstanceCounts{Started: 3, Completed: 1, BPMNErrorEnded: 1, Incidents: 1}, n)

	cases := []struct {
		name    string
		started []string
		edit    func(*oracle.EngineState)
		want    []string
		lost    int
	}{
		{"disallowed incident", []string{"p1", "other"}, func(*oracle.EngineState) {},
			[]string{"I3: instance other (bk-other) holds an incident whose reason is not allowed: : permanent: not ours", "I3: started 2 != completed 1",
				"I3: instance other (): external task t9 () is unlocked with retries left"}, 1},
		{"still active", []string{"p1", "p4"}, func(s *oracle.EngineState) { s.Instances = append(s.Instances, hist("p4", "ACTIVE")) },
			[]string{"I3: instance p4 (bk-p4) is still ACTIVE without an incident", "I3: started 2 != completed 1"}, 1},
		{"terminated", []string{"p5"}, func(s *oracle.EngineState) { s.Instances = append(s.Instances, hist("p5", "EXTERNALLY_TERMINATED")) },
			[]string{"I3: instance p5 (bk-p5) ended EXTERNALLY_TERMINATED", "I3: started 1 != completed 0"}, 1},
		{"unknown to history", []string{"p6"}, func(*oracle.EngineState) {},
			[]string{"I3: instance p6 was started but the engine's history does not know it", "I3: started 1 != completed 0"}, 1},
		{"stuck task", []string{"p1", "p2", "p3"}, func(s *oracle.EngineState) {
			s.Tasks = append(s.Tasks, camunda7.ExternalTask{ID: "t7", ActivityID: "sendReceipt", ProcessInstanceID: "p3", BusinessKey: "bk-p3",
				Retries: retries(2), LockExpirationTime: camunda7.Time{Time: now.Add(-time.Second)}})
			s.Tasks = append(s.Tasks, camunda7.ExternalTask{ID: "t8", ProcessInstanceID: "p1", BusinessKey: "bk-p1"}) // never locked, retries unset
		}, []string{"I3: instance p3 (bk-p3): external task t7 (sendReceipt) is unlocked with retries left",
			"I3: instance p1 (bk-p1): external task t8 () is unlocked with retries left"}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := good
			st.Instances = append([]admin.HistoricProcessInstance(nil), good.Instances...)
			st.Tasks = append([]camunda7.ExternalTask(nil), good.Tasks...)
			c.edit(&st)
			n, v := oracle.CheckInstances(c.started, st, allowed, now)
			require.Len(t, v, len(c.want), "%v", v)
			for i, w := range c.want {
				assert.Contains(t, v[i], w)
			}
			assert.Equal(t, c.lost, n.Lost)
		})
	}
}

// I9: every occurrence of every canary is found with its source, line and offset,
// including one split across the scanner's chunks and one at the very end; a clean
// source reports nothing; a source that fails to read is an error, not a pass.
func TestScanCanaries(t *testing.T) {
	const (
		secret = "sk_test_CANARY_provider_tok_19c2"
		pii    = "canary+pii@example.invalid"
	)
	// A log bigger than one chunk with a canary straddling the 64 KiB boundary.
	var big strings.Builder
	big.WriteString("first line\n")
	for big.Len() < 64<<10-10 {
		big.WriteString(`{"level":"info","msg":"task handled"}` + "\n")
	}
	lines := strings.Count(big.String(), "\n")
	straddle := int64(big.Len())
	big.WriteString(secret + " <- here\n")
	big.WriteString("tail " + pii)

	leaks, err := oracle.ScanCanaries([]string{secret, pii},
		oracle.Source{Name: "worker-0-0.log", R: strings.NewReader(big.String())},
		oracle.Source{Name: "ledger rows", R: strings.NewReader(`{"id":1,"error_message":"declined"}` + "\n")},
		oracle.Source{Name: "engine incidents", R: iotest.OneByteReader(strings.NewReader("msg\nretryable: token " + secret + " and " + secret))},
	)
	require.NoError(t, err)
	want := []oracle.Leak{
		{Canary: secret, Source: "worker-0-0.log", Line: lines + 1, Offset: straddle},
		{Canary: pii, Source: "worker-0-0.log", Line: lines + 2, Offset: straddle + int64(len(secret)) + 14},
		{Canary: secret, Source: "engine incidents", Line: 2, Offset: 21},
		{Canary: secret, Source: "engine incidents", Line: 2, Offset: 21 + int64(len(secret)) + 5},
	}
	assert.Equal(t, want, leaks)
	assert.Equal(t, fmt.Sprintf("I9: canary %q in engine incidents, line 2 (byte 21)", secret), leaks[2].String())

	none, err := oracle.ScanCanaries([]string{secret}, oracle.Source{Name: "clean", R: strings.NewReader("sk_test_CANARY_provider_tok_19c")})
	require.NoError(t, err)
	assert.Empty(t, none)

	boom := errors.New("disk gone")
	_, err = oracle.ScanCanaries([]string{secret}, oracle.Source{Name: "broken.log", R: io.MultiReader(strings.NewReader("ok\n"), iotest.ErrReader(boom))})
	require.ErrorIs(t, err, boom)
	assert.Contains(t, err.Error(), "broken.log")
}
