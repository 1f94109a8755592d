package inbox

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/extworker/extworker/internal/digest"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Stats counts what a consumer did.
type Stats struct {
	// Received counts deliveries, duplicates and retries included.
	Received atomic.Int64
	// Started and Correlated count what the engine did for this consumer.
	Started, Correlated atomic.Int64
	// Reconciled counts messages an earlier attempt had acted on without recording it:
	// found in the engine, not sent again.
	Reconciled atomic.Int64
	// Duplicates counts deliveries of messages consumed before, and copies of a message
	// that waits in the retry queue already (nothing sent).
	Duplicates atomic.Int64
	// Ignored counts messages recorded as ignored_duplicate without acting: late ones,
	// and starts whose business key has an instance already. (A message Decide answers
	// with Action.Ignore is processed and counted nowhere but in Received.)
	Ignored atomic.Int64
	// Retried counts deliveries sent to the retry queue; Parked those sent to the
	// dead-letter queue; Conflicts the parked ones whose id came with another body.
	Retried, Parked, Conflicts atomic.Int64
	// DuplicateStarts counts the starts that found more than one instance of their process
	// definition with their business key (each a WARN record): a start that reached the
	// engine after InFlightWindow (held by a proxy, say), or one from outside the inbox,
	// started a second instance. Nothing is cancelled: which to keep is an operator's call.
	DuplicateStarts atomic.Int64
}

// advisory-lock classes (pg_advisory_lock(int4, int4)): one for a message, one for a start
// by business key. A hash collision only makes two consumers wait for each other.
const (
	lockMessage = 0x696e6278 // "inbx"
	lockStart   = 0x696e7374 // "inst"
)

// Handle records m in the inbox, acts on it in the engine if it is due, and says what to
// do with the delivery. It returns an error only when the inbox itself cannot be read or
// written (the database): the delivery is then to be retried as it is. A value of the
// message's that PostgreSQL refuses (a data exception) is the message's fault: it is
// parked, recorded escaped.
//
// Handle is the consumer without its transport: Run calls it for each delivery, and a
// test or another transport may call it directly.
//
// Each message is a span, "inbox handle", with the engine's calls under it: a child of
// ctx's span, which Run sets from the delivery's traceparent and tracestate headers (the
// outbox's publish, under the trace of the task that added the event), or the root of a
// trace of its own when the delivery carries none.
func (c *Consumer) Handle(ctx context.Context, m Message) (out Outcome, err error) {
	f := recordOf(m, digest.Bytes(m.Body))
	ctx, span := c.startHandleSpan(ctx, f.typ)
	defer func() { endHandleSpan(span, out, err) }()
	c.stats.Received.Add(1)
	out, err = c.record(ctx, m, f, func(ctx context.Context, r *row) (Outcome, error) {
		if kind, reason := f.parkReason(); reason != "" {
			return r.park(ctx, kind, reason)
		}
		return c.act(ctx, r)
	})
	if code, ok := dataException(err); ok {
		out, err = c.record(ctx, m, f.ascii(), func(ctx context.Context, r *row) (Outcome, error) {
			return r.park(ctx, ParkUnstorable, "PostgreSQL refused to store the message (SQLSTATE "+code+"): recorded with its fields escaped "+
				"(hex: and their bytes in hex); not acted on")
		})
	}
	return c.count(out), err
}

func (c *Consumer) count(out Outcome) Outcome {
	switch {
	case out.Duplicate:
		c.stats.Duplicates.Add(1)
	case out.Started:
		c.stats.Started.Add(1)
	case out.Correlated:
		c.stats.Correlated.Add(1)
	case out.Reconciled:
		c.stats.Reconciled.Add(1)
	case out.State == StateIgnoredDuplicate || out.Late:
		c.stats.Ignored.Add(1)
	}
	switch out.Disposition {
	case Retry:
		c.stats.Retried.Add(1)
	case Park:
		c.stats.Parked.Add(1)
		if out.Conflict {
			c.stats.Conflicts.Add(1)
		}
	}
	return out
}

