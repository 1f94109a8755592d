package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/extworker/extworker/idempotency"
)

// The operations measured, in the report's order. A new side effect is one Do with a
// provider that answers at once: the claim (record the intent, already claimed and
// marked dispatched, in one statement), the provider call, and the confirm. Its two
// ledger parts are timed from inside the fake provider: Do's start to the provider
// being called is the record and dispatch mark, the provider's return to Do's return
// is the confirm.
const (
	opNew        = "new side effect: Do (record + dispatch mark + confirm)"
	opNewClaim   = "  of which record + dispatch mark (the claim)"
	opNewConfirm = "  of which confirm"
	opReplay     = "replay of a confirmed intent: Do"
	opReplayNew  = "  replay of one from the last hour (a redelivery)"
	opList       = "effects list --state unknown (limit 100)"
	opShowScope  = "effects show KEY --scope S"
	opShowKey    = "effects show KEY (no scope)"
)

var opOrder = []string{opNew, opNewClaim, opNewConfirm, opReplay, opReplayNew, opList, opShowScope, opShowKey}

// sample is one operation's latencies on one ledger.
type sample struct {
	d []time.Duration
	// stopped: the operation ran out of -op-budget before -n samples.
	stopped bool
}

// side is what one ledger's operations need: the keys they work on.
type side struct {
	d      *ledgerDB
	label  string
	seeded bool
	rows   int64
	rng    *rand.Rand
	// newKeys are the keys the new side effects recorded, in order (the empty ledger's
	// replays and shows use them: they are all it has).
	newKeys []string
	runID   string
	samples map[string]*sample
	spent   map[string]time.Duration
}

func (s *side) add(op string, d time.Duration) {
	sm := s.samples[op]
	if sm == nil {
		sm = &sample{}
		s.samples[op] = sm
	}
	sm.d = append(sm.d, d)
}

// request is the Request of a new side effect: like the seeded ones, an invoice and an
// amount.
func newRequest(key string) map[string]any {
	return map[string]any{"invoice": key, "amount": int64(1000)}
}

func task(key string, n uint64) idempotency.TaskRef {
	return idempotency.TaskRef{Actor: "ledgerscale", TaskID: uuidOf(n ^ 0xabcdef), ProcessInstanceID: uuidOf(n ^ 0x123456), BusinessKey: key}
}

// newEffect runs one new side effect and records its three latencies (when record).
func (s *side) newEffect(ctx context.Context, key string, record bool) error {
	var called, returned time.Time
	eff := idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		called = time.Now()
		r := idempotency.Result{ProviderRef: "ch_" + key, Values: map[string]any{"charge_id": "ch_" + key}}
		returned = time.Now()
		return r, nil
	}}
	in := idempotency.Intent{Scope: "payment.collect", Key: key, Request: newRequest(key), Task: task(key, uint64(len(s.newKeys))), Amount: 1000}
	t0 := time.Now()
	out, err := s.d.l.Do(ctx, in, eff)
	t1 := time.Now()
	if err != nil {
		return fmt.Errorf("%s: new side effect %s: %w", s.label, key, err)
	}
	if out.Replayed || out.State != idempotency.StateConfirmed {
		return fmt.Errorf("%s: new side effect %s: %+v, want a fresh confirm", s.label, key, out)
	}
	s.newKeys = append(s.newKeys, key)
	if record {
		s.add(opNew, t1.Sub(t0))
		s.add(opNewClaim, called.Sub(t0))
		s.add(opNewConfirm, t1.Sub(returned))
	}
	return nil
}

// pick returns an intent to replay or show: a random seeded one (anywhere in the 90
// days, so mostly not in any cache) on the seeded ledger, one of its own new ones on
// the empty ledger. For replays it must be confirmed.
func (s *side) pick(confirmed bool) (scope, key string, request map[string]any) {
	return s.pickIn(0, confirmed)
}

// pickRecent is pick among the seeded intents of the last of the 90 days' hours (the
// newest 1/2160 of them, 4,630 of 10 M): what a redelivery replays, an intent recorded
// minutes before by the same task's earlier attempt.
func (s *side) pickRecent() (scope, key string, request map[string]any) {
	return s.pickIn(s.rows-max(s.rows/(90*24), 100), true)
}

func (s *side) pickIn(from int64, confirmed bool) (scope, key string, request map[string]any) {
	if !s.seeded {
		k := s.newKeys[s.rng.IntN(len(s.newKeys))]
		return "payment.collect", k, newRequest(k)
	}
	from = max(from, 0)
	for {
		i := from + s.rng.Int64N(s.rows-from)
		if !confirmed || seedState(i) == idempotency.StateConfirmed {
			return seedScope(i), seedKey(i), seedRequest(i)
		}
	}
}

