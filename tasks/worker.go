package tasks

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/lockext"
)

// ErrShutdown is the context cause a handler sees when the worker stops and the grace
// period for running handlers has passed.
var ErrShutdown = errors.New("tasks: worker shutting down")

// NoLongPoll, as Config.AsyncResponseTimeout, turns long polling off.
const NoLongPoll time.Duration = -1

// Config configures a Worker. Zero values take the documented defaults.
type Config struct {
	// WorkerID is the id tasks are locked for. Default DefaultWorkerID(): host, pid and a
	// random suffix, unique per process start, so two processes never share locks.
	WorkerID string
	// MaxConcurrency is how many handlers run at once; the worker never locks more tasks
	// than it has free slots. Default 16.
	MaxConcurrency int
	// AsyncResponseTimeout is the long poll: how long the engine holds a fetch with
	// nothing to return. Keep it below any proxy's idle timeout. Default 20s; NoLongPoll
	// (any negative value) turns long polling off, and idle polls are then paced by
	// IdlePollInterval. A long poll as long as the lock, or longer, is safe: a task the
	// engine hands over late in a poll is extended before its handler starts.
	AsyncResponseTimeout time.Duration
	// IgnorePriority fetches without usePriority (by default higher-priority tasks come
	// first, as in the official clients).
	IgnorePriority bool
	// FetchBackoffInitial and FetchBackoffMax bound the jittered exponential backoff
	// after a failed fetch. Defaults 500ms and 10s: after an engine restart the worker
	// is back within 10s, at the cost of one small request per 10s per worker while the
	// engine is down. An empty result is not a failure: the long poll already waits.
	FetchBackoffInitial time.Duration
	FetchBackoffMax     time.Duration
	// CredentialsRejectedFor is how long fetches may go on being refused for credentials
	// (401 or 403, after the client's one token refresh) before Run stops as it does at
	// shutdown and returns ErrCredentialsRejected: a password rotated under the worker, or
	// a revoked client, is a configuration to fix, not an outage to wait out. Default 1m;
	// negative: back off forever.
	CredentialsRejectedFor time.Duration
	// ReportTimeout bounds each complete/failure/bpmnError call. Default 10s.
	ReportTimeout time.Duration
	// ReportConcurrency bounds how many tasks report their results (or are unlocked) at
	// once; the others wait their turn, their locks kept alive meanwhile. Thousands of
	// long-running handlers that end together would otherwise send thousands of
	// completes at once: the engine answers them at its own pace, the ones waiting for a
	// connection run out their ReportTimeout unsent and are sent again, and each holds
	// its request and a deep stack meanwhile. It binds only when MaxConcurrency is
	// larger. Default 64.
	ReportConcurrency int
	// ReportAttempts is how often a report certainly not delivered (or resolved as not
	// applied) is sent at least, however short ReportRetryFor is. Default 5.
	ReportAttempts int
	// ReportRetryFor bounds how long a report (complete, failure, bpmnError) that was
	// certainly not sent, or whose answer was lost, is sent again with backoff, for as
	// long as it can still take effect: the lock is ours, or the engine shows the task
	// still ours or unlocked and not taken. The lock is kept alive meanwhile and the task
	// is not run again here. It is what lets a report outlast an engine restart.
	// Default 5m.
	ReportRetryFor time.Duration
	// LockWatch is how often, while a long poll is pending, the worker asks the engine
	// when the earliest lock another worker holds on its topics ends (one query per
	// topic), to wake its poll then: the engine does not hand a task whose lock ran out to
	// a pending poll until the poll ends (docs/engine-facts.md), so a dead peer's task
	// would wait up to AsyncResponseTimeout after its lock. The watch also queries again
	// when a lock it saw is due to end, to tell a dead worker's lock (not extended: the
	// poll is woken) from a live one's (extended: nothing to do), at most every 0.5 s
	// while a dead worker's locks end one after the other. A lock shorter than the period
	// taken just after a query is seen only at the next one. The end of a retry timeout
	// the worker reported itself wakes its poll without a query. Default: the long poll
	// or the shortest lock of the topics, whichever is shorter (at defaults 20s: 3
	// queries a minute per topic while idle and no other worker holds a lock, none while
	// every slot is busy); at least 1s; negative: no watch.
	LockWatch time.Duration
	// IdlePollInterval is the least time between the starts of two fetches when the first
	// one came back empty: with NoLongPoll, or an engine that
	// answers a long poll early, idle polls wait instead of running back to back.
	// Default 1s.
	IdlePollInterval time.Duration
	// ShutdownGrace is how long Run waits, once its context ends, for running handlers
	// to finish before cancelling them with ErrShutdown. Default 30s.
	ShutdownGrace time.Duration
	// ShutdownTimeout bounds Run's shutdown as a whole: once its context has ended for
	// this long, Run returns even if a handler that ignores its context is still running
	// (that task's lock then runs out and the engine hands it to another worker). It must
	// be longer than ShutdownGrace. Default ShutdownGrace + 15s.
	ShutdownTimeout time.Duration
	// Logger receives the worker's records; every record about a task carries the same
	// fields (see package doc). Default discard.
	Logger *slog.Logger
	// Observer receives counts and timings for metrics (package metrics implements it).
	// Default NopObserver.
	Observer Observer
	// LockExtension tunes the one scheduler that keeps the locks of all the worker's
	// running tasks alive (lockext.Scheduler): how many extendLock calls may be in
	// flight at once, and how extensions due together are spread and paced. Zero fields
	// take lockext's defaults.
	LockExtension lockext.SchedulerConfig
	// OnTaskGone, if set, is told when a task this worker handled was cancelled by the
	// engine (its process instance deleted, or its activity interrupted by a boundary
	// event) while or after the handler ran: the engine's history records the task's
	// deletion, and no worker completed it. Whatever the handler did has no process to
	// report to; the effect ledger flags such intents orphaned for an operator
	// (idempotency.Operations.MarkOrphaned). A task that is gone because another worker
	// completed it after this one's lock expired is not cancelled, and not reported.
	OnTaskGone func(ctx context.Context, g Gone)
}

