package tasks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
)

// The first step of a task's walk: the fetch loop polls for as many tasks as there are
// free slots (plan, fetchSize), backs off after errors (fetchState, fetchBackoff), and
// hands each task it gets to start (run.go).

// fetchLoop polls while ctx lives, asking only for as many tasks as there are free slots.
// Each poll runs on pollCtx, which outlives ctx: the engine does not notice a client
// leaving a long poll, and would go on locking tasks for it, so a poll pending at
// shutdown is waited for and what it returns unlocked at once.
//
// It returns the time by which a poll that failed without an answer has surely ended on
// the engine (zero if none may be pending).
func (w *Worker) fetchLoop(ctx, pollCtx, workCtx context.Context, stopRun context.CancelCauseFunc) (pollEnd time.Time) {
	var st fetchState
	for ctx.Err() == nil {
		req, ok := w.plan(st.limit)
		if !ok {
			w.wait(ctx, w.freed, 0)
			continue
		}
		if st.sweepDue(time.Now()) && w.sweepOrphans(ctx) {
			st.sweepAt = time.Time{}
		}
		sentAt := time.Now()
		w.polling.begin()
		got, err := w.c.FetchAndLock(pollCtx, req)
		w.polling.end()
		switch {
		case err != nil && ctx.Err() != nil:
			return pendingUntil(err, sentAt, req.AsyncResponseTimeout)
		case err != nil:
			if end, stop := w.fetchFailed(ctx, workCtx, &st, req.MaxTasks, sentAt, err, stopRun); stop {
				return end
			}
		default:
			w.fetched(ctx, workCtx, &st, got, sentAt)
		}
	}
	return time.Time{}
}

// wait waits until ch receives (nil: never), d passes (d > 0; else never) or ctx ends.
func (w *Worker) wait(ctx context.Context, ch <-chan struct{}, d time.Duration) {
	var tc <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		tc = t.C
	}
	select {
	case <-ch:
	case <-tc:
	case <-ctx.Done():
	}
}

// pause waits d, or until ctx ends; no time at all if d is not positive.
func (w *Worker) pause(ctx context.Context, d time.Duration) {
	if d > 0 {
		w.wait(ctx, nil, d)
	}
}

// fetchFailed handles a failed poll as st.afterError decides: ask for fewer tasks, fail a
// task too large to receive, stop the run (credentials rejected for too long), or back
// off. stop says the loop ends, and end is then what fetchLoop returns.
func (w *Worker) fetchFailed(ctx, workCtx context.Context, st *fetchState, maxTasks int, sentAt time.Time, err error,
	stopRun context.CancelCauseFunc) (end time.Time, stop bool) {
	w.obs.Polled(0, time.Since(sentAt), err)
	w.obs.EngineError("fetch-and-lock", err)
	var verdict fetchVerdict
	*st, verdict = st.afterError(err, maxTasks, time.Now(), w.cfg)
	switch verdict {
	case fetchFewer:
		w.log.Warn("the engine's answer was larger than the client accepts; fetching fewer tasks at a time",
			slog.Int("max_tasks", st.limit), slog.Any("error", err))
		w.sweepOrphans(ctx)
		return time.Time{}, false
	case fetchOversized:
		w.failOversized(workCtx, err)
		return time.Time{}, false
	case fetchStop:
		lasted := time.Since(st.rejected).Round(time.Millisecond)
		w.log.Error("the engine has rejected the worker's credentials for too long; stopping",
			slog.Duration("for", lasted), slog.Any("error", err))
		stopRun(fmt.Errorf("%w for %v: %w", ErrCredentialsRejected, lasted, err))
		return time.Time{}, true
	}
	if st.failures == 1 {
		w.log.Warn("fetching tasks failed; backing off until the engine answers", slog.Any("error", err))
	} else {
		w.log.Debug("fetching tasks failed again", slog.Int("failures", st.failures), slog.Any("error", err))
	}
	w.pause(ctx, fetchBackoff(st.failures, w.cfg.FetchBackoffInitial, w.cfg.FetchBackoffMax, rand.Float64()*2-1))
	return st.sweepAt, ctx.Err() != nil // the failed poll may still be pending on the engine
}

// fetched starts the tasks a poll returned, or at shutdown hands them back at once
// instead of holding them until their locks expire. After an empty poll it waits until
// IdlePollInterval after the poll was sent (with no long poll, or an engine answering
// early, idle polls would otherwise follow each other at once).
func (w *Worker) fetched(ctx, workCtx context.Context, st *fetchState, got []camunda7.LockedExternalTask, sentAt time.Time) {
	if st.failures > 0 {
		w.log.Info("fetching tasks recovered", slog.Int("failures", st.failures), slog.Duration("after", time.Since(st.failSince)))
	}
	*st = st.afterSuccess(len(got), w.cfg.MaxConcurrency)
	w.stats.Fetched.Add(int64(len(got)))
	w.obs.Polled(len(got), time.Since(sentAt), nil)
	for _, t := range got {
		w.obs.Fetched(t.TopicName)
	}
	for _, t := range got {
		if ctx.Err() != nil {
			w.unlock(workCtx, t.ID, w.log.With(slog.String("topic", t.TopicName), slog.String("external_task_id", t.ID)))
		} else {
			w.start(workCtx, t, sentAt)
		}
	}
	if len(got) == 0 {
		w.pause(ctx, idleWait(sentAt, time.Now(), w.cfg.IdlePollInterval))
	}
}

// fetchState is what the fetch loop remembers from one poll to the next.
type fetchState struct {
	failures  int       // polls failed in a row
	failSince time.Time // when the first of them failed
	sweepAt   time.Time // when to look for orphaned locks; zero: no need
	limit     int       // maxTasks cap after answers too large to read; 0: none
	rejected  time.Time // since when every poll was refused for credentials; zero: not
}

