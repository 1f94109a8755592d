package humantask_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/humantask"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

// approvalBPMN is a process that waits in one user task "approve" for candidate users
// alice and bob and candidate group approvers.
const approvalBPMN = `<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn"
  id="defs-%[1]s" targetNamespace="http://extworker.dev/test">
  <bpmn:process id="%[1]s" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="approve"/>
    <bpmn:userTask id="approve" camunda:candidateUsers="alice,bob" camunda:candidateGroups="approvers"/>
    <bpmn:sequenceFlow id="f2" sourceRef="approve" targetRef="end"/>
    <bpmn:endEvent id="end"/>
  </bpmn:process>
</bpmn:definitions>`

var migrateOnce sync.Once

// env is a migrated ledger database, the real engine with the approval process of the
// test's own, and a Service (ledger namespace of its own) behind an httptest server,
// identities taken from the X-User and X-Groups headers of a trusted proxy (loopback).
type env struct {
	pool    *pgxpool.Pool
	engine  *admin.Client
	key     string // process definition key
	ns      string
	guards  map[string]humantask.Guard
	srv     *httptest.Server
	service *humantask.Service
	// observer and answerWithin, when set, are the Service's Config.Observer and
	// Config.AnswerWithin.
	observer     humantask.Observer
	answerWithin time.Duration
}

func newEnv(t *testing.T, guards map[string]humantask.Guard) *env {
	t.Helper()
	e := &env{pool: testenv.DB(t), engine: testenv.Engine(t), key: testenv.Unique("approval"), ns: testenv.Unique("ht"), guards: guards}
	migrateOnce.Do(func() {
		_, err := migrations.Up(context.Background(), stdlib.OpenDBFromPool(e.pool))
		require.NoError(t, err)
	})
	ctx := testenv.Context(t, 30*time.Second)
	res, err := e.engine.Deploy(ctx, admin.Deployment{Name: e.key, Resources: []admin.Resource{{Name: e.key + ".bpmn",
		Content: fmt.Appendf(nil, approvalBPMN, e.key)}}})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = e.engine.DeleteDeployment(ctx, res.ID, true)
		_, _ = e.pool.Exec(ctx, `DELETE FROM extworker_intents WHERE namespace = $1`, e.ns)
	})
	e.start(t, e.engine)
	return e
}

// start (re)starts the service on engine: a restarted process keeps nothing in memory.
func (e *env) start(t *testing.T, engine *admin.Client) {
	t.Helper()
	if e.srv != nil {
		e.srv.Close()
	}
	id, err := humantask.NewProxyHeader(humantask.ProxyHeader{UserHeader: "X-User", GroupsHeader: "X-Groups",
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}})
	require.NoError(t, err)
	e.service, err = humantask.New(humantask.Config{Engine: engine, Pool: e.pool, Identity: id, Guards: e.guards,
		Namespace: e.ns, Lease: 5 * time.Second, Observer: e.observer, AnswerWithin: e.answerWithin})
	require.NoError(t, err)
	e.srv = httptest.NewServer(e.service.Handler())
	t.Cleanup(e.srv.Close)
}

