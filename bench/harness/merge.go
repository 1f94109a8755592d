package harness

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Merge returns old with the scenarios fresh ran taken from fresh: their series, their
// profiles and their instance counts, the other scenarios kept as they were. It is for
// running one scenario again (benchrun -merge) without running the others; the note
// says which scenarios were merged in, when, and from which build.
func Merge(old, fresh *Results) *Results {
	m := *old
	rerun := fresh.Opts.Scenarios
	m.Series = nil
	for _, s := range old.Series {
		if !slices.Contains(rerun, s.Scenario) {
			m.Series = append(m.Series, s)
		}
	}
	m.Series = append(m.Series, fresh.Series...)
	slices.SortStableFunc(m.Series, func(a, b *Series) int { return a.Scenario - b.Scenario })
	m.Profiles = nil
	for _, p := range old.Profiles {
		if n, ok := profileScenario(p.Title); !ok || !slices.Contains(rerun, n) {
			m.Profiles = append(m.Profiles, p)
		}
	}
	m.Profiles = append(m.Profiles, fresh.Profiles...)
	o, f := &m.Opts, fresh.Opts
	for _, s := range rerun {
		switch s {
		case 1:
			o.N1 = f.N1
		case 2:
			o.N2, o.IOWait = f.N2, f.IOWait
		case 3:
			o.LatencySamples, o.LatencyWarmup = f.LatencySamples, f.LatencyWarmup
		case 4:
			o.N4, o.LedgerDBURL = f.N4, f.LedgerDBURL
		case 5:
			o.N5 = f.N5
		case 6:
			o.N6, o.RawConcurrency = f.N6, f.RawConcurrency
		case 7:
			o.N7, o.Hold7, o.Lock7 = f.N7, f.Hold7, f.Lock7
		}
		if !slices.Contains(o.Scenarios, s) {
			o.Scenarios = append(o.Scenarios, s)
		}
	}
	slices.Sort(o.Scenarios)
	for _, v := range fresh.Versions {
		if !slices.ContainsFunc(m.Versions, func(x [2]string) bool { return x[0] == v[0] }) {
			m.Versions = append(m.Versions, v)
		}
	}
	names := make([]string, len(rerun))
	for i, s := range rerun {
		names[i] = strconv.Itoa(s)
	}
	build := ""
	for _, v := range fresh.Versions {
		if v[0] == "extworker" {
			build = ", extworker " + v[1]
		}
	}
	note := fmt.Sprintf("Scenario %s ran separately on %s (%d runs%s) and was merged into these results; everything else is from the run above.",
		strings.Join(names, ", "), fresh.Started.UTC().Format("2006-01-02 15:04 MST"), fresh.Opts.Runs, build)
	if o.Note != "" {
		note = o.Note + " " + note
	}
	o.Note = note
	return &m
}

// profileScenario reads the scenario number from a profile title ("Scenario 4 (…").
func profileScenario(title string) (int, bool) {
	rest, ok := strings.CutPrefix(title, "Scenario ")
	if !ok {
		return 0, false
	}
	digits, _, _ := strings.Cut(rest, " ")
	n, err := strconv.Atoi(digits)
	return n, err == nil
}
