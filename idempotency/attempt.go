package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/internal/failpoint"
)

// attempt is one run of Do: the intent, its row as claimed, and how to reach the effect.
// Its steps decide with the functions of decide.go and write through the ledger's store.
type attempt struct {
	l       *Ledger
	in      Intent
	eff     Effect
	row     Row
	digest  string
	claimed bool // this attempt holds the intent's lease
	// compensates is the id of the intent Intent.Compensates names (nil: none).
	compensates *int64
	// leaseEnd is when this attempt's lease ends on the local monotonic clock (taken
	// before the claim was sent, so never later than the lease the store holds):
	// dispatches and reconciliations are cut off before it.
	leaseEnd time.Time
	// dbNow is the store's clock (the database's now()) read in the statement that read
	// row, at readAt on the local monotonic clock: ages of the row's timestamps are
	// measured on the store's clock (dbTime), never the worker's wall clock.
	dbNow, readAt time.Time
	// sending: the dispatch has started (the request may have left), so the writes that
	// record its answer get until the lease ends (writeCtx).
	sending bool
	// pending are the transitions of the transaction in progress, reported once it commits.
	pending []transition
}

// claimRequest is what this attempt brings to the claim.
func (a *attempt) claimRequest() claimRequest {
	c := a.l.cfg
	return claimRequest{digest: a.digest, dispatch: a.eff.Dispatch != nil, lease: c.Lease,
		inProgressBackoff: c.InProgressBackoff, maxAttempts: c.MaxAttempts}
}

func (a *attempt) run(ctx context.Context) (_ Receipt, err error) {
	if err := a.fence(ctx); err != nil {
		return Receipt{}, err
	}
	cctx, span := a.startStep(ctx, spanClaim)
	cerr := a.l.store.claim(cctx, a)
	if cerr == nil && a.row.State.Terminal() {
		setAttr(cctx, "idempotency.result", "settled") // replayed from the ledger, the provider not called
	}
	a.endStep(span, cerr)
	if cerr != nil {
		return Receipt{}, cerr
	}
	if a.claimed {
		defer func() {
			if err != nil {
				a.l.store.releaseLease(ctx, a) // this attempt is over: the next need not wait out the lease
			}
		}()
	}
	if a.row.State.Terminal() {
		return a.settled()
	}
	if a.row.State == StateUnknown {
		rctx, span := a.startStep(ctx, spanReconcile)
		proceed, out, err := a.reconcile(rctx)
		a.endStep(span, err)
		if !proceed {
			return out, err
		}
	}
	failpoint.Inject(failpoint.AfterPrepared)
	if a.eff.Dispatch == nil {
		if err := a.fence(ctx); err != nil {
			return Receipt{}, err
		}
		return a.confirm(ctx, StatePrepared, StateConfirmed, Result{}, "local effect committed with the ledger")
	}
	if a.row.State == StatePrepared { // back from unknown (not found) in this attempt
		mctx, span := a.startStep(ctx, spanMarkDispatched)
		merr := a.markDispatched(mctx)
		a.endStep(span, merr)
		if merr != nil {
			return Receipt{}, merr
		}
	}
	return a.dispatch(ctx)
}

// claimRefusal is the error of a claim that neither takes the intent nor replays it
// (nil for the others): a digest mismatch, another attempt's live lease, an operator
// hold.
func (a *attempt) claimRefusal(ctx context.Context, d claimDecision) error {
	row := a.row
	switch d.kind {
	case claimMismatch:
		a.logger(ctx).Warn("intent digest mismatch: same key, different request; nothing sent", slog.String("ledger_state", string(row.State)))
		return failure.Permanent(fmt.Errorf("%w: scope %s key %s was recorded with request digest %.12s…, this attempt's is %.12s…; nothing was sent",
			ErrDigestMismatch, a.in.Scope, a.in.Key, row.Digest, a.digest))
	case claimWait:
		// Waiting for another attempt's lease is not a failure of this task: it must
		// not use the task's retries up (a crashed worker's lease outlives its lock).
		return failure.Deferred(fmt.Errorf("%w (attempt %d by %s, lease ends in %v)", ErrInProgress, row.Attempt, deref(row.LeaseOwner),
			d.leaseLeft.Round(time.Millisecond)), d.wait)
	case claimHeld:
		return a.holdError(deref(row.ErrorMessage), ErrOperatorHold)
	}
	return nil
}

// mismatchReason is the event a refused digest mismatch appends.
func (a *attempt) mismatchReason() string {
	return "refused: same key, different request digest " + a.digest[:12]
}

