package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/extworker/extworker/internal/console"
	"github.com/extworker/extworker/internal/daemon"
)

// This file is `extworker console`: what the operator console (internal/console) needs
// from the command line. The console runs in a worker process (EXTWORKER_CONSOLE_ADDR),
// or alone: `extworker console serve`.

// stdin is where hash-password reads the password; tests replace it.
var stdin io.Reader = os.Stdin

const consoleUsage = `usage: extworker console hash-password NAME < password
  reads a password (one line) on standard input and prints NAME:bcrypt-hash, a line for
  EXTWORKER_CONSOLE_OPERATORS_FILE (htpasswd -nBC 10 NAME writes the same form)
usage: extworker console serve
  serves the operator console in a process of its own, without a worker, until SIGINT or
  SIGTERM: EXTWORKER_CONSOLE_ADDR, a way to authenticate operators, the migrated ledger
  (EXTWORKER_CONSOLE_DATABASE_URL, else EXTWORKER_DATABASE_URL) and EXTWORKER_ENGINE_URL
  (the engine's view of a task, the Cockpit links) as for a worker (docs/console.md)`

func runConsole(args []string, in io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 1 && args[0] == "serve" {
		return daemon.Command([]string{"console serve"}, consoleUsage, stdout, stderr, serveConsole)
	}
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprintln(stdout, consoleUsage)
		return nil
	}
	if len(args) != 2 || args[0] != "hash-password" {
		return usageError{errors.New(consoleUsage)} // no subcommand, or another: exit 2
	}
	name := args[1]
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("console hash-password: reading the password: %w", err)
	}
	hash, err := console.HashPassword(strings.TrimRight(line, "\r\n"))
	if err != nil {
		return fmt.Errorf("console hash-password: %w", err)
	}
	line, err = console.OperatorLine(name, hash)
	if err != nil {
		return fmt.Errorf("console hash-password: %w", err)
	}
	fmt.Fprintln(stdout, line)
	return nil
}

// serveConsole is `extworker console serve`: the console alone, until ctx ends. The
// engine is not asked at start: without it the pages of the ledger still serve, and an
// intent's page says that the engine's view is missing.
func serveConsole(ctx context.Context, cfg daemon.Config, logger *slog.Logger) error {
	if cfg.ConsoleAddr == "" {
		return daemon.ConfigError{Err: errors.New("console serve needs EXTWORKER_CONSOLE_ADDR, the address to serve the console on (docs/console.md)")}
	}
	client, err := daemon.NewClient(cfg, logger)
	if err != nil {
		return daemon.ConfigError{Err: err}
	}
	srv, err := console.Open(ctx, cfg, client, logger)
	if err != nil {
		return err
	}
	defer srv.Close()
	_, stop, err := srv.Start(ctx)
	if err != nil {
		return err
	}
	<-ctx.Done()
	stop()
	logger.Info("operator console stopped")
	return nil
}
