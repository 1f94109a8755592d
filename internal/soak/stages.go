package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/oracle"
)

// The run's stages, in the order runner.run takes them: the I/O around the schedule's
// decisions (schedule.go).

// prepare asks the worker binary what the workers will run with (the harness's timing
// follows from it), makes the run directory, and connects to the engine and the ledger.
func (r *runner) prepare(ctx context.Context) error {
	cfg := r.cfg
	var err error
	r.res.Settings, err = readSettings(ctx, cfg.Binary, workerEnv(cfg.Defaults, "EXTWORKER_LOG_FORMAT=json"), cfg.Defaults)
	if err != nil {
		return err
	}
	r.res.Timing = deriveTiming(r.res.Settings, cfg.KillEvery)
	tm := r.res.Timing
	r.logf("soak: seed %d (replay with -seed %d), %s tier, %d instances, %d workers, a kill every ~%v",
		cfg.Seed, cfg.Seed, r.res.Tier, cfg.Instances, cfg.Workers, tm.KillEvery)
	r.logf("soak: workers run with %s; provider delay fault %v, drain allowed %v", r.res.Settings, tm.ProviderDelay, tm.DrainAllowed)

	r.res.RunDir = filepath.Join(cfg.LogDir, fmt.Sprintf("%d-%s", cfg.Seed, r.start.Format("20060102T150405")))
	if err = os.MkdirAll(r.res.RunDir, 0o755); err != nil {
		return fmt.Errorf("run directory: %w", err)
	}
	cc, err := camunda7.New(camunda7.Config{BaseURL: cfg.EngineURL, Username: cfg.EngineUser, Password: cfg.EnginePassword})
	if err != nil {
		return err
	}
	r.c = admin.New(cc)
	if r.pool, err = pgxpool.New(ctx, cfg.DatabaseURL); err != nil {
		return err
	}
	r.onExit(r.pool.Close)
	// The seed decides every random choice; the nonce keeps a replay's invoices and ledger
	// rows apart from the earlier run's.
	r.nonce = time.Now().UnixNano() % 1_000_000_000
	r.ns = fmt.Sprintf("soak-%d-%d", cfg.Seed, r.nonce)
	r.prefix = fmt.Sprintf("SOAK-%d-%d", cfg.Seed, r.nonce)
	r.ledger, err = idempotency.New(r.pool, idempotency.Config{Namespace: r.ns})
	return err
}

// startProvider starts the fake provider with the run's fault mix (docs/reliability.md,
// The soak), drawn per charge request from the seed; declines are planted by amount
// (planInvoices). The delay outlasts the lock and the point where the worker gives up on
// the call (Timing.ProviderDelay), so the worker gives up on an answer the provider then
// commits.
func (r *runner) startProvider(context.Context) error {
	pay, err := fakeprovider.StartWith(fakeprovider.Options{DeclineAboveCents: declineAbove, Seed: int64(r.cfg.Seed),
		SlowDelay: r.res.Timing.ProviderDelay})
	if err != nil {
		return err
	}
	r.pay = pay
	r.onExit(func() { _ = pay.Close() })
	pay.ScriptRandom(0.02, fakeprovider.RateLimited)
	pay.ScriptRandom(0.01, fakeprovider.Stored500)
	pay.ScriptRandom(0.005, fakeprovider.LoseAnswer)
	pay.ScriptRandom(0.005, fakeprovider.DropBeforeAccept)
	pay.ScriptRandom(0.01, fakeprovider.Delay)
	return nil
}