// fetchVerdict is what the fetch loop does after a failed poll.
type fetchVerdict int

const (
	fetchBackOff   fetchVerdict = iota // wait fetchBackoff(failures), then poll again
	fetchFewer                         // the answer was too large to read: poll again at once for limit tasks, after unlocking what it locked
	fetchOversized                     // a single task too large to receive: fail it with an incident
	fetchStop                          // credentials rejected for CredentialsRejectedFor: stop the run
)

// afterError decides what follows a poll for maxTasks that failed with err at now.
func (s fetchState) afterError(err error, maxTasks int, now time.Time, cfg Config) (fetchState, fetchVerdict) {
	if errors.Is(err, camunda7.ErrResponseTooLarge) {
		// The engine locked the tasks but its answer was too large to read. Fetching the
		// same number again would only repeat it: ask for fewer; a single task too large to
		// receive is failed with an incident instead of cycling through its lock forever.
		if maxTasks <= 1 {
			return s, fetchOversized
		}
		s.limit = max(1, maxTasks/2)
		return s, fetchFewer
	}
	if !errors.Is(err, camunda7.ErrUnauthorized) {
		s.rejected = time.Time{}
	} else if s.rejected.IsZero() {
		s.rejected = now
	}
	if !s.rejected.IsZero() && cfg.CredentialsRejectedFor >= 0 && now.Sub(s.rejected) >= cfg.CredentialsRejectedFor {
		return s, fetchStop
	}
	if !errors.Is(err, camunda7.ErrNotSent) {
		// The engine may still hold this poll and lock tasks for it that will never
		// arrive. Once the poll has surely ended there, release such locks.
		s.sweepAt = now.Add(max(cfg.AsyncResponseTimeout, 0) + time.Second)
	}
	if s.failures == 0 {
		s.failSince = now
	}
	s.failures++
	return s, fetchBackOff
}

// afterSuccess is the state after a poll that returned n tasks: a maxTasks cap doubles
// back towards maxConcurrency with every poll that brought tasks.
func (s fetchState) afterSuccess(n, maxConcurrency int) fetchState {
	if s.limit > 0 && n > 0 {
		if s.limit *= 2; s.limit >= maxConcurrency {
			s.limit = 0
		}
	}
	s.failures, s.failSince, s.rejected = 0, time.Time{}, time.Time{}
	return s
}

// sweepDue reports whether orphaned locks are to be looked for at now.
func (s fetchState) sweepDue(now time.Time) bool { return !s.sweepAt.IsZero() && now.After(s.sweepAt) }

// fetchBackoff is the pause after the failures-th failed poll in a row: initial,
// doubling up to maxWait, with jitter (-1 ≤ jitter < 1) moving it by up to 20%, never
// past maxWait.
func fetchBackoff(failures int, initial, maxWait time.Duration, jitter float64) time.Duration {
	d := maxWait
	if n := failures - 1; n < 62 && initial<<n > 0 && initial<<n < maxWait {
		d = initial << n
	}
	d += time.Duration(float64(d) * 0.2 * jitter)
	return min(d, maxWait)
}

// idleWait is how long to wait after an empty poll sent at sentAt: until interval after
// it was sent.
func idleWait(sentAt, now time.Time, interval time.Duration) time.Duration {
	return max(sentAt.Add(interval).Sub(now), 0)
}

// pendingUntil is when a poll sent at sentAt that failed with err at shutdown has surely
// ended on the engine: zero if it certainly never left.
func pendingUntil(err error, sentAt time.Time, asyncResponseTimeout time.Duration) time.Time {
	if errors.Is(err, camunda7.ErrNotSent) {
		return time.Time{}
	}
	return sentAt.Add(asyncResponseTimeout + 500*time.Millisecond)
}

// fetchSize is how many tasks the next poll may ask for: the worker's free slots,
// capped by limit (after answers too large to read; 0: no cap). 0: none.
func fetchSize(maxConcurrency, inflight, limit int) int {
	free := maxConcurrency - inflight
	if limit > 0 {
		free = min(free, limit)
	}
	return max(free, 0)
}

// topicFree is how many tasks of a topic the next poll may ask for, of global free
// slots: fewer when the topic has its own cap (maxConcurrency > 0) and running handlers.
func topicFree(global, maxConcurrency, running int) int {
	if maxConcurrency > 0 {
		return max(min(global, maxConcurrency-running), 0)
	}
	return global
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
	global := fetchSize(w.cfg.MaxConcurrency, w.inflight, limit)
	if global == 0 {
		return camunda7.FetchAndLockRequest{}, false
	}
	req := camunda7.FetchAndLockRequest{WorkerID: w.cfg.WorkerID, MaxTasks: global, UsePriority: !w.cfg.IgnorePriority,
		AsyncResponseTimeout: max(w.cfg.AsyncResponseTimeout, 0)}
	for _, name := range w.reg.names { // sorted, without Topics' copy: plan runs before every poll
		t := w.reg.topics[name]
		if free := topicFree(global, t.opts.MaxConcurrency, w.perTopic[name]); free > 0 {
			req.MaxTasks = min(req.MaxTasks, free)
			req.Topics = append(req.Topics, t.fetch)
		}
	}
	return req, len(req.Topics) > 0
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
		log.Warn("unlocking a task locked for this worker by a fetch whose answer never arrived", slog.String("outcome", OutcomeUnlocked.String()))
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
		w.finish(ended{topic: t.TopicName, outcome: OutcomeIncident, class: failure.KindPermanent.String()})
		log.Warn("task too large to receive failed with an incident", slog.String("outcome", OutcomeIncident.String()))
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
