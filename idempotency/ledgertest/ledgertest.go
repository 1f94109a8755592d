// Package ledgertest is the behaviour suite of idempotency.Ledger.Do: what a handler
// sees through Do (confirmation and replay, digest mismatches, declines, unsent and
// unknown dispatches and their reconciliation, operator holds, another attempt's lease
// and its expiry, too many tries, compensation, cancellation). The idempotency package
// runs it against the PostgreSQL ledger and the in-memory one (idempotency.NewInMemory),
// so a handler tested on the in-memory ledger sees what it will see in production:
//
//	func TestLedgerConformance(t *testing.T) {
//		ledgertest.Run(t, func(t *testing.T, cfg idempotency.Config) *idempotency.Ledger {
//			return idempotency.NewInMemory(cfg)
//		})
//	}
//
// Each subtest asks newLedger for a ledger of its own with the Config it needs; it runs
// in parallel with the others, and observes the ledger only through Do.
package ledgertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
)

// NewLedger returns a fresh, empty ledger with cfg for one subtest.
type NewLedger func(t *testing.T, cfg idempotency.Config) *idempotency.Ledger

// Run runs every subtest of the suite against the ledgers newLedger returns.
func Run(t *testing.T, newLedger NewLedger) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newLedger)
		})
	}
}

var cases = []struct {
	name string
	run  func(*testing.T, NewLedger)
}{
	{"ConfirmedOnceThenReplayed", confirmedOnceThenReplayed},
	{"DigestMismatchSendsNothing", digestMismatch},
	{"DeclineIsABPMNErrorAndReplayed", decline},
	{"NotSentIsSentAgainWithTheSameKey", notSent},
	{"UnknownReconciledFound", unknownFound},
	{"UnknownReconciledAbsentIsSentAgain", unknownAbsent},
	{"UnknownStillUnknownEndsInOperatorHold", unknownStillUnknown},
	{"UnknownWithoutLookupIsHeld", unknownWithoutLookup},
	{"ProviderHoldIsHeld", providerHold},
	{"KeyRefusedIsHeld", keyRefused},
	{"InProgressWhileAnotherAttemptHoldsTheLease", inProgress},
	{"ExpiredLeaseIsTakenOverAndTheOldAttemptFenced", leaseTakeover},
	{"TooManyTriesIsHeld", tooManyTries},
	{"CompensationSettlesTheOriginal", compensation},
	{"SecondCompensationIsRefused", secondCompensation},
	{"RecordedCompensationRefusesAnother", recordedCompensation},
	{"DeclinedCompensationLetsAnotherTry", declinedCompensation},
	{"ConcurrentCompensationsDispatchOnce", concurrentCompensations},
	{"LocalEffectConfirmedOnce", localEffect},
	{"UnstorableProviderTextIsRecorded", unstorableText},
	{"ValuesThatJSONCannotHoldKeepTheEffectConfirmed", unencodableValues},
	{"CancelledBeforeDispatchSendsNothing", cancelled},
}

// provider is a payment provider honouring idempotency keys, whose next answers a
// subtest scripts.
type provider struct {
	mu      sync.Mutex
	calls   int               // Dispatch calls
	lookups int               // Reconcile and Search calls
	keys    []string          // the provider keys dispatched
	charges map[string]string // provider key -> charge reference
	// next are the errors of the next dispatches (nil: answered), after the charge took
	// effect when lost is set.
	next []error
	lost bool
	// recon is what the next lookups answer (nil: by the charges).
	recon []idempotency.Reconciliation
	// block, when set, holds every dispatch until it is closed.
	block chan struct{}
	// started is signalled when a dispatch starts.
	started chan struct{}
}

func newProvider() *provider {
	return &provider{charges: map[string]string{}, started: make(chan struct{}, 16)}
}

func (p *provider) dispatch(_ context.Context, key string) (idempotency.Result, error) {
	p.mu.Lock()
	p.calls++
	p.keys = append(p.keys, key)
	block := p.block
	var err error
	if len(p.next) > 0 {
		err, p.next = p.next[0], p.next[1:]
	}
	if err == nil || p.lost {
		if _, ok := p.charges[key]; !ok {
			p.charges[key] = fmt.Sprintf("ch_%d", len(p.charges)+1)
		}
	}
	ref := p.charges[key]
	p.mu.Unlock()
	p.started <- struct{}{}
	if block != nil {
		<-block // a stuck provider: the context is ignored, as a misbehaving client would
	}
	if err != nil {
		return idempotency.Result{}, err
	}
	return idempotency.Result{ProviderRef: ref, Values: map[string]any{"chargeId": ref}}, nil
}

