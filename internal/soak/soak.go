// Package soak runs the seeded SIGKILL soak (docs/reliability.md, The soak): real worker
// processes serve the demo topics while a killer SIGKILLs them at random and failpoints
// kill them at the ledger's crash points, PostgreSQL and the engine restart, toxiproxy
// windows slow and cut the workers' link to the fake provider, and the provider itself
// declines, rate-limits, stores 500s, drops requests and loses answers. A supervisor
// restarts the workers.
//
// Afterwards, with faults off and every instance settled, the recorder saves the run's
// history (the provider's request log, the ledger's rows and events, the engine's
// history, the worker logs) under Config.LogDir/<seed>-<time>/, and the oracle (package
// internal/oracle, shared with the crash-point scenarios) checks I1-I9 over every
// invoice: no double charge, digests intact, no lost instance, ledger, provider and
// engine in agreement, no blind retry, legal transitions only, nothing left in flight,
// no canary secret anywhere. report.txt says what was injected and what came of it.
//
// Two tiers (tier.go): the workers at the daemon's shipped settings (Config.Defaults), or
// with short timeouts; either way the harness's timing is derived from what the worker
// binary says it runs with.
package soak

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/oracle"
)

// Demo process facts the soak relies on (cmd/extworker/demo.go).
const (
	processKey     = "extworker-demo-invoice"
	errorEndEvent  = "invoiceDeclined"
	declineAbove   = 10_000_00
	providerFaults = "rate_limited 2%, stored_500 1%, lose_answer 0.5%, drop_before_accept 0.5%, delay past the lock 1%"
)

// Config is one soak run.
type Config struct {
	Binary      string        // the extworker binary
	EngineURL   string        // the engine's REST root
	DatabaseURL string        // the ledger database
	Instances   int           // invoices to start
	Workers     int           // worker processes
	KillEvery   time.Duration // mean time between random kills; 0: half the workers' lock (Timing)
	MinKills    int           // kills (random plus failpoint) the run must reach before the killer stops
	Seed        uint64        // seeds every random choice; printed for replay
	Timeout     time.Duration // the whole run, drain included
	// Defaults runs the workers at the daemon's shipped settings (the defaults tier, see
	// tier.go): no lock, long poll, lease, timeout or concurrency is set for them. false:
	// the short-timeouts tier (shortOverrides).
	Defaults bool
	// LogDir holds the run directories: each run records under LogDir/<seed>-<time>/.
	LogDir string
	// KeepHistory keeps a passing run's whole history; by default a passing run keeps
	// only report.txt and the tail of each worker log (a failing run keeps everything).
	KeepHistory bool
	// PGRestarts is how many times PostgreSQL (ledger and engine database alike) is
	// restarted with `pg_ctlcluster ... restart -m immediate` during the kills.
	PGRestarts int
	// EngineRestarts is how many times the engine is stopped (SIGTERM to whatever listens
	// on its port) and started again with EngineUpScript during the kills.
	EngineRestarts int
	// EngineUpScript starts the engine (services/engine-up.sh, run with ENGINE_PORT set).
	EngineUpScript string
	// EngineUser and EnginePassword are HTTP basic credentials for an engine with REST
	// authentication on (the spec's harness; `make up` runs one on 8081). The password is
	// then one of I9's canaries. Empty: the engine needs none, and the workers are given
	// a canary password it ignores.
	EngineUser, EnginePassword string
	// EngineLatencyWindow, if positive, routes the workers' engine traffic through a
	// proxy and adds 500 ms of latency to it for this long during the kills (the long
	// tier's). 0: the workers talk to the engine directly.
	EngineLatencyWindow time.Duration
	// Broker, if set, carries the demo's events: the workers publish invoice.paid through
	// the outbox and start the shipping process from it through the inbox, the killer
	// arms the events' crash points too, a duplicator sends some events again, and the
	// oracle checks I10 and I11 (events.go). nil: no events.
	Broker Broker
	// BrokerRestarts is how many times the broker is killed (SIGKILL) and started again
	// during the kills.
	BrokerRestarts int
	// Kafka says the Broker is Kafka: the workers run with the demo's Kafka setting
	// (EXTWORKER_DEMO_EVENTS=kafka, the relay publishing to the topic invoice.paid, the
	// inbox consuming it in the group extworker-demo.shipping), and the report counts the
	// group's rebalances it saw. false: RabbitMQ.
	Kafka bool
}

