package migrations_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
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
	assert.Equal(t, []int64{1, 2}, applied)
	applied, err = migrations.Up(ctx, db)
	require.NoError(t, err)
	assert.Empty(t, applied, "nothing to do the second time")
	require.NoError(t, migrations.Check(ctx, db))
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM extworker_intents`).Scan(&n))
}

// TestMain doubles as a migrating process: with EXTWORKER_MIGRATE_URL set, the test
// binary applies the migrations to that database, prints how many it applied, and exits.
func TestMain(m *testing.M) {
	if url := os.Getenv("EXTWORKER_MIGRATE_URL"); url != "" {
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		applied, err := migrations.Up(context.Background(), stdlib.OpenDBFromPool(pool))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(4)
		}
		fmt.Println(len(applied))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Several workers starting at once, two of them separate processes: the advisory lock
// lets exactly one apply each version.
func TestConcurrentMigrations(t *testing.T) {
	t.Parallel()
	url := emptySchema(t)
	ctx := testenv.Context(t, time.Minute)
	const procs, inproc = 2, 2
	var wg sync.WaitGroup
	counts := make(chan int, procs+inproc)
	for i := 0; i < procs; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "EXTWORKER_MIGRATE_URL="+url)
			out, err := cmd.Output()
			if err != nil {
				t.Errorf("migrating process: %v", err)
				return
			}
			n, err := strconv.Atoi(strings.TrimSpace(string(out)))
			if err != nil {
				t.Errorf("migrating process printed %q", out)
			}
			counts <- n
		}()
	}
	for i := 0; i < inproc; i++ {
		db := open(t, url) // its own pool
		wg.Add(1)
		go func() {
			defer wg.Done()
			applied, err := migrations.Up(ctx, db)
			if err != nil {
				t.Errorf("migrating goroutine: %v", err)
			}
			counts <- len(applied)
		}()
	}
	wg.Wait()
	close(counts)
	total := 0
	for n := range counts {
		total += n
	}
	assert.Equal(t, 2, total, "each of the two versions applied once in all")
	require.NoError(t, migrations.Check(ctx, open(t, url)))
}
