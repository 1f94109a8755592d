package harness

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// InFlight is what scenario 7 measured beyond a Trial's common fields: N7 tasks held in
// flight at once, each for Hold7 with its lock (Lock7) kept alive by the worker's one
// lock scheduler.
type InFlight struct {
	// Lock and Hold are the topic's lock duration and how long each handler held its task.
	Lock, Hold time.Duration
	// MaxInFlight is the most handlers that ran at once (tasks.Stats.MaxInFlight).
	MaxInFlight int64
	// HeldRSS is the worker's resident set when the first hold ended, every task still
	// in flight (the trial's PeakRSS also covers the completes that follow).
	HeldRSS int64
	// StartInstances is how long starting the N instances took, before the worker ran.
	StartInstances time.Duration
	// Extended and ExtendFailed count the extendLock calls that succeeded and failed;
	// Lost the locks lost (the engine answered that another worker, or nobody, held the
	// task, or that it was gone). Sent counts the extensions the scheduler sent.
	Extended, ExtendFailed, Lost, Sent int64
	// LateP50, LateP99 and LateMax are how late extensions went out after they were due
	// (an extension sent early, spread, counts as 0).
	LateP50, LateP99, LateMax time.Duration
	// Answered counts extendLock calls the engine answered with 2xx; Rate is them per
	// second from the first to the last sent, Busiest the most sent in one second, and
	// Latency their mean round trip.
	Answered int64
	Rate     float64
	Busiest  int64
	Latency  time.Duration
}

// inFlight is one trial of scenario 7: N7 instances wait on the engine before the worker
// starts with MaxConcurrency N7; it holds every task for Hold7 (locked for Lock7, so its
// lock is extended at least twice), then completes it. Timed from the first handler to
// the last task completed; the worker's LOCKS and EXTENDS lines say how the locks fared.
func (h *harness) inFlight(ctx context.Context, v Variant, run int) (Trial, error) {
	o := h.o
	m, err := h.eng.deploy(ctx, fmt.Sprintf("s7-%s-%d", v.ID, run))
	if err != nil {
		return Trial{}, err
	}
	began := time.Now()
	if err := h.eng.start(ctx, m.Key, o.N7, "f"); err != nil {
		return Trial{}, fmt.Errorf("start %d instances: %w", o.N7, err)
	}
	startTook := time.Since(began)
	fmt.Fprintf(o.Progress, "bench: scenario 7: started %d instances in %v\n", o.N7, startTook.Round(100*time.Millisecond))
	extra := []string{"-concurrency", strconv.Itoa(o.N7), "-hold", o.Hold7.String(), "-lock", o.Lock7.String(), "-warnings"}
	path, args, dir := h.command(v, o.EngineURL, m.Topic, "hold", false, extra)
	engineBefore := sampleEngineCPU(o.EnginePID)
	p, err := launch(v.Label, path, args, dir, h.logPath(7, v, run))
	if err != nil {
		return Trial{}, err
	}
	defer func() { _, _ = p.stop(stopGrace) }()
	if err := p.awaitFirst(ctx, 2*time.Minute); err != nil {
		return Trial{}, err
	}
	// Fetching, holding, and completing at the engine's pace (about 100 a second here).
	end, err := h.eng.drained(ctx, m.Topic, p, 2*time.Minute+o.Hold7+time.Duration(o.N7)*20*time.Millisecond)
	if err != nil {
		return Trial{}, err
	}
	engineUsed := sampleEngineCPU(o.EnginePID).since(engineBefore)
	u, err := p.stop(stopGrace)
	if err != nil {
		return Trial{}, err
	}
	f := &InFlight{Lock: o.Lock7, Hold: o.Hold7, StartInstances: startTook}
	if l := p.final("LOCKS"); len(l) == 9 {
		n := ints(l[1:])
		f.Extended, f.ExtendFailed, f.Lost, f.Sent = n[0], n[1], n[2], n[3]
		f.LateP50, f.LateP99, f.LateMax = time.Duration(n[4])*time.Microsecond, time.Duration(n[5])*time.Microsecond, time.Duration(n[6])*time.Microsecond
		f.MaxInFlight = n[7]
	} else {
		return Trial{}, fmt.Errorf("no LOCKS line from %s (log: %s)", p.name, p.logPath)
	}
	if h := p.final("HELD"); len(h) == 2 {
		f.HeldRSS = ints(h[1:])[0]
	}
	if e := p.final("EXTENDS"); len(e) == 6 {
		n := ints(e[1:])
		f.Answered, f.Busiest = n[0], n[3]
		if window := time.Duration(n[2] - n[1]); window > 0 {
			f.Rate = float64(n[0]-1) / window.Seconds()
		}
		if n[0] > 0 {
			f.Latency = time.Duration(n[4]) * time.Millisecond / time.Duration(n[0])
		}
	}
	t := Trial{N: o.N7, Startup: p.firstAt.Sub(p.launched), Wall: end.Sub(p.firstAt), CPUTotal: u.CPU, PeakRSS: u.PeakRSS,
		EngineCPU: engineUsed, Fetches: p.requests(), InFlight: f}
	t.CPUWork = max(0, u.CPU-p.cpuAtFirst)
	if t.Wall > 0 {
		t.TPS = float64(t.N) / t.Wall.Seconds()
	}
	return t, nil
}

// ints parses decimal fields; a bad one reads as 0.
func ints(fields []string) []int64 {
	out := make([]int64, len(fields))
	for i, f := range fields {
		out[i], _ = strconv.ParseInt(f, 10, 64)
	}
	return out
}
