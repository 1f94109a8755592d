package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/tasks"
)

// Client names a worker implementation.
type Client string

// The workers the benchmark runs.
const (
	Extworker Client = "extworker" // bench/cmd/goworker, on package tasks
	Java      Client = "java"      // bench/java-worker, on org.camunda.bpm:camunda-external-task-client
	JS        Client = "js"        // bench/js-worker, on camunda-external-task-client-js
	Raw       Client = "raw"       // bench/cmd/rawloop: one fetch and one complete per task (scenarios 5 and 6 only)
)

// Options configure a benchmark run. Zero values take the documented defaults.
type Options struct {
	// EngineURL is the engine's REST root. Default camunda7.DefaultBaseURL.
	EngineURL string
	// EngineDBURL is the engine's PostgreSQL, only read for its version. Empty: not reported.
	EngineDBURL string
	// EnginePID is the engine's process on this machine, whose CPU time (with that of
	// every PostgreSQL process) is reported per task. 0: PostgreSQL's only.
	EnginePID int
	// Runs is how often every scenario runs, the clients taking turns within each run.
	// Default 5.
	Runs int
	// Scenarios to run, from 1 to 7. Default all seven.
	Scenarios []int
	// Clients to compare, from Extworker, Java and JS (Raw runs in scenarios 5 and 6
	// whenever Extworker does). Default all three.
	Clients []Client
	// N1 and N2 are the instances of scenarios 1 and 2. Default 2000 each.
	N1, N2 int
	// N4 is scenario 4's instances per trial. Default N1.
	N4 int
	// LedgerDBURL is the effect ledger's PostgreSQL for scenario 4 (migrated by the
	// driver and by the worker; every trial writes to a namespace of its own, deleted at
	// the end). Default DefaultLedgerDBURL.
	LedgerDBURL string
	// IOWait is scenario 2's wait per task. Default 50ms.
	IOWait time.Duration
	// LatencySamples is scenario 3's instances per run, started one at a time with
	// random gaps of 50 to 250 ms after LatencyWarmup instances that warm the worker up.
	// Defaults 40 and 10.
	LatencySamples, LatencyWarmup int
	// N5 is scenario 5's tasks per run, served by the stub engine. Default 20000.
	N5 int
	// N6 is scenario 6's instances per trial. Default N1.
	N6 int
	// RawConcurrency lists the raw loops of scenario 6 by their number of parallel
	// fetch-complete loops; the one that serves the most is the yardstick. Default
	// DefaultRawConcurrency.
	RawConcurrency []int
	// N7 is scenario 7's tasks in flight at once, each held for Hold7 with its lock
	// (Lock7) kept alive meanwhile. Scenario 7 runs once, in the first run, extworker
	// only. Defaults 10000, 170s and 4m: every lock is extended at least twice (every 80s,
	// spread up to 20s earlier), and the extensions ask the engine for about 145 a second,
	// which the test environment's engine keeps up with.
	N7           int
	Hold7, Lock7 time.Duration
	// JavaBestMaxTasks is the Java client's maxTasks in its best configuration. Default 200.
	JavaBestMaxTasks int
	// AltConcurrency, if not 0, adds extworker with this MaxConcurrency to scenario 2:
	// whether the default concurrency is what limits it. Default 0: not run.
	AltConcurrency int
	// AltLedgerPool, if not 0, adds a third worker to scenario 4: the ledger on a pool
	// of this many connections (pgxpool's MaxConns) instead of pgxpool's default.
	// Default 0: not run.
	AltLedgerPool int
	// JavaJar is the runnable jar of bench/java-worker. Default <ModuleRoot>/bench/java-worker/target/java-worker.jar.
	JavaJar string
	// JSDir is bench/js-worker with its node_modules installed. Default <ModuleRoot>/bench/js-worker.
	JSDir string
	// ModuleRoot is the extworker checkout. Default: found with `go env GOMOD`.
	ModuleRoot string
	// BinDir receives the Go programs Run builds. Default a temporary directory.
	BinDir string
	// OutDir receives RESULTS.md and scenarios.svg. Required.
	OutDir string
	// LogDir receives every worker's stderr and unparsed stdout, and the profiles.
	// Default a temporary directory (its path is printed).
	LogDir string
	// Profile adds an extra, unmeasured pass of extworker with its CPU profile on in
	// scenarios 1, 4 (with the ledger) and 5, and puts pprof's top functions in RESULTS.md.
	Profile bool
	// Note is shown at the top of RESULTS.md (e.g. why instance counts were reduced).
	Note string
	// Progress receives one line per trial. Default io.Discard.
	Progress io.Writer `json:"-"`
}

