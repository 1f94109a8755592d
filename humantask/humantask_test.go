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
	"sync/atomic"
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
	// The approval process: one user task "approve", candidates alice, bob and group approvers.
	testenv.DeployUserTask(t, e.engine, testenv.UserTaskProcess{Key: e.key,
		CandidateUsers: []string{"alice", "bob"}, CandidateGroups: []string{"approvers"}})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
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
	require.LessOrEqual(t, len(vs), 1)
	var text string
	if len(vs) == 0 || string(vs[0].Value) == "null" {
		return nil // none, or cleared
	}
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

// Who completed a task, and when, is told only to a user who had a right on it (a
// candidate user, a member of a candidate group, its assignee): anyone else gets the
// 404 of a task that is not there. An outside tester read both of any task.
func TestConflictNamesTheWinnerOnlyToThoseWithARight(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, nil)
	etag := e.etag(t, task, "alice")
	require.Equal(t, http.StatusOK, e.complete(t, task, "alice", "c-alice", etag, `{}`).status)

	stranger := e.complete(t, task, "mallory", "c-mallory", etag, `{}`)
	assert.Equal(t, http.StatusNotFound, stranger.status)
	assert.JSONEq(t, `{"error":"no such task","task":"`+task+`"}`, string(stranger.body))
	assert.NotContains(t, string(stranger.body), "alice")

	candidate := e.complete(t, task, "bob", "c-bob", etag, `{}`)
	assert.Equal(t, http.StatusConflict, candidate.status)
	assert.Contains(t, string(candidate.body), `"completedBy":"alice"`)
	member := e.do(t, http.MethodPost, "/tasks/"+task+"/complete", "dave", "approvers", []byte(`{}`), "Idempotency-Key", "c-dave", "If-Match", etag)
	assert.Equal(t, http.StatusConflict, member.status, "a member of a candidate group")
}

// A task whose process is suspended is refused with a 409 saying so (it was a 503 for
// ever); once the process is activated again, a new command completes it.
func TestSuspendedTaskIs409(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, nil)
	ctx := testenv.Context(t, 30*time.Second)
	ut, err := e.engine.UserTask(ctx, task)
	require.NoError(t, err)
	require.NoError(t, e.engine.SuspendProcessInstance(ctx, ut.ProcessInstanceID, true))
	etag := e.etag(t, task, "alice")
	r := e.complete(t, task, "alice", "c1", etag, `{}`)
	assert.Equal(t, http.StatusConflict, r.status, string(r.body))
	assert.Contains(t, string(r.body), `"state":"suspended"`)
	assert.Equal(t, r.body, e.complete(t, task, "alice", "c1", etag, `{}`).body, "the same command, the same answer")

	require.NoError(t, e.engine.SuspendProcessInstance(ctx, ut.ProcessInstanceID, false))
	assert.Equal(t, http.StatusOK, e.complete(t, task, "alice", "c2", e.etag(t, task, "alice"), `{}`).status)
}

// A command id is its sender's: another user who sends it first (copied from a page's
// address) sends a command of their own, and the owner's still completes the task (an
// outside tester pre-empted it: the owner got a 422).
func TestCommandIDCopiedByAnotherUserDoesNotPreemptTheOwner(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, nil)
	etag := e.etag(t, task, "alice")
	stale := e.complete(t, task, "bob", "shared-id", `"not the etag"`, `{"approved": false}`)
	require.Equal(t, http.StatusPreconditionFailed, stale.status)
	r := e.complete(t, task, "alice", "shared-id", etag, `{"approved": true}`)
	assert.Equal(t, http.StatusOK, r.status, string(r.body))
	assert.Equal(t, map[string]string{"command": "shared-id", "user": "alice"}, e.marker(t, task))
	again := e.complete(t, task, "bob", "shared-id", etag, `{"approved": false}`)
	assert.Equal(t, stale.body, again.body, "bob's command keeps bob's answer")
}

