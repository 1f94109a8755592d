package humantask

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
)

// Task is a waiting user task as the service shows it: what the engine exposes of it,
// with its ETag.
type Task struct {
	ID                string `json:"id"`
	Name              string `json:"name,omitempty"`
	TaskDefinitionKey string `json:"taskDefinitionKey"`
	ProcessInstanceID string `json:"processInstanceId"`
	Assignee          string `json:"assignee,omitempty"`
	Owner             string `json:"owner,omitempty"`
	// DelegationState is the engine's: "PENDING" while the task is delegated to its
	// assignee by its owner (then it is not completed here), "RESOLVED" after.
	DelegationState string             `json:"delegationState,omitempty"`
	CandidateUsers  []string           `json:"candidateUsers"`
	CandidateGroups []string           `json:"candidateGroups"`
	Suspended       bool               `json:"suspended"`
	LastUpdated     time.Time          `json:"lastUpdated,omitzero"`
	Variables       camunda7.Variables `json:"variables"`
	// Fields are the variables the task's form declares (camunda:formField in the
	// process's BPMN), the only ones a completion may set; nil when it declares none (then
	// any may be set, and a Guard restricts them).
	Fields []string `json:"fields,omitempty"`
	// ETag changes whenever any field above does (see taskETag).
	ETag string `json:"etag"`
	// defaulted are the Fields with a default value, which the engine sets when a
	// submission leaves them out.
	defaulted []string
}

// Form is a completion's body: the variables the task completes with, by name. Values
// are strings, booleans, numbers (json.Number) or nil.
type Form map[string]any

// newTask builds the Task of what the engine answered: the task, its identity links,
// the variables its form shows and the fields its form declares.
func newTask(t *admin.UserTask, links []admin.IdentityLink, vars camunda7.Variables, fields []string) Task {
	out := Task{ID: t.ID, Name: t.Name, TaskDefinitionKey: t.TaskDefinitionKey, ProcessInstanceID: t.ProcessInstanceID,
		Assignee: t.Assignee, Owner: t.Owner, DelegationState: t.DelegationState, Suspended: t.Suspended, LastUpdated: t.LastUpdated.Time,
		CandidateUsers: []string{}, CandidateGroups: []string{}, Variables: vars, Fields: fields}
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
	case t.Suspended:
		a := suspended(t.ID)
		return &a
	case t.DelegationState == delegationPending:
		a := delegated(t.ID)
		return &a
	case t.ProcessInstanceID == "":
		// The engine keeps no record of a standalone task's completion variables (the
		// marker among them): a command on it could not be settled from history.
		return refusal(http.StatusUnprocessableEntity, t.ID, "a task without a process cannot be completed through this service", "")
	case !matchETag(ifMatch, t.ETag):
		return refusal(412, t.ID, "the task changed since the form was loaded (stale If-Match)", "")
	}
	for _, name := range slices.Sorted(maps.Keys(f)) {
		if t.Fields != nil && !slices.Contains(t.Fields, name) {
			return refusal(http.StatusUnprocessableEntity, t.ID, "a variable is not a field of the task's form",
				fmt.Sprintf("the form declares %s; the completion sent %s", strings.Join(t.Fields, ", "), sentName(name)))
		}
		v, ok := t.Variables[name]
		if !ok {
			continue
		}
		if !fits(v.Type, f[name]) {
			return refusal(http.StatusUnprocessableEntity, t.ID, "a value does not fit its variable's type",
				fmt.Sprintf("variable %q is %s; the form sent %s", name, v.Type, kindOf(f[name])))
		}
		if n, isNumber := f[name].(json.Number); isNumber {
			if _, err := numberVarAs(v.Type, n); err != nil {
				return refusal(http.StatusUnprocessableEntity, t.ID, "a value does not fit its variable's type",
					fmt.Sprintf("variable %q is %s; the form sent a number %v", name, v.Type, err))
			}
		}
	}
	return nil
}

// delegationPending is the engine's delegation state of a delegated task: its submitted
// form resolves it back to its owner, which is no completion.
const delegationPending = "PENDING"

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
	open      bool
	suspended bool                    // open, and its process suspended: the engine refuses to complete it
	history   *admin.HistoricUserTask // nil: the engine never had it (or forgot it)
	marker    *marker                 // nil: no marker (completed outside this service, or not completed)
	// hadRight: the asking user was, at some time, the task's assignee or one of its
	// candidates (a user, or a member of a group); only such a user learns who completed
	// it and when.
	hadRight bool
}

// hadRight reports whether who was ever entitled to t: its last assignee, the user
// whose command completed it, or an assignee or candidate (user, or one of who's
// groups) in the history's identity-link log.
func hadRight(h admin.HistoricUserTask, m *marker, log []admin.HistoricIdentityLink, who Identity) bool {
	if h.Assignee == who.User || (m != nil && m.User == who.User) {
		return true
	}
	for _, l := range log {
		if l.Type != "candidate" && l.Type != "assignee" {
			continue
		}
		if l.UserID == who.User || (l.GroupID != "" && slices.Contains(who.Groups, l.GroupID)) {
			return true
		}
	}
	return false
}

// settle decides what a command's answer is from the engine's state: open (the command
// may be sent again), or settled with its answer: 200 when this command (of this user)
// completed it, 409 naming who did and when when another did and the user had a right
// on the task, 404 otherwise (a user who never had one learns nothing of it).
func settle(st engineState, taskID, command, user string) (a Answer, open bool) {
	switch {
	case st.open && st.suspended:
		return suspended(taskID), false
	case st.open:
		return Answer{}, true
	case st.history == nil || !st.hadRight:
		return *refusal(404, taskID, "no such task", ""), false
	case st.history.DeleteReason != "completed":
		return *refusal(404, taskID, "the task was removed without being completed", ""), false
	case st.marker != nil && st.marker.Command == command && st.marker.User == user:
		return completed(taskID, command, user), false
	case st.marker != nil:
		return conflict(taskID, st.marker.User, st.history.EndTime.Time), false
	}
	return conflict(taskID, "", st.history.EndTime.Time), false
}

// matchETag reports whether an If-Match value matches etag (RFC 9110 13.1.1): "*"
// matches any task that exists; otherwise one of its comma-separated entity tags must
// equal etag by the strong comparison (a weak tag, W/"...", never matches).
func matchETag(ifMatch, etag string) bool {
	s := strings.TrimSpace(ifMatch)
	if s == "*" {
		return true
	}
	for s != "" {
		s = strings.TrimLeft(s, " \t,")
		weak := strings.HasPrefix(s, "W/")
		s = strings.TrimPrefix(s, "W/")
		if !strings.HasPrefix(s, `"`) {
			return false // not an entity tag: nothing after it can be trusted to parse
		}
		end := strings.IndexByte(s[1:], '"')
		if end < 0 {
			return false
		}
		tag := s[:end+2]
		if !weak && tag == etag {
			return true
		}
		s = strings.TrimLeft(s[end+2:], " \t")
		if s != "" && s[0] != ',' {
			return false
		}
	}
	return false
}

// fieldName is what a name a form might declare looks like.
var fieldName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]{0,63}$`)

// sentName names a variable the completion sent that its form does not declare, for the
// command's answer (recorded in the ledger): quoted when it looks like a field's name,
// not repeated when it does not (an outside tester's name was a sentence with an SSN and
// a password).
func sentName(name string) string {
	if fieldName.MatchString(name) {
		return strconv.Quote(name)
	}
	return "a name that is not one of them"
}
