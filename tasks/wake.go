package tasks

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/extworker/extworker/camunda7"
)

// Waking the worker's own long poll when a task becomes fetchable. The engine wakes its
// pending long polls for a new task or an unlock, but not when a lock or a failure's
// retry timeout runs out (docs/engine-facts.md): such a task would wait until the poll
// ends, up to AsyncResponseTimeout. The worker knows two such moments and sends the
// engine a wake at each (camunda7.Client.WakeLongPolls, which locks nothing): the end of
// a retry timeout it reported itself (wakeAt from send), and the earliest lock held by
// another worker on its topics, which the lock watch learns with one query per topic
// per LockWatch while a poll is pending (watchLocks). wakeLoop runs both.

// wakeMargin is how long after a task's lock or retry timeout ends the wake is sent:
// the engine compares the lock's end with its own clock.
const wakeMargin = 100 * time.Millisecond

// wakeSchedule is the set of moments a wake is due, earliest first. Moments closer than
// wakeCoalesce to one already due are one wake.
type wakeSchedule struct {
	mu   sync.Mutex
	due  []time.Time
	kick chan struct{} // an earlier moment was added: the loop re-arms its timer
}

func newWakeSchedule() *wakeSchedule { return &wakeSchedule{kick: make(chan struct{}, 1)} }

// add schedules a wake at at.
func (s *wakeSchedule) add(at time.Time) {
	s.mu.Lock()
	due, earliest := scheduleWake(s.due, at)
	s.due = due
	s.mu.Unlock()
	if earliest {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// next is the earliest moment due, zero if none.
func (s *wakeSchedule) next() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.due) == 0 {
		return time.Time{}
	}
	return s.due[0]
}

// take removes the moments at or before now and reports whether there were any.
func (s *wakeSchedule) take(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := dueCount(s.due, now)
	s.due = s.due[n:]
	return n > 0
}

// wakeCoalesce is how close two moments are that one wake serves (the retry timeouts of
// tasks that failed together end together): no more than wakeMargin, or the wake kept, the
// earlier, could come before the later task's retry timeout has ended.
const wakeCoalesce = wakeMargin

// scheduleWake inserts at into due (sorted), unless a moment within wakeCoalesce of it is
// there already, and reports whether at is now the earliest.
func scheduleWake(due []time.Time, at time.Time) ([]time.Time, bool) {
	i, _ := slices.BinarySearchFunc(due, at, time.Time.Compare)
	if (i > 0 && at.Sub(due[i-1]) < wakeCoalesce) || (i < len(due) && due[i].Sub(at) < wakeCoalesce) {
		return due, false
	}
	return slices.Insert(due, i, at), i == 0
}

// dueCount is how many moments of due (sorted) are at or before now.
func dueCount(due []time.Time, now time.Time) int {
	n, _ := slices.BinarySearchFunc(due, now, func(d, now time.Time) int {
		if d.After(now) {
			return 1
		}
		return -1
	})
	return n
}

// lockWatchPeriod is how often the lock watch queries: Config.LockWatch, or by default the
// long poll or the shortest lock of the topics, whichever is shorter (a lock taken just
// after one query and shorter than the period could end before the next one sees it),
// at least a second. 0: no watch (no long poll to wake, or LockWatch negative).
func lockWatchPeriod(cfg Config, locks []time.Duration) time.Duration {
	if cfg.AsyncResponseTimeout <= 0 || cfg.LockWatch < 0 {
		return 0
	}
	if cfg.LockWatch > 0 {
		return cfg.LockWatch
	}
	p := cfg.AsyncResponseTimeout
	for _, l := range locks {
		p = min(p, l)
	}
	return max(p, time.Second)
}

// wakeLoop sends the scheduled wakes and runs the lock watch until ctx ends. A wake or a
// watch is only worth its request while a long poll is pending: a poll sent later tries
// once at once, and gets the task then.
func (w *Worker) wakeLoop(ctx context.Context) {
	wk, ok := w.c.(waker)
	if !ok || w.cfg.AsyncResponseTimeout <= 0 {
		return
	}
	lw := lockWatch{period: lockWatchPeriod(w.cfg, w.reg.lockDurations())}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Stop()
		if at, ok := nextWakeEvent(w.wakes.next(), lw.next, lw.period > 0 && w.polling.pending(), time.Now()); ok {
			timer.Reset(max(time.Until(at), 0))
		}
		select {
		case <-ctx.Done():
			return
		case <-w.wakes.kick:
			continue
		case <-w.polling.started:
			continue
		case <-timer.C:
		}
		wake := false
		if now := time.Now(); lw.period > 0 && !now.Before(lw.next) && w.polling.pending() {
			wake = w.watchLocks(ctx, &lw, now)
		}
		if w.wakes.take(time.Now()) || wake {
			if w.polling.pending() {
				w.wake(ctx, wk)
			}
		}
	}
}

// nextWakeEvent is when the wake loop acts next: the earliest wake due, or the lock
// watch (at watchAt, zero: now) if it runs now (watching: a poll is pending); false if
// neither.
func nextWakeEvent(wake, watchAt time.Time, watching bool, now time.Time) (time.Time, bool) {
	if watching {
		if watchAt.IsZero() {
			watchAt = now
		}
		if wake.IsZero() || watchAt.Before(wake) {
			return watchAt, true
		}
	}
	return wake, !wake.IsZero()
}

// lockWatch is what the lock watch remembers from one query to the next.
type lockWatch struct {
	period time.Duration        // the longest time between two queries; 0: no watch
	next   time.Time            // when to query next; zero: at once
	woken  map[string]wokenLock // the ended foreign locks the poll was woken for, by task id
	failed bool                 // the last query failed (logged once)
}

