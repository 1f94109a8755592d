package extworker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/migrations"
)

// Migrate is a program's `migrate` command: it applies the ledger's migrations to
// EXTWORKER_DATABASE_URL and records the roles and the approval threshold, as
// `extworker migrate` does, then applies the program's own (opts.Migrations), each set
// in its own version table. It prints what it applied to out.
func Migrate(ctx context.Context, opts Options, out io.Writer) error {
	cfg, err := daemon.LoadConfig()
	if err != nil {
		return cfg.ScrubError(err)
	}
	if _, err := opts.migrationsTable(); err != nil {
		return err
	}
	if err := daemon.Migrate(ctx, cfg, out); err != nil || opts.Migrations == nil {
		return cfg.ScrubError(err)
	}
	pcfg, err := daemon.LedgerPoolConfig(cfg)
	if err != nil {
		return cfg.ScrubError(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return cfg.ScrubError(err)
	}
	defer pool.Close()
	applied, err := migrateApp(ctx, pool, opts)
	if err != nil {
		return cfg.ScrubError(err)
	}
	table, _ := opts.migrationsTable()
	if len(applied) == 0 {
		fmt.Fprintf(out, "the program's tables are up to date (%s)\n", table)
	} else {
		fmt.Fprintf(out, "applied the program's migrations %v (%s)\n", applied, table)
	}
	return nil
}

// migrationsTable is the program's version table, or a configuration error: none named
// while Options.Migrations is set, or a name the ledger's tables use. There is no
// default: goose records versions only, so two programs sharing one default table on a
// database would each skip the other's applied versions, silently.
func (o Options) migrationsTable() (string, error) {
	if o.Migrations == nil {
		return o.MigrationsTable, nil
	}
	if o.MigrationsTable == "" {
		return "", ConfigError{Err: errors.New("Options.Migrations is set without Options.MigrationsTable: name the program's own version table (bookings_schema_migrations, say), one per program on a database")}
	}
	if name := unqualified(o.MigrationsTable); name == migrations.VersionTable || strings.HasPrefix(name, ledgerPrefix) {
		return "", ConfigError{Err: fmt.Errorf("Options.MigrationsTable %q is a name of the ledger's (its tables begin with %q, its versions are in %s): name one of the program's own", o.MigrationsTable, ledgerPrefix, migrations.VersionTable)}
	}
	return o.MigrationsTable, nil
}

// ledgerPrefix begins the name of every table the ledger's migrations create.
const ledgerPrefix = "extworker_"

// unqualified is a table name as PostgreSQL resolves it, without its schema: the part
// after the last dot, unquoted, and case-folded unless it was quoted.
func unqualified(table string) string {
	name := table[strings.LastIndex(table, ".")+1:]
	if len(name) >= 2 && strings.HasPrefix(name, `"`) && strings.HasSuffix(name, `"`) {
		return strings.ReplaceAll(name[1:len(name)-1], `""`, `"`)
	}
	return strings.ToLower(name)
}

// migrateApp applies the pending ones of opts.Migrations and returns their versions:
// with goose, as the ledger's are applied (package migrations), under a PostgreSQL
// advisory lock so that replicas starting together migrate once.
func migrateApp(ctx context.Context, pool *pgxpool.Pool, opts Options) ([]int64, error) {
	table, err := opts.migrationsTable()
	if err != nil {
		return nil, err
	}
	// Poll for the lock every second, for up to five minutes (the ledger's migrations
	// take the same lock).
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, err
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, opts.Migrations,
		goose.WithTableName(table), goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		// What the file system holds: names goose cannot read, a version twice.
		return nil, ConfigError{Err: fmt.Errorf("the program's migrations: %w", err)}
	}
	res, err := p.Up(ctx)
	if err != nil {
		return nil, migrationError(p, table, err)
	}
	applied := make([]int64, 0, len(res))
	for _, r := range res {
		applied = append(applied, r.Source.Version)
	}
	return applied, nil
}

// migrationError names the migration that failed, and makes it a configuration error
// when running it again cannot succeed: goose could not parse it, or PostgreSQL refused
// its statements for themselves (a syntax error, an undefined object, a constraint),
// rather than for a lost connection, a conflict, a cancellation or a shortage. A
// supervisor then stops restarting the worker (Main exits with ExitConfig).
func migrationError(p *goose.Provider, table string, err error) error {
	var partial *goose.PartialError
	if errors.As(err, &partial) && partial.Failed != nil {
		err = fmt.Errorf("the program's migration %s (%s): %w", path.Base(partial.Failed.Source.Path), table, partial.Err)
		var pg *pgconn.PgError
		if errors.As(partial.Err, &pg) && !transientSQLState(pg.Code) {
			return ConfigError{Err: err}
		}
		return err
	}
	// goose parses the pending migrations before it runs any; its error (v3.26) is
	// "failed to prepare migration (type:sql,version:N): ...".
	if m := prepareFailed.FindStringSubmatch(err.Error()); m != nil {
		name := "version " + m[1]
		for _, s := range p.ListSources() {
			if strconv.FormatInt(s.Version, 10) == m[1] {
				name = path.Base(s.Path)
			}
		}
		return ConfigError{Err: fmt.Errorf("the program's migration %s (%s): %w", name, table, err)}
	}
	return fmt.Errorf("the program's migrations (%s): %w", table, err)
}

var prepareFailed = regexp.MustCompile(`^failed to prepare migration \(type:\w+,version:(\d+)\)`)

// transientSQLState reports whether a PostgreSQL error class may pass on a retry: a
// connection exception (08), a transaction rollback such as a deadlock (40), insufficient
// resources (53), an object in use or a lock not available (55), operator intervention
// such as a shutdown or a cancelled statement (57), a system error (58) or an internal
// error (XX).
func transientSQLState(code string) bool {
	if len(code) < 2 {
		return true
	}
	switch code[:2] {
	case "08", "40", "53", "55", "57", "58", "XX":
		return true
	}
	return false
}