// startInstance starts an instance with variables and returns its waiting task's id.
func (e *env) startInstance(t *testing.T, vars camunda7.Variables) string {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	pi, err := e.engine.StartProcess(ctx, e.key, admin.StartProcessRequest{Variables: vars})
	require.NoError(t, err)
	ts, err := e.engine.UserTasks(ctx, url.Values{"processInstanceId": {pi.ID}})
	require.NoError(t, err)
	require.Len(t, ts, 1)
	return ts[0].ID
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request as user (with groups), headers given as pairs.
func (e *env) do(t *testing.T, method, path, user, groups string, body []byte, headers ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, bytes.NewReader(body))
	require.NoError(t, err)
	if user != "" {
		req.Header.Set("X-User", user)
	}
	if groups != "" {
		req.Header.Set("X-Groups", groups)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{resp.StatusCode, resp.Header, b}
}

// etag is the task's ETag as user sees it.
func (e *env) etag(t *testing.T, task, user string) string {
	t.Helper()
	r := e.do(t, http.MethodGet, "/tasks/"+task, user, "", nil)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	require.NotEmpty(t, r.header.Get("ETag"))
	return r.header.Get("ETag")
}

func (e *env) complete(t *testing.T, task, user, command, ifMatch string, form string) reply {
	t.Helper()
	return e.do(t, http.MethodPost, "/tasks/"+task+"/complete", user, "", []byte(form), "Idempotency-Key", command, "If-Match", ifMatch)
}

// completedBody is the 200 body the contract names (doc.go).
func completedBody(t *testing.T, task, command, user string) string {
	b, err := json.Marshal(map[string]string{"state": "completed", "task": task, "command": command, "completedBy": user})
	require.NoError(t, err)
	return string(b)
}

// marker is what the engine's history holds of the task's completion.
func (e *env) marker(t *testing.T, task string) map[string]string {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	hs, err := e.engine.HistoricUserTasks(ctx, url.Values{"taskId": {task}})
	require.NoError(t, err)
	require.Len(t, hs, 1)
	vs, err := e.engine.HistoricVariableInstances(ctx, url.Values{"processInstanceId": {hs[0].ProcessInstanceID},
		"variableName": {"extworker_completion_" + task}})
	require.NoError(t, err)
	require.Len(t, vs, 1)
	var text string
	require.NoError(t, json.Unmarshal(vs[0].Value, &text))
	var m map[string]string
	require.NoError(t, json.Unmarshal([]byte(text), &m))
	return m
}

func (e *env) intents(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, e.pool.QueryRow(testenv.Context(t, 10*time.Second),
		`SELECT count(*) FROM extworker_intents WHERE namespace = $1`, e.ns).Scan(&n))
	return n
}

func TestSameCommandTwiceGetsTheFirstAnswerByteForByte(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, camunda7.Variables{"amount": camunda7.LongVar(40)})
	tag := e.etag(t, task, "alice")

	first := e.complete(t, task, "alice", "cmd-1", tag, `{"approved": true}`)
	require.Equal(t, http.StatusOK, first.status, string(first.body))
	assert.JSONEq(t, completedBody(t, task, "cmd-1", "alice"), string(first.body))
	again := e.complete(t, task, "alice", "cmd-1", tag, `{"approved": true}`)
	assert.Equal(t, first.status, again.status)
	assert.Equal(t, first.body, again.body, "the same command gets the first answer byte for byte")

	e.start(t, e.engine) // a restarted service answers it the same
	restarted := e.complete(t, task, "alice", "cmd-1", tag, `{"approved": true}`)
	assert.Equal(t, first.body, restarted.body)

	assert.Equal(t, map[string]string{"command": "cmd-1", "user": "alice"}, e.marker(t, task),
		"the engine recorded which command completed the task")
	reuse := e.complete(t, task, "alice", "cmd-1", tag, `{"approved": false}`)
	assert.Equal(t, http.StatusUnprocessableEntity, reuse.status, "a key reused with another form is refused")
}

func TestRacingCommandsOneWinsTheOthersGet409NamingTheWinner(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, nil)
	tag := e.etag(t, task, "alice")
	users := []string{"alice", "bob", "alice", "bob"}
	replies := make([]reply, len(users))
	var wg sync.WaitGroup
	for i, u := range users {
		wg.Go(func() { replies[i] = e.complete(t, task, u, fmt.Sprintf("race-%d", i), tag, `{}`) })
	}
	wg.Wait()
	winner := -1
	for i, r := range replies {
		if r.status == http.StatusOK {
			require.Equal(t, -1, winner, "exactly one command completes the task")
			winner = i
		}
	}
	require.NotEqual(t, -1, winner, "one command completes the task: %v", replies)
	m := e.marker(t, task)
	assert.Equal(t, fmt.Sprintf("race-%d", winner), m["command"])
	for i, r := range replies {
		if i == winner {
			continue
		}
		require.Equal(t, http.StatusConflict, r.status, string(r.body))
		var b map[string]string
		require.NoError(t, json.Unmarshal(r.body, &b))
		assert.Equal(t, users[winner], b["completedBy"], "the 409 names who completed the task")
		_, err := time.Parse(time.RFC3339Nano, b["completedAt"])
		assert.NoError(t, err, "the 409 says when")
		again := e.complete(t, task, users[i], fmt.Sprintf("race-%d", i), tag, `{}`)
		assert.Equal(t, r.body, again.body, "the losing command gets its 409 again")
	}
}

