package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/extworker/extworker/internal/daemon"
)

// subcommands is what every command of a group (effects, inbox) needs.
type subcommands struct {
	group          string // "effects", "inbox"
	cfg            daemon.Config
	logger         *slog.Logger
	stdout, stderr io.Writer
}

// dispatch runs the command args[0] names, or prints usage for help.
func (s *subcommands) dispatch(ctx context.Context, args []string, usage string, cmds map[string]func(context.Context, []string) error) error {
	if len(args) == 0 {
		return fmt.Errorf("%s: no command given\n%s", s.group, usage)
	}
	run, ok := cmds[args[0]]
	switch {
	case args[0] == "-h" || args[0] == "--help" || args[0] == "help":
		fmt.Fprintln(s.stdout, usage)
		return nil
	case !ok:
		return fmt.Errorf("%s: unknown command %q\n%s", s.group, args[0], usage)
	}
	err := run(ctx, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return nil // the flag set printed its usage
	}
	return err
}

// newFlags returns a flag set for one command, with --json.
func (s *subcommands) newFlags(name, synopsis string) (*flag.FlagSet, *bool) {
	fs := flag.NewFlagSet(s.group+" "+name, flag.ContinueOnError)
	fs.SetOutput(s.stderr)
	fs.Usage = func() {
		fmt.Fprintf(s.stderr, "usage: extworker %s %s %s\n\nflags:\n", s.group, name, synopsis)
		fs.PrintDefaults()
	}
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	return fs, asJSON
}

// listFlag collects a flag's values, comma-separated or repeated, each read by parse
// (the --state of effects list and inbox list).
type listFlag[T ~string] struct {
	vals  *[]T
	parse func(string) (T, error)
}

func (f listFlag[T]) String() string {
	if f.vals == nil {
		return ""
	}
	s := make([]string, len(*f.vals))
	for i, v := range *f.vals {
		s[i] = string(v)
	}
	return strings.Join(s, ",")
}

func (f listFlag[T]) Set(v string) error {
	for _, name := range strings.Split(v, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		val, err := f.parse(name)
		if err != nil {
			return err
		}
		*f.vals = append(*f.vals, val)
	}
	return nil
}
