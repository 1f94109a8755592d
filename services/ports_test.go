package services_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/testenv"
)

// holderEnv makes this test binary a port holder instead of running the tests: it listens
// on the address it names and, with holderVersionEnv, answers GET /engine-rest/version
// with that version, as an engine would (without it, it accepts connections and says
// nothing). Its arguments are ignored: they stand for a command line to be read in /proc.
const (
	holderEnv        = "SERVICES_TEST_HOLD_ADDR"
	holderVersionEnv = "SERVICES_TEST_HOLD_VERSION"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(holderEnv); addr != "" {
		hold(addr, os.Getenv(holderVersionEnv))
		return
	}
	os.Exit(m.Run())
}

func hold(addr, version string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if version == "" {
		for {
			c, err := ln.Accept()
			if err != nil {
				os.Exit(1)
			}
			_ = c.Close()
		}
	}
	_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/engine-rest/version" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"version":%q}`, version)
	}))
	os.Exit(1)
}

// startHolder runs a holder on a free port, from dir, its command line naming jar as
// another checkout's engine's does; it returns the port and the holder's process.
func startHolder(t *testing.T, dir, version, jar string) (int, *os.Process) {
	t.Helper()
	addr := testenv.FreeAddr(t)
	_, p, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	port, err := strconv.Atoi(p)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-jar", jar)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), holderEnv+"="+addr, holderVersionEnv+"="+version)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		require.True(t, time.Now().Before(deadline), "the holder does not listen on %s: %v", addr, err)
		time.Sleep(50 * time.Millisecond)
	}
	return port, cmd.Process
}

// runScript runs a services script with env and returns its exit status and output.
func runScript(t *testing.T, script string, env ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		require.NoError(t, err, out.String())
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// A port engine-up.sh needs, held by a process this checkout did not start (another
// checkout's engine of another version, or something that is no engine), is neither
// stopped nor taken for the engine asked for: the script names the holder (its pid,
// command line and working directory, the other checkout and how to stop its engine
// there) and exits 1 without saying "ready" and without starting an engine. An engine of
// the version asked for is reused, whoever started it.
func TestEngineUpNamesAForeignHolder(t *testing.T) {
	here, err := os.Getwd()
	require.NoError(t, err)
	for _, tc := range []struct {
		name, version string
		other         bool     // the holder's command line names another checkout's engine jar
		env           []string // more of the script's environment
	}{
		{"another checkout's engine of another version", "7.20.0", true, nil},
		{"a server that is no engine", "", false, nil},
		{"without ss, from /proc", "7.20.0", true, []string{"PATH=" + pathWithout(t, "ss")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := t.TempDir()
			jar := filepath.Join(other, "holder.jar")
			if tc.other {
				jar = filepath.Join(other, "services", ".run", "engine.jar")
			}
			port, holder := startHolder(t, other, tc.version, jar)
			pidfile := filepath.Join(here, ".run", fmt.Sprintf("engine-%d.pid", port))
			code, out := runScript(t, "engine-up.sh", append([]string{"ENGINE=camunda7", fmt.Sprintf("ENGINE_PORT=%d", port), "ENGINE_START_TIMEOUT=10"}, tc.env...)...)
			assert.Equal(t, 1, code, out)
			pid := holder.Pid
			assert.Contains(t, out, fmt.Sprintf("engine-up: port %d is held by pid %d, which this checkout (%s) did not start: %s -jar %s (working directory %s)",
				port, pid, filepath.Dir(here), os.Args[0], jar, other), out)
			if tc.other {
				assert.Contains(t, out, fmt.Sprintf(`engine-up: the engine on port %d answers {"version":"7.20.0"}, not camunda7's 7.24.0, and is not this checkout's to stop`, port))
				assert.Contains(t, out, fmt.Sprintf("it is the checkout %s's: stop it there with: ENGINE_PORT=%d bash %s/services/engine-down.sh, or kill %d", other, port, other, pid))
			} else {
				assert.Contains(t, out, fmt.Sprintf("engine-up: stop it (kill %d), or pick another port", pid))
			}
			assert.NotContains(t, out, "ready")
			assert.NotContains(t, out, "starting")
			assert.NoError(t, holder.Signal(syscall.Signal(0)), "the holder was left alone")
			assert.NoFileExists(t, pidfile, "no engine was started")
		})
	}

	t.Run("an engine of the version asked for is reused", func(t *testing.T) {
		other := t.TempDir()
		port, holder := startHolder(t, other, "7.24.0", filepath.Join(other, "services", ".run", "engine.jar"))
		code, out := runScript(t, "engine-up.sh", "ENGINE=camunda7", fmt.Sprintf("ENGINE_PORT=%d", port))
		assert.Equal(t, 0, code, out)
		assert.Contains(t, out, fmt.Sprintf("engine-up: camunda7 7.24.0 already running at http://127.0.0.1:%d/engine-rest; no Cockpit", port))
		assert.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 1, "one line:\n%s", out)
		assert.NoError(t, holder.Signal(syscall.Signal(0)))
	})
}

// kafka-up.sh does the same for its ports: a process that is no broker of this checkout's
// is named, and left alone.
func TestKafkaUpNamesAForeignHolder(t *testing.T) {
	other := t.TempDir()
	jar := filepath.Join(other, "holder.jar")
	port, holder := startHolder(t, other, "", jar)
	code, out := runScript(t, "kafka-up.sh", fmt.Sprintf("KAFKA_PORT=%d", port), fmt.Sprintf("KAFKA_CONTROLLER_PORT=%d", port+1))
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, fmt.Sprintf("kafka-up: port %d is held by pid %d", port, holder.Pid))
	assert.Contains(t, out, fmt.Sprintf("kafka-up: stop it (kill %d), or pick another port", holder.Pid))
	assert.NotContains(t, out, "ready")
	assert.NoError(t, holder.Signal(syscall.Signal(0)), "the holder was left alone")
}

// pathWithout is a PATH with every command of this one but those named: a directory of
// links, in the test's temporary directory.
func pathWithout(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		entries, _ := os.ReadDir(d) // a directory on PATH that is gone has no commands
		for _, e := range entries {
			if slices.Contains(names, e.Name()) {
				continue
			}
			link := filepath.Join(dir, e.Name())
			if _, err := os.Lstat(link); err == nil {
				continue // an earlier directory's command wins, as on PATH
			}
			require.NoError(t, os.Symlink(filepath.Join(d, e.Name()), link))
		}
	}
	_, err := exec.LookPath(filepath.Join(dir, "bash"))
	require.NoError(t, err)
	return dir
}
