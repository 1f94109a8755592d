package harness

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Scenario 6, the engine's ceiling: the engine's own limit as a yardstick. At saturation
// (all instances exist before the worker starts, no-op handler, as in scenario 1),
// extworker with its defaults takes turns with the raw HTTP loop (bench/cmd/rawloop,
// one fetchAndLock of one task and one complete per task) against the real engine, with
// as many loops as each of Options.RawConcurrency says. The raw loop that serves the
// most tasks per second is the yardstick: what the engine serves to a client that does
// nothing but fetch and complete. Reported: extworker's tasks/s as a fraction of the
// yardstick's, and the engine's and PostgreSQL's CPU per task under each, whose ratio
// has a goal: our polling and extension traffic may cost the engine at most 10 % more
// per task than the raw loop's.

// DefaultRawConcurrency is scenario 6's raw loops by default.
var DefaultRawConcurrency = []int{4, 16}

// engineCeilingGoal is the most engine + PostgreSQL CPU per task extworker may cost,
// as a multiple of the raw loop's.
const engineCeilingGoal = 1.10

// rawEngineVariant is the raw loop with n loops against the real engine.
func rawEngineVariant(n int) Variant {
	return Variant{Client: Raw, ID: fmt.Sprintf("raw-c%d", n), Label: fmt.Sprintf("raw HTTP loop, %d loops", n), Short: fmt.Sprintf("raw c%d", n),
		Config: fmt.Sprintf("%d goroutines, each: fetchAndLock maxTasks 1 (no long polling), then complete; a fetch that comes back empty (another loop's fetch locked the task first) is sent again at once; net/http and encoding/json only", n),
		flags:  []string{"-concurrency", strconv.Itoa(n)}}
}

// engineCeilingRun is one run of scenario 6. The order alternates from run to run
// (extworker first in odd runs, last in even ones), so that neither side always runs
// on an engine just warmed, or just tired, by the other.
func (h *harness) engineCeilingRun(ctx context.Context, ext Variant, run int) error {
	vs := []Variant{ext}
	for _, c := range h.o.RawConcurrency {
		vs = append(vs, rawEngineVariant(c))
	}
	if run%2 == 0 {
		slices.Reverse(vs)
	}
	for _, v := range vs {
		if err := h.trial(ctx, 6, v, run, func() (Trial, error) { return h.engineCeilingTrial(ctx, v, run) }); err != nil {
			return err
		}
	}
	return nil
}

// engineCeilingTrial is scenario 1's trial on Options.N6 instances. The raw loop is told
// how many tasks there are: against the real engine a fetch also comes back empty when
// a concurrent fetch locked the same task first, so an empty fetch does not mean done.
func (h *harness) engineCeilingTrial(ctx context.Context, v Variant, run int) (Trial, error) {
	n := h.o.N6
	if v.Client != Raw {
		return h.throughput(ctx, 6, v, run, n, "noop", nil)
	}
	var empty, failed int64
	t, err := h.throughputThen(ctx, 6, v, run, n, "noop", []string{"-tasks", strconv.Itoa(n)}, func(p *proc) {
		if f := p.final("REQUESTS"); len(f) >= 4 {
			empty, _ = strconv.ParseInt(f[2], 10, 64)
			failed, _ = strconv.ParseInt(f[3], 10, 64)
		}
	})
	t.EmptyFetches, t.FailedFetches = empty, failed
	return t, err
}

// yardstick is scenario 6's raw loop with the highest median tasks/s, or nil.
func yardstick(r *Results) *Series {
	var best *Series
	for _, s := range r.scenario(6) {
		if s.Variant.Client == Raw && (best == nil || s.of(tps).med > best.of(tps).med) {
			best = s
		}
	}
	return best
}

// ceilingRatios pairs scenario 6's extworker trials with the yardstick's by run:
// extworker's tasks/s as a fraction of the raw loop's, and its engine + PostgreSQL CPU
// per task as a multiple of the raw loop's.
func ceilingRatios(r *Results) (fraction, cpu summary, raw *Series, ok bool) {
	ext, raw := r.Find(6, "extworker"), yardstick(r)
	if ext == nil || raw == nil {
		return summary{}, summary{}, nil, false
	}
	var fs, cs []float64
	for _, a := range ext.Trials {
		for _, b := range raw.Trials {
			if a.Run != b.Run || b.TPS <= 0 {
				continue
			}
			fs = append(fs, a.TPS/b.TPS)
			if e := enginePT(b); e > 0 {
				cs = append(cs, enginePT(a)/e)
			}
		}
	}
	if len(fs) == 0 {
		return summary{}, summary{}, nil, false
	}
	return summarize(fs), summarize(cs), raw, true
}

