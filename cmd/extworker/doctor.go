package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/doctor"
	"github.com/extworker/extworker/internal/termsafe"
)

const doctorUsage = `usage: extworker doctor [--queue Q]... [--timeout 5s]

Checks what a worker on this host needs, as configured by the EXTWORKER_* variables:
the engine (reachable, version, credentials), the clocks, the ledger database (reachable,
migrated, roles, the login, the worker role's grants, who may connect), the brokers, the
operator console (with EXTWORKER_CONSOLE_ADDR), the relations between the configured
durations, and the listening addresses. No check writes anything. Each check
prints OK, WARN, FAIL or SKIP, with the fix under each that is not ok (docs/doctor.md).

exit status: 0 every check ok (warnings allowed), 1 a check failed, 2 a usage error (a bad
flag, an argument), 78 the configuration cannot be read

flags:`

// runDoctor is `extworker doctor`. It reads the configuration itself, unlike the other
// commands, so that an unreadable one is reported as the doctor's first check.
func runDoctor(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, doctorUsage)
		fs.PrintDefaults()
	}
	var opts doctor.Options
	fs.Func("queue", "a RabbitMQ queue this host's inbox consumes (repeated or comma-separated); its .retry and .dlq are checked too", func(v string) error {
		for _, q := range strings.Split(v, ",") {
			if q = strings.TrimSpace(q); q != "" {
				if err := doctor.ValidQueue(q); err != nil {
					return err
				}
				opts.Queues = append(opts.Queues, q)
			}
		}
		return nil
	})
	fs.DurationVar(&opts.Timeout, "timeout", 5*time.Second, "bound on each probe (engine, database, broker); positive")
	// A usage error exits 2 (usage.go), never 1: the doctor's "a check failed".
	usageErr := func(err error) error {
		return usageError{fmt.Errorf("doctor: %w (usage: extworker doctor [--queue Q]... [--timeout 5s])", err)}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return usageErr(err)
	}
	if fs.NArg() > 0 {
		return usageErr(fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	if opts.Timeout <= 0 {
		return usageErr(fmt.Errorf("--timeout %v: must be positive", opts.Timeout))
	}
	out := termsafe.NewWriter(stdout)
	symbols := terminal(stdout)
	cfg, err := daemon.LoadConfig()
	if err != nil {
		_ = doctor.Write(out, []doctor.Check{doctor.Configuration(err)}, symbols)
		return cfg.ScrubError(err) // a daemon.ConfigError: exit 78
	}
	ops, _, _ := daemon.ReadOpsConfig() // its problems are in err
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	checks := append([]doctor.Check{doctor.Configuration(nil)}, doctor.Run(ctx, cfg, ops, opts)...)
	if err := doctor.Write(out, checks, symbols); err != nil {
		return err
	}
	if doctor.ExitCode(checks) != doctor.ExitOK {
		return fmt.Errorf("doctor: %d of %d checks failed", doctor.Counts(checks)[doctor.Fail], len(checks))
	}
	return nil
}

// terminal reports whether w is a terminal: then the statuses print as ✓ ! ✗ -.
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
