package inbox_test

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
)

// A consumer of the billing system's invoice.paid events: each starts the shipping
// process once per invoice, and a payment.captured event is delivered to the invoice's
// process waiting for it. A worker program hands the same Config and Decide to
// extworker's App.Consume instead, which runs the consumer beside its handlers.
func ExampleNewConsumer() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://extworker@127.0.0.1:5432/extworker")
	engine, _ := camunda7.New(camunda7.Config{BaseURL: "http://127.0.0.1:8080/engine-rest"})
	decide := func(m inbox.Message) (inbox.Action, error) {
		var e struct{ Invoice string }
		if err := json.Unmarshal(m.Body, &e); err != nil || e.Invoice == "" {
			return inbox.Action{}, errors.New("not an invoice event") // parked, with this reason
		}
		switch m.Type {
		case "invoice.paid":
			return inbox.Action{Start: &inbox.Start{ProcessKey: "shipping", BusinessKey: e.Invoice}}, nil
		case "payment.captured":
			return inbox.Action{Correlate: &inbox.Correlate{ProcessDefinitionKey: "invoice", MessageName: "PaymentCaptured", BusinessKey: e.Invoice}}, nil
		}
		return inbox.Action{Ignore: "not for shipping: " + m.Type}, nil
	}
	c, err := inbox.NewConsumer(pool, admin.New(engine), "amqps://shipping:secret@broker.example.com/billing", decide, inbox.Config{
		Source:   "billing",
		Queue:    "shipping.billing-events",
		Bindings: []inbox.Binding{{Exchange: "billing", RoutingKey: "invoice.*"}, {Exchange: "billing", RoutingKey: "payment.*"}},
	})
	if err != nil {
		panic(err)
	}
	_ = c.Run(ctx) // until ctx ends
}
