package fakeprovider

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// faultsOf lists the fault each request of the history got.
func faultsOf(s *Server) []string {
	var out []string
	for _, r := range s.Log() {
		out = append(out, r.Fault)
	}
	return out
}

// TestScriptOrder: the first matching rule wins, in the order key, invoice, n-th,
// random; a queue is consumed one fault per request.
func TestScriptOrder(t *testing.T) {
	s, c := startTCP(t, Options{})
	ctx := t.Context()
	s.ScriptRandom(1, Unavailable)
	s.ScriptNth(3, RateLimited)
	s.Script("INV-A", Decline, Decline)
	s.ScriptKey("k1", Stored500)

	_, _ = c.Charge(ctx, "k1", "INV-A", 1) // key rule, the invoice queue untouched
	_, _ = c.Charge(ctx, "k2", "INV-A", 1) // invoice rule
	_, _ = c.Charge(ctx, "k3", "INV-B", 1) // third charge request: nth rule
	_, _ = c.Charge(ctx, "k4", "INV-A", 1) // invoice rule, second fault
	_, _ = c.Charge(ctx, "k5", "INV-A", 1) // random
	_, _ = c.Email(ctx, "e1", "INV-C", "a@example.invalid", "receipt")
	assert.Equal(t, []string{"stored_500", "decline", "rate_limited", "decline", "unavailable", "unavailable"}, faultsOf(s))

	s.ClearFaults()
	_, err := c.Charge(ctx, "k6", "INV-A", 1)
	require.NoError(t, err, "no faults after ClearFaults")
}

// TestScriptDeterminism: the same seed and the same request order give the same faults;
// another seed gives others.
func TestScriptDeterminism(t *testing.T) {
	run := func(seed int64) []string {
		s, c := startTCP(t, Options{Seed: seed})
		s.ScriptRandom(0.3, Unavailable)
		s.ScriptRandom(0.2, RateLimited)
		s.ScriptNth(5, Decline)
		for i := range 60 {
			_, _ = c.Charge(t.Context(), fmt.Sprintf("k%d", i), fmt.Sprintf("INV-%d", i), 100)
		}
		return faultsOf(s)
	}
	a, b, other := run(42), run(42), run(43)
	assert.Equal(t, a, b)
	assert.NotEqual(t, a, other)
	assert.Equal(t, "decline", a[4])
	n := map[string]int{}
	for _, f := range a {
		n[f]++
	}
	assert.Positive(t, n["unavailable"])
	assert.Positive(t, n["rate_limited"])
	assert.Positive(t, n[""])
}

// TestFaultNames: every fault round-trips through its name, as text and as JSON.
func TestFaultNames(t *testing.T) {
	for f := LoseAnswer; f <= Delay; f++ {
		got, err := ParseFault(f.String())
		require.NoError(t, err)
		assert.Equal(t, f, got)
		b, err := json.Marshal(f)
		require.NoError(t, err)
		var back Fault
		require.NoError(t, json.Unmarshal(b, &back))
		assert.Equal(t, f, back)
	}
	assert.Equal(t, `"stored_500"`, mustJSON(t, Stored500))
	f, err := ParseFault("Accept-Then-Drop")
	assert.Error(t, err, "only our names")
	assert.Zero(t, f)
	f, err = ParseFault("drop-before-accept")
	require.NoError(t, err)
	assert.Equal(t, DropBeforeAccept, f)
	assert.Equal(t, "none", Fault(0).String())
	assert.Equal(t, "fault(99)", Fault(99).String())
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}
