package fakeprovider

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHistory: every /v1 request is in the log, in order, with what happened to it,
// and WriteHistory writes the same entries as JSON lines.
func TestHistory(t *testing.T) {
	s, c := startTCP(t, Options{DeclineAboveCents: 1000})
	ctx := t.Context()
	ch, err := c.Charge(ctx, "k1", "INV-1", 500)
	require.NoError(t, err)
	_, _ = c.Charge(ctx, "k1", "INV-1", 500)
	_, _ = c.Charge(ctx, "k1", "INV-1", 600)
	_, _ = c.Charge(ctx, "k2", "INV-2", 5000)
	_, _ = c.Lookup(ctx, "k1")
	_, _ = c.Lookup(ctx, "nope")
	_, _ = c.Search(ctx, "INV-1")
	send(t, c, http.MethodGet, "/v1/refunds", "", "")

	type row struct{ method, path, key, invoice, outcome, effect, fate string }
	want := []row{
		{"POST", "/v1/charges", "k1", "INV-1", outCreated, ch.ID, fateAnswered},
		{"POST", "/v1/charges", "k1", "INV-1", outReplayed, ch.ID, fateAnswered},
		{"POST", "/v1/charges", "k1", "INV-1", outMismatch, "", fateAnswered},
		{"POST", "/v1/charges", "k2", "INV-2", outDeclined, "", fateAnswered},
		{"GET", "/v1/charges", "k1", "", outFound, ch.ID, fateAnswered},
		{"GET", "/v1/charges", "nope", "", outNotFound, "", fateAnswered},
		{"GET", "/v1/charges/search", "", "INV-1", outSearch, "", fateAnswered},
		{"GET", "/v1/refunds", "", "", outBadRequest, "", fateAnswered},
	}
	log := s.Log()
	require.Len(t, log, len(want))
	for i, r := range log {
		assert.EqualValues(t, i+1, r.Seq)
		assert.False(t, r.At.IsZero())
		assert.Empty(t, r.Fault)
		assert.Equal(t, want[i], row{r.Method, r.Path, r.Key, r.Invoice, r.Outcome, r.EffectID, r.Fate}, "request %d", i+1)
	}
	assert.Equal(t, ch.Digest, log[0].Digest)
	assert.Equal(t, ch.Digest, log[1].Digest)
	assert.NotEqual(t, ch.Digest, log[2].Digest)
	assert.False(t, ch.At.Before(log[0].At), "the charge is made after the request is read")

	var buf bytes.Buffer
	require.NoError(t, s.WriteHistory(&buf))
	assert.Equal(t, 1, strings.Count(buf.String(), `"outcome":"mismatch"`))
	var lines []Request
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		var r Request
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), sc.Text())
		lines = append(lines, r)
	}
	assert.Equal(t, log, lines)
}
