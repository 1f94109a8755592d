package lockext

import "time"

// The scheduler's decisions, as functions of values: when an extension goes out
// (dueAt, firstDue), what to do with the head of the queue (nextStep), how far apart
// sends are paced (paceGap), how long a call may take (callDeadline), and what a call's
// answer means (verdictOf, nextNominal). The Scheduler applies them under its lock.

// firstDue is when a task's first extension is due, Interval after its lock was granted;
// late says the task was handed over at or after that time (late in a long poll), and its
// first extension is then due at once, now.
func firstDue(grantedAt, now time.Time, interval time.Duration) (due time.Time, late bool) {
	due = grantedAt.Add(interval)
	if !now.Before(due) {
		return now, true
	}
	return due, false
}

// dueAt is when an extension due at nominal goes out: with spread (a share of interval,
// below 1) up to that much earlier, r (0 ≤ r < 1) choosing where, and never after maxAt
// (a MaxRunTime's end; zero: none).
func dueAt(nominal, maxAt time.Time, interval time.Duration, spread, r float64) time.Time {
	at := nominal
	if spread > 0 {
		at = nominal.Add(-time.Duration(r * spread * float64(interval)))
	}
	if !maxAt.IsZero() && maxAt.Before(at) {
		at = maxAt
	}
	return at
}

// step is what the scheduler does with the head of its queue.
type step int

const (
	stepWait   step = iota // not yet: look again after the returned wait
	stepExpire             // its MaxRunTime has passed: end it
	stepSend               // send its extension now (if a call slot is free)
)

// nextStep decides, at now, about the head of the queue, due to go out at at, whose
// MaxRunTime ends at maxAt (zero: none), when the previous extension went out at
// lastSend and sends are paced gap apart.
func nextStep(now, at, maxAt, lastSend time.Time, gap time.Duration) (step, time.Duration) {
	switch {
	case at.After(now):
		return stepWait, at.Sub(now)
	case !maxAt.IsZero() && !now.Before(maxAt):
		return stepExpire, 0
	case lastSend.Add(gap).After(now):
		return stepWait, lastSend.Add(gap).Sub(now)
	}
	return stepSend, 0
}

// paceGap is the least time between two sends: 1/(burst × need), need being the
// extensions per second the live tasks need, and never more than minPaceGap. 0 (no
// pacing) with burst negative or no need.
func paceGap(burst, need float64) time.Duration {
	if burst < 0 || need <= 0 {
		return 0
	}
	return min(time.Duration(float64(time.Second)/(burst*need)), minPaceGap)
}

// callDeadline is when a call sent at now ends: after timeout, and never after maxAt
// (zero: none).
func callDeadline(now time.Time, timeout time.Duration, maxAt time.Time) time.Time {
	end := now.Add(timeout)
	if !maxAt.IsZero() {
		end = earliest(end, maxAt)
	}
	return end
}

// verdict is what a call's answer means for the extender.
type verdict int

const (
	verdictExtended   verdict = iota // the lock was extended: the next one Interval after it was sent
	verdictRetry                     // a transient error: try again after the backoff
	verdictLost                      // the engine's answer: the lock is lost
	verdictMaxRunTime                // MaxRunTime passed while the call was out
)

// verdictOf reads a call's answer: lost is LostAnswer(err), maxOver whether MaxRunTime
// has passed. Only the engine's answer ends the lock as lost, whatever the local clock
// says.
func verdictOf(err error, lost, maxOver bool) verdict {
	switch {
	case err != nil && lost:
		return verdictLost
	case maxOver:
		return verdictMaxRunTime
	case err == nil:
		return verdictExtended
	}
	return verdictRetry
}

// nextNominal is when the next extension is due after a call sent at sentAt: Interval
// after it when it extended the lock, backoff after now when it failed.
func nextNominal(v verdict, sentAt, now time.Time, interval, backoff time.Duration) time.Time {
	if v == verdictExtended {
		return sentAt.Add(interval)
	}
	return now.Add(backoff)
}
