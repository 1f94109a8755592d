package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

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

// ApprovalNeeded reports whether verdict as on r would need a second operator under this
// ledger's Config.ApprovalThreshold, and why: a preview for listings. The database
// decides (extworker_resolve, with the threshold `extworker migrate` recorded for the
// namespace; SetApprovalThreshold).
func (o *Operations) ApprovalNeeded(r Row, as State) (bool, string) {
	switch {
	case r.OrphanedAt != nil:
		return true, "the intent is orphaned (its task was cancelled after the effect was dispatched)"
	case as == StateRejected:
		return false, ""
	case r.Amount == nil:
		return true, "the intent records no amount"
	case *r.Amount > o.cfg.ApprovalThreshold:
		return true, fmt.Sprintf("its amount %d is above the approval threshold %d", *r.Amount, o.cfg.ApprovalThreshold)
	}
	return false, ""
}

// Resolve records an operator's verdict on an intent held for an operator (or still
// unknown), after the operator has checked with the provider, or closes an orphan
// (VerdictClose). The database decides, in extworker_resolve: when a second person is
// needed the verdict is stored pending (Resolved.Pending) and the intent is left as it is
// until a different person approves it; otherwise it is applied at once. Once applied,
// the next attempt of its task completes (or declines) from the ledger without calling
// the provider, or, for a retry, sends it again.
//
// The person is the database's to say: the operator registered for the session's login
// (res.Operator, when given, must be their name), or, on the console's login only, the
// registered operator res.Operator names.
func (o *Operations) Resolve(ctx context.Context, scope, key string, res Resolution) (Resolved, error) {
	if !validText(res.Values) {
		// json.Marshal would write U+FFFD in their place: not what the operator gave.
		return Resolved{}, fmt.Errorf("resolve %s/%s: %w: a value is not valid UTF-8 text", scope, key, ErrInvalidVerdict)
	}
	values, err := json.Marshal(res.Values)
	if err != nil {
		return Resolved{}, fmt.Errorf("resolve: values: %w", err)
	}
	if res.Values == nil {
		values = nil
	}
	wctx, cancel := context.WithTimeout(ctx, o.cfg.WriteTimeout)
	defer cancel()
	var id int64
	var status, why string
	err = o.pool.QueryRow(wctx, `SELECT resolution_id, status, why FROM extworker_resolve($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		o.cfg.Namespace, scope, key, string(res.As), res.ProviderRef, values, res.ErrorCode, res.Reason, res.Operator).Scan(&id, &status, &why)
	if err != nil {
		if isUniqueViolation(err) || sqlState(err) == "EXW03" {
			err = fmt.Errorf("a resolution is already pending for this intent; approve or reject it first (extworker effects resolutions)")
		}
		return Resolved{}, fmt.Errorf("resolve %s/%s: %w", scope, key, operatorError(err))
	}
	r, err := o.Get(ctx, scope, key)
	if err != nil || status != string(ResolutionPending) {
		return Resolved{Row: r}, err
	}
	req, err := o.Resolution(ctx, id)
	return Resolved{Row: r, Pending: &req}, err
}

// Approve applies a pending resolution on behalf of a second person, who must differ
// from the requester (ErrSelfApproval): the database compares the people
// (extworker_decide), and the database users too outside the console's login. If the
// intent has moved since the request, the resolution goes stale and is not applied
// (ErrStaleResolution). d.Operator names the person as in Resolve.
func (o *Operations) Approve(ctx context.Context, id int64, d Decision) (Resolved, error) {
	req, err := o.decide(ctx, id, d, true)
	if err != nil {
		return Resolved{}, err
	}
	r, err := o.Get(ctx, req.Scope, req.Key)
	if err == nil && req.Status == ResolutionStale {
		err = fmt.Errorf("%w: resolution #%d was asked of %s/%s when it was %s at attempt %d; it is %s at attempt %d now, so it was not applied; look again and resolve anew",
			ErrStaleResolution, id, req.Scope, req.Key, req.FromState, req.Attempt, r.State, r.Attempt)
	}
	return Resolved{Row: r}, err
}

// RejectResolution turns a pending resolution down; the intent is left as it is. A
// different person rejects it, or its requester withdraws it.
func (o *Operations) RejectResolution(ctx context.Context, id int64, d Decision) (ResolutionRequest, error) {
	return o.decide(ctx, id, d, false)
}

// decide runs extworker_decide and returns the resolution as it was left.
func (o *Operations) decide(ctx context.Context, id int64, d Decision, approve bool) (ResolutionRequest, error) {
	wctx, cancel := context.WithTimeout(ctx, o.cfg.WriteTimeout)
	defer cancel()
	var status string
	if err := o.pool.QueryRow(wctx, `SELECT extworker_decide($1, $2, $3, $4, $5)`, o.cfg.Namespace, id, approve, d.Reason, d.Operator).
		Scan(&status); err != nil {
		verb := "reject"
		if approve {
			verb = "approve"
		}
		return ResolutionRequest{}, fmt.Errorf("%s resolution #%d: %w", verb, id, operatorError(err))
	}
	return o.Resolution(ctx, id)
}

// validText reports whether every string in v (and its map keys) is valid UTF-8.
func validText(v any) bool {
	switch x := v.(type) {
	case string:
		return utf8.ValidString(x)
	case map[string]any:
		for k, e := range x {
			if !utf8.ValidString(k) || !validText(e) {
				return false
			}
		}
	case []any:
		for _, e := range x {
			if !validText(e) {
				return false
			}
		}
	}
	return true
}

// ErrOperatorIdentity: the database could not tell who is acting (a login, or a name the
// console attests, that is not a registered operator; a name that is not the login's).
var ErrOperatorIdentity = errors.New("idempotency: operator identity")

// ErrInvalidVerdict: the database refused the verdict itself (no reason, no provider
// reference to confirm, an intent that is not unknown, held or an open orphan).
var ErrInvalidVerdict = errors.New("idempotency: invalid verdict")

// operatorError maps the refusals of extworker_resolve and extworker_decide (their
// SQLSTATEs, migrations/00009) to this package's errors, keeping the database's words.
func operatorError(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	sentinel := map[string]error{
		"EXW01": ErrNotPending, "EXW02": ErrSelfApproval, "EXW04": ErrOperatorIdentity, "EXW05": ErrInvalidVerdict,
		"P0002": ErrNotFound,
	}[pe.Code]
	if sentinel == nil {
		return err
	}
	return fmt.Errorf("%w: %s", sentinel, pe.Message)
}

// SetApprovalThreshold records the two-person rule's threshold for namespace in the
// database, which alone decides (extworker_resolve). Only the ledger's owner may:
// `extworker migrate` calls it with EXTWORKER_APPROVAL_THRESHOLD.
func SetApprovalThreshold(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, namespace string, threshold int64) error {
	_, err := db.Exec(ctx, `INSERT INTO extworker_ledger_settings (namespace, approval_threshold) VALUES ($1, $2)
		ON CONFLICT (namespace) DO UPDATE SET approval_threshold = EXCLUDED.approval_threshold`, namespace, threshold)
	if err != nil {
		return fmt.Errorf("idempotency: set the approval threshold of %s: %w", namespace, err)
	}
	return nil
}

// VerdictText says what a resolution decides, for events and listings.
func (r ResolutionRequest) VerdictText() string {
	switch r.As {
	case StateConfirmed:
		return "confirmed (provider ref " + deref(r.ProviderRef) + ", values " + r.ValuesText() + ")"
	case StateRejected:
		return "rejected (error code " + r.errorCode() + ")"
	case StatePrepared:
		return "retry (send again with the same provider key)"
	case VerdictClose:
		return "close the orphan (dealt with outside the ledger)"
	}
	return string(r.As)
}

// ValuesText is the values a confirmation completes the task with, as JSON ("{}" for
// none): what an approver must see before approving.
func (r ResolutionRequest) ValuesText() string {
	if len(r.Values) == 0 || string(r.Values) == "null" {
		return "{}"
	}
	return string(r.Values)
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
func (o *Operations) Resolution(ctx context.Context, id int64) (ResolutionRequest, error) {
	req, err := scanResolution(o.pool.QueryRow(ctx, `SELECT `+resolutionColumns+` FROM extworker_resolutions WHERE id = $1 AND namespace = $2`,
		id, o.cfg.Namespace))
	if errors.Is(err, pgx.ErrNoRows) {
		return req, fmt.Errorf("%w: no resolution #%d in namespace %s", ErrNotFound, id, o.cfg.Namespace)
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
func (o *Operations) Resolutions(ctx context.Context, f ResolutionFilter) ([]ResolutionRequest, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	// Only the filters that are set become conditions, as in List: an intent's requests
	// are then an index scan on extworker_resolutions_key, not a read of every request of
	// the namespace.
	where, args := []string{"namespace = $1"}, []any{o.cfg.Namespace}
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
	rows, err := o.pool.Query(ctx, `SELECT `+resolutionColumns+` FROM extworker_resolutions WHERE `+strings.Join(where, " AND ")+
		fmt.Sprintf(` ORDER BY id DESC LIMIT $%d`, len(args)), args...)
	if err != nil {
		return nil, fmt.Errorf("resolutions: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ResolutionRequest, error) { return scanResolution(r) })
}

// sqlState is err's SQLSTATE, or "" when the database did not answer with one.
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// isUniqueViolation reports a unique constraint's refusal (SQLSTATE 23505).
func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}
