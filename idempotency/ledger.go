package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/extworker/extworker/internal/digest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/internal/failpoint"
)

// Config configures a Ledger. Zero values take the documented defaults.
type Config struct {
	// Namespace separates tenants or applications sharing one database. Default "default".
	Namespace string
	// Lease is how long one attempt owns an intent; another attempt backs off meanwhile,
	// and takes over once it has run out. A dispatch is cut off before its lease ends.
	// Keep it shorter than the topic's lock duration plus a few extensions. Default 2m.
	Lease time.Duration
	// MaxAttempts bounds the attempts that take an intent and end without an outcome or
	// releasing it (workers dying, or losing their locks mid-dispatch): past it the
	// intent goes to operator hold. Attempts that end cleanly without sending (a 429,
	// connection refused, a cancelled handler) do not count. Default 10.
	MaxAttempts int
	// MaxReconciliations bounds the reconciliations that end still unknown. Default 5.
	MaxReconciliations int
	// ReconcileBackoff is the wait before the first re-reconciliation, doubling. Default 2s.
	ReconcileBackoff time.Duration
	// InProgressBackoff is how long an attempt that finds the intent owned by another live
	// attempt waits before asking again (at most the rest of that attempt's lease).
	// Default 1s.
	InProgressBackoff time.Duration
	// ProviderWindow is how long the provider keeps idempotency keys: past it an unknown
	// dispatch cannot be checked by key, so only Effect.Search is asked (operator hold
	// without one). The age of the first dispatch is measured on the database's clock,
	// never the worker's. Default 24h.
	ProviderWindow time.Duration
	// WriteTimeout bounds each ledger transaction. Ledger writes are detached from the
	// handler's context (what the ledger learns is written even when the handler's lock
	// was just lost); once a request has left, the writes recording its answer may take
	// until the attempt's lease ends if that is later. Default 10s.
	WriteTimeout time.Duration
	// Logger receives transitions at debug level, holds and mismatches at warn, each with
	// idempotency_scope, idempotency_key and ledger_state. Default discard.
	// Hooks.ContextLogger can substitute the running task's logger.
	Logger *slog.Logger
	// Hooks connect the ledger to metrics and to the task's logger; see Hooks and
	// Ledger.WithHooks. Default: none.
	Hooks Hooks
	// ApprovalThreshold is the two-person rule's: an operator's verdict that declares an
	// intent's money moved (confirmed) or sends it again (retry) needs a second operator
	// when the intent's Amount is above it or was not given; every verdict on an orphaned
	// intent does. Minor units. Default 0: every such verdict on an intent that moves
	// money, or may. The database enforces the threshold it holds for the namespace
	// (SetApprovalThreshold, which `extworker migrate` calls); this one only previews
	// (ApprovalNeeded), so keep the two equal.
	ApprovalThreshold int64
}

