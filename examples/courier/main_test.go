package main

import (
	"testing"
)

// Without a broker the program books couriers all the same: no announcements, no claims
// queue, and one line that says so. With RabbitMQ it runs everything; with Kafka only,
// it announces bookings (the outbox relays to Kafka) but cannot consume the claims queue.
func TestPlanWithoutBroker(t *testing.T) {
	for _, tc := range []struct {
		name        string
		env         map[string]string
		wantEvents  string
		wantConsume bool
		wantNote    bool
	}{
		{"no broker", map[string]string{"COURIER_URL": "http://courier", "COURIER_EVENTS": "courier-booked", "COURIER_CLAIMS": "claims"}, "", false, true},
		{"no broker, nothing asked", map[string]string{"COURIER_URL": "http://courier"}, "", false, true},
		{"rabbitmq", map[string]string{"EXTWORKER_AMQP_URL": "amqp://127.0.0.1/", "COURIER_EVENTS": "courier-booked", "COURIER_CLAIMS": "claims"}, "courier-booked", true, false},
		{"rabbitmq from a file", map[string]string{"EXTWORKER_AMQP_URL_FILE": "/run/secrets/amqp", "COURIER_CLAIMS": "claims"}, "", true, false},
		{"kafka only", map[string]string{"EXTWORKER_KAFKA_BROKERS": "127.0.0.1:9092", "COURIER_EVENTS": "courier-booked", "COURIER_CLAIMS": "claims"}, "courier-booked", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, consume, note := plan(func(k string) string { return tc.env[k] })
			if c.URL != tc.env["COURIER_URL"] {
				t.Errorf("courier URL %q, want %q", c.URL, tc.env["COURIER_URL"])
			}
			if c.Events != tc.wantEvents {
				t.Errorf("events %q, want %q", c.Events, tc.wantEvents)
			}
			if consume != tc.wantConsume {
				t.Errorf("consume %v, want %v", consume, tc.wantConsume)
			}
			if (note != "") != tc.wantNote {
				t.Errorf("note %q, want one: %v", note, tc.wantNote)
			}
		})
	}
}
