// Command extworker is the operator's tool for extworker workers: it migrates the effect
// ledger, inspects and settles side effects, inspects the inbox and replays parked
// messages, prints the effective configuration and checks the engine.
//
//	extworker migrate apply the effect ledger's migrations
//	extworker effects list|show|resolve|resolutions|approve|reject|prune   inspect and settle side effects
//	extworker operators list|add|remove   the people the two-person rule tells apart
//	extworker inbox list|show|replay   inspect consumed messages, replay parked ones
//	extworker humantask commands TASK_ID   the completion commands sent for a user task
//	extworker version print its own version and the engine's (a connectivity check)
//	extworker doctor  check this host's engine, database, brokers, clocks and configuration
//	extworker config  print the effective configuration, secrets masked (--json)
//	extworker console hash-password NAME   a line for the operator console's operators file
//	extworker console serve   the operator console in a process of its own
//
// Workers are programs of their own, built on package extworker (examples/invoice is
// one). Configuration comes from the same EXTWORKER_* variables (docs/configuration.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/termsafe"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "extworker:", termsafe.String(err.Error()))
		os.Exit(exitCode(err)) // 78 configuration, 2 usage, else 1 (usage.go)
	}
}

const usage = `usage: extworker <command> [flags]

commands:
  migrate   apply the effect ledger's database migrations
  effects   list | show KEY | resolve KEY --as confirmed|rejected|retry|close ... | resolutions | approve ID | reject ID | prune
  operators list | add NAME [--login LOGIN] | remove NAME: the people the two-person rule
            tells apart, one name each across the console and this tool (docs/operators.md)
  inbox     list [--parked] | show SOURCE MESSAGE_ID | replay --queue Q (--all | MESSAGE_ID...)
  humantask commands TASK_ID: the completion commands sent for a user task (docs/humantasks.md)
  version   print this program's version (module, VCS revision) and the engine's
  doctor    check what a worker on this host needs, with a fix for each failure
            [--queue Q]... (docs/doctor.md)
  config    print the effective configuration, secrets masked [--json]
  console   hash-password NAME: read a password on standard input, print NAME:bcrypt-hash
            for EXTWORKER_CONSOLE_OPERATORS_FILE | serve: the operator console in a
            process of its own (docs/console.md)

configuration: EXTWORKER_* environment variables (see docs/configuration.md)
workers: programs built on package extworker (see README.md and examples/invoice)`

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "console" {
		// hash-password needs no configuration; serve reads it (daemon.Command).
		return runConsole(args[1:], stdin, stdout, stderr)
	}
	if len(args) > 0 && args[0] == "doctor" {
		return runDoctor(args[1:], stdout, stderr) // it reports an unreadable configuration itself
	}
	return daemon.Command(args, usage, stdout, stderr, func(ctx context.Context, cfg daemon.Config, logger *slog.Logger) error {
		switch args[0] {
		case "migrate":
			return daemon.Migrate(ctx, cfg, stdout)
		case "effects":
			// Keys, provider and incident messages come from outside: nothing they carry
			// reaches the operator's terminal as an escape sequence.
			return runEffects(ctx, cfg, logger, args[1:], termsafe.NewWriter(stdout), termsafe.NewWriter(stderr))
		case "operators":
			return runOperators(ctx, cfg, logger, args[1:], termsafe.NewWriter(stdout), termsafe.NewWriter(stderr))
		case "humantask":
			// Task and command ids, users and answers come from outside, likewise.
			return runHumantask(ctx, cfg, logger, args[1:], termsafe.NewWriter(stdout), termsafe.NewWriter(stderr))
		case "inbox":
			// Message ids, types, business keys and reasons come from outside, likewise.
			return runInbox(ctx, cfg, logger, args[1:], termsafe.NewWriter(stdout), termsafe.NewWriter(stderr))
		case "version":
			// The program's own first: it prints even when the engine does not answer.
			bi, _ := debug.ReadBuildInfo()
			fmt.Fprintln(stdout, programVersion(bi))
			c, err := daemon.NewClient(cfg, logger)
			if err != nil {
				return err
			}
			v, err := c.Version(ctx)
			if err != nil {
				return daemon.EngineError(cfg, err) // rejected credentials: 78
			}
			fmt.Fprintln(stdout, "engine "+v)
			return nil
		case "run", "demo":
			return fmt.Errorf("%q is not an extworker command any more: workers are programs of their own, built on package extworker; the demo is examples/invoice (make demo)\n%s", args[0], usage)
		}
		return errors.New("unknown command " + fmt.Sprintf("%q", args[0]) + "\n" + usage)
	})
}

// programVersion is `extworker version`'s first line: the module's version and the VCS
// revision (in full) it was built from, with its commit time, and "modified" when the
// tree had uncommitted changes, e.g. "extworker v1.4.0 (revision 3f2c…, 2025-03-04T10:12:30Z)"
// or "extworker (devel) (revision 3f2c…, 2025-03-04T10:12:30Z, modified)".
func programVersion(bi *debug.BuildInfo) string {
	if bi == nil {
		return "extworker (no build information)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, at string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return "extworker " + v + " (no VCS revision)"
	}
	details := "revision " + rev
	if at != "" {
		details += ", " + at
	}
	if modified {
		details += ", modified"
	}
	return "extworker " + v + " (" + details + ")"
}
