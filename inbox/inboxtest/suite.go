package inboxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
)

// Harness is an inbox.Engine under test and the means to set the scene the behaviour
// suite (RunEngineSuite) asks for. For the real engine, Deploy deploys a BPMN process
// through the REST API and End deletes an instance; for Engine, they are its Deploy and
// End.
type Harness struct {
	// Engine is the engine under test.
	Engine inbox.Engine
	// Timeout is the engine client's timeout: what Engine.LongPollTimeout(0) answers.
	Timeout time.Duration
	// Deploy deploys a process with processKey whose instances, once started, wait for
	// the message messageName and, once it has come, keep running (at a wait state of
	// their own) until End.
	Deploy func(t *testing.T, processKey, messageName string)
	// End ends the running instance id; the engine's history keeps it and its variables.
	End func(t *testing.T, id string)
}

// RunEngineSuite runs the behaviour suite of an inbox.Engine against h: what the inbox
// relies on of the engine (a start found by its business key, running and in history;
// a process not deployed; a message nothing waits for; a correlation that moves an
// instance on; an ended instance; the marks' variables; the client's timeout). Package
// inbox runs it against the real engine (an *admin.Client) and package inboxtest against
// Engine, so that a test on Engine sees what the inbox sees in production:
//
//	func TestEngineConformance(t *testing.T) {
//		e := inboxtest.New(0)
//		inboxtest.RunEngineSuite(t, inboxtest.Harness{Engine: e, Timeout: camunda7.DefaultTimeout,
//			Deploy: func(_ *testing.T, key, msg string) { e.Deploy(key, msg) },
//			End:    func(_ *testing.T, id string) { e.End(id) }})
//	}
//
// Each subtest deploys processes and uses business keys of its own, and runs in
// parallel with the others.
func RunEngineSuite(t *testing.T, h Harness) {
	for _, c := range engineCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, h)
		})
	}
}

var engineCases = []struct {
	name string
	run  func(*testing.T, Harness)
}{
	{"StartIsFoundByBusinessKeyAndInHistory", startFound},
	{"StartOfAProcessNotDeployedIsNotFound", startNotDeployed},
	{"MessageNothingWaitsForCannotCorrelate", correlateNothingWaits},
	{"CorrelationReachesTheWaitingInstanceOnce", correlateOnce},
	{"CorrelationByBusinessKeyAlone", correlateByBusinessKey},
	{"CorrelationByBusinessKeyToTwoWaitingIsRefused", correlateAmbiguous},
	{"CorrelationKeysMustMatchTheInstancesVariables", correlationKeys},
	{"EndedInstanceIsInHistoryOnly", ended},
	{"HistoricVariablesByNameAndInstances", historicVariables},
	{"LongPollTimeoutIsTheClientsTimeoutOrLonger", longPollTimeout},
}

// mismatch is what the inbox tells a message nothing waits for by (inbox's
// mismatchError): a 400 whose text says it cannot correlate the message.
var mismatch = regexp.MustCompile(`(?i)cannot correlate message`)