// settled returns what a terminal intent settled as, without calling the provider: every
// terminal state is final, for this attempt and every later one.
func (a *attempt) settled() (Receipt, error) {
	switch a.row.State {
	case StateConfirmed, StateReconciled:
		return a.outcome(true)
	case StateRejected:
		a.l.cfg.Hooks.Observer.DuplicateSuppressed(a.in.Scope, "replayed")
		return Receipt{}, a.rejected(&Rejection{Code: deref(a.row.ErrorCode), Message: deref(a.row.ErrorMessage)})
	}
	cause := errors.New("idempotency: intent settled")
	if a.row.State == StateCompensated {
		// The effect was performed and undone; doing it again is a new business command,
		// with a new key.
		cause = ErrCompensated
	}
	a.l.cfg.Hooks.Observer.DuplicateSuppressed(a.in.Scope, "replayed")
	return Receipt{}, failure.Permanent(fmt.Errorf("%w: intent %s/%s is %s and is never dispatched again (provider key %s); a new effect needs a new intent key",
		cause, a.in.Scope, a.in.Key, a.row.State, a.row.ProviderKey))
}

// fence stops an attempt whose handler's context has ended, before it sends anything: it
// returns an error wrapping ErrCancelled and context.Cause(ctx), or nil while ctx lives.
func (a *attempt) fence(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	return failure.Retryable(fmt.Errorf("%w (%s/%s): %w", ErrCancelled, a.in.Scope, a.in.Key, context.Cause(ctx)))
}

// markDispatched commits the dispatched mark before anything leaves.
func (a *attempt) markDispatched(ctx context.Context) error {
	if err := a.fence(ctx); err != nil {
		return err
	}
	if err := a.move(ctx, StatePrepared, StateDispatched, "dispatching with the provider key", change{dispatchMark: true}); err != nil {
		return storeFailed(fmt.Errorf("idempotency: mark dispatched: %w", err))
	}
	return nil
}

// reconcile resolves an unknown intent with the provider (planLookup says how, and
// judgeReconciliation what the answer leads to). proceed means: dispatch again. Both
// the provider's key window and a search's index lag are measured on the store's clock,
// which wrote the timestamps: a worker's clock that is off moves neither.
func (a *attempt) reconcile(ctx context.Context) (proceed bool, out Receipt, err error) {
	r, cfg := a.row, a.l.cfg
	plan := planLookup(a.eff.Reconcile != nil, a.eff.Search != nil, r.FirstDispatchedAt, a.dbTime(), cfg.ProviderWindow)
	if plan.none {
		why := "the dispatch outcome is unknown and this effect has neither Reconcile nor Search"
		if plan.pastWindow {
			why = fmt.Sprintf("first dispatched %s, beyond the provider's %v idempotency window, and this effect has no Search",
				r.FirstDispatchedAt.Format(time.RFC3339), cfg.ProviderWindow)
		}
		return false, Receipt{}, a.hold(ctx, why, ErrUnknownOutcome)
	}
	ans, err := a.lookup(ctx, plan.bySearch)
	if err != nil {
		return false, Receipt{}, err
	}
	d := judgeReconciliation(ans, cfg.MaxReconciliations, cfg.ReconcileBackoff)
	cfg.Hooks.Observer.Reconciled(a.in.Scope, reconResults[d.rec.kind])
	setAttr(ctx, "idempotency.reconciliation", reconResults[d.rec.kind])
	how := "reconciled"
	if plan.bySearch {
		how = "reconciled by business search"
	}
	switch {
	case d.rec.kind == reconFound:
		out, err := a.confirm(ctx, StateUnknown, StateReconciled, d.rec.result, how+": the provider has the effect")
		return false, out, err
	case d.rec.kind == reconRejected:
		return false, Receipt{}, a.reject(ctx, StateUnknown, d.rec.rejection, how+": the provider declined the request")
	case d.rec.kind == reconAbsent:
		if err := a.move(ctx, StateUnknown, StatePrepared, how+": the provider has no record; dispatch again with the same key", change{}); err != nil {
			return false, Receipt{}, storeFailed(err)
		}
		return true, Receipt{}, nil
	case d.rec.kind == reconHold:
		return false, Receipt{}, a.hold(ctx, how+": "+d.rec.reason, ErrUnknownOutcome)
	case d.hold:
		// The reconciliation that reached the limit counts, as the reason says.
		return false, Receipt{}, a.holdChange(ctx, d.reason, ErrUnknownOutcome, change{reconciled: true})
	}
	if err := a.l.store.inconclusive(ctx, a, d.counted); err != nil {
		cfg.Hooks.Observer.DatabaseError("ledger-write", err)
		return false, Receipt{}, storeFailed(err)
	}
	return false, Receipt{}, failure.RetryableAfter(fmt.Errorf("%w: reconciliation %d of %d: %s", ErrUnknownOutcome, d.n, cfg.MaxReconciliations, d.rec.reason), d.backoff)
}

