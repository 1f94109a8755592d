// Package failpoint kills the process at named points, for the crash tests: real process
// death by SIGKILL, so no deferred cleanup, no flush, no goodbye to the engine.
//
// Points are enabled from the environment, never from code:
//
//	EXTWORKER_FAILPOINTS=after-dispatch-mark          kill at the first hit
//	EXTWORKER_FAILPOINTS=before-complete@3,in-extension   kill at the third hit of one, the first of the other
//
// With the variable unset, Inject costs one atomic load and a branch (BenchmarkDisabled),
// so the points stay compiled into the production binary, where they are inert.
package failpoint

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Env is the variable that enables failpoints.
const Env = "EXTWORKER_FAILPOINTS"

// Points named in the worker, in the order a side effect passes them.
const (
	AfterPrepared       = "after-prepared"        // intent recorded and claimed, nothing sent
	AfterDispatchMark   = "after-dispatch-mark"   // dispatched committed, request not yet sent
	AfterProviderAnswer = "after-provider-answer" // provider answered, ledger not yet confirmed
	AfterConfirm        = "after-confirm"         // ledger confirmed, engine not yet told
	BeforeComplete      = "before-complete"       // the completion is about to be sent
	InExtension         = "in-extension"          // a lock extension is about to be sent
)

var (
	once    sync.Once
	active  atomic.Bool
	mu      sync.Mutex
	targets map[string]int // point -> the hit that kills
	hits    map[string]int
)

func load() {
	spec := os.Getenv(Env)
	if spec == "" {
		return
	}
	targets, hits = map[string]int{}, map[string]int{}
	for _, p := range strings.Split(spec, ",") {
		name, nth, _ := strings.Cut(strings.TrimSpace(p), "@")
		n, err := strconv.Atoi(nth)
		if err != nil || n < 1 {
			n = 1
		}
		if name != "" {
			targets[name] = n
		}
	}
	active.Store(len(targets) > 0)
}

// Inject kills the process if point is enabled and this is the hit it names.
func Inject(point string) {
	once.Do(load)
	if !active.Load() {
		return
	}
	mu.Lock()
	n, ok := targets[point]
	hits[point]++
	kill := ok && hits[point] == n
	mu.Unlock()
	if kill {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
