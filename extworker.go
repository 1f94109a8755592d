// Package extworker runs Camunda 7 external-task workers in production: a program's main
// registers its handlers and hands over, and gets what a worker needs around them.
//
//	func main() {
//		extworker.Main(func(app *extworker.App) error {
//			return app.Handle("shipping.book-courier", bookCourier(app.Ledger()), tasks.TopicOptions{})
//		})
//	}
//
// Main, and New with Run for a program that wants its own control, give the handlers:
//
//   - configuration from the EXTWORKER_* variables (docs/configuration.md), secrets from
//     their _FILE variants, every problem listed at once (exit status 78, ExitConfig);
//   - the engine client, checked at start: rejected credentials exit 78 too, instead of a
//     worker whose every fetch fails;
//   - the effect ledger (package idempotency) on EXTWORKER_DATABASE_URL, which must be
//     migrated (`extworker migrate`), reporting to the metrics and logging through each
//     task's logger, pruned hourly (EXTWORKER_LEDGER_RETENTION), and told about tasks the
//     engine cancelled (their intents are flagged orphaned for an operator);
//   - /metrics, /healthz and /readyz on EXTWORKER_HTTP_ADDR;
//   - with EXTWORKER_CONSOLE_ADDR, the operator console (docs/console.md) on a listener of
//     its own: intents in doubt, verdicts and the two-person rule, parked messages;
//   - with EXTWORKER_TASKS_ADDR, the human-task completion service (package humantask,
//     docs/humantasks.md) on a listener of its own: Camunda user tasks completed once per
//     command, with business rules from HumanTasks and, with EXTWORKER_TASKS_PAGE, a
//     sample task page;
//   - with EXTWORKER_AMQP_URL, the outbox relay: events handlers add in their transactions
//     (package outbox) are published to RabbitMQ with publisher confirms; and the
//     consumers Consume registers (package inbox): each message recorded before it is
//     acted on, then starting a process instance or correlated to a waiting one, once;
//   - the worker (package tasks): long polling, lock extension, retries, classified
//     failures;
//   - signals: SIGINT or SIGTERM stops gracefully within EXTWORKER_SHUTDOWN_TIMEOUT; a
//     second one exits at once with 130 or 143;
//   - traces, when the standard OTEL_* variables ask for them (OTEL_EXPORTER_OTLP_ENDPOINT,
//     say): OpenTelemetry spans of every task, its handler, its engine calls and its
//     effects, exported over OTLP/HTTP, flushed by Close (docs/operations.md, Traces).
//
// Handlers are ordinary tasks.Handler functions; package tasks has the task's variables
// and outcomes, package idempotency the ledger, package failure the outcomes' kinds.
package extworker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/humantask"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/inbox/callback"
	"github.com/extworker/extworker/internal/console"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/termsafe"
	"github.com/extworker/extworker/internal/tracing"
	"github.com/extworker/extworker/metrics"
	"github.com/extworker/extworker/outbox"
	"github.com/extworker/extworker/tasks"
)

// ExitConfig is the exit status of a configuration the worker cannot run with: an invalid
// variable, or credentials the engine rejects. Retrying cannot help; a supervisor may stop
// restarting (EX_CONFIG).
const ExitConfig = daemon.ExitConfig

// App is one worker process: its configuration, engine client, ledger, metrics and the
// topics its handlers serve. Build it with New (or let Main do it), register handlers
// with Handle, then Run it.
type App struct {
	cfg       daemon.Config
	ops       daemon.OpsConfig
	logger    *slog.Logger
	client    *camunda7.Client
	ledger    *idempotency.Ledger
	pool      *pgxpool.Pool
	opsPool   *pgxpool.Pool
	promReg   *prometheus.Registry
	metrics   *metrics.Metrics
	registry  *tasks.Registry
	relay     *outbox.Relay // nil without a broker for the outbox (daemon.Config.Outbox)
	pub       interface{ Close() error }
	consumers []*inbox.Consumer
	runners   []func(context.Context) error // the Kafka consumers
	callbacks []callback.Source             // the callbacks' sources (EXTWORKER_CALLBACK_ADDR)
	// callbackPool holds the callbacks waiting for their instance: the first source's.
	callbackPool *pgxpool.Pool
	inboxPools   []*pgxpool.Pool
	inboxStats   *metrics.InboxCollector // registered with the first consumer
	console      *console.Server         // nil without EXTWORKER_CONSOLE_ADDR
	errs         []error
	// stopTracing flushes and stops the TracerProvider New installed; nil without one.
	stopTracing func(context.Context) error
	// taskGuards are the human tasks' business rules (App.HumanTasks).
	taskGuards map[string]humantask.Guard
}

