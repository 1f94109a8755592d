package testenv

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/extworker/extworker/camunda7"
)

// EngineVersions are the Camunda 7 releases the conformance suite and a short soak run
// against in CI (ENGINE=camunda7-7.20, camunda7-7.22, camunda7 for 7.24). Differences
// between them are pinned by the tests that meet them, with EngineAtLeast.
var EngineVersions = []string{"7.20.0", "7.22.0", "7.24.0"}

// EngineAtLeast reports whether the engine c talks to is Camunda 7 release want
// ("7.21") or newer. The forks (Operaton, CIB seven) number their releases anew (1.x,
// 2.x) from Camunda 7.23 and 7.24's code, so any version below 7 counts as newer than
// every Camunda 7 release this asks about.
func EngineAtLeast(t testing.TB, c *camunda7.Client, want string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := c.Version(ctx)
	if err != nil {
		t.Fatalf("engine version: %v", err)
	}
	have := versionParts(v)
	if len(have) > 0 && have[0] < 7 {
		return true
	}
	w := versionParts(want)
	for i := range w {
		h := 0
		if i < len(have) {
			h = have[i]
		}
		if h != w[i] {
			return h > w[i]
		}
	}
	return true
}

// versionParts reads "7.24.0" (or "7.24.0-ee", "2.1.3") as its numbers.
func versionParts(v string) []int {
	v, _, _ = strings.Cut(v, "-")
	var out []int
	for _, p := range strings.Split(v, ".") {
		n, err := strconv.Atoi(p)
		if err != nil {
			break
		}
		out = append(out, n)
	}
	return out
}
