package daemon_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/testenv"
)

// A Config that names no role prefix (one built in code, not by LoadConfig) is refused
// before Migrate touches the ledger. It was taken: the ledger's roles became _worker,
// _operator and _console, and extworker_operator lost every right at once. A test
// migrating the shared ledger so took the console's rights from the other packages'
// tests until the next migrate (a clean-clone CI: "permission denied for table
// extworker_operators" in two console tests).
func TestMigrateRefusesAConfigWithoutRolePrefix(t *testing.T) {
	admin := testenv.DB(t)
	ctx := testenv.Context(t, time.Minute)
	schema := "daemon_" + strings.ReplaceAll(testenv.Unique("s")[2:], "-", "_")
	_, err := admin.Exec(ctx, `CREATE SCHEMA `+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`) })

	for _, prefix := range []string{"", "Tenant", "x; DROP TABLE y"} {
		err = daemon.Migrate(ctx, daemon.Config{DatabaseURL: testenv.DBURL() + "?search_path=" + schema, DatabaseRolePrefix: prefix}, io.Discard)
		require.Error(t, err, "%q", prefix)
		assert.Contains(t, err.Error(), "EXTWORKER_DATABASE_ROLE_PREFIX", "%q", prefix)
	}
	var tables int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&tables))
	assert.Zero(t, tables, "nothing migrated, no role renamed")
}