// WithDefaults returns a copy with defaults filled in.
func (c Config) WithDefaults() Config {
	if c.Namespace == "" {
		c.Namespace = "default"
	}
	if c.Lease == 0 {
		c.Lease = 2 * time.Minute
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 10
	}
	if c.MaxReconciliations == 0 {
		c.MaxReconciliations = 5
	}
	if c.ReconcileBackoff == 0 {
		c.ReconcileBackoff = 2 * time.Second
	}
	if c.InProgressBackoff == 0 {
		c.InProgressBackoff = time.Second
	}
	if c.ProviderWindow == 0 {
		c.ProviderWindow = 24 * time.Hour
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Hooks.Observer == nil {
		c.Hooks.Observer = NopObserver{}
	}
	return c
}

// Validate names every bad field.
func (c Config) Validate() error {
	var errs []error
	if c.Lease < time.Second {
		errs = append(errs, fmt.Errorf("Lease %v: must be at least 1s", c.Lease))
	}
	if c.MaxAttempts < 1 || c.MaxReconciliations < 1 {
		errs = append(errs, fmt.Errorf("MaxAttempts %d and MaxReconciliations %d: must be at least 1", c.MaxAttempts, c.MaxReconciliations))
	}
	if c.ApprovalThreshold < 0 {
		errs = append(errs, fmt.Errorf("ApprovalThreshold %d: must not be negative", c.ApprovalThreshold))
	}
	if c.ReconcileBackoff <= 0 || c.ProviderWindow <= 0 || c.WriteTimeout <= 0 {
		errs = append(errs, errors.New("ReconcileBackoff, ProviderWindow and WriteTimeout must be positive"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("idempotency config: %w", errors.Join(errs...))
	}
	return nil
}

// Ledger records intents in PostgreSQL and runs effects through them.
type Ledger struct {
	pool *pgxpool.Pool
	cfg  Config
}

// New returns a ledger on pool, whose database must be migrated (package migrations).
func New(pool *pgxpool.Pool, cfg Config) (*Ledger, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Ledger{pool: pool, cfg: cfg}, nil
}

// Digest returns the canonical digest of a request: SHA-256 of its JSON with object keys
// sorted and numbers kept as written, so equal requests have equal digests whatever the
// field order of the struct or map they came from.
func Digest(request any) (string, error) { return digest.JSON(request) }

// ProviderKey derives the Idempotency-Key the provider sees from the intent: stable
// across attempts and workers, high-entropy, and free of the business values in the key.
func ProviderKey(namespace, scope, key string) string {
	sum := sha256.Sum256([]byte(namespace + "\x00" + scope + "\x00" + key))
	return "ew_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:20]))
}

// Row is an intent as stored.
type Row struct {
	ID                int64
	Namespace         string
	Scope             string
	Key               string
	Digest            string
	ProviderKey       string
	State             State
	Attempt           int
	LeaseOwner        *string
	LeaseUntil        *time.Time
	Dispatches        int
	Reconciliations   int
	ProviderRef       *string
	Result            []byte
	ErrorCode         *string
	ErrorMessage      *string
	TaskID            *string
	ProcessInstanceID *string
	BusinessKey       *string
	FirstDispatchedAt *time.Time
	LastDispatchedAt  *time.Time
	OrphanedAt        *time.Time
	OrphanReason      *string
	// OrphanClosedAt is when two operators closed the orphan (VerdictClose): it has
	// left the orphan queue.
	OrphanClosedAt *time.Time
	CreatedAt      time.Time
	UpdatedAt      time.Time
	// AbandonedAttempts counts the attempts that took the intent and ended without
	// releasing it (a worker died, or lost its lock mid-dispatch): only these count
	// towards Config.MaxAttempts.
	AbandonedAttempts int
	// Amount is Intent.Amount as recorded (nil: not given).
	Amount *int64
	// CompensatesID is the id of the intent this one compensates (Intent.Compensates).
	CompensatesID *int64
}

const rowColumns = `id, namespace, scope, intent_key, request_digest, provider_key, state, attempt, lease_owner, lease_until,
	dispatches, reconciliations, provider_ref, result, error_code, error_message, task_id, process_instance_id, business_key,
	first_dispatched_at, last_dispatched_at, orphaned_at, orphan_reason, created_at, updated_at, abandoned_attempts, amount, compensates_id,
	orphan_closed_at`

func scanRow(r pgx.Row) (Row, error) { return scanRowAnd(r) }

// scanRowAnd scans a row's columns followed by extra ones.
func scanRowAnd(r pgx.Row, extra ...any) (Row, error) {
	var x Row
	err := r.Scan(append([]any{&x.ID, &x.Namespace, &x.Scope, &x.Key, &x.Digest, &x.ProviderKey, &x.State, &x.Attempt, &x.LeaseOwner, &x.LeaseUntil,
		&x.Dispatches, &x.Reconciliations, &x.ProviderRef, &x.Result, &x.ErrorCode, &x.ErrorMessage, &x.TaskID, &x.ProcessInstanceID,
		&x.BusinessKey, &x.FirstDispatchedAt, &x.LastDispatchedAt, &x.OrphanedAt, &x.OrphanReason, &x.CreatedAt, &x.UpdatedAt,
		&x.AbandonedAttempts, &x.Amount, &x.CompensatesID, &x.OrphanClosedAt}, extra...)...)
	return x, err
}

// attempt is one run of Do: the intent, its row as claimed, and how to reach the effect.
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
	// before the claim was sent, so never later than the lease the database holds):
	// dispatches and reconciliations are cut off before it.
	leaseEnd time.Time
	// dbNow is the database's now() read in the statement that read row, at readAt on
	// the local monotonic clock: ages of the row's timestamps are measured on the
	// database's clock (dbTime), never the worker's wall clock.
	dbNow, readAt time.Time
	// sending: the dispatch has started (the request may have left), so the writes that
	// record its answer get until the lease ends (writeCtx).
	sending bool
	// pending are the transitions of the transaction in progress, reported once it commits.
	pending []transition
}

// Do runs one effect through the ledger, at most once per intent, and returns either the
// outcome or an error that is already a failure outcome for the handler to return:
//
//   - confirmed now, or earlier (Replayed, the provider not called): the Outcome;
//   - declined: Effect.OnRejected (default failure.BPMNError with the decline's code);
//   - same key, different request: failure.Permanent(ErrDigestMismatch), nothing sent;
//   - another live attempt owns the intent: failure.Deferred(ErrInProgress): retried
//     without spending a retry, since the other attempt's lease ends by itself;
//   - dispatch ambiguous: the intent is unknown, failure.RetryableAfter(ErrUnknownOutcome);
//     the next attempt reconciles before anything is sent again;
//   - not reconcilable, or too many tries: operator hold, failure.UnknownOutcome with what
//     an operator must check;
//   - compensated (its effect undone by a compensating intent): failure.Permanent
//     (ErrCompensated); a terminal intent is never dispatched again;
//   - ctx ended before the request left: failure.Retryable(ErrCancelled), wrapping
//     context.Cause(ctx); nothing was sent, and the intent is left where the next
//     attempt proceeds from (prepared, or unknown to be reconciled first).
//
// Cancellation fences an attempt before dispatch, never in the middle of one: ctx is
// checked before the claim, right before the dispatched mark and right before the
// request leaves; a request that has left is waited for (within the lease) and its
// answer recorded even if ctx ends meanwhile.
func (l *Ledger) Do(ctx context.Context, in Intent, eff Effect) (Receipt, error) {
	if err := checkIntent(in); err != nil {
		return Receipt{}, failure.Permanent(err)
	}
	if eff.Dispatch == nil && eff.Local == nil {
		return Receipt{}, failure.Permanent(errors.New("idempotency: an effect needs Dispatch or Local"))
	}
	digest, err := Digest(in.Request)
	if err != nil {
		return Receipt{}, failure.Permanent(err)
	}
	a := &attempt{l: l, in: in, eff: eff, digest: digest}
	if in.Compensates != (IntentRef{}) {
		if a.compensates, err = l.compensated(ctx, in); err != nil {
			return Receipt{}, err
		}
	}
	out, err := a.run(ctx)
	obs := l.cfg.Hooks.Observer
	switch {
	case err == nil && out.Replayed:
		obs.DuplicateSuppressed(in.Scope, "replayed")
	case errors.Is(err, ErrInProgress):
		obs.DuplicateSuppressed(in.Scope, "in_progress")
	case errors.Is(err, ErrDigestMismatch):
		obs.DigestMismatch(in.Scope)
	}
	if f := l.cfg.Hooks.Annotate; f != nil && a.row.State != "" {
		f(ctx, slog.String("idempotency_scope", in.Scope), slog.String("idempotency_key", in.Key), slog.String("ledger_state", string(a.row.State)))
	}
	return out, err
}

// ErrInvalidIntent is an intent the ledger cannot record as given: no scope or key, or a
// field PostgreSQL cannot store (invalid UTF-8, a NUL byte) or index (too long). A retry
// could not record it either, so Do refuses it as a permanent failure, before anything
// is written or sent.
var ErrInvalidIntent = errors.New("idempotency: invalid intent")

// Bounds of what the ledger stores and indexes, in bytes.
const (
	maxScopeBytes = 200
	maxFieldBytes = 1024
)

// checkIntent is what Do refuses before it touches the database.
func checkIntent(in Intent) error {
	if in.Scope == "" || in.Key == "" {
		return fmt.Errorf("%w: it needs a scope and a key (got %q, %q)", ErrInvalidIntent, in.Scope, in.Key)
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{
		{"scope", in.Scope, maxScopeBytes}, {"key", in.Key, maxFieldBytes}, {"business key", in.Task.BusinessKey, maxFieldBytes},
		{"actor", in.Task.Actor, maxFieldBytes}, {"task id", in.Task.TaskID, maxFieldBytes},
		{"process instance id", in.Task.ProcessInstanceID, maxFieldBytes},
		{"compensated scope", in.Compensates.Scope, maxScopeBytes}, {"compensated key", in.Compensates.Key, maxFieldBytes},
	} {
		switch {
		case len(f.v) > f.max:
			return fmt.Errorf("%w: its %s is %d bytes, over %d", ErrInvalidIntent, f.name, len(f.v), f.max)
		case !utf8.ValidString(f.v):
			return fmt.Errorf("%w: its %s %+q is not valid UTF-8", ErrInvalidIntent, f.name, truncateBytes(f.v, 64))
		case strings.IndexByte(f.v, 0) >= 0:
			return fmt.Errorf("%w: its %s %+q holds a NUL byte", ErrInvalidIntent, f.name, truncateBytes(f.v, 64))
		}
	}
	return nil
}

func truncateBytes(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func (a *attempt) run(ctx context.Context) (_ Receipt, err error) {
	if err := a.fence(ctx); err != nil {
		return Receipt{}, err
	}
	cctx, span := a.startStep(ctx, spanClaim)
	cerr := a.claim(cctx)
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
				a.releaseLease(ctx) // this attempt is over: the next need not wait out the lease
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
	err := a.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		return a.moveTx(ctx, tx, StatePrepared, StateDispatched, "dispatching with the provider key",
			", dispatches = dispatches + 1, first_dispatched_at = coalesce(first_dispatched_at, now()), last_dispatched_at = now()")
	})
	if err != nil {
		return failure.Retryable(fmt.Errorf("idempotency: mark dispatched: %w", err))
	}
	a.row.State = StateDispatched
	return nil
}

// claim records the intent if it is new, and takes its lease for this attempt.
func (a *attempt) claim(ctx context.Context) error {
	l, in := a.l, a.in
	pkey := ProviderKey(l.cfg.Namespace, in.Scope, in.Key)
	// The common cases take one statement, one round trip and one commit of its own: a new
	// intent is recorded already claimed by this attempt (attempt 1, its lease, and marked
	// dispatched when there is a Dispatch, committed before the request leaves), with the
	// events that recording and claiming it append; an intent already settled with this
	// request is read as it is, without a lock (a settled intent never moves, and the
	// locked path below would only read it too). Everything else takes the locked path.
	claimTo := StatePrepared
	if a.eff.Dispatch != nil {
		claimTo = StateDispatched
	}
	start := time.Now() // the lease the database records starts no earlier
	fctx, fcancel := a.writeCtx(ctx)
	var inserted bool
	found, ferr := scanRowAnd(l.pool.QueryRow(fctx, `WITH ins AS (
			INSERT INTO extworker_intents (namespace, scope, intent_key, request_digest, provider_key, state, attempt,
				lease_owner, lease_until, dispatches, first_dispatched_at, last_dispatched_at, task_id, process_instance_id, business_key,
				amount, compensates_id)
			SELECT $1, $2, $3, $4, $5, $6, 1, $7, now() + $8::bigint * interval '1 microsecond',
				CASE WHEN $9 THEN 1 ELSE 0 END, CASE WHEN $9 THEN now() END, CASE WHEN $9 THEN now() END, $10, $11, $12, $14, $15
			WHERE NOT EXISTS (SELECT FROM extworker_intent_tombstones WHERE namespace = $1 AND scope = $2 AND intent_key = $3)
			ON CONFLICT (namespace, scope, intent_key) DO NOTHING RETURNING `+rowColumns+`),
		ev AS (
			INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, task_id, reason)
			SELECT id, NULL, 'prepared', 0, $13, $10, 'intent recorded' FROM ins
			UNION ALL
			SELECT id, 'prepared', 'dispatched', 1, $13, $10, 'dispatching with the provider key' FROM ins WHERE $9)
		SELECT `+rowColumns+`, true FROM ins
		UNION ALL
		SELECT `+rowColumns+`, false FROM extworker_intents
		WHERE namespace = $1 AND scope = $2 AND intent_key = $3 AND NOT EXISTS (SELECT FROM ins)`,
		l.cfg.Namespace, in.Scope, in.Key, a.digest, pkey, claimTo, nz(in.Task.Actor), l.cfg.Lease.Microseconds(),
		claimTo == StateDispatched, nz(in.Task.TaskID), nz(in.Task.ProcessInstanceID), nz(in.Task.BusinessKey), actorOf(in.Task.Actor),
		amountOf(in.Amount), a.compensates),
		&inserted)
	fcancel()
	switch {
	case ferr == nil && inserted:
		a.row, a.claimed = found, true
		a.leaseEnd = start.Add(l.cfg.Lease)
		a.pending = []transition{{"", StatePrepared}}
		if claimTo == StateDispatched {
			a.transitioned(ctx, StatePrepared, StateDispatched)
		}
		a.committed(nil)
		return nil
	case ferr == nil && found.Digest == a.digest && (found.State.Terminal() || found.State == StateOperatorHold):
		a.row = found
		a.leaseEnd = start.Add(l.cfg.Lease)
		if found.State == StateOperatorHold {
			return a.holdError(deref(found.ErrorMessage), ErrOperatorHold)
		}
		return nil
	case ferr != nil && !errors.Is(ferr, pgx.ErrNoRows):
		a.pending = nil
		a.committed(ferr)
		return failure.Retryable(fmt.Errorf("idempotency: claim intent %s/%s: %w", in.Scope, in.Key, ferr))
	}
	exists := ferr == nil // else another attempt recorded it concurrently, after this statement's snapshot

	var result error
	start = time.Now()
	handlerCtx := ctx
	err := a.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if !exists {
			var id int64
			// One statement records the intent and its first event (when it is new).
			err := tx.QueryRow(ctx, `WITH ins AS (
					INSERT INTO extworker_intents (namespace, scope, intent_key, request_digest, provider_key, state,
						task_id, process_instance_id, business_key, amount, compensates_id)
					SELECT $1, $2, $3, $4, $5, 'prepared', $6, $7, $8, $10, $11
					WHERE NOT EXISTS (SELECT FROM extworker_intent_tombstones WHERE namespace = $1 AND scope = $2 AND intent_key = $3)
					ON CONFLICT (namespace, scope, intent_key) DO NOTHING RETURNING id),
				ev AS (
					INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, task_id, reason)
					SELECT id, NULL, 'prepared', 0, $9, $6, 'intent recorded' FROM ins)
				SELECT id FROM ins`,
				l.cfg.Namespace, in.Scope, in.Key, a.digest, pkey, nz(in.Task.TaskID), nz(in.Task.ProcessInstanceID), nz(in.Task.BusinessKey),
				actorOf(in.Task.Actor), amountOf(in.Amount), a.compensates).Scan(&id)
			if err == nil {
				a.pending = append(a.pending, transition{"", StatePrepared})
			} else if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
		}
		// Leases, and the ages reconcile measures, are compared on the database's clock,
		// shared by every worker.
		var now time.Time
		row, err := scanRowAnd(tx.QueryRow(ctx, `SELECT `+rowColumns+`, now() FROM extworker_intents
			WHERE namespace = $1 AND scope = $2 AND intent_key = $3 FOR UPDATE`, l.cfg.Namespace, in.Scope, in.Key), &now)
		if errors.Is(err, pgx.ErrNoRows) {
			// Not recorded, and not recordable: the intent settled and was pruned.
			result, err = a.tombstoned(ctx, tx)
			return err
		}
		if err != nil {
			return err
		}
		a.row, a.dbNow, a.readAt = row, now, time.Now()
		a.leaseEnd = start.Add(l.cfg.Lease)
		switch {
		case row.Digest != a.digest:
			result = failure.Permanent(fmt.Errorf("%w: scope %s key %s was recorded with request digest %.12s…, this attempt's is %.12s…; nothing was sent",
				ErrDigestMismatch, in.Scope, in.Key, row.Digest, a.digest))
			a.logger(ctx).Warn("intent digest mismatch: same key, different request; nothing sent", slog.String("ledger_state", string(row.State)))
			return a.event(ctx, tx, row.ID, row.State, row.State, row.Attempt, "refused: same key, different request digest "+a.digest[:12])
		case row.State.Terminal() || row.State == StateOperatorHold:
			return nil
		case row.LeaseUntil != nil && row.LeaseUntil.After(now):
			wait := row.LeaseUntil.Sub(now)
			// Waiting for another attempt's lease is not a failure of this task: it must
			// not use the task's retries up (a crashed worker's lease outlives its lock).
			result = failure.Deferred(fmt.Errorf("%w (attempt %d by %s, lease ends in %v)", ErrInProgress, row.Attempt, deref(row.LeaseOwner), wait.Round(time.Millisecond)),
				min(wait, l.cfg.InProgressBackoff))
			return nil
		}
		// The previous attempt ended without releasing the intent (its lease ran out, or it
		// died after the dispatched mark): it may have dispatched, or died. Attempts that
		// ended cleanly (not sent, cancelled, waiting to reconcile) released it and do not
		// count.
		abandoned := 0
		if row.Attempt > 0 && (row.LeaseUntil != nil || row.State == StateDispatched) {
			abandoned = 1
		}
		if n := row.AbandonedAttempts + abandoned; n >= l.cfg.MaxAttempts {
			result = a.holdTx(ctx, tx, fmt.Sprintf("%d attempts took this intent and ended without an outcome or releasing it (workers dying or losing their locks)", n),
				ErrTooManyTries)
			return nil
		}
		to, reason := row.State, ""
		switch {
		case row.State == StateDispatched:
			to, reason = StateUnknown, fmt.Sprintf("attempt %d ended after dispatch without recording an outcome", row.Attempt)
		case row.State == StatePrepared && a.eff.Dispatch != nil:
			// Claim and mark dispatched in one commit: it is still committed before the
			// request leaves, one transaction sooner. The fence first: a cancelled attempt
			// neither marks nor claims (the statements run detached from ctx).
			if result = a.fence(handlerCtx); result != nil {
				return nil
			}
			to, reason = StateDispatched, "dispatching with the provider key"
		}
		// One statement: the claim, and its event when it is a transition.
		var moved int
		err = tx.QueryRow(ctx, `WITH moved AS (
				UPDATE extworker_intents SET attempt = attempt + 1, lease_owner = $2, lease_until = $3, state = $4,
					task_id = coalesce($5, task_id), process_instance_id = coalesce($6, process_instance_id), updated_at = now(),
					dispatches = dispatches + CASE WHEN $8 THEN 1 ELSE 0 END, abandoned_attempts = abandoned_attempts + $12,
					first_dispatched_at = CASE WHEN $8 THEN coalesce(first_dispatched_at, now()) ELSE first_dispatched_at END,
					last_dispatched_at = CASE WHEN $8 THEN now() ELSE last_dispatched_at END
				WHERE id = $1 AND attempt = $7 RETURNING id),
			ev AS (
				INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, task_id, reason)
				SELECT id, $9, $4, $7 + 1, $10, $5, $11 FROM moved WHERE $11 <> '')
			SELECT count(*) FROM moved`,
			row.ID, nz(in.Task.Actor), now.Add(l.cfg.Lease), to, nz(in.Task.TaskID), nz(in.Task.ProcessInstanceID), row.Attempt,
			to == StateDispatched, row.State, actorOf(in.Task.Actor), reason, abandoned).Scan(&moved)
		if err != nil {
			return err
		}
		if moved != 1 {
			return ErrFenced
		}
		a.row.Attempt++
		a.row.AbandonedAttempts += abandoned
		a.row.State = to
		a.claimed = true
		lease := now.Add(l.cfg.Lease)
		a.row.LeaseUntil = &lease
		if reason != "" {
			a.transitioned(ctx, row.State, to)
		}
		return nil
	})
	if err != nil {
		return failure.Retryable(fmt.Errorf("idempotency: claim intent %s/%s: %w", in.Scope, in.Key, err))
	}
	if result == nil && a.row.State == StateOperatorHold {
		result = a.holdError(deref(a.row.ErrorMessage), ErrOperatorHold)
	}
	return result
}

