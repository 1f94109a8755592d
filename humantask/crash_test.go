package humantask_test

import (
	"context"
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
	target, err := url.Parse(testenv.EngineURL())
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	var silentUntil atomic.Int64 // unix nanos
	var completes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	}))
	t.Cleanup(srv.Close)
	c, err := camunda7.New(camunda7.Config{BaseURL: srv.URL + target.Path})
	require.NoError(t, err)
	e.start(t, admin.New(c))

	r, unsettled := untilAnswered(t, time.Minute, e.srv.URL, task, "alice", "silent-1", tag, `{}`)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	assert.JSONEq(t, completedBody(t, task, "silent-1", "alice"), string(r.body))
	assert.Equal(t, int32(1), completes.Load(), "the engine was asked to complete once")
	assert.Equal(t, "reconciled", e.intentState(t))
	t.Logf("settled after %d answers 503", unsettled)
}
