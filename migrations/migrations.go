// Package migrations holds the effect ledger's schema as numbered SQL files embedded in
// the binary, and applies them with pressly/goose: in order, each in its own
// transaction, under a PostgreSQL advisory lock so that several workers starting at once
// migrate exactly once.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// VersionTable is where goose records the applied versions.
const VersionTable = "extworker_schema_migrations"

// ErrNotMigrated means the database lacks migrations this binary needs.
var ErrNotMigrated = errors.New("the ledger database is not migrated: run `extworker migrate`")

// ErrInvalidIndex means one of the ledger's indexes is INVALID, left by a concurrent
// index build that did not finish: Up fails with it until the index is dropped.
var ErrInvalidIndex = errors.New("invalid index")

// Versions lists the migrations this binary carries, in order: what Up applies to an
// empty database.
func Versions() []int64 {
	entries, _ := files.ReadDir(".")
	var out []int64
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		if v, err := strconv.ParseInt(num, 10, 64); ok && err == nil && strings.HasSuffix(e.Name(), ".sql") {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}

func provider(db *sql.DB) (*goose.Provider, error) {
	// Poll for the lock every second (the default is 5s), for up to five minutes.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, err
	}
	return goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithTableName(VersionTable), goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true))
}

// Up applies every pending migration and returns the versions it applied.
func Up(ctx context.Context, db *sql.DB) ([]int64, error) {
	p, err := provider(db)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	res, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	var applied []int64
	for _, r := range res {
		applied = append(applied, r.Source.Version)
	}
	if err := checkIndexes(ctx, db); err != nil {
		return applied, err
	}
	if _, err := Grant(ctx, db); err != nil {
		return applied, err
	}
	return applied, nil
}

// checkIndexes fails if one of the ledger's indexes is INVALID: what a failed or
// interrupted CREATE INDEX CONCURRENTLY (migrations 00007 and 00008) leaves behind, and
// what a second run of the migration, with its IF NOT EXISTS, would otherwise pass over
// while PostgreSQL never uses the index.
func checkIndexes(ctx context.Context, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, `SELECT i.relname FROM pg_index x
		JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
		WHERE NOT x.indisvalid AND t.relname LIKE 'extworker\_%' AND t.relnamespace = current_schema()::regnamespace
		ORDER BY i.relname`)
	if err != nil {
		return fmt.Errorf("migrations: check the indexes: %w", err)
	}
	defer rows.Close()
	var invalid []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return fmt.Errorf("migrations: check the indexes: %w", err)
		}
		invalid = append(invalid, name)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("migrations: check the indexes: %w", err)
	}
	if len(invalid) > 0 {
		return fmt.Errorf("migrations: %w: %s (a CREATE INDEX CONCURRENTLY failed or was interrupted); drop each with DROP INDEX CONCURRENTLY and migrate again",
			ErrInvalidIndex, strings.Join(invalid, ", "))
	}
	return nil
}

// Roles the ledger's grants are for by default, when a DBA has created them
// (docs/operators.md). A ledger database names its own (SetRoles, from
// EXTWORKER_DATABASE_ROLE_PREFIX): roles are cluster-wide, and a second ledger on the
// same cluster must not trust the first one's logins.
const (
	// WorkerRole runs the workers: it reads and writes intents, appends events, and
	// prunes through extworker_prune; it never updates or deletes an event, and never
	// takes an intent out of operator hold.
	WorkerRole = "extworker_worker"
	// OperatorRole runs `extworker effects`: it reads the ledger, and gives verdicts,
	// approvals and rejections only through the ledger's functions (extworker_resolve,
	// extworker_decide), which take the person from the session's login.
	OperatorRole = "extworker_operator"
)

// Roles are the names of a ledger database's roles.
type Roles struct {
	Worker, Operator, Console string
}

// RolesFor returns the roles named prefix_worker, prefix_operator and prefix_console.
func RolesFor(prefix string) Roles {
	return Roles{Worker: prefix + "_worker", Operator: prefix + "_operator", Console: prefix + "_console"}
}

// ReadRoles returns the role names the ledger in db uses.
func ReadRoles(ctx context.Context, db *sql.DB) (Roles, error) {
	var r Roles
	err := db.QueryRowContext(ctx, `SELECT extworker_role('worker'), extworker_role('operator'), extworker_role('console')`).
		Scan(&r.Worker, &r.Operator, &r.Console)
	if err != nil {
		return r, fmt.Errorf("migrations: read the ledger's role names: %w", err)
	}
	return r, nil
}

