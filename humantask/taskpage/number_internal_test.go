package taskpage

import (
	"encoding/json"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What a person types into a number input reaches the service as JSON writes it: an
// outside tester's "0500" (a browser sends it as typed) and "+5" were answered 503 "send
// the same form again" for ever.
func TestTypedNumbers(t *testing.T) {
	for typed, want := range map[string]string{"0500": "500", "+5": "5", "-007.50": "-7.50", "00.5": "0.5", "0": "0",
		"-0": "-0", "1e3": "1e3", "12": "12", "0x1p3": "0x1p3", "1_001": "1_001"} {
		n, ok := typedNumber(typed)
		assert.True(t, ok, typed)
		assert.Equal(t, json.Number(want), n, typed)
	}
	for _, typed := range []string{"+-5", "-+5", ".5", "Inf", "NaN", "-", "+", "e5"} {
		_, ok := typedNumber(typed)
		assert.False(t, ok, typed)
	}
	f, err := formOf(url.Values{"kind.amount": {"number"}, "var.amount": {" 0500 "}})
	require.NoError(t, err)
	assert.Equal(t, json.Number("500"), f["amount"])
	_, err = formOf(url.Values{"kind.amount": {"number"}, "var.amount": {"Inf"}})
	assert.Error(t, err)
}