// reconcile resolves an unknown intent with the provider. proceed means: dispatch again.
//
// Within the provider's idempotency window the effect's Reconcile (by key) is asked;
// past it, a "not found by key" proves nothing (the provider may have forgotten the key,
// and a same-key resend would make a second effect), so only Search (by business key) is
// asked, and its "not found" only once the search index lag has passed since the last
// dispatch. Without either, the intent goes to an operator. Both ages are measured on
// the database's clock, which wrote the timestamps: a worker's clock that is off moves
// neither the window nor the lag.
func (a *attempt) reconcile(ctx context.Context) (proceed bool, out Receipt, err error) {
	l, r := a.l, a.row
	pastWindow := r.FirstDispatchedAt != nil && a.dbTime().Sub(*r.FirstDispatchedAt) > l.cfg.ProviderWindow
	lookup, bySearch := a.eff.Reconcile, false
	if pastWindow || lookup == nil {
		lookup, bySearch = a.eff.Search, true
	}
	if lookup == nil {
		why := "the dispatch outcome is unknown and this effect has neither Reconcile nor Search"
		if pastWindow {
			why = fmt.Sprintf("first dispatched %s, beyond the provider's %v idempotency window, and this effect has no Search",
				r.FirstDispatchedAt.Format(time.RFC3339), l.cfg.ProviderWindow)
		}
		return false, Receipt{}, a.hold(ctx, why, ErrUnknownOutcome)
	}
	rctx, cancel := context.WithDeadline(ctx, a.leaseDeadline())
	rctx, lspan := a.startStep(rctx, spanProviderLookup, trace.WithSpanKind(trace.SpanKindClient))
	asked := a.dbTime() // what the lookup can see was indexed before then, less the lag
	rec, rerr := lookup(rctx, Query{Scope: a.in.Scope, Key: a.in.Key, ProviderKey: r.ProviderKey, ProviderRef: deref(r.ProviderRef),
		FirstDispatchedAt: derefTime(r.FirstDispatchedAt), LastDispatchedAt: derefTime(r.LastDispatchedAt), BusinessKey: deref(r.BusinessKey)})
	a.endLookup(lspan, bySearch, rec, rerr)
	cancel()
	if rerr != nil && ctx.Err() != nil {
		// The handler's context ended during the lookup: no answer, and not an
		// inconclusive one to count towards MaxReconciliations. The intent stays unknown
		// for the next attempt (run releases the lease).
		return false, Receipt{}, a.fence(ctx)
	}
	if rerr != nil {
		rec = StillUnknown(rerr.Error())
	}
	var lagLeft time.Duration
	if bySearch && rec.kind == reconNotFound {
		last := derefTime(r.LastDispatchedAt)
		if last.IsZero() {
			last = derefTime(r.FirstDispatchedAt)
		}
		if since := asked.Sub(last); since < a.eff.SearchLag {
			lagLeft = a.eff.SearchLag - since
			rec = StillUnknown(fmt.Sprintf("search found nothing, but the last dispatch was %v ago, within the search index lag of %v",
				since.Round(time.Millisecond), a.eff.SearchLag))
		}
	}
	a.l.cfg.Hooks.Observer.Reconciled(a.in.Scope, reconResults[rec.kind])
	setAttr(ctx, "idempotency.reconciliation", reconResults[rec.kind])
	how := "reconciled"
	if bySearch {
		how = "reconciled by business search"
	}
	switch rec.kind {
	case reconFound:
		out, err := a.confirm(ctx, StateUnknown, StateReconciled, rec.result, how+": the provider has the effect")
		return false, out, err
	case reconRejected:
		return false, Receipt{}, a.reject(ctx, StateUnknown, rec.rejection, how+": the provider declined the request")
	case reconNotFound:
		if err := a.move(ctx, StateUnknown, StatePrepared, how+": the provider has no record; dispatch again with the same key", ""); err != nil {
			return false, Receipt{}, failure.Retryable(err)
		}
		a.row.State = StatePrepared
		return true, Receipt{}, nil
	case reconHold:
		return false, Receipt{}, a.hold(ctx, how+": "+rec.reason, ErrUnknownOutcome)
	}
	// Waiting out the index lag is not an inconclusive answer: it does not count towards
	// MaxReconciliations (the lag bounds it).
	n, counted := r.Reconciliations+1, 1
	if lagLeft > 0 {
		n, counted = r.Reconciliations, 0
	}
	if counted == 1 && n >= l.cfg.MaxReconciliations {
		return false, Receipt{}, a.hold(ctx, fmt.Sprintf("still unknown after %d reconciliations: %s", n, rec.reason), ErrUnknownOutcome)
	}
	wctx, wcancel := a.writeCtx(ctx)
	defer wcancel()
	if _, err := l.pool.Exec(wctx, `UPDATE extworker_intents SET reconciliations = reconciliations + $3, lease_owner = NULL, lease_until = NULL,
			updated_at = now() WHERE id = $1 AND attempt = $2`, r.ID, r.Attempt, counted); err != nil {
		l.cfg.Hooks.Observer.DatabaseError("ledger_write", err)
		return false, Receipt{}, failure.Retryable(err)
	}
	backoff := max(l.cfg.ReconcileBackoff<<min(max(n-1, 0), 10), lagLeft)
	return false, Receipt{}, failure.RetryableAfter(fmt.Errorf("%w: reconciliation %d of %d: %s", ErrUnknownOutcome, n, l.cfg.MaxReconciliations, rec.reason), backoff)
}

