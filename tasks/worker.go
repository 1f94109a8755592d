package tasks

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sethvargo/go-retry"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
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
	// (idempotency.Ledger.MarkOrphaned). A task that is gone because another worker
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
		reporting: make(chan struct{}, cfg.ReportConcurrency)}
	return w, nil
}

// extendConfig returns the lock extension settings of t's tasks. The callbacks are the
// topic's, not the task's: no closures per task.
func (w *Worker) extendConfig(t *topic) lockext.Config {
	return lockext.Config{LockDuration: t.opts.LockDuration, MaxRunTime: t.opts.MaxRunTime,
		OnExtend: func(err error) {
			w.obs.LockExtended(t.name, err)
			if err != nil && !lockext.LostAnswer(err) {
				w.obs.EngineError("extend_lock", err)
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
	// One scheduler keeps every running task's lock alive. Closed when Run returns: a
	// handler still running after the shutdown timeout is left, and its lock runs out.
	locks, err := lockext.NewScheduler(w.c, w.cfg.LockExtension)
	if err != nil {
		return err // validated by New
	}
	w.locks = locks
	defer locks.Close()
	// Each topic's lock extension settings, built once the registry is complete (topics
	// may be registered until Run): a task adds only its logger.
	w.extend = make(map[string]lockext.Config, len(w.reg.topics))
	for _, t := range w.reg.topics {
		w.extend[t.name] = w.extendConfig(t)
	}
	workCtx, stopWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopWork(ErrShutdown)
	// pollCtx outlives ctx, so that a pending long poll ends on the engine's side and
	// returns what it locked; it ends at the shutdown timeout.
	pollCtx, cancelPoll := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelPoll()
	w.log.Info("worker started", slog.Any("topics", w.reg.Topics()), slog.Int("max_concurrency", w.cfg.MaxConcurrency),
		slog.Duration("long_poll", w.cfg.AsyncResponseTimeout))

	// The watcher starts the shutdown clocks when ctx ends: ShutdownGrace for handlers,
	// ShutdownTimeout for Run as a whole.
	var (
		runDone   = make(chan struct{})
		watchDone = make(chan struct{})
		stopping  = make(chan struct{})
		hardOver  = make(chan struct{})
	)
	go func() {
		defer close(watchDone)
		select {
		case <-ctx.Done():
		case <-runDone:
			return
		}
		close(stopping)
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
				close(hardOver)
				return
			case <-runDone:
				return
			}
		}
	}()
	defer func() { close(runDone); <-watchDone }()

	pollEnd := w.fetchLoop(ctx, pollCtx, workCtx, stopRun)
	<-stopping
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
	// A poll that failed without an answer may still be pending on the engine, which locks
	// for it any task that appears meanwhile (our own completions create the next tasks of
	// their processes, our unlocks wake it). If we changed anything since, wait for that
	// poll to end on the engine and release what it locked.
	if wait := time.Until(pollEnd); wait > 0 && w.changes.Load() != changes {
		w.log.Info("waiting for the engine to drop a long poll whose answer was lost", slog.Duration("wait", wait))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-hardOver:
		}
		t.Stop()
	}
	w.sweepOrphans(context.WithoutCancel(workCtx))
	w.log.Info("worker stopped")
	if cause := context.Cause(ctx); parent.Err() == nil && errors.Is(cause, ErrCredentialsRejected) {
		return cause
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

// fetchLoop polls while ctx lives, asking only for as many tasks as there are free slots.
// Each poll runs on pollCtx, which outlives ctx: the engine does not notice a client
// leaving a long poll, and would go on locking tasks for it, so a poll pending at
// shutdown is waited for and what it returns unlocked at once.
//
// It returns the time by which a poll that failed without an answer has surely ended on
// the engine (zero if none may be pending).
func (w *Worker) fetchLoop(ctx, pollCtx, workCtx context.Context, stopRun context.CancelCauseFunc) (pollEnd time.Time) {
	var (
		backoff   retry.Backoff
		failures  int
		failSince time.Time
		sweepAt   time.Time // when to look for orphaned locks; zero: no need
		limit     int       // maxTasks cap after answers too large to read; 0: none
		rejected  time.Time // since when every fetch was refused for credentials; zero: not
	)
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	for ctx.Err() == nil {
		req, ok := w.plan(limit)
		if !ok {
			select {
			case <-w.freed:
			case <-ctx.Done():
			}
			continue
		}
		if !sweepAt.IsZero() && time.Now().After(sweepAt) && w.sweepOrphans(ctx) {
			sweepAt = time.Time{}
		}
		sentAt := time.Now()
		got, err := w.c.FetchAndLock(pollCtx, req)
		if err != nil {
			if ctx.Err() != nil {
				if errors.Is(err, camunda7.ErrNotSent) {
					return time.Time{}
				}
				return sentAt.Add(req.AsyncResponseTimeout + 500*time.Millisecond)
			}
			w.obs.Polled(0, time.Since(sentAt), err)
			w.obs.EngineError("fetch_and_lock", err)
			if errors.Is(err, camunda7.ErrResponseTooLarge) {
				// The engine locked the tasks but its answer was too large to read. Fetching
				// the same number again would only repeat it: ask for fewer, and give back
				// what this poll locked; a single task too large to receive is failed with
				// an incident instead of cycling through its lock forever.
				if req.MaxTasks > 1 {
					limit = max(1, req.MaxTasks/2)
					w.log.Warn("the engine's answer was larger than the client accepts; fetching fewer tasks at a time",
						slog.Int("max_tasks", limit), slog.Any("error", err))
					w.sweepOrphans(ctx)
				} else {
					w.failOversized(workCtx, err)
				}
				continue
			}
			if errors.Is(err, camunda7.ErrUnauthorized) {
				if rejected.IsZero() {
					rejected = time.Now()
				}
				if lasted := time.Since(rejected); w.cfg.CredentialsRejectedFor >= 0 && lasted >= w.cfg.CredentialsRejectedFor {
					w.log.Error("the engine has rejected the worker's credentials for too long; stopping",
						slog.Duration("for", lasted.Round(time.Millisecond)), slog.Any("error", err))
					stopRun(fmt.Errorf("%w for %v: %w", ErrCredentialsRejected, lasted.Round(time.Millisecond), err))
					return time.Time{}
				}
			} else {
				rejected = time.Time{}
			}
			if !errors.Is(err, camunda7.ErrNotSent) {
				// The engine may still hold this poll and lock tasks for it that will never
				// arrive. Once the poll has surely ended there, release such locks.
				sweepAt = time.Now().Add(max(w.cfg.AsyncResponseTimeout, 0) + time.Second)
			}
			if failures == 0 {
				failSince = time.Now()
				backoff = retry.WithCappedDuration(w.cfg.FetchBackoffMax, retry.WithJitterPercent(20, retry.NewExponential(w.cfg.FetchBackoffInitial)))
				w.log.Warn("fetching tasks failed; backing off until the engine answers", slog.Any("error", err))
			} else {
				w.log.Debug("fetching tasks failed again", slog.Int("failures", failures+1), slog.Any("error", err))
			}
			failures++
			d, _ := backoff.Next()
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return sweepAt // the failed poll may still be pending on the engine
			}
			continue
		}
		if limit > 0 && len(got) > 0 {
			if limit *= 2; limit >= w.cfg.MaxConcurrency {
				limit = 0
			}
		}
		rejected = time.Time{}
		if failures > 0 {
			w.log.Info("fetching tasks recovered", slog.Int("failures", failures), slog.Duration("after", time.Since(failSince)))
			failures = 0
		}
		w.stats.Fetched.Add(int64(len(got)))
		w.obs.Polled(len(got), time.Since(sentAt), nil)
		for _, t := range got {
			w.obs.Fetched(t.TopicName)
		}
		if ctx.Err() != nil {
			// Shutdown began while the answer was on its way: these tasks will not be
			// started, so hand them back at once instead of holding them until their
			// locks expire.
			for _, t := range got {
				w.unlock(workCtx, t.ID, w.log.With(slog.String("topic", t.TopicName), slog.String("external_task_id", t.ID)))
			}
			return time.Time{}
		}
		for _, t := range got {
			w.start(workCtx, t, sentAt)
		}
		if len(got) == 0 {
			// Idle: with no long poll (or an engine answering early), the next poll waits
			// until IdlePollInterval after this one was sent, instead of following at once.
			if wait := time.Until(sentAt.Add(w.cfg.IdlePollInterval)); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-ctx.Done():
					timer.Stop()
				}
			}
		}
	}
	return time.Time{}
}

