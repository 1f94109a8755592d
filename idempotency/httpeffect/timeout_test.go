package httpeffect_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/idempotency/httpeffect"
)

// The effect carries the spec's timeout (the default when none is given), which the
// ledger checks its lease against.
func TestEffectCarriesTheTimeout(t *testing.T) {
	eff, err := httpeffect.New(httpeffect.Spec{URL: "https://pay.example/charges"})
	require.NoError(t, err)
	assert.Equal(t, httpeffect.DefaultTimeout, eff.Timeout)
	eff, err = httpeffect.New(httpeffect.Spec{URL: "https://pay.example/charges", Timeout: 3 * time.Second})
	require.NoError(t, err)
	assert.Equal(t, 3*time.Second, eff.Timeout)
}
