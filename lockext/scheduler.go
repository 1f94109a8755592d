package lockext

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/extworker/extworker/internal/failpoint"
)

// Defaults applied by SchedulerConfig.WithDefaults.
const (
	defaultConcurrency = 16
	// With these two, extensions due together (tasks fetched in one answer) are paced out
	// within a fifth of their Interval, inside the quarter they are spread over: pacing
	// alone makes none of them late.
	defaultSpread = 0.25
	defaultBurst  = 5
	// minPaceGap is the longest pause pacing ever puts between two extensions: a
	// scheduler keeping few tasks may always send 20 a second.
	minPaceGap = 50 * time.Millisecond
)

// ErrClosed is returned by Scheduler.Start after Close, and by the Start of a late task
// whose first extension had not been sent when Close came.
var ErrClosed = errors.New("lockext: scheduler closed")

// SchedulerConfig tunes a Scheduler. WithDefaults fills the zero fields.
type SchedulerConfig struct {
	// Concurrency bounds the extendLock (and Lock) calls in flight at once: an engine
	// that answers slowly is not sent more, and extensions that are due meanwhile wait
	// their turn. Default 16.
	Concurrency int
	// Spread is the share of a task's Interval by which each of its extensions may go
	// out early, chosen at random per extension: tasks fetched together, or retried
	// together after an outage, fall out of step instead of asking for their extensions
	// all at once, Interval after Interval. It costs a few extensions more (Spread/2 of
	// them on average). Default 0.25; negative: none, every extension at its due time.
	Spread float64
	// Burst bounds how fast extensions go out, as a multiple of the rate the tasks being
	// kept need on average (one extension per Interval each): the scheduler leaves at
	// least 1/(Burst × that rate) between two sends, and never more than 50ms. Extensions
	// due together (a burst the spreading did not break up) so go out one after another
	// at that pace, while the scheduler can still catch up Burst times faster than it
	// falls behind. Default 5; negative: no pacing.
	Burst float64
	// OnSend, if set, is called as each extension goes out, with how late it is: the
	// time since it was due (negative when it went out early, spread). A task's first
	// extension is due GrantedAt+Interval, or on arrival for a task handed over late;
	// each later one Interval after the previous grant, or a retry's backoff after the
	// previous failure. Called from the scheduler's goroutine with its lock held: keep
	// it quick, and call no method of the scheduler or its extenders. For metrics and
	// benchmarks.
	OnSend func(lateness time.Duration)
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c SchedulerConfig) WithDefaults() SchedulerConfig {
	if c.Concurrency == 0 {
		c.Concurrency = defaultConcurrency
	}
	if c.Spread == 0 {
		c.Spread = defaultSpread
	}
	if c.Burst == 0 {
		c.Burst = defaultBurst
	}
	return c
}

// Validate names every bad field. Zero fields are accepted.
func (c SchedulerConfig) Validate() error {
	var errs []error
	if c.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("Concurrency %d: must not be negative", c.Concurrency))
	}
	if c.Spread >= 1 {
		errs = append(errs, fmt.Errorf("Spread %v: must be less than 1, or extensions could go out at once after each other", c.Spread))
	}
	if len(errs) > 0 {
		return fmt.Errorf("lockext scheduler config: %w", errors.Join(errs...))
	}
	return nil
}

// Scheduler keeps the locks of many tasks alive from one goroutine: a queue of due
// times, ordered by the earliest, and a bounded number of extendLock calls in flight.
// A task costs it a queue entry, not a goroutine and timers; extensions due at the same
// moment are spread and paced (SchedulerConfig), so that many tasks fetched together
// never send their extensions in one burst. Create one with NewScheduler, start an
// Extender per task with Start, and Close it once every extender is stopped. Its
// methods are safe for concurrent use.
type Scheduler struct {
	l   Locker
	cfg SchedulerConfig
	// own: created by the package-level Start for a single extender, and closed with it.
	own bool

	mu       sync.Mutex
	queue    queue
	live     int       // extenders started and neither stopped nor ended
	need     float64   // extensions per second the live extenders need: the sum of 1/Interval
	lastSend time.Time // when the previous extension went out, for pacing
	closed   bool

	wake  chan struct{} // a new head, or a free call slot: look at the queue again
	slots chan struct{} // one element per call in flight
	calls sync.WaitGroup
	stop  chan struct{} // closed by Close
	done  chan struct{} // closed when the goroutine has exited
}

