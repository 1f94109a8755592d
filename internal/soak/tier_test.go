package soak

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The harness's timing is what the worker binary's `config -json` reports: the
// framework's settings and the demo's own provider settings beside them.
func TestReadSettings(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "worker")
	script := `#!/bin/sh
[ "$1 $2" = "config -json" ] || exit 2
cat <<'JSON'
{"EXTWORKER_LOCK_DURATION": "3s", "EXTWORKER_LONG_POLL": "1s", "EXTWORKER_LEDGER_LEASE": "3s",
 "EXTWORKER_ENGINE_TIMEOUT": "30s", "EXTWORKER_SHUTDOWN_GRACE": "5s", "EXTWORKER_SHUTDOWN_TIMEOUT": "20s",
 "EXTWORKER_MAX_CONCURRENCY": "8", "EXTWORKER_PROVIDER_TIMEOUT": "2500ms", "EXTWORKER_PROVIDER_SEARCH_LAG": "1m0s"}
JSON
`
	require.NoError(t, os.WriteFile(bin, []byte(script), 0o755))
	s, err := readSettings(context.Background(), bin, workerEnv(false), false)
	require.NoError(t, err)
	assert.Equal(t, Settings{LockDuration: 3 * time.Second, LongPoll: time.Second, LedgerLease: 3 * time.Second,
		ProviderTimeout: 2500 * time.Millisecond, EngineTimeout: 30 * time.Second, SearchLag: time.Minute,
		ShutdownGrace: 5 * time.Second, ShutdownTimeout: 20 * time.Second, MaxConcurrency: 8, Overrides: shortOverrides}, s)
}
