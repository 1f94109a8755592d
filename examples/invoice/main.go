// Command invoice is extworker's demo, and the worker its fault tests and soak run: an
// invoice process whose payment is collected through the effect ledger from a payment
// provider (a fake one, package fakeprovider, in this process unless
// EXTWORKER_PROVIDER_URL names one).
//
//	invoice demo [-instances N] [-logs FILE] [-deploy-only]
//	                                             deploy the process, start N invoices, work them off
//	                                             showing progress, print a summary; the worker's
//	                                             logs go to FILE (default: a new file in the
//	                                             temporary directory), whose path it prints first
//	invoice run                                  serve the demo topics until SIGINT/SIGTERM
//	invoice migrate                              apply the ledger's migrations (as extworker migrate)
//	invoice config [-json]                       print the effective configuration (as extworker config)
//
// `make demo` runs `invoice demo`. It is built on the public packages only, as any
// worker program is: extworker for the process (extworker.Serve, Migrate and
// PrintConfig for its commands), tasks for the handlers, idempotency for the payment.
// The provider's settings (EXTWORKER_PROVIDER_URL, _TIMEOUT, _SEARCH, _SEARCH_LAG) and the
// broker of its invoice.paid events (EXTWORKER_DEMO_EVENTS: amqp or kafka) are the demo's
// own (provider.go, events.go); see demo.go for the handlers.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/camunda7/admin"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "invoice:", err)
		if extworker.IsConfigError(err) {
			os.Exit(extworker.ExitConfig)
		}
		os.Exit(1)
	}
}

const usage = `usage: invoice <command> [flags]

commands:
  demo      deploy the demo process, start instances, work them off, print a summary [-instances N] [-logs FILE] [-deploy-only]
  run       serve the demo topics until SIGINT or SIGTERM
  migrate   apply the effect ledger's database migrations
  config    print the effective configuration, secrets masked [--json]

configuration: EXTWORKER_* environment variables (see docs/configuration.md); the
demo's provider: EXTWORKER_PROVIDER_URL, _TIMEOUT, _SEARCH, _SEARCH_LAG; its events'
broker: EXTWORKER_DEMO_EVENTS=amqp (the default) or kafka
signals: SIGINT or SIGTERM stops gracefully; a second one exits at once (130, 143)`

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stdout, usage)
		return nil
	}
	opts := extworker.Options{LogOutput: stderr}
	switch args[0] {
	case "config":
		pc, perr := loadProviderConfig()
		ec, eerr := loadEventsConfig()
		return errors.Join(extworker.PrintConfig(args[1:], stdout, stderr, &pc, &ec), perr, eerr)
	case "migrate":
		return extworker.Migrate(context.Background(), opts, stdout)
	case "run":
		pc, ec, err := loadDemoConfig()
		if err != nil {
			return err
		}
		return extworker.Serve(opts, func(ctx context.Context, app *extworker.App) error {
			return runWorker(ctx, app, pc, ec)
		})
	case "demo":
		fs := flag.NewFlagSet("demo", flag.ContinueOnError)
		fs.SetOutput(stderr)
		n := fs.Int("instances", 200, "process instances to start")
		deployOnly := fs.Bool("deploy-only", false, "deploy the demo process and exit (for the soak and other drivers)")
		logPath := fs.String("logs", "", "the worker's log file (default: a new extworker-demo-*.log in the temporary directory)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *n < 1 {
			return fmt.Errorf("demo: -instances must be at least 1")
		}
		pc, ec, err := loadDemoConfig()
		if err != nil {
			return err
		}
		logName := ""
		if !*deployOnly {
			// The worker's log records go to a file, the terminal is the demo's: its
			// progress, then its summary.
			logs, err := demoLogFile(*logPath)
			if err != nil {
				return err
			}
			defer logs.Close()
			fmt.Fprintf(stdout, "invoice demo: the worker's logs go to %s\n", logs.Name())
			opts.LogOutput, logName = logs, logs.Name()
			// The demo migrates the ledger itself: `make demo` needs nothing else.
			if err := extworker.Migrate(context.Background(), opts, io.Discard); err != nil {
				return err
			}
		}
		err = extworker.Serve(opts, func(ctx context.Context, app *extworker.App) error {
			if *deployOnly {
				return deployDemo(ctx, admin.New(app.Client()))
			}
			return runDemo(ctx, app, pc, ec, stdout, *n)
		})
		if err != nil && logName != "" {
			return fmt.Errorf("%w (the worker's logs: %s)", err, logName)
		}
		return err
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

// demoLogFile creates the demo's log file: path, or a new one in the temporary directory.
func demoLogFile(path string) (*os.File, error) {
	if path == "" {
		return os.CreateTemp("", "extworker-demo-*.log")
	}
	return os.Create(path)
}

// loadDemoConfig reads the demo's own settings: its provider's and its events' broker.
func loadDemoConfig() (providerConfig, eventsConfig, error) {
	pc, perr := loadProviderConfig()
	ec, eerr := loadEventsConfig()
	return pc, ec, errors.Join(perr, eerr)
}
