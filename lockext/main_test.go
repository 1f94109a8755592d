package lockext_test

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestMain fails the run if a goroutine outlives the tests: every extender started
// here must have been stopped, or have ended on its own, with its goroutine gone.
//
// It does what goleak.VerifyTestMain(m) does, with the standard library only:
// go.uber.org/goleak is not (yet) required by go.mod, and this package may not change
// go.mod. Once it is, replace the body with
//
//	goleak.VerifyTestMain(m,
//		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
//		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
//		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaks := leakedGoroutines(5 * time.Second); len(leaks) > 0 {
			fmt.Fprintf(os.Stderr, "lockext: %d goroutine(s) leaked:\n\n%s\n", len(leaks), strings.Join(leaks, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}

// leakedGoroutines returns the stacks of goroutines other than this one that are still
// running after up to wait (goroutines that are ending get the time to end). Idle
// keep-alive connections of the engine clients' HTTP transports are not leaks: they
// belong to the transport and close on its idle timeout.
func leakedGoroutines(wait time.Duration) []string {
	deadline := time.Now().Add(wait)
	for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		var leaks []string
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		for i, g := range strings.Split(strings.TrimSpace(string(buf)), "\n\n") {
			if i == 0 || expectedGoroutine(g) { // the first is this goroutine
				continue
			}
			leaks = append(leaks, g)
		}
		if len(leaks) == 0 || time.Now().After(deadline) {
			return leaks
		}
		time.Sleep(delay)
	}
}

func expectedGoroutine(stack string) bool {
	for _, s := range []string{
		"net/http.(*persistConn).readLoop",
		"net/http.(*persistConn).writeLoop",
		"os/signal.signal_recv",
		"runtime.ensureSigM",
		"testing.(*M).startAlarm",
		"testing.runFuzzTests",
	} {
		if strings.Contains(stack, s) {
			return true
		}
	}
	return false
}