func (p *provider) lookup(_ context.Context, q idempotency.Query) (idempotency.Reconciliation, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lookups++
	if len(p.recon) > 0 {
		r := p.recon[0]
		p.recon = p.recon[1:]
		return r, nil
	}
	if ref, ok := p.charges[q.ProviderKey]; ok {
		return idempotency.Found(idempotency.Result{ProviderRef: ref, Values: map[string]any{"chargeId": ref}}), nil
	}
	return idempotency.Absent(), nil
}

func (p *provider) effect() idempotency.Effect {
	return idempotency.Effect{Dispatch: p.dispatch, Reconcile: p.lookup}
}

func (p *provider) counts() (calls, lookups, charges int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls, p.lookups, len(p.charges)
}

type invoice struct {
	ID     string `json:"id"`
	Amount int64  `json:"amountCents"`
}

func charge(id string, amount int64) idempotency.Intent {
	return idempotency.Intent{Scope: "payment.collect", Key: "invoice:" + id + ":v1", Request: invoice{id, amount},
		Task: idempotency.TaskRef{Actor: "ledgertest", TaskID: "task-" + id, BusinessKey: id}}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func kind(err error) failure.Kind { return failure.Classify(err).Kind }

// check fails the subtest now if cond does not hold.
func check(t *testing.T, cond bool, format string, args ...any) {
	t.Helper()
	if !cond {
		t.Fatalf(format, args...)
	}
}

func wantCounts(t *testing.T, p *provider, calls, lookups, charges int) {
	t.Helper()
	c, l, ch := p.counts()
	check(t, c == calls && l == lookups && ch == charges,
		"provider: %d dispatches, %d lookups, %d charges; want %d, %d, %d", c, l, ch, calls, lookups, charges)
}

func wantErr(t *testing.T, err, target error, k failure.Kind) {
	t.Helper()
	check(t, errors.Is(err, target), "error %v: want %v", err, target)
	check(t, kind(err) == k, "error %v: kind %v, want %v", err, kind(err), k)
}

func do(t *testing.T, l *idempotency.Ledger, in idempotency.Intent, eff idempotency.Effect) (idempotency.Receipt, error) {
	t.Helper()
	return l.Do(ctxFor(t), in, eff)
}

func mustDo(t *testing.T, l *idempotency.Ledger, in idempotency.Intent, eff idempotency.Effect) idempotency.Receipt {
	t.Helper()
	r, err := do(t, l, in, eff)
	check(t, err == nil, "Do: %v", err)
	return r
}

func confirmedOnceThenReplayed(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{}), newProvider()
	in := charge("A1", 1999)
	first := mustDo(t, l, in, p.effect())
	check(t, first.State == idempotency.StateConfirmed && !first.Replayed && first.ProviderRef == "ch_1" && first.Values["chargeId"] == "ch_1",
		"first Do: %+v", first)
	check(t, first.ProviderKey == idempotency.ProviderKey(l.Namespace(), in.Scope, in.Key), "provider key %q", first.ProviderKey)
	again := mustDo(t, l, in, p.effect())
	check(t, again.Replayed && again.State == idempotency.StateConfirmed && again.ProviderRef == "ch_1" &&
		again.Values["chargeId"] == "ch_1" && again.ProviderKey == first.ProviderKey, "replay: %+v", again)
	wantCounts(t, p, 1, 0, 1)
}

func digestMismatch(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{}), newProvider()
	mustDo(t, l, charge("M1", 1000), p.effect())
	other := charge("M1", 2000) // same key, another amount
	_, err := do(t, l, other, p.effect())
	wantErr(t, err, idempotency.ErrDigestMismatch, failure.KindPermanent)
	wantCounts(t, p, 1, 0, 1)
}

