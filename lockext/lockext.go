package lockext

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/extworker/extworker/camunda7"
)

// Locker is the part of *camunda7.Client the extender needs: ExtendLock sets a task's
// lock to expire newDuration from the engine's now; Lock locks it again for the same
// worker after that worker's own lock expired and nobody else took the task (the
// engine refuses to extend an expired lock, but lets it be locked anew; engine 7.15+).
// Tests substitute a fake.
type Locker interface {
	ExtendLock(ctx context.Context, taskID, workerID string, newDuration time.Duration) error
	Lock(ctx context.Context, taskID, workerID string, lockDuration time.Duration) error
}

// *camunda7.Client is the Locker the runtime uses.
var _ Locker = (*camunda7.Client)(nil)

// Defaults applied by Config.WithDefaults.
const (
	defaultRetryInitial      = 100 * time.Millisecond // the first pause after a transient error
	maxDefaultRequestTimeout = 10 * time.Second       // caps the default RequestTimeout
)

// Config tunes one extender. The runtime builds it once per topic and passes it to
// every Start (with the task's logger); WithDefaults fills the zero fields.
type Config struct {
	// LockDuration is the task's lock duration, as asked for in fetchAndLock; every
	// extension asks for it again (the engine measures it from its own now). Required,
	// at least 1ms (the engine's precision).
	LockDuration time.Duration
	// Interval is how long after the current lock was granted the next extension is
	// sent. Default LockDuration/3, which leaves two more attempts' worth of time before
	// the lock runs out. Must be shorter than LockDuration.
	Interval time.Duration
	// MaxRunTime bounds the whole run since Start: past it the extender stops extending
	// and cancels Context with ErrMaxRunTime, so a stuck handler cannot hold a task
	// forever (the lock then runs out and another worker may fetch the task). Zero, the
	// default, means unlimited.
	MaxRunTime time.Duration
	// RequestTimeout bounds each extendLock call. Default min(Interval, 10s).
	RequestTimeout time.Duration
	// RetryInitial is the first pause after a transient extendLock error; each further
	// failure doubles it, up to Interval. Transient errors never end the extending, however
	// long they last: only the engine's answer can say the lock is lost. Default 100ms.
	RetryInitial time.Duration
	// Logger receives a Warn record when a lock is lost or MaxRunTime is exceeded (with
	// task id, worker id and reason), an Info record when an expired lock was locked
	// again, and a Debug record per transient error. Default discards.
	Logger *slog.Logger
	// OnExtend, if set, is called after every extendLock call with its error (nil on
	// success), from the goroutine that made the call: for metrics, so keep it quick.
	// Not called for a call cut short by Stop.
	OnExtend func(err error)
	// OnEnd, if set, is called once when the extending ends for a reason other than Stop:
	// with the *LockLostError or ErrMaxRunTime that Context is cancelled with.
	OnEnd func(cause error)
}