// wokenLock is an ended lock the poll was woken for, and how often.
type wokenLock struct {
	end   time.Time
	tries int
}

const (
	// watchGap is the least time between two queries of the lock watch: it bounds them
	// while a dead worker's locks end one after the other.
	watchGap = 500 * time.Millisecond
	// maxWakeTries is how often the poll is woken for one ended lock whose task stays
	// unfetched: a clock ahead of the engine's woke it too early, or the topic's filters
	// (a process definition, a tenant) leave the task out of this worker's polls.
	maxWakeTries = 3
)

// decideWatch is what a lock watch at now does with the locks of its query (tasks, of
// every topic): wake the poll when another worker's lock has ended (each ended lock at
// most maxWakeTries times, a watchGap apart), and when to query next: at the next end of
// another worker's lock, to see whether it was extended (a live worker extends its locks
// long before they end, a dead one does not), at the latest period from now, at the
// earliest watchGap from now. When the query's answer was cut at its limit (full), the
// locks behind the ended ones were not seen: the watch comes back when those ended ones
// are too old to be read again (staleLock). It returns the woken locks still ended.
func decideWatch(tasks []camunda7.ExternalTask, full bool, self string, woken map[string]wokenLock, now time.Time, period time.Duration) (
	wake bool, next time.Time, stillWoken map[string]wokenLock) {
	next, stillWoken = now.Add(period), map[string]wokenLock{}
	for _, t := range tasks {
		end := t.LockExpirationTime.Time
		if t.WorkerID == self || end.IsZero() {
			continue // our own locks are kept alive, our retry timeouts scheduled by send
		}
		if end.After(now) {
			next = minTime(next, end.Add(wakeMargin))
			continue
		}
		if full {
			next = minTime(next, end.Add(staleLock))
		}
		wl := woken[t.ID]
		if !wl.end.Equal(end) {
			wl = wokenLock{end: end}
		}
		if wl.tries < maxWakeTries {
			wl.tries++
			wake = true
			next = minTime(next, now) // again after watchGap: taken, or woken again
		}
		stillWoken[t.ID] = wl
	}
	return wake, maxTime(next, now.Add(watchGap)), stillWoken
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// watchLocks queries, on each topic, the locks that end (or ended) before the next watch
// at the latest, and reports whether to wake the poll (decideWatch).
func (w *Worker) watchLocks(ctx context.Context, lw *lockWatch, now time.Time) bool {
	w.mu.Lock()
	ours := len(w.active) + len(w.held)
	w.mu.Unlock()
	var all []camunda7.ExternalTask
	var failed error
	full := false
	for _, name := range w.reg.names {
		qctx, cancel := context.WithTimeout(ctx, w.cfg.ReportTimeout)
		limit := min(ours+watchResults, 200)
		tasks, err := w.c.ExternalTasks(qctx, camunda7.ExternalTaskQuery{TopicName: name, Active: true, WithRetriesLeft: true,
			LockExpirationAfter: now.Add(-staleLock), LockExpirationBefore: now.Add(lw.period), ByLockExpiration: true,
			MaxResults: limit})
		cancel()
		w.stats.LockWatches.Add(1)
		if err != nil {
			w.obs.EngineError("query", err)
			failed = err
			continue
		}
		all = append(all, tasks...)
		full = full || len(tasks) == limit
	}
	switch {
	case failed != nil && !lw.failed:
		w.log.Warn("watching other workers' locks failed: a dead worker's task waits for the end of this worker's long poll until it works again",
			slog.Any("error", failed))
	case failed == nil && lw.failed:
		w.log.Info("watching other workers' locks works again")
	}
	lw.failed = failed != nil
	var wake bool
	wake, lw.next, lw.woken = decideWatch(all, full, w.cfg.WorkerID, lw.woken, now, lw.period)
	return wake
}

// staleLock is how long ago a lock may have ended for the watch to still look at it: the
// watches around its end have woken the poll for it maxWakeTries times by then. Older
// ones (a task of another tenant or process definition whose worker is gone, which this
// worker's polls never take) would otherwise sort first and hide the locks that matter.
const staleLock = maxWakeTries*watchGap + 2*wakeMargin

// watchResults is how many locks beyond the worker's own one watch query reads per topic:
// the ends of a dead worker's locks, which the next watches take one by one.
const watchResults = 20

// waker is an Engine that can wake its pending long polls, as *camunda7.Client can; with
// another Engine the worker sends no wakes and runs no lock watch.
type waker interface {
	WakeLongPolls(ctx context.Context, workerID string) error
}

// wake sends one wake to the engine.
func (w *Worker) wake(ctx context.Context, wk waker) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.ReportTimeout)
	defer cancel()
	if err := wk.WakeLongPolls(ctx, w.cfg.WorkerID); err != nil {
		w.obs.EngineError("wake", err)
		w.log.Debug("waking the long poll failed", slog.Any("error", err))
		return
	}
	w.stats.Wakes.Add(1)
}

// pollState says whether a long poll is pending, for the wake loop.
type pollState struct {
	mu      sync.Mutex
	n       int
	started chan struct{} // a poll was sent: the loop may watch now
}

func newPollState() *pollState { return &pollState{started: make(chan struct{}, 1)} }

func (p *pollState) begin() {
	p.mu.Lock()
	p.n++
	p.mu.Unlock()
	select {
	case p.started <- struct{}{}:
	default:
	}
}

func (p *pollState) end() {
	p.mu.Lock()
	p.n--
	p.mu.Unlock()
}

func (p *pollState) pending() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n > 0
}
