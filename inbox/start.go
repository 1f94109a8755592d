package inbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"strings"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/failpoint"
)

// StartMarkVariable is the process variable a start sets on the instance it starts, in
// the engine's transaction, to "source/message id": reconciliation tells by it which
// message started an instance.
const StartMarkVariable = "extworkerStartedBy"

// startKey is what a process is started once for: its definition and a business key.
type startKey struct{ process, business string }

// start starts the process once per process definition and business key: an instance
// with the key, running or ended, is the one the message asked for (started by this
// message in an attempt whose end was not recorded, or by another message announcing the
// same fact). A start another message sent, whose outcome is unknown, may still land: the
// message waits until it cannot, then asks the engine, before it starts anything.
func (c *Consumer) start(ctx context.Context, r *row, s Start, ambiguous bool) (Outcome, error) {
	k := startKey{process: s.ProcessKey, business: s.BusinessKey}
	unlock, err := r.lockStart(ctx, k)
	if err != nil {
		return Outcome{}, err
	}
	defer unlock()
	cl, err := r.readClaim(ctx, k)
	if err != nil {
		return Outcome{}, err
	}
	if wait := claimWait(cl, c.cfg.InFlightWindow); wait > 0 {
		return r.retryIn(ctx, wait, "start in flight", fmt.Sprintf("another message's start of process %s with this business key began %v ago "+
			"and may still land at the engine: asking the engine once it cannot", s.ProcessKey, cl.since.Round(time.Millisecond)))
	}
	if err := r.begin(ctx); err != nil {
		return Outcome{}, err
	}
	existing, err := c.instances(ctx, s.ProcessKey, s.BusinessKey)
	if err != nil {
		return r.failed(ctx, "looking for an instance with business key "+s.BusinessKey, err)
	}
	r.unresolved = false // the engine answered: whatever an earlier attempt did is there
	if len(existing) > 0 {
		return c.startedBefore(ctx, r, k, existing, ambiguous, cl.held)
	}
	return c.startNew(ctx, r, k, s)
}

// startNew claims the start for this message, committed, then asks the engine.
func (c *Consumer) startNew(ctx context.Context, r *row, k startKey, s Start) (Outcome, error) {
	if err := r.takeClaim(ctx, k); err != nil {
		return Outcome{}, err
	}
	vars := camunda7.Variables{}
	maps.Copy(vars, s.Variables)
	vars[StartMarkVariable] = camunda7.StringVar(r.token())
	r.unresolved = true
	pi, err := c.engine.StartProcess(ctx, s.ProcessKey, admin.StartProcessRequest{BusinessKey: s.BusinessKey, Variables: vars})
	failpoint.Inject(failpoint.InboxAfterEngine)
	r.unresolved = outcomeUnknown(err)
	switch {
	case err == nil:
		return r.settle(ctx, StateProcessed, "", pi.ID, Outcome{Disposition: Ack, Started: true})
	case errors.Is(err, camunda7.ErrNotFound):
		return r.early(ctx, fmt.Sprintf("process %s is not deployed", s.ProcessKey))
	}
	return r.failed(ctx, "start "+s.ProcessKey, err)
}

// startedBefore settles a start whose instance is there already: reconciled when this
// message started it (its mark says so; or, after an attempt whose outcome was unknown,
// an instance without any mark), else ignored as a duplicate.
func (c *Consumer) startedBefore(ctx context.Context, r *row, k startKey, existing []admin.ProcessInstance, ambiguous, claimed bool) (Outcome, error) {
	if len(existing) > 1 {
		c.duplicateStart(r, k, existing)
	}
	id, by, err := c.startedBy(ctx, existing, r.token())
	if err != nil {
		return r.failed(ctx, "reconciling start "+k.process, err)
	}
	if claimed {
		if err := r.resolveClaim(ctx, k, id); err != nil {
			return Outcome{}, err
		}
	}
	if startedByThis(ambiguous, by, r.token()) {
		return r.settle(ctx, StateProcessed, "reconciled: the instance was there when this message was delivered again", id,
			Outcome{Disposition: Ack, Reconciled: true})
	}
	reason := fmt.Sprintf("not started: process %s has an instance with business key %s already (%s)", k.process, k.business, id)
	if by != "" {
		reason += ", started by " + by
	}
	return r.settle(ctx, StateIgnoredDuplicate, reason, id, Outcome{Disposition: Ack})
}

// duplicateStart counts and logs a start whose business key has more than one instance
// of its process definition (Stats.DuplicateStarts): by the instances' ids, never the
// business key. Nothing is cancelled.
func (c *Consumer) duplicateStart(r *row, k startKey, existing []admin.ProcessInstance) {
	ids := make([]string, 0, len(existing))
	for _, pi := range existing {
		ids = append(ids, pi.ID)
	}
	c.stats.DuplicateStarts.Add(1)
	c.cfg.Logger.Warn("inbox: more than one process instance of the start's process definition has its business key "+
		"(a start that reached the engine after InFlightWindow, or one from outside the inbox); none is cancelled",
		"source", c.cfg.Source, "queue", c.cfg.Queue, "message_id", logID(r.id), "process", k.process,
		"instances", len(existing), "instance_ids", strings.Join(ids, ","))
}

// startedByThis reports whether the instance found was started by this message: its mark
// names it, or it has no mark and an attempt of this message has an unknown outcome
// (an instance started before starts were marked).
func startedByThis(ambiguous bool, by, token string) bool {
	return by == token || (ambiguous && by == "")
}

// startedBy returns the instance of existing that token's message started, or the first
// one and which message (if any) its mark names.
func (c *Consumer) startedBy(ctx context.Context, existing []admin.ProcessInstance, token string) (id, by string, err error) {
	ids := make([]string, 0, len(existing))
	for _, pi := range existing {
		ids = append(ids, pi.ID)
	}
	vars, err := c.engine.HistoricVariableInstances(ctx, url.Values{"variableName": {StartMarkVariable}, "processInstanceIdIn": {strings.Join(ids, ",")}})
	if err != nil {
		return "", "", err
	}
	id = existing[0].ID
	for _, v := range vars {
		got, err := camunda7.Variables{"v": v.Variable()}.String("v")
		switch {
		case err != nil:
		case got == token:
			return v.ProcessInstanceID, got, nil
		case by == "":
			id, by = v.ProcessInstanceID, got
		}
	}
	return id, by, nil
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
		FROM extworker_inbox_starts WHERE process_key = $1 AND business_key = $2`, k.process, k.business, r.c.cfg.Source, r.id)
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
			process_instance_id = NULL, attempt_started_at = now(), updated_at = now()`, k.process, k.business, r.c.cfg.Source, r.id)
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
