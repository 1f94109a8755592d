package inbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/failpoint"
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
	// Duplicates counts deliveries of messages consumed before (nothing sent).
	Duplicates atomic.Int64
	// Ignored counts messages recorded as IGNORED_DUPLICATE without acting: late ones,
	// and starts whose business key has an instance already. (A message Decide answers
	// with Action.Ignore is PROCESSED and counted nowhere but in Received.)
	Ignored atomic.Int64
	// Retried counts deliveries sent to the retry queue; Parked those sent to the
	// dead-letter queue; Conflicts the parked ones whose id came with another body.
	Retried, Parked, Conflicts atomic.Int64
}

// advisory-lock classes (pg_advisory_lock(int4, int4)): one for a message, one for a start
// by business key. A hash collision only makes two consumers wait for each other.
const (
	lockMessage = 0x696e6278 // "inbx"
	lockStart   = 0x696e7374 // "inst"
)

// Handle records m in the inbox, acts on it in the engine if it is due, and says what to
// do with the delivery. It returns an error only when the inbox itself cannot be read or
// written (the database): the delivery is then to be retried as it is.
//
// Handle is the consumer without its transport: Run calls it for each delivery, and a
// test or another transport may call it directly.
//
// Each message is a span, "inbox handle", with the engine's calls under it: a child of
// ctx's span, which Run sets from the delivery's traceparent and tracestate headers (the
// outbox's publish, under the trace of the task that added the event), or the root of a
// trace of its own when the delivery carries none.
func (c *Consumer) Handle(ctx context.Context, m Message) (out Outcome, err error) {
	ctx, span := c.startHandleSpan(ctx, m)
	defer func() { endHandleSpan(span, out, err) }()
	c.stats.Received.Add(1)
	digest := Digest(m.Body)
	if m.ID == "" {
		// Nothing to deduplicate by: recorded under its digest, and parked.
		m.ID = "sha256:" + digest
		out, err = c.record(ctx, m, digest, func(ctx context.Context, r *row) (Outcome, error) {
			return r.park(ctx, "the message has no message id: it cannot be deduplicated, so it is not acted on")
		})
		return c.count(out), err
	}
	out, err = c.record(ctx, m, digest, func(ctx context.Context, r *row) (Outcome, error) { return c.act(ctx, r) })
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
	c          *Consumer
	conn       *pgxpool.Conn
	m          Message
	state      State
	attempts   int
	receivedAt time.Time
	// sinceAttempt is how long ago (by the database's clock) the last attempt began
	// asking the engine; zero if none did.
	sinceAttempt time.Duration
}

