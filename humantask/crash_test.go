package humantask_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/humantask"
	"github.com/extworker/extworker/internal/testenv"
)

// answerLosingEngine forwards to the real engine; a user task's completion reaches the
// engine, and its answer is then withheld until release is closed (nil: dropped at once,
// the connection closed): the engine acted, the service never hears it. It counts the
// completions the engine received.
func answerLosingEngine(t *testing.T, release <-chan struct{}) (*admin.Client, *atomic.Int32) {
	t.Helper()
	target, err := url.Parse(testenv.EngineURL())
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	var completes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/complete") {
			rp.ServeHTTP(w, r)
			return
		}
		completes.Add(1)
		rec := httptest.NewRecorder()
		rp.ServeHTTP(rec, r)
		if release != nil {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		panic(http.ErrAbortHandler) // the answer is lost
	}))
	t.Cleanup(srv.Close)
	c, err := camunda7.New(camunda7.Config{BaseURL: srv.URL + target.Path})
	require.NoError(t, err)
	return admin.New(c), &completes
}

func (e *env) intentState(t *testing.T) string {
	t.Helper()
	var s string
	require.NoError(t, e.pool.QueryRow(testenv.Context(t, 10*time.Second),
		`SELECT state FROM extworker_intents WHERE namespace = $1`, e.ns).Scan(&s))
	return s
}

// TestLostAnswerSettlesFromTheEngine: the engine completes the task and its answer is
// lost; the service does not complete it again nor guess: it reads the marker from the
// engine's history and answers the command's 200.
func TestLostAnswerSettlesFromTheEngine(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, nil)
	tag := e.etag(t, task, "alice")
	lossy, completes := answerLosingEngine(t, nil)
	e.start(t, lossy)

	r := e.complete(t, task, "alice", "lost-1", tag, `{"approved": true}`)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	assert.JSONEq(t, completedBody(t, task, "lost-1", "alice"), string(r.body))
	assert.Equal(t, int32(1), completes.Load(), "the engine was asked to complete once")
	assert.Equal(t, "reconciled", e.intentState(t), "settled from the engine's history")
	again := e.complete(t, task, "alice", "lost-1", tag, `{"approved": true}`)
	assert.Equal(t, r.body, again.body)
}

// TestRestartedServiceSettlesACommandTheEngineCompleted: a service's request is in the
// engine (which completed the task) when the service is replaced; the client sends the
// command again to the new one, which waits out the old request's lease and settles the
// command from the engine's history, without completing again.
func TestRestartedServiceSettlesACommandTheEngineCompleted(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, nil)
	tag := e.etag(t, task, "alice")
	release := make(chan struct{})
	defer close(release)
	held, completes := answerLosingEngine(t, release)
	e.start(t, held)
	first := e.srv

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, first.URL+"/tasks/"+task+"/complete", strings.NewReader(`{}`))
		req.Header.Set("X-User", "alice")
		req.Header.Set("Idempotency-Key", "restart-1")
		req.Header.Set("If-Match", tag)
		if resp, err := first.Client().Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	testenv.Eventually(t, 10*time.Second, "the first request to reach the engine", func() (bool, error) {
		return completes.Load() == 1, nil
	})
	cancel() // the client gives up on the old service, which is replaced
	e.start(t, e.engine)

	r := e.complete(t, task, "alice", "restart-1", tag, `{}`)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	assert.JSONEq(t, completedBody(t, task, "restart-1", "alice"), string(r.body))
	assert.Equal(t, int32(1), completes.Load(), "the engine was asked to complete once")
	assert.Equal(t, "reconciled", e.intentState(t))
}

// TestEngineSilentWhileSettlingDoesNotHoldTheCommand: the engine completes the task, its
// answer is lost, and then it answers nothing for 4s, while the service tries to settle
// the command from its history again and again. The command is not put on hold for an
// operator (the ledger's default of 5 inconclusive reconciliations did that within
// 1.5s): once the engine answers, the client's next send gets the command's 200.
func TestEngineSilentWhileSettlingDoesNotHoldTheCommand(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, nil)
	tag := e.etag(t, task, "alice")
	var silentUntil atomic.Int64 // unix nanos
	var completes atomic.Int32
	c := proxiedEngine(t, func(w http.ResponseWriter, r *http.Request, rp http.Handler) {
		if time.Now().UnixNano() < silentUntil.Load() {
			panic(http.ErrAbortHandler) // no answer
		}
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/complete") {
			completes.Add(1)
			rp.ServeHTTP(httptest.NewRecorder(), r)
			silentUntil.Store(time.Now().Add(4 * time.Second).UnixNano())
			panic(http.ErrAbortHandler) // the answer is lost
		}
		rp.ServeHTTP(w, r)
	})
	e.start(t, c)

	r, unsettled := untilAnswered(t, time.Minute, e.srv.URL, task, "alice", "silent-1", tag, `{}`)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	assert.JSONEq(t, completedBody(t, task, "silent-1", "alice"), string(r.body))
	assert.Equal(t, int32(1), completes.Load(), "the engine was asked to complete once")
	assert.Equal(t, "reconciled", e.intentState(t))
	t.Logf("settled after %d answers 503", unsettled)
}

