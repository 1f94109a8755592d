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
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/failpoint"
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
	res := Result{Seed: cfg.Seed, Instances: cfg.Instances, Tier: tierName(cfg.Defaults)}
	out = &lockedWriter{w: out}
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	start := time.Now()
	var faults faultCounter

	// What the workers will run with, from the binary itself; the harness's timing
	// follows from it.
	var err error
	res.Settings, err = readSettings(ctx, cfg.Binary, workerEnv(cfg.Defaults, "EXTWORKER_LOG_FORMAT=json"), cfg.Defaults)
	if err != nil {
		return res, err
	}
	res.Timing = deriveTiming(res.Settings, cfg.KillEvery)
	tm := res.Timing
	fmt.Fprintf(out, "soak: seed %d (replay with -seed %d), %s tier, %d instances, %d workers, a kill every ~%v\n",
		cfg.Seed, cfg.Seed, res.Tier, cfg.Instances, cfg.Workers, tm.KillEvery)
	fmt.Fprintf(out, "soak: workers run with %s; provider delay fault %v, drain allowed %v\n", res.Settings, tm.ProviderDelay, tm.DrainAllowed)

	res.RunDir = filepath.Join(cfg.LogDir, fmt.Sprintf("%d-%s", cfg.Seed, start.Format("20060102T150405")))
	if err = os.MkdirAll(res.RunDir, 0o755); err != nil {
		return res, fmt.Errorf("run directory: %w", err)
	}
	cc, err := camunda7.New(camunda7.Config{BaseURL: cfg.EngineURL, Username: cfg.EngineUser, Password: cfg.EnginePassword})
	if err != nil {
		return res, err
	}
	c := admin.New(cc)
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

	// The provider's fault mix (docs/reliability.md, The soak), per charge request, seeded;
	// declines are planted by amount below. The delay outlasts the lock and the point
	// where the worker gives up on the call (Timing.ProviderDelay), so the worker gives up
	// on an answer the provider then commits.
	pay, err := fakeprovider.StartWith(fakeprovider.Options{DeclineAboveCents: declineAbove, Seed: int64(cfg.Seed),
		SlowDelay: tm.ProviderDelay})
	if err != nil {
		return res, err
	}
	defer pay.Close()
	pay.ScriptRandom(0.02, fakeprovider.RateLimited)
	pay.ScriptRandom(0.01, fakeprovider.Stored500)
	pay.ScriptRandom(0.005, fakeprovider.LoseAnswer)
	pay.ScriptRandom(0.005, fakeprovider.DropBeforeAccept)
	pay.ScriptRandom(0.01, fakeprovider.Delay)

	// toxiproxy between the workers and the provider (and the engine, if asked).
	tox := newToxics()
	defer tox.close()
	provProxy, err := tox.proxy("provider", strings.TrimPrefix(pay.URL(), "http://"))
	if err != nil {
		return res, err
	}
	workerEngineURL := cfg.EngineURL
	var engineProxy *toxiProxy
	if cfg.EngineLatencyWindow > 0 {
		u, err := url.Parse(cfg.EngineURL)
		if err != nil {
			return res, err
		}
		if engineProxy, err = tox.proxy("engine", u.Host); err != nil {
			return res, err
		}
		u.Host = engineProxy.addr()
		workerEngineURL = u.String()
	}
	// The canaries travel in the credentials and URLs the workers are given (check.go).
	providerURL := "http://token:" + canaryProvider + "@" + provProxy.addr()
	dbURL, err := withQuery(cfg.DatabaseURL, "sslpassword", canaryDatabase)
	if err != nil {
		return res, err
	}
	secrets := canaries
	user, password := "soak", canaryEngine
	if cfg.EnginePassword != "" {
		user, password = cfg.EngineUser, cfg.EnginePassword
		secrets = append(secrets[:len(secrets):len(secrets)], cfg.EnginePassword)
	}
	// Where things are, logging and the operations endpoint (off: the workers share the
	// host); the tier decides the rest (tier.go).
	env := workerEnv(cfg.Defaults, "EXTWORKER_ENGINE_URL="+workerEngineURL, "EXTWORKER_ENGINE_USER="+user,
		"EXTWORKER_ENGINE_PASSWORD="+password, "EXTWORKER_DATABASE_URL="+dbURL,
		"EXTWORKER_LEDGER_NAMESPACE="+ns, "EXTWORKER_PROVIDER_URL="+providerURL,
		"EXTWORKER_LOG_LEVEL=info", "EXTWORKER_LOG_FORMAT=json", "EXTWORKER_HTTP_ADDR=off")
	var events *tap
	if cfg.Broker != nil {
		env = append(env, "EXTWORKER_AMQP_URL="+cfg.Broker.URL())
		// The tap is declared before any worker runs: it sees every event published.
		events = newTap(cfg.Broker.URL(), fmt.Sprintf("soak-tap-%d-%d", cfg.Seed, nonce))
		if err := events.declare(); err != nil {
			return res, fmt.Errorf("events: the broker at %s: %w", cfg.Broker.URL(), err)
		}
		tctx, tcancel := context.WithCancel(ctx)
		tapDone := make(chan struct{})
		go func() { events.run(tctx); close(tapDone) }()
		defer func() { tcancel(); <-tapDone }()
	}
	for _, sub := range [][]string{{"migrate"}, {"demo", "-deploy-only"}} {
		cmd := exec.CommandContext(ctx, cfg.Binary, sub...)
		cmd.Env = env
		if b, err := cmd.CombinedOutput(); err != nil {
			return res, fmt.Errorf("extworker %s: %v: %s", sub[0], err, b)
		}
	}

	// Invoices: one in twenty declined by the provider (by amount).
	run := fmt.Sprintf("SOAK-%d-%d", cfg.Seed, nonce)
	invoices := make([]invoice, 0, cfg.Instances)
	for i := 0; i < cfg.Instances; i++ {
		id := fmt.Sprintf("%s-%05d", run, i)
		amount := int64(1000 + rng.IntN(5000))
		declined := i%20 == 4
		if declined {
			amount = declineAbove + 1
			res.Declined++
		} else {
			res.Paid++
		}
		invoices = append(invoices, invoice{id: id, amount: amount, declined: declined})
	}

	// Supervisor: keep cfg.Workers processes alive; the killer and failpoints end them.
	var (
		mu       sync.Mutex
		procs    = make([]*exec.Cmd, cfg.Workers)
		byKiller = map[*exec.Cmd]bool{} // workers the killer sent SIGKILL; under mu
		stop     atomic.Bool
		draining atomic.Bool // no more failpoints on restart
		randomK  atomic.Int64
		fpK      atomic.Int64
		starts   atomic.Int64
		wg       sync.WaitGroup
	)
	points := []string{failpoint.AfterPrepared, failpoint.AfterDispatchMark, failpoint.AfterProviderAnswer,
		failpoint.AfterConfirm, failpoint.BeforeComplete, failpoint.InExtension}
	if events != nil {
		points = append(points, failpoint.OutboxBeforePublish, failpoint.OutboxAfterPublish, failpoint.InboxAfterEngine, failpoint.InboxAfterAck)
	}
	fpRand := rand.New(rand.NewPCG(cfg.Seed+1, cfg.Seed+2))
	// The failpoints rotate through the crash points: each restart that carries one
	// takes the point armed least often so far (ties in the order above), so every point
	// is armed about equally often whatever the run's length.
	armed := make([]int, len(points))
	nextPoint := func() string {
		best := 0
		for i := range points {
			if armed[i] < armed[best] {
				best = i
			}
		}
		armed[best]++
		return points[best]
	}
	for slot := 0; slot < cfg.Workers; slot++ {
		wg.Add(1)
		go func(slot int) {
			defer wg.Done()
			for gen := 0; !stop.Load() && ctx.Err() == nil; gen++ {
				wenv := append(append([]string{}, env...), fmt.Sprintf("EXTWORKER_WORKER_ID=soak-%d-%d-%d", cfg.Seed, slot, gen))
				mu.Lock()
				point := ""
				if gen > 0 && !draining.Load() && fpRand.IntN(2) == 0 { // about every second restart carries a failpoint
					point = fmt.Sprintf("%s@%d", nextPoint(), 1+fpRand.IntN(10))
					wenv = append(wenv, failpoint.Env+"="+point)
				}
				mu.Unlock()
				logf, err := os.Create(filepath.Join(res.RunDir, fmt.Sprintf("worker-%d-%03d.log", slot, gen)))
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
				killedByKiller := byKiller[cmd]
				delete(byKiller, cmd)
				mu.Unlock()
				var exit *exec.ExitError
				if errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL && point != "" {
					// Killed at its failpoint, unless the killer got there first.
					if !killedByKiller {
						fpK.Add(1)
						name, _, _ := strings.Cut(point, "@")
						faults.add("failpoint kill " + name)
					}
				}
				time.Sleep(time.Duration(rng2(cfg.Seed, gen, slot)) * time.Millisecond) // restart jitter 0-500ms
			}
		}(slot)
	}
	defer func() { // on an early return, stop the workers too
		stop.Store(true)
		signalAll(&mu, procs, syscall.SIGKILL)
		wg.Wait()
	}()

	// Start the instances at a controlled rate, spread over the time the kills need.
	phase := time.Duration(cfg.MinKills) * tm.KillEvery
	spread := phase * 6 / 5
	every := spread / time.Duration(max(cfg.Instances, 1))
	var (
		allStarted atomic.Bool
		startsTook atomic.Int64 // from the run's start until the last instance started
	)
	startErr := make(chan error, 1)
	go func() {
		t := time.NewTicker(max(every, time.Millisecond))
		defer t.Stop()
		for i := range invoices {
			id, err := startInvoice(ctx, c, invoices[i])
			if err != nil {
				startErr <- fmt.Errorf("start instance %d: %w", i, err)
				return
			}
			invoices[i].instance = id
			<-t.C
		}
		startsTook.Store(int64(time.Since(start)))
		allStarted.Store(true)
		startErr <- nil
	}()

	// Toxic windows at seeded times during the kills.
	windows := toxicWindows(rng, phase, provProxy, engineProxy, cfg.EngineLatencyWindow)
	var windowsDone atomic.Bool
	windowsOver := make(chan struct{})
	wctx, wcancel := context.WithCancel(ctx)
	go func() {
		defer close(windowsOver)
		runWindows(wctx, start, windows, faults.add, func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) })
		windowsDone.Store(true)
	}()
	defer func() { wcancel(); <-windowsOver }() // on an early return, lift the toxics at once

	// settled counts the run's instances that have ended or hold an incident: once all
	// have, nothing more will happen without an operator. Only called after every
	// instance has started.
	var ours map[string]bool
	settled := func() int {
		if ours == nil {
			ours = make(map[string]bool, len(invoices))
			for _, in := range invoices {
				ours[in.instance] = true
			}
		}
		n, err := c.HistoricProcessInstanceCount(ctx, url.Values{"processDefinitionKey": {processKey},
			"processInstanceBusinessKeyLike": {run + "%"}, "finished": {"true"}})
		if err != nil {
			return -1
		}
		inc, err := c.Incidents(ctx, url.Values{"processDefinitionKeyIn": {processKey}})
		if err != nil {
			return -1
		}
		held := map[string]bool{}
		for _, i := range inc {
			if ours[i.ProcessInstanceID] {
				held[i.ProcessInstanceID] = true
			}
		}
		return n + len(held)
	}

	// The duplicator: during the kills, an event the broker delivered is sent again now
	// and then, byte for byte, as a producer's retry would.
	dctx, dcancel := context.WithCancel(ctx)
	dupDone := make(chan struct{})
	if events != nil {
		go func() {
			events.duplicate(dctx, rand.New(rand.NewPCG(cfg.Seed+3, cfg.Seed+4)), tm.KillEvery)
			close(dupDone)
		}()
	} else {
		close(dupDone)
	}
	defer func() { dcancel(); <-dupDone }()

	// Killer: SIGKILL a random live worker every ~KillEvery until enough kills happened,
	// the toxic windows are over and most work is done; then drain without faults.
	kill := time.NewTimer(tm.KillEvery)
	defer kill.Stop()
	for ctx.Err() == nil {
		<-kill.C
		kills := int(randomK.Load() + fpK.Load())
		if allStarted.Load() && windowsDone.Load() && (kills >= cfg.MinKills || settled() >= cfg.Instances) {
			break
		}
		select {
		case err := <-startErr:
			if err != nil {
				return res, err
			}
			startErr <- nil // all started; seen again below
		default:
		}
		if res.PGRestarts < cfg.PGRestarts && kills >= cfg.MinKills*(res.PGRestarts+1)/(cfg.PGRestarts+1) {
			b, err := exec.CommandContext(ctx, "bash", "-c",
				`v=$(ls /usr/lib/postgresql | sort -n | tail -1); pg_ctlcluster "$v" main restart -m immediate`).CombinedOutput()
			if err != nil {
				return res, fmt.Errorf("restart PostgreSQL: %v: %s", err, b)
			}
			res.PGRestarts++
			faults.add("PostgreSQL restart (immediate)")
			fmt.Fprintf(out, "soak: PostgreSQL restarted (immediate) after %d kills\n", kills)
		}
		if res.EngineRestarts < cfg.EngineRestarts && kills >= cfg.MinKills*(2*res.EngineRestarts+1)/(2*cfg.EngineRestarts+2) {
			t0 := time.Now()
			if err := restartEngine(ctx, cfg); err != nil {
				return res, err
			}
			res.EngineRestarts++
			faults.add("engine restart")
			fmt.Fprintf(out, "soak: engine restarted after %d kills (%.1fs)\n", kills, time.Since(t0).Seconds())
		}
		if cfg.Broker != nil && res.BrokerRestarts < cfg.BrokerRestarts && kills >= cfg.MinKills*(res.BrokerRestarts+1)/(cfg.BrokerRestarts+1) {
			t0 := time.Now()
			if err := cfg.Broker.Kill(); err != nil {
				return res, fmt.Errorf("kill the broker: %w", err)
			}
			if err := cfg.Broker.Restart(); err != nil {
				return res, fmt.Errorf("restart the broker: %w", err)
			}
			res.BrokerRestarts++
			faults.add("broker SIGKILL and restart")
			fmt.Fprintf(out, "soak: broker killed and started again after %d kills (%.1fs)\n", kills, time.Since(t0).Seconds())
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
			byKiller[victim] = true
			_ = victim.Process.Signal(syscall.SIGKILL)
			randomK.Add(1)
			faults.add("random SIGKILL")
		}
		mu.Unlock()
		kill.Reset(tm.KillEvery/2 + time.Duration(rng.Int64N(int64(tm.KillEvery))))
	}
	if err := <-startErr; err != nil {
		return res, err
	}
	// Drain: no more faults (no failpoints, no provider faults, the windows are over)
	// until every instance has ended or holds an incident.
	drainStart := time.Now()
	draining.Store(true)
	pay.ClearFaults()
	tick := time.NewTicker(500 * time.Millisecond)
	for settled() < cfg.Instances && ctx.Err() == nil {
		<-tick.C
	}
	tick.Stop()
	res.Drain = time.Since(drainStart)
	var eventsDrain time.Duration
	if events != nil {
		// The events settle after their invoices: published, consumed, acted on. The
		// workers run the relay and the consumers, so they keep running meanwhile.
		dcancel()
		<-dupDone
		t0 := time.Now()
		deadline := t0.Add(eventsDrainAllowed)
		for ctx.Err() == nil && time.Now().Before(deadline) {
			if ok, err := eventsSettled(ctx, pool, ns, run); err == nil && ok {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		eventsDrain = time.Since(t0)
	}
	res.Starts, res.Kills = time.Duration(startsTook.Load()), drainStart.Sub(start)
	stop.Store(true)
	signalAll(&mu, procs, syscall.SIGTERM)
	if live := waitStopped(&wg, &mu, procs, tm.StopWithin); live > 0 {
		res.Violations = append(res.Violations, fmt.Sprintf("run: %d workers still ran %v after SIGTERM (%s); killed",
			live, tm.StopWithin, res.Settings))
	}
	res.Took = time.Since(start)
	res.RandomKills, res.FailpointKills, res.Restarts = int(randomK.Load()), int(fpK.Load()), int(starts.Load())-cfg.Workers
	res.ProviderRequests = int(pay.Requests())
	res.Charges = len(pay.Charges())

	// Record the history, then check it.
	octx, ocancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer ocancel()
	return res, check(octx, cfg, &res, checkInput{c: c, pool: pool, ledger: ledger, pay: pay, ns: ns, run: run,
		invoices: invoices, start: start, faults: faults.snapshot(), canaries: secrets, events: events, eventsDrain: eventsDrain}, out)
}

// startInvoice starts an invoice's instance and returns its id, trying again while the
// engine refuses for a moment (a database restart makes it refuse). A start whose answer
// was lost is never resent blindly: findStarted asks first.
func startInvoice(ctx context.Context, c *admin.Client, inv invoice) (string, error) {
	vars := camunda7.Variables{"invoiceId": camunda7.StringVar(inv.id), "amountCents": camunda7.LongVar(inv.amount),
		canaryVariable: camunda7.StringVar(canaryPII)}
	var id string
	var err error
	for try := 0; try < 120; try++ {
		var pi *admin.ProcessInstance
		pi, err = c.StartProcess(ctx, processKey, admin.StartProcessRequest{BusinessKey: inv.id, Variables: vars})
		if err == nil {
			id = pi.ID
		} else if errors.Is(err, camunda7.ErrUnknownOutcome) {
			id, err = findStarted(ctx, c, inv.id, err)
		}
		if err == nil || !camunda7.SafeToRetry(err) || ctx.Err() != nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	return id, err
}

// findStarted asks the engine whether a start whose answer was lost (the engine or its
// database went away) created the instance: its id, or ErrNotSent when it did not. The
// engine may still be down (a restart): it keeps asking for a minute, then returns lost.
func findStarted(ctx context.Context, c *admin.Client, businessKey string, lost error) (string, error) {
	for ask := 0; ask < 240 && ctx.Err() == nil; ask++ {
		found, err := c.HistoricProcessInstances(ctx, url.Values{"processInstanceBusinessKey": {businessKey}})
		if err == nil {
			if len(found) > 0 {
				return found[0].ID, nil
			}
			return "", fmt.Errorf("%w (not started: safe to send again)", camunda7.ErrNotSent)
		}
		time.Sleep(250 * time.Millisecond)
	}
	return "", lost
}

// checkInput is what the recorder and the oracle need of a finished run.
type checkInput struct {
	c        *admin.Client
	pool     *pgxpool.Pool
	ledger   *idempotency.Ledger
	pay      *fakeprovider.Server
	ns, run  string
	invoices []invoice
	start    time.Time
	faults   map[string]int
	canaries []string
	// events is the broker's tap (nil: no events); eventsDrain how long they took to
	// settle after the invoices had.
	events      *tap
	eventsDrain time.Duration
}

// check records the run's history under res.RunDir, runs the oracle over it, writes
// report.txt (and prints it), and prunes a passing run's history unless asked to keep
// it. The error sums up the violations.
func check(ctx context.Context, cfg Config, res *Result, in checkInput, out io.Writer) error {
	began := time.Now()
	violate := func(format string, args ...any) {
		res.Violations = append(res.Violations, fmt.Sprintf(format, args...))
	}
	if k := res.RandomKills + res.FailpointKills; k < cfg.MinKills {
		violate("run: the run reached %d kills, short of the %d asked for", k, cfg.MinKills)
	}
	if res.Drain > res.Timing.DrainAllowed {
		violate("run: the drain took %v, over the %v allowed (%s tier)", res.Drain.Round(time.Second), res.Timing.DrainAllowed, res.Tier)
	}
	if err := recordProvider(res.RunDir, in.pay); err != nil {
		violate("run: record the provider's history: %v", err)
	}
	if err := recordLedger(ctx, res.RunDir, in.pool, in.ns); err != nil {
		violate("run: record the ledger: %v", err)
	}
	st, err := oracle.ReadEngine(ctx, in.c, oracle.EngineQuery{ProcessDefinitionKey: processKey, BusinessKeyPrefix: in.run,
		ErrorEndActivities: []string{errorEndEvent}, Since: in.start.Add(-time.Minute)})
	if err != nil {
		violate("run: read the engine's state: %v", err)
	}
	hist, err := readEngineHistory(ctx, in.c, st)
	if err != nil {
		violate("run: read the engine's history: %v", err)
	}
	if err := recordEngine(res.RunDir, hist); err != nil {
		violate("run: record the engine's history: %v", err)
	}

	// The demo topics are fixed: any other worker serving them on this engine takes some
	// of the run's tasks with its own ledger and provider, and the oracle would blame
	// this run's workers. Say so plainly.
	foreign := map[string]int{}
	for _, entries := range hist.ExternalTaskLog {
		for _, e := range entries {
			if (e.SuccessLog || e.FailureLog) && !strings.HasPrefix(e.WorkerID, fmt.Sprintf("soak-%d-", cfg.Seed)) {
				foreign[e.WorkerID]++
			}
		}
	}
	if len(foreign) > 0 {
		violate("run: workers not of this run reported on its tasks (%s): another worker serves the demo topics on this engine, so this run proves nothing; run the soak alone",
			counts(foreign))
	}

	log := in.pay.Log()
	charges := in.pay.Charges()
	// I1, I4-I8 per invoice.
	exps := expectations(in.invoices, log, hist)
	mayHold := map[string]bool{}
	for _, e := range exps {
		mayHold[e.Invoice] = e.MayHold
		if e.Declined && e.MayHold && e.Incident {
			res.HeldDeclined++ // a stored 500 before the provider could decline
		}
		res.Violations = append(res.Violations, oracle.Check(ctx, in.ledger, charges, e)...)
	}
	// I2 over every effect and every intent of the run.
	rows, err := in.ledger.List(ctx, idempotency.Filter{Limit: 2*len(in.invoices) + 100})
	if err != nil {
		violate("run: list the ledger: %v", err)
	}
	res.Violations = append(res.Violations, oracle.CheckDigests(rows, effects(charges))...)
	// I10 and I11 over the run's events.
	if in.events != nil {
		paid := map[string]bool{}
		for _, r := range rows {
			if r.Namespace == in.ns && r.Scope == scope && (r.State == idempotency.StateConfirmed || r.State == idempotency.StateReconciled) {
				paid[strings.TrimSuffix(strings.TrimPrefix(r.Key, "invoice:"), ":v1")] = true
			}
		}
		ev := checkEvents(ctx, in.c, in.pool, in.events, in.ns, in.run, paid, violate)
		ev.BrokerRestarts, ev.Drain = res.BrokerRestarts, in.eventsDrain
		if ev.Drain >= eventsDrainAllowed {
			violate("run: the events did not settle within %v of the invoices", eventsDrainAllowed)
		}
		res.Events = &ev
	}
	// I3 over the run's instances.
	started := make([]string, 0, len(in.invoices))
	for _, inv := range in.invoices {
		started = append(started, inv.instance)
	}
	var iv []string
	res.Engine, iv = oracle.CheckInstances(started, st, allowedIncident(in.invoices, mayHold), time.Now())
	res.Violations = append(res.Violations, iv...)
	// I9 over the recorded logs, the ledger dump and the engine's state.
	leaks, sources, err := scanCanaries(ctx, res.RunDir, hist, in.canaries)
	if err != nil {
		violate("run: I9 scan: %v", err)
	}
	res.Leaks = len(leaks)
	for _, l := range leaks {
		violate("%s", l)
	}
	control, err := plantedCanaries(hist)
	if err != nil || control < len(in.invoices) {
		violate("run: I9's control found the planted canary variable in %d of %d instances (%v)", control, len(in.invoices), err)
	}

	res.Faults = in.faults
	for _, r := range log {
		if r.Fault != "" {
			res.Faults["provider "+r.Fault]++
		}
	}
	res.Check = time.Since(began)
	rep := report{res: res, cfg: cfg, log: log, charges: charges, doubles: in.pay.DoubleCharges(), rows: rows, hist: hist, sources: sources, canaries: len(in.canaries), control: control}
	rep.version, _ = in.c.Version(ctx)
	rep.reconciled, _ = reconcileCounts(ctx, in.pool, in.ns)
	if err := writeFile(filepath.Join(res.RunDir, reportFile), rep.write); err != nil {
		fmt.Fprintf(out, "soak: write the report: %v\n", err)
	}
	_ = rep.write(out)
	if len(res.Violations) > 0 {
		fmt.Fprintf(out, "soak: FAILED; the run's whole history is in %s\n", res.RunDir)
		return fmt.Errorf("soak: %d invariant violations (seed %d); history in %s", len(res.Violations), cfg.Seed, res.RunDir)
	}
	if !cfg.KeepHistory {
		if err := prune(res.RunDir); err != nil {
			return fmt.Errorf("soak: prune %s: %w", res.RunDir, err)
		}
	}
	return nil
}

// withQuery adds a query parameter to a URL.
func withQuery(raw, k, v string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("database URL: %w", err)
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// signalAll sends sig to every live worker.
func signalAll(mu *sync.Mutex, procs []*exec.Cmd, sig syscall.Signal) {
	mu.Lock()
	defer mu.Unlock()
	for _, p := range procs {
		if p != nil && p.Process != nil {
			_ = p.Process.Signal(sig)
		}
	}
}

// waitStopped waits up to d for the supervisor's goroutines to end (every worker exited
// after SIGTERM); past d it SIGKILLs the workers still running and returns how many.
func waitStopped(wg *sync.WaitGroup, mu *sync.Mutex, procs []*exec.Cmd, d time.Duration) int {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
		return 0
	case <-timer.C:
	}
	mu.Lock()
	live := 0
	for _, p := range procs {
		if p != nil && p.Process != nil {
			live++
		}
	}
	mu.Unlock()
	signalAll(mu, procs, syscall.SIGKILL)
	<-done
	return live
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
