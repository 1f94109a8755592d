package harness

import (
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPercentile(t *testing.T) {
	ds := []time.Duration{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0, 1}, {10, 1}, {50, 5}, {51, 6}, {90, 9}, {99, 10}, {100, 10}} {
		require.Equal(t, c.want, percentile(ds, c.p), "p%v", c.p)
	}
	require.Zero(t, percentile(nil, 50))
	require.Equal(t, []time.Duration{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}, ds, "percentile must not reorder its input")
}

func TestSummarize(t *testing.T) {
	require.Equal(t, summary{med: 3, lo: 1, hi: 9, n: 5}, summarize([]float64{9, 1, 3, 2, 4}))
	require.Equal(t, summary{med: 2.5, lo: 1, hi: 4, n: 4}, summarize([]float64{4, 1, 2, 3}))
	require.Equal(t, "–", summarize(nil).String())
	require.Equal(t, "7.00", summarize([]float64{7}).String())
	require.Equal(t, "123 (1.50–4567)", summary{med: 123.4, lo: 1.5, hi: 4567, n: 3}.String())
}

func TestNiceScale(t *testing.T) {
	for _, top := range []float64{0, 0.004, 0.9, 1, 7, 12.5, 99, 100, 101, 4567, 1e6} {
		step, ymax := niceScale(top)
		require.Positive(t, step, "top %v", top)
		require.GreaterOrEqual(t, ymax, top, "top %v", top)
		require.LessOrEqual(t, ymax/step, 12.0, "top %v: too many ticks", top)
	}
}

// fakeResults has every scenario and variant, so the report and chart render all paths.
func fakeResults() *Results {
	o := Options{OutDir: "x"}.WithDefaults()
	ext, javaDef, javaBest, jsDef, jsBest, raw := variants(o)
	noLedger, withLedger := ledgerVariants(ext)
	r := &Results{Opts: o, Started: time.Unix(1700000000, 0), Finished: time.Unix(1700000600, 0),
		Versions: [][2]string{{"Camunda 7 engine", "7.24.0 (http://127.0.0.1:8080/engine-rest)"}, {"Java client", "7.24.0"}}, Machine: "test machine"}
	for run := 1; run <= 3; run++ {
		f := float64(run)
		r.add(1, ext, Trial{Run: run, N: 300, Wall: time.Duration(3+f) * time.Second, TPS: 100 - f, CPUTotal: 200 * time.Millisecond, CPUWork: 190 * time.Millisecond, PeakRSS: 16 << 20, EngineCPU: 5 * time.Second})
		r.add(1, javaBest, Trial{Run: run, N: 300, Wall: 6 * time.Second, TPS: 50 + f, CPUTotal: 3 * time.Second, CPUWork: time.Second, PeakRSS: 90 << 20, Startup: time.Second})
		r.add(1, jsBest, Trial{Run: run, N: 300, Wall: 3 * time.Second, TPS: 99, CPUTotal: time.Second, PeakRSS: 80 << 20})
		for _, v := range []Variant{ext, javaDef, javaBest, jsDef, jsBest} {
			t := Trial{Run: run, N: 200, Wall: time.Duration(2+len(v.ID)) * time.Second, TPS: 50}
			if v.ID == ext.ID {
				// 16 slots for 2.5 s, 200 tasks: 200 ms of slot time each, 50 handler + 100 complete + 40 free + 10 other.
				t.Slots = &SlotUse{Max: 16, Window: 2500 * time.Millisecond, Free: 8 * time.Second, Complete: 20 * time.Second,
					Polls: 40, Polled: 200, PollTime: 2 * time.Second}
			}
			r.add(2, v, t)
		}
		for _, v := range []Variant{ext, javaBest, jsBest} {
			lat := []time.Duration{8 * time.Millisecond, 9 * time.Millisecond, 30 * time.Millisecond}
			r.add(3, v, Trial{Run: run, N: 3, Latencies: lat, P50: 9 * time.Millisecond, P99: 30 * time.Millisecond})
		}
		r.add(4, noLedger, Trial{Run: run, N: 300, Wall: 3750 * time.Millisecond, TPS: 80, CPUWork: 180 * time.Millisecond, PeakRSS: 14 << 20, EngineCPU: 6 * time.Second})
		r.add(4, withLedger, Trial{Run: run, N: 300, Wall: 4 * time.Second, TPS: 80 * (1 - 0.05*f), CPUWork: 300 * time.Millisecond, PeakRSS: 18 << 20, EngineCPU: 9 * time.Second, Intents: 300})
		r.add(5, ext, Trial{Run: run, N: 20000, Wall: 4 * time.Second, TPS: 5000, CPUWork: 3800 * time.Millisecond, Fetches: 3400, PeakRSS: 16 << 20})
		r.add(5, raw, Trial{Run: run, N: 20000, Wall: 3 * time.Second, TPS: 6000, CPUWork: 3200 * time.Millisecond, Fetches: 20000, PeakRSS: 15 << 20})
		r.add(6, ext, Trial{Run: run, N: 300, Wall: 3 * time.Second, TPS: 100, CPUWork: 180 * time.Millisecond, EngineCPU: 5400 * time.Millisecond, Fetches: 54})
		r.add(6, rawEngineVariant(16), Trial{Run: run, N: 300, Wall: 3 * time.Second, TPS: 90 + f, CPUWork: 150 * time.Millisecond, EngineCPU: 6 * time.Second, Fetches: 330, EmptyFetches: 30})
		r.add(6, rawEngineVariant(64), Trial{Run: run, N: 300, Wall: 3 * time.Second, TPS: 80, CPUWork: 150 * time.Millisecond, EngineCPU: 4500 * time.Millisecond, Fetches: 600, EmptyFetches: 300})
	}
	r.add(7, ext, Trial{Run: 1, N: 10000, Wall: 400 * time.Second, TPS: 25, CPUTotal: 30 * time.Second, PeakRSS: 140 << 20,
		InFlight: &InFlight{Lock: 4 * time.Minute, Hold: 170 * time.Second, MaxInFlight: 10000, HeldRSS: 118 << 20, StartInstances: 90 * time.Second,
			Extended: 25000, ExtendFailed: 12, Sent: 25012, LateP50: 0, LateP99: 1500 * time.Millisecond, LateMax: 3 * time.Second,
			Answered: 25000, Rate: 140, Busiest: 410, Latency: 30 * time.Millisecond}})
	r.Profiles = []Profile{{Title: "Scenario 5", Top: "flat flat% ..."}}
	return r
}

