package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/testenv"
)

// extworker operators: the owner registers, lists and removes a person; an operator's own
// login may list but not register anyone (only the owner writes the register).
func TestOperatorsCommand(t *testing.T) {
	effectsEnv(t) // migrated, as the owner
	name := "op-" + testenv.Unique("x")[2:]
	ops := func(login string, args ...string) (string, error) {
		t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURLAs(login))
		if login == "" {
			t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
		}
		var out, errOut bytes.Buffer
		err := run(append([]string{"operators"}, args...), &out, &errOut)
		return out.String(), err
	}
	out, err := ops("", "add", name)
	require.NoError(t, err)
	assert.Contains(t, out, "operator "+name+" registered")
	_, err = ops("", "add", name)
	require.Error(t, err, "a name is registered once")
	assert.Contains(t, err.Error(), "operator "+name+" is already registered")
	assert.NotContains(t, err.Error(), "duplicate key")
	assert.Equal(t, 1, exitCode(err))
	out, err = ops(testenv.AliceLogin, "list")
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^`+name+`\s+-\s+`, out, "a console-only operator has no login")
	_, err = ops(testenv.AliceLogin, "add", "mallory", "--login", testenv.BobLogin)
	assert.ErrorContains(t, err, "permission denied", "an operator registers nobody")
	_, err = ops("", "add", name+".")
	assert.ErrorContains(t, err, "reads as "+name+", already registered", "a name that reads as one already registered")
	assert.NotContains(t, err.Error(), "duplicate key")
	out, err = ops("", "remove", name)
	require.NoError(t, err)
	assert.Contains(t, out, "operator "+name+" removed")
}
