package idempotency

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// NewInMemory returns a ledger that keeps its intents in memory, for testing handlers
// without PostgreSQL. Do behaves as on a ledger from New: the same claim, leases and
// fencing, replays, digest mismatches, declines, unknown outcomes and their
// reconciliation, operator holds and compensation (package ledgertest runs one suite
// against both). Its clock is the local one, its intents live as long as the ledger,
// and there are no operators (Operations returns nil): what only an operator settles
// (an operator hold) stays held. Effect.Local runs after the compare-and-set that
// confirms the intent is checked, with a nil pgx.Tx, and nothing undoes what it did if
// the confirmation is then fenced off.
//
// It panics if cfg is invalid (Config.Validate), as a test's mistake.
func NewInMemory(cfg Config) *Ledger {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	return &Ledger{store: &memStore{intents: map[memKey]*memIntent{}, byID: map[int64]*memIntent{}}, cfg: cfg}
}

// memStore keeps intents in a map, each write a compare-and-set under one mutex.
type memStore struct {
	mu      sync.Mutex
	nextID  int64
	intents map[memKey]*memIntent
	byID    map[int64]*memIntent
}

type memKey struct{ scope, key string }

// memIntent is an intent's row and its events.
type memIntent struct {
	row    Row
	events []Event
}

func (m *memStore) claim(ctx context.Context, a *attempt) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	a.dbNow, a.readAt, a.leaseEnd = now, now, now.Add(a.l.cfg.Lease)
	it := m.intents[memKey{a.in.Scope, a.in.Key}]
	if it == nil {
		if err := m.oneCompensation(a); err != nil {
			return err
		}
		m.record(ctx, a, decideClaim(nil, a.claimRequest(), now).to, now)
		return nil
	}
	a.row = it.row
	d := decideClaim(&it.row, a.claimRequest(), now)
	switch d.kind {
	case claimMismatch:
		it.event(a, it.row.State, it.row.State, a.mismatchReason(), now)
	case claimTooManyTries:
		why := tooManyTriesReason(d.attempts)
		m.apply(ctx, it, a, StateOperatorHold, "operator hold: "+why, change{errorMessage: &why}, now)
		return a.held(ctx, why, ErrTooManyTries)
	case claimTake:
		if d.to == StateDispatched {
			if err := a.fence(ctx); err != nil {
				return err
			}
		}
		m.take(ctx, it, a, d, now)
		return nil
	}
	return a.claimRefusal(ctx, d)
}

// record records a new intent in state to, claimed by a.
func (m *memStore) record(ctx context.Context, a *attempt, to State, now time.Time) {
	in, ns := a.in, a.l.cfg.Namespace
	m.nextID++
	lease := now.Add(a.l.cfg.Lease)
	r := Row{ID: m.nextID, Namespace: ns, Scope: in.Scope, Key: in.Key, Digest: a.digest, ProviderKey: ProviderKey(ns, in.Scope, in.Key),
		State: StatePrepared, Attempt: 1, LeaseOwner: nz(in.Task.Actor), LeaseUntil: &lease, TaskID: nz(in.Task.TaskID),
		ProcessInstanceID: nz(in.Task.ProcessInstanceID), BusinessKey: nz(in.Task.BusinessKey), CreatedAt: now, UpdatedAt: now,
		Amount: amountOf(in.Amount), CompensatesID: a.compensates}
	it := &memIntent{row: r}
	m.intents[memKey{in.Scope, in.Key}], m.byID[r.ID] = it, it
	a.row, a.claimed = r, true
	a.row.Attempt = 0 // the recording's event is attempt 0's
	it.event(a, "", StatePrepared, "intent recorded", now)
	a.row.Attempt = 1
	a.pending = []transition{{"", StatePrepared}}
	if to == StateDispatched {
		m.apply(ctx, it, a, StateDispatched, "dispatching with the provider key", change{dispatchMark: true}, now)
		return
	}
	a.committed(nil)
}

// take claims an intent for a as d decides (claimTake).
func (m *memStore) take(ctx context.Context, it *memIntent, a *attempt, d claimDecision, now time.Time) {
	in := a.in
	lease := now.Add(a.l.cfg.Lease)
	r := &it.row
	r.Attempt++
	r.AbandonedAttempts += d.abandoned
	r.LeaseOwner, r.LeaseUntil = nz(in.Task.Actor), &lease
	if in.Task.TaskID != "" {
		r.TaskID = nz(in.Task.TaskID)
	}
	if in.Task.ProcessInstanceID != "" {
		r.ProcessInstanceID = nz(in.Task.ProcessInstanceID)
	}
	r.UpdatedAt = now
	a.row, a.claimed = *r, true
	a.pending = nil
	if d.reason == "" {
		return
	}
	m.apply(ctx, it, a, d.to, d.reason, change{dispatchMark: d.to == StateDispatched}, now)
}

func (m *memStore) move(ctx context.Context, a *attempt, from, to State, reason string, ch change) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	it, err := m.current(a, from, to)
	if err != nil {
		return err
	}
	m.apply(ctx, it, a, to, reason, ch, time.Now())
	return nil
}

