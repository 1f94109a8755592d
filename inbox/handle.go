package inbox

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/internal/digest"
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
	// Ignored counts messages recorded as ignored_duplicate without acting: late ones
	// (ClassLate), and starts whose business key has an instance already (ClassIgnored).
	// (A message Decide answers with Action.Ignore is processed and counted nowhere but
	// in Received.)
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
func (c *Handler) Handle(ctx context.Context, m Message) (out Handling, err error) {
	f := recordOf(m, digest.Bytes(m.Body))
	ctx, span := c.startHandleSpan(ctx, f.typ)
	defer func() { endHandleSpan(span, out, err) }()
	c.stats.Received.Add(1)
	kind, reason := f.parkReason()
	out, err = c.record(ctx, m, f, kind, reason)
	if code, ok := dataException(err); ok {
		out, err = c.record(ctx, m, f.ascii(), ParkUnstorable, "PostgreSQL refused to store the message (SQLSTATE "+code+
			"): recorded with its fields escaped (hex: and their bytes in hex); not acted on")
	}
	return c.count(out), err
}

func (c *Handler) count(out Handling) Handling {
	switch {
	case out.Class == ClassDuplicate:
		c.stats.Duplicates.Add(1)
	case out.Class == ClassStarted:
		c.stats.Started.Add(1)
	case out.Class == ClassCorrelated:
		c.stats.Correlated.Add(1)
	case out.Class == ClassReconciled:
		c.stats.Reconciled.Add(1)
	case out.Class == ClassLate, out.State == StateIgnoredDuplicate:
		c.stats.Ignored.Add(1)
	}
	switch out.Disposition {
	case Retry:
		c.stats.Retried.Add(1)
	case Park:
		c.stats.Parked.Add(1)
		if out.Class == ClassConflict {
			c.stats.Conflicts.Add(1)
		}
	}
	return out
}

// record takes the message's lock (a second consumer with the same message waits here),
// upserts its row, and acts on it: parked with reason when kind is set (and the message
// not seen before).
func (c *Handler) record(ctx context.Context, m Message, f recorded, kind ParkKind, reason string) (Handling, error) {
	conn, release, err := c.lockMessage(ctx, f.id)
	if err != nil {
		return Handling{}, err
	}
	defer release()
	r := &row{conn: conn, source: c.cfg.Source, m: m, id: f.id}
	stored, err := r.upsert(ctx, f, c.cfg.Queue, suppressSlack(c.cfg))
	if err != nil {
		return Handling{}, err
	}
	fa := c.factsOf(r, stored, f.digest)
	fa.park = kind
	s := classify(fa)
	switch {
	case s.class == ClassConflict:
		return c.conflict(ctx, r, s, stored, f.digest)
	case s.class == ClassDuplicate && r.suppressed:
		return Handling{Disposition: Ack, State: r.state, Class: ClassDuplicate,
			Reason: "a copy of this message waits in the retry queue already: this one is a duplicate"}, nil
	case s.class == ClassDuplicate:
		// The upsert counted it as a duplicate.
		return Handling{Disposition: Ack, State: r.state, Class: ClassDuplicate}, nil
	case s.next == nextSettle:
		return c.finish(ctx, r, s, reason, "")
	}
	return c.act(ctx, r, fa)
}

