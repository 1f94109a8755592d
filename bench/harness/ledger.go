package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/migrations"
)

// ledgerDB is scenario 4's ledger database, seen from the driver: migrated before the
// first trial (so a missing database fails the run at once, not inside a worker), and
// rid of every trial's namespace at the end.
type ledgerDB struct {
	pool       *pgxpool.Pool
	namespaces []string
}

func openLedgerDB(ctx context.Context, dbURL string) (*ledgerDB, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pool, err := OpenLedgerPool(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("ledger database: %w", err)
	}
	return &ledgerDB{pool: pool}, nil
}

// OpenLedgerPool opens a pool with pgxpool's defaults (what a worker gets) on the ledger
// database at dbURL, checks that it answers and applies the migrations; errors name the
// URL without its password.
func OpenLedgerPool(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%s: %w (run `make up`)", daemon.RedactURL(dbURL), err)
	}
	db := stdlib.OpenDBFromPool(pool)
	_, err = migrations.Up(ctx, db)
	db.Close()
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("migrate %s: %w", daemon.RedactURL(dbURL), err)
	}
	return pool, nil
}

// namespace returns a ledger namespace no earlier trial used.
func (l *ledgerDB) namespace(run int) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	ns := "bench-s4-run" + strconv.Itoa(run) + "-" + hex.EncodeToString(b)
	l.namespaces = append(l.namespaces, ns)
	return ns
}

// close deletes the intents (and, by cascade, the events) the trials wrote.
func (l *ledgerDB) close(ctx context.Context, progress io.Writer) {
	defer l.pool.Close()
	if len(l.namespaces) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tag, err := l.pool.Exec(ctx, `DELETE FROM extworker_intents WHERE namespace = ANY($1)`, l.namespaces)
	if err != nil {
		fmt.Fprintf(progress, "bench: cleanup: ledger namespaces %v: %v\n", l.namespaces, err)
		return
	}
	fmt.Fprintf(progress, "bench: deleted %d ledger intents of %d namespaces\n", tag.RowsAffected(), len(l.namespaces))
}

// ledgerThroughput is one scenario-4 trial: scenario 1's measurement, the worker given
// the ledger when ledger is set; it fails unless the worker confirmed one new intent per
// task.
func (h *harness) ledgerThroughput(ctx context.Context, v Variant, run int, ledger bool, extra []string) (Trial, error) {
	if ledger {
		extra = append([]string{"-ledger-db", h.o.LedgerDBURL, "-ledger-namespace", h.ledger.namespace(run)}, extra...)
	}
	var ledgerLine []string
	t, err := h.throughputThen(ctx, 4, v, run, h.o.N4, "noop", extra, func(p *proc) { ledgerLine = p.final("LEDGER") })
	if err != nil || !ledger {
		return t, err
	}
	if len(ledgerLine) != 4 {
		return t, fmt.Errorf("the worker printed no LEDGER line")
	}
	n, _ := strconv.ParseInt(ledgerLine[1], 10, 64)
	if n != int64(t.N) {
		return t, fmt.Errorf("the ledger confirmed %d new intents for %d tasks (LEDGER new replayed failed: %v)", n, t.N, ledgerLine[1:])
	}
	t.Intents = n
	return t, nil
}
