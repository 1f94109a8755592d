package failure

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"
)

// fuzzErr builds an error from fuzz bytes and returns what Classify must say about it:
// the kind, and whether a panic is in the chain. The first byte picks the innermost
// error; each following byte wraps it once (a constructor, fmt.Errorf, errors.Join with
// a plain error), so the model is simple: the last constructor applied wins.
func fuzzErr(data []byte) (err error, kind Kind, panicked bool) {
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	str := func() string {
		n := int(next() % 8)
		n = min(n, len(data))
		s := string(data[:n])
		data = data[n:]
		return s
	}

	switch next() % 6 {
	case 0:
		err, kind = nil, KindNone
	case 1:
		err, kind = errors.New(str()), KindRetryable
	case 2:
		err, kind = context.Canceled, KindRetryable
	case 3:
		err, kind, panicked = FromPanic(str(), []byte("stack")), KindRetryable, true
	case 4:
		code := str()
		err = BPMNError(code, str(), map[string]any{"v": code})
		kind = KindBPMNError
		if code == "" {
			kind = KindPermanent
		}
	case 5:
		err, kind = context.DeadlineExceeded, KindRetryable
	}

	for depth := 0; len(data) > 0 && depth < 64; depth++ {
		switch next() % 7 {
		case 0:
			err, kind = Retryable(err), KindRetryable
		case 1:
			err, kind = RetryableAfter(err, time.Duration(next())*time.Millisecond), KindRetryable
		case 2:
			err, kind = UnknownOutcome(err), KindUnknownOutcome
		case 3:
			err, kind = Permanent(err), KindPermanent
		case 4:
			err = fmt.Errorf("%s: %w", str(), err)
			if kind == KindNone {
				kind = KindRetryable // fmt.Errorf("%w", nil) is a non-nil plain error
			}
		case 5:
			err = errors.Join(errors.New(str()), err)
			if kind == KindNone {
				kind = KindRetryable
			}
		case 6:
			// A panic whose value is an error does not unwrap to it: it hides any mark.
			err, kind, panicked = FromPanic(err, []byte("stack")), KindRetryable, true
		}
	}
	return err, kind, panicked
}

// FuzzClassify checks that Classify never panics, is deterministic, and agrees with
// the model: the outermost mark wins, unmarked errors are retryable, panics are kept.
func FuzzClassify(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0})
	f.Add([]byte{1, 3, 'b', 'o', 'o', 'm', 0, 3})
	f.Add([]byte{4, 2, 'E', '1', 1, 'm', 4, 0})
	f.Add([]byte{4, 0, 0})
	f.Add([]byte{3, 1, 'x', 4, 1, 'a', 2})
	f.Add([]byte{0, 4, 0, 1, 200, 5, 1, 'x'})
	f.Add([]byte{1, 0, 6, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		err, kind, panicked := fuzzErr(data)
		o := Classify(err)
		if o.Kind != kind {
			t.Fatalf("Classify(%q).Kind = %s, want %s", err, o.Kind, kind)
		}
		if o.Err != err {
			t.Fatalf("Classification.Err = %v, want the error as given %v", o.Err, err)
		}
		if (o.Panic != nil) != panicked {
			t.Fatalf("Classification.Panic = %v, want a panic: %v", o.Panic, panicked)
		}
		if o.Kind != KindBPMNError && (o.Code != "" || o.Variables != nil) {
			t.Fatalf("non-BPMN outcome with BPMN fields: %+v", o)
		}
		if o.Kind != KindRetryable && o.RetryDelay != 0 {
			t.Fatalf("non-retryable outcome with a delay: %+v", o)
		}
		if o.Kind == KindNone && !reflect.DeepEqual(o, Classification{}) {
			t.Fatalf("KindNone with fields set: %+v", o)
		}
		if o.Kind != KindNone && o.Kind != KindBPMNError && o.Message != err.Error() {
			t.Fatalf("Message %q, want the error's text %q", o.Message, err.Error())
		}
		if again := Classify(err); !reflect.DeepEqual(o, again) {
			t.Fatalf("Classify is not deterministic: %+v then %+v", o, again)
		}
		if again, _, _ := fuzzErr(data); !reflect.DeepEqual(o, Classify(again)) {
			t.Fatalf("Classify differs for an equal error: %+v then %+v", o, Classify(again))
		}
	})
}
