package migrations_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

// emptySchema returns a URL whose search_path is a new, empty schema (dropped at cleanup).
func emptySchema(t *testing.T) string {
	t.Helper()
	admin := testenv.DB(t)
	schema := "m_" + testenv.Unique("t")[2:]
	ctx := testenv.Context(t, 30*time.Second)
	_, err := admin.Exec(ctx, `CREATE SCHEMA `+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`) })
	return testenv.DBURL() + "?search_path=" + schema
}

func open(t *testing.T, url string) *sql.DB {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close(); pool.Close() })
	return db
}

func TestFromEmptyTwiceInARow(t *testing.T) {
	t.Parallel()
	db := open(t, emptySchema(t))
	ctx := testenv.Context(t, time.Minute)
	require.ErrorIs(t, migrations.Check(ctx, db), migrations.ErrNotMigrated)
	applied, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	assert.Equal(t, []int64{1}, applied)
	applied, err = migrations.Up(ctx, db)
	require.NoError(t, err)
	assert.Empty(t, applied, "nothing to do the second time")
	require.NoError(t, migrations.Check(ctx, db))
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM extworker_intents`).Scan(&n))
}

// Several workers starting at once: the advisory lock lets exactly one apply each version.
func TestConcurrentMigrations(t *testing.T) {
	t.Parallel()
	url := emptySchema(t)
	ctx := testenv.Context(t, time.Minute)
	const n = 4
	var wg sync.WaitGroup
	applied := make([][]int64, n)
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		db := open(t, url) // its own pool: like another process
		wg.Add(1)
		go func() {
			defer wg.Done()
			applied[i], errs[i] = migrations.Up(ctx, db)
		}()
	}
	wg.Wait()
	total := 0
	for i := 0; i < n; i++ {
		require.NoError(t, errs[i])
		total += len(applied[i])
	}
	assert.Equal(t, 1, total, "each version applied once in all")
	require.NoError(t, migrations.Check(ctx, open(t, url)))
}