func (s *side) replay(ctx context.Context, recent bool) (time.Duration, error) {
	pick := func() (string, string, map[string]any) { return s.pick(true) }
	if recent {
		pick = s.pickRecent
	}
	scope, key, req := pick()
	eff := idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		return idempotency.Result{}, errors.New("a replay called the provider")
	}}
	t0 := time.Now()
	out, err := s.d.l.Do(ctx, idempotency.Intent{Scope: scope, Key: key, Request: req, Task: task(key, 1), Amount: 1000}, eff)
	d := time.Since(t0)
	if err != nil {
		return 0, fmt.Errorf("%s: replay %s/%s: %w", s.label, scope, key, err)
	}
	if !out.Replayed {
		return 0, fmt.Errorf("%s: replay %s/%s was not replayed", s.label, scope, key)
	}
	return d, nil
}

func (s *side) listUnknown(ctx context.Context) (time.Duration, error) {
	t0 := time.Now()
	rows, err := s.d.l.Operations().List(ctx, idempotency.Filter{States: []idempotency.State{idempotency.StateUnknown}, Limit: 100})
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if len(rows) != 100 {
		return 0, fmt.Errorf("%s: list of unknowns returned %d intents, want a full page of 100", s.label, len(rows))
	}
	return d, nil
}

// show is what `extworker effects show` asks the ledger (cmd/extworker/effects.go): the
// intent (findIntent: Get with a scope, List by key without one), its events, its
// compensation and its resolutions. The engine's view, which it asks the engine for, is
// not the ledger's and is left out.
func (s *side) show(ctx context.Context, withScope bool) (time.Duration, error) {
	scope, key, _ := s.pick(false)
	l := s.d.l
	t0 := time.Now()
	var row idempotency.Row
	var err error
	if withScope {
		row, err = l.Operations().Get(ctx, scope, key)
	} else {
		var rows []idempotency.Row
		rows, err = l.Operations().List(ctx, idempotency.Filter{Key: key, Limit: 1000})
		if err == nil && len(rows) != 1 {
			err = fmt.Errorf("key %s is in %d scopes, want 1", key, len(rows))
		}
		if err == nil {
			row = rows[0]
		}
	}
	if err != nil {
		return 0, fmt.Errorf("%s: show %s/%s: %w", s.label, scope, key, err)
	}
	events, err := l.Operations().Events(ctx, row.Scope, row.Key)
	if err == nil && len(events) < 3 {
		err = fmt.Errorf("%d events, want at least 3", len(events))
	}
	if err == nil {
		_, _, err = l.Operations().Compensation(ctx, row)
	}
	if err == nil {
		_, err = l.Operations().Resolutions(ctx, idempotency.ResolutionFilter{Scope: row.Scope, Key: row.Key})
	}
	d := time.Since(t0)
	if err != nil {
		return 0, fmt.Errorf("%s: show %s/%s: %w", s.label, scope, key, err)
	}
	return d, nil
}

// unknowns records 150 intents whose dispatch ended ambiguously (the provider timed
// out), through the ledger, so `effects list --state unknown` returns a full page of
// 100 on both ledgers and the two are compared on the same work.
func (s *side) unknowns(ctx context.Context) error {
	eff := idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		return idempotency.Result{}, errors.New("provider timeout")
	}}
	for i := range 150 {
		key := fmt.Sprintf("UNK-%s-%03d", s.runID, i)
		_, err := s.d.l.Do(ctx, idempotency.Intent{Scope: "payment.collect", Key: key, Request: newRequest(key), Task: task(key, uint64(i))}, eff)
		if interruption(err) {
			// The server went away (retry.go): once it is back, a new key.
			if err := waitForServer(ctx, s.d.pool); err != nil {
				return err
			}
			s.runID += "r"
			return s.unknowns(ctx)
		}
		if !errors.Is(err, idempotency.ErrUnknownOutcome) {
			return fmt.Errorf("%s: unknown intent %s: %v, want an unknown outcome", s.label, key, err)
		}
	}
	return nil
}