func TestStaleIfMatchIs412(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, nil)
	tag := e.etag(t, task, "bob")
	require.NoError(t, e.engine.ClaimUserTask(testenv.Context(t, 10*time.Second), task, "bob"))
	r := e.complete(t, task, "bob", "stale-1", tag, `{}`)
	assert.Equal(t, http.StatusPreconditionFailed, r.status, string(r.body))
	fresh := e.complete(t, task, "bob", "fresh-1", e.etag(t, task, "bob"), `{}`)
	assert.Equal(t, http.StatusOK, fresh.status, string(fresh.body))
}

func TestNotAssigneeOrCandidateIs403(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, nil)
	tag := e.etag(t, task, "alice")
	assert.Equal(t, http.StatusForbidden, e.do(t, http.MethodGet, "/tasks/"+task, "carol", "", nil).status)
	r := e.complete(t, task, "carol", "c-1", tag, `{}`)
	assert.Equal(t, http.StatusForbidden, r.status, string(r.body))
	// a member of a candidate group may; once alice claims it, bob (a candidate) may not
	assert.Equal(t, http.StatusOK, e.do(t, http.MethodGet, "/tasks/"+task, "dave", "sales, approvers", nil).status)
	require.NoError(t, e.engine.ClaimUserTask(testenv.Context(t, 10*time.Second), task, "alice"))
	r = e.complete(t, task, "bob", "b-1", e.etag(t, task, "alice"), `{}`)
	assert.Equal(t, http.StatusForbidden, r.status, string(r.body))
}