func decline(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{}), newProvider()
	p.next = []error{idempotency.Rejected("card_declined", "insufficient funds")}
	in := charge("D1", 500)
	for i := range 2 {
		_, err := do(t, l, in, p.effect())
		c := failure.Classify(err)
		check(t, c.Kind == failure.KindBPMNError && c.Code == "card_declined" && c.Message == "insufficient funds",
			"Do %d: %v (%v)", i+1, err, c.Kind)
	}
	wantCounts(t, p, 1, 0, 0)
	// OnRejected decides what a decline becomes, for the replay too.
	custom := p.effect()
	custom.OnRejected = func(r *idempotency.Rejection) error { return failure.Permanent(r) }
	_, err := do(t, l, in, custom)
	var rej *idempotency.Rejection
	check(t, errors.As(err, &rej) && rej.Code == "card_declined" && kind(err) == failure.KindPermanent, "OnRejected replay: %v", err)
}

func notSent(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{}), newProvider()
	p.next = []error{idempotency.NotSent(errors.New("connection refused"))}
	in := charge("N1", 700)
	_, err := do(t, l, in, p.effect())
	check(t, kind(err) == failure.KindRetryable && idempotency.IsNotSent(err), "not sent: %v (%v)", err, kind(err))
	r := mustDo(t, l, in, p.effect())
	check(t, r.State == idempotency.StateConfirmed && !r.Replayed, "after not sent: %+v", r)
	wantCounts(t, p, 2, 0, 1)
	check(t, p.keys[0] == p.keys[1], "keys %v: the same key is sent again", p.keys)
}

// lostAnswer makes the next dispatch take effect and lose its answer.
func (p *provider) lostAnswer() {
	p.next, p.lost = []error{errors.New("read timeout after the request was written")}, true
}

func unknownFound(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{}), newProvider()
	p.lostAnswer()
	in := charge("U1", 900)
	_, err := do(t, l, in, p.effect())
	wantErr(t, err, idempotency.ErrUnknownOutcome, failure.KindRetryable)
	check(t, failure.Classify(err).RetryDelay > 0, "an unknown outcome waits before reconciling: %v", err)
	r := mustDo(t, l, in, p.effect())
	check(t, r.State == idempotency.StateReconciled && r.ProviderRef == "ch_1" && r.Values["chargeId"] == "ch_1", "reconciled: %+v", r)
	again := mustDo(t, l, in, p.effect())
	check(t, again.Replayed && again.State == idempotency.StateReconciled, "replay of a reconciled intent: %+v", again)
	wantCounts(t, p, 1, 1, 1)
}

func unknownAbsent(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{}), newProvider()
	p.next = []error{errors.New("connection reset before the provider accepted it")} // ambiguous, but nothing happened
	in := charge("U2", 900)
	_, err := do(t, l, in, p.effect())
	wantErr(t, err, idempotency.ErrUnknownOutcome, failure.KindRetryable)
	r := mustDo(t, l, in, p.effect()) // absent: sent again, with the same key
	check(t, r.State == idempotency.StateConfirmed && !r.Replayed, "after absent: %+v", r)
	wantCounts(t, p, 2, 1, 1)
	check(t, p.keys[0] == p.keys[1], "keys %v", p.keys)
}

func unknownStillUnknown(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{MaxReconciliations: 2}), newProvider()
	p.lostAnswer()
	p.recon = []idempotency.Reconciliation{idempotency.StillUnknown("provider busy"), idempotency.StillUnknown("provider busy")}
	in := charge("U3", 900)
	_, err := do(t, l, in, p.effect())
	wantErr(t, err, idempotency.ErrUnknownOutcome, failure.KindRetryable)
	_, err = do(t, l, in, p.effect())
	wantErr(t, err, idempotency.ErrUnknownOutcome, failure.KindRetryable) // reconciliation 1 of 2
	_, err = do(t, l, in, p.effect())
	wantErr(t, err, idempotency.ErrUnknownOutcome, failure.KindUnknownOutcome) // the second: held
	_, err = do(t, l, in, p.effect())
	wantErr(t, err, idempotency.ErrOperatorHold, failure.KindUnknownOutcome)
	wantCounts(t, p, 1, 2, 1)
}