// What cannot name a command unambiguously, or would be stored otherwise than sent, is
// a 400 with nothing recorded; If-Match takes "*" and lists (RFC 9110).
func TestSlashesBigIntegersAndIfMatchForms(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, nil)
	etag := e.etag(t, task, "alice")
	for name, r := range map[string]reply{
		"a / in the key":       e.complete(t, task, "alice", "a/b", etag, `{}`),
		"a / in the task id":   e.complete(t, url.PathEscape(task+"/x"), "alice", "c", etag, `{}`),
		"an integer past Long": e.complete(t, task, "alice", "c", etag, `{"n": 9223372036854775808}`),
		"GET of a / in the id": e.do(t, http.MethodGet, "/tasks/"+url.PathEscape(task+"/x"), "alice", "", nil),
	} {
		assert.Equal(t, http.StatusBadRequest, r.status, "%s: %s", name, r.body)
	}
	assert.Zero(t, e.intents(t), "nothing recorded")
	r := e.complete(t, task, "alice", "c-list", `"stale", `+etag, `{}`)
	assert.Equal(t, http.StatusOK, r.status, "a list holding the ETag: %s", r.body)
	other := e.startInstance(t, nil)
	assert.Equal(t, http.StatusOK, e.complete(t, other, "alice", "c-star", "*", `{}`).status, "If-Match: *")

	// Two If-Match lines are one list (an outside tester: only the first was read); two
	// Idempotency-Keys name no command.
	third := e.startInstance(t, nil)
	twice := func(name, first, second string) reply {
		req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/tasks/"+third+"/complete", strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("X-User", "alice")
		req.Header.Set("Idempotency-Key", "c-lines")
		req.Header.Set("If-Match", e.etag(t, third, "alice"))
		req.Header.Set(name, first)
		req.Header.Add(name, second)
		resp, err := e.srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return reply{resp.StatusCode, resp.Header, b}
	}
	keys := twice("Idempotency-Key", "k1", "k2")
	assert.Equal(t, http.StatusBadRequest, keys.status, string(keys.body))
	lines := twice("If-Match", `"stale"`, e.etag(t, third, "alice"))
	assert.Equal(t, http.StatusOK, lines.status, string(lines.body))
}

// A task whose form declares fields (camunda:formField) is completed with those only: a
// variable the process has but the form does not declare ("amount"), or a new name, is
// a 422 naming the fields, and the task still waits. An outside tester could set any
// variable through any task's form.
func TestDeclaredFormFieldsOnly(t *testing.T) {
	e := newEnv(t, nil)
	e.key = testenv.DeployUserTask(t, e.engine, testenv.UserTaskProcess{CandidateUsers: []string{"alice"},
		FormFields: []testenv.FormField{{ID: "approved", Type: "boolean"}, {ID: "comment", Type: "string"}}}).Key
	task := e.startInstance(t, camunda7.Variables{"amount": camunda7.LongVar(100)})
	r := e.do(t, http.MethodGet, "/tasks/"+task, "alice", "", nil)
	require.Equal(t, http.StatusOK, r.status)
	var shown humantask.Task
	require.NoError(t, json.Unmarshal(r.body, &shown))
	assert.Equal(t, []string{"approved", "comment"}, shown.Fields)
	etag := r.header.Get("ETag")

	for name, form := range map[string]string{"a variable the form does not declare": `{"approved": true, "amount": 1}`,
		"a new name":            `{"approved": true, "approver": "mallory"}`,
		"a sentence for a name": `{"approved": true, "SSN 123-45-6789 my password is hunter2": 1}`} {
		r := e.complete(t, task, "alice", testenv.Unique("c"), etag, form)
		assert.Equal(t, http.StatusUnprocessableEntity, r.status, "%s: %s", name, r.body)
		assert.Contains(t, string(r.body), "approved, comment", name)
		assert.NotContains(t, string(r.body), "hunter2", "%s: a name that is no field's is not repeated (nor recorded)", name)
	}
	assert.Equal(t, http.StatusOK, e.complete(t, task, "alice", "c-ok", etag, `{"approved": true, "comment": "fine"}`).status)
}

// identityFunc is an IdentitySource of a function.
type identityFunc func(*http.Request) (humantask.Identity, error)

func (f identityFunc) Identify(r *http.Request) (humantask.Identity, error) { return f(r) }

