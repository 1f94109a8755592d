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

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
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
	assert.Equal(t, migrations.Versions(), applied)
	for i, v := range migrations.Versions() {
		assert.Equal(t, int64(i+1), v, "the files this binary embeds are numbered 1, 2, 3, ... without gaps")
	}
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
	assert.Equal(t, len(migrations.Versions()), total, "each of the versions applied once in all")
	require.NoError(t, migrations.Check(ctx, open(t, url)))
}

// TestEventsAppendOnlyForEveryRole: the worker role's (and the operator role's, and the
// owner's) attempt to update or delete an intent's event fails against real PostgreSQL;
// the worker appends events and moves intents, but never takes one out of operator hold
// and never records a resolution; nor does an operator with plain SQL (roles_test.go has
// the whole matrix).
func TestEventsAppendOnlyForEveryRole(t *testing.T) {
	t.Parallel()
	url := emptySchema(t)
	ctx := testenv.Context(t, time.Minute)
	owner := open(t, url)
	_, err := migrations.Up(ctx, owner)
	require.NoError(t, err)
	granted, err := migrations.Grant(ctx, owner)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{migrations.WorkerRole, migrations.OperatorRole}, granted, "make up creates both roles")
	schema := url[strings.LastIndex(url, "=")+1:]
	as := func(login string) *pgxpool.Pool {
		testenv.DBAs(t, login) // fails in CI, skips elsewhere, when make up has not created the login
		p, err := pgxpool.New(ctx, testenv.DBURLAs(login)+"?search_path="+schema)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	worker, alice := as(testenv.WorkerLogin), as(testenv.AliceLogin)

	var id, eventID int64
	require.NoError(t, worker.QueryRow(ctx, `INSERT INTO extworker_intents (namespace, scope, intent_key, request_digest, provider_key, state)
		VALUES ('ns', 'payment.collect', 'invoice:1', 'd', 'ew_k', 'operator_hold') RETURNING id`).Scan(&id))
	require.NoError(t, worker.QueryRow(ctx, `INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, reason)
		VALUES ($1, 'unknown', 'operator_hold', 1, 'worker-1', 'held') RETURNING id`, id).Scan(&eventID))
	var dbUser string
	require.NoError(t, owner.QueryRowContext(ctx, `SELECT db_user FROM extworker_intent_events WHERE id = $1`, eventID).Scan(&dbUser))
	assert.Equal(t, testenv.WorkerLogin, dbUser, "each event names the database user that wrote it")

	refused := func(who string, exec func(string) error) {
		t.Helper()
		for _, stmt := range []string{
			fmt.Sprintf(`UPDATE extworker_intent_events SET reason = 'rewritten' WHERE id = %d`, eventID),
			fmt.Sprintf(`DELETE FROM extworker_intent_events WHERE id = %d`, eventID),
			`TRUNCATE extworker_intent_events`,
		} {
			err := exec(stmt)
			if assert.Error(t, err, "%s: %s", who, stmt) {
				assert.Regexp(t, `permission denied|append-only`, err.Error())
			}
		}
	}
	poolExec := func(p *pgxpool.Pool) func(string) error {
		return func(s string) error { _, err := p.Exec(ctx, s); return err }
	}
	refused("worker", poolExec(worker))
	refused("operator", poolExec(alice))
	refused("owner", func(s string) error { _, err := owner.ExecContext(ctx, s); return err })
	var reason string
	require.NoError(t, owner.QueryRowContext(ctx, `SELECT reason FROM extworker_intent_events WHERE id = $1`, eventID).Scan(&reason))
	assert.Equal(t, "held", reason)

	_, err = worker.Exec(ctx, `UPDATE extworker_intents SET state = 'confirmed', provider_ref = 'ch_forged' WHERE id = $1`, id)
	assert.ErrorContains(t, err, "may not settle intent", "the worker role never takes an intent out of operator hold")
	_, err = worker.Exec(ctx, `INSERT INTO extworker_resolutions (intent_id, namespace, scope, intent_key, from_state, attempt, verdict, reason, requested_by)
		VALUES ($1, 'ns', 'payment.collect', 'invoice:1', 'operator_hold', 0, 'confirmed', 'x', 'mallory')`, id)
	assert.ErrorContains(t, err, "permission denied", "the worker role records no resolution")
	_, err = worker.Exec(ctx, `DELETE FROM extworker_intents WHERE id = $1`, id)
	assert.ErrorContains(t, err, "permission denied", "the worker role deletes no intent (prune goes through extworker_prune)")

	_, err = alice.Exec(ctx, `UPDATE extworker_intents SET state = 'confirmed', provider_ref = 'ch_1' WHERE id = $1`, id)
	assert.ErrorContains(t, err, "permission denied", "an operator settles a held intent only through extworker_resolve and extworker_decide")
}

