package main

import (
	"bytes"
	"errors"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/testenv"
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

// `extworker console` without a subcommand (or with an unknown one) is a usage error,
// exit status 2, with the usage; --help prints it on standard output and succeeds.
func TestConsoleWithoutSubcommandIsUsageError(t *testing.T) {
	for _, args := range [][]string{{"console"}, {"console", "frobnicate"}, {"console", "serve", "extra"}} {
		var out, errOut bytes.Buffer
		err := run(args, &out, &errOut)
		require.Error(t, err, "%q", args)
		assert.Contains(t, err.Error(), "usage: extworker console hash-password NAME", "%q", args)
		assert.Equal(t, 2, exitCode(err), "%q", args)
	}
	for _, help := range []string{"-h", "--help", "help"} {
		var out, errOut bytes.Buffer
		require.NoError(t, run([]string{"console", help}, &out, &errOut), help)
		assert.Contains(t, out.String(), "usage: extworker console serve", help)
	}
}

// `extworker console serve` runs the console alone, as docs/console.md shows it: a
// process with the console's variables and the ledger's database, no worker, no topic,
// and no engine that answers (its address is only for the engine's view and the links).
// An operator logs in and sees the overview; SIGTERM stops it with exit status 0.
func TestConsoleServeAlone(t *testing.T) {
	effectsEnv(t) // a migrated ledger, the operators registered
	bin := buildCLI(t)
	stdin = strings.NewReader("alice-password\n")
	t.Cleanup(func() { stdin = os.Stdin })
	var line bytes.Buffer
	require.NoError(t, run([]string{"console", "hash-password", "alice"}, &line, &bytes.Buffer{}))
	addr := testenv.FreeAddr(t)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "EXTWORKER_") || strings.HasPrefix(kv, "EXTWORKER_TEST_") {
			env = append(env, kv)
		}
	}
	env = append(env, "EXTWORKER_CONSOLE_ADDR="+addr,
		"EXTWORKER_CONSOLE_OPERATORS_FILE="+testenv.WriteFile(t, "operators", line.String()),
		"EXTWORKER_CONSOLE_DATABASE_URL="+testenv.DBURLAs(testenv.ConsoleLogin),
		"EXTWORKER_DATABASE_URL="+testenv.DBURL(),
		"EXTWORKER_ENGINE_URL=http://127.0.0.1:1/engine-rest") // nothing answers there
	cmd := exec.Command(bin, "console", "serve")
	cmd.Env = env
	logs := &testenv.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	})

	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Timeout: 5 * time.Second}
	base := "http://" + addr
	var page []byte
	testenv.Eventually(t, 30*time.Second, "the console to serve its login page", func() (bool, error) {
		select {
		case err := <-exited:
			t.Fatalf("console serve exited (%v):\n%s", err, logs.String())
		default:
		}
		resp, err := c.Get(base + "/login")
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		page, err = io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK, err
	})
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindSubmatch(page)
	require.NotNil(t, csrf, "no CSRF token in the login page:\n%s", page)
	form := url.Values{"csrf": {html.UnescapeString(string(csrf[1]))}, "name": {"alice"}, "password": {"alice-password"}}
	req, err := http.NewRequest(http.MethodPost, base+"/login", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", base)
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "login: %s", logs.String())
	resp, err = c.Get(base + "/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the overview, from the ledger alone")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		assert.NoError(t, err, "a graceful stop exits 0:\n%s", logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("console serve did not stop within 30s of SIGTERM:\n%s", logs.String())
	}
	assert.Contains(t, logs.String(), "operator console stopped")
}

// Without EXTWORKER_CONSOLE_ADDR, console serve is a configuration error (exit 78).
func TestConsoleServeNeedsAddr(t *testing.T) {
	testenv.ClearConfigEnv(t)
	err := run([]string{"console", "serve"}, &bytes.Buffer{}, &bytes.Buffer{})
	require.Error(t, err)
	var ce daemon.ConfigError
	assert.True(t, errors.As(err, &ce), "a configuration error: %v", err)
	assert.Contains(t, err.Error(), "EXTWORKER_CONSOLE_ADDR")
}