// connect puts toxiproxy between the workers and the provider (and the engine, if asked)
// and builds the workers' environment: where things are, with the canaries in the
// credentials and URLs they are given (check.go), logging, and the operations endpoint
// off (the workers share the host); the tier decides the rest (tier.go).
func (r *runner) connect(context.Context) error {
	tox := newToxics()
	r.onExit(tox.close)
	var err error
	if r.provider, err = tox.proxy("provider", strings.TrimPrefix(r.pay.URL(), "http://")); err != nil {
		return err
	}
	engineURL := r.cfg.EngineURL
	if r.cfg.EngineLatencyWindow > 0 {
		u, err := url.Parse(r.cfg.EngineURL)
		if err != nil {
			return err
		}
		if r.engine, err = tox.proxy("engine", u.Host); err != nil {
			return err
		}
		u.Host = r.engine.addr()
		engineURL = u.String()
	}
	providerURL := "http://token:" + canaryProvider + "@" + r.provider.addr()
	dbURL, err := withQuery(r.cfg.DatabaseURL, "sslpassword", canaryDatabase)
	if err != nil {
		return err
	}
	r.secrets = canaries
	user, password := "soak", canaryEngine
	if r.cfg.EnginePassword != "" {
		user, password = r.cfg.EngineUser, r.cfg.EnginePassword
		r.secrets = append(canaries[:len(canaries):len(canaries)], r.cfg.EnginePassword)
	}
	r.env = workerEnv(r.cfg.Defaults, "EXTWORKER_ENGINE_URL="+engineURL, "EXTWORKER_ENGINE_USER="+user,
		"EXTWORKER_ENGINE_PASSWORD="+password, "EXTWORKER_DATABASE_URL="+dbURL,
		"EXTWORKER_LEDGER_NAMESPACE="+r.ns, "EXTWORKER_PROVIDER_URL="+providerURL,
		"EXTWORKER_LOG_LEVEL=info", "EXTWORKER_LOG_FORMAT=json", "EXTWORKER_HTTP_ADDR=off")
	return nil
}

// startTap, with a broker, gives the workers its URL (with Kafka, the demo's Kafka
// setting too) and starts the soak's tap on the events' exchange or topic. The tap is
// declared before any worker runs: it sees every event published.
func (r *runner) startTap(ctx context.Context) error {
	if r.cfg.Broker == nil {
		return nil
	}
	if r.cfg.Kafka {
		r.env = append(r.env, kafkaEnv(r.cfg.Broker.URL())...)
		r.events = newKafkaTap(r.cfg.Broker.URL())
	} else {
		r.env = append(r.env, "EXTWORKER_AMQP_URL="+r.cfg.Broker.URL())
		r.events = newTap(r.cfg.Broker.URL(), fmt.Sprintf("soak-tap-%d-%d", r.cfg.Seed, r.nonce))
	}
	if err := r.events.declare(); err != nil {
		return fmt.Errorf("events: the broker at %s: %w", r.cfg.Broker.URL(), err)
	}
	tctx, tcancel := context.WithCancel(ctx)
	tapDone := make(chan struct{})
	go func() { r.events.run(tctx); close(tapDone) }()
	r.onExit(func() { tcancel(); <-tapDone })
	return nil
}

// migrate migrates the ledger and deploys the demo's processes with the worker binary.
func (r *runner) migrate(ctx context.Context) error {
	for _, sub := range [][]string{{"migrate"}, {"demo", "-deploy-only"}} {
		cmd := exec.CommandContext(ctx, r.cfg.Binary, sub...)
		cmd.Env = r.env
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("extworker %s: %v: %s", sub[0], err, b)
		}
	}
	return nil
}

// startInstances starts the invoices' instances in the background, one every `every`
// (startPacing). The channel carries the first error, or nil once all have started.
func (r *runner) startInstances(ctx context.Context, every time.Duration) chan error {
	startErr := make(chan error, 1)
	go func() {
		t := time.NewTicker(max(every, time.Millisecond))
		defer t.Stop()
		for i := range r.invoices {
			id, err := startInvoice(ctx, r.c, r.invoices[i])
			if err != nil {
				startErr <- fmt.Errorf("start instance %d: %w", i, err)
				return
			}
			r.invoices[i].instance = id
			<-t.C
		}
		r.startsTook.Store(int64(time.Since(r.start)))
		r.allStarted.Store(true)
		startErr <- nil
	}()
	return startErr
}

// startWindows applies the toxic windows at their seeded times during the kills
// (toxicWindows); on an early return they are lifted at once.
func (r *runner) startWindows(ctx context.Context, phase time.Duration) {
	windows := toxicWindows(r.rng, phase, r.provider, r.engine, r.cfg.EngineLatencyWindow)
	wctx, wcancel := context.WithCancel(ctx)
	over := make(chan struct{})
	go func() {
		defer close(over)
		runWindows(wctx, r.start, windows, r.faults.add, r.logf)
		r.windowsDone.Store(true)
	}()
	r.onExit(func() { wcancel(); <-over })
}

