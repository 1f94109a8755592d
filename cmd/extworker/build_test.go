package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// symbols builds the extworker binary with the build tags given and returns its symbol
// table (go tool nm).
func symbols(t *testing.T, tags ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "extworker")
	args := []string{"build", "-o", bin}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	nm, err := exec.Command("go", "tool", "nm", bin).CombinedOutput()
	require.NoError(t, err, "go tool nm: %s", nm)
	return string(nm)
}

// The production binary cannot kill itself: failpoints exist only in builds with the
// failpoints tag, which the crash tests use (the check below proves the symbol test sees
// them when they are there).
func TestProductionBinaryHasNoFailpoints(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary twice")
	}
	t.Parallel()
	const pkg = "github.com/extworker/extworker/failpoint."
	assert.NotContains(t, symbols(t), pkg, "the production build has no failpoint code")
	assert.Contains(t, symbols(t, "failpoints"), pkg+"Inject", "a failpoints build has them (the check works)")
}