// Gone describes a cancelled task, for Config.OnTaskGone.
type Gone struct {
	TaskID, ProcessInstanceID, Topic, BusinessKey string
	// Reason says what the worker saw: the 404 and the engine's deletion record.
	Reason string
}

// DefaultWorkerID returns "<host>-<pid>-<random>".
func DefaultWorkerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "extworker"
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// WithDefaults returns a copy of c with defaults filled in.
func (c Config) WithDefaults() Config {
	if c.WorkerID == "" {
		c.WorkerID = DefaultWorkerID()
	}
	if c.MaxConcurrency == 0 {
		c.MaxConcurrency = 16
	}
	if c.AsyncResponseTimeout == 0 {
		c.AsyncResponseTimeout = 20 * time.Second
	}
	if c.FetchBackoffInitial == 0 {
		c.FetchBackoffInitial = 500 * time.Millisecond
	}
	if c.CredentialsRejectedFor == 0 {
		c.CredentialsRejectedFor = time.Minute
	}
	if c.FetchBackoffMax == 0 {
		c.FetchBackoffMax = 10 * time.Second
	}
	if c.ReportTimeout == 0 {
		c.ReportTimeout = 10 * time.Second
	}
	if c.ReportAttempts == 0 {
		c.ReportAttempts = 5
	}
	if c.ReportConcurrency == 0 {
		c.ReportConcurrency = 64
	}
	if c.ReportRetryFor == 0 {
		c.ReportRetryFor = 5 * time.Minute
	}
	if c.IdlePollInterval == 0 {
		c.IdlePollInterval = time.Second
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 30 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = c.ShutdownGrace + 15*time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Observer == nil {
		c.Observer = NopObserver{}
	}
	return c
}

// Validate names every bad field.
func (c Config) Validate() error {
	var errs []error
	if c.MaxConcurrency < 1 {
		errs = append(errs, fmt.Errorf("MaxConcurrency %d: must be at least 1", c.MaxConcurrency))
	}
	if c.AsyncResponseTimeout > camunda7.MaxAsyncResponseTimeout {
		errs = append(errs, fmt.Errorf("AsyncResponseTimeout %v: must be at most %v (or NoLongPoll)", c.AsyncResponseTimeout, camunda7.MaxAsyncResponseTimeout))
	}
	if c.FetchBackoffInitial <= 0 || c.FetchBackoffMax < c.FetchBackoffInitial {
		errs = append(errs, fmt.Errorf("FetchBackoffInitial %v and FetchBackoffMax %v: need 0 < initial <= max", c.FetchBackoffInitial, c.FetchBackoffMax))
	}
	if c.ReportTimeout <= 0 {
		errs = append(errs, fmt.Errorf("ReportTimeout %v: must be positive", c.ReportTimeout))
	}
	if c.ReportConcurrency < 1 {
		errs = append(errs, fmt.Errorf("ReportConcurrency %d: must be at least 1", c.ReportConcurrency))
	}
	if c.ReportAttempts < 1 {
		errs = append(errs, fmt.Errorf("ReportAttempts %d: must be at least 1", c.ReportAttempts))
	}
	if c.ReportRetryFor < 0 {
		errs = append(errs, fmt.Errorf("ReportRetryFor %v: must not be negative", c.ReportRetryFor))
	}
	if c.LockWatch > 0 && c.LockWatch < time.Second {
		errs = append(errs, fmt.Errorf("LockWatch %v: must be at least 1s (or negative: no watch): each watch is a query per topic", c.LockWatch))
	}
	if c.IdlePollInterval < 0 {
		errs = append(errs, fmt.Errorf("IdlePollInterval %v: must not be negative", c.IdlePollInterval))
	}
	if c.ShutdownGrace < 0 {
		errs = append(errs, fmt.Errorf("ShutdownGrace %v: must not be negative", c.ShutdownGrace))
	}
	if c.ShutdownTimeout <= c.ShutdownGrace {
		errs = append(errs, fmt.Errorf("ShutdownTimeout %v: must be longer than ShutdownGrace %v", c.ShutdownTimeout, c.ShutdownGrace))
	}
	if err := c.LockExtension.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("LockExtension: %w", err))
	}
	if len(errs) > 0 {
		return fmt.Errorf("tasks config: %w", errors.Join(errs...))
	}
	return nil
}

