package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/extworker/extworker"
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

// COURIER_URL is required, an absolute http(s) URL: without it the program refuses to
// start with a configuration error (exit status 78) naming the variable, instead of
// booking against "/bookings".
func TestCourierURLRequired(t *testing.T) {
	for _, v := range []string{"", "courier.example.com", "ftp://courier.example.com", "http://"} {
		err := checkCourier(courier{URL: v})
		if err == nil || !extworker.IsConfigError(err) || !strings.Contains(err.Error(), "COURIER_URL") {
			t.Errorf("COURIER_URL %q: %v, want a configuration error naming COURIER_URL", v, err)
		}
	}
	if err := checkCourier(courier{URL: "https://courier.example.com"}); err != nil {
		t.Errorf("a valid COURIER_URL: %v", err)
	}
}

// The program has no commands: --help prints the usage (its variables) and exits 0, any
// other argument exits 2 with the usage, instead of starting the worker.
func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		handled bool
		code    int
	}{
		{nil, false, 0},
		{[]string{"--help"}, true, 0},
		{[]string{"-h"}, true, 0},
		{[]string{"help"}, true, 0},
		{[]string{"run"}, true, 2},
	} {
		var out, errOut bytes.Buffer
		code, handled := commandLine(tc.args, &out, &errOut)
		if handled != tc.handled || code != tc.code {
			t.Errorf("%q: exit %d (handled %v), want %d (%v)", tc.args, code, handled, tc.code, tc.handled)
		}
		if handled && !strings.Contains(out.String()+errOut.String(), "COURIER_URL") {
			t.Errorf("%q: no usage: %q", tc.args, out.String()+errOut.String())
		}
	}
}