// Options are what New takes besides the environment. The zero value is the default.
type Options struct {
	// Logger receives the process's records. Default: EXTWORKER_LOG_LEVEL and
	// EXTWORKER_LOG_FORMAT on LogOutput.
	Logger *slog.Logger
	// LogOutput is where the default logger writes. Default: standard error.
	LogOutput io.Writer
	// Migrations are the program's own database migrations, for its own tables beside
	// the ledger's (Pool): goose SQL files (00001_bookings.sql, with -- +goose Up) at the
	// root of the file system; fs.Sub(embedded, "migrations") for a directory. New
	// applies the pending ones at start, once across replicas starting together (an
	// advisory lock), and Migrate applies them after the ledger's. A migration that
	// goose cannot parse or PostgreSQL refuses (a syntax error, say) is a configuration
	// error naming it, so that Main exits with ExitConfig and a supervisor does not
	// restart the worker in a loop.
	Migrations fs.FS
	// MigrationsTable records which of Migrations are applied; required with Migrations,
	// and there is no default. Each program on a database names its own table
	// (bookings_schema_migrations, say): goose records version numbers only, so a
	// second program recording in the first one's table would skip, silently, each of
	// its migrations whose version the first has applied. A name of the ledger's (its
	// version table migrations.VersionTable, or any table beginning with extworker_,
	// schema-qualified or not) is refused as a configuration error.
	MigrationsTable string
}

// ConfigError is a configuration a program cannot run with: Main exits with ExitConfig
// for it, and IsConfigError finds it. A program wraps the problems of its own settings in
// it to be treated as the EXTWORKER_* ones are.
type ConfigError = daemon.ConfigError

// New reads the configuration from the environment, checks that the engine accepts the
// credentials, and opens the ledger, which must be migrated. Its errors are what Main
// reports: a configuration error or rejected credentials satisfy IsConfigError. Close
// releases what it opened; Run does not.
//
// When the OTEL_* variables ask for traces, New installs an OpenTelemetry SDK
// TracerProvider (OTLP/HTTP) as the global one, and Close flushes it. A program that
// sets up OpenTelemetry itself leaves those variables unset for its worker, or sets
// OTEL_TRACES_EXPORTER=none.
func New(ctx context.Context, opts Options) (*App, error) {
	cfg, err := daemon.LoadConfig()
	if err != nil {
		return nil, cfg.ScrubError(err)
	}
	ops, err := daemon.LoadOpsConfig()
	if err != nil {
		return nil, err
	}
	traces, err := tracing.Read(os.LookupEnv)
	if err != nil {
		return nil, daemon.ConfigError{Err: err}
	}
	if _, err := opts.migrationsTable(); err != nil {
		return nil, err
	}
	logger := opts.Logger
	if logger == nil {
		logger = daemon.NewLogger(cfg, opts.logOutput())
	}
	a := &App{cfg: cfg, ops: ops, logger: logger, registry: tasks.NewRegistry()}
	if traces.On {
		if a.stopTracing, err = tracing.Start(ctx, traces, logger); err != nil {
			return nil, daemon.ConfigError{Err: err}
		}
		logger.Info("traces on", slog.String("endpoint", traces.Endpoint), slog.String("service_name", traces.ServiceName))
	}
	if err := a.open(ctx); err != nil {
		a.Close()
		return nil, cfg.ScrubError(err)
	}
	if opts.Migrations != nil {
		if _, err := migrateApp(ctx, a.pool, opts); err != nil {
			a.Close()
			return nil, cfg.ScrubError(err)
		}
	}
	return a, nil
}

