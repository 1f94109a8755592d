package failure

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var errBoom = errors.New("boom")

func TestKindString(t *testing.T) {
	cases := []struct {
		kind Kind
		want string
	}{
		{KindNone, "none"},
		{KindRetryable, "retryable"},
		{KindBPMNError, "bpmn-error"},
		{KindUnknownOutcome, "unknown-outcome"},
		{KindPermanent, "permanent"},
		{Kind(-1), "Kind(-1)"},
		{Kind(42), "Kind(42)"},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			assert.Equal(t, c.want, c.kind.String())
		})
	}
}

func TestClassify(t *testing.T) {
	stack := []byte("goroutine 1 [running]:\nmain.handler()")
	panicErr := FromPanic("nil map", stack)
	panicWithErr := FromPanic(errBoom, stack)
	vars := map[string]any{"reason": "declined", "amount": 12}

	cases := []struct {
		name      string
		err       error
		kind      Kind
		code      string
		message   string
		variables map[string]any
		delay     time.Duration
		panic     error // the *PanicError expected in Classification.Panic
		is        error // a sentinel errors.Is must find through Classification.Err
	}{
		{name: "nil", err: nil, kind: KindNone},

		// Plain errors.
		{name: "plain", err: errBoom, kind: KindRetryable, message: "boom", is: errBoom},
		{name: "plain wrapped", err: fmt.Errorf("charge: %w", errBoom), kind: KindRetryable, message: "charge: boom", is: errBoom},
		{name: "context canceled", err: context.Canceled, kind: KindRetryable, message: "context canceled", is: context.Canceled},
		{name: "deadline exceeded", err: context.DeadlineExceeded, kind: KindRetryable, message: "context deadline exceeded", is: context.DeadlineExceeded},
		{name: "deadline exceeded wrapped", err: fmt.Errorf("call: %w", context.DeadlineExceeded), kind: KindRetryable,
			message: "call: context deadline exceeded", is: context.DeadlineExceeded},
		{name: "joined plain", err: errors.Join(errBoom, io.EOF), kind: KindRetryable, message: "boom\nEOF", is: io.EOF},

		// Every constructor.
		{name: "Retryable", err: Retryable(errBoom), kind: KindRetryable, message: "boom", is: errBoom},
		{name: "Retryable nil", err: Retryable(nil), kind: KindRetryable, message: "retryable"},
		{name: "RetryableAfter", err: RetryableAfter(errBoom, 30*time.Second), kind: KindRetryable, message: "boom", delay: 30 * time.Second, is: errBoom},
		{name: "RetryableAfter nil", err: RetryableAfter(nil, time.Minute), kind: KindRetryable, message: "retryable", delay: time.Minute},
		{name: "RetryableAfter zero delay", err: RetryableAfter(errBoom, 0), kind: KindRetryable, message: "boom", is: errBoom},
		{name: "RetryableAfter negative delay", err: RetryableAfter(errBoom, -time.Second), kind: KindRetryable, message: "boom", is: errBoom},
		{name: "UnknownOutcome", err: UnknownOutcome(errBoom), kind: KindUnknownOutcome, message: "boom", is: errBoom},
		{name: "UnknownOutcome nil", err: UnknownOutcome(nil), kind: KindUnknownOutcome, message: "unknown-outcome"},
		{name: "Permanent", err: Permanent(errBoom), kind: KindPermanent, message: "boom", is: errBoom},
		{name: "Permanent nil", err: Permanent(nil), kind: KindPermanent, message: "permanent"},
		{name: "BPMNError", err: BPMNError("CARD_DECLINED", "card declined", vars), kind: KindBPMNError,
			code: "CARD_DECLINED", message: "card declined", variables: vars},
		{name: "BPMNError no message no variables", err: BPMNError("E1", "", nil), kind: KindBPMNError, code: "E1"},
		{name: "BPMNError empty code", err: BPMNError("", "card declined", vars), kind: KindPermanent,
			message: `failure: BPMNError called with an empty error code (message "card declined")`},

		// Marks survive fmt.Errorf wrapping.
		{name: "wrapped Retryable", err: fmt.Errorf("step: %w", Retryable(errBoom)), kind: KindRetryable, message: "step: boom", is: errBoom},
		{name: "wrapped RetryableAfter", err: fmt.Errorf("step: %w", RetryableAfter(errBoom, 5*time.Second)), kind: KindRetryable,
			message: "step: boom", delay: 5 * time.Second, is: errBoom},
		{name: "wrapped UnknownOutcome", err: fmt.Errorf("step: %w", UnknownOutcome(errBoom)), kind: KindUnknownOutcome, message: "step: boom", is: errBoom},
		{name: "wrapped Permanent", err: fmt.Errorf("step: %w", Permanent(errBoom)), kind: KindPermanent, message: "step: boom", is: errBoom},
		{name: "wrapped twice Permanent", err: fmt.Errorf("a: %w", fmt.Errorf("b: %w", Permanent(errBoom))), kind: KindPermanent, message: "a: b: boom", is: errBoom},
		{name: "wrapped BPMNError", err: fmt.Errorf("step: %w", BPMNError("E1", "m", vars)), kind: KindBPMNError,
			code: "E1", message: "m", variables: vars},
		{name: "wrapped BPMNError empty code", err: fmt.Errorf("step: %w", BPMNError("", "", nil)), kind: KindPermanent,
			message: `step: failure: BPMNError called with an empty error code (message "")`},
		{name: "joined with Permanent", err: errors.Join(errBoom, Permanent(io.EOF)), kind: KindPermanent, message: "boom\nEOF", is: io.EOF},

		// Nested marks: the outermost wins.
		{name: "Permanent(Retryable)", err: Permanent(Retryable(errBoom)), kind: KindPermanent, message: "boom", is: errBoom},
		{name: "Retryable(Permanent)", err: Retryable(Permanent(errBoom)), kind: KindRetryable, message: "boom", is: errBoom},
		{name: "UnknownOutcome(RetryableAfter)", err: UnknownOutcome(RetryableAfter(errBoom, time.Hour)), kind: KindUnknownOutcome, message: "boom", is: errBoom},
		{name: "RetryableAfter(UnknownOutcome)", err: RetryableAfter(UnknownOutcome(errBoom), time.Hour), kind: KindRetryable,
			message: "boom", delay: time.Hour, is: errBoom},
		{name: "Retryable(RetryableAfter)", err: Retryable(RetryableAfter(errBoom, time.Hour)), kind: KindRetryable, message: "boom", is: errBoom},
		{name: "Retryable(BPMNError)", err: Retryable(BPMNError("E1", "m", vars)), kind: KindRetryable, message: "bpmn error E1: m"},
		{name: "Permanent(wrapped Retryable)", err: Permanent(fmt.Errorf("x: %w", Retryable(errBoom))), kind: KindPermanent, message: "x: boom", is: errBoom},
		{name: "wrapped Permanent(wrapped UnknownOutcome)", err: fmt.Errorf("a: %w", Permanent(fmt.Errorf("b: %w", UnknownOutcome(errBoom)))),
			kind: KindPermanent, message: "a: b: boom", is: errBoom},

		// Panics.
		{name: "panic", err: panicErr, kind: KindRetryable, message: "handler panicked: nil map", panic: panicErr},
		{name: "panic wrapped", err: fmt.Errorf("handler: %w", panicErr), kind: KindRetryable, message: "handler: handler panicked: nil map", panic: panicErr},
		{name: "panic with error value", err: panicWithErr, kind: KindRetryable, message: "handler panicked: boom", panic: panicWithErr},
		{name: "Permanent(panic)", err: Permanent(panicErr), kind: KindPermanent, message: "handler panicked: nil map", panic: panicErr},
		{name: "wrapped UnknownOutcome(wrapped panic)", err: fmt.Errorf("a: %w", UnknownOutcome(fmt.Errorf("b: %w", panicErr))),
			kind: KindUnknownOutcome, message: "a: b: handler panicked: nil map", panic: panicErr},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := Classify(c.err)
			assert.Equal(t, c.kind, o.Kind, "kind %s, want %s", o.Kind, c.kind)
			assert.True(t, c.err == o.Err, "Err is the error as returned, got %v", o.Err)
			assert.Equal(t, c.code, o.Code)
			assert.Equal(t, c.message, o.Message)
			assert.Equal(t, c.variables, o.Variables)
			assert.Equal(t, c.delay, o.RetryDelay)
			if c.panic != nil {
				assert.Same(t, c.panic, o.Panic)
			} else {
				assert.Nil(t, o.Panic)
			}
			if c.is != nil {
				assert.ErrorIs(t, o.Err, c.is)
			}
			if c.err != nil {
				var e *Error
				if errors.As(c.err, &e) {
					assert.Equal(t, c.kind, e.Kind(), "the outermost *Error reports the same kind")
				}
			}
		})
	}
}