// record takes the message's lock (a second consumer with the same message waits here),
// upserts its row, and runs fn with it unless the message was seen before.
func (c *Consumer) record(ctx context.Context, m Message, digest string, fn func(context.Context, *row) (Outcome, error)) (Outcome, error) {
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return Outcome{}, fmt.Errorf("inbox: %w", err)
	}
	key := c.cfg.Source + "\n" + m.ID
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, lockMessage, key); err != nil {
		conn.Release()
		return Outcome{}, fmt.Errorf("inbox: lock %s: %w", m.ID, err)
	}
	defer func() {
		// The lock is the session's: a connection that cannot say it let go is closed.
		if _, err := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, hashtext($2))`, lockMessage, key); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
		conn.Release()
	}()

	r := &row{c: c, conn: conn, m: m}
	var stored string
	var since float64
	err = conn.QueryRow(ctx, `INSERT INTO extworker_inbox (source, message_id, type, body_digest, correlation_id)
			VALUES ($1, $2, $3, $4, nullif($5, ''))
		ON CONFLICT (source, message_id) DO UPDATE SET deliveries = extworker_inbox.deliveries + 1, updated_at = now(),
			duplicates = extworker_inbox.duplicates + CASE WHEN extworker_inbox.body_digest = EXCLUDED.body_digest
				AND extworker_inbox.state IN ('PROCESSED', 'IGNORED_DUPLICATE', 'FAILED_FINAL') THEN 1 ELSE 0 END
		RETURNING state, body_digest, attempts, received_at,
			coalesce(extract(epoch FROM now() - attempt_started_at), 0)::float8`,
		c.cfg.Source, m.ID, m.Type, digest, m.CorrelationID).Scan(&r.state, &stored, &r.attempts, &r.receivedAt, &since)
	if err != nil {
		return Outcome{}, fmt.Errorf("inbox: record %s: %w", m.ID, err)
	}
	r.sinceAttempt = time.Duration(since * float64(time.Second))
	if stored != digest {
		if _, err := conn.Exec(ctx, `WITH c AS (INSERT INTO extworker_inbox_conflicts (source, message_id, body_digest) VALUES ($1, $2, $3)
				ON CONFLICT (source, message_id, body_digest) DO UPDATE SET deliveries = extworker_inbox_conflicts.deliveries + 1)
			UPDATE extworker_inbox SET conflicts = conflicts + 1 WHERE source = $1 AND message_id = $2`, c.cfg.Source, m.ID, digest); err != nil {
			return Outcome{}, fmt.Errorf("inbox: record conflict %s: %w", m.ID, err)
		}
		return Outcome{Disposition: Park, State: r.state, Conflict: true,
			Reason: fmt.Sprintf("conflict: message id %s was consumed with another body (digest %.12s…, this one %.12s…); not acted on", m.ID, stored, digest)}, nil
	}
	switch r.state {
	case StateProcessed, StateIgnoredDuplicate, StateFailedFinal:
		// The upsert counted it as a duplicate.
		return Outcome{Disposition: Ack, State: r.state, Duplicate: true}, nil
	}
	return fn(ctx, r)
}

// act decides and acts on a message that is due: RECEIVED, or back from a retry, or left
// PROCESSING or UNKNOWN_OUTCOME by an attempt whose end nobody recorded.
func (c *Consumer) act(ctx context.Context, r *row) (Outcome, error) {
	a, err := c.decide(r.m)
	if err != nil {
		return r.park(ctx, "the consumer could not read the message: "+err.Error())
	}
	ambiguous := r.state == StateProcessing || r.state == StateUnknownOutcome
	if wait := r.c.cfg.InFlightWindow - r.sinceAttempt; ambiguous && wait > 0 {
		// An attempt whose end nobody recorded (its consumer died, or gave up on the
		// answer) may have a request still on its way to the engine, which asking now
		// would not see: a second start. Ask once it can no longer land.
		r.c.cfg.Logger.Info("inbox: an earlier attempt may still be in flight; asking the engine later",
			"source", r.c.cfg.Source, "message_id", r.m.ID, "wait", wait)
		return Outcome{Disposition: Retry, Delay: max(wait, time.Millisecond), State: r.state,
			Reason: fmt.Sprintf("an attempt that began %v ago may still be in flight at the engine", r.sinceAttempt.Round(time.Millisecond))}, nil
	}
	switch {
	case a.Start != nil && a.Correlate == nil && a.Ignore == "":
		return c.start(ctx, r, *a.Start, ambiguous)
	case a.Correlate != nil && a.Start == nil && a.Ignore == "":
		return c.correlate(ctx, r, *a.Correlate, ambiguous)
	case a.Ignore != "" && a.Start == nil && a.Correlate == nil:
		return r.settle(ctx, StateProcessed, "ignored: "+a.Ignore, "", Outcome{Disposition: Ack})
	}
	return r.park(ctx, "the consumer's Decide returned no single action (one of Start, Correlate, Ignore)")
}

// begin marks the row PROCESSING, committed, before the engine is asked anything that
// changes it: a consumer that dies from here on leaves a row the next delivery
// reconciles.
func (r *row) begin(ctx context.Context, action, businessKey string) error {
	r.attempts++
	_, err := r.conn.Exec(ctx, `UPDATE extworker_inbox SET state = 'PROCESSING', attempts = $3, action = $4, business_key = nullif($5, ''),
			updated_at = now(), attempt_started_at = now()
		WHERE source = $1 AND message_id = $2`, r.c.cfg.Source, r.m.ID, r.attempts, action, businessKey)
	if err != nil {
		return fmt.Errorf("inbox: record %s: %w", r.m.ID, err)
	}
	return nil
}

// settle records the row's state after the engine answered, on a context the delivery's
// end cannot cancel (what the engine did must be written down).
func (r *row) settle(ctx context.Context, st State, reason, instance string, out Outcome) (Outcome, error) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_, err := r.conn.Exec(wctx, `UPDATE extworker_inbox SET state = $3, reason = nullif($4, ''),
			process_instance_id = coalesce(nullif($5, ''), process_instance_id), updated_at = now(),
			processed_at = CASE WHEN $3 IN ('PROCESSED', 'IGNORED_DUPLICATE') THEN now() ELSE processed_at END,
			parked_at = CASE WHEN $3 = 'FAILED_FINAL' THEN now() ELSE NULL END
		WHERE source = $1 AND message_id = $2`, r.c.cfg.Source, r.m.ID, string(st), truncate(reason, 2000), instance)
	if err != nil {
		return Outcome{}, fmt.Errorf("inbox: record %s as %s: %w", r.m.ID, st, err)
	}
	out.State, out.Reason, out.ProcessInstanceID = st, reason, instance
	return out, nil
}

func (r *row) park(ctx context.Context, reason string) (Outcome, error) {
	r.c.cfg.Logger.Warn("inbox: message parked in the dead-letter queue",
		"source", r.c.cfg.Source, "message_id", r.m.ID, "reason", reason)
	return r.settle(ctx, StateFailedFinal, reason, "", Outcome{Disposition: Park})
}

// retry records why the message waits and when it comes back.
func (r *row) retry(ctx context.Context, st State, reason string) (Outcome, error) {
	d := r.c.backoff(r.attempts)
	r.c.cfg.Logger.Info("inbox: message retried later", "source", r.c.cfg.Source, "message_id", r.m.ID,
		"attempt", r.attempts, "wait", d, "reason", reason)
	return r.settle(ctx, st, reason, "", Outcome{Disposition: Retry, Delay: d})
}

// early retries a message nothing waits for yet, until EarlyWindow from its first
// delivery has passed; then it parks it.
func (r *row) early(ctx context.Context, reason string) (Outcome, error) {
	if since := time.Since(r.receivedAt); since > r.c.cfg.EarlyWindow {
		out, err := r.park(ctx, fmt.Sprintf("early for %v, past the window of %v: %s", since.Round(time.Second), r.c.cfg.EarlyWindow, reason))
		out.Early = true
		return out, err
	}
	out, err := r.retry(ctx, StateFailedRetryable, "early: "+reason)
	out.Early = true
	return out, err
}

// failed maps an engine call's error that is not the engine's verdict on the message:
// not sent (retried), outcome unknown (reconciled, then retried), or refused for good.
func (r *row) failed(ctx context.Context, op string, err error) (Outcome, error) {
	var ee *camunda7.Error
	switch {
	case errors.Is(err, camunda7.ErrNotSent), errors.Is(err, camunda7.ErrThrottled), errors.Is(err, camunda7.ErrUnauthorized),
		errors.Is(err, camunda7.ErrOptimisticLock):
		return r.retry(ctx, StateFailedRetryable, op+": "+err.Error())
	case errors.As(err, &ee) && ee.StatusCode >= 500:
		// The engine answered with its own failure: its transaction rolled back. Still,
		// the next attempt reconciles first.
		return r.retry(ctx, StateUnknownOutcome, op+": "+err.Error())
	case errors.As(err, &ee):
		return r.park(ctx, op+": the engine refused it: "+err.Error())
	}
	return r.retry(ctx, StateUnknownOutcome, op+": "+err.Error()) // sent, answer lost or unreadable
}

// start starts the process once per business key: an instance with the key, running or
// ended, is the one the message asked for (started by this message in an attempt whose
// end was not recorded, or by another message announcing the same fact).
func (c *Consumer) start(ctx context.Context, r *row, s Start, ambiguous bool) (Outcome, error) {
	if s.ProcessKey == "" || s.BusinessKey == "" {
		return r.park(ctx, "Start needs a process key and a business key")
	}
	key := s.ProcessKey + "\n" + s.BusinessKey
	if _, err := r.conn.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, lockStart, key); err != nil {
		return Outcome{}, fmt.Errorf("inbox: lock start %s: %w", s.BusinessKey, err)
	}
	defer func() {
		if _, err := r.conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, hashtext($2))`, lockStart, key); err != nil {
			_ = r.conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()
	action := "start " + s.ProcessKey
	if err := r.begin(ctx, action, s.BusinessKey); err != nil {
		return Outcome{}, err
	}
	existing, err := c.instances(ctx, s.ProcessKey, s.BusinessKey)
	if err != nil {
		return r.failed(ctx, "looking for an instance with business key "+s.BusinessKey, err)
	}
	if len(existing) > 0 {
		if ambiguous {
			// An earlier attempt of this message, whose end was not recorded, started it.
			return r.settle(ctx, StateProcessed, "reconciled: the instance was there when this message was delivered again", existing[0].ID, Outcome{Disposition: Ack, Reconciled: true})
		}
		return r.settle(ctx, StateIgnoredDuplicate, fmt.Sprintf("not started: process %s has an instance with business key %s already (%s)", s.ProcessKey, s.BusinessKey, existing[0].ID),
			existing[0].ID, Outcome{Disposition: Ack})
	}
	pi, err := c.engine.StartProcess(ctx, s.ProcessKey, admin.StartProcessRequest{BusinessKey: s.BusinessKey, Variables: s.Variables})
	failpoint.Inject(failpoint.InboxAfterEngine)
	switch {
	case err == nil:
		return r.settle(ctx, StateProcessed, "", pi.ID, Outcome{Disposition: Ack, Started: true})
	case errors.Is(err, camunda7.ErrNotFound):
		return r.early(ctx, fmt.Sprintf("process %s is not deployed", s.ProcessKey))
	}
	return r.failed(ctx, action, err)
}

