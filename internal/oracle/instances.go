package oracle

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
)

// EngineState is the engine's view of one run's process instances, as I3 needs it.
type EngineState struct {
	// Instances are the run's process instances from history, ended or not.
	Instances []admin.HistoricProcessInstance
	// ErrorEnded holds the ids of the instances that ended through a BPMN error's end
	// event (the model's error path), which history does not tell from a normal end.
	ErrorEnded map[string]bool
	// Incidents are the open incidents of the run's instances.
	Incidents []admin.Incident
	// Tasks are the run's active external tasks.
	Tasks []camunda7.ExternalTask
}

// InstanceCounts are the terms of I3's equation, started == completed + bpmnErrorEnded +
// incidents, plus what broke it.
type InstanceCounts struct {
	Started        int
	Completed      int // ended normally
	BPMNErrorEnded int // ended through the error path
	Incidents      int // still running, held by open incidents whose reasons are all allowed
	// Lost are instances in none of the above: still running without an incident (or
	// with one whose reason is not allowed), terminated, or unknown to the engine.
	Lost int
	// Stuck are active external tasks of the run left unlocked with retries to spare:
	// fetchable, yet nobody made progress on them by the end of the drain.
	Stuck int
}

// CheckInstances checks I3 (no lost instances) after the drain: every started instance
// has ended, normally or through the error path, or is held by open incidents that
// allowed accepts (the operator queue: for example an outcome only an operator can
// settle); and no active external task of the run is unlocked with retries left, which
// would mean the workers stopped picking up work the engine offers. now is the end of
// the drain, to tell an expired lock from a live one.
func CheckInstances(started []string, st EngineState, allowed func(admin.Incident) bool, now time.Time) (InstanceCounts, []string) {
	var v []string
	bad := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	n := InstanceCounts{Started: len(started)}
	ours := make(map[string]bool, len(started))
	for _, id := range started {
		ours[id] = true
	}
	hist := make(map[string]admin.HistoricProcessInstance, len(st.Instances))
	for _, h := range st.Instances {
		hist[h.ID] = h
	}
	incidents := map[string][]admin.Incident{}
	for _, in := range st.Incidents {
		incidents[in.ProcessInstanceID] = append(incidents[in.ProcessInstanceID], in)
	}
	for _, id := range started {
		h, ok := hist[id]
		switch {
		case !ok:
			n.Lost++
			bad("I3: instance %s was started but the engine's history does not know it", id)
		case h.State == "COMPLETED" && st.ErrorEnded[id]:
			n.BPMNErrorEnded++
		case h.State == "COMPLETED":
			n.Completed++
		case h.State == "ACTIVE" || h.State == "SUSPENDED":
			inc := incidents[id]
			if len(inc) == 0 {
				n.Lost++
				bad("I3: instance %s (%s) is still %s without an incident", id, h.BusinessKey, h.State)
				continue
			}
			ok := true
			for _, in := range inc {
				if allowed == nil || !allowed(in) {
					ok = false
					bad("I3: instance %s (%s) holds an incident whose reason is not allowed: %s: %.200s", id, h.BusinessKey, in.IncidentType, in.IncidentMessage)
				}
			}
			if ok {
				n.Incidents++
			} else {
				n.Lost++
			}
		default:
			n.Lost++
			bad("I3: instance %s (%s) ended %s", id, h.BusinessKey, h.State)
		}
	}
	if n.Started != n.Completed+n.BPMNErrorEnded+n.Incidents {
		bad("I3: started %d != completed %d + BPMN-error ended %d + open incidents (allowed) %d",
			n.Started, n.Completed, n.BPMNErrorEnded, n.Incidents)
	}
	for _, t := range st.Tasks {
		if !ours[t.ProcessInstanceID] {
			continue
		}
		retriesLeft := t.Retries == nil || *t.Retries > 0
		locked := !t.LockExpirationTime.IsZero() && t.LockExpirationTime.After(now)
		if retriesLeft && !locked {
			n.Stuck++
			bad("I3: instance %s (%s): external task %s (%s) is unlocked with retries left and nobody made progress by the end of the drain",
				t.ProcessInstanceID, t.BusinessKey, t.ID, t.ActivityID)
		}
	}
	return n, v
}

// EngineQuery names one run's instances.
type EngineQuery struct {
	ProcessDefinitionKey string
	// BusinessKeyPrefix selects the run's instances (every business key of the run
	// starts with it).
	BusinessKeyPrefix string
	// ErrorEndActivities are the end events of the model's error paths.
	ErrorEndActivities []string
	// Since is no later than the run's first start (bounds the activity query).
	Since time.Time
}

// pageSize is how many rows one history query asks for.
const pageSize = 2000

// AllPages asks fetch for q page by page (firstResult, maxResults) until a page comes
// back short, and returns every row; on an error, the rows read so far.
func AllPages[T any](ctx context.Context, q url.Values, fetch func(context.Context, url.Values) ([]T, error)) ([]T, error) {
	var all []T
	for first := 0; ; first += pageSize {
		q.Set("firstResult", strconv.Itoa(first))
		q.Set("maxResults", strconv.Itoa(pageSize))
		page, err := fetch(ctx, q)
		if err != nil {
			return all, err
		}
		all = append(all, page...)
		if len(page) < pageSize {
			return all, nil
		}
	}
}

// ReadEngine reads the engine's state of a run's instances for CheckInstances.
func ReadEngine(ctx context.Context, c *admin.Client, q EngineQuery) (EngineState, error) {
	st := EngineState{ErrorEnded: map[string]bool{}}
	var err error
	st.Instances, err = AllPages(ctx, url.Values{"processDefinitionKey": {q.ProcessDefinitionKey},
		"processInstanceBusinessKeyLike": {q.BusinessKeyPrefix + "%"}, "sortBy": {"instanceId"}, "sortOrder": {"asc"}},
		c.HistoricProcessInstances)
	if err != nil {
		return st, fmt.Errorf("historic process instances: %w", err)
	}
	ours := make(map[string]bool, len(st.Instances))
	for _, h := range st.Instances {
		ours[h.ID] = true
	}
	for _, a := range q.ErrorEndActivities {
		ended, err := AllPages(ctx, url.Values{"activityId": {a}, "startedAfter": {camunda7.FormatDate(q.Since)},
			"sortBy": {"activityInstanceId"}, "sortOrder": {"asc"}}, c.HistoricActivityInstances)
		for _, ai := range ended {
			if ours[ai.ProcessInstanceID] {
				st.ErrorEnded[ai.ProcessInstanceID] = true
			}
		}
		if err != nil {
			return st, fmt.Errorf("historic activity instances of %s: %w", a, err)
		}
	}
	inc, err := c.Incidents(ctx, url.Values{"processDefinitionKeyIn": {q.ProcessDefinitionKey}})
	if err != nil {
		return st, fmt.Errorf("incidents: %w", err)
	}
	for _, in := range inc {
		if ours[in.ProcessInstanceID] {
			st.Incidents = append(st.Incidents, in)
		}
	}
	tasks, err := c.ExternalTasks(ctx, camunda7.ExternalTaskQuery{ProcessDefinitionKey: q.ProcessDefinitionKey})
	if err != nil {
		return st, fmt.Errorf("external tasks: %w", err)
	}
	for _, t := range tasks {
		if ours[t.ProcessInstanceID] {
			st.Tasks = append(st.Tasks, t)
		}
	}
	return st, nil
}