func (a *App) open(ctx context.Context) error {
	var err error
	if a.client, err = daemon.NewClient(a.cfg, a.logger); err != nil {
		return daemon.ConfigError{Err: err}
	}
	if err := daemon.CheckClient(ctx, a.cfg, a.client, a.logger); err != nil {
		return err
	}
	if a.ledger, a.pool, err = daemon.OpenLedger(ctx, a.cfg, a.logger, true); err != nil {
		return err
	}
	a.promReg = daemon.NewOpsRegistry()
	if a.metrics, err = metrics.New(a.promReg, metrics.Options{MaxConcurrency: a.cfg.MaxConcurrency}); err != nil {
		return err
	}
	// The ledger reports to the metrics, logs through the running task's logger (so its
	// records carry the task's fields) and names the intent on the task's records.
	a.ledger = a.ledger.WithHooks(idempotency.Hooks{Observer: a.metrics, ContextLogger: tasks.Logger, Annotate: tasks.AddLogAttrs})
	a.promReg.MustRegister(metrics.NewBacklogCollector(a.ledger.Operations(), a.ops.ReadyTimeout, a.metrics, a.logger))
	if err := a.openRelay(); err != nil {
		return err
	}
	if a.cfg.ConsoleAddr != "" {
		// Opened here, not in Run, so that an unreadable operators file or session key is
		// a configuration error at start.
		if a.console, err = console.Open(ctx, a.cfg, a.client, a.logger); err != nil {
			return err
		}
	}
	a.opsPool, err = daemon.OpenOpsPool(ctx, a.cfg.DatabaseURL)
	return err
}

// IsConfigError reports whether err (from New or Run) is a configuration the worker
// cannot run with: Main exits with ExitConfig for it.
func IsConfigError(err error) bool {
	var ce daemon.ConfigError
	return errors.As(err, &ce)
}

// Ledger is the effect ledger, for handlers to run their side effects through.
func (a *App) Ledger() *idempotency.Ledger { return a.ledger }

// Pool is the ledger's connection pool (EXTWORKER_DATABASE_URL, at most
// EXTWORKER_LEDGER_MAX_CONNS connections), for the program's own tables (Options.Migrations):
// a handler's idempotency.Effect.Local gets a transaction on it, and a query of its own
// borrows a connection briefly, as the ledger does. Close closes it.
func (a *App) Pool() *pgxpool.Pool { return a.pool }

// Logger is the process's logger (EXTWORKER_LOG_LEVEL, EXTWORKER_LOG_FORMAT). Inside a
// handler, tasks.Logger(ctx) has the task's fields too.
func (a *App) Logger() *slog.Logger { return a.logger }

// Client is the engine client, for what a handler needs beyond its task (correlating a
// message, reading another instance's variables).
func (a *App) Client() *camunda7.Client { return a.client }

// Handle registers h for topic; opts.LockDuration defaults to EXTWORKER_LOCK_DURATION,
// whose own default is tasks.DefaultLockDuration, what a tasks.Registry uses: one default
// either way. A registration error (a topic twice, invalid options) is returned here and
// again by Run.
func (a *App) Handle(topic string, h tasks.Handler, opts tasks.TopicOptions) error {
	if opts.LockDuration == 0 {
		opts.LockDuration = a.cfg.LockDuration
	}
	if err := a.registry.Register(topic, h, opts); err != nil {
		a.errs = append(a.errs, err)
		return err
	}
	return nil
}

// Consume consumes cfg.Queue into the inbox (package inbox) while Run runs: each message
// is recorded before it is acted on, then starts a process instance or is correlated to
// a waiting one as decide says, once, whatever the broker redelivers; what cannot be
// acted on is parked in the queue's dead-letter queue for `extworker inbox replay`. It
// needs EXTWORKER_AMQP_URL; cfg.Logger defaults to the App's. A configuration error is
// returned here and again by Run.
func (a *App) Consume(cfg inbox.Config, decide inbox.Decide) error {
	if a.cfg.AMQPURL == "" {
		return a.configError(fmt.Errorf("consuming %s needs EXTWORKER_AMQP_URL, the broker", cfg.Queue))
	}
	cfg, pool, err := a.inboxPool(cfg)
	if err != nil {
		return a.configError(err)
	}
	c, err := inbox.NewConsumer(pool, admin.New(a.client), a.cfg.AMQPURL, decide, cfg)
	if err != nil {
		return a.configError(err)
	}
	a.countInbox(cfg.Queue, c.Stats())
	a.consumers = append(a.consumers, c)
	return nil
}

