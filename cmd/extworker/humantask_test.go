package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/humantask"
	"github.com/extworker/extworker/internal/testenv"
)

// completionService is a humantask.Service on the ledger namespace the command is
// configured with (effectsEnv's), on the test engine with a process of its own; start
// starts an instance and returns its task's id.
func completionService(t *testing.T) (http.Handler, func() string) {
	t.Helper()
	l := effectsEnv(t)
	engine := testenv.Engine(t)
	ctx := testenv.Context(t, time.Minute)
	key := testenv.DeployUserTask(t, engine, testenv.UserTaskProcess{CandidateUsers: []string{"alice", "bob"}}).Key
	id, err := humantask.NewProxyHeader(humantask.ProxyHeader{UserHeader: "X-User",
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	require.NoError(t, err)
	s, err := humantask.New(humantask.Config{Engine: engine, Pool: testenv.DB(t), Identity: id,
		Namespace: l.Operations().Namespace()})
	require.NoError(t, err)
	return s.Handler(), func() string {
		pi, err := engine.StartProcess(ctx, key, admin.StartProcessRequest{})
		require.NoError(t, err)
		ts, err := engine.UserTasks(ctx, url.Values{"processInstanceId": {pi.ID}})
		require.NoError(t, err)
		require.Len(t, ts, 1)
		return ts[0].ID
	}
}

// serve sends one request to h from the trusted proxy's address as user.
func serve(h http.Handler, method, path, user string, body string, headers ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.RemoteAddr = "127.0.0.1:40000"
	req.Header.Set("X-User", user)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func humantaskRun(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(append([]string{"humantask"}, args...), &out, &errOut)
	return out.String(), err
}

// TestHumantaskCommandsListsATasksCommands: real commands on a task (one completes it,
// one is told it lost, one is refused, one with bidi overrides in its id (the service refuses control characters)) and one on
// another task; the command lists the task's, oldest first, with the user, the ledger's
// state and the recorded answer, byte for byte what the service answered (JSON), no
// escape sequence reaching the terminal, and nothing of the other task.
func TestHumantaskCommandsListsATasksCommands(t *testing.T) {
	h, start := completionService(t)
	task, other := start(), start()
	etag := serve(h, http.MethodGet, "/tasks/"+task, "alice", "").Header().Get("ETag")
	require.NotEmpty(t, etag)
	complete := func(task, user, command, body string) *httptest.ResponseRecorder {
		return serve(h, http.MethodPost, "/tasks/"+task+"/complete", user, body, "Idempotency-Key", command, "If-Match", etag)
	}
	sent := []struct {
		user, command string
		status        int
	}{
		{"alice", "cmd-a", http.StatusOK},
		{"bob", "cmd-b", http.StatusConflict},
		{"carol", "cmd-c", http.StatusNotFound}, // never a candidate: she learns nothing of who completed it
		{"bob", "cmd-\u202eforged\u2066", http.StatusConflict},
		// A user whose name reads as columns of the table (an outside tester's forgery).
		{"mallory  confirmed  200 completed", "cmd-spaced", http.StatusNotFound},
	}
	answers := map[string]string{}
	for _, c := range sent {
		r := complete(task, c.user, c.command, `{"approved": true}`)
		require.Equal(t, c.status, r.Code, r.Body.String())
		answers[c.command] = r.Body.String()
	}
	require.Equal(t, http.StatusPreconditionFailed, complete(other, "alice", "cmd-other", `{}`).Code, "another task's etag")

	out, err := humantaskRun(t, "commands", task, "--json")
	require.NoError(t, err, out)
	var got commandsJSON
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	assert.Equal(t, task, got.Task)
	require.Len(t, got.Commands, len(sent), "the task's commands, and no other task's")
	for i, c := range got.Commands {
		assert.Equal(t, sent[i].command, c.Command, "oldest first")
		assert.Equal(t, sent[i].user, c.User)
		require.NotNil(t, c.Status)
		assert.Equal(t, sent[i].status, *c.Status)
		assert.JSONEq(t, answers[c.Command], string(c.Answer), "the answer the service gave")
	}
	assert.Equal(t, "confirmed", got.Commands[0].State)
	assert.Equal(t, "rejected", got.Commands[1].State)

	out, err = humantaskRun(t, "commands", task)
	require.NoError(t, err, out)
	assert.NotRegexp(t, "[\x00-\x08\x0b-\x1f\x7f\u0080-\u009f\u202a-\u202e\u2066-\u2069]", out, "a control or bidi character printed")
	assert.Contains(t, out, "forged", "the printable text stays")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2+len(sent), out)
	assert.Regexp(t, `^COMMAND\s+USER\s+STATE\s+ANSWER\s+RECEIVED\s+UPDATED`, lines[1])
	assert.Regexp(t, `^cmd-a\s+alice\s+confirmed\s+200 completed\s`, lines[2])
	assert.Regexp(t, `^cmd-b\s+bob\s+rejected\s+409 the task was completed by another command \(by alice\)\s`, lines[3])
	assert.Regexp(t, `^cmd-spaced\s+"mallory  confirmed  200 completed"\s+rejected\s+404 `, lines[6], "a name with spaces is quoted")
	assert.NotContains(t, out, "cmd-other")

	out, err = humantaskRun(t, "commands", "no-such-task")
	require.NoError(t, err)
	assert.Contains(t, out, "no commands for task no-such-task")
}

func TestHumantaskCommandsArguments(t *testing.T) {
	effectsEnv(t)
	for _, args := range [][]string{{}, {"commands"}, {"commands", "a", "b"}, {"commands", "a", "--limit", "0"}, {"nope"}} {
		_, err := humantaskRun(t, args...)
		assert.Error(t, err, "%q", args)
	}
	out, err := humantaskRun(t, "help")
	require.NoError(t, err)
	assert.Contains(t, out, "commands TASK_ID")
}

// effects show of a human-task command reads its task as the user task it is: waiting
// (for whom), then completed and when, never an external task "gone" (an outside
// tester's operator was told a waiting user task was "gone (completed or cancelled)").
func TestEffectsShowOfACommandNamesItsUserTask(t *testing.T) {
	h, start := completionService(t)
	task := start()
	etag := serve(h, http.MethodGet, "/tasks/"+task, "alice", "").Header().Get("ETag")
	require.NotEmpty(t, etag)
	key := func(command string) string {
		var k string
		require.NoError(t, testenv.DB(t).QueryRow(testenv.Context(t, 10*time.Second),
			`SELECT intent_key FROM extworker_intents WHERE scope = $1 AND intent_key LIKE $2`, humantask.Scope, task+"/"+command+"/%").Scan(&k))
		return k
	}
	// carol is no candidate: her command is refused, and the task still waits
	rec := serve(h, http.MethodPost, "/tasks/"+task+"/complete", "carol", `{}`, "Idempotency-Key", "c-1", "If-Match", etag)
	require.Equal(t, http.StatusForbidden, rec.Code, rec.Body.String())
	out := mustEffects(t, "show", key("c-1"))
	assert.Contains(t, out, "engine: user task "+task+" waiting, assigned to nobody")
	assert.NotContains(t, out, "gone")

	rec = serve(h, http.MethodPost, "/tasks/"+task+"/complete", "alice", `{}`, "Idempotency-Key", "a-1", "If-Match", etag)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	out = mustEffects(t, "show", key("a-1"))
	assert.Contains(t, out, "engine: user task "+task+" ended (completed) at ")
}
