package soak

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/failpoint"
)

// The invoices: one in twenty (the fifth of each twenty) declined by amount, the others
// charged an amount from the seed; the same seed plans the same invoices.
func TestPlanInvoices(t *testing.T) {
	plan := planInvoices(rand.New(rand.NewPCG(42, 7)), "SOAK-42-1", 60)
	require.Len(t, plan, 60)
	declined := 0
	for i, inv := range plan {
		assert.Equal(t, "SOAK-42-1-"+leftPad(i), inv.id)
		assert.Equal(t, i%20 == 4, inv.declined, "invoice %d", i)
		if inv.declined {
			declined++
			assert.Greater(t, inv.amount, int64(declineAbove), "a decline is planted by amount")
		} else {
			assert.GreaterOrEqual(t, inv.amount, int64(1000))
			assert.Less(t, inv.amount, int64(6000))
		}
	}
	assert.Equal(t, 3, declined)
	assert.Equal(t, plan, planInvoices(rand.New(rand.NewPCG(42, 7)), "SOAK-42-1", 60), "seeded")
	assert.NotEqual(t, plan, planInvoices(rand.New(rand.NewPCG(43, 7)), "SOAK-42-1", 60), "another seed, other amounts")
}

func leftPad(i int) string {
	s := strconv.Itoa(i)
	return strings.Repeat("0", 5-len(s)) + s
}

// The starts spread over a fifth more than the kill phase, which lasts the kills asked
// for at the mean pace.
func TestStartPacing(t *testing.T) {
	for _, c := range []struct {
		name             string
		minKills         int
		killEvery        time.Duration
		instances        int
		phase, everyWant time.Duration
	}{
		{"soak-short", 25, 2 * time.Second, 1000, 50 * time.Second, 60 * time.Millisecond},
		{"soak-defaults", 10, 10 * time.Second, 300, 100 * time.Second, 400 * time.Millisecond},
		{"no instances", 3, 2 * time.Second, 0, 6 * time.Second, 7200 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			phase, every := startPacing(c.minKills, c.killEvery, c.instances)
			assert.Equal(t, c.phase, phase)
			assert.Equal(t, c.everyWant, every)
		})
	}
}

// No failpoint on a worker's first start nor while the run drains (and no draw from the
// generator then: the rest of the schedule stays the same); about every second restart
// carries one, at a hit from 1 to 10, the points taking turns so that none is armed more
// than once more than another; the same seed gives the same failpoints.
func TestCrashSchedule(t *testing.T) {
	for _, events := range []bool{false, true} {
		t.Run("events="+strconv.FormatBool(events), func(t *testing.T) {
			points := crashPoints(events)
			if events {
				assert.Len(t, points, 10)
				assert.Contains(t, points, failpoint.InboxAfterAck)
			} else {
				assert.Len(t, points, 6)
				assert.NotContains(t, points, failpoint.OutboxBeforePublish)
			}
			s := newCrashSchedule(rand.New(rand.NewPCG(42, 43)), points)
			again := newCrashSchedule(rand.New(rand.NewPCG(42, 43)), points)
			armed := map[string]int{}
			restarts, carried := 0, 0
			for i := range 1000 {
				gen := i % 4 // every fourth start is a slot's first
				if i%7 == 0 {
					assert.Empty(t, s.next(gen, true), "draining")
				}
				got := s.next(gen, false)
				assert.Equal(t, again.next(gen, false), got, "seeded, and no draw while draining")
				if gen == 0 {
					assert.Empty(t, got, "a first start carries no failpoint")
					continue
				}
				restarts++
				if got == "" {
					continue
				}
				carried++
				name, hit, ok := strings.Cut(got, "@")
				require.True(t, ok, got)
				n, err := strconv.Atoi(hit)
				require.NoError(t, err)
				assert.True(t, n >= 1 && n <= 10, "hit %d", n)
				armed[name]++
				lo, hi := 1<<30, 0
				for _, p := range points {
					lo, hi = min(lo, armed[p]), max(hi, armed[p])
				}
				assert.LessOrEqual(t, hi-lo, 1, "the points take turns: %v", armed)
			}
			assert.InDelta(t, 0.5, float64(carried)/float64(restarts), 0.07, "about every second restart")
		})
	}
}

// A worker's end counts as a failpoint kill only when it carried a failpoint, died of
// SIGKILL, and the killer was not the one to send it.
func TestFailpointKill(t *testing.T) {
	for _, c := range []struct {
		name                string
		point               string
		sigkilled, byKiller bool
		want                string
		ok                  bool
	}{
		{"killed at its failpoint", "after-confirm@3", true, false, "after-confirm", true},
		{"the killer got there first", "after-confirm@3", true, true, "", false},
		{"no failpoint", "", true, false, "", false},
		{"exited otherwise", "after-confirm@3", false, false, "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			name, ok := failpointKill(c.point, c.sigkilled, c.byKiller)
			assert.Equal(t, c.ok, ok)
			assert.Equal(t, c.want, name)
		})
	}
}

// The restart jitter is under half a second, and the same for the same seed, generation
// and slot.
func TestRestartJitter(t *testing.T) {
	seen := map[time.Duration]bool{}
	for gen := range 50 {
		for slot := range 3 {
			d := restartJitter(42, gen, slot)
			assert.True(t, d >= 0 && d < 500*time.Millisecond, "%v", d)
			assert.Equal(t, d, restartJitter(42, gen, slot))
			seen[d] = true
		}
	}
	assert.Greater(t, len(seen), 50, "it varies")
}

