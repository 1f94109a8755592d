package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/daemon"
)

// Text an operator types on the command line is held to the console's rule: a control
// character, a byte that is not UTF-8 or an invisible character in a reason, an error
// code or a provider reference is refused before anything is opened (so nothing is
// stored), with exit status 2 and a message naming the flag and the character.
func TestEffectsRefusesTextTheConsoleRefuses(t *testing.T) {
	t.Setenv("EXTWORKER_DATABASE_URL", "postgres://nobody:s3cret@127.0.0.1:1/none")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"resolve", "K", "--as", "rejected", "--reason", "esc\x1b[31m", "--operator", "o"}, "--reason: U+001B"},
		{[]string{"resolve", "K", "--as", "rejected", "--reason", "bad\xff", "--operator", "o"}, "--reason: the reason is not UTF-8 text"},
		{[]string{"resolve", "K", "--as", "rejected", "--error-code", "E\xff", "--reason", "r", "--operator", "o"}, "--error-code: the error code is not UTF-8 text"},
		{[]string{"resolve", "K", "--as", "confirmed", "--provider-ref", "ch\u202e1", "--reason", "r"}, "--provider-ref: U+202E"},
		{[]string{"resolve", "K", "--as", "confirmed", "--provider-ref", "ch_1", "--value", "k=a\x1bb", "--reason", "r"}, "--value: U+001B"},
		{[]string{"approve", "7", "--reason", "ok\x07", "--operator", "o"}, "--reason: U+0007"},
		{[]string{"reject", "7", "--reason", "no\xfe", "--operator", "o"}, "--reason: the reason is not UTF-8 text"},
	} {
		_, err := effects(t, c.args...)
		require.Error(t, err, "%q", c.args)
		assert.Contains(t, err.Error(), c.want, "%q", c.args)
		assert.NotContains(t, err.Error(), "ledger database", "%q: nothing is opened", c.args)
		assert.NotContains(t, err.Error(), "SQLSTATE", "%q", c.args)
		assert.Equal(t, 2, exitCode(err), "%q: a usage error", c.args)
	}
	// A newline is fine in a reason (the console allows lines there).
	_, err := effects(t, "resolve", "K", "--as", "rejected", "--reason", "line one\nline two", "--operator", "o")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ledger database", "past the flags")
}

// main's exit statuses: 78 for a configuration problem, 2 for a usage error, else 1.
func TestExitCode(t *testing.T) {
	assert.Equal(t, 78, exitCode(fmt.Errorf("x: %w", daemon.ConfigError{Err: errors.New("bad")})))
	assert.Equal(t, 2, exitCode(fmt.Errorf("x: %w", usageError{errors.New("bad flag")})))
	assert.Equal(t, 1, exitCode(errors.New("other")))
}