// unique returns prefix with a random suffix: the real engine keeps what every run
// deployed and started.
func unique(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

func suiteContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// deploy deploys a process of the subtest's own that waits for a message of its own.
func deploy(t *testing.T, h Harness) (key, message string) {
	t.Helper()
	key, message = unique("conf_wait"), unique("conf_paid")
	h.Deploy(t, key, message)
	return key, message
}

func start(t *testing.T, h Harness, key, bk string, vars camunda7.Variables) string {
	t.Helper()
	pi, err := h.Engine.StartProcess(suiteContext(t), key, admin.StartProcessRequest{BusinessKey: bk, Variables: vars})
	if err != nil {
		t.Fatalf("start %s with business key %s: %v", key, bk, err)
	}
	if pi.ID == "" || pi.BusinessKey != bk {
		t.Fatalf("start %s: got instance %+v, want an id and business key %s", key, *pi, bk)
	}
	return pi.ID
}

func running(t *testing.T, h Harness, key, bk string) []string {
	t.Helper()
	pis, err := h.Engine.ProcessInstances(suiteContext(t), url.Values{"processDefinitionKey": {key}, "businessKey": {bk}})
	if err != nil {
		t.Fatalf("process instances of %s with %s: %v", key, bk, err)
	}
	ids := make([]string, 0, len(pis))
	for _, pi := range pis {
		if pi.BusinessKey != bk || pi.DefinitionKey != key || pi.Ended {
			t.Errorf("running process instances of %s asked by business key %s: got %+v", key, bk, pi)
		}
		ids = append(ids, pi.ID)
	}
	slices.Sort(ids)
	return ids
}

func history(t *testing.T, h Harness, key, bk string) []admin.HistoricProcessInstance {
	t.Helper()
	his, err := h.Engine.HistoricProcessInstances(suiteContext(t), url.Values{"processDefinitionKey": {key}, "processInstanceBusinessKey": {bk}})
	if err != nil {
		t.Fatalf("historic process instances of %s with %s: %v", key, bk, err)
	}
	slices.SortFunc(his, func(a, b admin.HistoricProcessInstance) int { return strings.Compare(a.ID, b.ID) })
	return his
}

// marks returns the string values of the variables named name of the instances ids, by
// instance.
func marks(t *testing.T, h Harness, name string, ids ...string) map[string]string {
	t.Helper()
	vars, err := h.Engine.HistoricVariableInstances(suiteContext(t), url.Values{"variableName": {name},
		"processInstanceIdIn": {strings.Join(ids, ",")}})
	if err != nil {
		t.Fatalf("historic variables %s of %v: %v", name, ids, err)
	}
	out := map[string]string{}
	for _, v := range vars {
		if v.Name != name {
			t.Errorf("historic variables asked by name %s: got %s", name, v.Name)
		}
		s, err := camunda7.Variables{"v": v.Variable()}.String("v")
		if err != nil {
			t.Errorf("historic variable %s of %s: %v", name, v.ProcessInstanceID, err)
		}
		if _, dup := out[v.ProcessInstanceID]; dup {
			t.Errorf("historic variable %s of %s listed twice", name, v.ProcessInstanceID)
		}
		out[v.ProcessInstanceID] = s
	}
	return out
}

func correlate(t *testing.T, h Harness, m admin.MessageCorrelation) ([]admin.CorrelationResult, error) {
	t.Helper()
	return h.Engine.CorrelateMessageResult(suiteContext(t), m)
}

// wantMismatch fails unless err is the engine's answer to a message nothing waits for,
// as the inbox reads it.
func wantMismatch(t *testing.T, err error, what string) {
	t.Helper()
	var ee *camunda7.Error
	switch {
	case !errors.As(err, &ee):
		t.Errorf("%s: got %v, want a *camunda7.Error", what, err)
	case ee.StatusCode != 400 || !errors.Is(err, camunda7.ErrBadRequest) || !mismatch.MatchString(ee.Message):
		t.Errorf("%s: got %d %q, want 400 \"Cannot correlate message ...\"", what, ee.StatusCode, ee.Message)
	case errors.Is(err, camunda7.ErrNotSent) || errors.Is(err, camunda7.ErrNotFound):
		t.Errorf("%s: %v must be neither ErrNotSent nor ErrNotFound", what, err)
	}
}

// startFound: a start with a business key and variables is an instance the inbox finds
// by its process and business key, running and in history, with the variables it was
// started with; a second start of the same key is a second instance (the engine does
// not refuse it: the inbox must not send it).
func startFound(t *testing.T, h Harness) {
	key, _ := deploy(t, h)
	bk, other := unique("BK"), unique("BK")
	id := start(t, h, key, bk, camunda7.Variables{inbox.StartMarkVariable: camunda7.StringVar("src/m-1"), "amount": camunda7.LongVar(42)})
	otherID := start(t, h, key, other, nil)

	if got := running(t, h, key, bk); !slices.Equal(got, []string{id}) {
		t.Errorf("running instances of %s: got %v, want [%s]", bk, got, id)
	}
	his := history(t, h, key, bk)
	if len(his) != 1 || his[0].ID != id || his[0].BusinessKey != bk || his[0].ProcessDefinitionKey != key || his[0].State != "ACTIVE" {
		t.Errorf("history of %s: got %+v, want instance %s ACTIVE", bk, his, id)
	}
	if got := marks(t, h, inbox.StartMarkVariable, id, otherID); len(got) != 1 || got[id] != "src/m-1" {
		t.Errorf("start marks: got %v, want %s: src/m-1", got, id)
	}

	again := start(t, h, key, bk, nil)
	want := []string{id, again}
	slices.Sort(want)
	if got := running(t, h, key, bk); again == id || !slices.Equal(got, want) {
		t.Errorf("after a second start of %s: got %v, want %v", bk, got, want)
	}
	if got := running(t, h, unique("conf_none"), bk); len(got) != 0 {
		t.Errorf("instances of another process with %s: got %v", bk, got)
	}
}

// startNotDeployed: a process not deployed is ErrNotFound, a 404 (the inbox's early
// start), and starts nothing.
func startNotDeployed(t *testing.T, h Harness) {
	key, bk := unique("conf_undeployed"), unique("BK")
	_, err := h.Engine.StartProcess(suiteContext(t), key, admin.StartProcessRequest{BusinessKey: bk})
	var ee *camunda7.Error
	if !errors.Is(err, camunda7.ErrNotFound) || !errors.As(err, &ee) || ee.StatusCode != 404 {
		t.Errorf("start of %s, not deployed: got %v, want a 404 *camunda7.Error matching ErrNotFound", key, err)
	}
	if errors.Is(err, camunda7.ErrNotSent) || errors.Is(err, camunda7.ErrBadRequest) {
		t.Errorf("start of %s, not deployed: %v must be neither ErrNotSent nor ErrBadRequest", key, err)
	}
	if his := history(t, h, key, bk); len(his) != 0 {
		t.Errorf("history of a process not deployed: %+v", his)
	}
}

// correlateNothingWaits: a message nothing waits for is the 400 mismatch, whether asked
// by business key, for an instance that waits for another message, or for an instance
// that does not exist.
func correlateNothingWaits(t *testing.T, h Harness) {
	key, msg := deploy(t, h)
	bk := unique("BK")
	id := start(t, h, key, bk, nil)

	_, err := correlate(t, h, admin.MessageCorrelation{MessageName: msg, BusinessKey: unique("nobody")})
	wantMismatch(t, err, "a business key without instance")
	_, err = correlate(t, h, admin.MessageCorrelation{MessageName: unique("conf_other"), BusinessKey: bk, ProcessInstanceID: id})
	wantMismatch(t, err, "a message the instance does not wait for")
	_, err = correlate(t, h, admin.MessageCorrelation{MessageName: msg, BusinessKey: unique("BK"), ProcessInstanceID: id})
	wantMismatch(t, err, "the waiting instance with another business key")
	_, err = correlate(t, h, admin.MessageCorrelation{MessageName: msg, ProcessInstanceID: unique("no-such-instance")})
	wantMismatch(t, err, "an instance that does not exist")
	if got := running(t, h, key, bk); !slices.Equal(got, []string{id}) {
		t.Errorf("after the mismatches: running %v, want [%s]", got, id)
	}
}

// correlateOnce: the instance the message is sent to takes it, the result names it, the
// variables sent (the inbox's mark) are its own; it moves past the wait and keeps
// running, and the same message again is the mismatch.
func correlateOnce(t *testing.T, h Harness) {
	key, msg := deploy(t, h)
	bk := unique("BK")
	id := start(t, h, key, bk, nil)
	mark := "extworkerMessage_" + msg
	m := admin.MessageCorrelation{MessageName: msg, BusinessKey: bk, ProcessInstanceID: id,
		ProcessVariables: camunda7.Variables{mark: camunda7.StringVar("src/m-2")}}

	res, err := correlate(t, h, m)
	if err != nil {
		t.Fatalf("correlate to the waiting instance: %v", err)
	}
	if len(res) != 1 || res[0].ResultType != "Execution" || res[0].InstanceID() != id {
		t.Errorf("correlation result: got %+v, want one Execution of instance %s", res, id)
	}
	if got := marks(t, h, mark, id); got[id] != "src/m-2" {
		t.Errorf("correlation mark: got %v, want %s: src/m-2", got, id)
	}
	if got := running(t, h, key, bk); !slices.Equal(got, []string{id}) {
		t.Errorf("after the correlation: running %v, want [%s] (past the wait, not ended)", got, id)
	}
	m.ProcessVariables = camunda7.Variables{mark: camunda7.StringVar("src/m-3")}
	_, err = correlate(t, h, m)
	wantMismatch(t, err, "the message again")
	if got := marks(t, h, mark, id); got[id] != "src/m-2" {
		t.Errorf("a correlation refused set its variables: got %v, want %s: src/m-2", got, id)
	}
}

// correlateByBusinessKey: without an instance id the message goes to the instance with
// the business key that waits for it.
func correlateByBusinessKey(t *testing.T, h Harness) {
	key, msg := deploy(t, h)
	bk := unique("BK")
	id := start(t, h, key, bk, nil)
	start(t, h, key, unique("BK"), nil)
	res, err := correlate(t, h, admin.MessageCorrelation{MessageName: msg, BusinessKey: bk})
	if err != nil {
		t.Fatalf("correlate by business key: %v", err)
	}
	if len(res) != 1 || res[0].InstanceID() != id {
		t.Errorf("correlation by business key: got %+v, want instance %s", res, id)
	}
	_, err = correlate(t, h, admin.MessageCorrelation{MessageName: msg, BusinessKey: bk})
	wantMismatch(t, err, "by business key again")
}

// correlateAmbiguous: a message without instance id that two waiting instances match is
// refused (a 400, not the inbox's mismatch) and reaches neither: the inbox therefore
// sends each message to one instance by its id.
func correlateAmbiguous(t *testing.T, h Harness) {
	key, msg := deploy(t, h)
	bk := unique("BK")
	first, second := start(t, h, key, bk, nil), start(t, h, key, bk, nil)
	_, err := correlate(t, h, admin.MessageCorrelation{MessageName: msg, BusinessKey: bk})
	var ee *camunda7.Error
	if !errors.As(err, &ee) || ee.StatusCode != 400 || !strings.Contains(ee.Message, "to a single execution") ||
		mismatch.MatchString(ee.Message) {
		t.Errorf("a message two instances wait for: got %v, want 400 \"... to a single execution\", not the mismatch", err)
	}
	for _, id := range []string{first, second} {
		if _, err := correlate(t, h, admin.MessageCorrelation{MessageName: msg, ProcessInstanceID: id}); err != nil {
			t.Errorf("instance %s no longer waits after the refused message: %v", id, err)
		}
	}
}

// correlationKeys: correlation keys select the instance whose variables hold them.
func correlationKeys(t *testing.T, h Harness) {
	key, msg := deploy(t, h)
	bk := unique("BK")
	id := start(t, h, key, bk, camunda7.Variables{"order": camunda7.StringVar("O-1")})
	_, err := correlate(t, h, admin.MessageCorrelation{MessageName: msg, ProcessInstanceID: id,
		CorrelationKeys: camunda7.Variables{"order": camunda7.StringVar("O-2")}})
	wantMismatch(t, err, "correlation keys the instance does not hold")
	_, err = correlate(t, h, admin.MessageCorrelation{MessageName: msg, ProcessInstanceID: id,
		CorrelationKeys: camunda7.Variables{"customer": camunda7.StringVar("O-1")}})
	wantMismatch(t, err, "a correlation key the instance has no variable of")
	res, err := correlate(t, h, admin.MessageCorrelation{MessageName: msg, ProcessInstanceID: id,
		CorrelationKeys: camunda7.Variables{"order": camunda7.StringVar("O-1")}})
	if err != nil || len(res) != 1 || res[0].InstanceID() != id {
		t.Errorf("correlation keys the instance holds: got %+v, %v, want instance %s", res, err, id)
	}
}

// ended: an ended instance is no longer running, its history says it ended (a state
// neither ACTIVE nor SUSPENDED, as the inbox reads it) and keeps its variables, and a
// message to it is the mismatch.
func ended(t *testing.T, h Harness) {
	key, msg := deploy(t, h)
	bk := unique("BK")
	id := start(t, h, key, bk, camunda7.Variables{inbox.StartMarkVariable: camunda7.StringVar("src/m-1")})
	h.End(t, id)

	if got := running(t, h, key, bk); len(got) != 0 {
		t.Errorf("an ended instance is running: %v", got)
	}
	his := history(t, h, key, bk)
	terminal := []string{"COMPLETED", "EXTERNALLY_TERMINATED", "INTERNALLY_TERMINATED"}
	if len(his) != 1 || his[0].ID != id || !slices.Contains(terminal, his[0].State) {
		t.Errorf("history of the ended instance: got %+v, want %s in one of %v", his, id, terminal)
	}
	if got := marks(t, h, inbox.StartMarkVariable, id); got[id] != "src/m-1" {
		t.Errorf("the ended instance's mark: got %v", got)
	}
	_, err := correlate(t, h, admin.MessageCorrelation{MessageName: msg, BusinessKey: bk, ProcessInstanceID: id})
	wantMismatch(t, err, "a message to an ended instance")
}

// historicVariables: the history answers by variable name and a comma-separated list of
// instance ids, and only those.
func historicVariables(t *testing.T, h Harness) {
	key, msg := deploy(t, h)
	mark := "extworkerMessage_" + msg
	var ids []string
	for i, token := range []string{"src/a", "src/b", "src/c"} {
		bk := unique("BK")
		id := start(t, h, key, bk, camunda7.Variables{inbox.StartMarkVariable: camunda7.StringVar(token), "note": camunda7.StringVar("n")})
		if i == 0 {
			if _, err := correlate(t, h, admin.MessageCorrelation{MessageName: msg, ProcessInstanceID: id,
				ProcessVariables: camunda7.Variables{mark: camunda7.StringVar(token)}}); err != nil {
				t.Fatalf("correlate: %v", err)
			}
		}
		ids = append(ids, id)
	}
	got := marks(t, h, inbox.StartMarkVariable, ids[0], ids[1])
	want := map[string]string{ids[0]: "src/a", ids[1]: "src/b"}
	if len(got) != len(want) || got[ids[0]] != want[ids[0]] || got[ids[1]] != want[ids[1]] {
		t.Errorf("start marks of two of three instances: got %v, want %v", got, want)
	}
	if got := marks(t, h, mark, ids...); len(got) != 1 || got[ids[0]] != "src/a" {
		t.Errorf("correlation marks: got %v, want %s: src/a", got, ids[0])
	}
	if got := marks(t, h, unique("nothing"), ids...); len(got) != 0 {
		t.Errorf("a variable no instance has: got %v", got)
	}
}

// longPollTimeout: LongPollTimeout(0) is the client's timeout (inbox.ClientTimeout), and
// a long poll's timeout is longer than the poll and never shorter than that.
func longPollTimeout(t *testing.T, h Harness) {
	if got := inbox.ClientTimeout(h.Engine); got != h.Timeout {
		t.Errorf("ClientTimeout: got %v, want the client's timeout %v", got, h.Timeout)
	}
	for _, poll := range []time.Duration{time.Millisecond, h.Timeout, 10 * h.Timeout} {
		if got := h.Engine.LongPollTimeout(poll); got <= poll || got < h.Timeout {
			t.Errorf("LongPollTimeout(%v) = %v: want longer than the poll and at least %v", poll, got, h.Timeout)
		}
	}
}
