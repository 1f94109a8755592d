package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/extworker/extworker/internal/console"
)

// This file is `extworker console`: what the operator console (internal/console) needs
// from the command line. The console itself runs in the worker process
// (EXTWORKER_CONSOLE_ADDR).

// stdin is where hash-password reads the password; tests replace it.
var stdin io.Reader = os.Stdin

const consoleUsage = `usage: extworker console hash-password NAME < password
  reads a password (one line) on standard input and prints NAME:bcrypt-hash, a line for
  EXTWORKER_CONSOLE_OPERATORS_FILE (htpasswd -nBC 10 NAME writes the same form)`

func runConsole(args []string, in io.Reader, stdout io.Writer) error {
	if len(args) != 2 || args[0] != "hash-password" {
		return errors.New(consoleUsage)
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
