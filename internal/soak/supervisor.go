package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/extworker/extworker/internal/failpoint"
)

// supervisor keeps Config.Workers worker processes alive, one per slot: each slot runs a
// process until it ends (SIGKILLed by the killer or at its failpoint), then, after a
// seeded jitter, the next. Which restarts carry a failpoint is the crashSchedule's
// decision, which kills count as failpoint kills failpointKill's, the killer's victim
// pickVictim's.
type supervisor struct {
	bin    string
	env    []string // every worker's; each adds its id and failpoint
	seed   uint64
	dir    string // the run directory: worker-<slot>-<gen>.log
	faults *faultCounter

	mu       sync.Mutex
	procs    []*exec.Cmd        // the live process by slot, nil between processes
	byKiller map[*exec.Cmd]bool // the processes the killer sent SIGKILL
	crashes  *crashSchedule

	stop                                atomic.Bool
	draining                            atomic.Bool // no more failpoints on restart
	randomKills, failpointKills, starts atomic.Int64
	wg                                  sync.WaitGroup
}

func newSupervisor(cfg Config, env []string, dir string, faults *faultCounter, events bool) *supervisor {
	return &supervisor{bin: cfg.Binary, env: env, seed: cfg.Seed, dir: dir, faults: faults,
		procs: make([]*exec.Cmd, cfg.Workers), byKiller: map[*exec.Cmd]bool{},
		crashes: newCrashSchedule(rand.New(rand.NewPCG(cfg.Seed+1, cfg.Seed+2)), crashPoints(events))}
}

// start starts every slot, until stop or ctx ends.
func (s *supervisor) start(ctx context.Context) {
	for slot := range s.procs {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for gen := 0; !s.stop.Load() && ctx.Err() == nil; gen++ {
				if !s.runOne(slot, gen) {
					return
				}
				time.Sleep(restartJitter(s.seed, gen, slot))
			}
		}()
	}
}

// runOne runs the slot's worker of generation gen until it exits, and counts its death at
// its failpoint. false: the process could not be started.
func (s *supervisor) runOne(slot, gen int) bool {
	env := append(append([]string{}, s.env...), fmt.Sprintf("EXTWORKER_WORKER_ID=soak-%d-%d-%d", s.seed, slot, gen))
	s.mu.Lock()
	point := s.crashes.next(gen, s.draining.Load())
	s.mu.Unlock()
	if point != "" {
		env = append(env, failpoint.Env+"="+point)
	}
	logf, err := os.Create(filepath.Join(s.dir, fmt.Sprintf("worker-%d-%03d.log", slot, gen)))
	if err != nil {
		return false
	}
	cmd := exec.Command(s.bin, "run")
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return false
	}
	s.starts.Add(1)
	s.mu.Lock()
	s.procs[slot] = cmd
	s.mu.Unlock()
	err = cmd.Wait()
	logf.Close()
	s.mu.Lock()
	s.procs[slot] = nil
	byKiller := s.byKiller[cmd]
	delete(s.byKiller, cmd)
	s.mu.Unlock()
	if name, ok := failpointKill(point, sigkilled(err), byKiller); ok {
		s.failpointKills.Add(1)
		s.faults.add("failpoint kill " + name)
	}
	return true
}

// sigkilled reports whether a process's Wait error says SIGKILL ended it.
func sigkilled(err error) bool {
	var exit *exec.ExitError
	return errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
}

// kills is how many workers were killed so far, at random and at failpoints.
func (s *supervisor) kills() int { return int(s.randomKills.Load() + s.failpointKills.Load()) }

// killRandom SIGKILLs the live worker pickVictim chooses, if any.
func (s *supervisor) killRandom(rng *rand.Rand) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var live []int
	for slot, p := range s.procs {
		if p != nil && p.Process != nil {
			live = append(live, slot)
		}
	}
	if v := pickVictim(rng, live); v >= 0 {
		victim := s.procs[v]
		s.byKiller[victim] = true
		_ = victim.Process.Signal(syscall.SIGKILL)
		s.randomKills.Add(1)
		s.faults.add("random SIGKILL")
	}
}

// signalAll sends sig to every live worker.
func (s *supervisor) signalAll(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		if p != nil && p.Process != nil {
			_ = p.Process.Signal(sig)
		}
	}
}

// live counts the live workers.
func (s *supervisor) live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, p := range s.procs {
		if p != nil && p.Process != nil {
			n++
		}
	}
	return n
}

// stopAll stops the workers at the end of the run: SIGTERM, then up to within for every
// slot to end; past it, it SIGKILLs the workers still running and returns how many.
func (s *supervisor) stopAll(within time.Duration) int {
	s.stop.Store(true)
	s.signalAll(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case <-done:
		return 0
	case <-timer.C:
	}
	live := s.live()
	s.signalAll(syscall.SIGKILL)
	<-done
	return live
}

// kill SIGKILLs every worker and waits for the slots to end (on an early return).
func (s *supervisor) kill() {
	s.stop.Store(true)
	s.signalAll(syscall.SIGKILL)
	s.wg.Wait()
}
