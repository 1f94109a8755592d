package migrations_test

import (
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

// TestInboxStatesLowerCase: migration 00011 rewrites the inbox rows a database already
// holds from the upper-case states to the lower-case ones (UNKNOWN_OUTCOME to unknown),
// with the state's CHECK (the old names refused, the new ones taken), its default and
// the settled rows' index predicate; Down puts every row and the schema back.
func TestInboxStatesLowerCase(t *testing.T) {
	t.Parallel()
	db := open(t, emptySchema(t))
	ctx := testenv.Context(t, time.Minute)
	p, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS("."),
		goose.WithTableName(migrations.VersionTable), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 10)
	require.NoError(t, err)
	renamed := map[string]string{
		"RECEIVED": "received", "PROCESSING": "processing", "PROCESSED": "processed", "FAILED_RETRYABLE": "failed_retryable",
		"FAILED_FINAL": "failed_final", "IGNORED_DUPLICATE": "ignored_duplicate", "UNKNOWN_OUTCOME": "unknown",
	}
	for old := range renamed {
		_, err := db.ExecContext(ctx, `INSERT INTO extworker_inbox (source, message_id, body_digest, state) VALUES ('s', $1, 'd', $1)`, old)
		require.NoError(t, err)
	}
	_, err = db.ExecContext(ctx, `INSERT INTO extworker_inbox (source, message_id, body_digest) VALUES ('s', 'default', 'd')`)
	require.NoError(t, err)
	states := func() map[string]string {
		rows, err := db.QueryContext(ctx, `SELECT message_id, state FROM extworker_inbox`)
		require.NoError(t, err)
		defer rows.Close()
		got := map[string]string{}
		for rows.Next() {
			var id, st string
			require.NoError(t, rows.Scan(&id, &st))
			got[id] = st
		}
		require.NoError(t, rows.Err())
		return got
	}
	settledIndex := func() string {
		var def string
		require.NoError(t, db.QueryRowContext(ctx, `SELECT indexdef FROM pg_indexes WHERE indexname = 'extworker_inbox_settled'
			AND schemaname = current_schema()`).Scan(&def))
		return def
	}
	insertState := func(id, st string) error {
		_, err := db.ExecContext(ctx, `INSERT INTO extworker_inbox (source, message_id, body_digest, state) VALUES ('t', $1, 'd', $2)`, id, st)
		return err
	}
	checkViolation := func(t *testing.T, err error) {
		t.Helper()
		var pe *pgconn.PgError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, "23514", pe.Code, "a check violation")
	}

	applied, err := p.UpTo(ctx, 11)
	require.NoError(t, err)
	require.Len(t, applied, 1)
	want := map[string]string{"default": "received"}
	for old, low := range renamed {
		want[old] = low
	}
	assert.Equal(t, want, states(), "every row in its lower-case state")
	assert.Contains(t, settledIndex(), "'processed'::text, 'ignored_duplicate'::text")
	checkViolation(t, insertState("upper", "PROCESSED"))
	require.NoError(t, insertState("lower", "unknown"))
	_, err = db.ExecContext(ctx, `INSERT INTO extworker_inbox (source, message_id, body_digest) VALUES ('t', 'default', 'd')`)
	require.NoError(t, err)
	var def string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT state FROM extworker_inbox WHERE source = 't' AND message_id = 'default'`).Scan(&def))
	assert.Equal(t, "received", def, "the default is lower-case")
	_, err = db.ExecContext(ctx, `DELETE FROM extworker_inbox WHERE source = 't'`)
	require.NoError(t, err)

	_, err = p.DownTo(ctx, 10)
	require.NoError(t, err)
	want = map[string]string{"default": "RECEIVED"}
	for old := range renamed {
		want[old] = old
	}
	assert.Equal(t, want, states(), "Down puts the upper-case states back")
	assert.Contains(t, settledIndex(), "'PROCESSED'::text, 'IGNORED_DUPLICATE'::text")
	checkViolation(t, insertState("lower", "processed"))
}