type customErr struct{ err error }

func (e *customErr) Error() string { return e.err.Error() }
func (e *customErr) Unwrap() error { return e.err }

func TestErrorsIsAsThroughError(t *testing.T) {
	custom := &customErr{errBoom}
	constructors := map[string]func(error) error{
		"Retryable":      Retryable,
		"RetryableAfter": func(err error) error { return RetryableAfter(err, time.Second) },
		"UnknownOutcome": UnknownOutcome,
		"Permanent":      Permanent,
	}
	for name, mark := range constructors {
		t.Run(name, func(t *testing.T) {
			err := fmt.Errorf("outer: %w", mark(fmt.Errorf("inner: %w", custom)))
			assert.ErrorIs(t, err, errBoom)
			assert.ErrorIs(t, err, custom)
			var got *customErr
			require.ErrorAs(t, err, &got)
			assert.Same(t, custom, got)

			var e *Error
			require.ErrorAs(t, err, &e, "the concrete type is *Error")
			assert.Equal(t, "inner: boom", e.Error(), "the text is the wrapped error's")
			assert.Equal(t, "outer: inner: boom", err.Error())
		})
	}
}

func TestConstructorsReturnError(t *testing.T) {
	for name, err := range map[string]error{
		"BPMNError":            BPMNError("E", "m", nil),
		"BPMNError empty code": BPMNError("", "m", nil),
		"Retryable":            Retryable(nil),
		"RetryableAfter":       RetryableAfter(nil, time.Second),
		"UnknownOutcome":       UnknownOutcome(nil),
		"Permanent":            Permanent(nil),
	} {
		t.Run(name, func(t *testing.T) {
			_, ok := err.(*Error)
			assert.True(t, ok, "got %T", err)
			assert.NotEmpty(t, err.Error())
		})
	}
}

