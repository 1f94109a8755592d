package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// pickup is a "PICKUP <business key> <unix ns>" line.
type pickup struct {
	key string
	at  time.Time
}

// proc is a worker (or the stub engine) running as a child process. Its stdout is read
// line by line: FIRST and PICKUP lines become fields and channel values, other lines go
// to lines (protocol lines like LISTEN and DONE) and to the log file.
type proc struct {
	name     string
	cmd      *exec.Cmd
	launched time.Time
	logPath  string

	first      chan struct{} // closed when FIRST was read; then firstAt and cpuAtFirst are set
	firstAt    time.Time
	cpuAtFirst time.Duration
	pickups    chan pickup
	lines      chan string
	finals     map[string][]string // protocol lines read by final, by first word

	exited  chan struct{} // closed after Wait; then state and waitErr are set
	state   *os.ProcessState
	waitErr error
	stopped bool
	hwm     int64 // VmHWM read just before stopping
}

// launch starts path with args; stderr and unparsed stdout go to logPath.
func launch(name, path string, args []string, dir, logPath string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "# %s %s\n", path, strings.Join(args, " "))
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	cmd.Stderr = logf
	// The driver's children die with it, even if it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, first: make(chan struct{}),
		pickups: make(chan pickup, 1<<14), lines: make(chan string, 64), exited: make(chan struct{})}
	p.launched = time.Now()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		defer close(p.exited)
		defer logf.Close()
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		firstSeen := false
		for sc.Scan() {
			line := sc.Text()
			f := strings.Fields(line)
			switch {
			case len(f) == 2 && f[0] == "FIRST" && !firstSeen:
				if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
					p.cpuAtFirst, _ = procCPU(cmd.Process.Pid)
					p.firstAt = time.Unix(0, ns)
					firstSeen = true
					close(p.first)
					continue
				}
			case len(f) == 3 && f[0] == "PICKUP":
				if ns, err := strconv.ParseInt(f[2], 10, 64); err == nil {
					select {
					case p.pickups <- pickup{key: f[1], at: time.Unix(0, ns)}:
					default: // never blocks the worker; the latency trial reports what is missing
					}
					continue
				}
			case len(f) > 0 && (f[0] == "LISTEN" || f[0] == "DONE" || f[0] == "REQUESTS" || f[0] == "LEDGER" || f[0] == "SLOTS" || f[0] == "LOCKS" || f[0] == "EXTENDS" || f[0] == "HELD"):
				select {
				case p.lines <- line:
				default:
				}
			}
			// Everything else, and the protocol lines above, go to the log.
			fmt.Fprintln(logf, line)
		}
		p.waitErr = cmd.Wait()
		p.state = cmd.ProcessState
	}()
	return p, nil
}

// exitErr describes how the process ended (call after exited is closed).
func (p *proc) exitErr() error {
	if p.waitErr != nil {
		return p.waitErr
	}
	return errors.New("exit status 0")
}

