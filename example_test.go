package extworker_test

import (
	"context"
	"os"
	"testing/fstest"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/tasks"
)

// invoice is what the collect-payment handler reads from its task.
type invoice struct {
	ID     string `var:"invoiceId"`
	Amount int64  `var:"amountCents"`
}

// A worker program's whole main: one topic, its side effect through the ledger. Main
// reads EXTWORKER_* variables, checks the engine, serves /metrics, /healthz and /readyz,
// and stops on SIGTERM.
func ExampleMain() {
	extworker.Main(func(app *extworker.App) error {
		return app.Handle("collect-payment", collect(app.Ledger()), tasks.TopicOptions{Variables: tasks.VariablesOf[invoice]()})
	})
}

func collect(ledger *idempotency.Ledger) tasks.Handler {
	return func(ctx context.Context, t *tasks.Task) (camunda7.Variables, error) {
		var in invoice
		if err := t.Bind(&in); err != nil {
			return nil, err
		}
		out, err := ledger.Do(ctx, t.Intent("payment.collect", "invoice:"+in.ID, in), idempotency.Effect{
			Dispatch: func(ctx context.Context, key string) (idempotency.Result, error) {
				return idempotency.Result{ProviderRef: "ch_" + in.ID}, nil // the provider call, with key as its Idempotency-Key
			},
		})
		if err != nil {
			return nil, err
		}
		return camunda7.Variables{"paymentRef": camunda7.StringVar(out.ProviderRef)}, nil
	}
}

// New and Run for a program that keeps control of its context.
func ExampleApp_Run() {
	ctx := context.Background()
	app, err := extworker.New(ctx, extworker.Options{})
	if err != nil {
		panic(err) // extworker.IsConfigError(err): exit extworker.ExitConfig
	}
	defer app.Close()
	if err := app.Handle("collect-payment", collect(app.Ledger()), tasks.TopicOptions{Variables: tasks.VariablesOf[invoice]()}); err != nil {
		panic(err)
	}
	if err := app.Run(ctx); err != nil {
		panic(err)
	}
}

// A program with commands of its own and tables of its own: `myworker migrate` applies the
// ledger's migrations and then the program's, `myworker run` serves its topics, and the
// handlers reach the program's tables through the ledger's pool.
func ExampleServe() {
	programSQL := fstest.MapFS{ // in a real program: fs.Sub of an embedded migrations directory
		"00001_parcels.sql": {Data: []byte("-- +goose Up\nCREATE TABLE parcels (id text PRIMARY KEY);\n")},
	}
	opts := extworker.Options{Migrations: programSQL}
	var err error
	switch os.Args[1] {
	case "migrate":
		err = extworker.Migrate(context.Background(), opts, os.Stdout)
	case "run":
		err = extworker.Serve(opts, func(ctx context.Context, app *extworker.App) error {
			pool := app.Pool() // the program's tables, beside the ledger's
			_ = pool
			if err := app.Handle("collect-payment", collect(app.Ledger()), tasks.TopicOptions{Variables: tasks.VariablesOf[invoice]()}); err != nil {
				return err
			}
			return app.Run(ctx)
		})
	}
	if extworker.IsConfigError(err) {
		os.Exit(extworker.ExitConfig)
	}
}