// WithDefaults returns a copy of c with every zero field set to its default. Interval
// and RequestTimeout are derived from LockDuration, so set that first.
func (c Config) WithDefaults() Config {
	if c.Interval == 0 {
		c.Interval = c.LockDuration / 3
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = min(c.Interval, maxDefaultRequestTimeout)
	}
	if c.RetryInitial == 0 {
		c.RetryInitial = defaultRetryInitial
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every problem with c at once, each naming its field. Zero fields
// that have a default are accepted, so Validate can check c before or after
// WithDefaults.
func (c Config) Validate() error {
	var errs []error
	if c.LockDuration < time.Millisecond {
		errs = append(errs, fmt.Errorf("LockDuration %v: must be at least 1ms", c.LockDuration))
	}
	switch {
	case c.Interval < 0:
		errs = append(errs, fmt.Errorf("Interval %v: must not be negative", c.Interval))
	case c.Interval >= c.LockDuration && c.LockDuration > 0:
		errs = append(errs, fmt.Errorf("Interval %v: must be shorter than LockDuration %v, or the lock expires before it is extended", c.Interval, c.LockDuration))
	}
	if c.MaxRunTime < 0 {
		errs = append(errs, fmt.Errorf("MaxRunTime %v: must not be negative", c.MaxRunTime))
	}
	if c.RequestTimeout < 0 {
		errs = append(errs, fmt.Errorf("RequestTimeout %v: must not be negative", c.RequestTimeout))
	}
	if c.RetryInitial < 0 {
		errs = append(errs, fmt.Errorf("RetryInitial %v: must not be negative", c.RetryInitial))
	}
	if len(errs) > 0 {
		return fmt.Errorf("lockext config: %w", errors.Join(errs...))
	}
	return nil
}

// Task identifies the locked task and when its lock was granted.
type Task struct {
	// ID is the external task's id. Required.
	ID string
	// WorkerID is the worker id the task was fetched (locked) for; extendLock must name
	// the same one. Required.
	WorkerID string
	// GrantedAt is the local time (time.Now(), monotonic) when the fetchAndLock request
	// that locked the task was SENT: the engine set expiry = its now + LockDuration at
	// some moment after that, so GrantedAt+LockDuration is a conservative local deadline
	// that needs no agreement with the engine's wall clock. It decides when to extend,
	// never that the lock is lost: a task the engine locked late in a long poll arrives
	// with its local deadline near or past, and is extended at once. Required.
	GrantedAt time.Time
}

func (t Task) validate() error {
	var errs []error
	if t.ID == "" {
		errs = append(errs, errors.New("ID is empty"))
	}
	if t.WorkerID == "" {
		errs = append(errs, errors.New("WorkerID is empty"))
	}
	if t.GrantedAt.IsZero() {
		errs = append(errs, errors.New("GrantedAt is zero"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("lockext task %q: %w", t.ID, errors.Join(errs...))
	}
	return nil
}

// Causes with which Extender.Context is cancelled, matched with errors.Is against
// context.Cause(ctx) or Extender.Lost. A lost lock is camunda7.ErrLockLost, the one
// lock-lost error there is (every *LockLostError matches it).
var (
	// ErrMaxRunTime is the cause once Config.MaxRunTime has passed since Start.
	ErrMaxRunTime = errors.New("lockext: maximum run time exceeded")
	// ErrStopped is the cause after Stop: the normal end, once the result is reported.
	ErrStopped = errors.New("lockext: extender stopped")
)

// LockLostError is the context cause on lock loss. errors.Is(err, camunda7.ErrLockLost) is true,
// and errors.Is/As also see Err (e.g. camunda7.ErrTaskGone, *camunda7.Error).
type LockLostError struct {
	// TaskID is the task whose lock was lost.
	TaskID string
	// Err is the engine's answer: the task is gone (completed, cancelled, its instance
	// deleted) or another worker holds it (or nobody, after an unlock).
	Err error
}

// Error says whose lock was lost and the engine's answer.
func (e *LockLostError) Error() string {
	return fmt.Sprintf("lockext: lock of task %s lost: %v", e.TaskID, e.Err)
}

// Unwrap returns Err, so callers can match the engine's answer.
func (e *LockLostError) Unwrap() error { return e.Err }

// Is matches camunda7.ErrLockLost, whatever the engine answered (a task gone included).
func (e *LockLostError) Is(target error) bool { return target == camunda7.ErrLockLost }

// LostAnswer reports whether an engine answer (to extendLock or lock, or to a report
// such as complete) proves the lock is gone: the task no longer exists, or another
// worker (or nobody) holds it. An expired lock of one's own (camunda7.ErrLockExpired)
// is not lost: nobody else has taken the task, and Lock takes it again. Everything else
// (not sent, unknown outcome, 5xx, suspended, unauthorized, a 404 that is not the
// engine's answer about the task) might pass.
func LostAnswer(err error) bool {
	if errors.Is(err, camunda7.ErrLockExpired) {
		return false
	}
	return errors.Is(err, camunda7.ErrTaskGone) || errors.Is(err, camunda7.ErrLockLost)
}