func TestMarkdownHasEveryScenarioAndGoal(t *testing.T) {
	md := Markdown(fakeResults())
	for _, want := range []string{
		"## Goals", "## Scenario 1", "## Scenario 2", "## Scenario 3", "## Scenario 4", "## Scenario 5", "## Profiles",
		"| extworker, no ledger | 80.0 (80.0–80.0) | 0.60 (0.60–0.60) |", "| extworker, ledger | 72.0 (68.0–76.0) | 1.00 (1.00–1.00) |",
		"| throughput lost, % of no-op tasks/s | 10.0 (5.0–15.0) |", "| worker CPU per task, % more | 66.7 (66.7–66.7) |",
		"| engine + PostgreSQL CPU per task, ms more | 10.0 (10.0–10.0) |",
		"Effect ledger costs under 15% of no-op throughput (scenario 4) | 10.0% (72.0 vs 80.0 tasks/s; paired by run) | **yes** |",
		"Java client, maxTasks 200", "JS client, maxParallelExecutions 16", "raw HTTP loop",
		"| extworker | 98.0 (97.0–99.0) |", // scenario 1 tasks/s: median and range
		"Scenario 1 throughput at least the best-configured Java client's | 98.0 vs 52.0 tasks/s (1.88×) | **yes** |",
		"CPU per task within 2 times the raw HTTP loop's (scenario 5) | 190 µs vs 160 µs (1.19×) | **yes** |",
		"Pickup p50 under 50 ms | 9.00 ms | **yes** |",
		"| extworker | 200 (200–200) | 50.0 | 100 (100–100) | 40.0 (40.0–40.0) | 10.0 (10.0–10.0) | 5.00 (5.00–5.00) | 50.0 (50.0–50.0) | 80.0 (80.0–80.0) |",
		"scenarios.svg",
		"## Scenario 7: 10000 tasks in flight, each held 2m50s with a 4m0s lock kept alive",
		"; scenario 7: 10000 in flight, held 2m50s each, lock 4m0s |",
		"| extworker | 10000 | 118 | 140 | 0 | 25000 (12) | 0 / 1500 / 3000 | 140 (410) | 30.0 | 30.0 | 400 |",
	} {
		require.Contains(t, md, want)
	}
	require.NotContains(t, md, "not measured in this run")
	require.NotContains(t, md, "pending")
}