// current is a's intent if it is still in from at a's attempt, else ErrFenced.
func (m *memStore) current(a *attempt, from, to State) (*memIntent, error) {
	it := m.byID[a.row.ID]
	if it == nil || it.row.State != from || it.row.Attempt != a.row.Attempt {
		return nil, fmt.Errorf("%w (%s -> %s at attempt %d)", ErrFenced, from, to, a.row.Attempt)
	}
	return it, nil
}

// apply moves it to to as ch says, appends the event and reports the transition, with
// the transitions pending before it.
func (m *memStore) apply(ctx context.Context, it *memIntent, a *attempt, to State, reason string, ch change, now time.Time) {
	r := &it.row
	from := r.State
	r.State, r.UpdatedAt = to, now
	if !leaseKept(to) {
		r.LeaseOwner, r.LeaseUntil = nil, nil
	}
	switch {
	case ch.dispatchMark:
		r.Dispatches++
		if r.FirstDispatchedAt == nil {
			r.FirstDispatchedAt = &now
		}
		r.LastDispatchedAt = &now
	case ch.undoDispatchMark:
		if r.Dispatches == 1 {
			r.FirstDispatchedAt, r.LastDispatchedAt = nil, nil
		}
		r.Dispatches--
	}
	if ch.errorCode != nil {
		r.ErrorCode = ch.errorCode
	}
	if ch.errorMessage != nil {
		r.ErrorMessage = ch.errorMessage
	}
	if res := ch.result; res != nil {
		r.ProviderRef, r.Result = nz(res.providerRef), res.values
	}
	if ch.reconciled {
		r.Reconciliations++
	}
	it.event(a, from, to, reason, now)
	a.row.State = to
	a.transitioned(ctx, from, to)
	a.committed(nil)
}

func (it *memIntent) event(a *attempt, from, to State, reason string, now time.Time) {
	it.events = append(it.events, Event{ID: int64(len(it.events) + 1), At: now, FromState: nz(string(from)), ToState: to,
		Attempt: a.row.Attempt, Actor: actorOf(a.in.Task.Actor), TaskID: nz(a.in.Task.TaskID), Reason: reason})
}

func (m *memStore) confirm(ctx context.Context, a *attempt, from, to State, res Result, values []byte, reason string) error {
	m.mu.Lock()
	_, err := m.current(a, from, to)
	m.mu.Unlock()
	if err == nil && a.eff.Local != nil {
		wctx, cancel := a.writeCtx(ctx)
		if lerr := a.eff.Local(wctx, nil, res); lerr != nil {
			err = fmt.Errorf("%w: %w", errLocal, lerr)
		}
		cancel()
	}
	if err != nil {
		a.committed(err)
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	it, err := m.current(a, from, to)
	if err != nil {
		return err
	}
	now := time.Now()
	if id := it.row.CompensatesID; id != nil {
		if orig := m.byID[*id]; orig != nil && (orig.row.State == StateConfirmed || orig.row.State == StateReconciled) {
			orig.event(&attempt{in: a.in, row: orig.row}, orig.row.State, StateCompensated, a.compensationReason(res.ProviderRef), now)
			orig.row.State, orig.row.UpdatedAt = StateCompensated, now
		}
	}
	m.apply(ctx, it, a, to, reason, change{result: &storedResult{res.ProviderRef, values}}, now)
	return nil
}

func (m *memStore) inconclusive(_ context.Context, a *attempt, counted int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if it := m.byID[a.row.ID]; it != nil && it.row.Attempt == a.row.Attempt {
		it.row.Reconciliations += counted
		it.row.LeaseOwner, it.row.LeaseUntil, it.row.UpdatedAt = nil, nil, time.Now()
	}
	return nil
}

func (m *memStore) releaseLease(_ context.Context, a *attempt) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if it := m.byID[a.row.ID]; it != nil && it.row.Attempt == a.row.Attempt {
		it.row.LeaseOwner, it.row.LeaseUntil = nil, nil
	}
}

func (m *memStore) compensated(_ context.Context, l *Ledger, in Intent) (*int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	it := m.intents[memKey{in.Compensates.Scope, in.Compensates.Key}]
	if it == nil {
		return nil, notRecordedToCompensate(in, l.cfg.Namespace)
	}
	self := m.intents[memKey{in.Scope, in.Key}]
	return compensable(it.row.ID, it.row.State, m.compensator(it.row.ID, in), self != nil && self.row.CompensatesID != nil && *self.row.CompensatesID == it.row.ID, in)
}

// compensator is the scope/key of an intent other than in that compensates the intent
// id and was not declined ("" if none): the in-memory unique index of migration 00012.
func (m *memStore) compensator(id int64, in Intent) string {
	var first *memIntent
	for _, c := range m.byID {
		r := c.row
		if r.CompensatesID != nil && *r.CompensatesID == id && r.State != StateRejected && (r.Scope != in.Scope || r.Key != in.Key) &&
			(first == nil || r.ID < first.row.ID) {
			first = c
		}
	}
	if first == nil {
		return ""
	}
	return first.row.Scope + "/" + first.row.Key
}

// oneCompensation refuses to record a compensating intent of an original another one
// compensates (recorded since Do's check, under the same mutex as the record).
func (m *memStore) oneCompensation(a *attempt) error {
	if a.compensates == nil || m.compensator(*a.compensates, a.in) == "" {
		return nil
	}
	return compensationExists(a.in, "")
}