// SetRoles records the ledger's role names (as its owner), revokes from the roles it
// named before everything they held on the ledger's schema, and grants the new ones
// their rights (Grant).
func SetRoles(ctx context.Context, db *sql.DB, r Roles) ([]string, error) {
	old, err := ReadRoles(ctx, db)
	if err != nil {
		return nil, err
	}
	_, err = db.ExecContext(ctx, `UPDATE extworker_ledger_roles SET role_name = CASE purpose
		WHEN 'worker' THEN $1 WHEN 'operator' THEN $2 WHEN 'console' THEN $3 END`, r.Worker, r.Operator, r.Console)
	if err != nil {
		return nil, fmt.Errorf("migrations: set the ledger's role names: %w", err)
	}
	for _, role := range []string{old.Worker, old.Operator, old.Console} {
		if role == r.Worker || role == r.Operator || role == r.Console {
			continue
		}
		if _, err := db.ExecContext(ctx, `SELECT extworker_revoke_all($1)`, role); err != nil {
			return nil, fmt.Errorf("migrations: revoke the rights of %s: %w", role, err)
		}
	}
	return Grant(ctx, db)
}

// PublicCanConnect reports whether PUBLIC (every login of the cluster) may connect to
// db's database, and its name: then only the table grants stand between another
// tenant's logins and this ledger, and `extworker migrate` warns.
func PublicCanConnect(ctx context.Context, db *sql.DB) (bool, string, error) {
	var can bool
	var name string
	err := db.QueryRowContext(ctx, `SELECT datname, datacl IS NULL
			OR EXISTS (SELECT FROM aclexplode(datacl) a WHERE a.grantee = 0 AND a.privilege_type = 'CONNECT')
		FROM pg_database WHERE datname = current_database()`).Scan(&name, &can)
	if err != nil {
		return false, "", fmt.Errorf("migrations: check who may connect: %w", err)
	}
	return can, name, nil
}

// Grant gives the ledger's roles (ReadRoles), those of them that exist, their rights on
// the ledger's tables, and returns the roles it granted to. Up calls it after every run,
// so roles a DBA creates later get their grants at the next `extworker migrate`.
func Grant(ctx context.Context, db *sql.DB) ([]string, error) {
	var done string
	if err := db.QueryRowContext(ctx, `SELECT extworker_apply_grants()`).Scan(&done); err != nil {
		return nil, fmt.Errorf("migrations: grants: %w", err)
	}
	if _, err := db.ExecContext(ctx, `SELECT extworker_apply_outbox_grants()`); err != nil {
		return nil, fmt.Errorf("migrations: outbox grants: %w", err)
	}
	if _, err := db.ExecContext(ctx, `SELECT extworker_apply_inbox_grants()`); err != nil {
		return nil, fmt.Errorf("migrations: inbox grants: %w", err)
	}
	return strings.Fields(done), nil
}

// Check returns ErrNotMigrated (with the versions missing) unless every migration of this
// binary has been applied. It only reads (Applied): goose's own check creates its
// version table in the first schema of the search_path when that schema has none, and
// then finds nothing applied.
func Check(ctx context.Context, db *sql.DB) error {
	applied, err := Applied(ctx, db)
	if err != nil {
		return err
	}
	return CheckApplied(applied)
}

// CheckApplied is Check's decision on the versions Applied read: ErrNotMigrated (with
// the versions missing) unless every migration of this binary is among them.
func CheckApplied(applied []int64) error {
	need := Versions()
	for _, v := range need {
		if !slices.Contains(applied, v) {
			current := int64(0)
			if len(applied) > 0 {
				current = slices.Max(applied)
			}
			return fmt.Errorf("%w (database at version %d, this binary needs %d)", ErrNotMigrated, current, need[len(need)-1])
		}
	}
	return nil
}

// Applied returns the versions recorded as applied in the version table db's
// search_path finds (to_regclass), in order, without writing: none when there is no such
// table.
func Applied(ctx context.Context, db *sql.DB) ([]int64, error) {
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, VersionTable).Scan(&exists); err != nil {
		return nil, fmt.Errorf("migrations: look up %s: %w", VersionTable, err)
	}
	if !exists {
		return nil, nil
	}
	// A version's latest row says whether it is applied (goose's own rule).
	rows, err := db.QueryContext(ctx, `SELECT version_id FROM (SELECT DISTINCT ON (version_id) version_id, is_applied
		FROM `+VersionTable+` ORDER BY version_id, id DESC) v WHERE is_applied AND version_id > 0 ORDER BY version_id`)
	if err != nil {
		return nil, fmt.Errorf("migrations: read %s: %w", VersionTable, err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("migrations: read %s: %w", VersionTable, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("migrations: read %s: %w", VersionTable, err)
	}
	return out, nil
}
