package main

import (
	"bytes"
	"errors"
	"net"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/testenv"
)

// doctorEnv is a healthy configuration against the services make up starts.
func doctorEnv(t *testing.T) {
	t.Helper()
	testenv.Engine(t)
	testenv.DBAs(t, testenv.WorkerLogin)
	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURLAs(testenv.WorkerLogin))
	t.Setenv("EXTWORKER_HTTP_ADDR", testenv.FreeAddr(t))
}

// TestDoctorHealthy: every check on its line, no failure, the counts last, exit 0.
func TestDoctorHealthy(t *testing.T) {
	doctorEnv(t)
	var out bytes.Buffer
	require.NoError(t, run([]string{"doctor"}, &out, &bytes.Buffer{}))
	assert.Regexp(t, `(?m)^OK    configuration `, out.String())
	assert.Regexp(t, `(?m)^OK    engine reachable +http://127\.0\.0\.1:\d+/engine-rest answers$`, out.String())
	assert.Regexp(t, `(?m)^OK    worker role grants `, out.String())
	assert.NotContains(t, out.String(), "FAIL")
	assert.Regexp(t, `\n\d+ checks: \d+ ok, \d+ warnings?, 0 failed, 0 skipped\n$`, out.String())
}

// TestDoctorProblems: three problems, each with its fix under it; exit 1 (a plain
// error, not a configuration error); no password printed.
func TestDoctorProblems(t *testing.T) {
	doctorEnv(t)
	testenv.AuthEngine(t)
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.AuthEngineURL())
	t.Setenv("EXTWORKER_ENGINE_USER", testenv.AuthEngineUser)
	t.Setenv("EXTWORKER_ENGINE_PASSWORD", "wrong-password-xyz")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	t.Setenv("EXTWORKER_HTTP_ADDR", ln.Addr().String())
	t.Setenv("EXTWORKER_LOCK_DURATION", "10s")
	t.Setenv("EXTWORKER_LONG_POLL", "30s")

	var out bytes.Buffer
	err = run([]string{"doctor"}, &out, &bytes.Buffer{})
	require.Error(t, err)
	var ce daemon.ConfigError
	assert.False(t, errors.As(err, &ce), "failed checks exit 1, not 78")
	assert.Regexp(t, `^doctor: 2 of \d+ checks failed$`, err.Error())
	for _, re := range []string{
		`(?m)^FAIL  engine credentials +refused\n      fix: engine at .* rejected the credentials \(401\): check EXTWORKER_ENGINE_USER and EXTWORKER_ENGINE_PASSWORD`,
		`(?m)^FAIL  address EXTWORKER_HTTP_ADDR .*address already in use\n      fix: set EXTWORKER_HTTP_ADDR to a free address`,
		`(?m)^WARN  lock vs long poll .*\n      fix: set EXTWORKER_LOCK_DURATION to at least EXTWORKER_LONG_POLL \(30s\)`,
		`(?m)^SKIP  engine version +skipped: needs engine credentials$`,
	} {
		assert.Regexp(t, regexp.MustCompile(re), out.String())
	}
	assert.NotContains(t, out.String(), "wrong-password-xyz")
	assert.NotContains(t, err.Error(), "wrong-password-xyz")
}

// TestDoctorConfigUnreadable: a configuration the daemon refuses is the doctor's one
// check, failed, and a daemon.ConfigError (exit 78) listing the problems.
func TestDoctorConfigUnreadable(t *testing.T) {
	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_LOCK_DURATION", "abc")
	t.Setenv("EXTWORKER_DATABASE_URL", "postgres://u:s3cret-pw@127.0.0.1:5432/x?sslmode=bogus")
	var out bytes.Buffer
	err := run([]string{"doctor"}, &out, &bytes.Buffer{})
	var ce daemon.ConfigError
	require.True(t, errors.As(err, &ce), "exit 78: %v", err)
	assert.Contains(t, err.Error(), "EXTWORKER_LOCK_DURATION")
	assert.NotContains(t, err.Error(), "s3cret-pw")
	assert.Regexp(t, `^FAIL  configuration  cannot be read: the problems are listed below\n      fix: correct each variable`, out.String())
	assert.Contains(t, out.String(), "1 checks: 0 ok, 0 warnings, 1 failed, 0 skipped")
}

// TestDoctorUsage: a usage error exits 2, not 1 (a check failed): a bad flag, an
// argument, a timeout that is not positive, a queue name AMQP cannot carry. Nothing is
// checked then.
func TestDoctorUsage(t *testing.T) {
	var stderr bytes.Buffer
	require.NoError(t, run([]string{"doctor", "--help"}, &bytes.Buffer{}, &stderr))
	assert.Contains(t, stderr.String(), "exit status: 0 every check ok (warnings allowed), 1 a check failed, 2 a usage error")

	for _, args := range [][]string{
		{"extra"}, {"--timeout", "abc"}, {"--timeout", "0"}, {"--timeout", "-1s"}, {"--no-such-flag"},
		{"--queue", strings.Repeat("q", 250)},
	} {
		var out bytes.Buffer
		err := run(append([]string{"doctor"}, args...), &out, &bytes.Buffer{})
		require.Error(t, err, args)
		assert.Equal(t, 2, exitCode(err), "%v: exit 2", args)
		assert.Empty(t, out.String(), "%v: nothing checked", args)
		assert.Contains(t, err.Error(), "usage: extworker doctor", args)
	}
}

// TestDoctorQueuesWithoutBroker: queues named with no EXTWORKER_AMQP_URL are shown,
// skipped, under the broker's failure.
func TestDoctorQueuesWithoutBroker(t *testing.T) {
	doctorEnv(t)
	var out bytes.Buffer
	require.Error(t, run([]string{"doctor", "--queue", "orders,invoices"}, &out, &bytes.Buffer{}))
	assert.Regexp(t, `(?m)^FAIL  broker reachable +EXTWORKER_AMQP_URL is not set`, out.String())
	assert.Regexp(t, `(?m)^SKIP  queue orders +skipped: needs EXTWORKER_AMQP_URL$`, out.String())
	assert.Regexp(t, `(?m)^SKIP  queue invoices +skipped: needs EXTWORKER_AMQP_URL$`, out.String())
}
