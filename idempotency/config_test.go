package idempotency_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/extworker/extworker/idempotency"
)

// TestConfigValidate: zero values mean the defaults, so the zero Config is valid; a
// namespace PostgreSQL cannot store or index with an intent is refused up front, rather
// than failing every Do.
func TestConfigValidate(t *testing.T) {
	assert.NoError(t, idempotency.Config{}.Validate(), "the zero Config takes the defaults")
	assert.NoError(t, idempotency.Config{Namespace: strings.Repeat("n", 200)}.Validate())
	for name, ns := range map[string]string{
		"NUL":           "tenant\x00a",
		"invalid UTF-8": "tenant-f\xfcr",
		"too long":      strings.Repeat("n", 201),
	} {
		err := idempotency.Config{Namespace: ns}.Validate()
		if assert.Error(t, err, name) {
			assert.Contains(t, err.Error(), "Namespace", name)
		}
	}
	assert.ErrorContains(t, idempotency.Config{Lease: -1}.Validate(), "Lease", "a negative value is no default")
}
