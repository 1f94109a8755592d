package harness

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/extworker/extworker/camunda7/admin"
)

// stopGrace is how long a worker may take to stop after SIGTERM before it is killed. An
// extworker worker waits for its pending long poll (20s by default) so that the engine locks
// nothing for it after it has gone, then prints its summary lines.
const stopGrace = 30 * time.Second

// command returns the program and arguments that run v against engineURL on topic.
func (h *harness) command(v Variant, engineURL, topic, mode string, latency bool, extra []string) (path string, args []string, dir string) {
	ioMs := strconv.FormatInt(h.o.IOWait.Milliseconds(), 10)
	common := []string{"-engine", engineURL, "-topic", topic}
	switch v.Client {
	case Extworker:
		path = filepath.Join(h.o.BinDir, "goworker")
		args = append(common, "-mode", mode, "-io", h.o.IOWait.String())
	case Java:
		path = "java"
		args = append([]string{"-jar", h.o.JavaJar}, common...)
		args = append(args, "-mode", mode, "-io-ms", ioMs)
	case JS:
		path = "node"
		args = append([]string{"worker.js"}, common...)
		args = append(args, "-mode", mode, "-io-ms", ioMs)
		dir = h.o.JSDir
	case Raw:
		path = filepath.Join(h.o.BinDir, "rawloop")
		args = common
	}
	if latency {
		args = append(args, "-latency")
	}
	args = append(args, v.flags...)
	return path, append(args, extra...), dir
}

func (h *harness) logPath(scenario int, v Variant, run int) string {
	h.seq++
	return filepath.Join(h.o.LogDir, fmt.Sprintf("%03d-s%d-%s-run%d.log", h.seq, scenario, v.ID, run))
}

// throughput is one trial of scenarios 1 and 2: n instances wait on the engine before
// the worker starts; it is timed from its first handler to the last task completed.
func (h *harness) throughput(ctx context.Context, scenario int, v Variant, run, n int, mode string, extra []string) (Trial, error) {
	return h.throughputThen(ctx, scenario, v, run, n, mode, extra, nil)
}

// throughputThen is throughput, calling after (if not nil) once the worker has exited.
func (h *harness) throughputThen(ctx context.Context, scenario int, v Variant, run, n int, mode string, extra []string, after func(*proc)) (Trial, error) {
	m, err := h.eng.deploy(ctx, fmt.Sprintf("s%d-%s-%d", scenario, v.ID, run))
	if err != nil {
		return Trial{}, err
	}
	if err := h.eng.start(ctx, m.Key, n, "i"); err != nil {
		return Trial{}, fmt.Errorf("start %d instances: %w", n, err)
	}
	path, args, dir := h.command(v, h.o.EngineURL, m.Topic, mode, false, extra)
	engineBefore := h.engineCPU(scenario)
	p, err := launch(v.Label, path, args, dir, h.logPath(scenario, v, run))
	if err != nil {
		return Trial{}, err
	}
	defer func() { _, _ = p.stop(stopGrace) }()
	if err := p.awaitFirst(ctx, 2*time.Minute); err != nil {
		return Trial{}, err
	}
	perTask := 20 * time.Millisecond
	if mode == "io" {
		perTask += h.o.IOWait
	}
	end, err := h.eng.drained(ctx, m.Topic, p, time.Minute+time.Duration(n)*perTask)
	if err != nil {
		return Trial{}, err
	}
	engineUsed := h.engineCPU(scenario).since(engineBefore)
	u, err := p.stop(stopGrace)
	if err != nil {
		return Trial{}, err
	}
	t := Trial{N: n, Startup: p.firstAt.Sub(p.launched), Wall: end.Sub(p.firstAt), CPUTotal: u.CPU, PeakRSS: u.PeakRSS, EngineCPU: engineUsed, Fetches: p.requests(),
		Slots: slotUse(p, v.Client)}
	if after != nil {
		after(p)
	}
	t.CPUWork = max(0, u.CPU-p.cpuAtFirst)
	if t.Wall > 0 {
		t.TPS = float64(n) / t.Wall.Seconds()
	}
	return t, nil
}

