// Command goworker is the benchmark's worker on extworker (package tasks): one topic, a
// handler that completes each task at once (-mode noop), after waiting (-mode io), or
// after holding it for long (-mode hold, scenario 7: -hold with -lock, its lock kept
// alive meanwhile), the runtime's defaults unless a flag says otherwise. With -ledger-db (scenario 4) the
// handler first runs one intent through the effect ledger (idempotency.Ledger.Do: scope
// bench.noop, key the task's process instance id, a Dispatch that returns at once), on a
// pgxpool with its defaults, after migrating the database. It prints to stdout
//
//	FIRST <unix ns>                  when the first handler starts
//	PICKUP <business key> <unix ns>  when a handler starts (with -latency)
//	LEDGER <new> <replayed> <errors> at exit, with -ledger-db: intents confirmed by this
//	                                 process, replayed from the ledger, and failed Do calls
//	REQUESTS <fetches> <completes> <other> <fetch ms> <complete ms>
//	                                 at exit: requests sent to the engine by kind, and the
//	                                 summed round-trip times of those answered with 2xx
//	SLOTS <window ms> <free slot-ms> <polls> <tasks polled> <poll ms> <max concurrency>
//	                                 at exit: where the handler slots' time went, from the
//	                                 first task starting to the last one ending (see slots)
//	LOCKS <extended> <failed> <lost> <sent> <late p50 µs> <late p99 µs> <late max µs> <max in flight>
//	                                 at exit: extendLock calls that succeeded and failed,
//	                                 tasks whose lock was lost while their handler ran,
//	                                 extensions the scheduler sent, and how late they went
//	                                 out (0 for one sent early, spread)
//	HELD <vmrss bytes>               with -mode hold, when the first hold ends: the
//	                                 process's resident set with every task still in flight
//	EXTENDS <answered> <first unix ns> <last unix ns> <busiest second> <summed ms>
//	                                 at exit: extendLock calls answered with 2xx, when the
//	                                 first and last were sent, the most sent in one second,
//	                                 and their summed round-trip times
//
// and stops (draining, as in production) on SIGTERM or SIGINT. The benchmark driver
// (bench/cmd/benchrun) starts it as a separate process and measures it from outside.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/lockext"
	"github.com/extworker/extworker/migrations"
	"github.com/extworker/extworker/tasks"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "goworker:", err)
		os.Exit(1)
	}
}

