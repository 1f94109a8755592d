package testenv

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/extworker/extworker/internal/daemon"
)

// ClearConfigEnv unsets every EXTWORKER_* variable of the configuration (and its _FILE
// variant) for the test, so that the environment the tests run in does not leak into
// them; t.Setenv restores each at cleanup.
func ClearConfigEnv(t *testing.T) {
	t.Helper()
	var c daemon.Config
	var o daemon.OpsConfig
	for _, cv := range append(daemon.SpecVars(&c), daemon.SpecVars(&o)...) {
		for _, name := range []string{cv.Name, cv.Name + "_FILE"} {
			if _, ok := os.LookupEnv(name); ok {
				t.Setenv(name, "")
				if err := os.Unsetenv(name); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// WriteFile writes content to a file name in the test's temporary directory (a secret
// for a _FILE variable, say) and returns its path.
func WriteFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
