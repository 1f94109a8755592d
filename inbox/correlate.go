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
func (c *Handler) correlate(ctx context.Context, r *row, fa facts, m Correlate) (Handling, error) {
	mark, token := markVariable(m.MessageName), r.token()
	action := "correlate " + m.MessageName
	if err := r.begin(ctx); err != nil {
		return Handling{}, err
	}
	if fa.unresolved {
		// An earlier attempt's end was not recorded: the engine says whether it correlated.
		took, _, err := c.marked(ctx, m, mark, token)
		if err != nil {
			return c.failed(ctx, r, "reconciling "+action, err)
		}
		r.unresolved, fa.unresolved = false, false
		if took != "" {
			fa.engine = engineTookThis
			return c.finish(ctx, r, classify(fa), "reconciled: the engine had correlated it", took)
		}
	}
	running, err := c.engine.ProcessInstances(ctx, url.Values{"processDefinitionKey": {m.ProcessDefinitionKey}, "businessKey": {m.BusinessKey}})
	if err != nil {
		return c.failed(ctx, r, "looking for the instance for "+action, err)
	}
	if len(running) > 0 {
		// Instances with the key run: each is sent the message until one takes it.
		fa.engine = engineWaiting
	}
	for i := 0; i < len(running) && classify(fa).next == nextAct; i++ {
		if out, sent, err := c.send(ctx, r, m, running[i].ID, mark, token); sent {
			return out, err
		}
	}
	return c.notWaiting(ctx, r, fa, m, mark, token)
}

// send correlates m to the instance id. sent is false when the instance does not wait
// for it (the engine's mismatch): nothing was done.
func (c *Handler) send(ctx context.Context, r *row, m Correlate, id, mark, token string) (out Handling, sent bool, err error) {
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
		out, err = c.finish(ctx, r, acted(ClassCorrelated), "", id)
		return out, true, err
	case mismatchError(err):
		return Handling{}, false, nil
	}
	out, err = c.failed(ctx, r, "correlate "+m.MessageName, err)
	return out, true, err
}

// notWaiting settles a message no instance of its definition waits for: reconciled (an
// earlier attempt correlated it), late, or early, as the marks the engine holds say.
func (c *Handler) notWaiting(ctx context.Context, r *row, fa facts, m Correlate, mark, token string) (Handling, error) {
	took, other, err := c.marked(ctx, m, mark, token)
	if err != nil {
		return c.failed(ctx, r, "classifying correlate "+m.MessageName, err)
	}
	r.unresolved, fa.unresolved = false, false
	fa.engine = markedSays(took, other)
	s := classify(fa)
	switch fa.engine {
	case engineTookThis:
		return c.finish(ctx, r, s, "reconciled: the engine had correlated it", took)
	case engineTookOther:
		return c.finish(ctx, r, s, fmt.Sprintf("late: process instance %s took message %s before (from %s) and no longer waits for it",
			other.instance, m.MessageName, other.token), other.instance)
	case engineEnded:
		return c.finish(ctx, r, s, fmt.Sprintf("late: process instance %s of %s with business key %s ended before message %s came",
			other.ended, m.ProcessDefinitionKey, m.BusinessKey, m.MessageName), other.ended)
	}
	return c.early(ctx, r, s, fmt.Sprintf("no process instance of %s with business key %s waits for message %s", m.ProcessDefinitionKey, m.BusinessKey, m.MessageName))
}

// markedSays is what the marks marked found say of a message no instance waits for.
func markedSays(took string, f found) engineSays {
	switch {
	case took != "":
		return engineTookThis
	case f.instance != "":
		return engineTookOther
	case f.ended != "":
		return engineEnded
	}
	return engineNone
}

// acted is the step of a delivery the engine carried out: acknowledged, processed.
func acted(class Class) step { return step{class: class, state: StateProcessed, disposition: Ack} }

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
func (c *Handler) marked(ctx context.Context, m Correlate, mark, token string) (string, found, error) {
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