// dispatch performs the effect of an intent already marked dispatched (committed before
// anything leaves: with the claim, or by markDispatched) and records what came back.
func (a *attempt) dispatch(ctx context.Context) (Receipt, error) {
	l := a.l
	failpoint.Inject(failpoint.AfterDispatchMark)
	if err := a.fence(ctx); err != nil {
		// Cancelled after the dispatched mark committed, before the request left: nothing
		// was sent, so the intent goes back to prepared and the mark is not counted as a
		// dispatch. last_dispatched_at of an earlier dispatch is not known any more; it
		// stays at this mark, which only makes a search's lag wait longer.
		if merr := a.moveNotSent(ctx, "cancelled before the request left: "+context.Cause(ctx).Error(),
			`, dispatches = dispatches - 1, first_dispatched_at = CASE WHEN dispatches = 1 THEN NULL ELSE first_dispatched_at END,
			last_dispatched_at = CASE WHEN dispatches = 1 THEN NULL ELSE last_dispatched_at END`); merr != nil {
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
	var rej *Rejection
	switch {
	case derr == nil:
		failpoint.Inject(failpoint.AfterProviderAnswer)
		return a.confirm(ctx, StateDispatched, StateConfirmed, res, "confirmed by the provider")
	case errors.As(derr, &rej):
		return Receipt{}, a.reject(ctx, StateDispatched, rej, "declined by the provider")
	case failure.Classify(derr).Kind == failure.KindPermanent:
		// The provider refused the request outright without acting on it as a decline
		// (the key is held for a different request: a mismatch that got past the digest
		// check). Nothing will change by retrying: an operator looks at the key.
		return Receipt{}, a.hold(ctx, "the provider refused the request: "+derr.Error(), ErrKeyRefused)
	case IsNotSent(derr):
		if err := a.moveNotSent(ctx, derr.Error(), ""); err != nil {
			return Receipt{}, failure.Retryable(err)
		}
		var ra interface{ RetryAfter() time.Duration }
		if errors.As(derr, &ra) && ra.RetryAfter() > 0 {
			// The provider said when to come back (429 Retry-After): the retry waits that long.
			return Receipt{}, failure.RetryableAfter(fmt.Errorf("idempotency: dispatch %w", derr), ra.RetryAfter())
		}
		return Receipt{}, failure.Retryable(fmt.Errorf("idempotency: dispatch %w", derr))
	}
	if err := a.moveUnknown(ctx, "ambiguous dispatch: "+derr.Error()); err != nil {
		// The row stays dispatched: the next attempt, once the lease ends, treats it as unknown.
		a.logger(ctx).Warn("recording an unknown dispatch failed", slog.String("ledger_state", string(StateDispatched)), slog.Any("error", err))
	}
	return Receipt{}, failure.RetryableAfter(fmt.Errorf("%w: %w", ErrUnknownOutcome, derr), l.cfg.ReconcileBackoff)
}

// confirm records the result (and runs Local in the same transaction).
func (a *attempt) confirm(ctx context.Context, from, to State, res Result, reason string) (_ Receipt, err error) {
	ctx, span := a.startStep(ctx, spanConfirm)
	defer func() { a.endStep(span, err) }()
	values, err := json.Marshal(res.Values)
	if err != nil {
		return Receipt{}, failure.Permanent(fmt.Errorf("idempotency: result values: %w", err))
	}
	wctx, cancel := a.writeCtx(ctx)
	defer cancel()
	const sets = ", provider_ref = $5, result = $6"
	if a.eff.Local == nil && a.row.CompensatesID == nil {
		// moveTx's one statement is a transaction of its own: one round trip, no BEGIN
		// and COMMIT.
		err = a.moveTx(wctx, a.l.pool, from, to, reason, sets, nz(res.ProviderRef), values)
	} else {
		err = pgx.BeginFunc(wctx, a.l.pool, func(tx pgx.Tx) error {
			if err := a.moveTx(wctx, tx, from, to, reason, sets, nz(res.ProviderRef), values); err != nil {
				return err
			}
			if a.row.CompensatesID != nil {
				if err := a.compensateTx(wctx, tx, *a.row.CompensatesID, res.ProviderRef); err != nil {
					return err
				}
			}
			if a.eff.Local == nil {
				return nil
			}
			if err := a.eff.Local(wctx, tx, res); err != nil {
				return fmt.Errorf("%w: %w", errLocal, err)
			}
			return nil
		})
	}
	a.committed(err)
	if err != nil {
		if from == StateDispatched {
			// The provider did it; the ledger could not say so. Make the next attempt check.
			if merr := a.moveUnknown(ctx, "confirm failed after the provider answered: "+err.Error()); merr != nil {
				a.logger(ctx).Warn("recording unknown after a failed confirm failed", slog.String("ledger_state", string(StateDispatched)), slog.Any("error", merr))
			}
		}
		return Receipt{}, failure.Retryable(fmt.Errorf("idempotency: confirm %s/%s: %w", a.in.Scope, a.in.Key, err))
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
	if err := a.move(ctx, from, StateRejected, reason+": "+rej.Code, ", error_code = $5, error_message = $6", rej.Code, rej.Message); err != nil {
		return failure.Retryable(err)
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
	ctx, span := a.startStep(ctx, spanHold)
	var err error
	if txErr := a.tx(ctx, func(ctx context.Context, tx pgx.Tx) error { err = a.holdTx(ctx, tx, why, cause); return nil }); txErr != nil {
		err = failure.Retryable(txErr)
	}
	a.endStep(span, err)
	return err
}

// moveUnknown records a dispatch whose outcome is unknown: reconciled before anything is
// sent again.
func (a *attempt) moveUnknown(ctx context.Context, reason string) error {
	ctx, span := a.startStep(ctx, spanUnknown)
	err := a.move(ctx, StateDispatched, StateUnknown, reason, "")
	a.endStep(span, err)
	return err
}

// moveNotSent takes a dispatch that certainly did not leave back to prepared.
func (a *attempt) moveNotSent(ctx context.Context, reason, sets string) error {
	ctx, span := a.startStep(ctx, spanNotSent)
	err := a.move(ctx, StateDispatched, StatePrepared, reason, sets)
	a.endStep(span, err)
	return err
}

func (a *attempt) holdTx(ctx context.Context, tx pgx.Tx, why string, cause error) error {
	if err := a.moveTx(ctx, tx, a.row.State, StateOperatorHold, "operator hold: "+why, ", error_message = $5", why); err != nil {
		return failure.Retryable(err)
	}
	a.row.State = StateOperatorHold
	a.logger(ctx).Warn("intent held for an operator", slog.String("ledger_state", string(StateOperatorHold)), slog.String("reason", why))
	return a.holdError(why, cause)
}

func (a *attempt) holdError(why string, cause error) error {
	return failure.UnknownOutcome(fmt.Errorf("%w: %s; check the provider for idempotency key %s (scope %s, intent %s), then run `extworker effects resolve %s --as confirmed|rejected|retry`",
		cause, why, a.row.ProviderKey, a.in.Scope, a.in.Key, a.in.Key))
}

func (a *attempt) outcome(replayed bool) (Receipt, error) {
	out := Receipt{State: a.row.State, ProviderKey: a.row.ProviderKey, ProviderRef: deref(a.row.ProviderRef), Replayed: replayed, Attempt: a.row.Attempt}
	if len(a.row.Result) > 0 {
		if err := json.Unmarshal(a.row.Result, &out.Values); err != nil {
			return Receipt{}, failure.Permanent(fmt.Errorf("idempotency: stored result of %s/%s: %w", a.in.Scope, a.in.Key, err))
		}
	}
	return out, nil
}

// releaseLease gives up this attempt's lease if it still holds it.
func (a *attempt) releaseLease(ctx context.Context) {
	wctx, cancel := a.writeCtx(ctx)
	defer cancel()
	if _, err := a.l.pool.Exec(wctx, `UPDATE extworker_intents SET lease_owner = NULL, lease_until = NULL
		WHERE id = $1 AND attempt = $2 AND lease_until IS NOT NULL`, a.row.ID, a.row.Attempt); err != nil {
		a.logger(ctx).Warn("releasing an intent's lease failed; it runs out by itself", slog.String("ledger_state", string(a.row.State)), slog.Any("error", err))
	}
}

// move is moveTx in its own transaction.
func (a *attempt) move(ctx context.Context, from, to State, reason, sets string, args ...any) error {
	err := a.tx(ctx, func(ctx context.Context, tx pgx.Tx) error { return a.moveTx(ctx, tx, from, to, reason, sets, args...) })
	if err == nil {
		a.row.State = to
	}
	return err
}

// moveTx is the compare-and-set every transition goes through: it changes the state only
// if the row is still in from at this attempt (the fencing token), releases the lease
// when the intent leaves the in-flight states, and appends the event. It is one
// statement, so on the pool (outside a transaction) it is a transaction of its own.
func (a *attempt) moveTx(ctx context.Context, tx interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, from, to State, reason, sets string, args ...any) error {
	release := ""
	if to != StateDispatched && to != StatePrepared {
		release = ", lease_owner = NULL, lease_until = NULL"
	}
	// One statement: the compare-and-set, and its event only if the row moved.
	n := 4 + len(args)
	tag, err := tx.Exec(ctx, `WITH moved AS (
			UPDATE extworker_intents SET state = $1, updated_at = now()`+release+sets+`
			WHERE id = $2 AND state = $3 AND attempt = $4 RETURNING id)
		INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, task_id, reason)
		SELECT id, $3, $1, $4, `+fmt.Sprintf("$%d, $%d, $%d", n+1, n+2, n+3)+` FROM moved`,
		append(append([]any{to, a.row.ID, from, a.row.Attempt}, args...), actorOf(a.in.Task.Actor), nz(a.in.Task.TaskID), reason)...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("%w (%s -> %s at attempt %d)", ErrFenced, from, to, a.row.Attempt)
	}
	a.transitioned(ctx, from, to)
	return nil
}

func (a *attempt) event(ctx context.Context, tx pgx.Tx, id int64, from, to State, attempt int, reason string) error {
	_, err := tx.Exec(ctx, `INSERT INTO extworker_intent_events (intent_id, from_state, to_state, attempt, actor, task_id, reason)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, id, nz(string(from)), to, attempt, actorOf(a.in.Task.Actor), nz(a.in.Task.TaskID), reason)
	return err
}

// tx runs fn in a transaction that outlives a cancelled handler context: what the
// ledger learns must be written even when the handler's lock was just lost. fn gets the
// transaction's context (writeCtx), and runs its statements on it, never on ctx.
func (a *attempt) tx(ctx context.Context, fn func(context.Context, pgx.Tx) error) error {
	wctx, cancel := a.writeCtx(ctx)
	defer cancel()
	a.pending = nil
	err := pgx.BeginFunc(wctx, a.l.pool, func(tx pgx.Tx) error { return fn(wctx, tx) })
	a.committed(err)
	return err
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

// dbTime is the database's clock now: its now() read with the row (by the claim's locked
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

// DispatchMargin is how long before an attempt's lease (Config.Lease) ends the ledger
// ends its provider call or reconciliation: a tenth of the lease, at most 5s. A lease
// shorter than the provider's timeout plus this margin cuts calls off before their own
// timeout.
func DispatchMargin(lease time.Duration) time.Duration {
	return min(5*time.Second, lease/10)
}

// amountOf is an Intent.Amount as stored: NULL when not given.
func amountOf(a int64) *int64 {
	if a == 0 {
		return nil
	}
	return &a
}

func nz(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func derefTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

func actorOf(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
