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
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"

	"github.com/extworker/extworker"
)

const usage = `usage: courier
  books couriers for the engine's book-courier tasks until SIGINT or SIGTERM; it takes no
  arguments. Configuration: EXTWORKER_* variables (docs/configuration.md) and
    COURIER_URL     the courier's API, an absolute http(s) URL (required)
    COURIER_EVENTS  the queue or topic bookings are announced to (with a broker)
    COURIER_CLAIMS  the RabbitMQ queue of claims to consume (with EXTWORKER_AMQP_URL)`

// commandLine handles the arguments, of which the program takes none: --help prints the
// usage (exit 0), anything else the usage as an error (exit 2). Without arguments it
// leaves the start to extworker.Main (handled false).
func commandLine(args []string, stdout, stderr io.Writer) (code int, handled bool) {
	switch {
	case len(args) == 0:
		return 0, false
	case len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help"):
		fmt.Fprintln(stdout, usage)
		return 0, true
	}
	fmt.Fprintf(stderr, "courier: unexpected argument %q\n%s\n", args[0], usage)
	return 2, true
}

// checkCourier refuses a courier the program cannot book with: COURIER_URL is required
// and must be an absolute http(s) URL. A configuration error: Main exits 78.
func checkCourier(c courier) error {
	u, err := url.Parse(c.URL)
	switch {
	case c.URL == "":
		err = errors.New("COURIER_URL is required: the courier's API, such as https://courier.example.com")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		err = errors.New("COURIER_URL: want an absolute http or https URL, such as https://courier.example.com")
	}
	if err != nil {
		return extworker.ConfigError{Err: err}
	}
	return nil
}

// setup registers what the program serves; its engine-backed test runs the same.
// Without a broker it books couriers all the same, and says what it leaves out.
func setup(app *extworker.App) error {
	c, consume, note := plan(os.Getenv)
	if err := checkCourier(c); err != nil {
		return err
	}
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

func main() {
	if code, handled := commandLine(os.Args[1:], os.Stdout, os.Stderr); handled {
		os.Exit(code)
	}
	extworker.Main(setup)
}
