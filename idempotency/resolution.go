package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// This file is an operator's verdict on an intent in doubt, and the two-person rule: a
// verdict that declares money moved (confirmed) or moves it (retry), on an intent above
// Config.ApprovalThreshold or without an amount, and any verdict on an orphaned intent,
// is recorded pending; the intent changes only when a different operator approves it.
// Operators are told apart by name and by database user: each needs a login of their
// own (docs/operators.md), except on the operator console's login (ConsoleRole), which
// authenticates operators itself and is trusted to name them. Requests, approvals and
// rejections each append an event.

// Resolution is an operator's verdict on an intent in doubt.
type Resolution struct {
	// As is the verdict: StateConfirmed (the provider has the effect), StateRejected
	// (it declined, or never got it and the process must take the error path), or
	// StatePrepared (retry: it never got it; send it again, with the same provider key,
	// and count attempts and reconciliations from zero).
	As          State
	ProviderRef string
	// Values are the result values the task completes with when confirmed (what Dispatch
	// would have returned), e.g. {"paymentRef": "ch_123"}.
	Values    map[string]any
	ErrorCode string // for StateRejected
	Reason    string
	Operator  string
}

// Resolved is what Resolve and Approve did.
type Resolved struct {
	// Row is the intent after the call: settled (or back to prepared) when the verdict
	// was applied, unchanged while it waits for approval.
	Row Row
	// Pending is the verdict waiting for a second operator; nil when it was applied.
	Pending *ResolutionRequest
}

// ResolutionStatus is where a resolution request is.
type ResolutionStatus string

// A request is pending until a different operator approves it (the intent changes) or
// rejects it, or it goes stale: the intent moved on before approval (a worker reconciled
// it), and the verdict is not applied.
const (
	ResolutionPending  ResolutionStatus = "pending"
	ResolutionApproved ResolutionStatus = "approved"
	ResolutionRejected ResolutionStatus = "rejected"
	ResolutionStale    ResolutionStatus = "stale"
)

// ResolutionRequest is a verdict recorded for a second operator.
type ResolutionRequest struct {
	ID              int64
	IntentID        int64
	Scope, Key      string
	FromState       State // the intent's state when requested
	Attempt         int   // and its attempt: approval applies only if neither moved
	As              State
	ProviderRef     *string
	Values          []byte
	ErrorCode       *string
	Reason          string
	RequestedBy     string
	RequestedDBUser string
	RequestedAt     time.Time
	Status          ResolutionStatus
	DecidedBy       *string
	DecidedDBUser   *string
	DecidedAt       *time.Time
	DecisionReason  *string
}

// Decision is a second operator's answer to a pending resolution.
type Decision struct {
	Operator string
	Reason   string
}

// Errors of the two-person rule.
var (
	// ErrSelfApproval: the approver is the requester (same operator name, or same
	// database user outside the console's login).
	ErrSelfApproval = errors.New("idempotency: a resolution is approved by a different operator")
	// ErrNotPending: the resolution was already approved, rejected or went stale.
	ErrNotPending = errors.New("idempotency: resolution not pending")
	// ErrStaleResolution: the intent moved on since the resolution was requested; it was
	// not applied, and is marked stale.
	ErrStaleResolution = errors.New("idempotency: intent changed since the resolution was requested")
)

// ApprovalNeeded reports whether verdict as on r needs a second operator, and why.
func (l *Ledger) ApprovalNeeded(r Row, as State) (bool, string) {
	switch {
	case r.OrphanedAt != nil:
		return true, "the intent is orphaned (its task was cancelled after the effect was dispatched)"
	case as == StateRejected:
		return false, ""
	case r.Amount == nil:
		return true, "the intent records no amount"
	case *r.Amount > l.cfg.ApprovalThreshold:
		return true, fmt.Sprintf("its amount %d is above the approval threshold %d", *r.Amount, l.cfg.ApprovalThreshold)
	}
	return false, ""
}