func TestErrorText(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"Retryable", Retryable(errBoom), "boom"},
		{"Retryable nil", Retryable(nil), "retryable"},
		{"RetryableAfter nil", RetryableAfter(nil, time.Second), "retryable"},
		{"UnknownOutcome nil", UnknownOutcome(nil), "unknown-outcome"},
		{"Permanent nil", Permanent(nil), "permanent"},
		{"BPMNError", BPMNError("E1", "went wrong", nil), "bpmn error E1: went wrong"},
		{"BPMNError no message", BPMNError("E1", "", nil), "bpmn error E1"},
		{"BPMNError empty code", BPMNError("", "went wrong", nil), `failure: BPMNError called with an empty error code (message "went wrong")`},
		{"nil *Error", (*Error)(nil), "<nil>"},
		{"zero Error", &Error{}, "retryable"},
		{"panic", FromPanic(42, []byte("stack")), "handler panicked: 42"},
		{"nil *PanicError", (*PanicError)(nil), "handler panicked: <nil>"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, c.err.Error())
		})
	}
}

func TestErrorUnwrap(t *testing.T) {
	assert.Same(t, errBoom, Retryable(errBoom).(*Error).Unwrap())
	assert.Nil(t, Retryable(nil).(*Error).Unwrap())
	assert.Nil(t, BPMNError("E", "m", nil).(*Error).Unwrap())
	assert.Nil(t, (*Error)(nil).Unwrap())
}

func TestErrorKind(t *testing.T) {
	cases := []struct {
		name string
		err  *Error
		want Kind
	}{
		{"BPMNError", BPMNError("E", "", nil).(*Error), KindBPMNError},
		{"BPMNError empty code", BPMNError("", "", nil).(*Error), KindPermanent},
		{"Retryable", Retryable(nil).(*Error), KindRetryable},
		{"RetryableAfter", RetryableAfter(nil, 1).(*Error), KindRetryable},
		{"UnknownOutcome", UnknownOutcome(nil).(*Error), KindUnknownOutcome},
		{"Permanent", Permanent(nil).(*Error), KindPermanent},
		{"nil", nil, KindRetryable},
		{"zero value is never KindNone", &Error{}, KindRetryable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, c.err.Kind())
		})
	}
}