func run() error {
	engine := flag.String("engine", camunda7.DefaultBaseURL, "engine REST root")
	topic := flag.String("topic", "", "topic to work (required)")
	mode := flag.String("mode", "noop", "handler: noop (complete at once), io (wait -io, then complete) or hold (wait -hold, then complete)")
	ioWait := flag.Duration("io", 50*time.Millisecond, "how long the io handler waits")
	hold := flag.Duration("hold", time.Minute, "how long the hold handler waits")
	lock := flag.Duration("lock", 0, "the topic's LockDuration (0: the default)")
	latency := flag.Bool("latency", false, "print PICKUP lines")
	concurrency := flag.Int("concurrency", 0, "tasks.Config.MaxConcurrency (0: the default)")
	longPoll := flag.Duration("long-poll", 0, "tasks.Config.AsyncResponseTimeout (0: the default)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile here")
	memProfile := flag.String("memprofile", "", "write a heap profile here at exit")
	verbose := flag.Bool("v", false, "log the worker's records to stderr")
	warnings := flag.Bool("warnings", false, "log the worker's warnings and errors to stderr (scenario 7: why a lock was lost)")
	ledgerDB := flag.String("ledger-db", "", "run one effect-ledger intent per task on this PostgreSQL (migrated first); empty: no ledger")
	ledgerNS := flag.String("ledger-namespace", "bench", "the ledger's namespace (a fresh one per trial keeps trials apart)")
	ledgerPool := flag.Int("ledger-pool", 0, "the ledger pool's MaxConns (0: pgxpool's default, as cmd/extworker)")
	flag.Parse()
	if *topic == "" {
		return fmt.Errorf("-topic is required")
	}
	if *mode != "noop" && *mode != "io" && *mode != "hold" {
		return fmt.Errorf("-mode %q: want noop, io or hold", *mode)
	}

	logger := slog.New(slog.DiscardHandler)
	switch {
	case *verbose:
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	case *warnings:
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	next := transport()
	if *mode == "hold" {
		// Thousands of handlers held together also end together: their completes wait for
		// one of 64 connections instead of opening thousands against the shared engine.
		next.MaxConnsPerHost = 64
	}
	counter := &countingTransport{next: next}
	c, err := camunda7.New(camunda7.Config{BaseURL: *engine, Logger: logger, HTTPClient: &http.Client{Transport: counter}})
	if err != nil {
		return err
	}
	out := &lineWriter{f: os.Stdout}
	defer func() {
		out.line(fmt.Sprintf("REQUESTS %d %d %d %d %d", counter.fetches.Load(), counter.completes.Load(), counter.other.Load(),
			counter.fetchTime.Load()/int64(time.Millisecond), counter.completeTime.Load()/int64(time.Millisecond)))
	}()
	var eff *effects
	if *ledgerDB != "" {
		if eff, err = openLedger(*ledgerDB, *ledgerNS, int32(*ledgerPool), logger); err != nil {
			return err
		}
		defer eff.pool.Close()
		defer func() { out.line(eff.summary()) }() // before REQUESTS: defers run last first
	}
	var first, held sync.Once
	reg := tasks.NewRegistry()
	err = reg.Register(*topic, func(ctx context.Context, t *tasks.Task) (camunda7.Variables, error) {
		now := time.Now().UnixNano()
		first.Do(func() { out.line("FIRST " + strconv.FormatInt(now, 10)) })
		if *latency {
			out.line("PICKUP " + t.BusinessKey() + " " + strconv.FormatInt(now, 10))
		}
		if eff != nil {
			if err := eff.do(ctx, t); err != nil {
				return nil, err
			}
		}
		if *mode == "io" || *mode == "hold" {
			wait := *ioWait
			if *mode == "hold" {
				wait = *hold
			}
			tm := time.NewTimer(wait)
			defer tm.Stop()
			select {
			case <-tm.C:
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
			if *mode == "hold" {
				held.Do(func() { out.line("HELD " + strconv.FormatInt(vmRSS(), 10)) })
			}
		}
		return nil, nil
	}, tasks.TopicOptions{LockDuration: *lock})
	if err != nil {
		return err
	}
	slots := &slots{}
	w, err := tasks.New(c, reg, tasks.Config{MaxConcurrency: *concurrency, AsyncResponseTimeout: *longPoll, Logger: logger, Observer: slots,
		LockExtension: lockext.SchedulerConfig{OnSend: slots.sent}})
	if err != nil {
		return err
	}
	slots.max = tasks.Config{MaxConcurrency: *concurrency}.WithDefaults().MaxConcurrency
	defer func() { out.line(counter.extends.summary()) }()
	defer func() { out.line(slots.locks(w.Stats().MaxInFlight.Load())) }()
	defer func() { out.line(slots.summary()) }()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err = w.Run(ctx)
	c.CloseIdleConnections()
	if *memProfile != "" {
		f, ferr := os.Create(*memProfile)
		if ferr != nil {
			return ferr
		}
		defer f.Close()
		runtime.GC()
		if ferr := pprof.WriteHeapProfile(f); ferr != nil {
			return ferr
		}
	}
	return err
}

// effects is scenario 4's effect ledger and what it did.
type effects struct {
	pool                     *pgxpool.Pool
	ledger                   *idempotency.Ledger
	confirmed, replayed, bad atomic.Int64
}

// openLedger connects to the ledger's database with pgxpool's defaults (as cmd/extworker
// does) unless maxConns is set, migrates it, opens every pooled connection once so that
// no task pays for a connection set-up, and returns the ledger on namespace.
func openLedger(url, namespace string, maxConns int32, logger *slog.Logger) (*effects, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("-ledger-db: %w", err)
	}
	if maxConns > 0 {
		pc.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("-ledger-db: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	_, err = migrations.Up(ctx, db)
	db.Close()
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("ledger database: %w", err)
	}
	conns := make([]*pgxpool.Conn, 0, pool.Config().MaxConns)
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	l, err := idempotency.New(pool, idempotency.Config{Namespace: namespace, Logger: logger})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &effects{pool: pool, ledger: l}, nil
}

// do runs the task's one intent: deterministic per task (its process instance), with a
// Dispatch that calls no provider, so what it costs is the ledger's own work.
func (e *effects) do(ctx context.Context, t *tasks.Task) error {
	pi := t.ProcessInstanceID()
	out, err := e.ledger.Do(ctx, idempotency.Intent{
		Scope:   "bench.noop",
		Key:     "pi:" + pi,
		Request: map[string]any{"processInstance": pi},
		Task:    idempotency.TaskRef{Actor: t.WorkerID(), TaskID: t.ID(), ProcessInstanceID: pi, BusinessKey: t.BusinessKey()},
	}, idempotency.Effect{Dispatch: noopDispatch})
	switch {
	case err != nil:
		e.bad.Add(1)
		return err // already a failure outcome
	case out.Replayed:
		e.replayed.Add(1)
	default:
		e.confirmed.Add(1)
	}
	return nil
}

func noopDispatch(context.Context, string) (idempotency.Result, error) {
	return idempotency.Result{}, nil
}

func (e *effects) summary() string {
	return fmt.Sprintf("LEDGER %d %d %d", e.confirmed.Load(), e.replayed.Load(), e.bad.Load())
}

// vmRSS reads the process's resident set size in bytes from /proc/self/status, or 0.
func vmRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// transport is the one camunda7.New builds by default.
func transport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 32
	return tr
}

// countingTransport counts the requests the worker sends, by kind, and sums the time
// to the answer's headers of fetches and completes that succeeded.
type countingTransport struct {
	next                      http.RoundTripper
	fetches, completes, other atomic.Int64
	fetchTime, completeTime   atomic.Int64 // nanoseconds
	extends                   extendCount
}

// extendCount counts the extendLock calls the engine answered, per second sent.
type extendCount struct {
	mu          sync.Mutex
	n           int64
	first, last time.Time
	perSecond   map[int64]int
	took        time.Duration
}

func (e *extendCount) add(sent time.Time, took time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == 0 {
		e.first, e.perSecond = sent, map[int64]int{}
	}
	e.n++
	e.last = sent
	e.perSecond[sent.Unix()]++
	e.took += took
}

func (e *extendCount) summary() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	busiest := 0
	for _, k := range e.perSecond {
		busiest = max(busiest, k)
	}
	var first, last int64
	if e.n > 0 {
		first, last = e.first.UnixNano(), e.last.UnixNano()
	}
	return fmt.Sprintf("EXTENDS %d %d %d %d %d", e.n, first, last, busiest, e.took.Milliseconds())
}

