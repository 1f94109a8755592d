// Command invoice is extworker's demo, and the worker its fault tests and soak run: an
// invoice process whose payment is collected through the effect ledger from a payment
// provider (a fake one, in this process, unless EXTWORKER_PROVIDER_URL names one).
//
//	invoice demo [-instances N] [-deploy-only]   deploy the process, start N invoices, work them off, print a summary
//	invoice run                                  serve the demo topics until SIGINT/SIGTERM
//	invoice migrate                              apply the ledger's migrations (as extworker migrate)
//	invoice config [-json]                       print the effective configuration (as extworker config)
//
// `make demo` runs `invoice demo`. Its worker is built on package extworker, as any
// worker program is; see demo.go for the handlers.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/daemon"
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
  demo      deploy the demo process, start instances, work them off, print a summary [-instances N] [-deploy-only]
  run       serve the demo topics until SIGINT or SIGTERM
  migrate   apply the effect ledger's database migrations
  config    print the effective configuration, secrets masked [--json]

configuration: EXTWORKER_* environment variables (see docs/configuration.md)
signals: SIGINT or SIGTERM stops gracefully; a second one exits at once (130, 143)`

func run(args []string, stdout, stderr io.Writer) error {
	return daemon.Command(args, usage, stdout, stderr, func(ctx context.Context, cfg daemon.Config, logger *slog.Logger) error {
		switch args[0] {
		case "run":
			return runWorker(ctx, cfg, logger)
		case "demo":
			fs := flag.NewFlagSet("demo", flag.ContinueOnError)
			fs.SetOutput(stderr)
			n := fs.Int("instances", 200, "process instances to start")
			deployOnly := fs.Bool("deploy-only", false, "deploy the demo process and exit (for the soak and other drivers)")
			if err := fs.Parse(args[1:]); err != nil {
				return err
			}
			if *deployOnly {
				c, err := daemon.NewClient(cfg, logger)
				if err != nil {
					return err
				}
				return deployDemo(ctx, admin.New(c))
			}
			return runDemo(ctx, cfg, logger, stdout, *n)
		case "migrate":
			return daemon.Migrate(ctx, cfg, stdout)
		}
		return fmt.Errorf("unknown command %q\n%s", args[0], usage)
	})
}