// GET /tasks answers a user in thousands of groups, or in groups no engine group can be
// named (a NUL byte, 10,000 characters): such groups are dropped, the others queried in
// the request's body. An outside tester got 503 for ever (the engine refused the URL).
func TestListsForUsersInManyOrOddGroups(t *testing.T) {
	e := newEnv(t, nil)
	group := testenv.Unique("grp")
	e.key = testenv.DeployUserTask(t, e.engine, testenv.UserTaskProcess{CandidateGroups: []string{group}}).Key
	task := e.startInstance(t, nil)
	many := make([]string, 0, 2501)
	for i := range 2500 {
		many = append(many, fmt.Sprintf("other-%d", i))
	}
	many = append(many, group)
	for name, groups := range map[string][]string{
		"2,501 groups":           many,
		"a group with a NUL":     {"mg\x00rs", group},
		"a group of 10,000":      {strings.Repeat("g", 10000), group},
		"invalid UTF-8 and a CR": {"\xff", "a\rb", group},
	} {
		svc, err := humantask.New(humantask.Config{Engine: e.engine, Pool: e.pool, Namespace: e.ns,
			Identity: identityFunc(func(*http.Request) (humantask.Identity, error) {
				return humantask.Identity{User: "zoe", Groups: groups}, nil
			})})
		require.NoError(t, err)
		srv := httptest.NewServer(svc.Handler())
		resp, err := http.Get(srv.URL + "/tasks")
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", name, body)
		assert.Contains(t, string(body), task, name)
	}
}

// A number keeps the type of the variable it overwrites, in the engine's history: an
// Integer stays an Integer, and a fraction for a Long is a 422 (an outside tester's 1.5
// turned a Long form field into a Double).
func TestNumbersKeepTheirVariablesTypes(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, camunda7.Variables{"count": {Type: camunda7.TypeInteger, Value: json.RawMessage("2")},
		"amount": camunda7.LongVar(100)})
	etag := e.etag(t, task, "alice")
	r := e.complete(t, task, "alice", "c-frac", etag, `{"amount": 1.5}`)
	assert.Equal(t, http.StatusUnprocessableEntity, r.status, string(r.body))
	require.Equal(t, http.StatusOK, e.complete(t, task, "alice", "c-ok", etag, `{"count": 3, "amount": 250}`).status)
	ctx := testenv.Context(t, 30*time.Second)
	hs, err := e.engine.HistoricUserTasks(ctx, url.Values{"taskId": {task}})
	require.NoError(t, err)
	require.Len(t, hs, 1)
	vs, err := e.engine.HistoricVariableInstances(ctx, url.Values{"processInstanceId": {hs[0].ProcessInstanceID}})
	require.NoError(t, err)
	types := map[string]string{}
	for _, v := range vs {
		types[v.Name] = v.Type + " " + string(v.Value)
	}
	assert.Equal(t, "Integer 3", types["count"])
	assert.Equal(t, "Long 250", types["amount"])
}

// A standalone task (created without a process, as Tasklist can) never makes a whole
// list 503 (an outside tester's find: every member of its candidate group got 503 for
// ever). It is not listed, and a command on it is a 422: the engine keeps no record of a
// standalone task's completion variables (a third tester saw the marker dropped and the
// service call its own completion "outside this service").
func TestStandaloneTaskNeitherListedNorCompleted(t *testing.T) {
	e := newEnv(t, nil)
	ctx := testenv.Context(t, 30*time.Second)
	group := testenv.Unique("solo")
	solo := testenv.Unique("solo")
	require.NoError(t, e.engine.Do(ctx, camunda7.Request{Op: "create a task", Method: http.MethodPost, Path: "/task/create",
		Body: map[string]string{"id": solo, "name": "standalone"}}))
	t.Cleanup(func() {
		_ = e.engine.Do(context.Background(), camunda7.Request{Op: "delete a task", Method: http.MethodDelete,
			Path: "/task/" + solo, Query: url.Values{"cascade": {"true"}}})
	})
	require.NoError(t, e.engine.AddUserTaskIdentityLink(ctx, solo, admin.IdentityLink{GroupID: group, Type: "candidate"}))
	e.key = testenv.DeployUserTask(t, e.engine, testenv.UserTaskProcess{CandidateGroups: []string{group}}).Key
	task := e.startInstance(t, nil)

	r := e.do(t, http.MethodGet, "/tasks", "zoe", group, nil)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	assert.NotContains(t, string(r.body), solo)
	assert.Contains(t, string(r.body), task)
	etag := e.do(t, http.MethodGet, "/tasks/"+solo, "zoe", group, nil).header.Get("ETag")
	c := e.do(t, http.MethodPost, "/tasks/"+solo+"/complete", "zoe", group, []byte(`{"note": "done"}`),
		"Idempotency-Key", "c-solo", "If-Match", etag)
	assert.Equal(t, http.StatusUnprocessableEntity, c.status, string(c.body))
	_, err := e.engine.UserTask(ctx, solo)
	assert.NoError(t, err, "the standalone task still waits")
}