// row is one message's inbox row, held under its advisory lock.
type row struct {
	c    *Consumer
	conn *pgxpool.Conn
	m    Message
	// id is the stored message id (StoredID).
	id             string
	state          State
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

// record takes the message's lock (a second consumer with the same message waits here),
// upserts its row, and runs fn with it unless the message was seen before, or waits in
// the retry queue already.
func (c *Consumer) record(ctx context.Context, m Message, f recorded, fn func(context.Context, *row) (Outcome, error)) (Outcome, error) {
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return Outcome{}, fmt.Errorf("inbox: %w", err)
	}
	key := c.cfg.Source + "\n" + f.id
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, lockMessage, key); err != nil {
		conn.Release()
		return Outcome{}, fmt.Errorf("inbox: lock %q: %w", f.id, err)
	}
	defer func() {
		// The lock is the session's: a connection that cannot say it let go is closed.
		if _, err := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, hashtext($2))`, lockMessage, key); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
		conn.Release()
	}()
	r := &row{c: c, conn: conn, m: m, id: f.id}
	stored, err := r.upsert(ctx, f)
	switch {
	case err != nil:
		return Outcome{}, err
	case stored != f.digest:
		return r.conflict(ctx, stored, f.digest)
	case r.state == StateProcessed || r.state == StateIgnoredDuplicate || r.state == StateFailedFinal:
		// The upsert counted it as a duplicate.
		return Outcome{Disposition: Ack, State: r.state, Duplicate: true}, nil
	case r.suppressed:
		return Outcome{Disposition: Ack, State: r.state, Duplicate: true,
			Reason: "a copy of this message waits in the retry queue already: this one is a duplicate"}, nil
	}
	return fn(ctx, r)
}

// upsert records a delivery of the message and reads its row; it returns the digest of
// the body the row was recorded with.
func (r *row) upsert(ctx context.Context, f recorded) (string, error) {
	cfg := r.c.cfg
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
		RETURNING state, body_digest, attempts, engine_failures, must_reconcile,
			extract(epoch FROM now() - received_at)::float8,
			coalesce(extract(epoch FROM now() - attempt_started_at), 0)::float8,
			coalesce($7 AND state IN ('failed_retryable', 'unknown') AND retry_due_at + $8::bigint * interval '1 microsecond' > now(), false)`,
		cfg.Source, r.id, f.typ, f.digest, f.corr, cfg.Queue, r.m.chained && r.m.fresh, suppressSlack(cfg).Microseconds()).Scan(
		&r.state, &stored, &r.attempts, &r.engineFailures, &mustReconcile, &sinceReceived, &sinceAttempt, &r.suppressed)
	if err != nil {
		return "", fmt.Errorf("inbox: record %q: %w", r.id, err)
	}
	r.sinceReceived, r.sinceAttempt = seconds(sinceReceived), seconds(sinceAttempt)
	r.unresolved = mustReconcile || r.state == StateProcessing || r.state == StateUnknown
	return stored, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// conflict records a copy whose id came with another body, and parks it: the row keeps
// the state of the message consumed first.
func (r *row) conflict(ctx context.Context, stored, digest string) (Outcome, error) {
	if _, err := r.conn.Exec(ctx, `WITH c AS (INSERT INTO extworker_inbox_conflicts (source, message_id, body_digest) VALUES ($1, $2, $3)
			ON CONFLICT (source, message_id, body_digest) DO UPDATE SET deliveries = extworker_inbox_conflicts.deliveries + 1)
		UPDATE extworker_inbox SET conflicts = conflicts + 1 WHERE source = $1 AND message_id = $2`, r.c.cfg.Source, r.id, digest); err != nil {
		return Outcome{}, fmt.Errorf("inbox: record conflict %q: %w", r.id, err)
	}
	r.logPark(ParkConflict)
	return Outcome{Disposition: Park, State: r.state, Conflict: true,
		Reason: fmt.Sprintf("conflict: message id %s was consumed with another body (digest %.12s…, this one %.12s…); not acted on", r.id, stored, digest)}, nil
}

// act decides and acts on a message that is due: received, or back from a retry, or left
// processing or unknown by an attempt whose end nobody recorded.
func (c *Consumer) act(ctx context.Context, r *row) (Outcome, error) {
	a, err := c.decide(r.m)
	if err != nil {
		return r.park(ctx, ParkUnreadable, "the consumer could not read the message: "+err.Error())
	}
	r.action, r.businessKey = actionText(a), businessKeyOf(a)
	if kind, reason := checkAction(a); reason != "" {
		return r.park(ctx, kind, reason)
	}
	ambiguous := r.unresolved
	if wait := c.cfg.InFlightWindow - r.sinceAttempt; ambiguous && wait > 0 {
		// An attempt whose end nobody recorded (its consumer died, or gave up on the
		// answer) may have a request still on its way to the engine, which asking now
		// would not see: a second start. Ask once it can no longer land.
		return r.retryIn(ctx, wait, "in flight",
			fmt.Sprintf("an attempt that began %v ago may still be in flight at the engine", r.sinceAttempt.Round(time.Millisecond)))
	}
	switch {
	case a.Start != nil:
		return c.start(ctx, r, *a.Start, ambiguous)
	case a.Correlate != nil:
		return c.correlate(ctx, r, *a.Correlate, ambiguous)
	}
	return r.settle(ctx, StateProcessed, "ignored: "+a.Ignore, "", Outcome{Disposition: Ack})
}

// actionText is what the row's action column says of a.
func actionText(a Action) string {
	switch {
	case a.Start != nil:
		return truncate(cleanText("start "+a.Start.ProcessKey), 600)
	case a.Correlate != nil:
		return truncate(cleanText("correlate "+a.Correlate.MessageName), 600)
	}
	return ""
}

