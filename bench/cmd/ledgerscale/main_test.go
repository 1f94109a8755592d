package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/testenv"
)

// TestSmoke runs the whole program on a ledger of 2,000 intents against the real
// PostgreSQL, so that `make bench-ledger` cannot rot between its runs: it seeds, checks
// the schema, measures every operation on both ledgers, prunes with claimers, writes its
// report and drops its two databases.
func TestSmoke(t *testing.T) {
	admin := testenv.DB(t) // fails in CI, skips elsewhere, without PostgreSQL
	ctx := testenv.Context(t, 3*time.Minute)
	seeded, empty := strings.ReplaceAll(testenv.Unique("ls_seeded"), "-", "_"), strings.ReplaceAll(testenv.Unique("ls_empty"), "-", "_")
	t.Cleanup(func() {
		for _, db := range []string{seeded, empty} {
			_, _ = admin.Exec(context.Background(), `DROP DATABASE IF EXISTS `+db+` WITH (FORCE)`)
		}
	})
	out := t.TempDir()
	err := run([]string{"-db-url", testenv.DBURL(), "-db", seeded, "-empty-db", empty,
		"-rows", "2000", "-n", "20", "-baseline", "1s", "-prune-for", "30s", "-claimers", "2", "-out", out})
	require.NoError(t, err)

	b, err := os.ReadFile(filepath.Join(out, "ledger-2k.md"))
	require.NoError(t, err)
	report := string(b)
	for _, op := range opOrder {
		assert.Contains(t, report, "| "+op+" | 20 / 20 |", "every operation measured 20 times on both ledgers")
	}
	assert.Contains(t, report, "`extworker_intents_unique` |", "the seeded ledger's indexes are listed")
	assert.Contains(t, report, "btree (namespace, intent_key, scope)")
	assert.Contains(t, report, "intents/s**", "the prune's throughput")
	after := report[strings.Index(report, "## Prune"):]
	assert.Contains(t, after, "| "+opNew+" | 20 / 20 |", "new side effects measured again after the prune")
	assert.Contains(t, report, "Index Scan using extworker_intents_unique", "the plans are the seeded ledger's")
	assert.NotContains(t, report, "EXPLAIN failed")

	var left int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname IN ($1, $2)`, seeded, empty).Scan(&left))
	assert.Zero(t, left, "both databases are dropped without -keep")
}
