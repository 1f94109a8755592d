package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/idempotency"
)

// The provider key is derived from the intent, never from a task or an attempt: every
// delivery of the same business command sends the same Idempotency-Key.
func ExampleProviderKey() {
	a := idempotency.ProviderKey("default", "payment.collect", "invoice:INV-1:v1")
	b := idempotency.ProviderKey("default", "payment.collect", "invoice:INV-1:v1")
	c := idempotency.ProviderKey("default", "payment.collect", "invoice:INV-2:v1")
	fmt.Println(a == b, a == c, len(a))
	// Output: true false 35
}

// Equal requests have equal digests whatever the order of their fields.
func ExampleDigest() {
	a, _ := idempotency.Digest(map[string]any{"invoice": "INV-1", "amountCents": 1999})
	b, _ := idempotency.Digest(struct {
		Amount  int    `json:"amountCents"`
		Invoice string `json:"invoice"`
	}{1999, "INV-1"})
	fmt.Println(a == b)
	// Output: true
}

// A charge through the ledger: the handler returns Do's error as it is (it is already a
// failure outcome: a decline becomes a BPMN error, an unknown outcome waits for
// reconciliation, a held intent becomes an incident).
func ExampleLedger_Do() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://extworker@127.0.0.1:5432/extworker")
	if err != nil {
		panic(err)
	}
	ledger, err := idempotency.New(pool, idempotency.Config{})
	if err != nil {
		panic(err)
	}
	charge := func(ctx context.Context, key string) (idempotency.Result, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://pay.example/charges", nil)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return idempotency.Result{}, err // ambiguous: the intent becomes unknown
		}
		defer resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusPaymentRequired:
			return idempotency.Result{}, idempotency.Rejected("CARD_DECLINED", "card declined")
		case resp.StatusCode == http.StatusTooManyRequests:
			return idempotency.Result{}, idempotency.NotSent(errors.New("429"))
		case resp.StatusCode >= 300:
			return idempotency.Result{}, fmt.Errorf("provider answered %s", resp.Status)
		}
		ref := resp.Header.Get("Charge-Id")
		return idempotency.Result{ProviderRef: ref, Values: map[string]any{"paymentRef": ref}}, nil
	}
	out, err := ledger.Do(ctx, idempotency.Intent{
		Scope:   "payment.collect",
		Key:     "invoice:INV-1:v1",
		Request: map[string]any{"invoice": "INV-1", "amountCents": 1999},
		Amount:  1999,
	}, idempotency.Effect{Dispatch: charge})
	if err != nil {
		return // return err from the handler
	}
	fmt.Println(out.Values["paymentRef"])
}

// A handler's test needs no PostgreSQL: an in-memory ledger behaves as the PostgreSQL
// one for what a handler sees through Do (package ledgertest holds both to one suite).
// Here the second delivery of the same intent is replayed from the ledger, and a
// different request under the same key is refused; the provider is called once.
func ExampleNewInMemory() {
	ctx := context.Background()
	ledger := idempotency.NewInMemory(idempotency.Config{})
	calls := 0
	charge := idempotency.Effect{Dispatch: func(ctx context.Context, key string) (idempotency.Result, error) {
		calls++
		return idempotency.Result{ProviderRef: "ch_1", Values: map[string]any{"paymentRef": "ch_1"}}, nil
	}}
	in := idempotency.Intent{Scope: "payment.collect", Key: "invoice:INV-1:v1", Request: map[string]any{"invoice": "INV-1", "amountCents": 1999}}

	first, _ := ledger.Do(ctx, in, charge)
	again, _ := ledger.Do(ctx, in, charge)
	fmt.Println(first.State, first.Replayed, again.Replayed, again.Values["paymentRef"])

	in.Request = map[string]any{"invoice": "INV-1", "amountCents": 2999}
	_, err := ledger.Do(ctx, in, charge)
	fmt.Println(errors.Is(err, idempotency.ErrDigestMismatch), calls)
	// Output:
	// confirmed false true ch_1
	// true 1
}