// Worker fetches tasks for the registry's topics and runs their handlers.
type Worker struct {
	c   Engine
	reg *Registry
	cfg Config
	log *slog.Logger
	obs Observer

	running atomic.Bool
	// locks keeps the running tasks' locks alive; created by Run, closed when it returns.
	locks *lockext.Scheduler
	// extend is each topic's lock extension settings, built by Run: a task adds its logger.
	extend map[string]lockext.Config

	mu          sync.Mutex
	inflight    int
	perTopic    map[string]int
	active      map[string]bool      // ids of tasks whose handler runs here
	held        map[string]time.Time // ids reported as failed, locked for us until their retry timeout ends
	heldPurgeAt int                  // held's size at which holdForRetry next drops expired entries
	freed       chan struct{}        // a slot came free: poll again
	reporting   chan struct{}        // one element per task reporting its result (ReportConcurrency)
	handlers    sync.WaitGroup

	wakes   *wakeSchedule // when to wake the pending long poll (wake.go)
	polling *pollState    // whether a long poll is pending
	stats   Stats
	changes atomic.Int64 // reports and unlocks sent: each may wake an abandoned long poll
}

// Stats counts what a worker did, for tests and the demo; metrics go through Config.Observer.
type Stats struct {
	Fetched, Completed, BPMNErrors, Failures, Incidents, LockLost, Unlocked, ReportErrors atomic.Int64
	// Deferred counts attempts reported as deferred (failure.Deferred): waiting for work in
	// progress elsewhere, with the task's retries unchanged. They are not Failures.
	Deferred atomic.Int64
	// Orphans counts tasks found locked for this worker that no handler here runs (a
	// fetch whose answer was lost locked them), unlocked so they need not wait out their lock.
	Orphans atomic.Int64
	// Redelivered counts tasks the engine handed back to this worker while their handler
	// was still running here (after an unlock, say): they are not run twice.
	Redelivered atomic.Int64
	// Wakes counts the wakes sent to the engine when a task the worker knew of became
	// fetchable during its long poll; LockWatches the queries for other workers' locks.
	Wakes, LockWatches atomic.Int64
	// MaxInFlight is the highest number of handlers that ran at once.
	MaxInFlight atomic.Int64
}

