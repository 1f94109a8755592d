package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
)

// The third engine `make up` starts: the one tests may SIGKILL and start again. It runs
// from the same jar as the others, without authentication, on its own database
// (camunda_faults), so killing it disturbs no test that uses the shared engines (8080 and
// 8081), which other packages' tests use at the same time. Tests that use it must not run
// in parallel with each other.
const (
	DefaultFaultEngineURL = "http://127.0.0.1:8082/engine-rest"
	// FaultEngineDB is its database, created by services/pg-up.sh.
	FaultEngineDB = "camunda_faults"
)

// FaultEngineURL is EXTWORKER_TEST_FAULT_ENGINE_URL or the local killable engine.
func FaultEngineURL() string { return env("EXTWORKER_TEST_FAULT_ENGINE_URL", DefaultFaultEngineURL) }

// FaultEngine returns a client for the killable engine after checking it answers. Like
// Engine, it fails in CI and skips elsewhere when that engine is not there.
func FaultEngine(t testing.TB) *admin.Client {
	t.Helper()
	return engine(t, "killable engine (make up starts it on port 8082)", camunda7.Config{BaseURL: FaultEngineURL()})
}

// faultEnginePort is the port of FaultEngineURL, which names the engine's pid file and is
// passed to services/engine-up.sh. It refuses the shared engines' ports: KillEngine must
// never hit an engine other tests are using.
func faultEnginePort(t testing.TB) string {
	t.Helper()
	u, err := url.Parse(FaultEngineURL())
	if err != nil || u.Port() == "" {
		t.Fatalf("EXTWORKER_TEST_FAULT_ENGINE_URL %q: want a URL with an explicit port", FaultEngineURL())
	}
	if host := u.Hostname(); host != "127.0.0.1" && host != "localhost" {
		unavailable(t, "a killable engine on this machine (EXTWORKER_TEST_FAULT_ENGINE_URL is "+FaultEngineURL()+")",
			errors.New("only an engine started here by services/engine-up.sh can be killed and started again"))
	}
	for _, shared := range []string{EngineURL(), AuthEngineURL()} {
		if s, err := url.Parse(shared); err == nil && s.Port() == u.Port() {
			t.Fatalf("the killable engine's port %s is a shared engine's (%s): refusing to kill it", u.Port(), shared)
		}
	}
	return u.Port()
}

// repoRoot is the module's root directory: the nearest parent of the working directory
// (a package directory while tests run) holding go.mod.
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("working directory: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// enginePIDFile is where services/engine-up.sh keeps the pid of the engine on port.
func enginePIDFile(root, port string) string {
	name := "engine"
	if port != "8080" {
		name = "engine-" + port
	}
	return filepath.Join(root, "services", ".run", name+".pid")
}

// EngineKill is what KillEngine did.
type EngineKill struct {
	PID int       // the JVM that was killed
	At  time.Time // when SIGKILL was sent
	// Dead is how long after the signal the process was gone (or a zombie) and the
	// engine's port refused connections.
	Dead time.Duration
}

// KillEngine SIGKILLs the killable engine's JVM (the pid in services/.run/engine-<port>.pid,
// checked to be the java process running that engine's jar, not a wrapper) and returns
// once the process is dead and the engine no longer answers. An engine that cannot be
// killed (not started by services/engine-up.sh here) fails the test in CI and skips it
// elsewhere. At cleanup, an engine still down is started again (StartEngine).
func KillEngine(t testing.TB) EngineKill {
	t.Helper()
	needServices(t, "the killable engine")
	port := faultEnginePort(t)
	root := repoRoot(t)
	pidFile := enginePIDFile(root, port)
	data, err := os.ReadFile(pidFile)
	if err != nil {
		unavailable(t, "the killable engine's process (services/engine-up.sh keeps its pid in "+filepath.Join("services", ".run", filepath.Base(pidFile))+")", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 1 {
		t.Fatalf("%s: not a pid: %q", pidFile, data)
	}
	jar := filepath.Base(strings.TrimSuffix(pidFile, ".pid")) + ".jar"
	jvm, err := findJVM(pid, jar)
	if err != nil {
		unavailable(t, "the killable engine's JVM", err)
	}
	t.Cleanup(func() {
		if !answers(FaultEngineURL(), 2*time.Second) {
			t.Logf("cleanup: the killable engine is down; starting it again")
			StartEngine(t)
		}
	})
	k := EngineKill{PID: jvm, At: time.Now()}
	if err := syscall.Kill(jvm, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL the engine's JVM (pid %d): %v", jvm, err)
	}
	Eventually(t, 20*time.Second, fmt.Sprintf("the engine's JVM (pid %d) to die and its port %s to refuse connections", jvm, port), func() (bool, error) {
		if alive(jvm) {
			return false, fmt.Errorf("pid %d still running", jvm)
		}
		if answers(FaultEngineURL(), 500*time.Millisecond) {
			return false, errors.New("the engine still answers")
		}
		return true, nil
	})
	k.Dead = time.Since(k.At)
	return k
}

// findJVM returns pid if it is the java process running jar, else such a java child of
// pid (if the pid file named a wrapper that forked).
func findJVM(pid int, jar string) (int, error) {
	if isJVM(pid, jar) {
		return pid, nil
	}
	if !alive(pid) {
		return 0, fmt.Errorf("pid %d from the pid file is not running", pid)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		child, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err != nil {
			continue
		}
		if ppid(child) == pid && isJVM(child, jar) {
			return child, nil
		}
	}
	return 0, fmt.Errorf("pid %d is not the java process running %s, nor is any of its children", pid, jar)
}

// isJVM reports whether pid is a live java process whose command line runs jar.
func isJVM(pid int, jar string) bool {
	if !alive(pid) {
		return false
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	if len(args) == 0 || filepath.Base(args[0]) != "java" {
		return false
	}
	for _, a := range args[1:] {
		if filepath.Base(a) == jar {
			return true
		}
	}
	return false
}

// procStat returns the state letter and the parent pid of pid from /proc/<pid>/stat.
func procStat(pid int) (state byte, parent int, ok bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, 0, false
	}
	fields := strings.Fields(string(raw[i+1:]))
	if len(fields) < 2 {
		return 0, 0, false
	}
	parent, err = strconv.Atoi(fields[1])
	return fields[0][0], parent, err == nil
}

// alive reports whether pid exists and is not a zombie (dead, waiting to be reaped).
func alive(pid int) bool {
	state, _, ok := procStat(pid)
	return ok && state != 'Z' && state != 'X'
}

func ppid(pid int) int {
	_, p, _ := procStat(pid)
	return p
}

// answers reports whether GET <base>/version answers 200 within timeout.
func answers(base string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/version", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// StartEngine starts the killable engine with services/engine-up.sh (ENGINE_PORT and
// ENGINE_DB set for it; the script leaves an engine that answers alone) and returns once
// GET /version answers, with how long that took from the call.
func StartEngine(t testing.TB) time.Duration {
	t.Helper()
	needServices(t, "the killable engine")
	port := faultEnginePort(t)
	root := repoRoot(t)
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "services", "engine-up.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "ENGINE_PORT="+port, "ENGINE_DB="+FaultEngineDB, "ENGINE_REST_AUTH=false", "ENGINE_START_TIMEOUT=300")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("services/engine-up.sh (port %s): %v\n%s", port, err, out)
	}
	Eventually(t, time.Minute, "the killable engine to answer GET /version", func() (bool, error) {
		return answers(FaultEngineURL(), 2*time.Second), nil
	})
	return time.Since(began)
}
