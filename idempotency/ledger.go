package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/extworker/extworker/internal/digest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/failure"
)

// Config configures a Ledger. Zero values take the documented defaults.
type Config struct {
	// Namespace separates tenants or applications sharing one database: valid UTF-8,
	// without NUL bytes, at most 200 bytes (it is stored and indexed with every intent).
	// Default "default".
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

// Validate names every bad field, of c with its defaults filled in (WithDefaults): a zero
// field is valid, and means its default.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	switch ns := c.Namespace; {
	case len(ns) > maxScopeBytes:
		errs = append(errs, fmt.Errorf("Namespace is %d bytes: at most %d", len(ns), maxScopeBytes))
	case !utf8.ValidString(ns) || strings.IndexByte(ns, 0) >= 0:
		errs = append(errs, fmt.Errorf("Namespace %+q: must be valid UTF-8 without NUL bytes", truncateBytes(ns, 64)))
	}
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

// Ledger records intents in PostgreSQL (New), or in memory for tests (NewInMemory), and
// runs effects through them.
type Ledger struct {
	store store
	pool  *pgxpool.Pool // nil in memory
	cfg   Config
}

// New returns a ledger on pool, whose database must be migrated (package migrations).
func New(pool *pgxpool.Pool, cfg Config) (*Ledger, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Ledger{store: &pgStore{pool}, pool: pool, cfg: cfg}, nil
}

// Namespace is the namespace this ledger works in.
func (l *Ledger) Namespace() string { return l.cfg.Namespace }

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
	ID          int64
	Namespace   string
	Scope       string
	Key         string
	Digest      string
	ProviderKey string
	State       State
	Attempt     int
	// LeaseOwner is the actor (Intent.Task.Actor) of the attempt that holds the intent's
	// lease until LeaseUntil; both nil when no attempt holds it.
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

// Do runs one effect through the ledger, at most once per intent, and returns either the
// Receipt or an error that is already a failure outcome for the handler to return:
//
//   - confirmed now, or earlier (Replayed, the provider not called): the Receipt;
//   - declined: Effect.OnRejected (default failure.BPMNError with the decline's code);
//   - same key, different request: failure.Permanent(ErrDigestMismatch), nothing sent;
//   - another live attempt owns the intent: failure.Deferred(ErrInProgress): retried
//     without spending a retry, since the other attempt's lease ends by itself;
//   - unknown outcome of the dispatch (the request may have been acted on): the intent is
//     unknown, failure.RetryableAfter(ErrUnknownOutcome);
//     the next attempt reconciles before anything is sent again;
//   - not reconcilable, or too many tries: operator hold, failure.UnknownOutcome with what
//     an operator must check;
//   - compensated (its effect undone by a compensating intent): failure.Permanent
//     (ErrCompensated); a terminal intent is never dispatched again;
//   - a compensating intent (Intent.Compensates) whose original is not confirmed:
//     failure.Permanent(ErrNothingToCompensate); whose original another compensating
//     intent, not declined, already names: failure.Permanent(ErrCompensationExists);
//     nothing sent;
//   - not sent (Dispatch's error wraps NotSent): failure.Retryable (RetryableAfter when
//     the error carries a Retry-After), IsNotSent true; the intent is prepared again and
//     the next attempt sends it under the same key;
//   - the provider refused the key (Dispatch returned a failure.Permanent error):
//     operator hold, failure.UnknownOutcome(ErrKeyRefused);
//   - ctx ended before the request left: failure.Retryable(ErrCancelled), wrapping
//     context.Cause(ctx); nothing was sent, and the intent is left where the next
//     attempt proceeds from (prepared, or unknown to be reconciled first).
//
// Cancellation fences an attempt before dispatch, never in the middle of one: ctx is
// checked before the claim, right before the dispatched mark and right before the
// request leaves; a request that has left is waited for (within the lease) and its
// answer recorded even if ctx ends meanwhile.
//
// A panic in Effect.Dispatch or Effect.Local is not recovered: it escapes Do, and the
// intent is left as a crash would leave it (dispatched, or prepared, under this
// attempt's lease): once the lease ends, the next attempt treats a dispatched intent as
// an unknown outcome and reconciles it before anything is sent again.
func (l *Ledger) Do(ctx context.Context, in Intent, eff Effect) (Receipt, error) {
	if err := checkIntent(in); err != nil {
		return Receipt{}, failure.Permanent(err)
	}
	if eff.Dispatch == nil && eff.Local == nil {
		return Receipt{}, failure.Permanent(errors.New("idempotency: an effect needs Dispatch or Local"))
	}
	if err := CheckLease(l.cfg.Lease, eff.Timeout); err != nil {
		return Receipt{}, failure.Permanent(err)
	}
	digest, err := Digest(in.Request)
	if err != nil {
		return Receipt{}, failure.Permanent(err)
	}
	a := &attempt{l: l, in: in, eff: eff, digest: digest}
	if in.Compensates != (IntentRef{}) {
		if a.compensates, err = l.store.compensated(ctx, l, in); err != nil {
			return Receipt{}, err
		}
	}
	out, err := a.run(ctx)
	obs := l.cfg.Hooks.Observer
	switch {
	case err == nil && out.Replayed:
		obs.DuplicateSuppressed(in.Scope, "replayed")
	case errors.Is(err, ErrInProgress):
		obs.DuplicateSuppressed(in.Scope, "in-progress")
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