// plan builds the next fetch from the free slots. Only the fetch loop takes slots, so
// the free count can only grow between plan and start. With per-topic limits the one
// request asks for the smallest free count among the topics it includes: the engine's
// maxTasks is shared by all topics, and no topic may get more tasks than it can start.
//
// limit, if positive, caps maxTasks further (after answers too large to read).
func (w *Worker) plan(limit int) (camunda7.FetchAndLockRequest, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	global := w.cfg.MaxConcurrency - w.inflight
	if limit > 0 {
		global = min(global, limit)
	}
	if global <= 0 {
		return camunda7.FetchAndLockRequest{}, false
	}
	req := camunda7.FetchAndLockRequest{WorkerID: w.cfg.WorkerID, MaxTasks: global, UsePriority: !w.cfg.IgnorePriority,
		AsyncResponseTimeout: max(w.cfg.AsyncResponseTimeout, 0)}
	for _, name := range w.reg.names { // sorted, without Topics' copy: plan runs before every poll
		t := w.reg.topics[name]
		free := global
		if t.opts.MaxConcurrency > 0 {
			free = min(free, t.opts.MaxConcurrency-w.perTopic[name])
		}
		if free <= 0 {
			continue
		}
		req.MaxTasks = min(req.MaxTasks, free)
		req.Topics = append(req.Topics, t.fetch)
	}
	return req, len(req.Topics) > 0
}