func unknownWithoutLookup(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{}), newProvider()
	p.lostAnswer()
	eff := idempotency.Effect{Dispatch: p.dispatch} // neither Reconcile nor Search
	in := charge("U4", 900)
	_, err := do(t, l, in, eff)
	wantErr(t, err, idempotency.ErrUnknownOutcome, failure.KindRetryable)
	_, err = do(t, l, in, eff)
	wantErr(t, err, idempotency.ErrUnknownOutcome, failure.KindUnknownOutcome)
	_, err = do(t, l, in, eff)
	wantErr(t, err, idempotency.ErrOperatorHold, failure.KindUnknownOutcome)
	wantCounts(t, p, 1, 0, 1)
}

func providerHold(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{}), newProvider()
	p.lostAnswer()
	p.recon = []idempotency.Reconciliation{idempotency.Hold("the provider stored a failure under the key")}
	in := charge("H1", 900)
	_, _ = do(t, l, in, p.effect())
	_, err := do(t, l, in, p.effect())
	wantErr(t, err, idempotency.ErrUnknownOutcome, failure.KindUnknownOutcome)
	_, err = do(t, l, in, p.effect())
	wantErr(t, err, idempotency.ErrOperatorHold, failure.KindUnknownOutcome)
	wantCounts(t, p, 1, 1, 1)
}

func keyRefused(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{}), newProvider()
	p.next = []error{failure.Permanent(errors.New("409: key used for another request"))}
	in := charge("K1", 900)
	_, err := do(t, l, in, p.effect())
	wantErr(t, err, idempotency.ErrKeyRefused, failure.KindUnknownOutcome)
	_, err = do(t, l, in, p.effect())
	wantErr(t, err, idempotency.ErrOperatorHold, failure.KindUnknownOutcome)
	wantCounts(t, p, 1, 0, 0)
}

// stuck starts a Do whose dispatch blocks until the returned release is called, and
// waits for the dispatch to start; the Do's result arrives on the channel.
func stuck(t *testing.T, l *idempotency.Ledger, p *provider, in idempotency.Intent) (release func(), result <-chan error) {
	t.Helper()
	p.mu.Lock()
	p.block = make(chan struct{})
	block := p.block
	p.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := l.Do(context.Background(), in, p.effect())
		done <- err
	}()
	select {
	case <-p.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the first attempt's dispatch did not start")
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			p.mu.Lock()
			p.block = nil
			p.mu.Unlock()
			close(block)
		})
	}
	t.Cleanup(release)
	return release, done
}

func inProgress(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{Lease: time.Minute, InProgressBackoff: 250 * time.Millisecond}), newProvider()
	in := charge("P1", 900)
	release, first := stuck(t, l, p, in)
	_, err := do(t, l, in, p.effect())
	wantErr(t, err, idempotency.ErrInProgress, failure.KindRetryable)
	c := failure.Classify(err)
	check(t, c.KeepRetries && c.RetryDelay > 0 && c.RetryDelay <= 250*time.Millisecond, "deferred: %+v", c)
	release()
	check(t, <-first == nil, "the first attempt confirms")
	r := mustDo(t, l, in, p.effect())
	check(t, r.Replayed && r.State == idempotency.StateConfirmed, "after the first attempt: %+v", r)
	wantCounts(t, p, 1, 0, 1)
}

// eventually retries Do until it returns something but ErrInProgress, within a deadline.
func eventually(t *testing.T, l *idempotency.Ledger, in idempotency.Intent, eff idempotency.Effect) (idempotency.Receipt, error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := do(t, l, in, eff)
		if !errors.Is(err, idempotency.ErrInProgress) {
			return r, err
		}
		check(t, time.Now().Before(deadline), "the first attempt's lease never ran out: %v", err)
		time.Sleep(min(failure.Classify(err).RetryDelay, time.Until(deadline)))
	}
}