// TestOneKeyIndex: migration 00008 moves the unique constraint onto (namespace,
// intent_key, scope) and drops migration 00007's key index, on a ledger that already
// holds intents: the constraint still refuses a duplicate and still serves ON CONFLICT
// on (namespace, scope, intent_key), a lookup by key alone reads the constraint's
// index, an intent's resolution requests have an index of their own, and Down puts the
// schema back as it was.
func TestOneKeyIndex(t *testing.T) {
	t.Parallel()
	db := open(t, emptySchema(t))
	ctx := testenv.Context(t, time.Minute)
	// The files themselves (this package's directory), to migrate to a version before the last.
	p, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS("."),
		goose.WithTableName(migrations.VersionTable), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 7)
	require.NoError(t, err)
	insert := `INSERT INTO extworker_intents (namespace, scope, intent_key, request_digest, provider_key, state)
		VALUES ('ns', $1, $2, 'd', 'p', 'confirmed')`
	for _, sk := range [][2]string{{"a", "K1"}, {"b", "K1"}, {"a", "K2"}} {
		_, err := db.ExecContext(ctx, insert, sk[0], sk[1])
		require.NoError(t, err)
	}
	constraintIndex := func() string {
		var def string
		require.NoError(t, db.QueryRowContext(ctx, `SELECT pg_get_indexdef(conindid) FROM pg_constraint
			WHERE conname = 'extworker_intents_unique' AND conrelid = 'extworker_intents'::regclass`).Scan(&def))
		return def
	}
	keyIndex := func() bool {
		var n int
		require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM pg_indexes
			WHERE indexname = 'extworker_intents_key' AND schemaname = current_schema()`).Scan(&n))
		return n == 1
	}
	require.Contains(t, constraintIndex(), "(namespace, scope, intent_key)")
	require.True(t, keyIndex())

	applied, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.NotEmpty(t, applied)
	assert.Equal(t, int64(8), applied[0])
	assert.Contains(t, constraintIndex(), "UNIQUE INDEX extworker_intents_unique ON")
	assert.Contains(t, constraintIndex(), "(namespace, intent_key, scope)")
	assert.False(t, keyIndex(), "extworker_intents_key is gone")
	var invalid int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM pg_index WHERE indrelid = 'extworker_intents'::regclass AND NOT indisvalid`).Scan(&invalid))
	assert.Zero(t, invalid, "no invalid index left behind")

	_, err = db.ExecContext(ctx, insert, "b", "K1")
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe, "a duplicate intent is refused")
	assert.Equal(t, "23505", pe.Code)
	res, err := db.ExecContext(ctx, insert+` ON CONFLICT (namespace, scope, intent_key) DO NOTHING`, "a", "K2")
	require.NoError(t, err, "the constraint still serves ON CONFLICT on its columns in the ledger's order")
	n, _ := res.RowsAffected()
	assert.Zero(t, n)

	// On three rows PostgreSQL would scan the table; without that choice, the plan shows
	// the index a lookup by key alone reads.
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, `SET enable_seqscan = off`)
	require.NoError(t, err)
	explain := func(query string) string {
		rows, err := conn.QueryContext(ctx, "EXPLAIN "+query)
		require.NoError(t, err)
		defer rows.Close()
		var plan strings.Builder
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan.WriteString(line + "\n")
		}
		require.NoError(t, rows.Err())
		return plan.String()
	}
	assert.Contains(t, explain(`SELECT id FROM extworker_intents WHERE namespace = 'ns' AND intent_key = 'K1'`),
		"extworker_intents_unique", "a lookup by key alone reads the constraint's index")
	assert.Contains(t, explain(`SELECT id FROM extworker_resolutions WHERE namespace = 'ns' AND intent_key = 'K1' ORDER BY id DESC LIMIT 100`),
		"extworker_resolutions_key", "an intent's resolution requests are read from their own index")

	_, err = p.DownTo(ctx, 7)
	require.NoError(t, err)
	assert.Contains(t, constraintIndex(), "(namespace, scope, intent_key)")
	assert.True(t, keyIndex(), "Down puts extworker_intents_key back")
	var n8 int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM pg_indexes WHERE indexname = 'extworker_resolutions_key' AND schemaname = current_schema()`).Scan(&n8))
	assert.Zero(t, n8, "Down drops extworker_resolutions_key")
}

// TestUpRefusesAnInvalidIndex: an index that a failed CREATE INDEX CONCURRENTLY left
// INVALID makes Up fail, naming it, instead of passing over it (the migrations' IF NOT
// EXISTS would); once it is dropped, Up succeeds.
func TestUpRefusesAnInvalidIndex(t *testing.T) {
	t.Parallel()
	db := open(t, emptySchema(t))
	ctx := testenv.Context(t, time.Minute)
	_, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	for _, k := range []string{"K1", "K2"} {
		_, err := db.ExecContext(ctx, `INSERT INTO extworker_intents (namespace, scope, intent_key, request_digest, provider_key, state)
			VALUES ('ns', 'a', $1, 'd', 'p', 'confirmed')`, k)
		require.NoError(t, err)
	}
	// Unique on a column the two intents share: the concurrent build fails and leaves the
	// index behind, INVALID, as an interrupted one does.
	_, err = db.ExecContext(ctx, `CREATE UNIQUE INDEX CONCURRENTLY extworker_intents_left_over ON extworker_intents (scope)`)
	require.Error(t, err)

	_, err = migrations.Up(ctx, db)
	require.ErrorIs(t, err, migrations.ErrInvalidIndex)
	assert.Contains(t, err.Error(), "extworker_intents_left_over")
	assert.Contains(t, err.Error(), "DROP INDEX CONCURRENTLY")

	_, err = db.ExecContext(ctx, `DROP INDEX CONCURRENTLY extworker_intents_left_over`)
	require.NoError(t, err)
	_, err = migrations.Up(ctx, db)
	require.NoError(t, err)
}

// Check only reads: with the ledger in a schema behind an empty one on the search_path,
// it finds the ledger migrated and writes nothing (goose's own check created its version
// table in the empty schema, and the worker refused to start at "version 0"), also in a
// read-only session.
func TestCheckReadsThroughTheSearchPathWithoutWriting(t *testing.T) {
	t.Parallel()
	ledgerURL := emptySchema(t)
	ctx := testenv.Context(t, time.Minute)
	_, err := migrations.Up(ctx, open(t, ledgerURL))
	require.NoError(t, err)
	_, ledgerSchema, _ := strings.Cut(ledgerURL, "search_path=")
	_, front, _ := strings.Cut(emptySchema(t), "search_path=")

	db := open(t, testenv.DBURL()+"?search_path="+front+","+ledgerSchema+"&default_transaction_read_only=on")
	require.NoError(t, migrations.Check(ctx, db))
	applied, err := migrations.Applied(ctx, db)
	require.NoError(t, err)
	assert.Equal(t, migrations.Versions(), applied)
	var n int
	require.NoError(t, testenv.DB(t).QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, front).Scan(&n))
	assert.Zero(t, n, "nothing created in the first schema of the search_path")

	none, err := migrations.Applied(ctx, open(t, emptySchema(t)))
	require.NoError(t, err)
	assert.Empty(t, none, "no version table: nothing applied")
}