// Result is what happened.
type Result struct {
	Seed                                  uint64
	Instances, Paid, Declined             int
	RandomKills, FailpointKills, Restarts int
	PGRestarts, EngineRestarts            int
	BrokerRestarts                        int
	Charges, ProviderRequests             int
	// Took is the run until the workers stopped: Starts (until the last instance
	// started) and Kills (until the drain began) are in it, as is Drain (until every
	// instance settled). Check is the recording and the oracle after it.
	Took, Starts, Kills, Drain, Check time.Duration
	// Faults counts the faults injected, by kind (kills by crash point, restarts, toxic
	// windows, provider faults).
	Faults map[string]int
	// Engine is I3's count of the run's instances.
	Engine oracle.InstanceCounts
	// Leaks is how many canary occurrences I9 found.
	Leaks int
	// HeldDeclined counts invoices to decline that the provider left undecidable (a 500
	// stored under the key before it could decline): held with an incident.
	HeldDeclined int
	// Tier is "defaults" or "short" (tier.go); Settings are what the workers ran with,
	// as the worker binary reported them; Timing is what the harness derived from them.
	Tier     string
	Settings Settings
	Timing   Timing
	// RunDir holds the run's history and report.
	RunDir     string
	Violations []string
	// Events is what the events did (with a Broker).
	Events *eventCounts
}

// invoice is one business command of the run.
type invoice struct {
	id, instance string
	amount       int64
	declined     bool
}

// faultCounter counts injected faults by kind; safe for concurrent use.
type faultCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (f *faultCounter) add(kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[string]int{}
	}
	f.n[kind]++
}

func (f *faultCounter) snapshot() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.n))
	for k, v := range f.n {
		out[k] = v
	}
	return out
}

// Run runs the soak and checks the invariants; the error lists every violation.
func Run(ctx context.Context, cfg Config, out io.Writer) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	r := &runner{cfg: cfg, out: &lockedWriter{w: out}, start: time.Now(),
		rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		res: Result{Seed: cfg.Seed, Instances: cfg.Instances, Tier: tierName(cfg.Defaults)}, restartErr: make(chan error, 1)}
	defer r.undo()
	err := r.run(ctx)
	return r.res, err
}

// runner is one run under way: what its stages share. The stages are I/O; what they
// decide comes from schedule.go.
type runner struct {
	cfg    Config
	out    io.Writer
	res    Result
	rng    *rand.Rand // the schedule's: invoice amounts, toxic windows, the killer's victims and pauses
	start  time.Time
	faults faultCounter
	exits  []func() // undone in reverse order when Run returns

	c          *admin.Client
	pool       *pgxpool.Pool
	ledger     *idempotency.Ledger
	pay        *fakeprovider.Server
	nonce      int64  // keeps a replay's invoices and ledger rows apart from the earlier run's
	ns, prefix string // the ledger namespace; the invoices' ids and business keys begin with prefix
	provider   *toxiProxy
	engine     *toxiProxy // nil: the workers talk to the engine directly
	env        []string   // the workers' environment
	secrets    []string   // I9's canaries
	events     *tap       // nil: no broker
	invoices   []invoice
	sup        *supervisor

	allStarted, windowsDone atomic.Bool
	restarting              atomic.Bool     // a batch of service restarts is under way (startRestarts)
	restarts                sync.WaitGroup  // the restarts under way
	restartErr              chan error      // the restarts' first error
	startsTook              atomic.Int64    // from the run's start until the last instance started
	ours                    map[string]bool // the run's instance ids, once all have started
}

// onExit registers an undo for when Run returns (the last registered runs first).
func (r *runner) onExit(f func()) { r.exits = append(r.exits, f) }

func (r *runner) undo() {
	for i := len(r.exits) - 1; i >= 0; i-- {
		r.exits[i]()
	}
}

func (r *runner) logf(format string, args ...any) { fmt.Fprintf(r.out, format+"\n", args...) }

// run sets the run up, starts the workers and the instances, injects the faults until
// the kill phase is over, drains, stops the workers, and checks the history.
func (r *runner) run(ctx context.Context) error {
	for _, step := range []func(context.Context) error{r.prepare, r.startProvider, r.connect, r.startTap, r.migrate} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	r.invoices = planInvoices(r.rng, r.prefix, r.cfg.Instances)
	for _, inv := range r.invoices {
		if inv.declined {
			r.res.Declined++
		} else {
			r.res.Paid++
		}
	}
	r.sup = newSupervisor(r.cfg, r.env, r.res.RunDir, &r.faults, r.events != nil)
	r.sup.start(ctx)
	r.onExit(r.sup.kill) // on an early return, stop the workers too
	r.onExit(r.restarts.Wait)
	phase, every := startPacing(r.cfg.MinKills, r.res.Timing.KillEvery, r.cfg.Instances)
	startErr := r.startInstances(ctx, every)
	r.startWindows(ctx, phase)
	stopDuplicator := r.startDuplicator(ctx)
	if err := r.killPhase(ctx, startErr); err != nil {
		return err
	}
	if err := <-startErr; err != nil {
		return err
	}
	drainStart := r.drain(ctx)
	eventsDrain := r.drainEvents(ctx, stopDuplicator)
	r.stopWorkers(drainStart)

	// Record the history, then check it.
	octx, ocancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer ocancel()
	return check(octx, r.cfg, &r.res, checkInput{c: r.c, pool: r.pool, ledger: r.ledger, pay: r.pay, ns: r.ns, run: r.prefix,
		invoices: r.invoices, start: r.start, faults: r.faults.snapshot(), canaries: r.secrets, events: r.events, eventsDrain: eventsDrain}, r.out)
}