// lockMessage takes the advisory lock of the message with the stored id on a connection
// of the pool; release lets go of the lock and the connection.
func (c *Handler) lockMessage(ctx context.Context, id string) (conn *pgxpool.Conn, release func(), err error) {
	if conn, err = c.pool.Acquire(ctx); err != nil {
		return nil, nil, fmt.Errorf("inbox: %w", err)
	}
	key := c.cfg.Source + "\n" + id
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, lockMessage, key); err != nil {
		conn.Release()
		return nil, nil, fmt.Errorf("inbox: lock %q: %w", id, err)
	}
	return conn, func() {
		// The lock is the session's: a connection that cannot say it let go is closed.
		if _, err := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, hashtext($2))`, lockMessage, key); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
		conn.Release()
	}, nil
}

// factsOf is what the row says of the message, for classify.
func (c *Handler) factsOf(r *row, stored, digest string) facts {
	return facts{state: r.state, storedDigest: stored, digest: digest, suppressed: r.suppressed, unresolved: r.unresolved,
		sinceReceived: r.sinceReceived, sinceAttempt: r.sinceAttempt, earlyWindow: c.cfg.EarlyWindow, inFlightWindow: c.cfg.InFlightWindow}
}

// conflict records a copy whose id came with another body, and parks it: the row keeps
// the state of the message consumed first.
func (c *Handler) conflict(ctx context.Context, r *row, s step, stored, digest string) (Handling, error) {
	if err := r.recordConflict(ctx, digest); err != nil {
		return Handling{}, err
	}
	c.logPark(r.id, s.parkKind)
	return Handling{Disposition: Park, State: r.state, Class: ClassConflict,
		Reason: fmt.Sprintf("conflict: message id %s was consumed with another body (digest %.12s…, this one %.12s…); not acted on", r.id, stored, digest)}, nil
}

// act decides and acts on a message that is due: received, or back from a retry, or left
// processing or unknown by an attempt whose end nobody recorded.
func (c *Handler) act(ctx context.Context, r *row, fa facts) (Handling, error) {
	a, err := c.decide(r.m)
	if err != nil {
		fa.park = ParkUnreadable
		return c.finish(ctx, r, classify(fa), "the consumer could not read the message: "+err.Error(), "")
	}
	if r.m.Replay && a.Start != nil {
		return c.replayedStart(ctx, r, a.Start.ProcessKey)
	}
	r.action, r.businessKey = actionText(a), businessKeyOf(a)
	kind, reason := checkAction(a)
	fa.park, fa.action = kind, kindOf(a)
	s := classify(fa)
	switch {
	case s.class == ClassUnknownOutcome:
		reason = fmt.Sprintf("an attempt that began %v ago may still be in flight at the engine", r.sinceAttempt.Round(time.Millisecond))
	case s.class == ClassIgnored:
		reason = "ignored: " + a.Ignore
	case s.next == nextSettle:
	case a.Start != nil:
		return c.start(ctx, r, fa, *a.Start)
	default:
		return c.correlate(ctx, r, fa, *a.Correlate)
	}
	return c.finish(ctx, r, s, reason, "")
}

// replayedStart answers a historical replay of a start, which never starts a process:
// it leaves no trace, so that the live channel, which may not have delivered the message
// yet, still acts on it. A row this delivery made is deleted; one of the live channel's
// is left as it is.
func (c *Handler) replayedStart(ctx context.Context, r *row, process string) (Handling, error) {
	if r.deliveries == 1 {
		if err := r.forget(ctx); err != nil {
			return Handling{}, err
		}
	}
	return Handling{Disposition: Ack, State: r.state, Class: ClassIgnored,
		Reason: "a historical replay never starts a process (start " + process + " not sent; the message left as the live channel has it)"}, nil
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

// finish records the step classify chose, with the reason and the instance, and says
// what the transport does: a park is logged (its kind, never the reason: reasons quote
// business keys and what Decide said of the body), a retry waits s.wait, or the backoff
// when that is 0.
func (c *Handler) finish(ctx context.Context, r *row, s step, reason, instance string) (Handling, error) {
	out := Handling{Disposition: s.disposition, Class: s.class}
	switch s.disposition {
	case Park:
		r.parkKind = s.parkKind
	case Retry:
		out.Delay = max(cmpOr(s.wait, c.backoff(r.attempts)), time.Millisecond)
		c.cfg.Logger.Info("inbox: message retried later", "source", c.cfg.Source, "message_id", logID(r.id),
			"attempt", r.attempts, "wait", out.Delay, "why", string(s.class), "state", string(s.state))
	}
	out, err := r.settle(ctx, s.state, reason, instance, out)
	if err == nil && s.disposition == Park {
		c.logPark(r.id, s.parkKind)
	}
	return out, err
}

func cmpOr(d, otherwise time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return otherwise
}

func (c *Handler) logPark(id string, kind ParkKind) {
	c.cfg.Logger.Warn("inbox: message parked in the dead-letter queue (extworker inbox show SOURCE MESSAGE_ID says why)",
		"source", c.cfg.Source, "queue", c.cfg.Queue, "message_id", logID(id), "kind", string(kind))
}

// retrying is the step of a message retried after the backoff: an unknown outcome while
// an attempt's outcome is unknown, else a plain retry.
func retrying(unresolved bool) step {
	if unresolved {
		return step{class: ClassUnknownOutcome, state: StateUnknown, disposition: Retry}
	}
	return step{class: ClassRetry, state: StateFailedRetryable, disposition: Retry}
}

// parking is the step of a message parked for kind.
func parking(kind ParkKind) step {
	return step{class: ClassParked, state: StateFailedFinal, disposition: Park, parkKind: kind}
}

// early records a message nothing waits for yet, as classify stepped it: retried, or
// parked once EarlyWindow from its first delivery (on the database's clock) has passed.
func (c *Handler) early(ctx context.Context, r *row, s step, why string) (Handling, error) {
	reason := "early: " + why
	if s.disposition == Park {
		reason = fmt.Sprintf("early for %v, past the window of %v: %s", r.sinceReceived.Round(time.Second), c.cfg.EarlyWindow, why)
	}
	return c.finish(ctx, r, s, reason, "")
}

// failed maps an engine call's error that is not the engine's verdict on the message:
// not sent or answer lost (retried; an unknown outcome is reconciled first), the engine
// failing (retried, then parked), or refused for good (parked).
func (c *Handler) failed(ctx context.Context, r *row, op string, err error) (Handling, error) {
	switch judgeEngineError(err, r.engineFailures, c.cfg.MaxEngineFailures) {
	case parkRefused:
		return c.finish(ctx, r, parking(ParkRefused), op+": the engine refused it: "+err.Error(), "")
	case parkFailing:
		r.engineFailures++
		return c.finish(ctx, r, parking(ParkEngineFailing), fmt.Sprintf("%s: the engine failed on it %d times (Config.MaxEngineFailures); the last time: %v",
			op, r.engineFailures, err), "")
	case engineFailed:
		r.engineFailures++
	}
	return c.finish(ctx, r, retrying(r.unresolved), op+": "+err.Error(), "")
}
