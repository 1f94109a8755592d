package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/bench/harness"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/daemon"
)

// namespace is the ledger namespace of both databases: one namespace, as the issue's
// ledger of 10 million intents has, so every query works on the whole table.
const namespace = "ledgerscale"

// server is the PostgreSQL server, reached through its maintenance database for
// creating and dropping the run's two databases. A pool rather than one connection: a
// server restart (retry.go) leaves a pool that connects again.
type server struct {
	base  string
	admin *pgxpool.Pool
	cfg   *pgx.ConnConfig
}

func newServer(base string) (*server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, withDB(base, "postgres"))
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: %w (run `make pg-up`)", daemon.RedactURL(base), err)
	}
	return &server{base: base, admin: pool, cfg: pool.Config().ConnConfig}, nil
}

func (s *server) close() { s.admin.Close() }

// exec runs an administrative statement, again after a server restart.
func (s *server) exec(ctx context.Context, sql string) error {
	var n int
	return retrying(ctx, s.admin, sql, &n, func() error {
		_, err := s.admin.Exec(ctx, sql)
		return err
	})
}

func (s *server) urlFor(db string) string { return withDB(s.base, db) }

func (s *server) version(ctx context.Context) string {
	var v string
	if err := s.admin.QueryRow(ctx, `SELECT version()`).Scan(&v); err != nil {
		return "unknown (" + err.Error() + ")"
	}
	if i := strings.Index(v, " on "); i > 0 {
		v = v[:i]
	}
	return v
}

func (s *server) exists(ctx context.Context, db string) (bool, error) {
	var ok bool
	var n int
	err := retrying(ctx, s.admin, "look for database "+db, &n, func() error {
		return s.admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, db).Scan(&ok)
	})
	return ok, err
}

// create makes db, owned by the run's user. The test environment's user may not create
// databases (it has no CREATEDB), so when that is refused and this process runs as root,
// it asks the postgres system user's createdb, as services/pg-up.sh does.
func (s *server) create(ctx context.Context, db string) error {
	err := s.exec(ctx, `CREATE DATABASE `+pgx.Identifier{db}.Sanitize())
	var pe *pgconn.PgError
	if err == nil || !errors.As(err, &pe) || pe.Code != "42501" {
		return err
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("create database %s: %w; create it with `sudo -u postgres createdb -O %s %s`", db, err, s.cfg.User, db)
	}
	// Over the local socket (peer authentication), with no terminal to ask a password on.
	cmd := exec.CommandContext(ctx, "runuser", "-u", "postgres", "--", "createdb", "--no-password",
		"-p", fmt.Sprint(s.cfg.Port), "-O", s.cfg.User, db)
	out, cerr := cmd.CombinedOutput()
	if cerr != nil {
		return fmt.Errorf("createdb %s: %w: %s", db, cerr, strings.TrimSpace(string(out)))
	}
	return nil
}

// drop removes db; its owner may. A plain DROP DATABASE stops the autovacuum workers
// in it (which WITH (FORCE) may not: they are the superuser's); WITH (FORCE) then ends
// the sessions a crashed run left.
func (s *server) drop(ctx context.Context, db string) error {
	err := s.exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{db}.Sanitize())
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "55006" { // object_in_use
		err = s.exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{db}.Sanitize()+` WITH (FORCE)`)
	}
	return err
}

func (s *server) recreate(ctx context.Context, db string) error {
	if err := s.drop(ctx, db); err != nil {
		return err
	}
	return s.create(ctx, db)
}

// ledgerDB is one of the two ledgers under test: a migrated database, a pool with
// pgxpool's defaults (what a worker gets), and a ledger with the default Config in the
// run's namespace.
type ledgerDB struct {
	name string
	pool *pgxpool.Pool
	l    *idempotency.Ledger
}

