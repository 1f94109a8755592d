//go:build failpoints && unix

package failpoint

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Enabled reports whether this build has failpoints (the failpoints tag, on Unix).
const Enabled = true

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

// Inject kills the process if point is enabled and this is the hit it names. With the
// variable unset it costs one atomic load and a branch (BenchmarkDisabled).
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
