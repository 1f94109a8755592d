// Command courier is a worker in a module of its own, as a user writes one: its main
// registers one ledger-backed handler and one inbox consumer and hands over to
// extworker.Main, which gives it
// configuration from EXTWORKER_* variables, the credential check, the ledger, metrics,
// health and readiness, and signals. The repository builds and runs it in its tests
// (extworker's TestUserModule).
package main

import (
	"github.com/extworker/extworker"
	"github.com/extworker/extworker/tasks"
)

func main() {
	extworker.Main(func(app *extworker.App) error {
		if err := app.Consume(claims()); err != nil {
			return err
		}
		return app.Handle("shipping.book-courier", bookCourier(app.Ledger()), tasks.TopicOptions{Variables: tasks.VariablesOf[booking]()})
	})
}
