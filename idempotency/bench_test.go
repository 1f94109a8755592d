package idempotency_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/extworker/extworker/idempotency"
)

// BenchmarkDoNewIntent is the ledger's cost for one side effect: record, mark dispatched,
// confirm (three transactions), with a provider that answers at once.
func BenchmarkDoNewIntent(b *testing.B) {
	l, _ := newLedger(b, idempotency.Config{})
	p := newProvider()
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := l.Do(ctx, intent(fmt.Sprintf("B-%d", i), 100), p.effect()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDoReplay is a redelivered, already confirmed intent: one transaction.
func BenchmarkDoReplay(b *testing.B) {
	l, _ := newLedger(b, idempotency.Config{})
	p := newProvider()
	ctx := context.Background()
	if _, err := l.Do(ctx, intent("B-replay", 100), p.effect()); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := l.Do(ctx, intent("B-replay", 100), p.effect()); err != nil {
			b.Fatal(err)
		}
	}
}
