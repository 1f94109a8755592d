package humantask

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
)

// Task is a waiting user task as the service shows it: what the engine exposes of it,
// with its ETag.
type Task struct {
	ID                string             `json:"id"`
	Name              string             `json:"name,omitempty"`
	TaskDefinitionKey string             `json:"taskDefinitionKey"`
	ProcessInstanceID string             `json:"processInstanceId"`
	Assignee          string             `json:"assignee,omitempty"`
	Owner             string             `json:"owner,omitempty"`
	CandidateUsers    []string           `json:"candidateUsers"`
	CandidateGroups   []string           `json:"candidateGroups"`
	Suspended         bool               `json:"suspended"`
	LastUpdated       time.Time          `json:"lastUpdated,omitzero"`
	Variables         camunda7.Variables `json:"variables"`
	// ETag changes whenever any field above does (see taskETag).
	ETag string `json:"etag"`
}

// Form is a completion's body: the variables the task completes with, by name. Values
// are strings, booleans, numbers (json.Number) or nil.
type Form map[string]any

// newTask builds the Task of what the engine answered: the task, its identity links
// and the variables its form shows.
func newTask(t *admin.UserTask, links []admin.IdentityLink, vars camunda7.Variables) Task {
	out := Task{ID: t.ID, Name: t.Name, TaskDefinitionKey: t.TaskDefinitionKey, ProcessInstanceID: t.ProcessInstanceID,
		Assignee: t.Assignee, Owner: t.Owner, Suspended: t.Suspended, LastUpdated: t.LastUpdated.Time,
		CandidateUsers: []string{}, CandidateGroups: []string{}, Variables: vars}
	if out.Variables == nil {
		out.Variables = camunda7.Variables{}
	}
	for _, l := range links {
		if l.Type != "candidate" {
			continue
		}
		if l.UserID != "" {
			out.CandidateUsers = append(out.CandidateUsers, l.UserID)
		}
		if l.GroupID != "" {
			out.CandidateGroups = append(out.CandidateGroups, l.GroupID)
		}
	}
	slices.Sort(out.CandidateUsers)
	slices.Sort(out.CandidateGroups)
	out.ETag = taskETag(t, out)
	return out
}

// taskETag is a strong ETag over everything the engine exposes that a completion may
// depend on: the task's fields (with lastUpdated, which the engine moves on claim,
// assignment and identity-link changes, but not on variable changes), its candidates,
// and the variables its form shows (so a variable change changes it too).
func taskETag(t *admin.UserTask, v Task) string {
	b, _ := json.Marshal(struct {
		Task                          *admin.UserTask
		CandidateUsers, CandidateGrps []string
		Variables                     camunda7.Variables
	}{t, v.CandidateUsers, v.CandidateGroups, v.Variables})
	sum := sha256.Sum256(b)
	return `"` + hex.EncodeToString(sum[:16]) + `"`
}

// allowed reports whether who may see and complete t: its assignee; while nobody is
// assigned, a candidate user or a member of a candidate group. A candidate does not
// complete a task someone has claimed.
func allowed(t Task, who Identity) bool {
	if t.Assignee != "" {
		return who.User == t.Assignee
	}
	if slices.Contains(t.CandidateUsers, who.User) {
		return true
	}
	for _, g := range who.Groups {
		if slices.Contains(t.CandidateGroups, g) {
			return true
		}
	}
	return false
}

// checkCompletion is the completion-time decision before the guard: nil when who may
// complete t as the form it saw (ifMatch) showed it, or the answer refusing it.
func checkCompletion(t Task, who Identity, ifMatch string, f Form) *Answer {
	switch {
	case !allowed(t, who):
		return refusal(403, t.ID, "not the assignee or a candidate of this task", "")
	case ifMatch != t.ETag:
		return refusal(412, t.ID, "the task changed since the form was loaded (stale If-Match)", "")
	}
	for _, name := range slices.Sorted(maps.Keys(f)) {
		if v, ok := t.Variables[name]; ok && !fits(v.Type, f[name]) {
			return refusal(http.StatusUnprocessableEntity, t.ID, "a value does not fit its variable's type",
				fmt.Sprintf("variable %q is %s; the form sent %s", name, v.Type, kindOf(f[name])))
		}
	}
	return nil
}

// fits reports whether a form's value may overwrite a variable of type typ: a string a
// String, a number a number, a boolean a Boolean, null anything; a variable of another
// type (a Date, a Json, an Object) cannot be set from a form here.
func fits(typ string, v any) bool {
	switch v.(type) {
	case nil:
		return true
	case string:
		return typ == camunda7.TypeString || typ == camunda7.TypeNull
	case bool:
		return typ == camunda7.TypeBoolean || typ == camunda7.TypeNull
	case json.Number:
		return slices.Contains([]string{camunda7.TypeShort, camunda7.TypeInteger, camunda7.TypeLong, camunda7.TypeDouble, camunda7.TypeNull}, typ)
	}
	return false
}

func kindOf(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	}
	return "null"
}

// marker is what the engine records, in the completion's transaction, as the process
// variable markerName(task): which command completed the task, for whom.
type marker struct {
	Command string `json:"command"`
	User    string `json:"user"`
}

// markerPrefix begins every marker variable's name; forms may not use it.
const markerPrefix = "extworker_completion_"

func markerName(taskID string) string { return markerPrefix + taskID }

// engineState is what the engine says of a task that may have been completed: still
// waiting, or its history and the marker its completion recorded.
type engineState struct {
	open    bool
	history *admin.HistoricUserTask // nil: the engine never had it (or forgot it)
	marker  *marker                 // nil: no marker (completed outside this service, or not completed)
}

// settle decides what a command's answer is from the engine's state: open (the command
// may be sent again), or settled with its answer: 200 when this command completed it,
// 409 naming who did and when when another did, 404 when it is gone otherwise.
func settle(st engineState, taskID, command, user string) (a Answer, open bool) {
	switch {
	case st.open:
		return Answer{}, true
	case st.history == nil:
		return *refusal(404, taskID, "no such task", ""), false
	case st.history.DeleteReason != "completed":
		return *refusal(404, taskID, "the task was removed without being completed", ""), false
	case st.marker != nil && st.marker.Command == command:
		return completed(taskID, command, user), false
	case st.marker != nil:
		return conflict(taskID, st.marker.User, st.history.EndTime.Time), false
	}
	return conflict(taskID, "", st.history.EndTime.Time), false
}