// start takes a slot for the task and runs it.
func (w *Worker) start(workCtx context.Context, raw camunda7.LockedExternalTask, sentAt time.Time) {
	t, ok := w.reg.topics[raw.TopicName]
	if !ok {
		// Never asked for; give it back at once rather than hold it until the lock expires.
		w.log.Error("engine returned a task for an unregistered topic; unlocking it", slog.String("topic", raw.TopicName), slog.String("task_id", raw.ID))
		w.unlock(workCtx, raw.ID, w.log)
		return
	}
	w.mu.Lock()
	if w.active[raw.ID] {
		// Locked again for our own worker id while its handler runs here: the running
		// handler's extender keeps the new lock alive; a second run would duplicate work.
		w.mu.Unlock()
		w.stats.Redelivered.Add(1)
		w.log.Warn("task redelivered while its handler is still running here; not starting it twice",
			slog.String("topic", raw.TopicName), slog.String("external_task_id", raw.ID))
		return
	}
	w.active[raw.ID] = true
	delete(w.held, raw.ID) // back from its retry timeout
	w.inflight++
	w.perTopic[t.name]++
	if n := int64(w.inflight); n > w.stats.MaxInFlight.Load() {
		w.stats.MaxInFlight.Store(n)
	}
	inTopic, free := w.perTopic[t.name], w.cfg.MaxConcurrency-w.inflight
	w.mu.Unlock()
	w.obs.Slots(t.name, inTopic, free)
	// The task is built here, so that the goroutine holds one copy of what was fetched.
	task := newTask(raw, w.cfg.WorkerID, t.opts.Retry.Attempt(raw.Retries))
	task.fetch = &t.fetch
	w.handlers.Add(1)
	go func() {
		defer w.handlers.Done()
		defer w.release(t.name, task.ID())
		w.handle(workCtx, t, task, sentAt)
	}()
}

