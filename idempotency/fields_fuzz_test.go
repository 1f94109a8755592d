package idempotency_test

import (
	"context"
	"errors"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
)

// FuzzIntentFields (issue 23): whatever bytes a handler puts in an intent's scope, key,
// business key or actor (they come from process variables and task fields), the real
// ledger either records the intent and settles it, or refuses it at once as a permanent
// failure naming the field: never a retryable error that would send the task round
// forever, never a database error passed off as an unknown outcome, never a panic.
func FuzzIntentFields(f *testing.F) {
	for _, s := range [][4]string{
		{"payment.collect", "invoice:1:v1", "INV-1", "worker-1"},
		{"payment.collect", "invoice:\x00:v1", "INV-\x00", "w"},
		{"payment.collect", "invoice:\xff\xfe:v1", "INV-\xc3\x28", "w\x80"},
		{"payment\u202e.collect", "S-\u202e2001", "S-1002", "w"},
		{"", "", "", ""},
		{"p", string(make([]byte, 3000)), "k", "w"},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	l, _ := newLedger(f, idempotency.Config{})
	f.Fuzz(func(t *testing.T, scope, key, businessKey, actor string) {
		ctx := testenv.Context(t, 30*time.Second)
		in := idempotency.Intent{Scope: scope, Key: key, Request: map[string]string{"k": key},
			Task: idempotency.TaskRef{Actor: actor, BusinessKey: businessKey, TaskID: "t"}}
		calls := 0
		out, err := l.Do(ctx, in, idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
			calls++
			return idempotency.Result{ProviderRef: "ch_1"}, nil
		}})
		if err == nil {
			// The fuzzer may bring the same fields twice: the second time is a replay.
			if out.State != idempotency.StateConfirmed || calls+btoi(out.Replayed) != 1 {
				t.Fatalf("recorded as %s after %d calls (replayed %v)", out.State, calls, out.Replayed)
			}
			if !utf8.ValidString(scope+key) || containsNUL(scope+key) {
				t.Fatalf("bytes PostgreSQL cannot store were recorded: %q %q", scope, key)
			}
			return
		}
		if calls != 0 {
			t.Fatalf("dispatched, then failed: %v", err)
		}
		if k := failure.Classify(err).Kind; k != failure.KindPermanent {
			t.Fatalf("refused as %v, want permanent (a retry cannot store these bytes either): %v", k, err)
		}
		if !errors.Is(err, idempotency.ErrInvalidIntent) {
			t.Fatalf("want ErrInvalidIntent: %v", err)
		}
	})
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