// startDuplicator, with a broker, sends an event the broker delivered again now and then
// during the kills, byte for byte, as a producer's retry would. stop ends it (and may be
// called again).
func (r *runner) startDuplicator(ctx context.Context) (stop func()) {
	dctx, dcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	if r.events != nil {
		go func() {
			r.events.duplicate(dctx, rand.New(rand.NewPCG(r.cfg.Seed+3, r.cfg.Seed+4)), r.res.Timing.KillEvery)
			close(done)
		}()
	} else {
		close(done)
	}
	stop = func() { dcancel(); <-done }
	r.onExit(stop)
	return stop
}

// killPhase SIGKILLs a random live worker every ~KillEvery, and starts the services'
// restarts when their turn comes (beside the kills: startRestarts), until killPhaseOver.
func (r *runner) killPhase(ctx context.Context, startErr chan error) error {
	kill := time.NewTimer(r.res.Timing.KillEvery)
	defer kill.Stop()
	for ctx.Err() == nil {
		<-kill.C
		kills := r.sup.kills()
		restartsIdle := !r.restarting.Load()
		select {
		case err := <-r.restartErr:
			return err
		default:
		}
		if killPhaseOver(r.allStarted.Load(), r.windowsDone.Load(), restartsIdle, kills, r.cfg.MinKills, r.cfg.Instances,
			func() int { return r.settled(ctx) }) {
			return nil
		}
		select {
		case err := <-startErr:
			if err != nil {
				return err
			}
			startErr <- nil // all started; seen again after the kills
		default:
		}
		if restartsIdle {
			r.startRestarts(ctx, kills)
		}
		r.sup.killRandom(r.rng)
		kill.Reset(nextKillIn(r.rng, r.res.Timing.KillEvery))
	}
	return nil
}

// startRestarts restarts, in the background, PostgreSQL, the engine and the broker when
// restartsDue says their turn has come after kills kills. The killer goes on meanwhile:
// a lane's broker took up to 104 s to start again in CI, and a killer that waited for it
// fell short of its kills (6 of 10) once the workers had settled everything. The caller
// holds r.restarting false; the restarts' first error reaches r.restartErr.
func (r *runner) startRestarts(ctx context.Context, kills int) {
	want := restartCounts{PG: r.cfg.PGRestarts, Engine: r.cfg.EngineRestarts}
	if r.cfg.Broker != nil {
		want.Broker = r.cfg.BrokerRestarts
	}
	due := restartsDue(restartCounts{PG: r.res.PGRestarts, Engine: r.res.EngineRestarts, Broker: r.res.BrokerRestarts},
		want, kills, r.cfg.MinKills)
	if due == (restartsPlan{}) {
		return
	}
	r.restarting.Store(true)
	r.restarts.Add(1)
	go func() {
		defer r.restarts.Done()
		if err := r.restartServices(ctx, due, kills); err != nil {
			r.restartErr <- err
		}
		r.restarting.Store(false)
	}()
}

// restartServices restarts the services due, one after another.
func (r *runner) restartServices(ctx context.Context, due restartsPlan, kills int) error {
	if due.PG {
		if err := restartPostgres(ctx); err != nil {
			return err
		}
		r.res.PGRestarts++
		r.faults.add("PostgreSQL restart (immediate)")
		r.logf("soak: PostgreSQL restarted (immediate) after %d kills", kills)
	}
	if due.Engine {
		t0 := time.Now()
		if err := restartEngine(ctx, r.cfg); err != nil {
			return err
		}
		r.res.EngineRestarts++
		r.faults.add("engine restart")
		r.logf("soak: engine restarted after %d kills (%.1fs)", kills, time.Since(t0).Seconds())
	}
	if due.Broker {
		t0 := time.Now()
		if err := restartBroker(r.cfg.Broker); err != nil {
			return err
		}
		r.res.BrokerRestarts++
		r.faults.add("broker SIGKILL and restart")
		r.logf("soak: broker killed and started again after %d kills (%.1fs)", kills, time.Since(t0).Seconds())
	}
	return nil
}

// drain runs without faults (no failpoints, no provider faults, the windows are over)
// until every instance has ended or holds an incident; it returns when the drain began.
func (r *runner) drain(ctx context.Context) time.Time {
	began := time.Now()
	r.sup.draining.Store(true)
	r.pay.ClearFaults()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for r.settled(ctx) < r.cfg.Instances && ctx.Err() == nil {
		<-tick.C
	}
	r.res.Drain = time.Since(began)
	return began
}

