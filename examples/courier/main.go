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
func setup(app *extworker.App) error {
	if os.Getenv("COURIER_CLAIMS") != "" {
		if err := app.Consume(claims()); err != nil {
			return err
		}
	}
	return app.Handle(bookTopic, bookCourier(app.Ledger(), courierFromEnv()), bookOptions)
}
