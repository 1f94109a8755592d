// Command ledgerscale measures the effect ledger at scale (issue 16, part 2): it seeds a
// ledger of -rows intents (10 million by default) with COPY, then measures what a worker
// and an operator run against it (a new side effect, a replay, `effects list` of
// unknowns, `effects show` with and without a scope) beside the same operations on an
// empty ledger, in the same process with the same settings, and finally prunes millions
// of old intents while concurrent workers keep claiming new ones. It writes a Markdown
// table to -out (bench/results/ledger-10m.md for 10 million rows). See docs/benchmarks.md.
//
//	go run ./bench/cmd/ledgerscale                                   # 10 M rows, into bench/results
//	go run ./bench/cmd/ledgerscale -rows 100000 -n 200 -out bench/.smoke  # a smoke run
//
// The two databases are its own (-db, -empty-db), created when missing and dropped at
// the end unless -keep; a seeded database kept with -keep is reused by the next run with
// the same -rows (until a prune has changed it: -prune=false measures without pruning).
package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// options are the run's settings, as the flags give them.
type options struct {
	baseURL    string
	db         string
	emptyDB    string
	rows       int64
	n          int
	opBudget   time.Duration
	retention  time.Duration
	pruneFor   time.Duration
	claimers   int
	baseline   time.Duration
	out        string
	keep       bool
	reseed     bool
	note       string
	eventsEach int
	doPrune    bool
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ledgerscale:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var o options
	fs := flag.NewFlagSet("ledgerscale", flag.ContinueOnError)
	fs.StringVar(&o.baseURL, "db-url", "postgres://extworker:extworker@127.0.0.1:5432/", "PostgreSQL server and user; the database name is replaced by -db and -empty-db")
	fs.StringVar(&o.db, "db", "extworker_scale", "the seeded ledger's database (created when missing)")
	fs.StringVar(&o.emptyDB, "empty-db", "extworker_scale_empty", "the empty ledger's database (created afresh every run)")
	fs.Int64Var(&o.rows, "rows", 10_000_000, "intents to seed")
	fs.IntVar(&o.eventsEach, "events", 3, "events seeded per intent (a real settled intent has 3: recorded, dispatched, settled)")
	fs.IntVar(&o.n, "n", 5000, "samples per operation and ledger")
	fs.DurationVar(&o.opBudget, "op-budget", 3*time.Minute, "at most this long per operation and ledger (a slow query stops with fewer samples, which the table shows)")
	fs.DurationVar(&o.retention, "retention", 60*24*time.Hour, "the prune's retention: the seeded intents span 90 days, so 60 days prunes about a third")
	fs.DurationVar(&o.pruneFor, "prune-for", 15*time.Minute, "stop the prune after this long (its throughput is reported either way)")
	fs.IntVar(&o.claimers, "claimers", 4, "goroutines claiming new intents during the prune and the baseline before it")
	fs.DurationVar(&o.baseline, "baseline", 30*time.Second, "how long the claimers run without a prune, for comparison")
	fs.StringVar(&o.out, "out", "bench/results", "directory for ledger-<rows>.md")
	fs.BoolVar(&o.keep, "keep", false, "keep both databases at the end (the seeded one is reused by the next run with the same -rows)")
	fs.BoolVar(&o.doPrune, "prune", true, "prune the seeded ledger after the measurements (-prune=false keeps it as seeded, for another run with -keep)")
	fs.BoolVar(&o.reseed, "reseed", false, "seed again even if -db already holds a seeded ledger of -rows intents")
	fs.StringVar(&o.note, "note", "", "a note for the results file (what else ran on the machine)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.rows < 1000 || o.n < 10 || o.eventsEach < 1 {
		return fmt.Errorf("-rows must be at least 1000, -n at least 10, -events at least 1")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	rep := &report{opts: o, started: time.Now().UTC(), loadBefore: loadAvg()}
	rep.machine = machineInfo()
	srv, err := newServer(o.baseURL)
	if err != nil {
		return err
	}
	defer srv.close()
	rep.pgVersion, rep.pgSettings = srv.version(ctx), srv.settings(ctx)

	// The seeded ledger first: seeding is by far the longest part, and a failure there
	// should not wait for anything else.
	seeded, err := srv.ensureSeeded(ctx, o, rep)
	if err != nil {
		return err
	}
	defer seeded.close()
	if err := srv.recreate(ctx, o.emptyDB); err != nil {
		return err
	}
	empty, err := openLedgerDB(ctx, srv.urlFor(o.emptyDB))
	if err != nil {
		return err
	}
	defer empty.close()
	// Both ledgers' schema is migrations.Up's, with migrations 00007's and 00008's indexes
	// (built CONCURRENTLY there, so an interrupted build would leave them INVALID and unused):
	// measure nothing unless every index is there and valid.
	for _, d := range []*ledgerDB{empty, seeded} {
		idx, err := d.checkIndexes(ctx)
		if err != nil {
			return err
		}
		if d == seeded {
			rep.indexes = idx
		}
	}

	rep.memBefore = memInfo()
	if err := measure(ctx, o, empty, seeded, rep); err != nil {
		return err
	}
	progress("EXPLAIN ANALYZE of the queries that grow with the ledger")
	rep.explains = explainSlow(ctx, seeded, o.retention)
	if o.doPrune {
		if err := seeded.markPruned(ctx); err != nil {
			return err
		}
		if err := prune(ctx, o, seeded, &rep.prune, o.pruneFor); err != nil {
			return err
		}
		if err := measureAfterPrune(ctx, o, rep); err != nil {
			return err
		}
	}
	rep.loadAfter = loadAvg()
	rep.finished = time.Now().UTC()
	path := filepath.Join(o.out, "ledger-"+rowsLabel(o.rows)+".md")
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(rep.markdown()), 0o644); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "wrote", path)
	if !o.keep {
		seeded.close()
		empty.close()
		for _, db := range []string{o.db, o.emptyDB} {
			if err := srv.drop(ctx, db); err != nil {
				fmt.Fprintln(os.Stderr, "ledgerscale: drop", db+":", err)
			}
		}
	}
	return nil
}

// rowsLabel names a row count the way the results files do: 10m, 100k, 2500.
func rowsLabel(n int64) string {
	switch {
	case n%1_000_000 == 0:
		return fmt.Sprintf("%dm", n/1_000_000)
	case n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// withDB returns base with its database replaced by db.
func withDB(base, db string) string {
	u, err := url.Parse(base)
	if err != nil {
		return base
	}
	u.Path = "/" + db
	return u.String()
}

// progress prints a line to stderr with the time, so a long run shows where it is.
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().UTC().Format("15:04:05"), strings.TrimSpace(fmt.Sprintf(format, args...)))
}
