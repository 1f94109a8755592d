package soak

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/failpoint"
)

// The run's schedule: what the soak decides, as functions of values. Every random choice
// comes from a generator seeded by Config.Seed, so the same seed gives the same
// schedule (docs/testing.md, Replaying a seed). The I/O that carries the decisions out
// (starting and killing processes, restarting services, polling the engine) is in
// soak.go, supervisor.go and restart.go.

// planInvoices is the run's business commands: n invoices named run-00000 on, an amount
// each drawn from rng, and one in twenty (the fifth of each twenty) above the provider's
// decline threshold, so declined by amount.
func planInvoices(rng *rand.Rand, run string, n int) []invoice {
	invoices := make([]invoice, 0, n)
	for i := 0; i < n; i++ {
		inv := invoice{id: fmt.Sprintf("%s-%05d", run, i), amount: int64(1000 + rng.IntN(5000)), declined: i%20 == 4}
		if inv.declined {
			inv.amount = declineAbove + 1
		}
		invoices = append(invoices, inv)
	}
	return invoices
}

// startPacing spreads the instance starts over the time the kills need: the kill phase
// lasts about minKills kills a killEvery apart, and the starts take a fifth longer, one
// every `every`.
func startPacing(minKills int, killEvery time.Duration, instances int) (phase, every time.Duration) {
	phase = time.Duration(minKills) * killEvery
	spread := phase * 6 / 5
	return phase, spread / time.Duration(max(instances, 1))
}

// crashPoints are the failpoints the killer arms: the ledger's, and with events the
// outbox's and the inbox's.
func crashPoints(events bool) []string {
	points := []string{failpoint.AfterPrepared, failpoint.AfterDispatchMark, failpoint.AfterProviderAnswer,
		failpoint.AfterConfirm, failpoint.BeforeComplete, failpoint.InExtension}
	if events {
		points = append(points, failpoint.OutboxBeforePublish, failpoint.OutboxAfterPublish, failpoint.InboxAfterEngine, failpoint.InboxAfterAck)
	}
	return points
}

// crashSchedule decides which worker restarts carry a failpoint, and which. Not safe for
// concurrent use: the supervisor calls it under its lock.
type crashSchedule struct {
	rng    *rand.Rand
	points []string
	armed  []int // how often each point was armed so far
}

func newCrashSchedule(rng *rand.Rand, points []string) *crashSchedule {
	return &crashSchedule{rng: rng, points: points, armed: make([]int, len(points))}
}

// next is the failpoint (failpoint.Env's value, "point@hit") the worker started as
// generation gen of its slot carries, or "" for none. A first start carries none, nor
// does any start once the run drains; about every second restart carries one. The points
// rotate: each failpoint takes the point armed least often so far (ties in crashPoints'
// order), so every point is armed about equally often whatever the run's length; it
// fires at a hit from 1 to 10.
func (s *crashSchedule) next(gen int, draining bool) string {
	if gen == 0 || draining || s.rng.IntN(2) != 0 {
		return ""
	}
	best := 0
	for i := range s.points {
		if s.armed[i] < s.armed[best] {
			best = i
		}
	}
	s.armed[best]++
	return fmt.Sprintf("%s@%d", s.points[best], 1+s.rng.IntN(10))
}

// failpointKill says whether a worker's end counts as a kill at its failpoint, and at
// which point: it carried one (point, "name@hit"), it died of SIGKILL, and the killer
// did not send that SIGKILL (the killer's kills count as random ones).
func failpointKill(point string, sigkilled, byKiller bool) (name string, ok bool) {
	if point == "" || !sigkilled || byKiller {
		return "", false
	}
	name, _, _ = strings.Cut(point, "@")
	return name, true
}

// restartJitter is how long a worker slot waits before starting its next process
// (0-500ms), derived from the seed so a replay waits the same.
func restartJitter(seed uint64, gen, slot int) time.Duration {
	r := rand.New(rand.NewPCG(seed+uint64(gen), uint64(slot)))
	return time.Duration(r.Int64N(500)) * time.Millisecond
}

// restartCounts counts service restarts: those done, or those asked for.
type restartCounts struct{ PG, Engine, Broker int }

// restartsPlan is which service restarts are due now.
type restartsPlan struct{ PG, Engine, Broker bool }

// restartsDue decides which service restarts are due after kills kills, given those done
// and those asked for. The restarts of each service are spread evenly over the minKills
// kills: PostgreSQL's and the broker's i-th (from 1) of n is due at minKills*i/(n+1)
// kills, the engine's in between, at minKills*(2i-1)/(2n+2).
func restartsDue(done, want restartCounts, kills, minKills int) restartsPlan {
	return restartsPlan{
		PG:     done.PG < want.PG && kills >= minKills*(done.PG+1)/(want.PG+1),
		Engine: done.Engine < want.Engine && kills >= minKills*(2*done.Engine+1)/(2*want.Engine+2),
		Broker: done.Broker < want.Broker && kills >= minKills*(done.Broker+1)/(want.Broker+1),
	}
}

// killPhaseOver decides when the killer stops: every instance has started, the toxic
// windows are over, no service restart is under way, and either the run has its kills or
// every instance has settled already. settled (an engine query) is only asked when the
// rest holds and the kills fall short.
func killPhaseOver(allStarted, windowsDone, restartsIdle bool, kills, minKills, instances int, settled func() int) bool {
	return allStarted && windowsDone && restartsIdle && (kills >= minKills || settled() >= instances)
}

// pickVictim is the worker slot the killer SIGKILLs among the live ones (by slot), or -1
// when none is live (then rng is not drawn from).
func pickVictim(rng *rand.Rand, live []int) int {
	if len(live) == 0 {
		return -1
	}
	return live[rng.IntN(len(live))]
}

// nextKillIn is the pause before the killer's next round: uniform in [every/2, 3*every/2).
func nextKillIn(rng *rand.Rand, every time.Duration) time.Duration {
	return every/2 + time.Duration(rng.Int64N(int64(every)))
}

// settledCount counts the run's instances that need nothing more without an operator:
// those of ours that finished (finished: the ids the engine lists) or hold an incident,
// each once. An instance not of ours never counts, though its business key is one of the
// run's: during a database restart a CI soak started one invoice twice, and counting the
// second instance ended the drain while an instance of ours still ran.
func settledCount(finished []string, incidents []admin.Incident, ours map[string]bool) int {
	done := map[string]bool{}
	for _, id := range finished {
		if ours[id] {
			done[id] = true
		}
	}
	for _, i := range incidents {
		if ours[i.ProcessInstanceID] {
			done[i.ProcessInstanceID] = true
		}
	}
	return len(done)
}