func TestMergeReplacesOnlyTheScenariosRunAgain(t *testing.T) {
	old := fakeResults()
	old.Opts.Note = "first run"
	old.Profiles = append(old.Profiles, Profile{Title: "Scenario 4 (old)", Top: "old"})
	fresh := &Results{Opts: Options{OutDir: "x", Scenarios: []int{4}, Runs: 2, N4: 123}.WithDefaults(), Started: time.Unix(1800000000, 0),
		Versions: [][2]string{{"extworker", "commit abc"}, {"PostgreSQL (ledger database, scenario 4)", "15"}}}
	ext, _, _, _, _, _ := variants(fresh.Opts)
	noLedger, withLedger := ledgerVariants(ext)
	for run := 1; run <= 2; run++ {
		fresh.add(4, noLedger, Trial{Run: run, N: 123, TPS: 100, CPUWork: time.Second})
		fresh.add(4, withLedger, Trial{Run: run, N: 123, TPS: 50, CPUWork: 2 * time.Second})
	}
	fresh.Profiles = []Profile{{Title: "Scenario 4 (new)", Top: "new"}}
	m := Merge(old, fresh)
	require.Len(t, m.Find(4, "extworker-ledger").Trials, 2)
	require.Len(t, m.Find(1, "extworker").Trials, 3, "other scenarios kept")
	require.Equal(t, 123, m.Opts.N4)
	require.Equal(t, old.Opts.N1, m.Opts.N1)
	require.Equal(t, []Profile{{Title: "Scenario 5", Top: "flat flat% ..."}, {Title: "Scenario 4 (new)", Top: "new"}}, m.Profiles)
	require.Contains(t, m.Opts.Note, "first run Scenario 4 ran separately on 2027-01-15")
	require.Contains(t, m.Versions, [2]string{"PostgreSQL (ledger database, scenario 4)", "15"})
	md := Markdown(m)
	require.Contains(t, md, "Effect ledger costs under 15% of no-op throughput (scenario 4) | 50.0% (50.0 vs 100 tasks/s; paired by run) | no |")
	require.Contains(t, md, "## Scenario 1")
	require.Len(t, old.Find(4, "extworker-ledger").Trials, 3, "old left alone")
}

// Scenario 7 run alone (once, extworker only) and merged into results from before it
// existed brings its options along and renders beside the old scenarios.
func TestMergeScenario7IntoOlderResults(t *testing.T) {
	old := fakeResults()
	old.Series = slices.DeleteFunc(old.Series, func(s *Series) bool { return s.Scenario == 7 })
	old.Opts.Scenarios, old.Opts.N7, old.Opts.Hold7, old.Opts.Lock7 = []int{1, 2, 3, 4, 5, 6}, 0, 0, 0
	require.NotContains(t, Markdown(old), "scenario 7")
	fresh := &Results{Opts: Options{OutDir: "x", Scenarios: []int{7}, Clients: []Client{Extworker}, Runs: 1, N7: 500, Hold7: time.Minute, Lock7: 30 * time.Second}.WithDefaults(),
		Started: time.Unix(1800000000, 0)}
	ext, _, _, _, _, _ := variants(fresh.Opts)
	fresh.add(7, ext, Trial{Run: 1, N: 500, Wall: 90 * time.Second, TPS: 5.6, PeakRSS: 30 << 20,
		InFlight: &InFlight{Lock: 30 * time.Second, Hold: time.Minute, MaxInFlight: 500, HeldRSS: 25 << 20, Extended: 1500}})
	m := Merge(old, fresh)
	require.Equal(t, []int{1, 2, 3, 4, 5, 6, 7}, m.Opts.Scenarios)
	require.Equal(t, 500, m.Opts.N7)
	require.Equal(t, time.Minute, m.Opts.Hold7)
	require.Equal(t, 30*time.Second, m.Opts.Lock7)
	require.Len(t, m.Find(6, "extworker").Trials, 3, "scenario 6 kept")
	md := Markdown(m)
	require.Contains(t, md, "scenario 6: 2000; scenario 7: 500 in flight, held 1m0s each, lock 30s |")
	require.Contains(t, md, "## Scenario 6: the engine's ceiling")
	require.Contains(t, md, "## Scenario 7: 500 tasks in flight, each held 1m0s with a 30s lock kept alive")
	require.Contains(t, m.Opts.Note, "Scenario 7 ran separately")
}

