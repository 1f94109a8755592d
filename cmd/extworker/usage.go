package main

import (
	"errors"

	"github.com/extworker/extworker/internal/daemon"
)

// usageError is a command line the tool cannot act on (a flag's value it refuses, a
// missing subcommand): exit status 2, as for a bad flag.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// exitUsage is the exit status of a usage error.
const exitUsage = 2

// exitCode is main's exit status for err: 78 (EX_CONFIG) for a configuration problem or
// rejected credentials, 2 for a usage error, 1 for any other failure.
func exitCode(err error) int {
	var ce daemon.ConfigError
	var ue usageError
	switch {
	case errors.As(err, &ce):
		return daemon.ExitConfig // retrying cannot help: a supervisor may stop restarting
	case errors.As(err, &ue):
		return exitUsage
	}
	return 1
}