// writeEngineCeilingGoal adds scenario 6's goal to the goals table.
func writeEngineCeilingGoal(b *strings.Builder, r *Results) {
	const goal = "Engine + PostgreSQL CPU per task at most the raw HTTP loop's + 10% (scenario 6)"
	fraction, cpu, raw, ok := ceilingRatios(r)
	if !ok || cpu.n == 0 {
		fmt.Fprintf(b, "| %s | not measured in this run | – |\n", goal)
		return
	}
	met := "no"
	if cpu.med <= engineCeilingGoal {
		met = "**yes**"
	}
	fmt.Fprintf(b, "| %s | %.2f× (%s vs %s ms; paired by run; extworker's tasks/s %.2f of the raw loop's) | %s |\n", goal, cpu.med,
		num(r.Find(6, "extworker").of(enginePT).med), num(raw.of(enginePT).med), fraction.med, met)
}

// writeEngineCeiling renders scenario 6.
func writeEngineCeiling(b *strings.Builder, r *Results) {
	ss := r.scenario(6)
	if len(ss) == 0 {
		return
	}
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## Scenario 6: the engine's ceiling, no-op handler, %d instances\n\n", r.Opts.N6)
	w("extworker with its defaults and the raw HTTP loop (`bench/cmd/rawloop`: fetchAndLock one task, complete it, nothing else) against the real engine at saturation: all instances exist before the worker starts, as in scenario 1. They took turns in every run, extworker first in odd runs and last in even ones. The raw loop that served the most tasks per second is the yardstick: what this engine, on this machine, serves to a client that does nothing but fetch and complete.\n\n")
	w("| worker | tasks/s | engine + PostgreSQL CPU ms per task | worker CPU ms per task | fetches per task | empty fetches per task | failed requests, sent again |\n|---|---|---|---|---|---|---|\n")
	for _, s := range ss {
		empty, failed := "–", "–"
		if s.Variant.Client == Raw {
			empty = s.of(func(t Trial) float64 { return float64(t.EmptyFetches) / float64(t.N) }).String()
			failed = s.of(func(t Trial) float64 { return float64(t.FailedFetches) }).String()
		}
		w("| %s | %s | %s | %s | %s | %s | %s |\n", s.Variant.Label, s.of(tps), s.of(enginePT), s.of(cpuPerMs), s.known(fetchesPT), empty, failed)
	}
	fraction, cpu, raw, ok := ceilingRatios(r)
	if !ok {
		w("\n")
		return
	}
	w("\nextworker against the yardstick (%s), paired run by run, median (min–max) over %d runs:\n\n", raw.Variant.Label, fraction.n)
	w("| | median (min–max) |\n|---|---|\n")
	w("| extworker's tasks/s as a fraction of the raw loop's | %s |\n", fraction)
	w("| engine + PostgreSQL CPU per task, extworker's as a multiple of the raw loop's (goal: at most %.2f) | %s |\n\n", engineCeilingGoal, cpu)
}

// engineCPU samples what the engine costs for a trial of scenario: everywhere but in
// scenario 6 the engine's process and every PostgreSQL process (scenario 4's ledger
// lives in another database of the same cluster, and its cost is part of the measure).
// Scenario 6 compares the engine's cost under two clients, which the backends of other
// databases in the cluster (other work on a shared machine) only blur, so it counts the
// engine's process, the backends of the engine's database and the cluster's own
// processes (WAL writer, checkpointer, background writer, launchers), whose work is
// shared.
func (h *harness) engineCPU(scenario int) cpuSample {
	db := databaseName(h.o.EngineDBURL)
	s := sampleEngineCPU(h.o.EnginePID)
	if scenario != 6 || db == "" {
		return s
	}
	for pid := range s {
		if pid == h.o.EnginePID {
			continue
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil {
			continue // gone; since leaves out what it spent either way
		}
		if other, ok := postgresDatabase(string(b)); ok && other != db {
			delete(s, pid)
		}
	}
	return s
}

// databaseName is the database of a postgres:// URL, or "".
func databaseName(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(u.Path, "/")
}

// postgresDatabase reads the database a PostgreSQL process works for from its title
// (its /proc cmdline): "postgres: 15/main: user db 127.0.0.1(5432) idle" for a backend,
// "postgres: 15/main: autovacuum worker db" for an autovacuum worker. The postmaster and
// the cluster's background processes work for no database: ok is false.
func postgresDatabase(cmdline string) (db string, ok bool) {
	rest, found := strings.CutPrefix(strings.TrimRight(strings.ReplaceAll(cmdline, "\x00", " "), " "), "postgres: ")
	if !found {
		return "", false
	}
	f := strings.Fields(rest)
	if len(f) > 0 && strings.HasSuffix(f[0], ":") { // cluster_name, when set
		f = f[1:]
	}
	switch {
	case len(f) >= 3 && f[0] == "autovacuum" && f[1] == "worker":
		return f[2], true
	case len(f) >= 3 && (strings.Contains(f[2], "(") || f[2] == "[local]"):
		return f[1], true
	}
	return "", false
}