func leaseTakeover(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{Lease: time.Second, InProgressBackoff: 50 * time.Millisecond}), newProvider()
	in := charge("L1", 900)
	release, first := stuck(t, l, p, in)
	// Once the stuck attempt's lease ends, the next takes the intent over: dispatched
	// without an outcome is unknown, so it reconciles (the charge is there) instead of
	// charging again.
	r, err := eventually(t, l, in, p.effect())
	check(t, err == nil && r.State == idempotency.StateReconciled && r.Attempt == 2, "takeover: %+v, %v", r, err)
	release()
	err = <-first
	wantErr(t, err, idempotency.ErrFenced, failure.KindRetryable)
	again := mustDo(t, l, in, p.effect())
	check(t, again.Replayed && again.State == idempotency.StateReconciled && again.ProviderRef == r.ProviderRef, "replay: %+v", again)
	wantCounts(t, p, 1, 1, 1)
}

func tooManyTries(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{Lease: time.Second, InProgressBackoff: 50 * time.Millisecond, MaxAttempts: 1}), newProvider()
	in := charge("T1", 900)
	release, first := stuck(t, l, p, in)
	_, err := eventually(t, l, in, p.effect())
	wantErr(t, err, idempotency.ErrTooManyTries, failure.KindUnknownOutcome)
	release()
	<-first
	_, err = do(t, l, in, p.effect())
	wantErr(t, err, idempotency.ErrOperatorHold, failure.KindUnknownOutcome)
	wantCounts(t, p, 1, 0, 1)
}

func compensation(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{}), newProvider()
	orig := charge("C1", 900)
	mustDo(t, l, orig, p.effect())
	refund := idempotency.Intent{Scope: "payment.refund", Key: "invoice:C1:refund", Request: invoice{"C1", 900},
		Task: orig.Task, Compensates: idempotency.IntentRef{Scope: orig.Scope, Key: orig.Key}}
	r := mustDo(t, l, refund, p.effect())
	check(t, r.State == idempotency.StateConfirmed && !r.Replayed, "refund: %+v", r)
	_, err := do(t, l, orig, p.effect())
	wantErr(t, err, idempotency.ErrCompensated, failure.KindPermanent)
	again := mustDo(t, l, refund, p.effect())
	check(t, again.Replayed, "refund replayed: %+v", again)
	nothing := refund
	nothing.Key, nothing.Compensates.Key = "invoice:C2:refund", "invoice:C2:v1"
	_, err = do(t, l, nothing, p.effect())
	wantErr(t, err, idempotency.ErrNothingToCompensate, failure.KindPermanent)
	wantCounts(t, p, 2, 0, 2)
}

// refund is a compensating intent of orig, under key.
func refund(orig idempotency.Intent, key string) idempotency.Intent {
	return idempotency.Intent{Scope: "payment.refund", Key: key, Request: orig.Request, Task: orig.Task,
		Compensates: idempotency.IntentRef{Scope: orig.Scope, Key: orig.Key}}
}

// A charge already compensated is not compensated again by another intent (a double
// refund), and the first refund still replays.
func secondCompensation(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{}), newProvider()
	orig := charge("S1", 4200)
	mustDo(t, l, orig, p.effect())
	first := refund(orig, "invoice:S1:refund:v1")
	mustDo(t, l, first, p.effect())
	_, err := do(t, l, refund(orig, "invoice:S1:refund:v2"), p.effect())
	wantErr(t, err, idempotency.ErrCompensationExists, failure.KindPermanent)
	check(t, strings.Contains(err.Error(), first.Key), "the refusal names the first refund: %v", err)
	again := mustDo(t, l, first, p.effect())
	check(t, again.Replayed, "the first refund replays: %+v", again)
	wantCounts(t, p, 2, 0, 2)
}

// A compensating intent blocks another from the moment it is recorded, not only once
// confirmed: here the first refund was not sent, and is still prepared.
func recordedCompensation(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{}), newProvider()
	orig := charge("S2", 4200)
	mustDo(t, l, orig, p.effect())
	p.next = []error{idempotency.NotSent(errors.New("connection refused"))}
	first := refund(orig, "invoice:S2:refund:v1")
	_, err := do(t, l, first, p.effect())
	check(t, idempotency.IsNotSent(err), "first refund not sent: %v", err)
	_, err = do(t, l, refund(orig, "invoice:S2:refund:v2"), p.effect())
	wantErr(t, err, idempotency.ErrCompensationExists, failure.KindPermanent)
	r := mustDo(t, l, first, p.effect())
	check(t, r.State == idempotency.StateConfirmed && !r.Replayed, "the first refund goes on: %+v", r)
	wantCounts(t, p, 3, 0, 2)
}

