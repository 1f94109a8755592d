package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/testenv"
)

// symbols builds the package in dir with the build tags given and returns its symbol
// table (go tool nm).
func symbols(t *testing.T, dir string, tags ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "bin")
	args := []string{"build", "-o", bin}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	out, err := exec.Command("go", append(args, dir)...).CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	nm, err := exec.Command("go", "tool", "nm", bin).CombinedOutput()
	require.NoError(t, err, "go tool nm: %s", nm)
	return string(nm)
}

// The production binary cannot kill itself, and charges no fake provider: failpoints
// exist only in builds with the failpoints tag (which the crash tests' workers use; the
// last check proves the symbol test sees them when they are there), the fake provider
// and the test environment only in the demo and the tests.
func TestProductionBinaryHasNoFailpointsOrFakes(t *testing.T) {
	if testing.Short() && !testenv.InCI() { // in CI (CI=true) it always runs
		t.Skip("builds two binaries")
	}
	t.Parallel()
	const mod = "github.com/extworker/extworker/"
	prod := symbols(t, ".")
	for _, pkg := range []string{"internal/failpoint.", "examples/invoice/fakeprovider.", "internal/testenv."} {
		assert.False(t, strings.Contains(prod, mod+pkg), "the production binary contains %s", mod+pkg)
	}
	worker := symbols(t, "../../examples/invoice", "failpoints")
	assert.True(t, strings.Contains(worker, mod+"internal/failpoint.Inject"), "a failpoints build of a worker has them (the check works)")
}

// buildCLI builds the extworker binary once per test, as it ships (no build tags).
func buildCLI(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "extworker")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}