// Run serves the registered topics until ctx ends, then stops gracefully: it stops
// fetching, lets running handlers finish within EXTWORKER_SHUTDOWN_GRACE, and returns
// within EXTWORKER_SHUTDOWN_TIMEOUT. Meanwhile it serves /metrics, /healthz and /readyz
// (and the operator console, with EXTWORKER_CONSOLE_ADDR)
// and prunes the ledger hourly.
func (a *App) Run(ctx context.Context) error {
	if len(a.errs) > 0 {
		return errors.Join(a.errs...)
	}
	if len(a.registry.Topics()) == 0 && !a.consumes() && !a.servesHumanTasks() {
		return daemon.ConfigError{Err: errors.New("no topics registered and no messages taken in: call App.Handle, App.Consume, App.ConsumeKafka or App.Callback before Run (or serve human tasks: EXTWORKER_TASKS_ADDR)")}
	}
	_, stopOps, err := daemon.StartOps(ctx, a.ops, a.promReg, a.client, a.opsPool, a.metrics, a.logger)
	if err != nil {
		return err
	}
	defer stopOps()
	if a.console != nil {
		_, stopConsole, err := a.console.Start(ctx)
		if err != nil {
			return err
		}
		defer stopConsole()
	}
	if a.servesHumanTasks() {
		stopTasks, err := a.serveHumanTasks(ctx)
		if err != nil {
			return err
		}
		defer stopTasks()
	}
	var background sync.WaitGroup
	defer background.Wait()
	// What Run started in the background ends with it, on an error too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := a.runChannels(ctx, &background); err != nil {
		return err
	}
	if retention := a.cfg.LedgerRetention; retention > 0 {
		background.Go(func() {
			daemon.PrunePeriodically(ctx, "settled intents", func(ctx context.Context) (int64, error) { return a.ledger.Operations().Prune(ctx, retention) },
				time.Hour, a.logger)
		})
		if a.relay != nil {
			background.Go(func() {
				daemon.PrunePeriodically(ctx, "published outbox events", func(ctx context.Context) (int64, error) { return a.relay.Prune(ctx, retention) },
					time.Hour, a.logger)
			})
		}
		if a.consumes() {
			background.Go(func() {
				daemon.PrunePeriodically(ctx, "settled inbox messages", func(ctx context.Context) (int64, error) { return inbox.Prune(ctx, a.pool, retention) },
					time.Hour, a.logger)
			})
		}
	}
	if len(a.registry.Topics()) == 0 {
		<-ctx.Done() // a process that only consumes
		return nil
	}
	wcfg := a.cfg.WorkerConfig(a.logger)
	wcfg.Observer = a.metrics
	wcfg.OnTaskGone = a.orphaned
	w, err := tasks.New(a.client, a.registry, wcfg)
	if err != nil {
		return err
	}
	err = w.Run(ctx)
	if errors.Is(err, tasks.ErrCredentialsRejected) {
		// Credentials that stopped working under a running worker: the same exit as
		// credentials rejected at start.
		err = daemon.ConfigError{Err: err}
	}
	return a.cfg.ScrubError(err)
}

// orphaned flags the intents of a task the engine cancelled (tasks.Config.OnTaskGone).
func (a *App) orphaned(ctx context.Context, g tasks.Gone) {
	if _, err := a.ledger.Operations().MarkOrphaned(ctx, g.ProcessInstanceID, g.TaskID, g.Reason); err != nil {
		a.logger.Error("flagging the intents of a cancelled task failed; find them with `extworker effects list`",
			slog.String("external_task_id", g.TaskID), slog.String("process_instance_id", g.ProcessInstanceID), slog.Any("error", err))
	}
}