// lookup asks the provider about an unknown dispatch (Effect.Search when bySearch, else
// Effect.Reconcile), within the lease. An error is the handler's context ending meanwhile:
// no answer, and not an inconclusive one to count towards MaxReconciliations; the intent
// stays unknown for the next attempt (run releases the lease).
func (a *attempt) lookup(ctx context.Context, bySearch bool) (reconAnswer, error) {
	r, lookup := a.row, a.eff.Reconcile
	if bySearch {
		lookup = a.eff.Search
	}
	rctx, cancel := context.WithDeadline(ctx, a.leaseDeadline())
	rctx, lspan := a.startStep(rctx, spanProviderLookup, trace.WithSpanKind(trace.SpanKindClient))
	asked := a.dbTime() // what the lookup can see was indexed before then, less the lag
	rec, rerr := lookup(rctx, Query{Scope: a.in.Scope, Key: a.in.Key, ProviderKey: r.ProviderKey, ProviderRef: deref(r.ProviderRef),
		FirstDispatchedAt: derefTime(r.FirstDispatchedAt), LastDispatchedAt: derefTime(r.LastDispatchedAt), BusinessKey: deref(r.BusinessKey)})
	a.endLookup(lspan, bySearch, rec, rerr)
	cancel()
	if rerr != nil && ctx.Err() != nil {
		return reconAnswer{}, a.fence(ctx)
	}
	last := derefTime(r.LastDispatchedAt)
	if last.IsZero() {
		last = derefTime(r.FirstDispatchedAt)
	}
	return reconAnswer{rec: rec, err: rerr, bySearch: bySearch, searchLag: a.eff.SearchLag, sinceDispatch: asked.Sub(last),
		reconciliations: r.Reconciliations}, nil
}

// dispatch performs the effect of an intent already marked dispatched (committed before
// anything leaves: with the claim, or by markDispatched) and records what came back
// (classifyDispatch says what it means).
func (a *attempt) dispatch(ctx context.Context) (Receipt, error) {
	failpoint.Inject(failpoint.AfterDispatchMark)
	if err := a.fence(ctx); err != nil {
		// Cancelled after the dispatched mark committed, before the request left: nothing
		// was sent, so the intent goes back to prepared and the mark is not counted as a
		// dispatch. last_dispatched_at of an earlier dispatch is not known any more; it
		// stays at this mark, which only makes a search's lag wait longer.
		if merr := a.moveNotSent(ctx, "cancelled before the request left: "+context.Cause(ctx).Error(), change{undoDispatchMark: true}); merr != nil {
			// The row stays dispatched: the next attempt, once the lease ends, reconciles it.
			a.logger(ctx).Warn("recording a dispatch cancelled before it left failed", slog.String("ledger_state", string(StateDispatched)), slog.Any("error", merr))
		}
		return Receipt{}, err
	}
	// Once the request may leave, it is not abandoned when the handler's context ends (a
	// lost lock, a cancelled task, shutdown): its answer is waited for, within the lease,
	// and recorded (on writes detached from ctx, see writeCtx), rather than turned into an
	// unknown outcome. Cancellation stops an attempt before dispatch (the fence above),
	// not in the middle of one.
	a.sending = true
	dctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), a.leaseDeadline())
	dctx, pspan := a.startStep(dctx, spanProviderCall, trace.WithSpanKind(trace.SpanKindClient))
	res, derr := a.eff.Dispatch(dctx, a.row.ProviderKey)
	a.endProviderCall(pspan, derr)
	cancel()
	return a.recordAnswer(ctx, res, derr)
}

