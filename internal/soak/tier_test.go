package soak

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The demo's own settings the binary does not report come from the workers' environment
// (the short tier sets the provider timeout), else from the demo's defaults; what the
// binary reports wins.
func TestWithDemoSettings(t *testing.T) {
	for _, c := range []struct {
		name     string
		reported map[string]string
		env      []string
		expect   map[string]string
	}{
		{"defaults tier: the demo's defaults", map[string]string{}, workerEnv(true),
			map[string]string{"EXTWORKER_PROVIDER_TIMEOUT": "10s", "EXTWORKER_PROVIDER_SEARCH_LAG": "1m"}},
		{"short tier: its override", map[string]string{}, workerEnv(false),
			map[string]string{"EXTWORKER_PROVIDER_TIMEOUT": "2500ms", "EXTWORKER_PROVIDER_SEARCH_LAG": "1m"}},
		{"the last setting wins", map[string]string{}, []string{"EXTWORKER_PROVIDER_SEARCH_LAG=5s", "EXTWORKER_PROVIDER_SEARCH_LAG=7s"},
			map[string]string{"EXTWORKER_PROVIDER_TIMEOUT": "10s", "EXTWORKER_PROVIDER_SEARCH_LAG": "7s"}},
		{"reported by the binary", map[string]string{"EXTWORKER_PROVIDER_TIMEOUT": "4s", "EXTWORKER_PROVIDER_SEARCH_LAG": "0s"}, workerEnv(false),
			map[string]string{"EXTWORKER_PROVIDER_TIMEOUT": "4s", "EXTWORKER_PROVIDER_SEARCH_LAG": "0s"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			withDemoSettings(c.reported, c.env)
			assert.Equal(t, c.expect, c.reported)
		})
	}
}

// The harness's copy of the demo's defaults is the demo's: the default tags of
// providerConfig in examples/invoice/provider.go.
func TestDemoDefaultsAreTheDemos(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "../../examples/invoice/provider.go", nil, 0)
	require.NoError(t, err)
	found := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "providerConfig" {
			return true
		}
		for _, field := range ts.Type.(*ast.StructType).Fields.List {
			if field.Tag == nil {
				continue
			}
			tag, err := strconv.Unquote(field.Tag.Value)
			require.NoError(t, err)
			st := reflect.StructTag(tag)
			if _, ours := demoDefaults[st.Get("envconfig")]; ours {
				found[st.Get("envconfig")] = st.Get("default")
			}
		}
		return false
	})
	assert.Equal(t, demoDefaults, found)
}

// A worker binary whose `config -json` reports the framework's settings only (the demo's
// provider settings are its own) still gives the harness its timing: the short tier's
// provider timeout from the workers' environment, the search lag at the demo's default.
func TestReadSettingsWithoutTheDemosOwn(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "worker")
	script := `#!/bin/sh
[ "$1 $2" = "config -json" ] || exit 2
cat <<'JSON'
{"EXTWORKER_LOCK_DURATION": "3s", "EXTWORKER_LONG_POLL": "1s", "EXTWORKER_LEDGER_LEASE": "3s",
 "EXTWORKER_ENGINE_TIMEOUT": "30s", "EXTWORKER_SHUTDOWN_GRACE": "5s", "EXTWORKER_SHUTDOWN_TIMEOUT": "20s",
 "EXTWORKER_MAX_CONCURRENCY": "8"}
JSON
`
	require.NoError(t, os.WriteFile(bin, []byte(script), 0o755))
	s, err := readSettings(context.Background(), bin, workerEnv(false), false)
	require.NoError(t, err)
	assert.Equal(t, Settings{LockDuration: 3 * time.Second, LongPoll: time.Second, LedgerLease: 3 * time.Second,
		ProviderTimeout: 2500 * time.Millisecond, EngineTimeout: 30 * time.Second, SearchLag: time.Minute,
		ShutdownGrace: 5 * time.Second, ShutdownTimeout: 20 * time.Second, MaxConcurrency: 8, Overrides: shortOverrides}, s)
}