func TestGuardRefusalIs422WithItsReason(t *testing.T) {
	e := newEnv(t, map[string]humantask.Guard{"approve": func(_ context.Context, task humantask.Task, f humantask.Form) error {
		amount, err := task.Variables.Long("amount")
		if err != nil {
			return err
		}
		if f["approved"] == true && amount > 1000 {
			return errors.New("amounts above 1000 need a second approver")
		}
		return nil
	}})
	task := e.startInstance(t, camunda7.Variables{"amount": camunda7.LongVar(5000)})
	tag := e.etag(t, task, "alice")
	r := e.complete(t, task, "alice", "g-1", tag, `{"approved": true}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.status, string(r.body))
	var b map[string]string
	require.NoError(t, json.Unmarshal(r.body, &b))
	assert.Equal(t, "amounts above 1000 need a second approver", b["reason"])
	declined := e.complete(t, task, "alice", "g-2", tag, `{"approved": false}`)
	assert.Equal(t, http.StatusOK, declined.status, string(declined.body))
}

func TestUnknownTaskIs404(t *testing.T) {
	e := newEnv(t, nil)
	assert.Equal(t, http.StatusNotFound, e.do(t, http.MethodGet, "/tasks/no-such-task", "alice", "", nil).status)
	r := e.complete(t, "no-such-task", "alice", "u-1", `"x"`, `{}`)
	assert.Equal(t, http.StatusNotFound, r.status, string(r.body))
}

func TestCompletedOutsideTheServiceIs409(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, nil)
	tag := e.etag(t, task, "alice")
	require.NoError(t, e.engine.CompleteUserTask(testenv.Context(t, 10*time.Second), task, nil))
	r := e.complete(t, task, "alice", "late-1", tag, `{}`)
	require.Equal(t, http.StatusConflict, r.status, string(r.body))
	var b map[string]string
	require.NoError(t, json.Unmarshal(r.body, &b))
	assert.Empty(t, b["completedBy"])
	assert.NotEmpty(t, b["completedAt"])
}

func TestMissingHeadersAre428AndBadInputs400WithNothingStored(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, nil)
	tag := e.etag(t, task, "alice")
	path := "/tasks/" + task + "/complete"
	assert.Equal(t, http.StatusPreconditionRequired, e.do(t, http.MethodPost, path, "alice", "", []byte(`{}`), "If-Match", tag).status)
	assert.Equal(t, http.StatusPreconditionRequired, e.do(t, http.MethodPost, path, "alice", "", []byte(`{}`), "Idempotency-Key", "k").status)
	assert.Equal(t, http.StatusUnauthorized, e.do(t, http.MethodPost, path, "", "", []byte(`{}`), "Idempotency-Key", "k", "If-Match", tag).status)
	for name, c := range map[string]struct{ user, key, body string }{
		"invalid UTF-8 in the body":   {"alice", "k1", "{\"note\": \"\xff\"}"},
		"NUL in a variable":           {"alice", "k2", `{"note": "a\u0000b"}`},
		"NUL in a variable name":      {"alice", "k3", `{"a\u0000": 1}`},
		"invalid UTF-8 in the key":    {"alice", "k\xff", `{}`},
		"invalid UTF-8 in the user":   {"al\xffice", "k4", `{}`},
		"a nested value":              {"alice", "k5", `{"a": {"b": 1}}`},
		"not an object":               {"alice", "k6", `[1]`},
		"the marker's name":           {"alice", "k7", `{"extworker_completion_x": "forged"}`},
		"two JSON values":             {"alice", "k8", `{} {}`},
		"a number a Double cannot be": {"alice", "k9", `{"n": 1e999}`},
		// the engine refuses a longer String on every attempt: it was answered 503 for ever
		"a string the engine cannot store": {"alice", "k10", `{"note": "` + strings.Repeat("é", 4001) + `"}`},
	} {
		r := e.complete(t, task, c.user, c.key, tag, c.body)
		assert.Equal(t, http.StatusBadRequest, r.status, "%s: %s", name, r.body)
	}
	assert.Zero(t, e.intents(t), "nothing stored for a refused request")
	ok := e.complete(t, task, "alice", "k-ok", tag, `{"note": "ünïcode ✓"}`)
	assert.Equal(t, http.StatusOK, ok.status, string(ok.body))
}

func TestETagChangesWhenTheTaskDoes(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, camunda7.Variables{"amount": camunda7.LongVar(1)})
	ctx := testenv.Context(t, 30*time.Second)
	seen := map[string]string{"start": e.etag(t, task, "alice")}
	assert.Equal(t, seen["start"], e.etag(t, task, "alice"), "unchanged task, same ETag")
	for _, step := range []struct {
		name string
		do   func() error
	}{
		{"variable", func() error { return e.engine.SetUserTaskVariable(ctx, task, "amount", camunda7.LongVar(2)) }},
		{"candidate group", func() error {
			return e.engine.AddUserTaskIdentityLink(ctx, task, admin.IdentityLink{GroupID: "auditors", Type: "candidate"})
		}},
		{"candidate user", func() error {
			return e.engine.AddUserTaskIdentityLink(ctx, task, admin.IdentityLink{UserID: "erin", Type: "candidate"})
		}},
		{"claim", func() error { return e.engine.ClaimUserTask(ctx, task, "alice") }},
	} {
		require.NoError(t, step.do(), step.name)
		tag := e.etag(t, task, "alice")
		for before, old := range seen {
			assert.NotEqual(t, old, tag, "the ETag after %s differs from the one after %s", step.name, before)
		}
		seen[step.name] = tag
	}
	require.NoError(t, e.engine.SetUserTaskAssignee(ctx, task, "bob"))
	tag := e.etag(t, task, "bob")
	assert.NotContains(t, []string{seen["claim"], seen["start"]}, tag, "reassigning changes the ETag")
}

func TestListsTheCallersTasks(t *testing.T) {
	e := newEnv(t, nil)
	mine := e.startInstance(t, nil)
	claimed := e.startInstance(t, nil)
	require.NoError(t, e.engine.ClaimUserTask(testenv.Context(t, 10*time.Second), claimed, "bob"))
	ids := func(user, groups string) []string {
		r := e.do(t, http.MethodGet, "/tasks", user, groups, nil)
		require.Equal(t, http.StatusOK, r.status, string(r.body))
		var b struct{ Tasks []humantask.Task }
		require.NoError(t, json.Unmarshal(r.body, &b))
		var out []string
		for _, tk := range b.Tasks {
			if tk.ID == mine || tk.ID == claimed {
				out = append(out, tk.ID)
				assert.NotEmpty(t, tk.ETag)
			}
		}
		return out
	}
	assert.ElementsMatch(t, []string{mine}, ids("alice", ""), "alice: the unclaimed one")
	assert.ElementsMatch(t, []string{mine, claimed}, ids("bob", ""), "bob: the unclaimed one and his own")
	assert.ElementsMatch(t, []string{mine}, ids("dave", "approvers"), "a candidate group's member")
	assert.Empty(t, ids("carol", ""))
}
