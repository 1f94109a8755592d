package extworker_test

import (
	"context"
	"errors"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/humantask"
)

// A process that serves Camunda user tasks only: with EXTWORKER_TASKS_ADDR (and an
// identity source: EXTWORKER_TASKS_AUTH_HEADER with EXTWORKER_TASKS_TRUSTED_PROXIES, or
// EXTWORKER_TASKS_JWT_*) Run serves the completion service on a listener of its own;
// HumanTasks gives it the business rule of the "approve" task.
func ExampleApp_HumanTasks() {
	extworker.Main(func(app *extworker.App) error {
		return app.HumanTasks(map[string]humantask.Guard{"approve": func(_ context.Context, t humantask.Task, f humantask.Form) error {
			if amount, _ := t.Variables.Long("amount"); f["approved"] == true && amount > 1000 {
				return errors.New("amounts above 1000 need a second approver")
			}
			return nil
		}})
	})
}
