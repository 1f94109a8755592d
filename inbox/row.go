package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// row is one message's inbox row, held under its advisory lock, and its connection: the
// database's side of a delivery. It knows its source, not its Consumer: what to do with
// the message is the Consumer's (classify, then act).
type row struct {
	conn   *pgxpool.Conn
	source string
	m      Message
	// id is the stored message id (StoredID).
	id             string
	state          State
	deliveries     int // this one included: 1 for a row this delivery made
	attempts       int
	engineFailures int
	// unresolved: an attempt's outcome at the engine is unknown (the row's
	// must_reconcile, or an attempt left processing or unknown): the engine is
	// asked before anything is sent. Cleared once it answers; set while a request that
	// changes it is out.
	unresolved bool
	// sinceReceived and sinceAttempt are how long ago, on the database's clock, the row
	// was first seen (or replayed) and the last attempt began asking the engine (zero if
	// none did).
	sinceReceived, sinceAttempt time.Duration
	// suppressed: a fresh copy of a message whose retry copy is on its way.
	suppressed bool
	// action and businessKey are what the row records of Decide's action.
	action, businessKey string
	parkKind            ParkKind
	// claim is the start claim this attempt holds (extworker_inbox_starts): settle
	// records its outcome there too.
	claim *startKey
}

// upsert records a delivery of the message and reads its row; it returns the digest of
// the body the row was recorded with.
func (r *row) upsert(ctx context.Context, f recorded, queue string, slack time.Duration) (string, error) {
	var (
		stored                      string
		sinceReceived, sinceAttempt float64
		mustReconcile               bool
	)
	// Every time is the database's now(), received_at too: the early window is measured
	// on one clock.
	// A delivery that is a duplicate, or a conflicting copy, leaves the row's queue: the
	// queue is the one whose retry or dead-letter queue holds the message's copy.
	err := r.conn.QueryRow(ctx, `INSERT INTO extworker_inbox (source, message_id, type, body_digest, correlation_id, queue, received_at, updated_at)
			VALUES ($1, $2, $3, $4, nullif($5, ''), $6, now(), now())
		ON CONFLICT (source, message_id) DO UPDATE SET deliveries = extworker_inbox.deliveries + 1, updated_at = now(),
			duplicates = extworker_inbox.duplicates + CASE WHEN extworker_inbox.body_digest = EXCLUDED.body_digest
				AND (extworker_inbox.state IN ('processed', 'ignored_duplicate', 'failed_final')
					OR ($7 AND extworker_inbox.state IN ('failed_retryable', 'unknown')
						AND extworker_inbox.retry_due_at + $8::bigint * interval '1 microsecond' > now())) THEN 1 ELSE 0 END,
			queue = CASE WHEN extworker_inbox.body_digest <> EXCLUDED.body_digest
				OR extworker_inbox.state IN ('processed', 'ignored_duplicate', 'failed_final')
				OR ($7 AND extworker_inbox.state IN ('failed_retryable', 'unknown')
					AND extworker_inbox.retry_due_at + $8::bigint * interval '1 microsecond' > now()) THEN extworker_inbox.queue ELSE EXCLUDED.queue END
		RETURNING state, body_digest, attempts, engine_failures, must_reconcile, deliveries,
			extract(epoch FROM now() - received_at)::float8,
			coalesce(extract(epoch FROM now() - attempt_started_at), 0)::float8,
			coalesce($7 AND state IN ('failed_retryable', 'unknown') AND retry_due_at + $8::bigint * interval '1 microsecond' > now(), false)`,
		r.source, r.id, f.typ, f.digest, f.corr, queue, r.m.chained && r.m.fresh, slack.Microseconds()).Scan(
		&r.state, &stored, &r.attempts, &r.engineFailures, &mustReconcile, &r.deliveries, &sinceReceived, &sinceAttempt, &r.suppressed)
	if err != nil {
		return "", fmt.Errorf("inbox: record %q: %w", r.id, err)
	}
	r.sinceReceived, r.sinceAttempt = seconds(sinceReceived), seconds(sinceAttempt)
	r.unresolved = mustReconcile || r.state == StateProcessing || r.state == StateUnknown
	return stored, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// recordConflict records a copy whose id came with another body (the row keeps the state
// of the message consumed first).
func (r *row) recordConflict(ctx context.Context, digest string) error {
	if _, err := r.conn.Exec(ctx, `WITH c AS (INSERT INTO extworker_inbox_conflicts (source, message_id, body_digest) VALUES ($1, $2, $3)
			ON CONFLICT (source, message_id, body_digest) DO UPDATE SET deliveries = extworker_inbox_conflicts.deliveries + 1)
		UPDATE extworker_inbox SET conflicts = conflicts + 1 WHERE source = $1 AND message_id = $2`, r.source, r.id, digest); err != nil {
		return fmt.Errorf("inbox: record conflict %q: %w", r.id, err)
	}
	return nil
}

// token is what the engine keeps of this message: "source/stored message id".
func (r *row) token() string { return r.source + "/" + r.id }

// begin marks the row processing (and its outcome to be reconciled), committed, before
// the engine is asked anything that changes it: a consumer that dies from here on leaves
// a row the next delivery reconciles.
func (r *row) begin(ctx context.Context) error {
	r.attempts++
	_, err := r.conn.Exec(ctx, `UPDATE extworker_inbox SET state = 'processing', attempts = $3, action = nullif($4, ''),
			business_key = nullif($5, ''), updated_at = now(), attempt_started_at = now(), must_reconcile = true
		WHERE source = $1 AND message_id = $2`, r.source, r.id, r.attempts, r.action, r.businessKey)
	if err != nil {
		return fmt.Errorf("inbox: record %q: %w", r.id, err)
	}
	return nil
}

// settle records the row's state after the engine answered (and the outcome of the start
// claim it holds), on a context the delivery's end cannot cancel (what the engine did
// must be written down). A retry of a message whose transport keeps its retry chain
// records when the chain's copy is due back.
func (r *row) settle(ctx context.Context, st State, reason, instance string, out Handling) (Handling, error) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	reason, instance = truncate(cleanText(reason), 2000), truncate(cleanText(instance), 200)
	due := int64(-1)
	if out.Disposition == Retry && r.m.chained {
		due = out.Delay.Microseconds()
	}
	var claimProcess, claimBusiness *string
	if r.claim != nil {
		claimProcess, claimBusiness = &r.claim.process, &r.claim.business
	}
	_, err := r.conn.Exec(wctx, `WITH s AS (UPDATE extworker_inbox_starts SET pending = $8,
				process_instance_id = coalesce(nullif($5, ''), process_instance_id), updated_at = now()
			WHERE process_key = $12 AND business_key = $13 AND source = $1 AND message_id = $2)
		UPDATE extworker_inbox SET state = $3, reason = nullif($4, ''),
			process_instance_id = coalesce(nullif($5, ''), process_instance_id), updated_at = now(),
			processed_at = CASE WHEN $3 IN ('processed', 'ignored_duplicate') THEN now() ELSE processed_at END,
			parked_at = CASE WHEN $3 = 'failed_final' THEN now() ELSE NULL END,
			action = coalesce(nullif($6, ''), action), business_key = coalesce(nullif($7, ''), business_key),
			must_reconcile = $8, engine_failures = $9, park_kind = nullif($10, ''),
			retry_due_at = CASE WHEN $11::bigint >= 0 THEN now() + $11::bigint * interval '1 microsecond' END
		WHERE source = $1 AND message_id = $2`, r.source, r.id, string(st), reason, instance, r.action, r.businessKey,
		r.unresolved, r.engineFailures, string(r.parkKind), due, claimProcess, claimBusiness)
	if err != nil {
		return Handling{}, fmt.Errorf("inbox: record %q as %s: %w", r.id, st, err)
	}
	out.State, out.Reason, out.ProcessInstanceID = st, reason, instance
	return out, nil
}

