package harness

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/testenv"
)

// TestSmoke runs the whole harness once with tiny counts for extworker (in scenario 4
// with and without the effect ledger on the test database), in scenario 5 the stub
// engine and the raw loop, in scenario 6 the raw loop on the real engine (one
// configuration of it), and in scenario 7 extworker holding every task in flight while
// their short locks are extended: the programs build, start, report over stdout, work every
// task off the real engine, stop, and the report and chart come out. The
// Java and JS workers need Maven and npm and are left to `make bench-smoke`. Nothing
// here asserts a speed: performance belongs to the benchmark, not to the tests.
func TestSmoke(t *testing.T) {
	c := testenv.Engine(t) // fails in CI, skips elsewhere, without an engine
	c.CloseIdleConnections()
	if testing.Short() && !testenv.InCI() { // in CI (CI=true) the smoke run always runs
		t.Skip("builds and runs worker processes")
	}
	out := t.TempDir()
	var progress bytes.Buffer
	// Each extworker worker waits for its pending long poll when it stops (up to 20s).
	res, err := Run(testenv.Context(t, 8*time.Minute), Options{
		EngineURL: testenv.EngineURL(), EngineDBURL: testenv.EngineDBURL(), LedgerDBURL: testenv.DBURL(),
		Runs: 1, Clients: []Client{Extworker},
		N1: 20, N2: 20, IOWait: 20 * time.Millisecond, LatencySamples: 3, LatencyWarmup: 2, N4: 20, N5: 500, N6: 20, RawConcurrency: []int{16},
		N7: 20, Hold7: 7 * time.Second, Lock7: 3 * time.Second,
		BinDir: t.TempDir(), OutDir: out, LogDir: t.TempDir(), Profile: true,
		Note: "smoke test", Progress: &progress,
	})
	t.Log(progress.String())
	require.NoError(t, err)

	for _, want := range []struct {
		scenario int
		id       string
	}{{1, "extworker"}, {2, "extworker"}, {3, "extworker"}, {4, "extworker"}, {4, "extworker-ledger"}, {5, "extworker"}, {5, "raw"}, {6, "extworker"}, {6, "raw-c16"}} {
		s := res.Find(want.scenario, want.id)
		require.NotNil(t, s, "scenario %d %s", want.scenario, want.id)
		require.Len(t, s.Trials, 1)
		tr := s.Trials[0]
		require.Positive(t, tr.N)
		require.Positive(t, tr.PeakRSS, "scenario %d %s: rusage read", want.scenario, want.id)
		if want.scenario == 3 {
			require.Len(t, tr.Latencies, 3)
		} else {
			require.Positive(t, tr.Wall)
			require.Positive(t, tr.TPS)
		}
	}
	require.Equal(t, int64(20), res.Find(4, "extworker-ledger").Trials[0].Intents, "one new intent per task")
	require.GreaterOrEqual(t, res.Find(6, "raw-c16").Trials[0].Fetches, int64(20), "the raw loop's REQUESTS line read")
	s7 := res.Find(7, "extworker")
	require.NotNil(t, s7, "scenario 7")
	require.Len(t, s7.Trials, 1)
	f := s7.Trials[0].InFlight
	require.NotNil(t, f)
	require.Equal(t, int64(20), f.MaxInFlight, "all held at once")
	require.Zero(t, f.Lost)
	require.GreaterOrEqual(t, f.Extended, int64(2*20), "every lock extended at least twice")
	require.Len(t, res.Profiles, 3)
	for _, p := range res.Profiles {
		require.Contains(t, p.Top, "flat%")
	}

	md, err := os.ReadFile(filepath.Join(out, "RESULTS.md"))
	require.NoError(t, err)
	for _, want := range []string{"## Goals", "## Scenario 1", "## Scenario 4", "| extworker, ledger |", "## Scenario 5", "| extworker |", "| raw HTTP loop |", "## Scenario 6", "| raw HTTP loop, 16 loops |", "raw HTTP loop's + 10% (scenario 6)", "## Scenario 7", "Camunda 7 engine", "PostgreSQL", "smoke test"} {
		require.Contains(t, string(md), want)
	}
	svg, err := os.ReadFile(filepath.Join(out, "scenarios.svg"))
	require.NoError(t, err)
	wellFormed(t, string(svg))
	require.True(t, strings.Contains(string(svg), "extworker"))
}