// sweepOrphans unlocks tasks locked for this worker id that no handler here runs and
// that are not waiting out a retry timeout we reported. The engine does not notice a
// client giving up on a long poll: it may still lock tasks for that poll, and they would
// sit locked for their whole lock duration. It reports whether the sweep ran.
func (w *Worker) sweepOrphans(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.ReportTimeout)
	defer cancel()
	stray, err := w.strayLocks(ctx)
	if err != nil {
		w.log.Debug("looking for orphaned locks failed; will try again", slog.Any("error", err))
		return false
	}
	for _, t := range stray {
		log := w.log.With(slog.String("topic", t.TopicName), slog.String("external_task_id", t.ID), slog.String("process_instance_id", t.ProcessInstanceID))
		log.Warn("unlocking a task locked for this worker by a fetch whose answer never arrived", slog.String("outcome", "unlocked"))
		w.unlock(ctx, t.ID, log)
		w.stats.Orphans.Add(1)
	}
	w.mu.Lock()
	w.dropExpiredHolds()
	w.mu.Unlock()
	return true
}

// strayLocks returns the tasks locked for this worker id that no handler here runs and
// that are not waiting out a retry timeout reported from here: what a poll whose answer
// never arrived (or could not be read) locked.
func (w *Worker) strayLocks(ctx context.Context) ([]camunda7.ExternalTask, error) {
	locked, err := w.c.ExternalTasks(ctx, camunda7.ExternalTaskQuery{WorkerID: w.cfg.WorkerID, Locked: true})
	if err != nil {
		w.obs.EngineError("query", err)
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	stray := locked[:0]
	for _, t := range locked {
		if until, held := w.held[t.ID]; w.active[t.ID] || (held && now.Before(until)) {
			continue
		}
		stray = append(stray, t)
	}
	return stray, nil
}

// failOversized fails, with an incident, the task that a fetch of maxTasks 1 locked for
// this worker but whose answer was too large to read (its variables exceed the client's
// MaxResponseBytes): no fetch could ever hand it over, and an unlock would only let the
// next poll lock it again.
func (w *Worker) failOversized(workCtx context.Context, fetchErr error) {
	ctx := context.WithoutCancel(workCtx)
	qctx, cancel := context.WithTimeout(ctx, w.cfg.ReportTimeout)
	defer cancel()
	stray, err := w.strayLocks(qctx)
	if err != nil {
		w.log.Warn("cannot find the task whose answer was too large; its lock will run out", slog.Any("error", err))
		return
	}
	for _, t := range stray {
		log := w.log.With(slog.String("topic", t.TopicName), slog.String("external_task_id", t.ID), slog.String("process_instance_id", t.ProcessInstanceID))
		msg := "permanent: the task's variables make the engine's answer larger than the worker accepts (camunda7.Config.MaxResponseBytes): fetch fewer or smaller variables, or raise the limit"
		details := fmt.Sprintf("extworker: failure report v1\nclassification: permanent\nretries left: 0: incident raised\nworker: %s\ntopic: %s\nexternal task: %s\nprocess instance: %s\noperator action: limit the topic's variables (TopicOptions.Variables) or raise MaxResponseBytes, then set retries > 0\n\nerror: %s\n",
			w.cfg.WorkerID, t.TopicName, t.ID, t.ProcessInstanceID, fetchErr)
		err := w.deliver(ctx, t.ID, func(ctx context.Context) error {
			return w.c.Failure(ctx, t.ID, camunda7.FailureRequest{WorkerID: w.cfg.WorkerID, ErrorMessage: msg, ErrorDetails: details})
		}, log)
		if err != nil {
			w.obs.EngineError("failure", err)
			log.Warn("failing a task too large to receive failed; its lock will run out", slog.Any("error", err))
			continue
		}
		w.stats.Incidents.Add(1)
		w.obs.Handled(t.TopicName, "incident", failure.KindPermanent.String(), 0)
		log.Warn("task too large to receive failed with an incident", slog.String("outcome", "incident"))
	}
}

// minHeldPurge is the size of the held map below which holdForRetry does not look for
// expired entries.
const minHeldPurge = 256

// holdForRetry remembers a task reported as failed: the engine keeps it locked for us
// until its retry timeout ends, and sweepOrphans must leave it alone. The map stays
// bounded by the tasks actually waiting out a retry timeout: an entry goes when the task
// comes back (start), and expired entries are dropped whenever the map has doubled since
// the last purge, as well as by every sweep.
func (w *Worker) holdForRetry(id string, d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.held[id] = time.Now().Add(d + time.Second)
	if len(w.held) >= max(w.heldPurgeAt, minHeldPurge) {
		w.dropExpiredHolds()
		w.heldPurgeAt = 2 * len(w.held)
	}
}

// dropExpiredHolds deletes the holds whose retry timeout has ended. w.mu must be held.
func (w *Worker) dropExpiredHolds() {
	now := time.Now()
	for id, until := range w.held {
		if now.After(until) {
			delete(w.held, id)
		}
	}
}

func (w *Worker) release(topic, id string) {
	w.mu.Lock()
	delete(w.active, id)
	w.inflight--
	w.perTopic[topic]--
	inTopic, free := w.perTopic[topic], w.cfg.MaxConcurrency-w.inflight
	w.mu.Unlock()
	w.obs.Slots(topic, inTopic, free)
	select {
	case w.freed <- struct{}{}:
	default:
	}
}

// handle runs one task from lock to report. Its frame, and so the stack of a goroutine
// whose handler waits, is kept small: what comes before and after the handler is in
// functions of their own, whose frames are gone while it runs.
func (w *Worker) handle(workCtx context.Context, t *topic, task *Task, sentAt time.Time) {
	log := slog.New(newTaskHandler(w.log.Handler(), task))
	// The task's span: its trace's root, ended (after the lock extender stops) with the
	// outcome set below.
	workCtx, span := w.startTaskSpan(workCtx, &task.raw, task.Attempt())
	var outcome, class string
	defer func() { endOutcomeSpan(span, outcome, class) }()
	ext, outcome := w.keepLock(workCtx, t, task, sentAt, log)
	if ext == nil {
		return
	}
	defer ext.Stop() // after the report: the lock stays alive while the result is reported

	start := time.Now()
	log.Debug("handler started") // formats the task's fields only if Debug is on
	hctx, tl := withTaskLog(ext.Context(), log)
	sctx, hspan := startHandlerSpan(hctx) // the handler's ctx carries its span: its own spans nest under it
	vars, herr := runHandler(sctx, t.handler, task)
	endHandlerSpan(hspan, herr)
	took := time.Since(start)
	// Waits here, with a small stack, for a turn to report (ReportConcurrency).
	w.reporting <- struct{}{}
	defer func() { <-w.reporting }()
	// With what the handler added to its logger (AddLogAttrs).
	outcome, class = w.settle(workCtx, t, task, ext, hctx, vars, herr, took, tl.get())
}

// keepLock starts keeping the task's lock alive. When the handler must not run, it
// returns a nil extender and the task's outcome: the lock cannot be kept (the task is
// unlocked), or it was lost before the handler started.
func (w *Worker) keepLock(workCtx context.Context, t *topic, task *Task, sentAt time.Time, log *slog.Logger) (*lockext.Extender, string) {
	raw := &task.raw
	extCfg := w.extend[t.name]
	extCfg.Logger = log
	ext, err := w.locks.Start(workCtx, lockext.Task{ID: raw.ID, WorkerID: w.cfg.WorkerID, GrantedAt: sentAt}, extCfg)
	if err != nil {
		// The scheduler closed while the task waited to be extended (lockext.ErrClosed: Run
		// returned at its shutdown timeout), or a bug: the task goes back to the engine.
		log.Log(workCtx, startFailureLevel(err), "cannot keep the lock alive; unlocking the task", slog.Any("error", err), slog.String("outcome", "unlocked"))
		w.unlock(workCtx, raw.ID, log)
		w.obs.Handled(raw.TopicName, "unlocked", "", 0)
		return nil, "unlocked"
	}
	if cause := ext.Lost(); cause != nil {
		// Handed over late in a long poll, and the extension sent at once on arrival was
		// refused: another worker has it, or it is gone. Nothing ran, nothing to report.
		ext.Stop()
		w.stats.LockLost.Add(1)
		log.Warn("lock lost before the handler started; not running it", slog.String("outcome", "lock-lost"), slog.Any("cause", cause))
		w.obs.Handled(raw.TopicName, "lock-lost", "", 0)
		return nil, "lock-lost"
	}
	return ext, ""
}

// startFailureLevel is the level of the record about a lock that could not be kept: Info
// at shutdown (the scheduler closed), Error otherwise.
func startFailureLevel(err error) slog.Level {
	if errors.Is(err, lockext.ErrClosed) {
		return slog.LevelInfo
	}
	return slog.LevelError
}

// settle reports what the handler returned, unless its lock was lost or the shutdown
// cancelled it, and returns the task's outcome and failure class.
func (w *Worker) settle(workCtx context.Context, t *topic, task *Task, ext *lockext.Extender, hctx context.Context,
	vars camunda7.Variables, herr error, took time.Duration, log *slog.Logger) (outcome, class string) {
	raw := &task.raw
	cause := context.Cause(hctx)
	var lost *lockext.LockLostError
	switch {
	case hctx.Err() != nil && errors.As(cause, &lost):
		// The engine said another worker has the task, or it is gone: nothing to report.
		w.stats.LockLost.Add(1)
		log.Warn("lock lost while the handler ran; result discarded", slog.String("outcome", "lock-lost"),
			slog.Any("cause", cause), slog.Duration("took", took))
		w.obs.Handled(raw.TopicName, "lock-lost", "", took)
		if errors.Is(cause, camunda7.ErrTaskGone) {
			w.taskGone(workCtx, task, cause, log)
		}
		return "lock-lost", ""
	case hctx.Err() != nil && errors.Is(cause, ErrShutdown) && herr != nil:
		// Cancelled by shutdown: hand the task back at once, without spending a retry.
		log.Info("handler cancelled by shutdown; unlocking the task", slog.String("outcome", "unlocked"), slog.Duration("took", took))
		ext.Stop() // an extension racing the unlock makes the engine refuse one of them
		w.unlock(workCtx, raw.ID, log)
		w.obs.Handled(raw.TopicName, "unlocked", "", took)
		return "unlocked", ""
	case hctx.Err() != nil && herr != nil && cause != nil && !errors.Is(herr, cause):
		herr = fmt.Errorf("%w (context ended: %w)", herr, cause)
	}
	rctx, rspan := startReportSpan(workCtx)
	outcome, class = w.report(rctx, t, task, failure.Classify(herr), vars, took, log)
	endReportSpan(rspan, outcome)
	return outcome, class
}

// runHandler calls the handler, turning a panic into a failure.
func runHandler(ctx context.Context, h Handler, t *Task) (vars camunda7.Variables, err error) {
	defer func() {
		if v := recover(); v != nil {
			vars, err = nil, failure.FromPanic(v, debug.Stack())
		}
	}()
	return h(ctx, t)
}

func (w *Worker) unlock(workCtx context.Context, id string, log *slog.Logger) {
	ctx := context.WithoutCancel(workCtx)
	err := retry.Do(ctx, w.reportBackoff(), func(ctx context.Context) error {
		rctx, cancel := context.WithTimeout(ctx, w.cfg.ReportTimeout)
		defer cancel()
		w.changes.Add(1)
		err := w.c.Unlock(rctx, id)
		if errors.Is(err, camunda7.ErrNotSent) || errors.Is(err, camunda7.ErrOptimisticLock) || errors.Is(err, camunda7.ErrUnknownOutcome) {
			return retry.RetryableError(err) // unlocking twice is harmless
		}
		return err
	})
	if err != nil && !errors.Is(err, camunda7.ErrTaskGone) {
		w.obs.EngineError("unlock", err)
		log.Warn("unlock failed; the task returns when its lock expires", slog.Any("error", err))
		return
	}
	w.stats.Unlocked.Add(1)
}

// reportBackoff paces the resending of an unlock: ReportAttempts tries in all. (Reports
// are resent for up to ReportRetryFor: deliver.)
func (w *Worker) reportBackoff() retry.Backoff {
	return retry.WithMaxRetries(uint64(w.cfg.ReportAttempts-1), retry.WithJitterPercent(20, retry.NewExponential(100*time.Millisecond)))
}