// lockStart takes the start's advisory lock: one consumer at a time asks the engine about
// a start of k. It returns what lets go of it.
func (r *row) lockStart(ctx context.Context, k startKey) (func(), error) {
	key := k.process + "\n" + k.business
	if _, err := r.conn.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, lockStart, key); err != nil {
		return nil, fmt.Errorf("inbox: lock start %s: %w", k.business, err)
	}
	return func() {
		if _, err := r.conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, hashtext($2))`, lockStart, key); err != nil {
			_ = r.conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}, nil
}

// readClaim reads the start claim of k, as this message sees it.
func (r *row) readClaim(ctx context.Context, k startKey) (claim, error) {
	var (
		cl    claim
		since float64
	)
	rows, err := r.conn.Query(ctx, `SELECT source = $3 AND message_id = $4, pending, extract(epoch FROM now() - attempt_started_at)::float8
		FROM extworker_inbox_starts WHERE process_key = $1 AND business_key = $2`, k.process, k.business, r.source, r.id)
	if err != nil {
		return cl, fmt.Errorf("inbox: read the start of %s: %w", k.business, err)
	}
	defer rows.Close()
	if rows.Next() {
		cl.held = true
		if err := rows.Scan(&cl.mine, &cl.pending, &since); err != nil {
			return cl, fmt.Errorf("inbox: read the start of %s: %w", k.business, err)
		}
		cl.since = seconds(since)
	}
	return cl, rows.Err()
}

// takeClaim records, committed, that this message is about to ask the engine for the
// start of k: until its answer is recorded (settle), other messages for k wait.
func (r *row) takeClaim(ctx context.Context, k startKey) error {
	_, err := r.conn.Exec(ctx, `INSERT INTO extworker_inbox_starts (process_key, business_key, source, message_id) VALUES ($1, $2, $3, $4)
		ON CONFLICT (process_key, business_key) DO UPDATE SET source = EXCLUDED.source, message_id = EXCLUDED.message_id, pending = true,
			process_instance_id = NULL, attempt_started_at = now(), updated_at = now()`, k.process, k.business, r.source, r.id)
	if err != nil {
		return fmt.Errorf("inbox: claim the start of %s: %w", k.business, err)
	}
	r.claim = &k
	return nil
}

// resolveClaim records that the engine has the instance of k, whoever sent the start.
func (r *row) resolveClaim(ctx context.Context, k startKey, instance string) error {
	_, err := r.conn.Exec(ctx, `UPDATE extworker_inbox_starts SET pending = false, process_instance_id = $3, updated_at = now()
		WHERE process_key = $1 AND business_key = $2`, k.process, k.business, instance)
	if err != nil {
		return fmt.Errorf("inbox: record the start of %s: %w", k.business, err)
	}
	return nil
}

// forget deletes the row this delivery made: a message that must leave no trace (a
// historical replay of a start, which the live channel may still deliver).
func (r *row) forget(ctx context.Context) error {
	if _, err := r.conn.Exec(ctx, `DELETE FROM extworker_inbox WHERE source = $1 AND message_id = $2 AND deliveries = 1 AND state = 'received'`,
		r.source, r.id); err != nil {
		return fmt.Errorf("inbox: forget %q: %w", r.id, err)
	}
	return nil
}