func openLedgerDB(ctx context.Context, dbURL string) (*ledgerDB, error) {
	pool, err := harness.OpenLedgerPool(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	l, err := idempotency.New(pool, idempotency.Config{Namespace: namespace})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &ledgerDB{name: pool.Config().ConnConfig.Database, pool: pool, l: l}, nil
}

func (d *ledgerDB) close() {
	if d.pool != nil {
		d.pool.Close()
		d.pool = nil
	}
}

// markPruned records that the seeded ledger is about to change, so that a later run
// with -keep seeds it again instead of measuring a pruned ledger.
func (d *ledgerDB) markPruned(ctx context.Context) error {
	var n int
	return retrying(ctx, d.pool, "mark the seeded ledger pruned", &n, func() error {
		_, err := d.pool.Exec(ctx, `UPDATE ledgerscale_seed SET pruned = true`)
		return err
	})
}

// size is the database's size on disk, and the two ledger tables' with their indexes.
func (d *ledgerDB) size(ctx context.Context) (db, intents, events, indexes int64) {
	_ = d.pool.QueryRow(ctx, `SELECT pg_database_size(current_database()),
		pg_table_size('extworker_intents'), pg_table_size('extworker_intent_events'),
		pg_indexes_size('extworker_intents') + pg_indexes_size('extworker_intent_events')`).Scan(&db, &intents, &events, &indexes)
	return
}

// scaleIndexes are the indexes a ledger at scale has since migrations 00007 and 00008:
// both ledgers must have them, valid, or the run measures a schema the product no
// longer has. extworker_intents_unique must be on (namespace, intent_key, scope)
// (migration 00008, which also dropped 00007's extworker_intents_key).
var scaleIndexes = []string{"extworker_intents_prunable", "extworker_intents_unique"}

// indexInfo is one index of the two ledger tables, as pg_index has it.
type indexInfo struct {
	Table, Name, Def string
	Valid, Ready     bool
	Bytes            int64
}

// indexes lists the indexes of the two ledger tables.
func (d *ledgerDB) indexes(ctx context.Context) ([]indexInfo, error) {
	var out []indexInfo
	var n int
	err := retrying(ctx, d.pool, "list the ledger's indexes", &n, func() error {
		rows, err := d.pool.Query(ctx, `SELECT t.relname, i.relname, pg_get_indexdef(i.oid), x.indisvalid, x.indisready, pg_relation_size(i.oid)
			FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
			WHERE t.relname IN ('extworker_intents', 'extworker_intent_events') AND t.relnamespace = 'public'::regnamespace
			ORDER BY t.relname, i.relname`)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (indexInfo, error) {
			var ix indexInfo
			err := r.Scan(&ix.Table, &ix.Name, &ix.Def, &ix.Valid, &ix.Ready, &ix.Bytes)
			return ix, err
		})
		return err
	})
	return out, err
}

// checkIndexes fails unless every index of the ledger tables is valid and ready and the
// schema is migration 00008's (scaleIndexes).
func (d *ledgerDB) checkIndexes(ctx context.Context) ([]indexInfo, error) {
	idx, err := d.indexes(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.name, err)
	}
	have := map[string]bool{}
	for _, ix := range idx {
		if !ix.Valid || !ix.Ready {
			return nil, fmt.Errorf("%s: index %s is not valid (indisvalid %v, indisready %v): %s", d.name, ix.Name, ix.Valid, ix.Ready, ix.Def)
		}
		have[ix.Name] = true
	}
	for _, name := range scaleIndexes {
		if !have[name] {
			return nil, fmt.Errorf("%s: index %s is missing", d.name, name)
		}
	}
	for _, ix := range idx {
		if ix.Name == "extworker_intents_unique" && !strings.Contains(ix.Def, "(namespace, intent_key, scope)") ||
			ix.Name == "extworker_intents_key" {
			return nil, fmt.Errorf("%s: not the schema of migration 00008: %s", d.name, ix.Def)
		}
	}
	return idx, nil
}
