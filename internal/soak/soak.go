// Package soak runs the seeded SIGKILL soak: several real worker processes serve the
// demo topics while a killer SIGKILLs them at random and failpoints kill them at the
// ledger's crash points; a supervisor restarts them; afterwards an oracle checks the
// invariants over every invoice: no double charge, the ledger and the provider agree,
// the ledger and the engine agree, every instance ended, only legal transitions
// (package internal/oracle, shared with the crash-point scenarios).
package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failpoint"
	"github.com/extworker/extworker/fakeprovider"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/oracle"
)

// Demo process facts the soak relies on (cmd/extworker/demo.go).
const (
	processKey   = "extworker-demo-invoice"
	declineAbove = 10_000_00
)

// Config is one soak run.
type Config struct {
	Binary      string        // the extworker binary
	EngineURL   string        // the engine's REST root
	DatabaseURL string        // the ledger database
	Instances   int           // invoices to start
	Workers     int           // worker processes
	KillEvery   time.Duration // mean time between random kills
	MinKills    int           // kills (random plus failpoint) the run must reach before the killer stops
	Seed        uint64        // seeds every random choice; printed for replay
	Timeout     time.Duration // the whole run, drain included
	LogDir      string        // worker logs
	// PGRestarts is how many times PostgreSQL (ledger and engine database alike) is
	// restarted with `pg_ctlcluster ... restart -m immediate` during the kills.
	PGRestarts int
	// EngineRestarts is how many times the engine is stopped (SIGTERM to whatever listens
	// on its port) and started again with EngineUpScript during the kills.
	EngineRestarts int
	// EngineUpScript starts the engine (testenv/engine-up.sh, run with ENGINE_PORT set).
	EngineUpScript string
}

// Result is what happened.
type Result struct {
	Seed                                  uint64
	Instances, Paid, Declined             int
	RandomKills, FailpointKills, Restarts int
	PGRestarts, EngineRestarts            int
	Charges, ProviderRequests             int
	Took                                  time.Duration
	Violations                            []string
}

