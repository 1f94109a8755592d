// Package failure turns what a topic handler returns into exactly one classified
// outcome, and holds the retry policy that turns a retryable outcome into the
// retries and retryTimeout the worker reports to the engine.
//
// It uses the standard library only; it knows nothing of HTTP or of the engine
// client, so handlers can depend on it without pulling the worker in.
//
// # Returning an outcome from a handler
//
// A handler returns an error. Returning nil completes the task. Returning a plain
// error reports a failure that the engine retries later. To say more, wrap the error
// with one of the constructors:
//
//	func charge(ctx context.Context, t *tasks.Task) error {
//		card, err := t.Variables().String("card")
//		if err != nil {
//			return failure.Permanent(err) // bad input: an incident now, retrying cannot help
//		}
//		resp, err := payments.Charge(ctx, card)
//		switch {
//		case errors.Is(err, payments.ErrDeclined):
//			// a business outcome the process model handles with an error boundary event
//			return failure.BPMNError("CARD_DECLINED", "card declined", map[string]any{"reason": resp.Reason})
//		case errors.Is(err, payments.ErrRateLimited):
//			return failure.RetryableAfter(err, resp.RetryAfter) // the service said when
//		case errors.Is(err, payments.ErrTimeout):
//			// the charge may have gone through: do not charge again blindly
//			return failure.UnknownOutcome(err)
//		case err != nil:
//			return err // retryable, with the policy's backoff
//		}
//		return nil
//	}
//
// The constructors return an *Error that wraps the handler's error: errors.Is and
// errors.As see through it, and its text is the wrapped error's. Wrapping a marked
// error again with fmt.Errorf("...: %w", err) keeps the mark. When marks are nested the
// outermost wins, so Permanent(Retryable(err)) is permanent: whoever wrapped last knew
// the most.
//
// A BPMN error needs a code, since the model catches errors by code. BPMNError with an
// empty code is a programming error; rather than panic inside a running worker it is
// classified as permanent, and the incident's message says what went wrong.
//
// # Panics
//
// The worker recovers a handler's panic and turns it into a *PanicError with
// FromPanic, keeping the panic value and the stack. A panic is classified retryable:
// it is usually a bug, but may be transient, and when the retries run out the task
// ends in an incident whose details can carry the stack.
//
// # Classifying
//
// Classify is the one place the worker looks at a handler's error:
//
//	o := failure.Classify(err)
//	switch o.Kind {
//	case failure.KindNone:           // complete the task
//	case failure.KindBPMNError:      // throw o.Code, o.Message, o.Variables
//	case failure.KindRetryable:      // report a failure with policy.Next (see below)
//	case failure.KindUnknownOutcome: // do not retry blindly: find out, or raise an incident
//	case failure.KindPermanent:      // report a failure with retries 0: an incident now
//	}
//
// Context errors are not special: a handler that gives up because its context was
// cancelled (the lock was lost, the worker is stopping) returns a retryable error.
// Nor does Classify know other packages' errors: a request that left but whose answer
// was lost (camunda7.ErrUnknownOutcome, or any client's timeout after sending) is
// retryable unless the handler wraps it with UnknownOutcome.
//
// # Retries
//
// The engine keeps a task's retries but never counts them down: its retries field is
// null until the first failure is reported, and after that it holds whatever the
// worker last reported. RetryPolicy does the counting. Next takes the retries field
// as fetched and returns the retries left and the retry timeout to report:
//
//	policy := failure.RetryPolicy{} // MaxAttempts 3, InitialDelay 1s, Multiplier 2, MaxDelay 5m
//	left, delay := policy.Next(task.Retries)
//	// nil -> 2, 1s; 2 -> 1, 2s; 1 -> 0, 0 (an incident)
//	if o.RetryDelay > 0 && left > 0 {
//		delay = o.RetryDelay // RetryableAfter overrides the backoff, not the count
//	}
//
// An operator who raises a task's retries above MaxAttempts gives it that many more
// chances; Next honours them. Validate checks a policy read from configuration; apply
// WithDefaults first if zero fields should mean the defaults.
package failure
