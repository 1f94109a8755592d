package inbox

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"strings"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/failpoint"
)

// mismatch matches the engine's 400 when a message correlates to nothing (pinned by
// TestEngineCorrelationMismatchMessage).
var mismatch = regexp.MustCompile(`(?i)cannot correlate message`)

// correlate delivers the message, once, to the instance of its process definition with
// its business key that waits for it. The engine's /message takes no process definition:
// the running instances of the definition with the key are looked up, and the message
// sent to each by its id until one takes it.
func (c *Consumer) correlate(ctx context.Context, r *row, m Correlate, ambiguous bool) (Outcome, error) {
	mark, token := markVariable(m.MessageName), r.token()
	action := "correlate " + m.MessageName
	if err := r.begin(ctx); err != nil {
		return Outcome{}, err
	}
	if ambiguous {
		// An earlier attempt's end was not recorded: the engine says whether it correlated.
		took, _, err := c.marked(ctx, m, mark, token)
		if err != nil {
			return r.failed(ctx, "reconciling "+action, err)
		}
		r.unresolved = false
		if took != "" {
			return r.settle(ctx, StateProcessed, "reconciled: the engine had correlated it", took, Outcome{Disposition: Ack, Reconciled: true})
		}
	}
	running, err := c.engine.ProcessInstances(ctx, url.Values{"processDefinitionKey": {m.ProcessDefinitionKey}, "businessKey": {m.BusinessKey}})
	if err != nil {
		return r.failed(ctx, "looking for the instance for "+action, err)
	}
	for _, pi := range running {
		if out, sent, err := c.send(ctx, r, m, pi.ID, mark, token); sent {
			return out, err
		}
	}
	return c.classify(ctx, r, m, mark, token)
}

// send correlates m to the instance id. sent is false when the instance does not wait
// for it (the engine's mismatch): nothing was done.
func (c *Consumer) send(ctx context.Context, r *row, m Correlate, id, mark, token string) (out Outcome, sent bool, err error) {
	vars := camunda7.Variables{}
	maps.Copy(vars, m.Variables)
	vars[mark] = camunda7.StringVar(token)
	r.unresolved = true
	res, err := c.engine.CorrelateMessageResult(ctx, admin.MessageCorrelation{MessageName: m.MessageName, BusinessKey: m.BusinessKey,
		ProcessInstanceID: id, CorrelationKeys: m.CorrelationKeys, ProcessVariables: vars})
	failpoint.Inject(failpoint.InboxAfterEngine)
	r.unresolved = outcomeUnknown(err)
	switch {
	case err == nil:
		if len(res) > 0 && res[0].InstanceID() != "" {
			id = res[0].InstanceID()
		}
		out, err = r.settle(ctx, StateProcessed, "", id, Outcome{Disposition: Ack, Correlated: true})
		return out, true, err
	case mismatchError(err):
		return Outcome{}, false, nil
	}
	out, err = r.failed(ctx, "correlate "+m.MessageName, err)
	return out, true, err
}

// classify settles a message no instance of its definition waits for: early, or late.
func (c *Consumer) classify(ctx context.Context, r *row, m Correlate, mark, token string) (Outcome, error) {
	took, other, err := c.marked(ctx, m, mark, token)
	if err != nil {
		return r.failed(ctx, "classifying correlate "+m.MessageName, err)
	}
	r.unresolved = false
	switch {
	case took != "":
		return r.settle(ctx, StateProcessed, "reconciled: the engine had correlated it", took, Outcome{Disposition: Ack, Reconciled: true})
	case other.instance != "":
		return r.settle(ctx, StateIgnoredDuplicate, fmt.Sprintf("late: process instance %s took message %s before (from %s) and no longer waits for it",
			other.instance, m.MessageName, other.token), other.instance, Outcome{Disposition: Ack, Late: true})
	case other.ended != "":
		return r.settle(ctx, StateIgnoredDuplicate, fmt.Sprintf("late: process instance %s of %s with business key %s ended before message %s came",
			other.ended, m.ProcessDefinitionKey, m.BusinessKey, m.MessageName), other.ended, Outcome{Disposition: Ack, Late: true})
	}
	return r.early(ctx, fmt.Sprintf("no process instance of %s with business key %s waits for message %s", m.ProcessDefinitionKey, m.BusinessKey, m.MessageName))
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

// marked looks through the instances of m's process definition with its business key,
// running and ended, for the mark of its message name: it returns the instance that took
// token (this message), else what it found instead.
func (c *Consumer) marked(ctx context.Context, m Correlate, mark, token string) (string, found, error) {
	var f found
	his, err := c.engine.HistoricProcessInstances(ctx, url.Values{"processDefinitionKey": {m.ProcessDefinitionKey},
		"processInstanceBusinessKey": {m.BusinessKey}})
	if err != nil || len(his) == 0 {
		return "", f, err
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