// latency is one trial of scenario 3: after a warm-up, instances start one at a time
// with random gaps; each one's latency runs from its start call returning to the
// worker's handler starting (both read from the same machine's wall clock).
func (h *harness) latency(ctx context.Context, v Variant, run int) (Trial, error) {
	m, err := h.eng.deploy(ctx, fmt.Sprintf("s3-%s-%d", v.ID, run))
	if err != nil {
		return Trial{}, err
	}
	path, args, dir := h.command(v, h.o.EngineURL, m.Topic, "noop", true, nil)
	p, err := launch(v.Label, path, args, dir, h.logPath(3, v, run))
	if err != nil {
		return Trial{}, err
	}
	defer func() { _, _ = p.stop(stopGrace) }()
	if err := h.eng.start(ctx, m.Key, h.o.LatencyWarmup, "warm"); err != nil {
		return Trial{}, err
	}
	if err := p.awaitFirst(ctx, 2*time.Minute); err != nil {
		return Trial{}, err
	}
	if _, err := h.eng.drained(ctx, m.Topic, p, 2*time.Minute); err != nil {
		return Trial{}, err
	}
	if err := sleep(ctx, 300*time.Millisecond); err != nil { // let the worker settle into its long poll
		return Trial{}, err
	}
	k := h.o.LatencySamples
	returned := make(map[string]time.Time, k)
	keys := make([]string, 0, k)
	for i := range k {
		key := fmt.Sprintf("lat-%d", i)
		if _, err := h.eng.c.StartProcess(ctx, m.Key, admin.StartProcessRequest{BusinessKey: key}); err != nil {
			return Trial{}, err
		}
		returned[key] = time.Now()
		keys = append(keys, key)
		if err := sleep(ctx, 50*time.Millisecond+rand.N(200*time.Millisecond)); err != nil {
			return Trial{}, err
		}
	}
	picked := make(map[string]time.Time, k)
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for len(picked) < k {
		select {
		case pk := <-p.pickups:
			if _, ok := returned[pk.key]; ok {
				if _, dup := picked[pk.key]; !dup {
					picked[pk.key] = pk.at
				}
			}
		case <-deadline.C:
			return Trial{}, fmt.Errorf("%d of %d pickups seen after 30s (log: %s)", len(picked), k, p.logPath)
		case <-ctx.Done():
			return Trial{}, ctx.Err()
		}
	}
	u, err := p.stop(stopGrace)
	if err != nil {
		return Trial{}, err
	}
	t := Trial{N: k, Startup: p.firstAt.Sub(p.launched), CPUTotal: u.CPU, PeakRSS: u.PeakRSS}
	for _, key := range keys {
		t.Latencies = append(t.Latencies, picked[key].Sub(returned[key]))
	}
	t.P50, t.P99 = percentile(t.Latencies, 50), percentile(t.Latencies, 99)
	return t, nil
}

// ceiling is one trial of scenario 5: the worker against the stub engine, which serves
// N5 tasks from memory; timed by the stub from its first answer with tasks to the last
// complete.
func (h *harness) ceiling(ctx context.Context, v Variant, run int, extra []string) (Trial, error) {
	n := h.o.N5
	stub, err := launch("stub engine", filepath.Join(h.o.BinDir, "stubengine"), []string{"-n", strconv.Itoa(n), "-topic", "bench"}, "",
		filepath.Join(h.o.LogDir, fmt.Sprintf("%03d-s5-stub-for-%s-run%d.log", h.seq+1, v.ID, run)))
	if err != nil {
		return Trial{}, err
	}
	defer func() { _, _ = stub.stop(stopGrace) }()
	f, err := stub.awaitLine(ctx, "LISTEN", 10*time.Second)
	if err != nil || len(f) != 2 {
		return Trial{}, fmt.Errorf("stub engine: %v %v", f, err)
	}
	url := "http://" + f[1] + "/engine-rest"
	path, args, dir := h.command(v, url, "bench", "noop", false, extra)
	p, err := launch(v.Label, path, args, dir, h.logPath(5, v, run))
	if err != nil {
		return Trial{}, err
	}
	defer func() { _, _ = p.stop(stopGrace) }()
	done, err := stub.awaitLine(ctx, "DONE", 2*time.Minute+time.Duration(n)*time.Millisecond)
	if err != nil {
		return Trial{}, err
	}
	nums := make([]int64, 0, 4)
	for _, s := range done[1:] {
		x, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return Trial{}, fmt.Errorf("stub engine: bad DONE line %v", done)
		}
		nums = append(nums, x)
	}
	if len(nums) != 4 {
		return Trial{}, fmt.Errorf("stub engine: bad DONE line %v", done)
	}
	u, err := p.stop(stopGrace)
	if err != nil {
		return Trial{}, fmt.Errorf("%w (log: %s)", err, p.logPath)
	}
	if p.state != nil && !p.state.Success() && p.state.ExitCode() != -1 {
		return Trial{}, fmt.Errorf("%s failed: %v (log: %s)", p.name, p.waitErr, p.logPath)
	}
	t := Trial{N: n, Wall: time.Duration(nums[1] - nums[0]), CPUTotal: u.CPU, PeakRSS: u.PeakRSS, Fetches: nums[2]}
	t.CPUWork = max(0, u.CPU-p.cpuAtFirst)
	if !p.firstAt.IsZero() {
		t.Startup = p.firstAt.Sub(p.launched)
	}
	if t.Wall > 0 {
		t.TPS = float64(n) / t.Wall.Seconds()
	}
	return t, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// percentile is the nearest-rank percentile of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(p/100*float64(len(s))+0.999999) - 1
	return s[min(max(rank, 0), len(s)-1)]
}