// NewScheduler starts a scheduler that extends locks through l. The error is only for
// an invalid cfg.
func NewScheduler(l Locker, cfg SchedulerConfig) (*Scheduler, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Scheduler{l: l, cfg: cfg, wake: make(chan struct{}, 1), slots: make(chan struct{}, cfg.Concurrency),
		stop: make(chan struct{}), done: make(chan struct{})}
	go s.run()
	return s, nil
}

// Close stops the scheduler: it waits for the calls in flight, and sends no extension
// after it returns. An extender not stopped before keeps its context; its lock runs
// out. Start fails with ErrClosed after Close, and so does, at once, a late task's
// Start still waiting for its first extension to be sent. Safe to call twice.
func (s *Scheduler) Close() {
	s.closeAsync()
	<-s.done
	s.calls.Wait()
}

// closeAsync stops the scheduler's goroutine without waiting for it.
func (s *Scheduler) closeAsync() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.stop)
	}
}

// Tasks returns how many extenders the scheduler is keeping: queued or with a call in
// flight.
func (s *Scheduler) Tasks() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live
}

// poke wakes the scheduler's goroutine.
func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// gap is the least time between two sends. s.mu must be held.
func (s *Scheduler) gap() time.Duration { return paceGap(s.cfg.Burst, s.need) }

// schedule queues e's next extension. nominal is when it is due; with spread it goes
// out up to Spread × Interval earlier. s.mu must be held.
func (s *Scheduler) schedule(e *Extender, nominal time.Time, spread bool) {
	e.nominal = nominal
	share := 0.0
	if spread {
		share = s.cfg.Spread
	}
	e.at = dueAt(nominal, e.maxAt, e.cfg.Interval, share, rand.Float64())
	heap.Push(&s.queue, e)
	if e.index == 0 {
		s.poke()
	}
}

// forget takes e out of the scheduler's books, once. s.mu must be held.
func (s *Scheduler) forget(e *Extender) {
	if e.index >= 0 {
		heap.Remove(&s.queue, e.index)
	}
	if e.counted {
		e.counted = false
		s.live--
		s.need -= 1 / e.cfg.Interval.Seconds()
		if s.live == 0 {
			s.need = 0 // no drift from float sums
		}
	}
}

// run is the scheduler's one goroutine: it sends the extensions whose time has come,
// at the pace and within the concurrency allowed, and ends the extenders whose
// MaxRunTime has passed.
func (s *Scheduler) run() {
	defer close(s.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait, expired := s.dispatch()
		for _, e := range expired {
			e.end(ErrMaxRunTime)
		}
		var tc <-chan time.Time
		if wait > 0 {
			timer.Reset(wait)
			tc = timer.C
		}
		select {
		case <-s.stop:
			return
		case <-s.wake:
		case <-tc:
		}
		timer.Stop()
	}
}

// dispatch sends what is due and returns how long to wait before looking again (0:
// until woken), and the extenders whose MaxRunTime has passed (taken out of the queue),
// to be ended outside the lock.
func (s *Scheduler) dispatch() (wait time.Duration, expired []*Extender) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.queue) > 0 {
		now := time.Now()
		e := s.queue[0]
		switch st, wait := nextStep(now, e.at, e.maxAt, s.lastSend, s.gap()); st {
		case stepWait:
			return wait, expired
		case stepExpire:
			s.forget(e)
			e.ended = true
			expired = append(expired, e)
			continue
		}
		select {
		case s.slots <- struct{}{}:
		default:
			return 0, expired // every call slot is busy: a call's end wakes us
		}
		heap.Pop(&s.queue)
		s.lastSend = now
		if s.cfg.OnSend != nil {
			s.cfg.OnSend(now.Sub(e.nominal))
		}
		ctx, cancel := context.WithDeadline(context.WithoutCancel(e.parent), callDeadline(now, e.cfg.RequestTimeout, e.maxAt))
		e.callCancel = cancel
		e.callDone = make(chan struct{})
		s.calls.Add(1)
		go s.call(e, ctx, now)
	}
	return 0, expired
}

