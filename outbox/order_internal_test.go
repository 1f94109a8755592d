package outbox

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The lock of a key is the same in every process (a fixed hash, not a per-process seed),
// and differs between keys and between namespaces, however the two are split.
func TestKeyLockID(t *testing.T) {
	cases := []struct {
		name               string
		ns1, key1, ns2, k2 string
		same               bool
	}{
		{"the same key", "default", "INV-1", "default", "INV-1", true},
		{"another key", "default", "INV-1", "default", "INV-2", false},
		{"another namespace", "default", "INV-1", "billing", "INV-1", false},
		{"the same bytes split otherwise", "ab", "c", "a", "bc", false},
		{"empty namespace", "", "INV-1", "INV-1", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.same, keyLockID(tc.ns1, tc.key1) == keyLockID(tc.ns2, tc.k2))
		})
	}
	// Pinned: processes of different builds must agree on it while they run side by side.
	assert.Equal(t, int64(4938090355688186074), keyLockID("default", "INV-1"))
}