// drainEvents, with a broker, waits (up to eventsDrainAllowed) for the events to settle
// after their invoices: published, consumed, acted on. The workers run the relay and the
// consumers, so they keep running meanwhile. It returns how long that took.
func (r *runner) drainEvents(ctx context.Context, stopDuplicator func()) time.Duration {
	if r.events == nil {
		return 0
	}
	stopDuplicator()
	t0 := time.Now()
	deadline := t0.Add(eventsDrainAllowed)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if ok, err := eventsSettled(ctx, r.pool, r.ns, r.events.source, r.prefix); err == nil && ok {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	return time.Since(t0)
}

// stopWorkers stops the workers (SIGTERM, SIGKILL past Timing.StopWithin) and fills in
// the run's timings and counts.
func (r *runner) stopWorkers(drainStart time.Time) {
	r.res.Starts, r.res.Kills = time.Duration(r.startsTook.Load()), drainStart.Sub(r.start)
	if live := r.sup.stopAll(r.res.Timing.StopWithin); live > 0 {
		r.res.Violations = append(r.res.Violations, fmt.Sprintf("run: %d workers still ran %v after SIGTERM (%s); killed",
			live, r.res.Timing.StopWithin, r.res.Settings))
	}
	r.res.Took = time.Since(r.start)
	r.res.RandomKills, r.res.FailpointKills = int(r.sup.randomKills.Load()), int(r.sup.failpointKills.Load())
	r.res.Restarts = int(r.sup.starts.Load()) - r.cfg.Workers
	r.res.ProviderRequests = int(r.pay.Requests())
	r.res.Charges = len(r.pay.Charges())
}

// settled counts the run's instances that have ended or hold an incident (settledCount):
// once all have, nothing more will happen without an operator. -1 when the engine does
// not answer. Only called after every instance has started. The engine's count of
// finished instances with the run's business keys comes first (one cheap query); it
// counts every instance of those keys, so while it falls short it is the answer (at least
// the true figure), and once it does not, the finished instances are listed and only
// ours counted.
func (r *runner) settled(ctx context.Context) int {
	if r.ours == nil {
		r.ours = make(map[string]bool, len(r.invoices))
		for _, in := range r.invoices {
			r.ours[in.instance] = true
		}
	}
	q := url.Values{"processDefinitionKey": {processKey}, "processInstanceBusinessKeyLike": {r.prefix + "%"}, "finished": {"true"}}
	n, err := r.c.HistoricProcessInstanceCount(ctx, q)
	if err != nil {
		return -1
	}
	inc, err := r.c.Incidents(ctx, url.Values{"processDefinitionKeyIn": {processKey}})
	if err != nil {
		return -1
	}
	if upper := n + settledCount(nil, inc, r.ours); upper < r.cfg.Instances {
		return upper
	}
	q.Set("sortBy", "instanceId")
	q.Set("sortOrder", "asc")
	finished, err := oracle.AllPages(ctx, q, r.c.HistoricProcessInstances)
	if err != nil {
		return -1
	}
	ids := make([]string, len(finished))
	for i, h := range finished {
		ids[i] = h.ID
	}
	return settledCount(ids, inc, r.ours)
}

// startInvoice starts an invoice's instance and returns its id, trying again while the
// engine refuses for a moment (a database restart makes it refuse). A start whose answer
// was lost is never resent blindly: findStarted asks first; so is one the engine answered
// with a server error. During a database restart a CI soak started one invoice twice, and
// which answer misled it is not known (in 40 starts the engine answered with a 500 while
// its database restarted, none had been committed): asking costs one query. Only a
// refusal (a 4xx) or a request that never left is sent again without asking.
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
		} else if errors.Is(err, camunda7.ErrUnknownOutcome) || serverError(err) {
			id, err = findStarted(ctx, c, inv.id, err)
		}
		if err == nil || !camunda7.SafeToRetry(err) || ctx.Err() != nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	return id, err
}

// serverError reports whether the engine answered err with a 5xx error of its own.
func serverError(err error) bool {
	var ee *camunda7.Error
	return errors.As(err, &ee) && ee.StatusCode >= 500
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
