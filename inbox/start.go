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
func (c *Handler) start(ctx context.Context, r *row, fa facts, s Start) (Handling, error) {
	k := startKey{process: s.ProcessKey, business: s.BusinessKey}
	unlock, err := r.lockStart(ctx, k)
	if err != nil {
		return Handling{}, err
	}
	defer unlock()
	cl, err := r.readClaim(ctx, k)
	if err != nil {
		return Handling{}, err
	}
	if fa.claimWait = claimWait(cl, c.cfg.InFlightWindow); fa.claimWait > 0 {
		return c.finish(ctx, r, classify(fa), fmt.Sprintf("another message's start of process %s with this business key began %v ago "+
			"and may still land at the engine: asking the engine once it cannot", s.ProcessKey, cl.since.Round(time.Millisecond)), "")
	}
	if err := r.begin(ctx); err != nil {
		return Handling{}, err
	}
	existing, err := c.instances(ctx, s.ProcessKey, s.BusinessKey)
	if err != nil {
		return c.failed(ctx, r, "looking for an instance with business key "+s.BusinessKey, err)
	}
	// The engine answered: whatever an earlier attempt did is there.
	unknownOutcome := fa.unresolved
	r.unresolved, fa.unresolved = false, false
	if len(existing) > 0 {
		return c.startedBefore(ctx, r, fa, k, existing, unknownOutcome, cl.held)
	}
	return c.startNew(ctx, r, fa, k, s)
}

// startNew claims the start for this message, committed, then asks the engine.
func (c *Handler) startNew(ctx context.Context, r *row, fa facts, k startKey, s Start) (Handling, error) {
	if err := r.takeClaim(ctx, k); err != nil {
		return Handling{}, err
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
		return c.finish(ctx, r, acted(ClassStarted), "", pi.ID)
	case errors.Is(err, camunda7.ErrNotFound):
		fa.engine, fa.unresolved = engineNotDeployed, r.unresolved
		return c.early(ctx, r, classify(fa), fmt.Sprintf("process %s is not deployed", s.ProcessKey))
	}
	return c.failed(ctx, r, "start "+s.ProcessKey, err)
}

// startedBefore settles a start whose instance is there already: reconciled when this
// message started it (its mark says so; or, after an attempt whose outcome was unknown,
// an instance without any mark), else ignored as a duplicate.
func (c *Handler) startedBefore(ctx context.Context, r *row, fa facts, k startKey, existing []admin.ProcessInstance, unknownOutcome, claimed bool) (Handling, error) {
	if len(existing) > 1 {
		c.duplicateStart(r, k, existing)
	}
	id, by, err := c.startedBy(ctx, existing, r.token())
	if err != nil {
		return c.failed(ctx, r, "reconciling start "+k.process, err)
	}
	if claimed {
		if err := r.resolveClaim(ctx, k, id); err != nil {
			return Handling{}, err
		}
	}
	if startedByThis(unknownOutcome, by, r.token()) {
		fa.engine = engineTookThis
		return c.finish(ctx, r, classify(fa), "reconciled: the instance was there when this message was delivered again", id)
	}
	fa.engine = engineTookOther
	reason := fmt.Sprintf("not started: process %s has an instance with business key %s already (%s)", k.process, k.business, id)
	if by != "" {
		reason += ", started by " + by
	}
	return c.finish(ctx, r, classify(fa), reason, id)
}

// duplicateStart counts and logs a start whose business key has more than one instance
// of its process definition (Stats.DuplicateStarts): by the instances' ids, never the
// business key. Nothing is cancelled.
func (c *Handler) duplicateStart(r *row, k startKey, existing []admin.ProcessInstance) {
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
func startedByThis(unknownOutcome bool, by, token string) bool {
	return by == token || (unknownOutcome && by == "")
}

// startedBy returns the instance of existing that token's message started, or the first
// one and which message (if any) its mark names.
func (c *Handler) startedBy(ctx context.Context, existing []admin.ProcessInstance, token string) (id, by string, err error) {
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

// instances returns the instances of processKey with businessKey, running or ended.
func (c *Handler) instances(ctx context.Context, processKey, businessKey string) ([]admin.ProcessInstance, error) {
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
