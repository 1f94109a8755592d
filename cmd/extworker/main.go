// Command extworker runs Camunda 7 external-task workers.
//
//	extworker run     run the worker for the built-in demo topics until SIGINT/SIGTERM
//	extworker demo    deploy the demo process, start instances, run the worker until they finish, print a summary
//	extworker migrate apply the effect ledger's migrations
//	extworker effects list|show|resolve|resolutions|approve|reject|prune   inspect and settle side effects
//	extworker version print the engine's version (a connectivity check)
//	extworker config  print the effective configuration, secrets masked (--json)
//
// Configuration comes from the environment (EXTWORKER_*, see config.go and
// docs/configuration.md). main only reads the environment, sets up logging and signals,
// and wires the packages.
//
// Signals: the first SIGINT or SIGTERM stops the worker gracefully (running handlers get
// EXTWORKER_SHUTDOWN_GRACE, the whole shutdown EXTWORKER_SHUTDOWN_TIMEOUT). A second one
// exits at once, with status 128+signal: 130 for SIGINT, 143 for SIGTERM.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/termsafe"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "extworker:", termsafe.String(err.Error()))
		var ce daemon.ConfigError
		if errors.As(err, &ce) {
			os.Exit(daemon.ExitConfig) // retrying cannot help: a supervisor may stop restarting
		}
		os.Exit(1)
	}
}

const usage = `usage: extworker <command> [flags]

commands:
  run       run the worker for the demo topics until SIGINT or SIGTERM
  demo      deploy the demo process, start instances, work them off, print a summary
  migrate   apply the effect ledger's database migrations
  effects   list | show KEY | resolve KEY --as confirmed|rejected|retry ... | resolutions | approve ID | reject ID | prune
  version   print the engine's version
  config    print the effective configuration, secrets masked [--json]

configuration: EXTWORKER_* environment variables (see docs/configuration.md)
signals: SIGINT or SIGTERM stops gracefully; a second one exits at once (130, 143)`

func run(args []string, stdout, stderr io.Writer) (err error) {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stdout, usage)
		return nil
	}
	if args[0] == "config" {
		return daemon.ConfigCommand(args[1:], stdout, stderr)
	}
	cfg, err := daemon.LoadConfig()
	if err != nil {
		return cfg.ScrubError(err)
	}
	// No secret reaches an error message, whatever library wrote it.
	defer func() { err = cfg.ScrubError(err) }()
	logger := daemon.NewLogger(cfg, stderr)
	ctx, stop := daemon.SignalContext(logger, os.Exit)
	defer stop()

	switch args[0] {
	case "run":
		// Rejected credentials end the start here, with what to check, not in a worker
		// whose every fetch fails.
		if err := daemon.CheckEngine(ctx, cfg, logger); err != nil {
			return err
		}
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
			return deployDemo(ctx, c)
		}
		return runDemo(ctx, cfg, logger, stdout, *n)
	case "migrate":
		return daemon.Migrate(ctx, cfg, stdout)
	case "effects":
		// Keys, provider and incident messages come from outside: nothing they carry
		// reaches the operator's terminal as an escape sequence.
		return runEffects(ctx, cfg, logger, args[1:], termsafe.NewWriter(stdout), termsafe.NewWriter(stderr))
	case "version":
		c, err := daemon.NewClient(cfg, logger)
		if err != nil {
			return err
		}
		v, err := c.Version(ctx)
		if err != nil {
			return fmt.Errorf("engine at %s: %w", daemon.RedactURL(cfg.EngineURL), err)
		}
		fmt.Fprintln(stdout, v)
		return nil
	}
	return errors.New("unknown command " + fmt.Sprintf("%q", args[0]) + "\n" + usage)
}