// token is what the engine keeps of this message: "source/stored message id".
func (r *row) token() string { return r.c.cfg.Source + "/" + r.id }

// begin marks the row processing (and its outcome to be reconciled), committed, before
// the engine is asked anything that changes it: a consumer that dies from here on leaves
// a row the next delivery reconciles.
func (r *row) begin(ctx context.Context) error {
	r.attempts++
	_, err := r.conn.Exec(ctx, `UPDATE extworker_inbox SET state = 'processing', attempts = $3, action = nullif($4, ''),
			business_key = nullif($5, ''), updated_at = now(), attempt_started_at = now(), must_reconcile = true
		WHERE source = $1 AND message_id = $2`, r.c.cfg.Source, r.id, r.attempts, r.action, r.businessKey)
	if err != nil {
		return fmt.Errorf("inbox: record %q: %w", r.id, err)
	}
	return nil
}

// settle records the row's state after the engine answered (and the outcome of the start
// claim it holds), on a context the delivery's end cannot cancel (what the engine did
// must be written down). A retry of a message whose transport keeps its retry chain
// records when the chain's copy is due back.
func (r *row) settle(ctx context.Context, st State, reason, instance string, out Outcome) (Outcome, error) {
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
		WHERE source = $1 AND message_id = $2`, r.c.cfg.Source, r.id, string(st), reason, instance, r.action, r.businessKey,
		r.unresolved, r.engineFailures, string(r.parkKind), due, claimProcess, claimBusiness)
	if err != nil {
		return Outcome{}, fmt.Errorf("inbox: record %q as %s: %w", r.id, st, err)
	}
	out.State, out.Reason, out.ProcessInstanceID = st, reason, instance
	return out, nil
}

// park records the message as parked, with the reason, and logs it (the kind, never the
// reason: reasons quote business keys and what Decide said of the body).
func (r *row) park(ctx context.Context, kind ParkKind, reason string) (Outcome, error) {
	r.parkKind = kind
	out, err := r.settle(ctx, StateFailedFinal, reason, "", Outcome{Disposition: Park})
	if err == nil {
		r.logPark(kind)
	}
	return out, err
}

func (r *row) logPark(kind ParkKind) {
	r.c.cfg.Logger.Warn("inbox: message parked in the dead-letter queue (extworker inbox show SOURCE MESSAGE_ID says why)",
		"source", r.c.cfg.Source, "queue", r.c.cfg.Queue, "message_id", logID(r.id), "kind", string(kind))
}

// retry records why the message waits and when it comes back, after the backoff.
func (r *row) retry(ctx context.Context, why, reason string) (Outcome, error) {
	return r.retryIn(ctx, r.c.backoff(r.attempts), why, reason)
}

// retryIn records why the message waits, in unknown while an attempt's outcome
// is unknown (whatever failed since), else in failed_retryable, and that it comes back
// after d.
func (r *row) retryIn(ctx context.Context, d time.Duration, why, reason string) (Outcome, error) {
	st := StateFailedRetryable
	if r.unresolved {
		st = StateUnknown
	}
	d = max(d, time.Millisecond)
	r.c.cfg.Logger.Info("inbox: message retried later", "source", r.c.cfg.Source, "message_id", logID(r.id),
		"attempt", r.attempts, "wait", d, "why", why, "state", string(st))
	return r.settle(ctx, st, reason, "", Outcome{Disposition: Retry, Delay: d})
}

// early retries a message nothing waits for yet, until EarlyWindow from its first
// delivery (on the database's clock) has passed; then it parks it.
func (r *row) early(ctx context.Context, reason string) (Outcome, error) {
	var (
		out Outcome
		err error
	)
	if earlyExpired(r.sinceReceived, r.c.cfg.EarlyWindow) {
		out, err = r.park(ctx, ParkEarly, fmt.Sprintf("early for %v, past the window of %v: %s", r.sinceReceived.Round(time.Second), r.c.cfg.EarlyWindow, reason))
	} else {
		out, err = r.retry(ctx, "early", "early: "+reason)
	}
	out.Early = true
	return out, err
}

// failed maps an engine call's error that is not the engine's verdict on the message:
// not sent or answer lost (retried; an unknown outcome is reconciled first), the engine
// failing (retried, then parked), or refused for good (parked).
func (r *row) failed(ctx context.Context, op string, err error) (Outcome, error) {
	switch judgeEngineError(err, r.engineFailures, r.c.cfg.MaxEngineFailures) {
	case parkRefused:
		return r.park(ctx, ParkRefused, op+": the engine refused it: "+err.Error())
	case parkFailing:
		r.engineFailures++
		return r.park(ctx, ParkEngineFailing, fmt.Sprintf("%s: the engine failed on it %d times (Config.MaxEngineFailures); the last time: %v",
			op, r.engineFailures, err))
	case engineFailed:
		r.engineFailures++
		return r.retry(ctx, "engine failure", op+": "+err.Error())
	}
	return r.retry(ctx, "engine", op+": "+err.Error())
}