// call sends one extension of e's lock, sent at sentAt, and classifies the answer as
// the extender did with its own goroutine: only the engine's answer ends the lock as
// lost; transient errors are retried with backoff for as long as it takes, whatever
// the local deadline says.
func (s *Scheduler) call(e *Extender, ctx context.Context, sentAt time.Time) {
	defer s.calls.Done()
	failpoint.Inject(failpoint.InExtension)
	relocked, err := e.extend(ctx)

	s.mu.Lock()
	e.callCancel()
	e.callCancel = nil
	stopped := e.stopped
	s.mu.Unlock()
	<-s.slots
	s.poke()

	var (
		cause error // ends the extending
		v     = verdictOf(err, LostAnswer(err), !e.maxAt.IsZero() && !time.Now().Before(e.maxAt))
	)
	if !stopped {
		cause = e.answered(v, err, sentAt, relocked)
	}

	s.mu.Lock()
	done := e.callDone
	e.callDone = nil
	e.anyAnswer = true
	switch {
	case e.stopped:
		cause = nil // Stop came while the answer was being read: it is ignored
	case cause != nil || s.closed:
		s.forget(e)
		e.ended = cause != nil
	default:
		s.schedule(e, nextNominal(v, sentAt, time.Now(), e.cfg.Interval, e.backoff), true)
	}
	s.mu.Unlock()

	if cause != nil {
		e.end(cause)
	}
	e.setReady() // a late task's first answer is in: its handler may start
	close(done)
}

// Start begins keeping t's lock alive on s and returns its Extender, as the
// package-level Start does (see there), without a goroutine of its own. The error is
// for an invalid cfg (after WithDefaults) or t, or a closed scheduler (ErrClosed); then
// nothing was started, and the task's lock is the caller's to give back (unlock). A
// late task's Start that is still waiting for its first extension to be sent when Close
// comes returns ErrClosed too, at once.
func (s *Scheduler) Start(parent context.Context, t Task, cfg Config) (*Extender, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := t.validate(); err != nil {
		return nil, err
	}
	now := time.Now()
	e := &Extender{s: s, task: t, cfg: cfg, parent: parent, startedAt: now, index: -1,
		deadline: t.GrantedAt.Add(cfg.LockDuration)}
	if cfg.MaxRunTime > 0 {
		e.maxAt = now.Add(cfg.MaxRunTime)
	}
	e.ctx, e.cancel = context.WithCancelCause(parent)
	due, late := firstDue(t.GrantedAt, now, cfg.Interval)
	if late {
		// Handed over late in a long poll: extend at once, and let the handler start
		// only on the engine's answer.
		e.ready = make(chan struct{})
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		e.cancel(ErrClosed)
		return nil, ErrClosed
	}
	e.counted = true
	s.live++
	s.need += 1 / cfg.Interval.Seconds()
	s.schedule(e, due, !late) // a late task's is not spread: its handler waits for it
	s.mu.Unlock()
	if late {
		return s.awaitFirst(e)
	}
	return e, nil
}

// awaitFirst waits for the answer to a late task's first extension. If the scheduler is
// closed before that extension got a call slot, nothing will ever send it: e is taken
// out of the queue, its context ends with ErrClosed, and so does Start, at once, for
// the caller to unlock the task as at any shutdown. An extension already in flight
// (Close waits for it) or an end already under way is waited for as usual.
func (s *Scheduler) awaitFirst(e *Extender) (*Extender, error) {
	select {
	case <-e.ready:
		return e, nil
	case <-s.stop:
	}
	s.mu.Lock()
	// e.anyAnswer: the answer came in since stop woke us (select picks either when both
	// are ready), so e is out of the queue and ready comes at once: not to be closed.
	pending := e.callDone != nil || e.ended || e.anyAnswer
	if !pending {
		e.stopped = true
		s.forget(e)
	}
	s.mu.Unlock()
	if pending {
		<-e.ready
		return e, nil
	}
	e.cancel(ErrClosed)
	return nil, ErrClosed
}

// queue is a min-heap of extenders by the time their next extension goes out
// (container/heap).
type queue []*Extender

func (q queue) Len() int { return len(q) }

func (q queue) Less(i, j int) bool { return q[i].at.Before(q[j].at) }

func (q queue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index = i
	q[j].index = j
}

func (q *queue) Push(x any) {
	e := x.(*Extender)
	e.index = len(*q)
	*q = append(*q, e)
}

func (q *queue) Pop() any {
	old := *q
	n := len(old)
	e := old[n-1]
	old[n-1] = nil
	e.index = -1
	*q = old[:n-1]
	return e
}