// Close releases the ledger's and the operations server's database pools, and the
// broker connection, and flushes the spans not yet exported (for at most 5s).
func (a *App) Close() {
	if a.pub != nil {
		_ = a.pub.Close()
	}
	if a.pool != nil {
		a.pool.Close()
	}
	if a.opsPool != nil {
		a.opsPool.Close()
	}
	if a.console != nil {
		a.console.Close()
	}
	for _, p := range a.inboxPools {
		p.Close()
	}
	if a.stopTracing != nil {
		ctx, cancel := context.WithTimeout(context.Background(), tracingFlushTimeout)
		defer cancel()
		if err := a.stopTracing(ctx); err != nil {
			a.logger.Warn("flushing the last spans failed; they are lost", slog.Any("error", err))
		}
		a.stopTracing = nil
	}
}

// tracingFlushTimeout bounds Close's flush of the spans not yet exported.
const tracingFlushTimeout = 5 * time.Second

// Main is a worker program's whole main: it builds the App from the environment, lets
// setup register the handlers, and runs until SIGINT or SIGTERM. It exits 0 after a
// graceful stop, ExitConfig (78) for a configuration the worker cannot run with
// (invalid variables, credentials rejected at start or for tasks.Config's
// CredentialsRejectedFor while running, no topic), 130 or 143 on a second signal,
// and 1 for any other error, which it prints first. It never returns.
func Main(setup func(*App) error) {
	err := Serve(Options{}, func(ctx context.Context, app *App) error {
		if err := setup(app); err != nil {
			return err
		}
		return app.Run(ctx)
	})
	os.Exit(exitWith(os.Stderr, err))
}

// exitWith is Main's exit status for err, after printing err (if any) to w. An error
// may quote what came from outside (an engine's answer, a header, a variable): printed
// escaped (package termsafe), it cannot act on the terminal.
func exitWith(w io.Writer, err error) int {
	if err == nil {
		return 0
	}
	fmt.Fprintln(w, "extworker:", termsafe.String(err.Error()))
	if IsConfigError(err) {
		return ExitConfig
	}
	return 1
}

// Serve is Main for a program with commands of its own (`myworker run` beside its
// `migrate`, which calls Migrate) or with something to set up and tear down around its
// handlers: it builds the App with opts, calls run with it and a context that the first
// SIGINT or SIGTERM ends (a second one exits at once with 130 or 143), closes the App,
// and returns run's error. run registers the handlers and calls app.Run(ctx). A
// configuration the worker cannot run with is an error IsConfigError reports.
func Serve(opts Options, run func(ctx context.Context, app *App) error) error {
	if opts.Logger == nil {
		cfg, _ := daemon.LoadConfig() // for the logger; New reports its problems
		opts.Logger = daemon.NewLogger(cfg, opts.logOutput())
	}
	ctx, stop := SignalContext(opts.Logger)
	defer stop()
	app, err := New(ctx, opts)
	if err != nil {
		return err
	}
	defer app.Close()
	return app.cfg.ScrubError(run(ctx, app))
}

// SignalContext returns a context the first SIGINT or SIGTERM cancels, for a graceful
// stop; a second one, while that stop is under way, logs a record and exits the process
// at once with 130 or 143. stop releases the signals.
func SignalContext(logger *slog.Logger) (ctx context.Context, stop func()) {
	return daemon.SignalContext(logger, os.Exit)
}

// PrintConfig is a program's `config` command, as `extworker config`: every EXTWORKER_
// variable with its value (defaults applied) and where it came from, secrets masked;
// args may be [-json]. With an invalid configuration it prints what it could read and
// returns every problem.
//
// specs are the program's own settings, if it reads any: pointers to structs read with
// envconfig.Process("EXTWORKER", spec), their envconfig tags without the EXTWORKER_
// prefix; they are printed beside the framework's.
func PrintConfig(args []string, stdout, stderr io.Writer, specs ...any) error {
	return daemon.ConfigCommand(args, stdout, stderr, specs...)
}

func (o Options) logOutput() io.Writer {
	if o.LogOutput == nil {
		return os.Stderr
	}
	return o.LogOutput
}