// recordAnswer records what a dispatch came back with.
func (a *attempt) recordAnswer(ctx context.Context, res Result, derr error) (Receipt, error) {
	verdict, rej, retryAfter := classifyDispatch(derr)
	switch verdict {
	case dispatchConfirmed:
		failpoint.Inject(failpoint.AfterProviderAnswer)
		return a.confirm(ctx, StateDispatched, StateConfirmed, res, "confirmed by the provider")
	case dispatchRejected:
		return Receipt{}, a.reject(ctx, StateDispatched, rej, "declined by the provider")
	case dispatchKeyRefused:
		// The provider refused the request outright without acting on it as a decline
		// (the key is held for a different request: a mismatch that got past the digest
		// check). Nothing will change by retrying: an operator looks at the key.
		return Receipt{}, a.hold(ctx, "the provider refused the request: "+derr.Error(), ErrKeyRefused)
	case dispatchNotSent:
		if err := a.moveNotSent(ctx, derr.Error(), change{}); err != nil {
			return Receipt{}, storeFailed(err)
		}
		if retryAfter > 0 {
			// The provider said when to come back (429 Retry-After): the retry waits that long.
			return Receipt{}, failure.RetryableAfter(fmt.Errorf("idempotency: dispatch %w", derr), retryAfter)
		}
		return Receipt{}, failure.Retryable(fmt.Errorf("idempotency: dispatch %w", derr))
	}
	if err := a.moveUnknown(ctx, "unknown outcome of the dispatch: "+derr.Error()); err != nil {
		// The row stays dispatched: the next attempt, once the lease ends, treats it as unknown.
		a.logger(ctx).Warn("recording an unknown dispatch failed", slog.String("ledger_state", string(StateDispatched)), slog.Any("error", err))
	}
	return Receipt{}, failure.RetryableAfter(fmt.Errorf("%w: %w", ErrUnknownOutcome, derr), a.l.cfg.ReconcileBackoff)
}

// confirm records the result (and runs Local in the same transaction).
func (a *attempt) confirm(ctx context.Context, from, to State, res Result, reason string) (_ Receipt, err error) {
	ctx, span := a.startStep(ctx, spanConfirm)
	defer func() { a.endStep(span, err) }()
	res.ProviderRef, reason = storable(res.ProviderRef), storable(reason)
	var values []byte
	var dropped []string
	if res.Values, values, dropped, err = storableValues(res.Values); err != nil {
		return Receipt{}, failure.Permanent(fmt.Errorf("idempotency: result values: %w", err))
	}
	if len(dropped) > 0 {
		// The provider has acted: the intent is confirmed with the values that can be stored.
		reason = storable(reason + "; values not stored (not encodable as JSON): " + strings.Join(dropped, ", "))
		a.logger(ctx).Warn("result values not stored: not encodable as JSON", slog.String("ledger_state", string(to)),
			slog.String("values", strings.Join(dropped, ", ")))
	}
	if err := a.l.store.confirm(ctx, a, from, to, res, values, reason); err != nil {
		if from == StateDispatched {
			// The provider did it; the ledger could not say so. Make the next attempt check.
			if merr := a.moveUnknown(ctx, "confirm failed after the provider answered: "+err.Error()); merr != nil {
				a.logger(ctx).Warn("recording unknown after a failed confirm failed", slog.String("ledger_state", string(StateDispatched)), slog.Any("error", merr))
			}
		}
		return Receipt{}, storeFailed(fmt.Errorf("idempotency: confirm %s/%s: %w", a.in.Scope, a.in.Key, err))
	}
	failpoint.Inject(failpoint.AfterConfirm)
	a.row.State, a.row.Result = to, values
	ref := res.ProviderRef
	a.row.ProviderRef = &ref
	return a.outcome(false)
}

func (a *attempt) reject(ctx context.Context, from State, rej *Rejection, reason string) (err error) {
	ctx, span := a.startStep(ctx, spanReject)
	defer func() { a.endStep(span, err) }()
	if rej.Code != storable(rej.Code) || rej.Message != storable(rej.Message) {
		r := *rej // the provider's own error is left as it is
		r.Code, r.Message = storable(r.Code), storable(r.Message)
		rej = &r
	}
	if err := a.move(ctx, from, StateRejected, reason+": "+rej.Code, change{errorCode: &rej.Code, errorMessage: &rej.Message}); err != nil {
		return storeFailed(err)
	}
	return a.rejected(rej)
}

func (a *attempt) rejected(rej *Rejection) error {
	if a.eff.OnRejected != nil {
		return a.eff.OnRejected(rej)
	}
	return failure.BPMNError(rej.Code, rej.Message, nil)
}

// hold parks the intent for an operator and returns the incident for the handler.
func (a *attempt) hold(ctx context.Context, why string, cause error) error {
	return a.holdChange(ctx, why, cause, change{})
}