// The service restarts fall evenly over the kills asked for: walking the kills one by
// one, each restart fires at the kill count its share says, the engine's between the
// others.
func TestRestartsDue(t *testing.T) {
	for _, c := range []struct {
		name     string
		minKills int
		want     restartCounts
		at       map[string][]int // the kill counts at which each service restarts
	}{
		{"soak-short: 1 PostgreSQL, 2 broker", 25, restartCounts{PG: 1, Broker: 2},
			map[string][]int{"pg": {12}, "broker": {8, 16}}},
		{"soak-defaults: 1 PostgreSQL, 1 broker", 10, restartCounts{PG: 1, Broker: 1},
			map[string][]int{"pg": {5}, "broker": {5}}},
		{"soak: 2 PostgreSQL, 1 engine, 3 broker", 118, restartCounts{PG: 2, Engine: 1, Broker: 3},
			map[string][]int{"pg": {39, 78}, "engine": {29}, "broker": {29, 59, 88}}},
		{"the small soak: 1 broker in 3 kills", 3, restartCounts{Broker: 1},
			map[string][]int{"broker": {1}}},
		{"none asked", 25, restartCounts{}, map[string][]int{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var done restartCounts
			got := map[string][]int{}
			for kills := 0; kills <= c.minKills+10; kills++ {
				due := restartsDue(done, c.want, kills, c.minKills)
				if due.PG {
					done.PG++
					got["pg"] = append(got["pg"], kills)
				}
				if due.Engine {
					done.Engine++
					got["engine"] = append(got["engine"], kills)
				}
				if due.Broker {
					done.Broker++
					got["broker"] = append(got["broker"], kills)
				}
			}
			assert.Equal(t, c.at, got)
			assert.Equal(t, c.want, done, "every restart asked for happens within the kills")
		})
	}
}

// The killer stops once everything has started, the windows are over, and the kills are
// reached or nothing is left to settle; it asks the engine only when it must.
func TestKillPhaseOver(t *testing.T) {
	for _, c := range []struct {
		name                    string
		allStarted, windowsDone bool
		restartsIdle            bool
		kills, settled          int
		over, asked             bool
	}{
		{"kills reached", true, true, true, 10, 0, true, false},
		{"everything settled before the kills", true, true, true, 3, 100, true, true},
		{"short of kills, work left", true, true, true, 3, 99, false, true},
		{"engine unreachable", true, true, true, 3, -1, false, true},
		{"instances still starting", false, true, true, 10, 100, false, false},
		{"a window still on", true, false, true, 10, 100, false, false},
		{"a service restart under way", true, true, false, 10, 100, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			asked := false
			settled := func() int { asked = true; return c.settled }
			assert.Equal(t, c.over, killPhaseOver(c.allStarted, c.windowsDone, c.restartsIdle, c.kills, 10, 100, settled))
			assert.Equal(t, c.asked, asked, "the engine asked")
		})
	}
}

// The killer's victim is a live slot, chosen by the seed; with none live it draws nothing.
func TestPickVictim(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ref := rand.New(rand.NewPCG(1, 2))
	assert.Equal(t, -1, pickVictim(rng, nil))
	assert.Equal(t, ref.Uint64(), rng.Uint64(), "no draw without a live worker")
	hit := map[int]int{}
	for range 300 {
		v := pickVictim(rng, []int{0, 2})
		assert.Contains(t, []int{0, 2}, v)
		hit[v]++
	}
	assert.Len(t, hit, 2, "both live slots get killed")
	a, b := rand.New(rand.NewPCG(9, 9)), rand.New(rand.NewPCG(9, 9))
	for range 20 {
		assert.Equal(t, pickVictim(a, []int{0, 1, 2}), pickVictim(b, []int{0, 1, 2}), "seeded")
	}
}

// The killer's pauses average the pace asked for, within half of it either way.
func TestNextKillIn(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	every := 2 * time.Second
	var sum time.Duration
	for range 1000 {
		d := nextKillIn(rng, every)
		assert.True(t, d >= every/2 && d < every*3/2, "%v", d)
		sum += d
	}
	assert.InDelta(t, float64(every), float64(sum/1000), float64(every/10))
}

// Settled: ours that finished or hold an incident, each once, however many incidents it
// holds; other runs' incidents and instances do not count, nor does a second instance of
// one of the run's business keys (started during a database restart: counting it ended a
// CI drain early).
func TestSettledCount(t *testing.T) {
	ours := map[string]bool{"p1": true, "p2": true, "p3": true}
	for _, c := range []struct {
		name      string
		finished  []string
		incidents []admin.Incident
		want      int
	}{
		{"none", nil, nil, 0},
		{"finished only", []string{"p1", "p2"}, nil, 2},
		{"an incident of ours", []string{"p1", "p2"}, []admin.Incident{{ProcessInstanceID: "p3"}}, 3},
		{"two incidents on one instance", []string{"p1"}, []admin.Incident{{ProcessInstanceID: "p3"}, {ProcessInstanceID: "p3"}}, 2},
		{"another run's incident", []string{"p1"}, []admin.Incident{{ProcessInstanceID: "other"}}, 1},
		{"a second instance of one business key", []string{"p1", "p2", "dup"}, []admin.Incident{{ProcessInstanceID: "p3"}}, 3},
		{"a second instance, ours still running", []string{"p1", "dup"}, []admin.Incident{{ProcessInstanceID: "p3"}}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, settledCount(c.finished, c.incidents, ours))
		})
	}
}
