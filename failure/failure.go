package failure

import (
	"errors"
	"fmt"
	"maps"
	"time"
)

// Kind classifies the outcome of a handler call. It decides which engine call the
// worker makes next: complete, failure with retries counted down, bpmnError, or
// failure with retries 0 (an incident).
type Kind int

const (
	// KindNone means the handler returned no error: the worker completes the task.
	KindNone Kind = iota
	// KindRetryable means the worker reports a failure with retries counted down, so
	// the engine hands the task out again after a retry timeout. A plain error, one no
	// constructor of this package marked, is retryable.
	KindRetryable
	// KindBPMNError means the worker throws a BPMN error: the process takes the
	// business path the model defines for the error code (an error boundary event).
	KindBPMNError
	// KindUnknownOutcome means a side effect may or may not have happened (a request
	// left but its answer was lost). Retrying blindly could do it twice, so the task is
	// never retried automatically: someone (or something) must find out first.
	KindUnknownOutcome
	// KindPermanent means retrying cannot help: the worker reports a failure with
	// retries 0, which raises an incident at once.
	KindPermanent
)

// String returns the kind's name as used in logs and metrics: "none", "retryable",
// "bpmn-error", "unknown-outcome" or "permanent"; "Kind(n)" for any other value.
func (k Kind) String() string {
	switch k {
	case KindNone:
		return "none"
	case KindRetryable:
		return "retryable"
	case KindBPMNError:
		return "bpmn-error"
	case KindUnknownOutcome:
		return "unknown-outcome"
	case KindPermanent:
		return "permanent"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Error is an error a handler marked with a kind, using BPMNError, Retryable,
// RetryableAfter, UnknownOutcome or Permanent. It wraps the handler's error, so
// errors.Is and errors.As see through it; wrapping it again (fmt.Errorf with %w) keeps
// the mark, and the outermost *Error in a chain decides the kind.
type Error struct {
	kind      Kind
	err       error
	code      string
	message   string
	variables map[string]any
	delay     time.Duration
	keep      bool // Deferred: the retries are not counted down
}

// Error returns the text of the wrapped error unchanged (so marking an error does not
// alter logs), the kind's name when there is none, and "bpmn error <code>: <message>"
// for a BPMN error.
func (e *Error) Error() string {
	if e == nil {
		return "<nil>"
	}
	k := e.Kind()
	if k == KindBPMNError {
		if e.message == "" {
			return "bpmn error " + e.code
		}
		return "bpmn error " + e.code + ": " + e.message
	}
	if e.err != nil {
		return e.err.Error()
	}
	if e.message != "" {
		return e.message
	}
	return k.String()
}

// Unwrap returns the wrapped error, nil for a BPMN error or a nil argument. It lets
// errors.Is and errors.As reach the handler's own error.
func (e *Error) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.err
}

// Kind returns the kind the error was marked with. A nil or zero *Error (not made by a
// constructor) is KindRetryable, like any unmarked error: an error is never KindNone.
func (e *Error) Kind() Kind {
	if e == nil || e.kind <= KindNone || e.kind > KindPermanent {
		return KindRetryable
	}
	return e.kind
}

// BPMNError returns an error that makes the worker throw a BPMN error with the given
// code, message and variables, so the process takes the path the model defines for
// the code. The code is required: an empty code is a programming error, and since a
// handler runs inside a live worker it is reported as a permanent error (an incident
// whose message names the mistake) rather than a panic. Variables are copied
// (shallowly); nil means none.
func BPMNError(code, message string, variables map[string]any) error {
	if code == "" {
		return &Error{
			kind:    KindPermanent,
			message: fmt.Sprintf("failure: BPMNError called with an empty error code (message %q)", message),
		}
	}
	return &Error{kind: KindBPMNError, code: code, message: message, variables: maps.Clone(variables)}
}

// Retryable marks err as retryable: the worker reports a failure with retries counted
// down and the delay of its RetryPolicy. Unmarked errors are retryable already; use it
// to say so explicitly, or to override an inner mark (the outermost mark wins).
func Retryable(err error) error {
	return &Error{kind: KindRetryable, err: err}
}

// RetryableAfter is Retryable with the task's own retry timeout, overriding the
// policy's backoff for this failure: for example the delay a rate-limited service
// asked for. A delay of 0 or less means "use the policy", as with Retryable. The
// retries are still counted down by the policy.
func RetryableAfter(err error, delay time.Duration) error {
	return &Error{kind: KindRetryable, err: err, delay: max(delay, 0)}
}

// Deferred is RetryableAfter without counting a retry down: the task is not failing, it
// is waiting for something that ends by itself, such as another attempt's lease on the
// same side effect (idempotency.ErrInProgress). The worker reports a failure with the
// task's retries unchanged and the given retry timeout (the policy's backoff if 0), so a
// crashed worker's lease cannot use a healthy task's retries up and raise an incident.
// Whatever it waits for must be bounded in time: Deferred never ends in an incident.
func Deferred(err error, delay time.Duration) error {
	return &Error{kind: KindRetryable, err: err, delay: max(delay, 0), keep: true}
}

// UnknownOutcome marks err as leaving a side effect in doubt: the request may or may
// not have taken effect (a timeout after sending, a lost answer). Such a task is never
// retried blindly, since doing so could repeat the effect.
func UnknownOutcome(err error) error {
	return &Error{kind: KindUnknownOutcome, err: err}
}

// Permanent marks err as one retrying cannot fix (bad input, a missing configuration):
// the worker reports a failure with retries 0, raising an incident at once instead of
// wasting the retries.
func Permanent(err error) error {
	return &Error{kind: KindPermanent, err: err}
}

// PanicError is a handler panic the worker recovered: the value passed to panic and
// the goroutine's stack at the time. A panic is usually a bug but may be transient (a
// nil map from a half-failed call), so it is classified retryable; when retries run
// out the task gets an incident carrying the stack.
type PanicError struct {
	// Value is the value passed to panic.
	Value any
	// Stack is the stack trace of the panicking goroutine (runtime/debug.Stack).
	Stack []byte
}

// Error returns "handler panicked: <value>". The stack is left out of the text so
// that logs stay one line; it is in Stack, for the incident's details.
func (e *PanicError) Error() string {
	if e == nil {
		return "handler panicked: <nil>"
	}
	return fmt.Sprintf("handler panicked: %v", e.Value)
}

// FromPanic returns a *PanicError for a recovered panic value and its stack, to be
// called in the worker's deferred recover:
//
//	defer func() {
//		if v := recover(); v != nil {
//			err = failure.FromPanic(v, debug.Stack())
//		}
//	}()
//
// A value that already is a *PanicError (a panic re-raised with a recovered one) is
// returned as it is, so panics do not nest.
func FromPanic(value any, stack []byte) error {
	if pe, ok := value.(*PanicError); ok && pe != nil {
		return pe
	}
	return &PanicError{Value: value, Stack: stack}
}

// Classification is a handler's error classified: what the worker must tell the engine.
// Only Classify builds one.
type Classification struct {
	// Kind decides which engine call the worker makes.
	Kind Kind
	// Err is the error as the handler returned it (nil for KindNone).
	Err error
	// Code is the BPMN error code (KindBPMNError only).
	Code string
	// Message is the BPMN error message for KindBPMNError, the error's text otherwise
	// (the failure's errorMessage).
	Message string
	// Variables are the BPMN error's variables (KindBPMNError only; a copy).
	Variables map[string]any
	// RetryDelay is the delay set with RetryableAfter or Deferred (KindRetryable only);
	// 0 means the RetryPolicy decides.
	RetryDelay time.Duration
	// KeepRetries is set by Deferred: report the failure without counting a retry down.
	KeepRetries bool
	// Panic is set when the error is, or wraps, a recovered panic, whatever the kind.
	Panic *PanicError
}

// Classify turns a handler's error into exactly one Classification:
//
//   - nil: KindNone.
//   - an error that is or wraps an *Error: the outermost *Error in the chain (the
//     first errors.As finds) decides, so Permanent(Retryable(x)) is permanent.
//   - an error that is or wraps a *PanicError: KindRetryable, with Panic set.
//   - anything else, context.Canceled and context.DeadlineExceeded included:
//     KindRetryable.
//
// Classify is deterministic and does not panic, even when the error's Error method
// does.
func Classify(err error) Classification {
	if err == nil {
		return Classification{Kind: KindNone}
	}
	o := Classification{Kind: KindRetryable, Err: err}
	var pe *PanicError
	if errors.As(err, &pe) && pe != nil {
		o.Panic = pe
	}
	var e *Error
	if errors.As(err, &e) && e != nil {
		o.Kind = e.Kind()
		switch o.Kind {
		case KindBPMNError:
			o.Code = e.code
			o.Message = e.message
			o.Variables = maps.Clone(e.variables)
			return o
		case KindRetryable:
			o.RetryDelay = e.delay
			o.KeepRetries = e.keep
		}
	}
	o.Message = text(err)
	return o
}

// text returns err.Error(), or a description of the panic if Error panics, so that a
// broken error type cannot take the worker down.
func text(err error) (s string) {
	defer func() {
		if v := recover(); v != nil {
			s = fmt.Sprintf("%T: Error method panicked: %v", err, v)
		}
	}()
	return err.Error()
}