// A task whose form declares fields is completed through the form, as Tasklist does: the
// engine's validations hold (readonly, required, max, an enum's values, a date's format),
// a refusal is a 422 naming the field but never the value, the task still waits, and a
// declared field the request leaves out keeps its value (the engine would set its
// default). An outside tester stored all of these through a plain complete.
func TestFormValidationsHold(t *testing.T) {
	e := newEnv(t, nil)
	// The fields need constraints DeployUserTask does not write: deployed here.
	e.key = testenv.Unique("validated")
	bpmn := fmt.Sprintf(`<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn" id="defs-%[1]s" targetNamespace="http://extworker.dev/test">
  <bpmn:process id="%[1]s" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="approve"/>
    <bpmn:userTask id="approve" camunda:candidateUsers="alice"><bpmn:extensionElements><camunda:formData>
      <camunda:formField id="limit" type="long" defaultValue="100"><camunda:validation><camunda:constraint name="readonly"/></camunda:validation></camunda:formField>
      <camunda:formField id="amount" type="long"><camunda:validation><camunda:constraint name="required"/><camunda:constraint name="max" config="1000"/></camunda:validation></camunda:formField>
      <camunda:formField id="kind" type="enum"><camunda:value id="a" name="A"/><camunda:value id="b" name="B"/></camunda:formField>
      <camunda:formField id="due" type="date"/>
      <camunda:formField id="comment" type="string" defaultValue="none"/>
      <camunda:formField id="since" type="date"/>
    </camunda:formData></bpmn:extensionElements></bpmn:userTask>
    <bpmn:sequenceFlow id="f2" sourceRef="approve" targetRef="end"/>
    <bpmn:endEvent id="end"/>
  </bpmn:process>
</bpmn:definitions>`, e.key)
	ctx := testenv.Context(t, time.Minute)
	dep, err := e.engine.Deploy(ctx, admin.Deployment{Name: e.key, Resources: []admin.Resource{{Name: e.key + ".bpmn", Content: []byte(bpmn)}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.engine.DeleteDeployment(context.Background(), dep.ID, true) })
	task := e.startInstance(t, camunda7.Variables{"comment": camunda7.StringVar("keep me"),
		"since": {Type: camunda7.TypeDate, Value: json.RawMessage(`"2024-02-01T13:45:00.000+0000"`)}})
	etag := e.etag(t, task, "alice")
	for form, reason := range map[string]string{
		`{"limit": 5, "amount": 5}`:                  `not a field of the task's form`, // readonly: not settable
		`{"amount": 5000}`:                           `validation of max(1000) failed`,
		`{"kind": "a"}`:                              `validation of required failed`,
		`{"amount": 5, "kind": "zzz-secret"}`:        `not one of its enum field's values`,
		`{"amount": 5, "due": "not a date, secret"}`: `not in its field's format`,
		// a value that reads like a field's refusal is not taken for one (nor echoed)
		`{"amount": 5, "kind": "form field 'secret': validation of required failed"}`: `not one of its enum field's values`,
	} {
		r := e.complete(t, task, "alice", testenv.Unique("c"), etag, form)
		assert.Equal(t, http.StatusUnprocessableEntity, r.status, "%s: %s", form, r.body)
		assert.Contains(t, string(r.body), reason, form)
		assert.NotContains(t, string(r.body), "secret", "%s: the value is not echoed", form)
	}
	_, err = e.engine.UserTask(ctx, task)
	require.NoError(t, err, "the task still waits")
	r := e.complete(t, task, "alice", "c-ok", etag, `{"amount": 5, "kind": "b", "due": "24/12/2026"}`)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	hs, err := e.engine.HistoricUserTasks(ctx, url.Values{"taskId": {task}})
	require.NoError(t, err)
	vs, err := e.engine.HistoricVariableInstances(ctx, url.Values{"processInstanceId": {hs[0].ProcessInstanceID}})
	require.NoError(t, err)
	got := map[string]string{}
	for _, v := range vs {
		got[v.Name] = v.Type + " " + string(v.Value)
	}
	assert.Equal(t, `String "keep me"`, got["comment"], "a declared field left out keeps its value, not its default")
	assert.Equal(t, "Long 5", got["amount"])
	assert.Equal(t, "Long 100", got["limit"], "the readonly field keeps its default")
	assert.Equal(t, `Date "2024-02-01T13:45:00.000+0000"`, got["since"], "a date left out keeps its time (a tester saw it cut to the day)")
}

// parallelBPMN forks into two user tasks with form fields, then joins.
const parallelBPMN = `<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn" id="defs-%[1]s" targetNamespace="http://extworker.dev/test">
  <bpmn:process id="%[1]s" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f0" sourceRef="start" targetRef="fork"/>
    <bpmn:parallelGateway id="fork"/>
    <bpmn:sequenceFlow id="fa" sourceRef="fork" targetRef="ta"/>
    <bpmn:sequenceFlow id="fb" sourceRef="fork" targetRef="tb"/>
    <bpmn:userTask id="ta" camunda:assignee="alice"><bpmn:extensionElements><camunda:formData><camunda:formField id="a" type="long"/></camunda:formData></bpmn:extensionElements></bpmn:userTask>
    <bpmn:userTask id="tb" camunda:assignee="alice"><bpmn:extensionElements><camunda:formData><camunda:formField id="b" type="long"/></camunda:formData></bpmn:extensionElements></bpmn:userTask>
    <bpmn:sequenceFlow id="fa2" sourceRef="ta" targetRef="join"/>
    <bpmn:sequenceFlow id="fb2" sourceRef="tb" targetRef="join"/>
    <bpmn:parallelGateway id="join"/>
    <bpmn:sequenceFlow id="f9" sourceRef="join" targetRef="end"/>
    <bpmn:endEvent id="end"/>
  </bpmn:process>
</bpmn:definitions>`

// Two branches' tasks completed at once collide in the engine (an optimistic-locking
// failure at the join, code 1): the loser is sent again, and both complete. A third
// tester got a 422 "the form's values" recorded for one of them in 30 of 30 runs.
func TestParallelBranchesBothComplete(t *testing.T) {
	e := newEnv(t, nil)
	e.key = testenv.Unique("parallel")
	ctx := testenv.Context(t, 2*time.Minute)
	dep, err := e.engine.Deploy(ctx, admin.Deployment{Name: e.key, Resources: []admin.Resource{{Name: e.key + ".bpmn",
		Content: fmt.Appendf(nil, parallelBPMN, e.key)}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.engine.DeleteDeployment(context.Background(), dep.ID, true) })
	for round := range 5 {
		pi, err := e.engine.StartProcess(ctx, e.key, admin.StartProcessRequest{})
		require.NoError(t, err)
		ts, err := e.engine.UserTasks(ctx, url.Values{"processInstanceId": {pi.ID}})
		require.NoError(t, err)
		require.Len(t, ts, 2)
		replies := make([]reply, 2)
		var wg sync.WaitGroup
		for i, task := range ts {
			etag := e.etag(t, task.ID, "alice")
			field := map[string]string{"ta": "a", "tb": "b"}[task.TaskDefinitionKey]
			wg.Go(func() {
				replies[i] = e.complete(t, task.ID, "alice", fmt.Sprintf("c-%d-%d", round, i), etag, `{"`+field+`": 1}`)
			})
		}
		wg.Wait()
		for i, r := range replies {
			assert.Equal(t, http.StatusOK, r.status, "round %d, task %d: %s", round, i, r.body)
		}
	}
}

// listenerBPMN's user task has a complete listener that always fails, and a form field
// whose default is an expression that cannot be resolved.
const listenerBPMN = `<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn" id="defs-%[1]s" targetNamespace="http://extworker.dev/test">
  <bpmn:process id="%[1]s" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f0" sourceRef="start" targetRef="fork"/>
    <bpmn:parallelGateway id="fork"/>
    <bpmn:sequenceFlow id="f1" sourceRef="fork" targetRef="broken"/>
    <bpmn:sequenceFlow id="f2" sourceRef="fork" targetRef="unshown"/>
    <bpmn:userTask id="broken" camunda:assignee="alice"><bpmn:extensionElements>
      <camunda:taskListener event="complete" expression="${nosuchbean.explode()}"/>
    </bpmn:extensionElements></bpmn:userTask>
    <bpmn:userTask id="unshown" camunda:assignee="alice"><bpmn:extensionElements><camunda:formData>
      <camunda:formField id="x" type="string" defaultValue="${nosuchvariable}"/>
    </camunda:formData></bpmn:extensionElements></bpmn:userTask>
    <bpmn:sequenceFlow id="f3" sourceRef="broken" targetRef="end1"/>
    <bpmn:sequenceFlow id="f4" sourceRef="unshown" targetRef="end2"/>
    <bpmn:endEvent id="end1"/>
    <bpmn:endEvent id="end2"/>
  </bpmn:process>
</bpmn:definitions>`

// A task the engine fails to complete for good (a listener that throws) is a 502
// recorded as the command's answer, not 503s for ever (a third tester's service asked the
// engine 14 times a request and left the command unsettled); a task whose form the engine
// cannot show is a 502 to GET.
func TestEngineFailingForGoodIs502(t *testing.T) {
	e := newEnv(t, nil)
	e.key = testenv.Unique("listener")
	ctx := testenv.Context(t, time.Minute)
	dep, err := e.engine.Deploy(ctx, admin.Deployment{Name: e.key, Resources: []admin.Resource{{Name: e.key + ".bpmn",
		Content: fmt.Appendf(nil, listenerBPMN, e.key)}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.engine.DeleteDeployment(context.Background(), dep.ID, true) })
	pi, err := e.engine.StartProcess(ctx, e.key, admin.StartProcessRequest{})
	require.NoError(t, err)
	ts, err := e.engine.UserTasks(ctx, url.Values{"processInstanceId": {pi.ID}})
	require.NoError(t, err)
	require.Len(t, ts, 2)
	byKey := map[string]string{}
	for _, task := range ts {
		byKey[task.TaskDefinitionKey] = task.ID
	}
	broken, unshown := byKey["broken"], byKey["unshown"]

	etag := e.etag(t, broken, "alice")
	start := time.Now()
	r := e.complete(t, broken, "alice", "c-broken", etag, `{}`)
	assert.Equal(t, http.StatusBadGateway, r.status, string(r.body))
	assert.Less(t, time.Since(start), 9*time.Second, "answered before AnswerWithin (10s), not a 503 after it")
	assert.Equal(t, r.body, e.complete(t, broken, "alice", "c-broken", etag, `{}`).body, "recorded: the same answer again")
	assert.NotContains(t, string(r.body), "nosuchbean", "the engine's message is not recorded")

	g := e.do(t, http.MethodGet, "/tasks/"+unshown, "alice", "", nil)
	assert.Equal(t, http.StatusBadGateway, g.status, string(g.body))
	c := e.complete(t, unshown, "alice", "c-unshown", "*", `{}`)
	assert.Equal(t, http.StatusBadGateway, c.status, string(c.body))
	l := e.do(t, http.MethodGet, "/tasks", "alice", "", nil)
	assert.Equal(t, http.StatusOK, l.status, "one task the engine cannot show leaves the list")
}

// Every entry point gets the form's checks, not only the JSON body: a Go caller (and the
// page, which calls Complete) cannot write the service's marker for another task, nor
// send a NUL byte or invalid UTF-8 (an outside tester forged a sibling task's marker
// through the page, and so got a 200 for a task that was never hers).
func TestCompleteChecksTheFormFromEveryEntryPoint(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, nil)
	etag := e.etag(t, task, "alice")
	ctx := testenv.Context(t, 30*time.Second)
	for name, form := range map[string]humantask.Form{
		"a marker":      {"extworker_completion_" + task: `{"command":"C","user":"alice"}`},
		"a NUL":         {"note": "hi\x00"},
		"invalid UTF-8": {"note": "hi\xff"},
		"a bad name":    {"no\xffte": "x"},
		// not JSON numbers: each was answered 503 "not settled yet" for ever (the
		// request's digest could not encode them), and "1_001" was "beyond a Long's range"
		"a plus sign":    {"amount": json.Number("+5")},
		"a leading zero": {"amount": json.Number("0500")},
		"a hex float":    {"amount": json.Number("0x1.fp10")},
		"an underscore":  {"amount": json.Number("1_001")},
		"a bare dot":     {"amount": json.Number(".5")},
		"not a number":   {"amount": json.Number("NaN")},
	} {
		a := e.service.Complete(ctx, humantask.Identity{User: "alice"}, humantask.Command{TaskID: task, ID: testenv.Unique("c"), IfMatch: etag, Form: form})
		assert.Equal(t, http.StatusBadRequest, a.Status, "%s: %s", name, a.Body)
	}
	assert.Zero(t, e.intents(t), "nothing recorded")
}

// A command's row an operator resolved alone (`rejected`, with a text of their own) is
// not the command's answer: the engine's history is (an outside tester's operator turned
// a completed command's 200 into a 409 with the body "alone").
func TestOperatorResolutionIsNotTheCommandsAnswer(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, nil)
	etag := e.etag(t, task, "alice")
	first := e.complete(t, task, "alice", "c-op", etag, `{}`)
	require.Equal(t, http.StatusOK, first.status)
	tag, err := e.pool.Exec(testenv.Context(t, 10*time.Second), `UPDATE extworker_intents SET state = 'rejected',
		error_code = 'REJECTED', error_message = 'alone' WHERE namespace = $1 AND scope = $2`, e.ns, humantask.Scope)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	again := e.complete(t, task, "alice", "c-op", etag, `{}`)
	assert.Equal(t, http.StatusOK, again.status, string(again.body))
	assert.Equal(t, string(first.body), string(again.body), "the engine's answer, byte for byte")
	other := e.complete(t, task, "bob", "c-bob", etag, `{}`)
	assert.Contains(t, string(other.body), `"completedBy":"alice"`)
}

// The marker of a task completed before, in the same instance, is not shown with a later
// task: it names who completed the earlier one and with which command, which the 404 of
// a command on that task hides from a user who had no right on it (an outside tester
// read it from the next task's variables).
func TestMarkersOfOtherTasksAreNotShown(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, camunda7.Variables{"extworker_completion_earlier": camunda7.StringVar(`{"command":"secret-cmd","user":"carol"}`),
		"amount": camunda7.LongVar(5)})
	r := e.do(t, http.MethodGet, "/tasks/"+task, "alice", "", nil)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	assert.NotContains(t, string(r.body), "secret-cmd")
	assert.NotContains(t, string(r.body), "extworker_completion_")
	assert.Contains(t, string(r.body), `"amount"`)
	l := e.do(t, http.MethodGet, "/tasks", "alice", "", nil)
	require.Equal(t, http.StatusOK, l.status, string(l.body))
	assert.NotContains(t, string(l.body), "secret-cmd")
}