// A declined compensation undid nothing: another compensating intent may try.
func declinedCompensation(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{}), newProvider()
	orig := charge("S3", 4200)
	mustDo(t, l, orig, p.effect())
	p.next = []error{idempotency.Rejected("refund_declined", "try later")}
	_, err := do(t, l, refund(orig, "invoice:S3:refund:v1"), p.effect())
	check(t, kind(err) == failure.KindBPMNError, "first refund declined: %v", err)
	r := mustDo(t, l, refund(orig, "invoice:S3:refund:v2"), p.effect())
	check(t, r.State == idempotency.StateConfirmed, "second refund: %+v", r)
	_, err = do(t, l, orig, p.effect())
	wantErr(t, err, idempotency.ErrCompensated, failure.KindPermanent)
	wantCounts(t, p, 3, 0, 2)
}

// Refunds of one charge started at once: exactly one reaches the provider, the others
// are refused before anything is sent.
func concurrentCompensations(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{}), newProvider()
	orig := charge("S4", 4200)
	mustDo(t, l, orig, p.effect())
	const n = 4
	errs := make(chan error, n)
	start := make(chan struct{})
	for i := range n {
		go func() {
			<-start
			_, err := l.Do(ctxFor(t), refund(orig, fmt.Sprintf("invoice:S4:refund:v%d", i+1)), p.effect())
			errs <- err
		}()
	}
	close(start)
	var ok, refused int
	for range n {
		switch err := <-errs; {
		case err == nil:
			ok++
		case errors.Is(err, idempotency.ErrCompensationExists) && kind(err) == failure.KindPermanent:
			refused++
		default:
			t.Errorf("refund: %v", err)
		}
	}
	check(t, ok == 1 && refused == n-1, "%d refunds confirmed, %d refused; want 1 and %d", ok, refused, n-1)
	wantCounts(t, p, 2, 0, 2)
}

// Text a provider returns that PostgreSQL cannot store (a NUL byte, invalid UTF-8 such as
// an ISO-8859-1 message) is recorded with each such byte as U+FFFD, the answer kept: the
// first Do and its replay return the same, and nothing is sent again.
func unstorableText(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{}), newProvider()
	// A decline in ISO-8859-1, with a NUL in its code.
	p.next = []error{idempotency.Rejected("too\x00high", "Wert zu hoch f\xfcr diese Karte")}
	in := charge("T1", 900)
	for i := range 2 {
		_, err := do(t, l, in, p.effect())
		c := failure.Classify(err)
		check(t, c.Kind == failure.KindBPMNError && c.Code == "too\uFFFDhigh" && c.Message == "Wert zu hoch f\uFFFDr diese Karte",
			"decline, Do %d: %v (%v)", i+1, err, c.Kind)
	}
	wantCounts(t, p, 1, 0, 0)

	// A confirmation whose reference and values (keys, strings, nested) hold such text.
	calls := 0
	eff := idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		calls++
		return idempotency.Result{ProviderRef: "ref\x00\xfc", Values: map[string]any{
			"note\x00": "f\xfcr", "nested": map[string]any{"list": []any{"a\x00", 7}}}}, nil
	}}
	paid := charge("T2", 900)
	for i := range 2 {
		r := mustDo(t, l, paid, eff)
		nested, _ := r.Values["nested"].(map[string]any)
		list, _ := nested["list"].([]any)
		check(t, r.State == idempotency.StateConfirmed && r.ProviderRef == "ref\uFFFD\uFFFD" && r.Values["note\uFFFD"] == "f\uFFFDr" &&
			len(list) == 2 && list[0] == "a\uFFFD" && fmt.Sprint(list[1]) == "7" && r.Replayed == (i > 0), "confirmed, Do %d: %+v", i+1, r)
	}
	check(t, calls == 1, "%d dispatches, want 1", calls)

	// Not sent, with such text: sent again, then confirmed.
	p.next = []error{idempotency.NotSent(errors.New("refused \x00 f\xfcr now"))}
	again := charge("T3", 900)
	_, err := do(t, l, again, p.effect())
	check(t, idempotency.IsNotSent(err) && kind(err) == failure.KindRetryable, "not sent: %v", err)
	r := mustDo(t, l, again, p.effect())
	check(t, r.State == idempotency.StateConfirmed && !r.Replayed, "after not sent: %+v", r)

	// A permanent refusal and a lookup's hold reason with such text: held, as without it.
	p.next = []error{failure.Permanent(errors.New("409 f\xfcr \x00 key"))}
	refused := charge("T4", 900)
	_, err = do(t, l, refused, p.effect())
	wantErr(t, err, idempotency.ErrKeyRefused, failure.KindUnknownOutcome)
	_, err = do(t, l, refused, p.effect())
	wantErr(t, err, idempotency.ErrOperatorHold, failure.KindUnknownOutcome)
	p.lostAnswer()
	p.recon = []idempotency.Reconciliation{idempotency.StillUnknown("index f\xfcr \x00 lag"), idempotency.Hold("stored f\xfcr \x00 failure")}
	held := charge("T5", 900)
	_, _ = do(t, l, held, p.effect())
	_, err = do(t, l, held, p.effect())
	wantErr(t, err, idempotency.ErrUnknownOutcome, failure.KindRetryable)
	_, err = do(t, l, held, p.effect())
	wantErr(t, err, idempotency.ErrUnknownOutcome, failure.KindUnknownOutcome)
	_, err = do(t, l, held, p.effect())
	wantErr(t, err, idempotency.ErrOperatorHold, failure.KindUnknownOutcome)
}