// Run runs the soak and checks the invariants; the error lists every violation.
func Run(ctx context.Context, cfg Config, out io.Writer) (Result, error) {
	res := Result{Seed: cfg.Seed, Instances: cfg.Instances}
	fmt.Fprintf(out, "soak: seed %d (replay with -seed %d), %d instances, %d workers, a kill every ~%v\n",
		cfg.Seed, cfg.Seed, cfg.Instances, cfg.Workers, cfg.KillEvery)
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	start := time.Now()

	c, err := camunda7.New(camunda7.Config{BaseURL: cfg.EngineURL})
	if err != nil {
		return res, err
	}
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	// The seed decides every random choice; the nonce keeps a replay's invoices and ledger
	// rows apart from the earlier run's.
	nonce := time.Now().UnixNano() % 1_000_000_000
	ns := fmt.Sprintf("soak-%d-%d", cfg.Seed, nonce)
	ledger, err := idempotency.New(pool, idempotency.Config{Namespace: ns})
	if err != nil {
		return res, err
	}
	pay, err := fakeprovider.Start(declineAbove)
	if err != nil {
		return res, err
	}
	defer pay.Close()
	env := append(os.Environ(), "EXTWORKER_ENGINE_URL="+cfg.EngineURL, "EXTWORKER_DATABASE_URL="+cfg.DatabaseURL,
		"EXTWORKER_LEDGER_NAMESPACE="+ns, "EXTWORKER_PROVIDER_URL="+pay.URL(), "EXTWORKER_LOCK_DURATION=3s",
		"EXTWORKER_LEDGER_LEASE=3s", "EXTWORKER_LONG_POLL=1s", "EXTWORKER_LOG_LEVEL=warn", "EXTWORKER_HTTP_ADDR=off",
		"EXTWORKER_SHUTDOWN_GRACE=5s", "EXTWORKER_MAX_CONCURRENCY=8")
	for _, sub := range [][]string{{"migrate"}, {"demo", "-deploy-only"}} {
		cmd := exec.CommandContext(ctx, cfg.Binary, sub...)
		cmd.Env = env
		if b, err := cmd.CombinedOutput(); err != nil {
			return res, fmt.Errorf("extworker %s: %v: %s", sub[0], err, b)
		}
	}

	// Invoices: one in ten declined by the provider; some answers lost, some requests dropped.
	run := fmt.Sprintf("SOAK-%d-%d", cfg.Seed, nonce)
	type inv struct {
		id, instance string
		amount       int64
		declined     bool
	}
	invoices := make([]inv, 0, cfg.Instances)
	for i := 0; i < cfg.Instances; i++ {
		id := fmt.Sprintf("%s-%05d", run, i)
		amount := int64(1000 + rng.IntN(5000))
		declined := i%10 == 4
		if declined {
			amount = declineAbove + 1
		}
		switch rng.IntN(20) {
		case 0:
			pay.Script(id, fakeprovider.LoseAnswer)
		case 1:
			pay.Script(id, fakeprovider.DropBeforeAccept)
		}
		invoices = append(invoices, inv{id: id, amount: amount, declined: declined})
		if declined {
			res.Declined++
		} else {
			res.Paid++
		}
	}

	// Supervisor: keep cfg.Workers processes alive; the killer and failpoints end them.
	var (
		mu       sync.Mutex
		procs    = make([]*exec.Cmd, cfg.Workers)
		stop     atomic.Bool
		draining atomic.Bool // no more failpoints on restart
		randomK  atomic.Int64
		fpK      atomic.Int64
		starts   atomic.Int64
		wg       sync.WaitGroup
	)
	points := []string{failpoint.AfterPrepared, failpoint.AfterDispatchMark, failpoint.AfterProviderAnswer,
		failpoint.AfterConfirm, failpoint.BeforeComplete, failpoint.InExtension}
	fpRand := rand.New(rand.NewPCG(cfg.Seed+1, cfg.Seed+2))
	for slot := 0; slot < cfg.Workers; slot++ {
		wg.Add(1)
		go func(slot int) {
			defer wg.Done()
			for gen := 0; !stop.Load() && ctx.Err() == nil; gen++ {
				wenv := append(append([]string{}, env...), fmt.Sprintf("EXTWORKER_WORKER_ID=soak-%d-%d-%d", cfg.Seed, slot, gen))
				mu.Lock()
				point := ""
				if gen > 0 && !draining.Load() && fpRand.IntN(3) == 0 { // about every third restart carries a failpoint
					point = fmt.Sprintf("%s@%d", points[fpRand.IntN(len(points))], 1+fpRand.IntN(10))
					wenv = append(wenv, failpoint.Env+"="+point)
				}
				mu.Unlock()
				logf, err := os.Create(filepath.Join(cfg.LogDir, fmt.Sprintf("worker-%d-%d.log", slot, gen)))
				if err != nil {
					return
				}
				cmd := exec.Command(cfg.Binary, "run")
				cmd.Env, cmd.Stdout, cmd.Stderr = wenv, logf, logf
				if err := cmd.Start(); err != nil {
					logf.Close()
					return
				}
				starts.Add(1)
				mu.Lock()
				procs[slot] = cmd
				mu.Unlock()
				err = cmd.Wait()
				logf.Close()
				mu.Lock()
				procs[slot] = nil
				mu.Unlock()
				var exit *exec.ExitError
				if errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL && point != "" {
					// Killed at its failpoint, unless the killer got there first.
					if !killedByKiller(cmd) {
						fpK.Add(1)
					}
				}
				t := time.NewTimer(time.Duration(rng2(cfg.Seed, gen, slot)) * time.Millisecond) // restart jitter 0-500ms
				<-t.C
			}
		}(slot)
	}

	// Start the instances at a controlled rate, spread over the time the kills need.
	spread := time.Duration(cfg.MinKills) * cfg.KillEvery * 6 / 5
	every := spread / time.Duration(max(cfg.Instances, 1))
	var allStarted atomic.Bool
	startErr := make(chan error, 1)
	go func() {
		t := time.NewTicker(max(every, time.Millisecond))
		defer t.Stop()
		for i := range invoices {
			vars := camunda7.Variables{"invoiceId": camunda7.StringVar(invoices[i].id), "amountCents": camunda7.LongVar(invoices[i].amount)}
			var pi *camunda7.ProcessInstance
			var err error
			for try := 0; try < 120; try++ { // a database restart makes the engine refuse for a moment
				pi, err = c.StartProcess(ctx, processKey, camunda7.StartProcessRequest{BusinessKey: invoices[i].id, Variables: vars})
				if errors.Is(err, camunda7.ErrOutcomeUnknown) {
					// The answer was lost (the engine or its database went away): ask whether
					// the instance exists before starting it again.
					if found, ferr := c.HistoricProcessInstances(ctx, url.Values{"processInstanceBusinessKey": {invoices[i].id}}); ferr == nil {
						if len(found) > 0 {
							pi, err = &camunda7.ProcessInstance{ID: found[0].ID}, nil
						} else {
							err = fmt.Errorf("%w (not started: safe to send again)", camunda7.ErrNotSent)
						}
					}
				}
				if err == nil || !camunda7.SafeToRetry(err) || ctx.Err() != nil {
					break
				}
				backoff := time.NewTimer(250 * time.Millisecond)
				<-backoff.C
			}
			if err != nil {
				startErr <- fmt.Errorf("start instance %d: %w", i, err)
				return
			}
			invoices[i].instance = pi.ID
			<-t.C
		}
		allStarted.Store(true)
		startErr <- nil
	}()

	// Killer: SIGKILL a random live worker every ~KillEvery until enough kills happened
	// and most work is done; then drain without faults.
	finished := func() int {
		n, err := c.HistoricProcessInstanceCount(ctx, url.Values{"processDefinitionKey": {processKey},
			"processInstanceBusinessKeyLike": {run + "%"}, "finished": {"true"}})
		if err != nil {
			return -1
		}
		return n
	}
	kill := time.NewTimer(cfg.KillEvery)
	defer kill.Stop()
	for ctx.Err() == nil {
		<-kill.C
		kills := int(randomK.Load() + fpK.Load())
		if allStarted.Load() && (kills >= cfg.MinKills || finished() >= cfg.Instances) {
			break
		}
		select {
		case err := <-startErr:
			if err != nil {
				stop.Store(true)
				return res, err
			}
			startErr <- nil // all started; seen again below
		default:
		}
		if res.PGRestarts < cfg.PGRestarts && kills >= cfg.MinKills*(res.PGRestarts+1)/(cfg.PGRestarts+1) {
			out, err := exec.CommandContext(ctx, "bash", "-c",
				`v=$(ls /usr/lib/postgresql | sort -n | tail -1); pg_ctlcluster "$v" main restart -m immediate`).CombinedOutput()
			if err != nil {
				return res, fmt.Errorf("restart PostgreSQL: %v: %s", err, out)
			}
			res.PGRestarts++
			fmt.Fprintf(os.Stdout, "soak: PostgreSQL restarted (immediate) after %d kills\n", kills)
		}
		if res.EngineRestarts < cfg.EngineRestarts && kills >= cfg.MinKills*(2*res.EngineRestarts+1)/(2*cfg.EngineRestarts+2) {
			t0 := time.Now()
			if err := restartEngine(ctx, cfg); err != nil {
				return res, err
			}
			res.EngineRestarts++
			fmt.Fprintf(os.Stdout, "soak: engine restarted after %d kills (%.1fs)\n", kills, time.Since(t0).Seconds())
		}
		mu.Lock()
		var live []*exec.Cmd
		for _, p := range procs {
			if p != nil && p.Process != nil {
				live = append(live, p)
			}
		}
		if len(live) > 0 {
			victim := live[rng.IntN(len(live))]
			markKilledByKiller(victim)
			_ = victim.Process.Signal(syscall.SIGKILL)
			randomK.Add(1)
		}
		mu.Unlock()
		kill.Reset(cfg.KillEvery/2 + time.Duration(rng.Int64N(int64(cfg.KillEvery))))
	}
	if err := <-startErr; err != nil {
		stop.Store(true)
		return res, err
	}
	// Drain: no more faults until every instance ended.
	draining.Store(true)
	tick := time.NewTicker(500 * time.Millisecond)
	for finished() < cfg.Instances && ctx.Err() == nil {
		<-tick.C
	}
	tick.Stop()
	stop.Store(true)
	mu.Lock()
	for _, p := range procs {
		if p != nil && p.Process != nil {
			_ = p.Process.Signal(syscall.SIGTERM)
		}
	}
	mu.Unlock()
	wg.Wait()
	res.Took = time.Since(start)
	res.RandomKills, res.FailpointKills, res.Restarts = int(randomK.Load()), int(fpK.Load()), int(starts.Load())-cfg.Workers
	res.ProviderRequests = int(pay.Requests())

	// The oracle.
	octx, ocancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer ocancel()
	res.Charges = len(pay.Charges())
	violate := func(format string, args ...any) {
		res.Violations = append(res.Violations, fmt.Sprintf(format, args...))
	}
	if k := res.RandomKills + res.FailpointKills; k < cfg.MinKills {
		violate("the run reached %d kills, short of the %d asked for", k, cfg.MinKills)
	}
	if n := finished(); n != cfg.Instances {
		violate("I3: %d of %d instances ended (within %v)", n, cfg.Instances, cfg.Timeout)
	}
	all := pay.Charges()
	for _, in := range invoices {
		res.Violations = append(res.Violations, oracle.Check(octx, ledger, all,
			oracle.Expect{Scope: "payment.collect", Key: "invoice:" + in.id + ":v1", Invoice: in.id, Declined: in.declined})...)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "seed\tinstances\tpaid\tdeclined\trandom kills\tfailpoint kills\trestarts\tPG restarts\tengine restarts\tprovider requests\tcharges\ttook\tviolations\n")
	fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.1fs\t%d\n", res.Seed, res.Instances, res.Paid, res.Declined,
		res.RandomKills, res.FailpointKills, res.Restarts, res.PGRestarts, res.EngineRestarts, res.ProviderRequests, res.Charges, res.Took.Seconds(), len(res.Violations))
	tw.Flush()
	if len(res.Violations) > 0 {
		for _, v := range res.Violations[:min(len(res.Violations), 20)] {
			fmt.Fprintln(out, "VIOLATION", v)
		}
		return res, fmt.Errorf("soak: %d invariant violations (seed %d)", len(res.Violations), cfg.Seed)
	}
	return res, nil
}

