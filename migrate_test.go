package extworker_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

func migration(sql string) *fstest.MapFile {
	return &fstest.MapFile{Data: []byte("-- +goose Up\n" + sql + "\n")}
}

// A program's own migrations run beside the ledger's, each set in its own version table:
// Migrate applies the ledger's, then the program's; New applies the program's pending
// ones at start; App.Pool reaches the program's tables; the ledger's version table is
// refused as the program's.
func TestProgramMigrations(t *testing.T) {
	testenv.Engine(t)
	admin := testenv.DB(t)
	ctx := testenv.Context(t, 2*time.Minute)
	schema := "app_" + testenv.Unique("s")[2:]
	_, err := admin.Exec(ctx, `CREATE SCHEMA `+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`) })
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL()+"?search_path="+schema)
	t.Setenv("EXTWORKER_HTTP_ADDR", "off")
	quiet := slog.New(slog.DiscardHandler)

	fsys := fstest.MapFS{"00001_parcels.sql": migration(`CREATE TABLE parcels (id text PRIMARY KEY);`)}
	const table = "parcels_schema_migrations"
	var out bytes.Buffer
	require.NoError(t, extworker.Migrate(ctx, extworker.Options{Migrations: fsys, MigrationsTable: table}, &out))
	assert.Contains(t, out.String(), fmt.Sprintf("applied migrations %v", migrations.Versions()))
	assert.Contains(t, out.String(), "applied the program's migrations [1] (parcels_schema_migrations)")
	out.Reset()
	require.NoError(t, extworker.Migrate(ctx, extworker.Options{Migrations: fsys, MigrationsTable: table}, &out))
	assert.Contains(t, out.String(), "the program's tables are up to date")

	// A second migration, applied by New at start; the program writes its table through
	// the App's pool.
	fsys["00002_parcel_weight.sql"] = migration(`ALTER TABLE parcels ADD COLUMN grams integer;`)
	app, err := extworker.New(ctx, extworker.Options{Migrations: fsys, MigrationsTable: table, Logger: quiet})
	require.NoError(t, err)
	_, err = app.Pool().Exec(ctx, `INSERT INTO parcels (id, grams) VALUES ('P-1', 1200)`)
	require.NoError(t, err)
	app.Close()
	var ledger, program int64
	require.NoError(t, admin.QueryRow(ctx, `SELECT (SELECT max(version_id) FROM `+schema+`.extworker_schema_migrations),
		(SELECT max(version_id) FROM `+schema+`.parcels_schema_migrations)`).Scan(&ledger, &program))
	assert.Equal(t, migrations.Versions()[len(migrations.Versions())-1], ledger, "the ledger's versions in the ledger's table")
	assert.Equal(t, int64(2), program, "the program's in its own")

	// A name of the ledger's, however spelled, and no name at all, are refused before
	// anything is applied: the ledger's version table keeps the ledger's versions only.
	for _, name := range []string{
		migrations.VersionTable,
		schema + "." + migrations.VersionTable,
		"public." + migrations.VersionTable,
		`"` + schema + `"."` + migrations.VersionTable + `"`,
		strings.ToUpper(migrations.VersionTable),
		"extworker_app_migrations",
		"",
	} {
		_, err = extworker.New(ctx, extworker.Options{Migrations: fstest.MapFS{"00099_x.sql": migration(`CREATE TABLE x (id int);`)}, MigrationsTable: name, Logger: quiet})
		require.Error(t, err, name)
		assert.True(t, extworker.IsConfigError(err), "%q: %v", name, err)
		assert.Contains(t, err.Error(), "Options.MigrationsTable", name)
	}
	require.NoError(t, admin.QueryRow(ctx, `SELECT max(version_id) FROM `+schema+`.extworker_schema_migrations`).Scan(&ledger))
	assert.Equal(t, migrations.Versions()[len(migrations.Versions())-1], ledger, "nothing of the program's recorded in the ledger's table")
	var xs int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'x'`, schema).Scan(&xs))
	assert.Zero(t, xs, "the refused program's migration was not applied")

	// A migration that cannot succeed however often it is retried is a configuration
	// error (Main exits with ExitConfig, a supervisor stops restarting) naming the
	// migration; the ones before it stay applied.
	for name, bad := range map[string]*fstest.MapFile{
		"syntax":    migration(`CREATE TABLE broken (id text PRIMARY KEY;`),
		"undefined": migration(`ALTER TABLE no_such_table ADD COLUMN y int;`),
		"no up":     {Data: []byte("CREATE TABLE noup (id int);\n")},
	} {
		t.Run(name, func(t *testing.T) {
			bad := fstest.MapFS{"00001_parcels.sql": fsys["00001_parcels.sql"], "00002_parcel_weight.sql": fsys["00002_parcel_weight.sql"], "00003_broken.sql": bad}
			_, err := extworker.New(ctx, extworker.Options{Migrations: bad, MigrationsTable: table, Logger: quiet})
			require.Error(t, err)
			assert.True(t, extworker.IsConfigError(err), "%v", err)
			assert.Contains(t, err.Error(), "00003_broken.sql")
			require.NoError(t, admin.QueryRow(ctx, `SELECT max(version_id) FROM `+schema+`.parcels_schema_migrations`).Scan(&program))
			assert.Equal(t, int64(2), program)
		})
	}
}