// New returns a worker for the registry's topics that talks to the engine through c: a
// *camunda7.Client in production, a taskstest.Engine in handler tests.
func New(c Engine, reg *Registry, cfg Config) (*Worker, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if isNil(c) || reg == nil || len(reg.topics) == 0 {
		return nil, errors.New("tasks: an engine client and a registry with at least one topic are required")
	}
	w := &Worker{c: c, reg: reg, cfg: cfg, log: cfg.Logger.With(slog.String("worker_id", cfg.WorkerID)), obs: cfg.Observer,
		perTopic: map[string]int{}, active: map[string]bool{}, held: map[string]time.Time{}, freed: make(chan struct{}, 1),
		reporting: make(chan struct{}, cfg.ReportConcurrency), wakes: newWakeSchedule(), polling: newPollState()}
	return w, nil
}

// extendConfig returns the lock extension settings of t's tasks. The callbacks are the
// topic's, not the task's: no closures per task.
func (w *Worker) extendConfig(t *topic) lockext.Config {
	return lockext.Config{LockDuration: t.opts.LockDuration, MaxRunTime: t.opts.MaxRunTime,
		OnExtend: func(err error) {
			w.obs.LockExtended(t.name, err)
			if err != nil && !lockext.LostAnswer(err) {
				w.obs.EngineError("extend-lock", err)
			}
		},
		OnEnd: func(cause error) { w.obs.LockLost(t.name, lockLostReason(cause)) },
	}
}

// WorkerID returns the id tasks are locked for.
func (w *Worker) WorkerID() string { return w.cfg.WorkerID }

// Stats returns the worker's counters.
func (w *Worker) Stats() *Stats { return &w.stats }

// InFlight returns how many handlers are running.
func (w *Worker) InFlight() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.inflight
}

// ErrShutdownTimeout is returned by Run when handlers were still running
// Config.ShutdownTimeout after its context ended: Run left them, and their tasks return
// to the engine when their locks run out.
var ErrShutdownTimeout = errors.New("tasks: handlers still running at the shutdown timeout")

// ErrCredentialsRejected is returned by Run when the engine refused its fetches for
// credentials (401 or 403) for Config.CredentialsRejectedFor: Run stopped as at shutdown.
// The error also wraps the engine's answer (camunda7.ErrUnauthorized).
var ErrCredentialsRejected = errors.New("tasks: the engine rejects the worker's credentials")

// Run fetches and handles tasks until ctx ends. Then it stops polling: a long poll
// pending on the engine is not abandoned (the engine would go on locking tasks for it,
// for a worker that is gone) but waited for, and whatever it returns is unlocked at once.
// Running handlers get ShutdownGrace to finish, then are cancelled with ErrShutdown (their
// tasks unlocked, no retry spent); Run returns once every result has been reported, and
// at the latest ShutdownTimeout after ctx ended (then with ErrShutdownTimeout). Results are
// reported with their own timeouts, never cut short by the shutdown.
func (w *Worker) Run(parent context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("tasks: worker already running")
	}
	// The fetch loop ends the run itself when the engine keeps rejecting the credentials:
	// ctx then ends with that cause, and the shutdown below runs as for parent's end.
	ctx, stopRun := context.WithCancelCause(parent)
	defer stopRun(nil)
	if err := w.startLocks(); err != nil {
		return err // validated by New
	}
	// Closed when Run returns: a handler still running after the shutdown timeout is
	// left, and its lock runs out.
	defer w.locks.Close()
	workCtx, stopWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopWork(ErrShutdown)
	// pollCtx outlives ctx, so that a pending long poll ends on the engine's side and
	// returns what it locked; it ends at the shutdown timeout.
	pollCtx, cancelPoll := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelPoll()
	w.log.Info("worker started", slog.Any("topics", w.reg.Topics()), slog.Int("max_concurrency", w.cfg.MaxConcurrency),
		slog.Duration("long_poll", w.cfg.AsyncResponseTimeout))
	sd := w.watchShutdown(ctx, stopWork, cancelPoll)
	defer sd.close()

	wakeDone := make(chan struct{})
	go func() { defer close(wakeDone); w.wakeLoop(ctx) }()
	defer func() { <-wakeDone }()
	pollEnd := w.fetchLoop(ctx, pollCtx, workCtx, stopRun)
	<-sd.stopping
	if err := w.drain(pollEnd, sd.hardOver); err != nil {
		return err
	}
	w.sweepOrphans(context.WithoutCancel(workCtx))
	w.log.Info("worker stopped")
	if cause := context.Cause(ctx); parent.Err() == nil && errors.Is(cause, ErrCredentialsRejected) {
		return cause
	}
	return nil
}

