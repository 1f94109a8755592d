package fakeprovider_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/extworker/extworker/examples/invoice/fakeprovider"
)

// Start a provider, script a lost answer for one invoice, and see the idempotency key
// make the retry safe: the first attempt's outcome is unknown, the same-key retry
// replays the one charge it made.
func Example() {
	pay, err := fakeprovider.Start(10_000) // decline charges above 100.00
	if err != nil {
		panic(err)
	}
	defer pay.Close()
	pay.Script("INV-1", fakeprovider.LoseAnswer)

	// A fresh connection per request, so that net/http does not resend on its own.
	c := &fakeprovider.Client{BaseURL: pay.URL(), HTTP: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
	ctx := context.Background()
	_, err = c.Charge(ctx, "invoice:INV-1:v1", "INV-1", 500)
	fmt.Println("first attempt ambiguous:", errors.Is(err, fakeprovider.ErrUnknownOutcome))

	ch, err := c.Charge(ctx, "invoice:INV-1:v1", "INV-1", 500)
	fmt.Println("retry:", ch.ID, ch.Invoice, ch.AmountCents, err)

	_, err = c.Charge(ctx, "invoice:INV-2:v1", "INV-2", 50_000)
	var decline *fakeprovider.DeclineError
	fmt.Println("declined:", errors.As(err, &decline) && decline.Code == "card_declined")

	fmt.Println("charges:", len(pay.Charges()), "double charges:", pay.DoubleCharges())
	for _, r := range pay.Log() {
		fmt.Println(r.Seq, r.Fault, r.Outcome, r.EffectID, r.Fate)
	}
	// Output:
	// first attempt ambiguous: true
	// retry: ch_000001 INV-1 500 <nil>
	// declined: true
	// charges: 1 double charges: 0
	// 1 lose_answer created ch_000001 dropped
	// 2  replayed ch_000001 answered
	// 3  declined  answered
}