// mismatch matches the engine's 400 when a message correlates to nothing (pinned by
// TestEngineCorrelationMismatchMessage).
var mismatch = regexp.MustCompile(`(?i)cannot correlate message`)

// correlate delivers the message to the instance waiting for it, once.
func (c *Consumer) correlate(ctx context.Context, r *row, m Correlate, ambiguous bool) (Outcome, error) {
	if m.MessageName == "" || m.BusinessKey == "" {
		return r.park(ctx, "Correlate needs a message name and a business key")
	}
	mark, token := markVariable(m.MessageName), c.cfg.Source+"/"+r.m.ID
	action := "correlate " + m.MessageName
	if err := r.begin(ctx, action, m.BusinessKey); err != nil {
		return Outcome{}, err
	}
	if ambiguous {
		// An earlier attempt's end was not recorded: the engine says whether it correlated.
		took, _, err := c.marked(ctx, m.BusinessKey, mark, token)
		if err != nil {
			return r.failed(ctx, "reconciling "+action, err)
		}
		if took != "" {
			return r.settle(ctx, StateProcessed, "reconciled: the engine had correlated it", took, Outcome{Disposition: Ack, Reconciled: true})
		}
	}
	vars := camunda7.Variables{}
	for k, v := range m.Variables {
		vars[k] = v
	}
	vars[mark] = camunda7.StringVar(token)
	res, err := c.engine.CorrelateMessageResult(ctx, admin.MessageCorrelation{MessageName: m.MessageName, BusinessKey: m.BusinessKey,
		CorrelationKeys: m.CorrelationKeys, ProcessVariables: vars})
	failpoint.Inject(failpoint.InboxAfterEngine)
	var ee *camunda7.Error
	switch {
	case err == nil:
		id := ""
		if len(res) > 0 {
			id = res[0].InstanceID()
		}
		return r.settle(ctx, StateProcessed, "", id, Outcome{Disposition: Ack, Correlated: true})
	case errors.As(err, &ee) && ee.StatusCode == http.StatusBadRequest && mismatch.MatchString(ee.Message):
	default:
		return r.failed(ctx, action, err)
	}
	// Nothing waits for it: early, or late?
	took, other, err := c.marked(ctx, m.BusinessKey, mark, token)
	switch {
	case err != nil:
		return r.failed(ctx, "classifying "+action, err)
	case took != "":
		return r.settle(ctx, StateProcessed, "reconciled: the engine had correlated it", took, Outcome{Disposition: Ack, Reconciled: true})
	case other.instance != "":
		return r.settle(ctx, StateIgnoredDuplicate, fmt.Sprintf("late: process instance %s took message %s before (from %s) and no longer waits for it",
			other.instance, m.MessageName, other.token), other.instance, Outcome{Disposition: Ack, Late: true})
	case other.ended != "":
		return r.settle(ctx, StateIgnoredDuplicate, fmt.Sprintf("late: process instance %s with business key %s ended before message %s came",
			other.ended, m.BusinessKey, m.MessageName), other.ended, Outcome{Disposition: Ack, Late: true})
	}
	return r.early(ctx, fmt.Sprintf("no process instance with business key %s waits for message %s", m.BusinessKey, m.MessageName))
}

