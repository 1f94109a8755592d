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

	exited  chan struct{} // closed after Wait; then state and waitErr are set
	state   *os.ProcessState
	waitErr error
	stopped bool
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
			case len(f) > 0 && (f[0] == "LISTEN" || f[0] == "DONE"):
				select {
				case p.lines <- line:
				default:
				}
			}
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

// usage is what the kernel counted for a process that has exited.
type usage struct {
	CPU     time.Duration
	PeakRSS int64
}

// stop sends SIGTERM, waits up to grace, then kills; it returns the process's rusage.
// Calling it again returns the same.
func (p *proc) stop(grace time.Duration) (usage, error) {
	if !p.stopped {
		p.stopped = true
		select {
		case <-p.exited:
		default:
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
	return usage{
		CPU:     time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		PeakRSS: ru.Maxrss * 1024, // kilobytes on Linux
	}, nil
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

// engineCPU sums the CPU time of the engine's process (pid, if not 0) and of every
// PostgreSQL process on the machine. Other users of the same engine and database add
// to it, so it is only meaningful while the benchmark has them to itself.
func engineCPU(pid int) time.Duration {
	var total time.Duration
	if pid > 0 {
		if d, err := procCPU(pid); err == nil {
			total += d
		}
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return total
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
			total += d
		}
	}
	return total
}
