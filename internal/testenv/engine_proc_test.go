package testenv

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// KillEngine never aims at a shared engine: a killable engine URL on the port of the
// engine other tests use is refused before anything is read or signalled.
func TestKillEngineRefusesSharedEngines(t *testing.T) {
	for _, shared := range []string{DefaultEngineURL, DefaultAuthEngineURL} {
		t.Setenv("EXTWORKER_TEST_FAULT_ENGINE_URL", shared)
		r := &recorder{TB: t}
		r.run(func() { faultEnginePort(r) })
		if !r.fatal {
			t.Errorf("killable engine URL %s (a shared engine's): not refused", shared)
		}
	}
	t.Setenv("EXTWORKER_TEST_FAULT_ENGINE_URL", "")
	r := &recorder{TB: t}
	var port string
	r.run(func() { port = faultEnginePort(r) })
	if r.fatal || r.skipped || port != "8082" {
		t.Errorf("default killable engine: port %q (fatal %v, skipped %v), want 8082", port, r.fatal, r.skipped)
	}
}

// Only a java process running the engine's jar is taken for the engine's JVM; a dead
// process (or a zombie) is not alive.
func TestFindJVM(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if !alive(pid) {
		t.Fatalf("running pid %d not alive", pid)
	}
	if ppid(pid) != os.Getpid() {
		t.Errorf("parent of %d: %d, want %d", pid, ppid(pid), os.Getpid())
	}
	if isJVM(pid, "engine-8082.jar") {
		t.Errorf("sleep taken for the engine's JVM")
	}
	if _, err := findJVM(pid, "engine-8082.jar"); err == nil {
		t.Errorf("findJVM accepted sleep")
	}
	_ = cmd.Process.Kill()
	Eventually(t, 5*time.Second, "the killed process to be a zombie", func() (bool, error) { return !alive(pid), nil })
	_ = cmd.Wait()
	if _, err := findJVM(pid, "engine-8082.jar"); err == nil {
		t.Errorf("findJVM accepted a dead pid")
	}
}