// markVariable is the process variable a correlation sets: extworkerMessage_<name>.
func markVariable(messageName string) string {
	return "extworkerMessage_" + nonIdent.ReplaceAllString(messageName, "_")
}

var nonIdent = regexp.MustCompile(`[^A-Za-z0-9_]`)

// found is what the engine holds of earlier messages for a business key.
type found struct {
	instance, token string // an instance that took another message of this name, and which
	ended           string // an instance with the business key that has ended
}

// marked looks through the instances with businessKey, running and ended, for the mark
// of message name: it returns the instance that took token (this message), else what it
// found instead.
func (c *Consumer) marked(ctx context.Context, businessKey, mark, token string) (string, found, error) {
	var f found
	his, err := c.engine.HistoricProcessInstances(ctx, url.Values{"processInstanceBusinessKey": {businessKey}})
	if err != nil {
		return "", f, err
	}
	if len(his) == 0 {
		return "", f, nil
	}
	ids := make([]string, 0, len(his))
	for _, h := range his {
		ids = append(ids, h.ID)
		if h.State != "ACTIVE" && h.State != "SUSPENDED" && f.ended == "" {
			f.ended = h.ID
		}
	}
	vars, err := c.engine.HistoricVariableInstances(ctx, url.Values{"variableName": {mark}, "processInstanceIdIn": {strings.Join(ids, ",")}})
	if err != nil {
		return "", f, err
	}
	for _, v := range vars {
		got, err := camunda7.Variables{"v": v.Variable()}.String("v")
		if err != nil {
			continue
		}
		if got == token {
			return v.ProcessInstanceID, f, nil
		}
		f.instance, f.token = v.ProcessInstanceID, got
	}
	return "", f, nil
}

// instances returns the instances of processKey with businessKey, running or ended.
func (c *Consumer) instances(ctx context.Context, processKey, businessKey string) ([]admin.ProcessInstance, error) {
	run, err := c.engine.ProcessInstances(ctx, url.Values{"processDefinitionKey": {processKey}, "businessKey": {businessKey}})
	if err != nil || len(run) > 0 {
		return run, err
	}
	his, err := c.engine.HistoricProcessInstances(ctx, url.Values{"processDefinitionKey": {processKey}, "processInstanceBusinessKey": {businessKey}})
	if err != nil {
		return nil, err
	}
	out := make([]admin.ProcessInstance, 0, len(his))
	for _, h := range his {
		out = append(out, admin.ProcessInstance{ID: h.ID, DefinitionKey: h.ProcessDefinitionKey, BusinessKey: h.BusinessKey, Ended: true})
	}
	return out, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
