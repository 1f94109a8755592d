//go:build failpoints && unix

package failpoint

import (
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	if p := os.Getenv("FAILPOINT_HELPER"); p != "" {
		for i := 0; i < 5; i++ {
			Inject("other")
			Inject(p)
		}
		os.Exit(0) // survived
	}
	os.Exit(m.Run())
}

func run(t *testing.T, spec, point string) *exec.ExitError {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), Env+"="+spec, "FAILPOINT_HELPER="+point)
	err := cmd.Run()
	if err == nil {
		return nil
	}
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	return exit
}

func TestKillsAtTheNamedHit(t *testing.T) {
	exit := run(t, "after-confirm@3", AfterConfirm)
	require.NotNil(t, exit, "the process died")
	ws := exit.Sys().(syscall.WaitStatus)
	assert.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL)
}

func TestInertWhenNotNamed(t *testing.T) {
	assert.Nil(t, run(t, "before-complete", AfterConfirm), "another point enabled: survives")
	assert.Nil(t, run(t, "after-confirm@9", AfterConfirm), "the ninth hit never comes: survives")
	assert.Nil(t, run(t, "", AfterConfirm), "nothing enabled: survives")
}

// BenchmarkDisabled is what a point costs in production (no EXTWORKER_FAILPOINTS).
func BenchmarkDisabled(b *testing.B) {
	for b.Loop() {
		Inject(AfterConfirm)
	}
}
