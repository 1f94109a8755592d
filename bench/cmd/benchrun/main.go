// Command benchrun runs extworker's benchmark against the official Camunda 7 clients
// (make bench) and writes RESULTS.md and scenarios.svg. See bench/README.md.
//
//	go run ./bench/cmd/benchrun -out bench/results            # the full run
//	go run ./bench/cmd/benchrun -smoke -out bench/.smoke      # tiny counts, one run
//	go run ./bench/cmd/benchrun -from bench/results/results.json -out bench/results  # render again
//	go run ./bench/cmd/benchrun -scenarios 4 -clients extworker -merge -out bench/results  # one scenario again
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/extworker/extworker/bench/harness"
	"github.com/extworker/extworker/internal/testenv"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benchrun:", err)
		os.Exit(1)
	}
}

func run() error {
	def := harness.Options{}.WithDefaults()
	var o harness.Options
	flag.StringVar(&o.EngineURL, "engine", testenv.EngineURL(), "engine REST root")
	flag.StringVar(&o.EngineDBURL, "engine-db", testenv.EngineDBURL(), "engine's PostgreSQL, read for its version only (empty: skip)")
	flag.IntVar(&o.EnginePID, "engine-pid", pidFile("services/.run/engine.pid"), "the engine's process id, for its CPU time (0: PostgreSQL's only)")
	flag.StringVar(&o.OutDir, "out", "bench/results", "where RESULTS.md and scenarios.svg go")
	flag.StringVar(&o.LogDir, "logs", "", "where worker logs and profiles go (default: a new temporary directory)")
	flag.IntVar(&o.Runs, "runs", def.Runs, "runs of every scenario")
	flag.IntVar(&o.N1, "n1", def.N1, "scenario 1 instances")
	flag.IntVar(&o.N2, "n2", def.N2, "scenario 2 instances")
	flag.IntVar(&o.N4, "n4", 0, "scenario 4 instances per trial (0: as -n1)")
	flag.StringVar(&o.LedgerDBURL, "ledger-db", testenv.DBURL(), "scenario 4's effect-ledger database (migrated; trials' rows are deleted at the end)")
	flag.DurationVar(&o.IOWait, "io", def.IOWait, "scenario 2 wait per task")
	flag.IntVar(&o.LatencySamples, "lat", def.LatencySamples, "scenario 3 instances per run")
	flag.IntVar(&o.LatencyWarmup, "lat-warmup", def.LatencyWarmup, "scenario 3 warm-up instances per run")
	flag.IntVar(&o.N5, "n5", def.N5, "scenario 5 tasks per run (stub engine)")
	flag.IntVar(&o.N6, "n6", 0, "scenario 6 instances per trial (0: as -n1)")
	rawConcurrency := flag.String("raw-concurrency", joinInts(harness.DefaultRawConcurrency), "scenario 6's raw loops, by their parallel loops; the one serving the most is the yardstick")
	flag.IntVar(&o.N7, "n7", def.N7, "scenario 7 tasks in flight at once (run once, extworker only)")
	flag.DurationVar(&o.Hold7, "hold7", def.Hold7, "scenario 7: how long each handler holds its task")
	flag.DurationVar(&o.Lock7, "lock7", def.Lock7, "scenario 7: the topic's lock duration, extended while the task is held")
	flag.IntVar(&o.JavaBestMaxTasks, "java-max-tasks", def.JavaBestMaxTasks, "Java client's maxTasks in its best configuration")
	flag.IntVar(&o.AltConcurrency, "alt-concurrency", 0, "also run extworker with this MaxConcurrency in scenario 2 (0: not)")
	flag.IntVar(&o.AltLedgerPool, "alt-ledger-pool", 0, "also run scenario 4's ledger worker on a pool of this many connections (0: not)")
	flag.BoolVar(&o.Profile, "profile", true, "add an unmeasured, CPU-profiled extworker trial in scenarios 1, 4 and 5")
	flag.StringVar(&o.Note, "note", "", "a note for the top of RESULTS.md")
	scenarios := flag.String("scenarios", "1,2,3,4,5,6,7", "scenarios to run")
	clients := flag.String("clients", "extworker,java,js", "workers to compare")
	from := flag.String("from", "", "render RESULTS.md and scenarios.svg again from this results.json, running nothing")
	merge := flag.Bool("merge", false, "merge the scenarios run into the results.json in -out, keeping its other scenarios, and render from the merged results")
	smoke := flag.Bool("smoke", false, "tiny counts and one run, to check the harness works (overrides -runs, -n1, -n2, -lat, -n5, -n6, -n7, -hold7, -lock7)")
	flag.Parse()

	if *from != "" {
		res, err := harness.ReadResults(*from)
		if err != nil {
			return err
		}
		return harness.WriteReport(res, o.OutDir)
	}
	for _, s := range strings.Split(*scenarios, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("-scenarios %q: %w", *scenarios, err)
		}
		o.Scenarios = append(o.Scenarios, n)
	}
	for _, s := range strings.Split(*rawConcurrency, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("-raw-concurrency %q: %w", *rawConcurrency, err)
		}
		o.RawConcurrency = append(o.RawConcurrency, n)
	}
	for _, c := range strings.Split(*clients, ",") {
		o.Clients = append(o.Clients, harness.Client(strings.TrimSpace(c)))
	}
	if *smoke {
		o.Runs, o.N1, o.N2, o.LatencySamples, o.LatencyWarmup, o.N4, o.N5, o.N6 = 1, 50, 50, 5, 3, 50, 1000, 50
		o.N7, o.Hold7, o.Lock7 = 50, 7*time.Second, 3*time.Second
		o.Note = "smoke run: tiny instance counts and one run; the numbers mean nothing."
	}
	o.Progress = os.Stdout

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	began := time.Now()
	if *merge {
		old, err := harness.ReadResults(filepath.Join(o.OutDir, "results.json"))
		if err != nil {
			return fmt.Errorf("-merge: %w", err)
		}
		out := o.OutDir
		if o.OutDir, err = os.MkdirTemp("", "extworker-benchrun-"); err != nil {
			return err
		}
		res, err := harness.Run(ctx, o)
		if err != nil {
			return err
		}
		fmt.Printf("benchrun: this run alone is in %s\n", o.OutDir)
		o.OutDir = out
		if err := harness.WriteReport(harness.Merge(old, res), out); err != nil {
			return err
		}
	} else if _, err := harness.Run(ctx, o); err != nil {
		return err
	}
	fmt.Printf("benchrun: wrote %s/RESULTS.md and %s/scenarios.svg in %v\n", o.OutDir, o.OutDir, time.Since(began).Round(time.Second))
	return nil
}

// joinInts is ns as "16,64".
func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// pidFile reads the pid `make up` wrote, or returns 0.
func pidFile(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return pid
}