// A zero or typed-nil *Error an author built by hand must not complete the task.
func TestClassifyHandMadeError(t *testing.T) {
	assert.Equal(t, KindRetryable, Classify(&Error{}).Kind)
	var nilErr *Error
	o := Classify(fmt.Errorf("x: %w", nilErr))
	assert.Equal(t, KindRetryable, o.Kind)
	assert.Equal(t, "x: <nil>", o.Message)
	var nilPanic *PanicError
	o = Classify(nilPanic)
	assert.Equal(t, KindRetryable, o.Kind)
	assert.Nil(t, o.Panic)
}

func TestBPMNErrorVariablesAreCopied(t *testing.T) {
	vars := map[string]any{"a": 1}
	err := BPMNError("E", "m", vars)
	vars["a"] = 2
	vars["b"] = 3

	o := Classify(err)
	assert.Equal(t, map[string]any{"a": 1}, o.Variables, "the constructor copies")
	o.Variables["a"] = 99
	assert.Equal(t, map[string]any{"a": 1}, Classify(err).Variables, "each Classification gets its own copy")
}

func TestFromPanic(t *testing.T) {
	stack := []byte("goroutine 7 [running]:\nexample.com/h.handle()\n\t/src/h.go:12")
	err := FromPanic("index out of range", stack)
	var pe *PanicError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "index out of range", pe.Value)
	assert.Equal(t, stack, pe.Stack)
	assert.Equal(t, "handler panicked: index out of range", err.Error())
	assert.NotContains(t, err.Error(), "goroutine", "no stack in Error()")

	assert.Same(t, pe, FromPanic(pe, []byte("other stack")), "a re-raised *PanicError does not nest")
	assert.Equal(t, "handler panicked: <nil>", FromPanic(nil, nil).Error())
}

// A real recovered panic, the way the worker produces it.
func TestFromPanicRecovered(t *testing.T) {
	handler := func() (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = FromPanic(v, []byte("stack"))
			}
		}()
		var m map[string]int
		m["x"] = 1 // panics: assignment to entry in nil map
		return nil
	}
	o := Classify(fmt.Errorf("topic charge: %w", handler()))
	assert.Equal(t, KindRetryable, o.Kind)
	require.NotNil(t, o.Panic)
	assert.Contains(t, o.Message, "handler panicked: assignment to entry in nil map")
	var re interface{ RuntimeError() }
	assert.ErrorAs(t, o.Panic.Value.(error), &re)
}

type panickyErr struct{ p *int }

func (e panickyErr) Error() string { return fmt.Sprint(*e.p) }

func TestClassifyErrorMethodPanics(t *testing.T) {
	var o Classification
	require.NotPanics(t, func() { o = Classify(Permanent(panickyErr{})) })
	assert.Equal(t, KindPermanent, o.Kind)
	assert.True(t, strings.HasPrefix(o.Message, "*failure.Error: Error method panicked: "), o.Message)
}

// Deferred is retryable with its own delay and keeps the retries; the outermost mark
// still wins, so Retryable(Deferred(x)) counts a retry down again.
func TestDeferredKeepsRetries(t *testing.T) {
	base := errors.New("intent in progress in another attempt")
	o := Classify(Deferred(base, 3*time.Second))
	if o.Kind != KindRetryable || !o.KeepRetries || o.RetryDelay != 3*time.Second || !errors.Is(o.Err, base) {
		t.Fatalf("Deferred classified as %+v", o)
	}
	if o := Classify(RetryableAfter(base, time.Second)); o.KeepRetries {
		t.Fatal("RetryableAfter must count retries down")
	}
	if o := Classify(Retryable(Deferred(base, time.Second))); o.KeepRetries {
		t.Fatal("the outermost mark decides")
	}
	if o := Classify(fmt.Errorf("wrapped: %w", Deferred(base, -time.Second))); !o.KeepRetries || o.RetryDelay != 0 {
		t.Fatalf("wrapped Deferred with a negative delay: %+v", o)
	}
}
