package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"
)

// hash-password prints a line for the console's operators file from a password read on
// standard input, with no configuration needed; a short password or a name the console
// would refuse is an error.
func TestConsoleHashPassword(t *testing.T) {
	old := stdin
	defer func() { stdin = old }()
	stdin = strings.NewReader("correct horse battery\n")
	var out, errOut bytes.Buffer
	require.NoError(t, run([]string{"console", "hash-password", "alice"}, &out, &errOut))
	name, hash, ok := strings.Cut(strings.TrimSpace(out.String()), ":")
	require.True(t, ok, out.String())
	assert.Equal(t, "alice", name)
	assert.NoError(t, bcrypt.CompareHashAndPassword([]byte(hash), []byte("correct horse battery")))
	assert.NotContains(t, out.String(), "correct horse")

	stdin = strings.NewReader("short\n")
	assert.ErrorContains(t, run([]string{"console", "hash-password", "alice"}, &out, &errOut), "at least 8 characters")
	stdin = strings.NewReader("long enough password\n")
	assert.ErrorContains(t, run([]string{"console", "hash-password", "al ice"}, &out, &errOut), "operator name")
	assert.ErrorContains(t, run([]string{"console"}, &out, &errOut), "usage: extworker console hash-password NAME")
}
