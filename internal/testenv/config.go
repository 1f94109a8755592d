package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ClearConfigEnv unsets every EXTWORKER_* variable (the configuration and the _FILE
// variants of its secrets) but the tests' own EXTWORKER_TEST_*, and every OTEL_* variable
// (traces), so that the environment the tests run in does not leak into them; t.Setenv
// restores each at cleanup.
func ClearConfigEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "EXTWORKER_") && !strings.HasPrefix(name, "EXTWORKER_TEST_") || strings.HasPrefix(name, "OTEL_") {
			t.Setenv(name, "")
			if err := os.Unsetenv(name); err != nil {
				t.Fatal(err)
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