// measure runs every operation -n times on both ledgers, in blocks that take turns
// (20 on the empty ledger, 20 on the seeded one, and so on), so that whatever else the
// machine does in the meantime falls on both alike. Each operation is warmed up first
// (the pool's connections, pgx's statement cache, the server's plan cache).
func measure(ctx context.Context, o options, empty, seeded *ledgerDB, rep *report) error {
	runID := fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffffff)
	sides := []*side{
		{d: empty, label: "empty", rng: rand.New(rand.NewPCG(1, 2)), runID: runID},
		{d: seeded, label: rowsLabel(o.rows), seeded: true, rows: o.rows, rng: rand.New(rand.NewPCG(3, 4)), runID: runID},
	}
	for _, s := range sides {
		s.samples, s.spent = map[string]*sample{}, map[string]time.Duration{}
		if err := s.unknowns(ctx); err != nil {
			return err
		}
	}
	timed := func(op string, f func(s *side) (time.Duration, error)) opFn {
		return func(s *side, record bool) error {
			d, err := f(s)
			if err == nil && record {
				s.add(op, d)
			}
			return err
		}
	}
	ops := []namedOp{
		{opNew, func(s *side, record bool) error { return s.newEffect(ctx, s.nextKey(), record) }},
		{opReplay, timed(opReplay, func(s *side) (time.Duration, error) { return s.replay(ctx, false) })},
		{opReplayNew, timed(opReplayNew, func(s *side) (time.Duration, error) { return s.replay(ctx, true) })},
		{opList, timed(opList, func(s *side) (time.Duration, error) { return s.listUnknown(ctx) })},
		{opShowScope, timed(opShowScope, func(s *side) (time.Duration, error) { return s.show(ctx, true) })},
		{opShowKey, timed(opShowKey, func(s *side) (time.Duration, error) { return s.show(ctx, false) })},
	}
	if err := takeTurns(ctx, o, sides, ops, rep); err != nil {
		return err
	}
	rep.empty, rep.seeded = sides[0].samples, sides[1].samples
	rep.sides = sides
	return nil
}

// measureAfterPrune records new side effects again on both ledgers once the prune has
// turned a third of the seeded one into tombstones, which every new intent's claim
// checks (its INSERT's NOT EXISTS on extworker_intent_tombstones).
func measureAfterPrune(ctx context.Context, o options, rep *report) error {
	sides := rep.sides
	for _, s := range sides {
		s.samples, s.spent = map[string]*sample{}, map[string]time.Duration{}
		s.runID += "p"
	}
	ops := []namedOp{{opNew, func(s *side, record bool) error { return s.newEffect(ctx, s.nextKey(), record) }}}
	if err := takeTurns(ctx, o, sides, ops, rep); err != nil {
		return err
	}
	rep.emptyAfter, rep.seededAfter = sides[0].samples, sides[1].samples
	return nil
}

// nextKey is the key of the side's next new side effect.
func (s *side) nextKey() string { return fmt.Sprintf("NEW-%s-%06d", s.runID, len(s.newKeys)) }

// opFn runs an operation once on a side, recording its latency when record.
type opFn func(s *side, record bool) error

type namedOp struct {
	name string
	f    opFn
}

// takeTurns runs each of ops -n times on each side, warmed up, in blocks that take turns.
func takeTurns(ctx context.Context, o options, sides []*side, ops []namedOp, rep *report) error {
	const block, warm = 20, 20
	for _, op := range ops {
		progress("measuring %q, %d times on each ledger", op.name, o.n)
		// run is one operation; one the server's going away interrupted is waited out and
		// not recorded.
		run := func(s *side, record bool) (bool, error) {
			err := op.f(s, record)
			if interruption(err) {
				rep.interrupted++
				progress("  %s: interrupted (%v); waiting for PostgreSQL", s.label, err)
				if rep.interrupted > 50 {
					return false, fmt.Errorf("interrupted more than 50 times: %w", err)
				}
				return false, waitForServer(ctx, s.d.pool)
			}
			return err == nil, err
		}
		for _, s := range sides {
			for range warm {
				if _, err := run(s, false); err != nil {
					return err
				}
			}
		}
		done := map[*side]int{}
		for {
			busy := false
			for _, s := range sides {
				if done[s] >= o.n || s.spent[op.name] > o.opBudget {
					continue
				}
				busy = true
				t := time.Now()
				for j := 0; j < block && done[s] < o.n; j++ {
					ok, err := run(s, true)
					if err != nil {
						return err
					}
					if ok {
						done[s]++
					}
				}
				s.spent[op.name] += time.Since(t)
			}
			if !busy {
				break
			}
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		for _, s := range sides {
			if done[s] < o.n {
				if s.samples[op.name] == nil {
					s.samples[op.name] = &sample{}
				}
				s.samples[op.name].stopped = true
				progress("  %s: stopped after %d samples (-op-budget %v)", s.label, done[s], o.opBudget)
			}
		}
	}
	return nil
}

// stats are the figures of one sample.
type stats struct {
	n              int
	p50, p99, max  time.Duration
	mean           time.Duration
	stopped, valid bool
}

func statsOf(sm *sample) stats {
	if sm == nil || len(sm.d) == 0 {
		return stats{}
	}
	d := slices.Clone(sm.d)
	slices.Sort(d)
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return stats{n: len(d), p50: quantile(d, 0.50), p99: quantile(d, 0.99), max: d[len(d)-1], mean: sum / time.Duration(len(d)),
		stopped: sm.stopped, valid: true}
}

// quantile is the nearest-rank quantile of sorted d.
func quantile(d []time.Duration, q float64) time.Duration {
	i := int(float64(len(d))*q+0.999999) - 1
	return d[min(max(i, 0), len(d)-1)]
}