var killed sync.Map // *exec.Cmd -> true when the killer sent the signal

func markKilledByKiller(c *exec.Cmd) { killed.Store(c, true) }
func killedByKiller(c *exec.Cmd) bool {
	_, ok := killed.Load(c)
	return ok
}

// rng2 is the restart jitter, derived from the seed so a replay waits the same.
func rng2(seed uint64, gen, slot int) int64 {
	r := rand.New(rand.NewPCG(seed+uint64(gen), uint64(slot)))
	return r.Int64N(500)
}

// restartEngine stops the engine listening on the engine URL's port and starts it again.
func restartEngine(ctx context.Context, cfg Config) error {
	u, err := url.Parse(cfg.EngineURL)
	if err != nil {
		return err
	}
	port := u.Port()
	stop := exec.CommandContext(ctx, "bash", "-c", `pid=$(ss -ltnpH "sport = :`+port+`" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
		[ -n "$pid" ] || exit 0
		kill "$pid"; for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.5; done; kill -9 "$pid"`)
	if out, err := stop.CombinedOutput(); err != nil {
		return fmt.Errorf("stop the engine on port %s: %v: %s", port, err, out)
	}
	up := exec.CommandContext(ctx, "bash", cfg.EngineUpScript)
	up.Env = append(os.Environ(), "ENGINE_PORT="+port)
	if out, err := up.CombinedOutput(); err != nil {
		return fmt.Errorf("start the engine on port %s: %v: %s", port, err, out)
	}
	return nil
}