// engineTaskOp posts a task operation (delegate, resolve) to the engine's REST, as
// Tasklist does; the service itself never sends them.
func engineTaskOp(t *testing.T, task, op, body string) {
	t.Helper()
	req, err := http.NewRequestWithContext(testenv.Context(t, 30*time.Second), http.MethodPost,
		testenv.EngineURL()+"/task/"+task+"/"+op, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode, "%s %s", op, task)
}

// A task whose delegation is pending is not completed through the service: the engine's
// submit-form resolves it back to its owner instead (Tasklist's "complete" by the
// delegate), so a 200 "completed" would be false. An outside tester's delegate got 200
// for a form task the engine had only resolved, and its owner then got a second 200 for
// the same task. The delegate's command is a 409 "delegated", recorded; once the
// delegation is resolved, the owner completes it.
func TestDelegatedTaskIs409UntilResolved(t *testing.T) {
	for _, form := range []bool{true, false} {
		t.Run(map[bool]string{true: "declared form fields", false: "no form fields"}[form], func(t *testing.T) {
			e := newEnv(t, nil)
			p := testenv.UserTaskProcess{CandidateUsers: []string{"alice"}}
			if form {
				p.FormFields = []testenv.FormField{{ID: "approved", Type: "boolean"}}
			}
			e.key = testenv.DeployUserTask(t, e.engine, p).Key
			task := e.startInstance(t, nil)
			require.NoError(t, e.engine.SetUserTaskAssignee(testenv.Context(t, 10*time.Second), task, "alice"))
			engineTaskOp(t, task, "delegate", `{"userId":"bob"}`)

			r := e.complete(t, task, "bob", "bob-1", e.etag(t, task, "bob"), `{"approved": true}`)
			require.Equal(t, http.StatusConflict, r.status, string(r.body))
			assert.Contains(t, string(r.body), `"state":"delegated"`)
			again := e.complete(t, task, "bob", "bob-1", e.etag(t, task, "bob"), `{"approved": true}`)
			assert.Equal(t, string(r.body), string(again.body), "the same answer byte for byte")
			ts, err := e.engine.UserTask(testenv.Context(t, 10*time.Second), task)
			require.NoError(t, err, "the task still waits")
			assert.Equal(t, "PENDING", ts.DelegationState, "its delegation still pending")
			assert.Nil(t, e.marker(t, task), "no marker")

			engineTaskOp(t, task, "resolve", `{}`)
			r = e.complete(t, task, "alice", "alice-1", e.etag(t, task, "alice"), `{"approved": false}`)
			require.Equal(t, http.StatusOK, r.status, string(r.body))
			assert.Equal(t, map[string]string{"command": "alice-1", "user": "alice"}, e.marker(t, task))
		})
	}
}