func TestMarkdownWithOnlyExtworker(t *testing.T) {
	r := fakeResults()
	var keep []*Series
	for _, s := range r.Series {
		if s.Variant.Client == Extworker || s.Variant.Client == Raw {
			keep = append(keep, s)
		}
	}
	r.Series = keep
	md := Markdown(r)
	require.Contains(t, md, "not measured in this run")
	require.Contains(t, md, "Pickup p50 under 50 ms | 9.00 ms | **yes** |")
}

// wellFormed parses s as XML to its end.
func wellFormed(t *testing.T, s string) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(s))
	for {
		_, err := d.Token()
		if errors.Is(err, io.EOF) {
			return
		}
		require.NoError(t, err)
	}
}

func TestChartIsWellFormedSVG(t *testing.T) {
	svg := Chart(fakeResults())
	wellFormed(t, svg)
	require.True(t, strings.HasPrefix(svg, "<svg "))
	for _, want := range []string{"tasks per second", "wall time", "pickup latency", ">Java<", ">best<", ">default<", "p99"} {
		require.Contains(t, svg, want)
	}
	wellFormed(t, Chart(&Results{Opts: Options{}.WithDefaults()})) // no data at all
}

func TestWriteReportKeepsHandWrittenNotes(t *testing.T) {
	dir := t.TempDir()
	r := fakeResults()
	require.NoError(t, WriteReport(r, dir))
	path := filepath.Join(dir, "RESULTS.md")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(b), NotesMarker+"\n## Findings\n\n(none yet)\n")

	notes := "\n## Findings\n\nThe time goes to the engine.\n"
	gen, _, _ := strings.Cut(string(b), NotesMarker)
	require.NoError(t, os.WriteFile(path, []byte(gen+NotesMarker+notes), 0o644))
	r.Opts.Note = "second run"
	require.NoError(t, WriteReport(r, dir))
	b, err = os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(b), "**Note:** second run")
	require.True(t, strings.HasSuffix(string(b), NotesMarker+notes), "notes kept verbatim at the end")
	require.Equal(t, 1, strings.Count(string(b), NotesMarker))
	_, err = os.Stat(filepath.Join(dir, "scenarios.svg"))
	require.NoError(t, err)

	back, err := ReadResults(filepath.Join(dir, "results.json"))
	require.NoError(t, err)
	require.Equal(t, Markdown(r), Markdown(back), "the report renders the same from results.json")
}

func TestOptionsValidate(t *testing.T) {
	err := Options{Runs: -1, Scenarios: []int{8}, Clients: []Client{"go"}, N1: -1, RawConcurrency: []int{0}, Lock7: time.Millisecond}.WithDefaults().Validate()
	require.Error(t, err)
	for _, want := range []string{"OutDir", "Runs -1", "Scenarios: 8", `Clients: "go"`, "N1 -1", "RawConcurrency 0", "Lock7 1ms"} {
		require.Contains(t, err.Error(), want)
	}
	require.NoError(t, Options{OutDir: "x"}.WithDefaults().Validate())
}