// A list the engine cannot read is no empty list: when the query answers and the tasks'
// own reads then fail, GET /tasks is a 503 with Retry-After, not 200 {"tasks":[]} (an
// outside tester's finding: a user told she had nothing to do), whether the reads get no
// answer or the engine's 500. A task the engine does not show is left out and counted
// ("unavailable") while the others are listed; a hanging engine holds a list for three
// times AnswerWithin, not 30s per task; one dropped read of a definition's XML does not hide its
// tasks for a minute.
func TestListTheEngineCannotRead(t *testing.T) {
	e := newEnv(t, nil)
	group := testenv.Unique("unread")
	e.key = testenv.DeployUserTask(t, e.engine, testenv.UserTaskProcess{CandidateGroups: []string{group},
		FormFields: []testenv.FormField{{ID: "approved", Type: "boolean"}}}).Key
	first, second := e.startInstance(t, nil), e.startInstance(t, nil)
	var fault atomic.Pointer[func(w http.ResponseWriter, r *http.Request) bool] // true: answered
	c := proxiedEngine(t, func(w http.ResponseWriter, r *http.Request, rp http.Handler) {
		if f := fault.Load(); f != nil && (*f)(w, r) {
			return
		}
		rp.ServeHTTP(w, r)
	})
	e.answerWithin = time.Second // a list: within 3s
	e.start(t, c)
	set := func(f func(w http.ResponseWriter, r *http.Request) bool) {
		if f == nil {
			fault.Store(nil)
			return
		}
		fault.Store(&f)
	}
	engine500 := func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"type":"ProcessEngineException","message":"boom","code":0}`)
	}
	list := func() reply { return e.do(t, http.MethodGet, "/tasks", "zoe", group, nil) }
	var xmlReads atomic.Int32

	for _, c := range []struct {
		name  string
		fault func(w http.ResponseWriter, r *http.Request) bool
		want  int
		shows []string
	}{
		{"no fault", nil, http.StatusOK, []string{first, second}},
		{"every task's reads get no answer", func(w http.ResponseWriter, r *http.Request) bool {
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/task/") {
				panic(http.ErrAbortHandler)
			}
			return false
		}, http.StatusServiceUnavailable, nil},
		{"every task's reads get the engine's 500", func(w http.ResponseWriter, r *http.Request) bool {
			if strings.HasSuffix(r.URL.Path, "/identity-links") {
				engine500(w)
				return true
			}
			return false
		}, http.StatusServiceUnavailable, nil},
		{"one task's reads get the engine's 500", func(w http.ResponseWriter, r *http.Request) bool {
			if strings.HasSuffix(r.URL.Path, "/task/"+first+"/identity-links") {
				engine500(w)
				return true
			}
			return false
		}, http.StatusOK, []string{second}},
		{"every task's reads hang", func(w http.ResponseWriter, r *http.Request) bool {
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/task/") {
				<-r.Context().Done()
				return true
			}
			return false
		}, http.StatusServiceUnavailable, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			set(c.fault)
			began := time.Now()
			r := list()
			took := time.Since(began)
			require.Equal(t, c.want, r.status, string(r.body))
			assert.Less(t, took, 10*time.Second, "answered within three times AnswerWithin (3s) and a moment")
			if c.want != http.StatusOK {
				assert.NotEmpty(t, r.header.Get("Retry-After"))
				assert.NotContains(t, string(r.body), `"tasks"`)
				return
			}
			var got humantask.TaskList
			require.NoError(t, json.Unmarshal(r.body, &got))
			var ids []string
			for _, tk := range got.Tasks {
				ids = append(ids, tk.ID)
			}
			assert.ElementsMatch(t, c.shows, ids)
			assert.Equal(t, 2-len(c.shows), got.Unavailable, "the tasks left out are counted")
		})
	}

	t.Run("one dropped read of the definition's XML", func(t *testing.T) {
		e.start(t, c) // a fresh service: nothing cached
		set(func(w http.ResponseWriter, r *http.Request) bool {
			if strings.HasSuffix(r.URL.Path, "/xml") {
				xmlReads.Add(1)
				panic(http.ErrAbortHandler)
			}
			return false
		})
		assert.Equal(t, http.StatusServiceUnavailable, list().status, "the tasks' form fields could not be read")
		require.Positive(t, xmlReads.Load())
		set(nil)
		r := list()
		require.Equal(t, http.StatusOK, r.status, string(r.body))
		assert.Contains(t, string(r.body), first, "read again at once, not hidden for a minute")
		assert.Contains(t, string(r.body), second)
	})
}

// Tasks the engine is slow to show do not hide the others: a reader gives a task a
// quarter of AnswerWithin at first and goes on to the next, and reads the slow ones
// again with the time left. Outside testers' engines, slow for a user's newest tasks
// only, got the whole list answered 503 after 30s: first with 8 slow tasks (8 readers
// took the tasks 8 at a time), then with 25 (each reader gave each slow task
// AnswerWithin, and 25 used up the list's time).
func TestSlowTasksDoNotHideTheOthers(t *testing.T) {
	// defaults: each task first within 2.5s, the list within 30s; short: 0.25s and 3s
	for _, tier := range []struct {
		name         string
		answerWithin time.Duration
	}{{"defaults", 0}, {"short", time.Second}} {
		t.Run(tier.name, func(t *testing.T) {
			e := newEnv(t, nil)
			group := testenv.Unique("slow")
			e.key = testenv.DeployUserTask(t, e.engine, testenv.UserTaskProcess{CandidateGroups: []string{group}}).Key
			const slow, quick = 30, 3
			var ids []string
			for range slow + quick {
				ids = append(ids, e.startInstance(t, nil))
			}
			slowIDs := ids[quick:] // the newest, listed first
			c := proxiedEngine(t, func(w http.ResponseWriter, r *http.Request, rp http.Handler) {
				for _, id := range slowIDs {
					if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/task/"+id) {
						<-r.Context().Done()
						return
					}
				}
				rp.ServeHTTP(w, r)
			})
			e.answerWithin = tier.answerWithin
			e.start(t, c)
			r := e.do(t, http.MethodGet, "/tasks", "zoe", group, nil)
			require.Equal(t, http.StatusOK, r.status, string(r.body))
			var got humantask.TaskList
			require.NoError(t, json.Unmarshal(r.body, &got))
			var shown []string
			for _, tk := range got.Tasks {
				shown = append(shown, tk.ID)
			}
			assert.ElementsMatch(t, ids[:quick], shown, "the tasks the engine shows are listed")
			assert.Equal(t, slow, got.Unavailable, "the slow ones are counted")
		})
	}
}

// A client that gives up on its requests (a short timeout, a closed tab) while the
// command's outcome is unknown does not spend the command's reconciliations: a look at
// the engine cut short by the caller is no answer. An outside tester's client, resending
// with a 0.3s timeout while the engine answered in 1s, put its command on hold for an
// operator in 34s (each cancelled look counted as one of the 100).
func TestClientsGivingUpDoNotSpendReconciliations(t *testing.T) {
	e := newEnv(t, nil)
	task := e.startInstance(t, nil)
	tag := e.etag(t, task, "alice")
	var dropping, slow atomic.Bool
	dropping.Store(true)
	c := proxiedEngine(t, func(w http.ResponseWriter, r *http.Request, rp http.Handler) {
		if dropping.Load() && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/complete") {
			slow.Store(true)
			panic(http.ErrAbortHandler) // not sent on; to the service, an answer lost
		}
		if slow.Load() && r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/task/"+task) {
			select { // the engine answering in 1s
			case <-time.After(time.Second):
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(w, r)
	})
	e.start(t, c)

	impatient := func(timeout time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, _ = post(ctx, e.srv.URL, task, "alice", "", "hasty-1", tag, `{}`)
	}
	impatient(3 * time.Second) // dispatched, its answer lost: unknown
	require.True(t, slow.Load(), "the completion was sent")
	for range 25 { // 25 looks at the engine, each given up after 0.3s
		impatient(300 * time.Millisecond)
	}
	var n int
	require.NoError(t, e.pool.QueryRow(testenv.Context(t, 10*time.Second),
		`SELECT reconciliations FROM extworker_intents WHERE namespace = $1`, e.ns).Scan(&n))
	assert.Zero(t, n, "reconciliations spent by clients giving up")
	assert.NotEqual(t, "operator_hold", e.intentState(t))

	dropping.Store(false)
	slow.Store(false)
	r, _ := untilAnswered(t, time.Minute, e.srv.URL, task, "alice", "hasty-1", tag, `{}`)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	assert.Equal(t, map[string]string{"command": "hasty-1", "user": "alice"}, e.marker(t, task))
}

// proxiedEngine is a client of the engine through a proxy of the test's own: handle gets
// every request with the proxy to the engine (rp), and answers it, drops it or sends it on.
func proxiedEngine(t *testing.T, handle func(w http.ResponseWriter, r *http.Request, rp http.Handler)) *admin.Client {
	t.Helper()
	target, err := url.Parse(testenv.EngineURL())
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handle(w, r, rp) }))
	t.Cleanup(srv.Close)
	c, err := camunda7.New(camunda7.Config{BaseURL: srv.URL + target.Path})
	require.NoError(t, err)
	return admin.New(c)
}