// holdChange is hold that also records ch (its errorMessage is why).
func (a *attempt) holdChange(ctx context.Context, why string, cause error, ch change) error {
	ctx, span := a.startStep(ctx, spanHold)
	why = storable(why)
	ch.errorMessage = &why
	err := a.move(ctx, a.row.State, StateOperatorHold, "operator hold: "+why, ch)
	if err != nil {
		err = storeFailed(err)
	} else {
		err = a.held(ctx, why, cause)
	}
	a.endStep(span, err)
	return err
}

// held notes a hold the store recorded, and returns the incident for the handler.
func (a *attempt) held(ctx context.Context, why string, cause error) error {
	a.row.State = StateOperatorHold
	a.logger(ctx).Warn("intent held for an operator", slog.String("ledger_state", string(StateOperatorHold)), slog.String("reason", why))
	return a.holdError(why, cause)
}

// moveUnknown records a dispatch whose outcome is unknown: reconciled before anything is
// sent again.
func (a *attempt) moveUnknown(ctx context.Context, reason string) error {
	ctx, span := a.startStep(ctx, spanUnknown)
	err := a.move(ctx, StateDispatched, StateUnknown, reason, change{})
	a.endStep(span, err)
	return err
}

// moveNotSent takes a dispatch that certainly did not leave back to prepared.
func (a *attempt) moveNotSent(ctx context.Context, reason string, ch change) error {
	ctx, span := a.startStep(ctx, spanNotSent)
	err := a.move(ctx, StateDispatched, StatePrepared, reason, ch)
	a.endStep(span, err)
	return err
}

// move is the store's compare-and-set of a transition (see change), noted in the row.
// Text is made storable here (storable), the same for every store.
func (a *attempt) move(ctx context.Context, from, to State, reason string, ch change) error {
	ch.errorCode, ch.errorMessage = storablePtr(ch.errorCode), storablePtr(ch.errorMessage)
	err := a.l.store.move(ctx, a, from, to, storable(reason), ch)
	if err == nil {
		a.row.State = to
	}
	return err
}

// holdError is the incident: what to check, and the command that settles the intent
// (with --scope: a key may be in several scopes), in words a shell keeps whole.
func (a *attempt) holdError(why string, cause error) error {
	return failure.UnknownOutcome(fmt.Errorf("%w: %s; check the provider for idempotency key %s (scope %s, intent %s), then run "+
		"`extworker effects resolve %s --scope %s --as VERDICT --reason TEXT` (VERDICT: confirmed --provider-ref REF, rejected, or retry)",
		cause, why, a.row.ProviderKey, a.in.Scope, a.in.Key, shellWord(a.in.Key), shellWord(a.in.Scope)))
}

// shellWord is s as one shell word: as it is when it holds nothing a shell would read,
// else single-quoted.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:/@%+=,-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func (a *attempt) outcome(replayed bool) (Receipt, error) {
	out := Receipt{State: a.row.State, ProviderKey: a.row.ProviderKey, ProviderRef: deref(a.row.ProviderRef), Replayed: replayed, Attempt: a.row.Attempt}
	if len(a.row.Result) > 0 {
		var err error
		if out.Values, err = decodeValues(a.row.Result); err != nil {
			return Receipt{}, failure.Permanent(fmt.Errorf("idempotency: stored result of %s/%s: %w", a.in.Scope, a.in.Key, err))
		}
	}
	return out, nil
}

// writeCtx is the context of a ledger write: ctx's values without its cancellation,
// bounded by WriteTimeout. Once the dispatch has started, the bound is at least the end
// of this attempt's lease: the dispatch is cut off a margin before it (leaseDeadline),
// so an answer the worker had is always given the time to be recorded while the
// attempt still owns the intent (after that, another attempt may take it over, and the
// compare-and-set on the attempt fences this one off).
func (a *attempt) writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline := time.Now().Add(a.l.cfg.WriteTimeout)
	if a.sending && a.leaseEnd.After(deadline) {
		deadline = a.leaseEnd
	}
	return context.WithDeadline(context.WithoutCancel(ctx), deadline)
}

// dbTime is the store's clock now: its now() read with the row (by the claim's locked
// path, the only one that leads to a reconciliation), advanced by the local monotonic
// time since. Ages of stored timestamps are measured with it, so the worker's wall
// clock (and any skew it has) never enters a comparison.
func (a *attempt) dbTime() time.Time {
	return a.dbNow.Add(time.Since(a.readAt))
}

// leaseDeadline is when a dispatch or reconciliation must be over: DispatchMargin before
// the lease ends, so no call outlives this attempt's ownership.
func (a *attempt) leaseDeadline() time.Time {
	return a.leaseEnd.Add(-DispatchMargin(a.l.cfg.Lease))
}
