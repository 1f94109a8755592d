// Command courier is a worker in a module of its own, as a user writes one: the model
// user module (docs/handlers.md). Its main hands over to extworker.Main, which gives it
// configuration from EXTWORKER_* variables, the credential check, the ledger, metrics,
// health and readiness, and signals; setup registers one ledger-backed handler and, with
// COURIER_CLAIMS, one inbox consumer. Its own tests: handler_test.go without services
// (tasks/taskstest, the in-memory ledger), engine_test.go against the engine and
// PostgreSQL (package extworkertest). The repository also runs the built program
// (extworker's TestUserModule).
package main

import (
	"os"

	"github.com/extworker/extworker"
)

func main() {
	extworker.Main(setup)
}

// setup registers what the program serves; its engine-backed test runs the same.
// Without a broker it books couriers all the same, and says what it leaves out.
func setup(app *extworker.App) error {
	c, consume, note := plan(os.Getenv)
	if note != "" {
		app.Logger().Info(note)
	}
	if consume {
		if err := app.Consume(claims()); err != nil {
			return err
		}
	}
	return app.Handle(bookTopic, bookCourier(app.Ledger(), c), bookOptions)
}

// plan is what the program runs with the variables getenv reads: the courier
// (COURIER_URL, and COURIER_EVENTS, the queue or topic bookings are announced to through
// the outbox), whether to consume the claims queue COURIER_CLAIMS, and a line for the log
// when a broker is missing ("" otherwise). Without a broker (EXTWORKER_AMQP_URL for
// RabbitMQ, EXTWORKER_KAFKA_BROKERS for Kafka) bookings are not announced and no claims
// are consumed; the claims queue needs RabbitMQ.
func plan(getenv func(string) string) (c courier, consume bool, note string) {
	c = courierFromEnv(getenv)
	amqp := getenv("EXTWORKER_AMQP_URL") != "" || getenv("EXTWORKER_AMQP_URL_FILE") != ""
	kafka := getenv("EXTWORKER_KAFKA_BROKERS") != ""
	consume = getenv("COURIER_CLAIMS") != ""
	switch {
	case !amqp && !kafka:
		note = "no broker configured (EXTWORKER_AMQP_URL, EXTWORKER_KAFKA_BROKERS): booking couriers without announcing them (COURIER_EVENTS) and without the claims queue (COURIER_CLAIMS)"
		c.Events, consume = "", false
	case consume && !amqp:
		note = "the claims queue (COURIER_CLAIMS) needs RabbitMQ (EXTWORKER_AMQP_URL): booking couriers without it"
		consume = false
	}
	return c, consume, note
}
