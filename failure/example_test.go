package failure_test

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/extworker/extworker/failure"
)

// Errors a payment service might return.
var (
	errDeclined    = errors.New("card declined")
	errRateLimited = errors.New("rate limited")
	errTimeout     = errors.New("timeout after sending")
	errNoCard      = errors.New(`variable "card" is missing`)
	errUnavailable = errors.New("service unavailable")
)

// charge is a topic handler: each failure of the payment service becomes a
// different kind of outcome.
func charge(ctx context.Context, serviceErr error) error {
	switch {
	case serviceErr == nil:
		return nil // complete the task
	case errors.Is(serviceErr, errDeclined):
		return failure.BPMNError("CARD_DECLINED", "card declined", map[string]any{"reason": "insufficient funds"})
	case errors.Is(serviceErr, errRateLimited):
		return failure.RetryableAfter(serviceErr, 30*time.Second)
	case errors.Is(serviceErr, errTimeout):
		return failure.UnknownOutcome(fmt.Errorf("charge card: %w", serviceErr))
	case errors.Is(serviceErr, errNoCard):
		return failure.Permanent(serviceErr)
	default:
		return fmt.Errorf("charge card: %w", serviceErr) // retryable
	}
}

// Each kind a handler can return, classified.
func Example() {
	for _, serviceErr := range []error{nil, errUnavailable, errDeclined, errRateLimited, errTimeout, errNoCard} {
		o := failure.Classify(charge(context.Background(), serviceErr))
		switch o.Kind {
		case failure.KindNone:
			fmt.Println("none: complete")
		case failure.KindBPMNError:
			fmt.Printf("%s: throw %s %q %v\n", o.Kind, o.Code, o.Message, o.Variables)
		case failure.KindRetryable:
			fmt.Printf("%s: %q retry delay %v (0: the policy's)\n", o.Kind, o.Message, o.RetryDelay)
		default:
			fmt.Printf("%s: %q\n", o.Kind, o.Message)
		}
	}
	// Output:
	// none: complete
	// retryable: "charge card: service unavailable" retry delay 0s (0: the policy's)
	// bpmn-error: throw CARD_DECLINED "card declined" map[reason:insufficient funds]
	// retryable: "rate limited" retry delay 30s (0: the policy's)
	// unknown-outcome: "charge card: timeout after sending"
	// permanent: "variable \"card\" is missing"
}

// A worker reporting a retryable failure: the policy counts the engine's retries down
// and backs off, and a delay set with RetryableAfter replaces the backoff.
func ExampleRetryPolicy_Next() {
	policy := failure.RetryPolicy{} // defaults: 3 attempts, 1s, x2, at most 5m

	report := func(engineRetries *int, err error) *int {
		o := failure.Classify(err)
		left, delay := policy.Next(engineRetries)
		if o.RetryDelay > 0 && left > 0 {
			delay = o.RetryDelay
		}
		fmt.Printf("attempt %d failed (%s): retries=%d retryTimeout=%v\n",
			policy.Attempt(engineRetries), o.Message, left, delay)
		return &left
	}

	var retries *int // null until the first failure is reported
	retries = report(retries, errUnavailable)
	retries = report(retries, failure.RetryableAfter(errRateLimited, 45*time.Second))
	report(retries, errUnavailable)
	// Output:
	// attempt 1 failed (service unavailable): retries=2 retryTimeout=1s
	// attempt 2 failed (rate limited): retries=1 retryTimeout=45s
	// attempt 3 failed (service unavailable): retries=0 retryTimeout=0s
}

// An operator raised a task's retries to 10 to give it more chances: the policy
// honours them.
func ExampleRetryPolicy_Next_operatorRaisedRetries() {
	policy := failure.RetryPolicy{MaxAttempts: 3}
	retries := 10
	left, delay := policy.Next(&retries)
	fmt.Println(left, delay)
	// Output:
	// 9 1s
}

// Nested marks: the outermost wins, and errors.Is still sees the cause.
func ExampleClassify() {
	err := fmt.Errorf("step 2: %w", failure.Permanent(failure.Retryable(errNoCard)))
	o := failure.Classify(err)
	fmt.Println(o.Kind, errors.Is(err, errNoCard))
	fmt.Println(failure.Classify(context.Canceled).Kind)
	fmt.Println(failure.Classify(nil).Kind)
	// Output:
	// permanent true
	// retryable
	// none
}

// A BPMN error needs a code; without one it becomes an incident that says why.
func ExampleBPMNError() {
	o := failure.Classify(failure.BPMNError("", "card declined", nil))
	fmt.Println(o.Kind)
	fmt.Println(o.Message)
	// Output:
	// permanent
	// failure: BPMNError called with an empty error code (message "card declined")
}

// The worker recovers a handler's panic with FromPanic; it is retryable and keeps the
// stack out of the message.
func ExampleFromPanic() {
	run := func(handler func() error) (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = failure.FromPanic(v, debug.Stack())
			}
		}()
		return handler()
	}
	err := run(func() error { panic("something went wrong") })
	o := failure.Classify(fmt.Errorf("topic charge: %w", err))
	fmt.Println(o.Kind, o.Panic != nil, len(o.Panic.Stack) > 0)
	fmt.Println(o.Message)
	// Output:
	// retryable true true
	// topic charge: handler panicked: something went wrong
}

// Validate names the field at fault; WithDefaults fills zero fields first.
func ExampleRetryPolicy_Validate() {
	fmt.Println(failure.RetryPolicy{MaxAttempts: 5}.WithDefaults().Validate())
	fmt.Println(failure.RetryPolicy{MaxAttempts: 5, Multiplier: 0.5}.WithDefaults().Validate())
	// Output:
	// <nil>
	// failure: RetryPolicy.Multiplier must be a finite number of at least 1, got 0.5
}