// A delegation made between the service's checks and its submit-form: the engine
// resolves it instead of completing the task. The command is a 409 "delegated", not a
// 200, and the marker it sent is cleared, so no later answer names it.
func TestDelegatedWhileSubmittingIs409(t *testing.T) {
	e := newEnv(t, nil)
	e.key = testenv.DeployUserTask(t, e.engine, testenv.UserTaskProcess{CandidateUsers: []string{"alice"},
		FormFields: []testenv.FormField{{ID: "approved", Type: "boolean"}}}).Key
	task := e.startInstance(t, nil)
	require.NoError(t, e.engine.SetUserTaskAssignee(testenv.Context(t, 10*time.Second), task, "alice"))
	tag := e.etag(t, task, "alice")
	var delegated atomic.Bool
	c := proxiedEngine(t, func(w http.ResponseWriter, r *http.Request, rp http.Handler) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/submit-form") && !delegated.Swap(true) {
			engineTaskOp(t, task, "delegate", `{"userId":"bob"}`)
		}
		rp.ServeHTTP(w, r)
	})
	e.start(t, c)
	r := e.complete(t, task, "alice", "alice-1", tag, `{"approved": true}`)
	require.True(t, delegated.Load())
	require.Equal(t, http.StatusConflict, r.status, string(r.body))
	assert.Contains(t, string(r.body), `"state":"delegated"`)
	_, err := e.engine.UserTask(testenv.Context(t, 10*time.Second), task)
	require.NoError(t, err, "the task still waits (resolved back to alice)")
	assert.Nil(t, e.marker(t, task), "the marker of a command that completed nothing is cleared")

	r = e.complete(t, task, "alice", "alice-2", e.etag(t, task, "alice"), `{"approved": true}`)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	assert.Equal(t, map[string]string{"command": "alice-2", "user": "alice"}, e.marker(t, task))
}