// Resolve records an operator's verdict on an intent held for an operator (or still
// unknown), after the operator has checked with the provider. When ApprovalNeeded, the
// verdict is stored pending (Resolved.Pending) and the intent is left as it is until a
// different operator approves it; otherwise it is applied at once. Once applied, the next
// attempt of its task completes (or declines) from the ledger without calling the
// provider, or, for a retry, sends it again.
func (l *Ledger) Resolve(ctx context.Context, scope, key string, res Resolution) (Resolved, error) {
	res.Operator, res.Reason = strings.TrimSpace(res.Operator), strings.TrimSpace(res.Reason)
	switch {
	case res.As != StateConfirmed && res.As != StateRejected && res.As != StatePrepared:
		return Resolved{}, fmt.Errorf("resolve: the verdict must be confirmed, rejected or retry (prepared), not %q", res.As)
	case res.Operator == "" || res.Reason == "":
		return Resolved{}, errors.New("resolve: an operator and a reason are required")
	case res.As == StateConfirmed && res.ProviderRef == "":
		return Resolved{}, errors.New("resolve: confirming needs the provider's reference")
	}
	values, err := json.Marshal(res.Values)
	if err != nil {
		return Resolved{}, fmt.Errorf("resolve: values: %w", err)
	}
	r, err := l.Get(ctx, scope, key)
	if err != nil {
		return Resolved{}, err
	}
	if r.State != StateOperatorHold && r.State != StateUnknown {
		return Resolved{Row: r}, fmt.Errorf("resolve: intent %s/%s is %s; only unknown or held intents are resolved by an operator", scope, key, r.State)
	}
	req := ResolutionRequest{IntentID: r.ID, Scope: scope, Key: key, FromState: r.State, Attempt: r.Attempt, As: res.As,
		ProviderRef: nz(res.ProviderRef), Values: values, ErrorCode: nz(res.ErrorCode), Reason: res.Reason, RequestedBy: res.Operator}
	a := &attempt{l: l, in: Intent{Scope: scope, Key: key, Task: TaskRef{Actor: "operator:" + res.Operator}}, row: r}
	if need, why := l.ApprovalNeeded(r, res.As); need {
		err := a.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `INSERT INTO extworker_resolutions (intent_id, namespace, scope, intent_key, from_state, attempt, verdict,
					provider_ref, result, error_code, reason, requested_by)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING id, requested_db_user, requested_at, status`,
				r.ID, l.cfg.Namespace, scope, key, r.State, r.Attempt, res.As, req.ProviderRef, values, req.ErrorCode, res.Reason, res.Operator).
				Scan(&req.ID, &req.RequestedDBUser, &req.RequestedAt, &req.Status); err != nil {
				return err
			}
			return a.event(ctx, tx, r.ID, r.State, r.State, r.Attempt,
				fmt.Sprintf("resolution #%d requested: %s; waits for a second operator (%s): %s", req.ID, req.VerdictText(), why, res.Reason))
		})
		if err != nil {
			if isUniqueViolation(err) {
				return Resolved{Row: r}, fmt.Errorf("resolve %s/%s: a resolution is already pending for this intent; approve or reject it first (extworker effects resolutions)", scope, key)
			}
			return Resolved{Row: r}, fmt.Errorf("resolve %s/%s: %w", scope, key, err)
		}
		return Resolved{Row: r, Pending: &req}, nil
	}
	if err := a.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		return a.applyTx(ctx, tx, req, "operator resolution: "+res.Reason)
	}); err != nil {
		return Resolved{Row: r}, fmt.Errorf("resolve %s/%s: %w", scope, key, err)
	}
	r, err = l.Get(ctx, scope, key)
	return Resolved{Row: r}, err
}

// Approve applies a pending resolution on behalf of a second operator, who must differ
// from the requester by name and by database user (ErrSelfApproval; by name only on
// the console's login, ConsoleRole). If the intent has
// moved since the request, the resolution goes stale and is not applied
// (ErrStaleResolution).
func (l *Ledger) Approve(ctx context.Context, id int64, d Decision) (Resolved, error) {
	d.Operator, d.Reason = strings.TrimSpace(d.Operator), strings.TrimSpace(d.Reason)
	if d.Operator == "" || d.Reason == "" {
		return Resolved{}, errors.New("approve: an operator and a reason are required")
	}
	var out Resolved
	var refusal error
	err := l.decide(ctx, id, d, true, func(ctx context.Context, tx pgx.Tx, req *ResolutionRequest, me string) error {
		r, err := scanRow(tx.QueryRow(ctx, `SELECT `+rowColumns+` FROM extworker_intents WHERE id = $1 FOR UPDATE`, req.IntentID))
		if err != nil {
			return fmt.Errorf("read intent %s/%s: %w", req.Scope, req.Key, err)
		}
		a := &attempt{l: l, in: Intent{Scope: req.Scope, Key: req.Key, Task: TaskRef{Actor: "operator:" + d.Operator}}, row: r}
		if r.State != req.FromState || r.Attempt != req.Attempt {
			refusal = fmt.Errorf("%w: resolution #%d was asked of %s/%s when it was %s at attempt %d; it is %s at attempt %d now, so it was not applied; look again and resolve anew",
				ErrStaleResolution, id, req.Scope, req.Key, req.FromState, req.Attempt, r.State, r.Attempt)
			out.Row = r
			if err := l.settleRequest(ctx, tx, req, ResolutionStale, d); err != nil {
				return err
			}
			return a.event(ctx, tx, r.ID, r.State, r.State, r.Attempt, fmt.Sprintf("resolution #%d went stale at approval by %s: the intent moved since the request", id, d.Operator))
		}
		reason := fmt.Sprintf("operator resolution #%d: %s, requested by %s (database user %s) at %s: %s; approved by %s (database user %s): %s",
			id, req.VerdictText(), req.RequestedBy, req.RequestedDBUser, req.RequestedAt.UTC().Format(time.RFC3339), req.Reason, d.Operator, me, d.Reason)
		if err := a.applyTx(ctx, tx, *req, reason); err != nil {
			return err
		}
		return l.settleRequest(ctx, tx, req, ResolutionApproved, d)
	})
	if err != nil {
		return Resolved{}, err
	}
	if refusal != nil {
		return out, refusal
	}
	req, err := l.Resolution(ctx, id)
	if err != nil {
		return Resolved{}, err
	}
	out.Row, err = l.Get(ctx, req.Scope, req.Key)
	return out, err
}

