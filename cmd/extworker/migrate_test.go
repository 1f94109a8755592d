package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/testenv"
)

// extworker migrate records what the database enforces (issue 23): the namespace's
// approval threshold and the ledger's role names, and warns while every login of the
// cluster may connect to the ledger's database (PUBLIC has CONNECT, as on the test
// database). A role prefix that is not a plain identifier is refused as configuration.
func TestMigrateRecordsThresholdAndWarnsAboutPublic(t *testing.T) {
	pool := testenv.DB(t)
	ns := testenv.Unique("ns")
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	t.Setenv("EXTWORKER_LEDGER_NAMESPACE", ns)
	t.Setenv("EXTWORKER_APPROVAL_THRESHOLD", "4200")
	t.Setenv("EXTWORKER_LOG_LEVEL", "warn")
	var out, errOut bytes.Buffer
	require.NoError(t, run([]string{"migrate"}, &out, &errOut), errOut.String())
	assert.Contains(t, out.String(), "warning: every login of the cluster may connect to database extworker (PUBLIC has CONNECT)")
	assert.Contains(t, out.String(), "REVOKE CONNECT ON DATABASE extworker FROM PUBLIC")
	var threshold int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT approval_threshold FROM extworker_ledger_settings WHERE namespace = $1`, ns).Scan(&threshold))
	assert.Equal(t, int64(4200), threshold)

	for _, bad := range []string{"Tenant", "tenant-b", "x; DROP TABLE y", "", "_x"} {
		t.Setenv("EXTWORKER_DATABASE_ROLE_PREFIX", bad)
		out.Reset()
		err := run([]string{"migrate"}, &out, &errOut)
		assert.ErrorContains(t, err, "EXTWORKER_DATABASE_ROLE_PREFIX", "%q", bad)
	}
}
