package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// SignalContext returns a context that the first SIGINT or SIGTERM cancels, for a
// graceful stop, as signal.NotifyContext does. A second SIGINT or SIGTERM, while that stop
// is under way, logs one record and calls exit at once with SignalExitCode: nothing more
// is waited for (running handlers' tasks stay locked until their locks run out; a
// provider call in flight is an unknown outcome, which the ledger reconciles). stop
// releases the signals.
func SignalContext(logger *slog.Logger, exit func(int)) (ctx context.Context, stop func()) {
	ctx, stopNotify := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// Every signal reaches this channel too; the first is NotifyContext's.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		for n := 1; ; n++ {
			select {
			case sig := <-sigs:
				if n == 1 {
					logger.Info("signal received: stopping gracefully; send it again to exit at once", slog.String("signal", sig.String()))
					continue
				}
				code := SignalExitCode(sig)
				logger.Warn("second signal: exiting at once, without waiting for running handlers",
					slog.String("signal", sig.String()), slog.Int("exit_code", code))
				exit(code)
				return
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			signal.Stop(sigs)
			stopNotify()
			close(done)
		})
	}
}

// SignalExitCode is the exit status for dying of sig: 128 plus its number (130 for
// SIGINT, 143 for SIGTERM), as a shell reports a process killed by a signal; 1 for a
// signal without a number.
func SignalExitCode(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 1
}

// Command runs one command of a program built on this package (the operator's tool, the
// demo's worker): no command or help prints usage; "config" prints the effective
// configuration; any other loads the configuration (its problems listed at once), builds
// the logger on stderr and a context that SIGINT or SIGTERM ends (a second signal exits
// at once), and runs fn, every error of which reaches the caller with the
// configuration's secrets masked.
func Command(args []string, usage string, stdout, stderr io.Writer, fn func(ctx context.Context, cfg Config, logger *slog.Logger) error) (err error) {
	switch {
	case len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help":
		fmt.Fprintln(stdout, usage)
		return nil
	case args[0] == "config":
		return ConfigCommand(args[1:], stdout, stderr)
	}
	cfg, err := LoadConfig()
	if err != nil {
		return cfg.ScrubError(err)
	}
	defer func() { err = cfg.ScrubError(err) }()
	logger := NewLogger(cfg, stderr)
	ctx, stop := SignalContext(logger, os.Exit)
	defer stop()
	return fn(ctx, cfg, logger)
}