// RejectResolution turns a pending resolution down; the intent is left as it is. A
// different operator rejects it, or its requester withdraws it.
func (l *Ledger) RejectResolution(ctx context.Context, id int64, d Decision) (ResolutionRequest, error) {
	d.Operator, d.Reason = strings.TrimSpace(d.Operator), strings.TrimSpace(d.Reason)
	if d.Operator == "" || d.Reason == "" {
		return ResolutionRequest{}, errors.New("reject: an operator and a reason are required")
	}
	err := l.decide(ctx, id, d, false, func(ctx context.Context, tx pgx.Tx, req *ResolutionRequest, me string) error {
		if err := l.settleRequest(ctx, tx, req, ResolutionRejected, d); err != nil {
			return err
		}
		a := &attempt{l: l, in: Intent{Scope: req.Scope, Key: req.Key, Task: TaskRef{Actor: "operator:" + d.Operator}}}
		return a.event(ctx, tx, req.IntentID, req.FromState, req.FromState, req.Attempt,
			fmt.Sprintf("resolution #%d (%s, requested by %s) rejected by %s (database user %s): %s; the intent is unchanged",
				id, req.VerdictText(), req.RequestedBy, d.Operator, me, d.Reason))
	})
	if err != nil {
		return ResolutionRequest{}, err
	}
	return l.Resolution(ctx, id)
}

// ConsoleRole is the database role of the operator console's login (docs/console.md).
// The console has one login for every operator and attests who is logged in, so a
// session whose user is a member of this role is told apart from the requester by
// operator name only; everywhere else the two-person rule also compares database users.
const ConsoleRole = "extworker_console"

// decide runs fn on a pending resolution of this namespace, locked, in a transaction,
// with the session's database user. approving refuses the requester: by name, and by
// database user unless the session is the console's (ConsoleRole), whose one login
// serves every operator it has authenticated.
func (l *Ledger) decide(ctx context.Context, id int64, d Decision, approving bool,
	fn func(ctx context.Context, tx pgx.Tx, req *ResolutionRequest, me string) error) error {
	wctx, cancel := context.WithTimeout(ctx, l.cfg.WriteTimeout)
	defer cancel()
	return pgx.BeginFunc(wctx, l.pool, func(tx pgx.Tx) error {
		var me string
		var console bool
		// The role is looked up first, as migrations/00003's hold trigger does for
		// extworker_operator: pg_has_role fails on a role that does not exist, and a
		// ledger without a console has none.
		req, err := scanResolution(tx.QueryRow(wctx, `SELECT `+resolutionColumns+`, session_user,
				coalesce((SELECT pg_has_role(session_user, oid, 'MEMBER') FROM pg_roles WHERE rolname = $3), false)
			FROM extworker_resolutions WHERE id = $1 AND namespace = $2 FOR UPDATE`, id, l.cfg.Namespace, ConsoleRole), &me, &console)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: no resolution #%d in namespace %s", ErrNotFound, id, l.cfg.Namespace)
		}
		if err != nil {
			return fmt.Errorf("resolution #%d: %w", id, err)
		}
		if req.Status != ResolutionPending {
			return fmt.Errorf("%w: resolution #%d is %s", ErrNotPending, id, req.Status)
		}
		if approving && (strings.EqualFold(req.RequestedBy, d.Operator) || req.RequestedDBUser == me && !console) {
			return fmt.Errorf("%w: resolution #%d was requested by %s (database user %s), and %s (database user %s) may not approve it; a second operator with a database login of their own does",
				ErrSelfApproval, id, req.RequestedBy, req.RequestedDBUser, d.Operator, me)
		}
		return fn(wctx, tx, &req, me)
	})
}