// WithDefaults returns a copy with the defaults filled in.
func (o Options) WithDefaults() Options {
	if o.EngineURL == "" {
		o.EngineURL = camunda7.DefaultBaseURL
	}
	if o.Runs == 0 {
		o.Runs = 5
	}
	if len(o.Scenarios) == 0 {
		o.Scenarios = []int{1, 2, 3, 4, 5, 6, 7}
	}
	if len(o.Clients) == 0 {
		o.Clients = []Client{Extworker, Java, JS}
	}
	if o.N1 == 0 {
		o.N1 = 2000
	}
	if o.N2 == 0 {
		o.N2 = 2000
	}
	if o.N4 == 0 {
		o.N4 = o.N1
	}
	if o.LedgerDBURL == "" {
		o.LedgerDBURL = DefaultLedgerDBURL
	}
	if o.IOWait == 0 {
		o.IOWait = 50 * time.Millisecond
	}
	if o.LatencySamples == 0 {
		o.LatencySamples = 40
	}
	if o.LatencyWarmup == 0 {
		o.LatencyWarmup = 10
	}
	if o.N5 == 0 {
		o.N5 = 20000
	}
	if o.N6 == 0 {
		o.N6 = o.N1
	}
	if len(o.RawConcurrency) == 0 {
		o.RawConcurrency = slices.Clone(DefaultRawConcurrency)
	}
	if o.JavaBestMaxTasks == 0 {
		o.JavaBestMaxTasks = 200
	}
	if o.N7 == 0 {
		o.N7 = 10000
	}
	if o.Hold7 == 0 {
		o.Hold7 = 170 * time.Second
	}
	if o.Lock7 == 0 {
		o.Lock7 = 4 * time.Minute
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

// Validate names every bad field.
func (o Options) Validate() error {
	var errs []error
	if o.OutDir == "" {
		errs = append(errs, errors.New("OutDir is required"))
	}
	if o.Runs < 1 {
		errs = append(errs, fmt.Errorf("Runs %d: must be at least 1", o.Runs))
	}
	for _, s := range o.Scenarios {
		if s < 1 || s > 7 {
			errs = append(errs, fmt.Errorf("Scenarios: %d is not one of 1, 2, 3, 4, 5, 6, 7", s))
		}
	}
	for _, c := range o.Clients {
		if c != Extworker && c != Java && c != JS {
			errs = append(errs, fmt.Errorf("Clients: %q is not one of extworker, java, js", c))
		}
	}
	for name, n := range map[string]int{"N1": o.N1, "N2": o.N2, "N4": o.N4, "LatencySamples": o.LatencySamples, "LatencyWarmup": o.LatencyWarmup, "N5": o.N5, "N6": o.N6, "N7": o.N7, "JavaBestMaxTasks": o.JavaBestMaxTasks} {
		if n < 1 {
			errs = append(errs, fmt.Errorf("%s %d: must be at least 1", name, n))
		}
	}
	for _, c := range o.RawConcurrency {
		if c < 1 {
			errs = append(errs, fmt.Errorf("RawConcurrency %d: must be at least 1", c))
		}
	}
	if o.Lock7 < time.Second || o.Hold7 < 0 {
		errs = append(errs, fmt.Errorf("Lock7 %v and Hold7 %v: need a lock of at least 1s and a hold not negative", o.Lock7, o.Hold7))
	}
	if o.IOWait < 0 {
		errs = append(errs, fmt.Errorf("IOWait %v: must not be negative", o.IOWait))
	}
	if o.AltConcurrency < 0 || o.AltLedgerPool < 0 {
		errs = append(errs, fmt.Errorf("AltConcurrency %d and AltLedgerPool %d: must not be negative", o.AltConcurrency, o.AltLedgerPool))
	}
	if len(errs) > 0 {
		return fmt.Errorf("bench options: %w", errors.Join(errs...))
	}
	return nil
}

func (o Options) has(c Client) bool { return slices.Contains(o.Clients, c) }

func (o Options) runs(s int) bool { return slices.Contains(o.Scenarios, s) }

// Variant is one worker in one configuration.
type Variant struct {
	Client Client
	// ID is short and file-name safe ("java-best").
	ID string
	// Label names it in tables; Short in the chart.
	Label, Short string
	// Config says, in the client's own terms, what was set.
	Config string
	// flags are the worker program's configuration flags.
	flags []string
}

// Concurrency is extworker's default MaxConcurrency, the JS client's
// maxParallelExecutions in its best configuration, and the raw loop's parallelism.
var Concurrency = tasks.Config{}.WithDefaults().MaxConcurrency

const longPoll = 20 * time.Second

// DefaultLedgerDBURL is the ledger database of the test environment (services/, make up).
const DefaultLedgerDBURL = "postgres://extworker:extworker@127.0.0.1:5432/extworker"

// altVariant is extworker with MaxConcurrency n (Options.AltConcurrency).
func altVariant(n int) Variant {
	return Variant{Client: Extworker, ID: fmt.Sprintf("extworker-c%d", n), Label: fmt.Sprintf("extworker, MaxConcurrency %d", n),
		Short: fmt.Sprintf("extworker c%d", n), Config: fmt.Sprintf("as extworker, with MaxConcurrency %d", n),
		flags: []string{"-concurrency", strconv.Itoa(n)}}
}

// ledgerVariants are scenario 4's two workers: extworker as in scenario 1, and the same
// with one effect-ledger intent per task.
func ledgerVariants(ext Variant) (without, with Variant) {
	without = ext
	without.Label, without.Short = "extworker, no ledger", "no ledger"
	with = Variant{Client: Extworker, ID: "extworker-ledger", Label: "extworker, ledger", Short: "ledger",
		Config: "as extworker, and the no-op handler first runs one intent through idempotency.Ledger.Do (scope bench.noop, key the task's process instance id; record and claim it marked dispatched, then confirm: two statements, each its own transaction) with a Dispatch that returns at once; pgxpool defaults (MaxConns: 4 or the core count, as cmd/extworker), a fresh ledger namespace per trial"}
	return without, with
}

// ledgerPoolVariant is scenario 4's ledger worker on a pool of n connections
// (Options.AltLedgerPool).
func ledgerPoolVariant(with Variant, n int) Variant {
	v := with
	v.ID, v.Label, v.Short = fmt.Sprintf("extworker-ledger-pool%d", n), fmt.Sprintf("extworker, ledger, pool of %d", n), fmt.Sprintf("ledger, pool %d", n)
	v.Config = fmt.Sprintf("as extworker, ledger, with pgxpool MaxConns %d", n)
	v.flags = append(slices.Clone(with.flags), "-ledger-pool", strconv.Itoa(n))
	return v
}

func variants(o Options) (ext, javaDef, javaBest, jsDef, jsBest, raw Variant) {
	lp := strconv.FormatInt(longPoll.Milliseconds(), 10)
	c := strconv.Itoa(Concurrency)
	ext = Variant{Client: Extworker, ID: "extworker", Label: "extworker", Short: "extworker",
		Config: fmt.Sprintf("defaults: MaxConcurrency %d, long poll %v, lock 30s with extension, no variables fetched", Concurrency, tasks.Config{}.WithDefaults().AsyncResponseTimeout)}
	javaDef = Variant{Client: Java, ID: "java-default", Label: "Java client, defaults", Short: "Java default",
		Config: "defaults: maxTasks 10, no long polling (exponential backoff 500ms…60s when empty), lockDuration 20s, handlers run one after another on the fetch thread"}
	javaBest = Variant{Client: Java, ID: "java-best", Label: fmt.Sprintf("Java client, maxTasks %d", o.JavaBestMaxTasks), Short: "Java best",
		Config: fmt.Sprintf("maxTasks %d, asyncResponseTimeout %s ms (lockDuration 20s stays above maxTasks × the I/O wait)", o.JavaBestMaxTasks, lp),
		flags:  []string{"-max-tasks", strconv.Itoa(o.JavaBestMaxTasks), "-long-poll-ms", lp}}
	jsDef = Variant{Client: JS, ID: "js-default", Label: "JS client, defaults", Short: "JS default",
		Config: "defaults: maxTasks 10, interval 300 ms between polls, no long polling, no maxParallelExecutions"}
	jsBest = Variant{Client: JS, ID: "js-best", Label: fmt.Sprintf("JS client, maxParallelExecutions %s", c), Short: "JS best",
		Config: fmt.Sprintf("maxParallelExecutions %s and maxTasks %s (maxTasks stays 10 otherwise), interval 10 ms (300 ms otherwise, waited after every poll), asyncResponseTimeout %s ms", c, c, lp),
		flags:  []string{"-max-parallel", c, "-max-tasks", c, "-interval", "10", "-long-poll-ms", lp}}
	raw = Variant{Client: Raw, ID: "raw", Label: "raw HTTP loop", Short: "raw loop",
		Config: fmt.Sprintf("%s goroutines, each: fetchAndLock maxTasks 1 (no long polling), then complete; net/http and encoding/json only", c),
		flags:  []string{"-concurrency", c}}
	return
}

// Trial is one worker's measurements in one run of one scenario.
type Trial struct {
	Run int
	N   int
	// Startup is from launching the worker process to its first handler starting.
	Startup time.Duration
	// Wall is from the first handler starting to the last task completed on the engine
	// (the stub engine's first answer with tasks to its last complete in scenario 5).
	Wall time.Duration
	// TPS is N / Wall.
	TPS float64
	// CPUTotal is the worker process's user+system CPU over its whole life (rusage);
	// CPUWork leaves out what it spent before its first handler started.
	CPUTotal, CPUWork time.Duration
	// PeakRSS is the worker process's maximum resident set size, in bytes.
	PeakRSS int64
	// Latencies are scenario 3's pickup latencies, in start order; P50 and P99 of them.
	Latencies []time.Duration
	P50, P99  time.Duration
	// Fetches counts fetchAndLock calls: seen by the stub in scenario 5, reported by
	// extworker itself in scenarios 1, 2 and 7 and by both workers in scenario 6; 0
	// where unknown.
	Fetches int64
	// EmptyFetches counts the raw loop's fetches that locked no task in scenario 6, and
	// FailedFetches its fetches and completes the engine failed (5xx), sent again.
	EmptyFetches  int64 `json:",omitempty"`
	FailedFetches int64 `json:",omitempty"`
	// EngineCPU is the engine's and PostgreSQL's CPU time from the worker's launch to
	// the last task completed (scenarios 1, 2, 4, 6 and 7).
	EngineCPU time.Duration
	// Intents is how many new intents the worker confirmed in the ledger (scenario 4,
	// with the ledger; it must equal N).
	Intents int64 `json:",omitempty"`
	// Slots is where the worker's handler slots spent their time (scenarios 1, 2 and 4
	// for extworker, and the JS client with maxParallelExecutions), or nil.
	Slots *SlotUse `json:",omitempty"`
	// InFlight is scenario 7's locks and extensions, or nil.
	InFlight *InFlight `json:",omitempty"`
}

// SlotUse is a worker's SLOTS line with the completes' latency from its REQUESTS line:
// from its first handler starting to its last ending (Window), Max slots were either
// running a handler, waiting for its complete, or free (Free, summed over the slots)
// while the fetch loop waited for the engine.
type SlotUse struct {
	Max           int
	Window, Free  time.Duration
	Complete      time.Duration // summed latency of the completes
	Polls, Polled int64         // fetchAndLock calls answered, and the tasks they returned
	PollTime      time.Duration // summed latency of those calls
}

// slotUse parses the SLOTS and REQUESTS lines a worker printed at exit, or returns nil.
// REQUESTS carries the completes' summed milliseconds in its fifth field (extworker) or
// its third (the JS worker).
func slotUse(p *proc, c Client) *SlotUse {
	sl, rq := p.final("SLOTS"), p.final("REQUESTS")
	if len(sl) != 7 {
		return nil
	}
	n := make([]int64, 6)
	for i := range n {
		n[i], _ = strconv.ParseInt(sl[i+1], 10, 64)
	}
	u := &SlotUse{Window: time.Duration(n[0]) * time.Millisecond, Free: time.Duration(n[1]) * time.Millisecond,
		Polls: n[2], Polled: n[3], PollTime: time.Duration(n[4]) * time.Millisecond, Max: int(n[5])}
	field := 5
	if c == JS {
		field = 3
	}
	if len(rq) > field {
		ms, _ := strconv.ParseInt(rq[field], 10, 64)
		u.Complete = time.Duration(ms) * time.Millisecond
	}
	return u
}

// Series is one variant's trials in one scenario.
type Series struct {
	Scenario int
	Variant  Variant
	Trials   []Trial
}

// Profile is pprof's view of one extra, unmeasured trial.
type Profile struct {
	Title, Top string
}

// Results is everything a run measured.
type Results struct {
	Opts              Options
	Started, Finished time.Time
	// Versions and Machine describe what ran.
	Versions [][2]string
	Machine  string
	Series   []*Series
	Profiles []Profile
}

// Find returns the series for a scenario and variant id, or nil.
func (r *Results) Find(scenario int, id string) *Series {
	for _, s := range r.Series {
		if s.Scenario == scenario && s.Variant.ID == id {
			return s
		}
	}
	return nil
}

func (r *Results) add(scenario int, v Variant, t Trial) {
	s := r.Find(scenario, v.ID)
	if s == nil {
		s = &Series{Scenario: scenario, Variant: v}
		r.Series = append(r.Series, s)
	}
	s.Trials = append(s.Trials, t)
}

// Run builds the Go programs, runs the scenarios Options.Runs times with the clients
// taking turns, and writes the report into Options.OutDir.
func Run(ctx context.Context, opts Options) (*Results, error) {
	o := opts.WithDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var err error
	if o.ModuleRoot == "" {
		if o.ModuleRoot, err = moduleRoot(ctx); err != nil {
			return nil, err
		}
	}
	if o.JavaJar == "" {
		o.JavaJar = filepath.Join(o.ModuleRoot, "bench", "java-worker", "target", "java-worker.jar")
	}
	if o.JSDir == "" {
		o.JSDir = filepath.Join(o.ModuleRoot, "bench", "js-worker")
	}
	if o.has(Java) {
		if _, err := os.Stat(o.JavaJar); err != nil {
			return nil, fmt.Errorf("java worker: %w (build it: cd bench/java-worker && mvn -B -q package)", err)
		}
	}
	if o.has(JS) {
		if _, err := os.Stat(filepath.Join(o.JSDir, "node_modules", "camunda-external-task-client-js")); err != nil {
			return nil, fmt.Errorf("js worker: %w (install it: cd bench/js-worker && npm ci)", err)
		}
	}
	for _, d := range []*string{&o.BinDir, &o.LogDir} {
		if *d == "" {
			if *d, err = os.MkdirTemp("", "extworker-bench-"); err != nil {
				return nil, err
			}
		}
	}
	if err := os.MkdirAll(o.LogDir, 0o755); err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Progress, "bench: worker logs and profiles in %s\n", o.LogDir)
	if err := BuildPrograms(ctx, o.ModuleRoot, o.BinDir); err != nil {
		return nil, err
	}

	eng, err := newEngine(o.EngineURL)
	if err != nil {
		return nil, err
	}
	defer eng.cleanup(context.WithoutCancel(ctx), o.Progress)
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	engineVersion, err := eng.c.Version(vctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("engine at %s: %w (run `make up`)", o.EngineURL, err)
	}

	h := &harness{o: o, eng: eng, res: &Results{Opts: o, Started: time.Now()}}
	h.res.Versions, h.res.Machine = versions(ctx, o, engineVersion)
	if o.runs(4) && o.has(Extworker) {
		if h.ledger, err = openLedgerDB(ctx, o.LedgerDBURL); err != nil {
			return nil, err
		}
		defer h.ledger.close(context.WithoutCancel(ctx), o.Progress)
		h.res.Versions = append(h.res.Versions, [2]string{"PostgreSQL (ledger database, scenario 4)", pgVersion(ctx, o.LedgerDBURL)})
	}
	if err := h.runAll(ctx); err != nil {
		return h.res, err
	}
	h.res.Finished = time.Now()
	if err := WriteReport(h.res, o.OutDir); err != nil {
		return h.res, err
	}
	return h.res, nil
}

type harness struct {
	o      Options
	eng    *engine
	ledger *ledgerDB // scenario 4's, or nil
	res    *Results
	seq    int
}

func (h *harness) runAll(ctx context.Context) error {
	ext, javaDef, javaBest, jsDef, jsBest, raw := variants(h.o)
	pick := func(vs ...Variant) []Variant {
		var out []Variant
		for _, v := range vs {
			if h.o.has(v.Client) || (v.Client == Raw && h.o.has(Extworker)) {
				out = append(out, v)
			}
		}
		return out
	}
	s1 := pick(ext, javaBest, jsBest)
	s2 := pick(ext, javaDef, javaBest, jsDef, jsBest)
	if h.o.AltConcurrency > 0 && h.o.has(Extworker) {
		s2 = append(s2[:1], append([]Variant{altVariant(h.o.AltConcurrency)}, s2[1:]...)...)
	}
	s3 := pick(ext, javaBest, jsBest)
	s5 := pick(ext, raw)
	noLedger, withLedger := ledgerVariants(ext)
	start := time.Now()
	for run := 1; run <= h.o.Runs; run++ {
		if h.o.runs(1) {
			for _, v := range s1 {
				if err := h.trial(ctx, 1, v, run, func() (Trial, error) { return h.throughput(ctx, 1, v, run, h.o.N1, "noop", nil) }); err != nil {
					return err
				}
			}
		}
		if h.o.runs(2) {
			for _, v := range s2 {
				if err := h.trial(ctx, 2, v, run, func() (Trial, error) { return h.throughput(ctx, 2, v, run, h.o.N2, "io", nil) }); err != nil {
					return err
				}
			}
		}
		if h.o.runs(3) {
			for _, v := range s3 {
				if err := h.trial(ctx, 3, v, run, func() (Trial, error) { return h.latency(ctx, v, run) }); err != nil {
					return err
				}
			}
		}
		if h.o.runs(4) && h.o.has(Extworker) {
			s4 := []Variant{noLedger, withLedger}
			if h.o.AltLedgerPool > 0 {
				s4 = append(s4, ledgerPoolVariant(withLedger, h.o.AltLedgerPool))
			}
			for _, v := range s4 { // taking turns: A B in every run
				ledger := v.ID != noLedger.ID
				if err := h.trial(ctx, 4, v, run, func() (Trial, error) { return h.ledgerThroughput(ctx, v, run, ledger, nil) }); err != nil {
					return err
				}
			}
		}
		if h.o.runs(5) {
			for _, v := range s5 {
				if v.Client == Extworker || v.Client == Raw {
					if err := h.trial(ctx, 5, v, run, func() (Trial, error) { return h.ceiling(ctx, v, run, nil) }); err != nil {
						return err
					}
				}
			}
		}
		if h.o.runs(6) && h.o.has(Extworker) {
			if err := h.engineCeilingRun(ctx, ext, run); err != nil {
				return err
			}
		}
		if h.o.runs(7) && h.o.has(Extworker) && run == 1 { // once: it takes minutes
			if err := h.trial(ctx, 7, ext, run, func() (Trial, error) { return h.inFlight(ctx, ext, run) }); err != nil {
				return err
			}
		}
		fmt.Fprintf(h.o.Progress, "bench: run %d of %d done after %v\n", run, h.o.Runs, time.Since(start).Round(time.Second))
	}
	if h.o.Profile && h.o.has(Extworker) {
		return h.profiles(ctx, ext, withLedger)
	}
	return nil
}

func (h *harness) trial(ctx context.Context, scenario int, v Variant, run int, f func() (Trial, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	began := time.Now()
	t, err := f()
	if err != nil {
		return fmt.Errorf("scenario %d, %s, run %d: %w", scenario, v.Label, run, err)
	}
	t.Run = run
	h.res.add(scenario, v, t)
	detail := fmt.Sprintf("%.0f tasks/s, wall %.2fs, cpu %.2fs, rss %.0f MiB", t.TPS, t.Wall.Seconds(), t.CPUTotal.Seconds(), mib(t.PeakRSS))
	if scenario == 3 {
		detail = fmt.Sprintf("p50 %.1f ms, p99 %.1f ms", ms(t.P50), ms(t.P99))
	}
	if f := t.InFlight; f != nil {
		detail = fmt.Sprintf("%d in flight, rss %.0f MiB all in flight, peak %.0f MiB, %d locks lost, %d extensions (%d failed), late p99 %.0f ms, max %.0f ms, extendLock %.0f/s (busiest second %d, %.1f ms each)",
			f.MaxInFlight, mib(f.HeldRSS), mib(t.PeakRSS), f.Lost, f.Extended, f.ExtendFailed, ms(f.LateP99), ms(f.LateMax), f.Rate, f.Busiest, ms(f.Latency))
	}
	fmt.Fprintf(h.o.Progress, "bench: run %d scenario %d %-40s %s (trial %v)\n", run, scenario, v.Label, detail, time.Since(began).Round(100*time.Millisecond))
	return nil
}

// profiles runs extworker once more in scenarios 1, 4 (with the ledger) and 5 with its
// CPU profile on.
func (h *harness) profiles(ctx context.Context, ext, withLedger Variant) error {
	if h.o.runs(1) {
		path := filepath.Join(h.o.LogDir, "s1-extworker.cpu.pprof")
		t, err := h.throughput(ctx, 1, ext, 0, h.o.N1, "noop", []string{"-cpuprofile", path})
		if err != nil {
			return fmt.Errorf("profile scenario 1: %w", err)
		}
		top, err := pprofTop(ctx, filepath.Join(h.o.BinDir, "goworker"), path)
		if err != nil {
			return err
		}
		h.res.Profiles = append(h.res.Profiles, Profile{Title: fmt.Sprintf("Scenario 1 (real engine, %d no-op tasks, %.0f tasks/s, %.2f s CPU while profiled)", t.N, t.TPS, t.CPUTotal.Seconds()), Top: top})
	}
	if h.o.runs(4) {
		path := filepath.Join(h.o.LogDir, "s4-extworker-ledger.cpu.pprof")
		t, err := h.ledgerThroughput(ctx, withLedger, 0, true, []string{"-cpuprofile", path})
		if err != nil {
			return fmt.Errorf("profile scenario 4: %w", err)
		}
		top, err := pprofTop(ctx, filepath.Join(h.o.BinDir, "goworker"), path)
		if err != nil {
			return err
		}
		h.res.Profiles = append(h.res.Profiles, Profile{Title: fmt.Sprintf("Scenario 4 (real engine, %d no-op tasks with the ledger, %.0f tasks/s, %.2f s CPU while profiled)", t.N, t.TPS, t.CPUTotal.Seconds()), Top: top})
	}
	if h.o.runs(5) {
		path := filepath.Join(h.o.LogDir, "s5-extworker.cpu.pprof")
		t, err := h.ceiling(ctx, ext, 0, []string{"-cpuprofile", path})
		if err != nil {
			return fmt.Errorf("profile scenario 5: %w", err)
		}
		top, err := pprofTop(ctx, filepath.Join(h.o.BinDir, "goworker"), path)
		if err != nil {
			return err
		}
		h.res.Profiles = append(h.res.Profiles, Profile{Title: fmt.Sprintf("Scenario 5 (stub engine, %d tasks, %.0f tasks/s, %.2f s CPU while profiled)", t.N, t.TPS, t.CPUTotal.Seconds()), Top: top})
	}
	return nil
}

func mib(b int64) float64         { return float64(b) / (1 << 20) }
func ms(d time.Duration) float64  { return float64(d) / float64(time.Millisecond) }
func sec(d time.Duration) float64 { return d.Seconds() }
