package harness

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The yardstick is the raw loop that served the most (16 loops here, at 92 tasks/s), and
// extworker is compared with it run by run, not with the raw loop that cost the engine
// least per task (64 loops).
func TestEngineCeilingAgainstTheFastestRawLoop(t *testing.T) {
	r := fakeResults()
	require.Equal(t, "raw-c16", yardstick(r).Variant.ID)
	md := Markdown(r)
	for _, want := range []string{
		"## Scenario 6: the engine's ceiling, no-op handler, 2000 instances",
		"| raw HTTP loop, 16 loops | 92.0 (91.0–93.0) | 20.0 (20.0–20.0) | 0.50 (0.50–0.50) | 1.10 (1.10–1.10) | 0.10 (0.10–0.10) | 0.00 (0.00–0.00) |",
		"| extworker | 100 (100–100) | 18.0 (18.0–18.0) | 0.60 (0.60–0.60) | 0.18 (0.18–0.18) | – | – |",
		"extworker against the yardstick (raw HTTP loop, 16 loops), paired run by run, median (min–max) over 3 runs",
		"| extworker's tasks/s as a fraction of the raw loop's | 1.09 (1.08–1.10) |",
		"(goal: at most 1.10) | 0.90 (0.90–0.90) |",
		"| Engine + PostgreSQL CPU per task at most the raw HTTP loop's + 10% (scenario 6) | 0.90× (18.0 vs 20.0 ms; paired by run; extworker's tasks/s 1.09 of the raw loop's) | **yes** |",
		"scenario 6: 2000; scenario 7: ", // scenario 7 follows in the instances row
	} {
		require.Contains(t, md, want)
	}

	// Over the goal: the engine spends 12 % more per task under extworker.
	for i := range r.Find(6, "extworker").Trials {
		r.Find(6, "extworker").Trials[i].EngineCPU = 6720 * 1e6
	}
	require.Contains(t, Markdown(r), "(scenario 6) | 1.12× (22.4 vs 20.0 ms; paired by run; extworker's tasks/s 1.09 of the raw loop's) | no |")

	// Results without scenario 6 (older results.json files) render without it.
	r.Series = r.Series[:len(r.Series)-9]
	r.Opts.N6 = 0
	md = Markdown(r)
	require.NotContains(t, md, "## Scenario 6")
	require.NotContains(t, md, "scenario 6: ")
	require.Contains(t, md, "(scenario 6) | not measured in this run | – |")
}

func TestPostgresDatabase(t *testing.T) {
	for _, c := range []struct {
		title, db string
		ok        bool
	}{
		{"postgres: 15/main: camunda camunda 127.0.0.1(39830) idle\x00\x00", "camunda", true},
		{"postgres: 15/main: extworker extworker_scale 127.0.0.1(37316) INSERT", "extworker_scale", true},
		{"postgres: camunda camunda [local] SELECT", "camunda", true},
		{"postgres: 15/main: autovacuum worker camunda", "camunda", true},
		{"postgres: 15/main: walwriter", "", false},
		{"postgres: 15/main: autovacuum launcher", "", false},
		{"/usr/lib/postgresql/15/bin/postgres\x00-D\x00/var/lib/postgresql/15/main", "", false},
	} {
		db, ok := postgresDatabase(c.title)
		require.Equal(t, c.ok, ok, c.title)
		require.Equal(t, c.db, db, c.title)
	}
	require.Equal(t, "camunda", databaseName("postgres://camunda:camunda@127.0.0.1:5432/camunda"))
	require.Empty(t, databaseName(""))
}