// applyTx moves the intent as req decides (the compare-and-set on its state and attempt
// as the request saw them), with reason as the event's.
func (a *attempt) applyTx(ctx context.Context, tx pgx.Tx, req ResolutionRequest, reason string) error {
	switch req.As {
	case StateConfirmed:
		return a.moveTx(ctx, tx, req.FromState, StateConfirmed, reason,
			", provider_ref = $5, result = $6, error_code = NULL, error_message = NULL", req.ProviderRef, req.Values)
	case StateRejected:
		return a.moveTx(ctx, tx, req.FromState, StateRejected, reason,
			", provider_ref = $5, error_code = $6, error_message = $7", req.ProviderRef, req.errorCode(), req.Reason)
	case StatePrepared:
		// Sent again, with the same provider key, by the next attempt: counted afresh.
		return a.moveTx(ctx, tx, req.FromState, StatePrepared, reason,
			", abandoned_attempts = 0, reconciliations = 0, error_code = NULL, error_message = NULL, lease_owner = NULL, lease_until = NULL")
	}
	return fmt.Errorf("resolution #%d: unknown verdict %q", req.ID, req.As)
}

func (l *Ledger) settleRequest(ctx context.Context, tx pgx.Tx, req *ResolutionRequest, status ResolutionStatus, d Decision) error {
	_, err := tx.Exec(ctx, `UPDATE extworker_resolutions SET status = $2, decided_by = $3, decided_db_user = session_user, decided_at = now(),
		decision_reason = $4 WHERE id = $1`, req.ID, status, d.Operator, d.Reason)
	return err
}

// VerdictText says what a resolution decides, for events and listings.
func (r ResolutionRequest) VerdictText() string {
	switch r.As {
	case StateConfirmed:
		return "confirmed (provider ref " + deref(r.ProviderRef) + ")"
	case StateRejected:
		return "rejected (error code " + r.errorCode() + ")"
	case StatePrepared:
		return "retry (send again with the same provider key)"
	}
	return string(r.As)
}

// errorCode is the code a rejection settles with: the operator's, or REJECTED.
func (r ResolutionRequest) errorCode() string {
	if code := deref(r.ErrorCode); code != "" {
		return code
	}
	return "REJECTED"
}

const resolutionColumns = `id, intent_id, scope, intent_key, from_state, attempt, verdict, provider_ref, result, error_code, reason,
	requested_by, requested_db_user, requested_at, status, decided_by, decided_db_user, decided_at, decision_reason`

func scanResolution(r pgx.Row, extra ...any) (ResolutionRequest, error) {
	var x ResolutionRequest
	err := r.Scan(append([]any{&x.ID, &x.IntentID, &x.Scope, &x.Key, &x.FromState, &x.Attempt, &x.As, &x.ProviderRef, &x.Values, &x.ErrorCode,
		&x.Reason, &x.RequestedBy, &x.RequestedDBUser, &x.RequestedAt, &x.Status, &x.DecidedBy, &x.DecidedDBUser, &x.DecidedAt,
		&x.DecisionReason}, extra...)...)
	return x, err
}

// Resolution returns one resolution request.
func (l *Ledger) Resolution(ctx context.Context, id int64) (ResolutionRequest, error) {
	req, err := scanResolution(l.pool.QueryRow(ctx, `SELECT `+resolutionColumns+` FROM extworker_resolutions WHERE id = $1 AND namespace = $2`,
		id, l.cfg.Namespace))
	if errors.Is(err, pgx.ErrNoRows) {
		return req, fmt.Errorf("%w: no resolution #%d in namespace %s", ErrNotFound, id, l.cfg.Namespace)
	}
	return req, err
}

// ResolutionFilter selects resolution requests. Zero fields do not filter.
type ResolutionFilter struct {
	Status     ResolutionStatus
	Scope, Key string
	Limit      int // default 100
}

// Resolutions returns resolution requests, newest first.
func (l *Ledger) Resolutions(ctx context.Context, f ResolutionFilter) ([]ResolutionRequest, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	// Only the filters that are set become conditions, as in List: an intent's requests
	// are then an index scan on extworker_resolutions_key, not a read of every request of
	// the namespace.
	where, args := []string{"namespace = $1"}, []any{l.cfg.Namespace}
	add := func(column, v string) {
		if v != "" {
			args = append(args, v)
			where = append(where, fmt.Sprintf("%s = $%d", column, len(args)))
		}
	}
	add("status", string(f.Status))
	add("scope", f.Scope)
	add("intent_key", f.Key)
	args = append(args, f.Limit)
	rows, err := l.pool.Query(ctx, `SELECT `+resolutionColumns+` FROM extworker_resolutions WHERE `+strings.Join(where, " AND ")+
		fmt.Sprintf(` ORDER BY id DESC LIMIT $%d`, len(args)), args...)
	if err != nil {
		return nil, fmt.Errorf("resolutions: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ResolutionRequest, error) { return scanResolution(r) })
}

// isUniqueViolation reports a unique constraint's refusal (SQLSTATE 23505).
func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}