// awaitFirst waits for the FIRST line.
func (p *proc) awaitFirst(ctx context.Context, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.first:
		return nil
	case <-p.exited:
		return fmt.Errorf("%s exited before its first task: %v (log: %s)", p.name, p.exitErr(), p.logPath)
	case <-t.C:
		return fmt.Errorf("%s started no handler within %v (log: %s)", p.name, timeout, p.logPath)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// awaitLine waits for a protocol line starting with word.
func (p *proc) awaitLine(ctx context.Context, word string, timeout time.Duration) ([]string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case line := <-p.lines:
			if f := strings.Fields(line); len(f) > 0 && f[0] == word {
				return f, nil
			}
		case <-p.exited:
			// The last lines may still be buffered.
			select {
			case line := <-p.lines:
				if f := strings.Fields(line); len(f) > 0 && f[0] == word {
					return f, nil
				}
			default:
			}
			return nil, fmt.Errorf("%s exited before printing %s: %v (log: %s)", p.name, word, p.exitErr(), p.logPath)
		case <-t.C:
			return nil, fmt.Errorf("%s printed no %s within %v (log: %s)", p.name, word, timeout, p.logPath)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// requests returns the fetch count of the worker's "REQUESTS <fetches> ..." line,
// printed at exit (extworker and the JS worker), or 0. Call after stop.
func (p *proc) requests() int64 {
	if f := p.final("REQUESTS"); len(f) >= 2 {
		n, _ := strconv.ParseInt(f[1], 10, 64)
		return n
	}
	return 0
}

// final returns the fields of the last protocol line starting with word that the
// process printed, or nil. Call after stop.
func (p *proc) final(word string) []string {
	if p.finals == nil {
		p.finals = map[string][]string{}
	}
	for {
		select {
		case line := <-p.lines:
			if f := strings.Fields(line); len(f) > 0 {
				p.finals[f[0]] = f
			}
		default:
			return p.finals[word]
		}
	}
}

// usage is what the kernel counted for a process that has exited.
type usage struct {
	CPU     time.Duration
	PeakRSS int64
}

// stop reads the process's peak RSS, sends SIGTERM, waits up to grace, then kills; it
// returns the CPU time from its rusage. Calling it again returns the same.
//
// The peak RSS comes from VmHWM in /proc/<pid>/status, which starts afresh at exec:
// rusage's ru_maxrss also counts the pages the child shared with the driver between
// fork and exec, and so would report the driver's size for a small worker.
func (p *proc) stop(grace time.Duration) (usage, error) {
	if !p.stopped {
		p.stopped = true
		select {
		case <-p.exited:
		default:
			p.hwm, _ = procHWM(p.cmd.Process.Pid)
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			t := time.NewTimer(grace)
			select {
			case <-p.exited:
			case <-t.C:
				_ = p.cmd.Process.Kill()
				<-p.exited
			}
			t.Stop()
		}
	}
	if p.state == nil {
		return usage{}, fmt.Errorf("%s: no process state: %v", p.name, p.waitErr)
	}
	ru, ok := p.state.SysUsage().(*syscall.Rusage)
	if !ok {
		return usage{}, fmt.Errorf("%s: no rusage", p.name)
	}
	if p.hwm == 0 {
		return usage{}, fmt.Errorf("%s: exited before its peak RSS could be read", p.name)
	}
	return usage{CPU: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), PeakRSS: p.hwm}, nil
}

// procHWM reads a live process's peak resident set size (VmHWM) in bytes.
func procHWM(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err != nil {
				return 0, fmt.Errorf("/proc/%d/status: VmHWM: %w", pid, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmHWM", pid)
}

// procCPU reads a live process's user+system CPU from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no comm", pid)
	}
	f := strings.Fields(s[i+1:])
	// Fields after comm start with state (field 3); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime or stime", pid)
	}
	const clockTicks = 100 // USER_HZ, 100 on every Linux the benchmark targets
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// cpuSample is the CPU time of the engine's process and of every PostgreSQL process,
// by pid.
type cpuSample map[int]time.Duration

// sampleEngineCPU reads the CPU time of the engine's process (pid, if not 0) and of
// every PostgreSQL process on the machine.
func sampleEngineCPU(pid int) cpuSample {
	s := cpuSample{}
	if pid > 0 {
		if d, err := procCPU(pid); err == nil {
			s[pid] = d
		}
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return s
	}
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n == pid {
			continue
		}
		comm, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err != nil || strings.TrimSpace(string(comm)) != "postgres" {
			continue
		}
		if d, err := procCPU(n); err == nil {
			s[n] = d
		}
	}
	return s
}

// since is the CPU the sampled processes spent between before and s: the growth of
// each process seen both times, plus all of each process that started in between. A
// process that ended in between (a test suite's connection, say) is left out, so the
// sum never goes negative. Other users of the same engine and database still add to
// it: it is only exact while the benchmark has them to itself.
func (s cpuSample) since(before cpuSample) time.Duration {
	var total time.Duration
	for pid, d := range s {
		total += max(0, d-before[pid])
	}
	return total
}