func (t *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	var n, d *atomic.Int64
	switch p := r.URL.Path; {
	case strings.HasSuffix(p, "/extendLock"):
		t.other.Add(1)
		start := time.Now()
		resp, err := t.next.RoundTrip(r)
		if err == nil && resp.StatusCode/100 == 2 {
			t.extends.add(start, time.Since(start))
		}
		return resp, err
	case strings.HasSuffix(p, "/fetchAndLock"):
		n, d = &t.fetches, &t.fetchTime
	case strings.HasSuffix(p, "/complete"):
		n, d = &t.completes, &t.completeTime
	default:
		t.other.Add(1)
		return t.next.RoundTrip(r)
	}
	n.Add(1)
	start := time.Now()
	resp, err := t.next.RoundTrip(r)
	if err == nil && resp.StatusCode/100 == 2 {
		d.Add(int64(time.Since(start)))
	}
	return resp, err
}

// lineWriter writes whole lines to an unbuffered file, one write per line, so the
// driver reading the pipe never sees two handlers' lines interleaved.
type lineWriter struct {
	mu sync.Mutex
	f  *os.File
}

func (w *lineWriter) line(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.f.WriteString(s + "\n")
}

// slots integrates the worker's free handler slots over time, from the first task
// starting to the last one ending, and sums its polls: with the handler's run time and
// the completes' latency (REQUESTS) it says where the slots' time went (running the
// handler, reporting, or free while the fetch loop waits for the engine's answer).
type slots struct {
	tasks.NopObserver
	max int

	mu            sync.Mutex
	first, last   time.Time
	free          int
	freeTime      time.Duration // free slots × time, from first to last
	polls, polled int64
	pollTime      time.Duration
	seen          bool

	extended, extendFailed, lost int64
	lateness                     []time.Duration // of every extension sent, 0 when sent early
}

func (s *slots) LockExtended(_ string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.extendFailed++
		return
	}
	s.extended++
}

// Handled counts the tasks whose lock was lost while their handler ran. The observer's
// LockLost would also count an extension that, racing the task's own complete, found
// the task gone: a task this worker completed, its lock never lost.
func (s *slots) Handled(_ string, outcome tasks.Outcome, _ string, _ time.Duration) {
	if outcome != tasks.OutcomeLockLost {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lost++
}

// sent is the lock scheduler's OnSend.
func (s *slots) sent(lateness time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lateness = append(s.lateness, max(lateness, 0))
}

// locks is the LOCKS line.
func (s *slots) locks(maxInFlight int64) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := slices.Clone(s.lateness)
	slices.Sort(l)
	q := func(p float64) int64 {
		if len(l) == 0 {
			return 0
		}
		return l[min(len(l)-1, int(p*float64(len(l))))].Microseconds()
	}
	return fmt.Sprintf("LOCKS %d %d %d %d %d %d %d %d", s.extended, s.extendFailed, s.lost, len(l), q(0.5), q(0.99), q(1), maxInFlight)
}

func (s *slots) Slots(_ string, _ int, free int) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.seen {
		s.first, s.seen = now, true
	} else {
		s.freeTime += time.Duration(s.free) * now.Sub(s.last)
	}
	s.free, s.last = free, now
}

func (s *slots) Polled(n int, latency time.Duration, err error) {
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.polls++
	s.polled += int64(n)
	s.pollTime += latency
}

func (s *slots) summary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("SLOTS %d %d %d %d %d %d", s.last.Sub(s.first).Milliseconds(), s.freeTime.Milliseconds(),
		s.polls, s.polled, s.pollTime.Milliseconds(), s.max)
}
