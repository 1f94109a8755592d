// Package doctor is `extworker doctor`: checks an operator runs on a new host, each of
// which says what it found and, when it is not ok, the fix.
//
// The checks are of three kinds. The probes (probe.go) each reach one service, bounded
// by a timeout, and collect facts: the engine's version, its answer to the configured
// credentials and its clock (the Date header); the database's clock, migrations, roles,
// grants and who may connect; the broker and its queues; the listening addresses. The
// decisions (decide.go) are pure functions of those facts and of the configuration:
// what counts as ok, a warning or a failure, and what to do about it. Run runs every
// probe, one failing probe never stopping the others, and a check whose probe could not
// run because another failed is skipped, naming what it needs.
//
// No check writes: the database session is read-only (default_transaction_read_only),
// the console's as well, and the migrations are read (migrations.Applied, Check) without
// goose, which would create its version table.
//
// The existing checks are reused, not copied: the credential check is
// daemon.CheckClient, the migration check migrations.Check, who may connect
// migrations.PublicCanConnect, the database's TLS daemon.DatabaseTLSWarning, the
// console's configuration and login console.Open. The
// configuration's own problems (values out of range, the relations refused at start)
// are daemon.LoadConfig's: with them the doctor runs nothing and exits 78.
package doctor

import (
	"fmt"
	"io"
	"strings"
)

// Status is a check's verdict.
type Status int

const (
	OK   Status = iota // nothing to do
	Warn               // the worker runs, at a cost or a risk the check names
	Fail               // the worker will not run correctly until fixed
	Skip               // not checked: a check it needs failed
)

func (s Status) String() string {
	return [...]string{"OK", "WARN", "FAIL", "SKIP"}[s]
}

// symbol is the status on a terminal.
func (s Status) symbol() string {
	return [...]string{"✓", "!", "✗", "-"}[s]
}

// Check is one check's result.
type Check struct {
	Name   string // what is checked, e.g. "engine credentials"
	Status Status
	Found  string // what was found; never a secret
	Fix    string // what to do, for every status but OK and Skip
}

func ok(name, found string) Check { return Check{Name: name, Status: OK, Found: found} }
func warn(name, found, fix string) Check {
	return Check{Name: name, Status: Warn, Found: found, Fix: fix}
}
func fail(name, found, fix string) Check {
	return Check{Name: name, Status: Fail, Found: found, Fix: fix}
}

// skipped is a check that needs another one that failed.
func skipped(name, needs string) Check {
	return Check{Name: name, Status: Skip, Found: "skipped: needs " + needs}
}

// Exit codes of `extworker doctor`.
const (
	ExitOK     = 0  // every check ok (warnings allowed)
	ExitFailed = 1  // at least one check failed
	ExitUsage  = 2  // a usage error: a bad flag or argument; nothing was checked
	ExitConfig = 78 // the configuration cannot be read (daemon.ExitConfig)
)

// ExitCode is the exit status for checks: ExitFailed when one failed, else ExitOK.
func ExitCode(checks []Check) int {
	for _, c := range checks {
		if c.Status == Fail {
			return ExitFailed
		}
	}
	return ExitOK
}

// Counts returns how many checks have each status.
func Counts(checks []Check) map[Status]int {
	n := map[Status]int{}
	for _, c := range checks {
		n[c.Status]++
	}
	return n
}

// Summary is the last line: "14 checks: 12 ok, 1 warning, 1 failed, 0 skipped".
func Summary(checks []Check) string {
	n := Counts(checks)
	return fmt.Sprintf("%d checks: %d ok, %d %s, %d failed, %d skipped",
		len(checks), n[OK], n[Warn], plural(n[Warn], "warning", "warnings"), n[Fail], n[Skip])
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// nameWidth is the widest name column: a longer name (a long queue's) takes a line of
// its own rather than pushing every other line's column right.
const nameWidth = 30

// Write prints one line per check, the fix indented under each that is not ok, then the
// summary. symbols uses ✓ ! ✗ - (for a terminal); otherwise OK WARN FAIL SKIP.
func Write(w io.Writer, checks []Check, symbols bool) error {
	width := 0
	for _, c := range checks {
		if len(c.Name) <= nameWidth {
			width = max(width, len(c.Name))
		}
	}
	var b strings.Builder
	for _, c := range checks {
		mark := fmt.Sprintf("%-4s", c.Status)
		if symbols {
			mark = c.Status.symbol()
		}
		if len(c.Name) > width {
			fmt.Fprintf(&b, "%s  %s\n%*s  %s\n", mark, c.Name, len(mark)+2+width, "", c.Found)
		} else {
			fmt.Fprintf(&b, "%s  %-*s  %s\n", mark, width, c.Name, c.Found)
		}
		if c.Fix != "" && c.Status != OK {
			fmt.Fprintf(&b, "      fix: %s\n", c.Fix)
		}
	}
	b.WriteString(Summary(checks) + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}