// Values JSON cannot encode (NaN, a channel) or float64 cannot hold (1E700) never turn
// an effect the provider performed into an error: the intent is confirmed with what can
// be stored, and the first Do and its replays return the same.
func unencodableValues(t *testing.T, newLedger NewLedger) {
	l := newLedger(t, idempotency.Config{})
	calls := 0
	eff := idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		calls++
		return idempotency.Result{ProviderRef: "ch_big", Values: map[string]any{
			"huge": json.Number("1E700"), "ratio": math.NaN(), "events": make(chan int), "chargeId": "ch_big", "cents": 4200}}, nil
	}}
	in := charge("V1", 4200)
	huge, _ := new(big.Float).SetString("1E700")
	for i := range 3 {
		r, err := do(t, l, in, eff)
		check(t, err == nil, "Do %d: %v", i+1, err)
		n, _ := r.Values["huge"].(json.Number)
		got, ok := new(big.Float).SetString(string(n))
		_, ratio := r.Values["ratio"]
		_, events := r.Values["events"]
		check(t, r.State == idempotency.StateConfirmed && r.Replayed == (i > 0) && r.ProviderRef == "ch_big" &&
			r.Values["chargeId"] == "ch_big" && r.Values["cents"] == float64(4200) && ok && got.Cmp(huge) == 0 && !ratio && !events,
			"Do %d: %+v", i+1, r)
	}
	check(t, calls == 1, "%d dispatches, want 1", calls)
}

func localEffect(t *testing.T, newLedger NewLedger) {
	l := newLedger(t, idempotency.Config{})
	var mu sync.Mutex
	runs := 0
	eff := idempotency.Effect{Local: func(context.Context, pgx.Tx, idempotency.Result) error {
		mu.Lock()
		defer mu.Unlock()
		runs++
		return nil
	}}
	in := charge("O1", 0)
	r := mustDo(t, l, in, eff)
	check(t, r.State == idempotency.StateConfirmed && !r.Replayed, "local: %+v", r)
	again := mustDo(t, l, in, eff)
	check(t, again.Replayed, "local replay: %+v", again)
	check(t, runs == 1, "Local ran %d times", runs)
}

func cancelled(t *testing.T, newLedger NewLedger) {
	l, p := newLedger(t, idempotency.Config{}), newProvider()
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("lock lost")
	cancel(stop)
	in := charge("X1", 900)
	_, err := l.Do(ctx, in, p.effect())
	wantErr(t, err, idempotency.ErrCancelled, failure.KindRetryable)
	check(t, errors.Is(err, stop), "the cause: %v", err)
	r := mustDo(t, l, in, p.effect())
	check(t, r.State == idempotency.StateConfirmed && !r.Replayed, "after the cancelled attempt: %+v", r)
	wantCounts(t, p, 1, 0, 1)
}
