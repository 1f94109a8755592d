package extworker

import (
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/migrations"
)

// DefaultMigrationsTable records which of a program's own migrations
// (Options.Migrations) are applied, unless Options.MigrationsTable names another table.
const DefaultMigrationsTable = "app_schema_migrations"

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

// migrationsTable is the program's version table, or a configuration error when it
// would be the ledger's.
func (o Options) migrationsTable() (string, error) {
	switch o.MigrationsTable {
	case "":
		return DefaultMigrationsTable, nil
	case migrations.VersionTable:
		return "", ConfigError{Err: fmt.Errorf("Options.MigrationsTable %q is the ledger's version table: name one of the program's own", o.MigrationsTable)}
	}
	return o.MigrationsTable, nil
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
		return nil, fmt.Errorf("the program's migrations: %w", err)
	}
	res, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("the program's migrations (%s): %w", table, err)
	}
	applied := make([]int64, 0, len(res))
	for _, r := range res {
		applied = append(applied, r.Source.Version)
	}
	return applied, nil
}
