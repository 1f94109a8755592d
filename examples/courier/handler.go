package main

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/idempotency/httpeffect"
	"github.com/extworker/extworker/outbox"
	"github.com/extworker/extworker/tasks"
)

// bookTopic is the service task's topic; bookOptions what the handler is registered
// with (its tests use the same).
const bookTopic = "shipping.book-courier"

var bookOptions = tasks.TopicOptions{Variables: tasks.VariablesOf[booking]()}

// booking is what the courier is asked to do for one shipment.
type booking struct {
	Shipment string `var:"shipmentId" json:"shipment"`
	Postcode string `var:"postcode" json:"postcode"`
}

// courier is where bookings go: the courier's API (COURIER_URL), and the queue
// bookings are announced to (COURIER_EVENTS; empty: not announced).
type courier struct {
	URL, Events string
}

func courierFromEnv(getenv func(string) string) courier {
	return courier{URL: getenv("COURIER_URL"), Events: getenv("COURIER_EVENTS")}
}

// bookCourier books a courier for the task's shipment, once per shipment whatever the
// engine redelivers: the booking runs through the ledger under the key shipment:ID. An
// address the courier refuses (422) is the process's ADDRESS_REJECTED error. With
// c.Events, a booking announces itself with a courier.booked event, added in the
// transaction that records it (the outbox): published if and only if the booking is.
func bookCourier(ledger *idempotency.Ledger, c courier) tasks.Handler {
	return func(ctx context.Context, t *tasks.Task) (camunda7.Variables, error) {
		var in booking
		if err := t.Bind(&in); err != nil {
			return nil, err // names the variable; an incident, not a retry loop
		}
		body, _ := json.Marshal(in)
		eff, err := httpeffect.New(httpeffect.Spec{
			URL:  c.URL + "/bookings",
			Body: body,
			Decode: func(_ int, _ http.Header, body []byte) (idempotency.Result, error) {
				var b struct{ ID string }
				err := json.Unmarshal(body, &b)
				return idempotency.Result{ProviderRef: b.ID, Values: map[string]any{"bookingId": b.ID}}, err
			},
			Reject: func(status int, _ []byte) (string, string, bool) {
				return "ADDRESS_REJECTED", "the courier does not deliver there", status == http.StatusUnprocessableEntity
			},
			LookupURL: func(q idempotency.Query) string { return c.URL + "/bookings?key=" + q.ProviderKey },
		})
		if err != nil {
			return nil, err
		}
		if c.Events != "" {
			eff.Local = func(ctx context.Context, tx pgx.Tx, res idempotency.Result) error {
				return outbox.Add(ctx, tx, ledger.Namespace(), outbox.Event{MessageID: "courier.booked:" + in.Shipment, Type: "courier.booked",
					RoutingKey: c.Events, OrderingKey: in.Shipment, Body: body})
			}
		}
		out, err := ledger.Do(ctx, t.Intent("courier.book", "shipment:"+in.Shipment, in), eff)
		if err != nil {
			return nil, err
		}
		return camunda7.Variables{"bookingId": camunda7.StringVar(out.ProviderRef)}, nil
	}
}
