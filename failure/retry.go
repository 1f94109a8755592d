package failure

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Default values of RetryPolicy, used by WithDefaults for fields left at zero.
const (
	defaultMaxAttempts  = 3
	defaultInitialDelay = time.Second
	defaultMultiplier   = 2
	defaultMaxDelay     = 5 * time.Minute
)

// RetryPolicy decides, for a retryable outcome, how many retries the worker reports
// to the engine and after how long the task may be fetched again (the failure's
// retries and retryTimeout). The engine keeps the count: its task field retries is
// null until the first failure is reported, and it never counts down by itself, so the
// worker reports one less each time; reporting 0 raises an incident.
//
// A field left at zero takes its default (see WithDefaults); Attempt and Next apply the
// defaults themselves, so the zero RetryPolicy is the default policy. A consequence is
// that a delay of exactly 0 cannot be asked for: use a tiny one instead.
type RetryPolicy struct {
	// MaxAttempts is the number of attempts including the first; default 3. With 1 the
	// first failure raises an incident.
	MaxAttempts int
	// InitialDelay is the retry timeout after the first failure; default 1s.
	InitialDelay time.Duration
	// Multiplier is the factor between consecutive retry timeouts; default 2.
	Multiplier float64
	// MaxDelay caps the retry timeout; default 5m.
	MaxDelay time.Duration
}

// WithDefaults returns a copy of p with every zero field set to its default
// (MaxAttempts 3, InitialDelay 1s, Multiplier 2, MaxDelay 5m). Non-zero fields, even
// invalid ones, are kept for Validate to report.
func (p RetryPolicy) WithDefaults() RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = defaultMaxAttempts
	}
	if p.InitialDelay == 0 {
		p.InitialDelay = defaultInitialDelay
	}
	if p.Multiplier == 0 {
		p.Multiplier = defaultMultiplier
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = defaultMaxDelay
	}
	return p
}

// Validate reports every field of p that is out of range, each error naming its
// field: MaxAttempts must be at least 1, InitialDelay and MaxDelay must not be
// negative, Multiplier must be at least 1 (backoff never shrinks). It checks p as it
// is; call it on p.WithDefaults() to accept zero fields as defaults, as in a
// configuration loader.
func (p RetryPolicy) Validate() error {
	var errs []error
	if p.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("failure: RetryPolicy.MaxAttempts must be at least 1, got %d", p.MaxAttempts))
	}
	if p.InitialDelay < 0 {
		errs = append(errs, fmt.Errorf("failure: RetryPolicy.InitialDelay must not be negative, got %v", p.InitialDelay))
	}
	if !(p.Multiplier >= 1) || math.IsInf(p.Multiplier, 1) {
		errs = append(errs, fmt.Errorf("failure: RetryPolicy.Multiplier must be a finite number of at least 1, got %v", p.Multiplier))
	}
	if p.MaxDelay < 0 {
		errs = append(errs, fmt.Errorf("failure: RetryPolicy.MaxDelay must not be negative, got %v", p.MaxDelay))
	}
	return errors.Join(errs...)
}

// sane returns p with defaults applied and any field Validate would reject clamped to
// the nearest valid value, so that Attempt and Next never panic or overflow.
func (p RetryPolicy) sane() RetryPolicy {
	p = p.WithDefaults()
	p.MaxAttempts = max(p.MaxAttempts, 1)
	p.InitialDelay = max(p.InitialDelay, 0)
	p.MaxDelay = max(p.MaxDelay, 0)
	if !(p.Multiplier >= 1) {
		p.Multiplier = 1
	}
	return p
}

// Attempt returns the 1-based number of the attempt a task is on, given the engine's
// retries field as fetched: nil (no failure reported yet) is attempt 1; r retries left
// is attempt MaxAttempts-r+1, at least 1 (an operator may have raised the retries
// above MaxAttempts). A negative r counts as 0. It is meant for logs and metrics, and
// for a handler that behaves differently on its last attempt.
func (p RetryPolicy) Attempt(engineRetries *int) int {
	p = p.sane()
	if engineRetries == nil {
		return 1
	}
	r := max(*engineRetries, 0)
	if r >= p.MaxAttempts {
		return 1
	}
	n := p.MaxAttempts - r // >= 1, no overflow since 0 <= r < MaxAttempts
	if n == math.MaxInt {
		return n
	}
	return n + 1
}

// Next returns what the worker reports to the engine after a retryable failure: the
// retries left and the retry timeout. engineRetries is the task's retries field as
// fetched. With nil (the first failure) left is MaxAttempts-1; with r it is r-1, never
// below 0. A value above MaxAttempts, set by an operator to give a task more chances,
// is honoured the same way. The delay is InitialDelay*Multiplier^(attempt-1) for the
// attempt that failed (see Attempt), capped at MaxDelay. When left is 0 the retries
// are exhausted: the failure raises an incident, and the delay is 0.
//
// A delay set with RetryableAfter (Classification.RetryDelay) replaces the returned delay
// when left is above 0; the count-down is the same.
func (p RetryPolicy) Next(engineRetries *int) (left int, delay time.Duration) {
	p = p.sane()
	if engineRetries == nil {
		left = p.MaxAttempts - 1
	} else {
		left = max(*engineRetries, 1) - 1
	}
	if left == 0 {
		return 0, 0
	}
	return left, p.backoff(p.Attempt(engineRetries))
}

// backoff returns InitialDelay*Multiplier^(attempt-1) capped at MaxDelay, computed in
// floating point so that large attempts saturate instead of overflowing.
func (p RetryPolicy) backoff(attempt int) time.Duration {
	if p.InitialDelay >= p.MaxDelay {
		return p.MaxDelay
	}
	d := float64(p.InitialDelay) * math.Pow(p.Multiplier, float64(attempt-1))
	if math.IsNaN(d) || d >= float64(p.MaxDelay) {
		return p.MaxDelay
	}
	return time.Duration(d)
}