// startLocks starts the one scheduler that keeps every running task's lock alive, and
// builds each topic's lock extension settings (topics may be registered until Run): a
// task adds only its logger.
func (w *Worker) startLocks() error {
	locks, err := lockext.NewScheduler(w.c, w.cfg.LockExtension)
	if err != nil {
		return err
	}
	w.locks = locks
	w.extend = make(map[string]lockext.Config, len(w.reg.topics))
	for _, t := range w.reg.topics {
		w.extend[t.name] = w.extendConfig(t)
	}
	return nil
}

// shutdown is the watcher of a Run's end (watchShutdown).
type shutdown struct {
	stopping chan struct{} // closed when Run's ctx ends
	hardOver chan struct{} // closed at the shutdown timeout
	runDone  chan struct{} // closed when Run returns
	done     chan struct{} // closed when the watcher has returned
}

// close tells the watcher that Run returns, and waits for it.
func (s *shutdown) close() { close(s.runDone); <-s.done }

// watchShutdown starts the shutdown clocks when ctx ends: ShutdownGrace for handlers
// (then stopWork cancels them with ErrShutdown), ShutdownTimeout for Run as a whole
// (then cancelPoll abandons a pending poll, and hardOver closes).
func (w *Worker) watchShutdown(ctx context.Context, stopWork context.CancelCauseFunc, cancelPoll context.CancelFunc) *shutdown {
	s := &shutdown{stopping: make(chan struct{}), hardOver: make(chan struct{}), runDone: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		select {
		case <-ctx.Done():
		case <-s.runDone:
			return
		}
		close(s.stopping)
		// A pending long poll is waited for (at most long_poll), so that the engine locks
		// nothing for this worker once it has gone.
		w.log.Info("worker stopping", slog.Int("running_handlers", w.InFlight()), slog.Duration("long_poll", max(w.cfg.AsyncResponseTimeout, 0)),
			slog.Duration("grace", w.cfg.ShutdownGrace), slog.Duration("timeout", w.cfg.ShutdownTimeout))
		grace := time.NewTimer(w.cfg.ShutdownGrace)
		defer grace.Stop()
		hard := time.NewTimer(w.cfg.ShutdownTimeout)
		defer hard.Stop()
		for {
			select {
			case <-grace.C:
				if n := w.InFlight(); n > 0 {
					w.log.Warn("grace period over; cancelling running handlers", slog.Int("running_handlers", n))
				}
				stopWork(ErrShutdown)
			case <-hard.C:
				cancelPoll()
				close(s.hardOver)
				return
			case <-s.runDone:
				return
			}
		}
	}()
	return s
}

// drain waits for the running handlers to report, until hardOver (then it returns
// ErrShutdownTimeout). A poll that failed without an answer may still be pending on the
// engine until pollEnd, and the engine locks for it any task that appears meanwhile (our
// own completions create the next tasks of their processes, our unlocks wake it): if we
// changed anything since, drain waits for that poll to end, so that the sweep after it
// releases what it locked.
func (w *Worker) drain(pollEnd time.Time, hardOver <-chan struct{}) error {
	changes := w.changes.Load()
	done := make(chan struct{})
	go func() { w.handlers.Wait(); close(done) }()
	select {
	case <-done:
	case <-hardOver:
		running := w.activeIDs()
		w.log.Error("shutdown timeout: handlers still running; leaving them, their tasks return when their locks run out",
			slog.Duration("timeout", w.cfg.ShutdownTimeout), slog.Any("external_task_ids", running))
		return fmt.Errorf("%w: %d after %v (%v)", ErrShutdownTimeout, len(running), w.cfg.ShutdownTimeout, running)
	}
	if wait := time.Until(pollEnd); wait > 0 && w.changes.Load() != changes {
		w.log.Info("waiting for the engine to drop a long poll whose answer was lost", slog.Duration("wait", wait))
		w.wait(context.Background(), hardOver, wait)
	}
	return nil
}

// activeIDs returns the ids of the tasks whose handlers run here, sorted.
func (w *Worker) activeIDs() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]string, 0, len(w.active))
	for id := range w.active {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
