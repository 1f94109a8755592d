package camunda7

// Unit tests of the client against fake servers: what the real engine never sends but
// proxies and faults do (refused connections, hangs, resets, truncated and oversized
// bodies, HTML error pages), and the client's own contract (the wire form of requests,
// validation before sending, timeouts, auth and TLS). The conformance suite pins the
// engine's own behaviour; nothing here needs an engine.

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// received is one request as a fake server saw it.
type received struct {
	Method      string
	EscapedPath string
	RawQuery    string
	Header      http.Header
	Body        []byte
}

// fakeEngine is an httptest server that records every request (body read in full) and
// answers with its handler.
type fakeEngine struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []received
}

// newFakeEngine starts a server whose handler gets each request with its body already
// read; handle may be nil (204 No Content).
func newFakeEngine(t *testing.T, handle func(w http.ResponseWriter, r *http.Request, body []byte)) *fakeEngine {
	t.Helper()
	f := &fakeEngine{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		f.mu.Lock()
		f.reqs = append(f.reqs, received{Method: r.Method, EscapedPath: r.URL.EscapedPath(), RawQuery: r.URL.RawQuery,
			Header: r.Header.Clone(), Body: body})
		f.mu.Unlock()
		if handle == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		handle(w, r, body)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeEngine) url() string { return f.srv.URL + "/engine-rest" }

func (f *fakeEngine) requests() []received {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]received(nil), f.reqs...)
}

// only returns the only request the server saw.
func (f *fakeEngine) only(t *testing.T) received {
	t.Helper()
	reqs := f.requests()
	require.Len(t, reqs, 1)
	return reqs[0]
}

// client returns a client for f with cfg's other fields.
func (f *fakeEngine) client(t *testing.T, cfg Config) *Client {
	t.Helper()
	cfg.BaseURL = f.url()
	return newTestClient(t, cfg)
}

func newTestClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	c, err := New(cfg)
	require.NoError(t, err)
	return c
}

// answer is a canned HTTP answer.
func answer(status int, ctype, body string) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		if ctype != "" {
			w.Header().Set("Content-Type", ctype)
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

func jsonAnswer(status int, body string) func(http.ResponseWriter, *http.Request, []byte) {
	return answer(status, "application/json", body)
}

// rawServer is a TCP listener speaking just enough HTTP/1.1 to read one request in full
// per connection; respond then writes whatever it likes and the connection is closed.
// Every request read is sent on the returned channel (buffered).
func rawServer(t *testing.T, respond func(c net.Conn)) (baseURL string, got <-chan *http.Request) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ch := make(chan *http.Request, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			req, err := http.ReadRequest(bufio.NewReader(conn))
			if err == nil {
				_, err = io.ReadAll(req.Body)
			}
			if err == nil {
				ch <- req
				respond(conn)
			}
			_ = conn.Close()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
	})
	return "http://" + ln.Addr().String() + "/engine-rest", ch
}

// closedPortURL returns a URL on which nothing listens (a port just released).
func closedPortURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return "http://" + addr + "/engine-rest"
}

func completeCall(ctx context.Context, c *Client) error {
	return c.Complete(ctx, "1", CompleteRequest{WorkerID: "a"})
}

func fetchRequest() FetchAndLockRequest {
	return FetchAndLockRequest{WorkerID: "w", MaxTasks: 1, Topics: []FetchTopic{{TopicName: "t", LockDuration: time.Minute}}}
}

// requireNotSent asserts err proves the request never left.
func requireNotSent(t *testing.T, err error) *TransportError {
	t.Helper()
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrNotSent)
	assert.NotErrorIs(t, err, ErrUnknownOutcome)
	assert.True(t, SafeToRetry(err), "SafeToRetry(%v)", err)
	var te *TransportError
	require.ErrorAs(t, err, &te)
	assert.False(t, te.Sent)
	return te
}

// requireOutcomeUnknown asserts err is a request that left without a usable answer.
func requireOutcomeUnknown(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrUnknownOutcome)
	assert.NotErrorIs(t, err, ErrNotSent)
	assert.False(t, SafeToRetry(err), "SafeToRetry(%v)", err)
}

// ---- 1. Transport: not sent vs. unknown outcome ----

func TestTransportConnectionRefusedIsNotSent(t *testing.T) {
	c := newTestClient(t, Config{BaseURL: closedPortURL(t)})
	err := completeCall(t.Context(), c)
	te := requireNotSent(t, err)
	assert.Equal(t, "complete external task 1", te.Op)
	assert.Contains(t, err.Error(), "complete external task 1: not sent")
	var opErr *net.OpError
	assert.ErrorAs(t, err, &opErr, "the dial error stays reachable")
}

func TestTransportContextCancelledBeforeCallIsNotSent(t *testing.T) {
	f := newFakeEngine(t, nil)
	c := f.client(t, Config{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for name, call := range map[string]func() error{
		"complete": func() error { return completeCall(ctx, c) },
		"fetch": func() error {
			_, err := c.FetchAndLock(ctx, fetchRequest())
			return err
		},
		"version": func() error {
			_, err := c.Version(ctx)
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			err := call()
			requireNotSent(t, err)
			assert.ErrorIs(t, err, context.Canceled)
		})
	}
	assert.Empty(t, f.requests(), "the server must see no request")
}

func TestTransportServerHangsPastTimeoutIsOutcomeUnknown(t *testing.T) {
	got := make(chan []byte, 1)
	f := newFakeEngine(t, func(_ http.ResponseWriter, r *http.Request, body []byte) {
		got <- body
		<-r.Context().Done() // never answer; the client gives up and closes the connection
	})
	c := f.client(t, Config{Timeout: 200 * time.Millisecond})
	start := time.Now()
	err := completeCall(t.Context(), c)
	took := time.Since(start)

	requireOutcomeUnknown(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	var te *TransportError
	require.ErrorAs(t, err, &te)
	assert.True(t, te.Sent)
	assert.Contains(t, err.Error(), "complete external task 1: sent, no answer")
	assert.GreaterOrEqual(t, took, 200*time.Millisecond)
	assert.Less(t, took, 3*time.Second)
	select {
	case body := <-got:
		assert.JSONEq(t, `{"workerId":"a"}`, string(body), "the server received the whole request")
	default:
		t.Fatal("the server did not receive the request")
	}
}

func TestTransportServerClosesWithoutAnswerIsOutcomeUnknown(t *testing.T) {
	base, got := rawServer(t, func(net.Conn) {}) // read the request, then close
	c := newTestClient(t, Config{BaseURL: base})
	err := completeCall(t.Context(), c)
	requireOutcomeUnknown(t, err)
	var te *TransportError
	require.ErrorAs(t, err, &te)
	assert.True(t, te.Sent)
	select {
	case req := <-got:
		assert.Equal(t, "/engine-rest/external-task/1/complete", req.URL.EscapedPath())
	default:
		t.Fatal("the server did not receive the request")
	}
}

func TestTransportTruncatedBodyIsMalformedAndOutcomeUnknown(t *testing.T) {
	base, got := rawServer(t, func(conn net.Conn) {
		_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"+
			`[{"id":"1","topicName":"t","workerId":"w"`)
	})
	c := newTestClient(t, Config{BaseURL: base})
	tasks, err := c.FetchAndLock(t.Context(), fetchRequest())
	assert.Empty(t, tasks)
	requireOutcomeUnknown(t, err)
	assert.ErrorIs(t, err, ErrMalformedResponse)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	var re *ResponseError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, http.StatusOK, re.StatusCode)
	assert.Equal(t, "fetch and lock external tasks", re.Op)
	require.Len(t, got, 1)
}

func TestTransportResetBeforeStatusLineIsOutcomeUnknown(t *testing.T) {
	// Garbage instead of an HTTP answer, as a misconfigured proxy or a TLS port would send.
	base, _ := rawServer(t, func(conn net.Conn) { _, _ = io.WriteString(conn, "SSH-2.0-OpenSSH_9.6\r\n") })
	c := newTestClient(t, Config{BaseURL: base})
	err := completeCall(t.Context(), c)
	requireOutcomeUnknown(t, err)
}

func TestTransportTimeoutWhileReadingBodyIsOutcomeUnknown(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	f := newFakeEngine(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"id":"1"`)
		w.(http.Flusher).Flush()
		select { // the rest never comes
		case <-r.Context().Done():
		case <-release:
		}
	})
	c := f.client(t, Config{Timeout: 200 * time.Millisecond})
	_, err := c.ExternalTask(t.Context(), "1")
	requireOutcomeUnknown(t, err)
	assert.ErrorIs(t, err, ErrMalformedResponse)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

// ---- 2. Answer bodies ----

func TestAnswerBodies(t *testing.T) {
	const lockMsg = "External Task 1 cannot be completed by worker 'a'. It is locked by worker 'b'."
	proxyPage := "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n" +
		"<hr><center>nginx/1.25.3</center>\r\n" + strings.Repeat("<!-- a padding to disable MSIE and Chrome friendly error page -->\r\n", 6) + "</body>\r\n</html>\r\n"

	complete := completeCall
	fetch := func(ctx context.Context, c *Client) error {
		_, err := c.FetchAndLock(ctx, fetchRequest())
		return err
	}
	version := func(ctx context.Context, c *Client) error {
		_, err := c.Version(ctx)
		return err
	}
	getTask := func(ctx context.Context, c *Client) error {
		_, err := c.ExternalTask(ctx, "1")
		return err
	}
	startProcess := func(ctx context.Context, c *Client) error { // through Do, as package admin calls it
		return c.Do(ctx, Request{Op: "start process order", Method: http.MethodPost, Path: "/process-definition/key/order/start", Body: struct{}{}})
	}
	errorDetails := func(ctx context.Context, c *Client) error {
		_, err := c.ExternalTaskErrorDetails(ctx, "1")
		return err
	}
	extendLock := func(ctx context.Context, c *Client) error {
		return c.ExtendLock(ctx, "1", "a", time.Minute)
	}

	// Answers the engine gave: *Error, outcome known, nothing committed.
	engineCases := []struct {
		name     string
		handle   func(http.ResponseWriter, *http.Request, []byte)
		call     func(context.Context, *Client) error
		status   int
		typ, msg string
		code     *int // nil: expect a nil Code
		is       []error
		isNot    []error
	}{
		{name: "401 empty body", handle: answer(401, "", ""), call: complete, status: 401, msg: "Unauthorized",
			is: []error{ErrUnauthorized}, isNot: []error{ErrLockLost, ErrBadRequest, ErrNotFound}},
		{name: "403 authorization exception", call: complete, status: 403, typ: "AuthorizationException", code: ptr(0),
			handle: jsonAnswer(403, `{"type":"AuthorizationException","message":"The user with id 'x' does not have 'UPDATE' permission on resource '1' of type 'ProcessInstance'.","code":0,"userId":"x","missingAuthorizations":[]}`),
			msg:    "The user with id 'x' does not have 'UPDATE' permission on resource '1' of type 'ProcessInstance'.",
			is:     []error{ErrUnauthorized}},
		{name: "400 locked by another worker", call: complete, status: 400, typ: "RestException", msg: lockMsg, code: ptr(0),
			handle: jsonAnswer(400, `{"type":"RestException","message":"`+lockMsg+`","code":0}`),
			is:     []error{ErrLockLost}, isNot: []error{ErrSuspended, ErrTaskGone, ErrNotFound}},
		{name: "400 extend an expired lock", call: extendLock, status: 400, typ: "RestException", code: ptr(0),
			msg:    "Cannot extend a lock that expired: lockExpirationTime is not greater than or equal to 1700000000000",
			handle: jsonAnswer(400, `{"type":"RestException","message":"Cannot extend a lock that expired: lockExpirationTime is not greater than or equal to 1700000000000","code":0}`),
			is:     []error{ErrLockExpired, ErrLockLost, ErrBadRequest}},
		{name: "400 suspended", call: complete, status: 400, typ: "RestException", code: ptr(0),
			msg:    "ENGINE-03043 ExternalTask with id '1' is suspended.",
			handle: jsonAnswer(400, `{"type":"RestException","message":"ENGINE-03043 ExternalTask with id '1' is suspended.","code":0}`),
			is:     []error{ErrSuspended, ErrBadRequest}, isNot: []error{ErrLockLost}},
		{name: "400 jackson mapping error with empty message", call: complete, status: 400, typ: "InvalidRequestException",
			handle: jsonAnswer(400, `{"type":"InvalidRequestException","message":"","code":null}`),
			is:     []error{ErrBadRequest}, isNot: []error{ErrLockLost, ErrSuspended}},
		{name: "404 on a task endpoint", call: complete, status: 404, typ: "RestException", code: ptr(0),
			msg:    "External task with id 1 does not exist",
			handle: jsonAnswer(404, `{"type":"RestException","message":"External task with id 1 does not exist","code":0}`),
			is:     []error{ErrTaskGone, ErrNotFound}, isNot: []error{ErrBadRequest}},
		{name: "404 on get task with code null", call: getTask, status: 404, typ: "RestException",
			msg:    "External task with id 1 does not exist",
			handle: jsonAnswer(404, `{"type":"RestException","message":"External task with id 1 does not exist","code":null}`),
			is:     []error{ErrTaskGone, ErrNotFound}},
		{name: "404 on start process", call: startProcess, status: 404, typ: "RestException",
			msg:    "No matching process definition with key: order and no tenant-id",
			handle: jsonAnswer(404, `{"type":"RestException","message":"No matching process definition with key: order and no tenant-id","code":null}`),
			is:     []error{ErrNotFound}, isNot: []error{ErrTaskGone}},
		{name: "500 optimistic locking", call: complete, status: 500, typ: "OptimisticLockingException", code: ptr(1),
			msg:    "ENGINE-03005 Execution of 'UPDATE ExternalTaskEntity[1]' failed. Entity was updated by another transaction concurrently.",
			handle: jsonAnswer(500, `{"type":"OptimisticLockingException","message":"ENGINE-03005 Execution of 'UPDATE ExternalTaskEntity[1]' failed. Entity was updated by another transaction concurrently.","code":1}`),
			is:     []error{ErrOptimisticLock}, isNot: []error{ErrMalformedResponse}},
		{name: "500 errorDetails of an unknown task", call: errorDetails, status: 500, typ: "NullValueException", code: ptr(0),
			msg:    "No external task found with id 1: externalTask is null",
			handle: jsonAnswer(500, `{"type":"NullValueException","message":"No external task found with id 1: externalTask is null","code":0}`),
			is:     []error{ErrTaskGone}},
		{name: "500 engine error body with charset", call: complete, status: 500, typ: "ProcessEngineException", code: ptr(10000),
			msg:    "deadlock",
			handle: answer(500, "application/json;charset=UTF-8", `{"type":"ProcessEngineException","message":"deadlock","code":10000}`),
			isNot:  []error{ErrOptimisticLock, ErrBadRequest}},
		{name: "413 from a proxy", call: complete, status: 413, msg: "Request Entity Too Large",
			handle: answer(413, "text/html", "<html><body>413 Request Entity Too Large</body></html>"),
			is:     []error{ErrThrottled}, isNot: []error{ErrBadRequest, ErrUnauthorized}},
	}
	for _, tc := range engineCases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeEngine(t, tc.handle)
			c := f.client(t, Config{})
			err := tc.call(t.Context(), c)
			require.Error(t, err)
			var ee *Error
			require.ErrorAs(t, err, &ee)
			assert.Equal(t, tc.status, ee.StatusCode)
			assert.Equal(t, tc.typ, ee.Type)
			assert.Equal(t, tc.msg, ee.Message)
			if tc.code == nil {
				assert.Nil(t, ee.Code)
			} else if assert.NotNil(t, ee.Code) {
				assert.Equal(t, *tc.code, *ee.Code)
			}
			for _, want := range tc.is {
				assert.ErrorIs(t, err, want)
			}
			for _, not := range append(tc.isNot, ErrUnknownOutcome, ErrNotSent, ErrMalformedResponse, ErrInvalidArgument) {
				assert.NotErrorIs(t, err, not)
			}
			assert.True(t, SafeToRetry(err), "the engine answered: nothing took effect")
			assert.NotEmpty(t, ee.Op)
			assert.True(t, strings.HasPrefix(err.Error(), ee.Op+": engine answered "), err.Error())
			assert.Len(t, f.requests(), 1)
		})
	}

	// Answers that cannot be read as the engine's: *ResponseError, ErrMalformedResponse.
	unreadableCases := []struct {
		name           string
		cfg            Config
		handle         func(http.ResponseWriter, *http.Request, []byte)
		call           func(context.Context, *Client) error
		status         int
		outcomeUnknown bool
		errContains    string
		snippetPrefix  string
	}{
		{name: "502 HTML proxy page", handle: answer(502, "text/html", proxyPage), call: complete, status: 502,
			outcomeUnknown: true, errContains: "not an engine error body", snippetPrefix: "<html>  <head><title>502 Bad Gateway</title></head>"},
		{name: "504 empty body", handle: answer(504, "", ""), call: fetch, status: 504, outcomeUnknown: true,
			errContains: "not an engine error body"},
		{name: "503 JSON that is not an engine body", handle: jsonAnswer(503, `{"error":"upstream connect error"}`), call: complete,
			status: 503, outcomeUnknown: true, snippetPrefix: `{"error":"upstream connect error"}`},
		{name: "200 malformed JSON", handle: jsonAnswer(200, `[{"id":"1","topicName":}]`), call: fetch, status: 200,
			outcomeUnknown: true, errContains: "decode JSON", snippetPrefix: `[{"id":"1"`},
		{name: "200 JSON of the wrong shape", handle: jsonAnswer(200, `{"id":"1"}`), call: fetch, status: 200,
			outcomeUnknown: true, errContains: "decode JSON"},
		{name: "200 text/html (a login page)", handle: answer(200, "text/html; charset=utf-8", "<!DOCTYPE html><html><title>Sign in</title></html>"),
			call: version, status: 200, outcomeUnknown: true, errContains: "content type is not JSON", snippetPrefix: "<!DOCTYPE html>"},
		{name: "200 without content type", handle: answer(200, "", `{"version":"7.24.0"}`), call: version, status: 200,
			outcomeUnknown: true, errContains: "content type is not JSON"},
		{name: "200 empty body where JSON is due", handle: jsonAnswer(200, ""), call: fetch, status: 200, outcomeUnknown: true,
			errContains: "empty body"},
		{name: "204 where JSON is due", handle: answer(204, "", ""), call: getTask, status: 204, outcomeUnknown: true,
			errContains: "empty body"},
		{name: "body larger than MaxResponseBytes", cfg: Config{MaxResponseBytes: 64},
			handle: jsonAnswer(200, "["+strings.Repeat(`{"id":"1"},`, 50)+`{"id":"1"}]`), call: fetch, status: 200,
			outcomeUnknown: true, errContains: "64-byte limit (Config.MaxResponseBytes)"},
		{name: "error body larger than MaxResponseBytes", cfg: Config{MaxResponseBytes: 16},
			handle: jsonAnswer(500, `{"type":"ProcessEngineException","message":"a long message","code":0}`), call: complete,
			status: 500, outcomeUnknown: true, errContains: "16-byte limit"},
	}
	for _, tc := range unreadableCases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeEngine(t, tc.handle)
			c := f.client(t, tc.cfg)
			err := tc.call(t.Context(), c)
			require.Error(t, err)
			var re *ResponseError
			require.ErrorAs(t, err, &re)
			assert.Equal(t, tc.status, re.StatusCode)
			assert.ErrorIs(t, err, ErrMalformedResponse)
			assert.NotErrorIs(t, err, ErrNotSent)
			var ee *Error
			assert.False(t, errors.As(err, &ee), "not an engine answer")
			if tc.outcomeUnknown {
				requireOutcomeUnknown(t, err)
			}
			assert.Contains(t, err.Error(), tc.errContains)
			assert.True(t, strings.HasPrefix(err.Error(), re.Op+": unreadable answer"), err.Error())
			assert.True(t, strings.HasPrefix(re.Snippet, tc.snippetPrefix), "snippet %q", re.Snippet)
			assert.LessOrEqual(t, len([]rune(re.Snippet)), 120)
			assert.NotContains(t, re.Snippet, "\n")
			assert.NotContains(t, re.Snippet, "\r")
		})
	}
}

func TestAnswerSuccessBodies(t *testing.T) {
	t.Run("json with charset and +json", func(t *testing.T) {
		for _, ct := range []string{"application/json", "application/json;charset=UTF-8", "application/hal+json"} {
			f := newFakeEngine(t, answer(200, ct, `{"version":"7.24.0"}`))
			v, err := f.client(t, Config{}).Version(t.Context())
			require.NoError(t, err, ct)
			assert.Equal(t, "7.24.0", v)
		}
	})
	t.Run("body exactly at MaxResponseBytes", func(t *testing.T) {
		body := `{"version":"7.24.0"}`
		f := newFakeEngine(t, jsonAnswer(200, body))
		v, err := f.client(t, Config{MaxResponseBytes: int64(len(body))}).Version(t.Context())
		require.NoError(t, err)
		assert.Equal(t, "7.24.0", v)
	})
	t.Run("fetchAndLock empty list", func(t *testing.T) {
		f := newFakeEngine(t, jsonAnswer(200, `[]`))
		tasks, err := f.client(t, Config{}).FetchAndLock(t.Context(), fetchRequest())
		require.NoError(t, err)
		assert.Empty(t, tasks)
	})
	t.Run("fetchAndLock task fields", func(t *testing.T) {
		f := newFakeEngine(t, jsonAnswer(200, `[{"id":"1","topicName":"t","workerId":"w","retries":null,"priority":7,
			"lockExpirationTime":"2024-01-02T03:04:05.678+0100","createTime":null,"errorDetails":null,"unknownField":1,
			"variables":{"amount":{"type":"Long","value":9007199254740993,"valueInfo":{}}}}]`))
		tasks, err := f.client(t, Config{}).FetchAndLock(t.Context(), fetchRequest())
		require.NoError(t, err)
		require.Len(t, tasks, 1)
		task := tasks[0]
		assert.Equal(t, "1", task.ID)
		assert.Nil(t, task.Retries)
		assert.EqualValues(t, 7, task.Priority)
		assert.True(t, task.LockExpirationTime.Equal(time.Date(2024, 1, 2, 2, 4, 5, 678e6, time.UTC)))
		assert.True(t, task.CreateTime.IsZero())
		n, err := task.Variables.Long("amount")
		require.NoError(t, err)
		assert.EqualValues(t, 9007199254740993, n)
	})
	t.Run("errorDetails text and 204", func(t *testing.T) {
		f := newFakeEngine(t, answer(200, "text/plain", "java.lang.RuntimeException: boom\n\tat x"))
		s, err := f.client(t, Config{}).ExternalTaskErrorDetails(t.Context(), "1")
		require.NoError(t, err)
		assert.Equal(t, "java.lang.RuntimeException: boom\n\tat x", s)

		f = newFakeEngine(t, nil)
		s, err = f.client(t, Config{}).ExternalTaskErrorDetails(t.Context(), "1")
		require.NoError(t, err)
		assert.Empty(t, s)
	})
	t.Run("204 and 200 with a body where none is due", func(t *testing.T) {
		f := newFakeEngine(t, nil)
		require.NoError(t, completeCall(t.Context(), f.client(t, Config{})))
		f = newFakeEngine(t, answer(200, "text/html", "<html>ok</html>"))
		require.NoError(t, completeCall(t.Context(), f.client(t, Config{})))
	})
}

// ---- 4. Requests on the wire ----

func TestWireFetchAndLock(t *testing.T) {
	f := newFakeEngine(t, jsonAnswer(200, `[]`))
	c := f.client(t, Config{})
	_, err := c.FetchAndLock(t.Context(), FetchAndLockRequest{
		WorkerID: "w", MaxTasks: 5, UsePriority: true, AsyncResponseTimeout: 1500 * time.Millisecond,
		Sorting: []Sorting{{SortBy: SortByCreateTime, SortOrder: SortAsc}},
		Topics: []FetchTopic{
			{TopicName: "none", LockDuration: 90 * time.Second},
			{TopicName: "all", LockDuration: 1500 * time.Microsecond, AllVariables: true, Variables: []string{"ignored"}},
			{TopicName: "some", LockDuration: time.Hour, Variables: []string{"a", "b"}, LocalVariables: true,
				BusinessKey: "bk", ProcessDefinitionKeyIn: []string{"p1", "p2"}, TenantIDIn: []string{"x"},
				WithoutTenantID: true, ProcessVariables: map[string]any{"k": "v"}, IncludeExtensionProperties: true},
			{TopicName: "empty", LockDuration: time.Minute, Variables: []string{}},
		},
	})
	require.NoError(t, err)
	req := f.only(t)
	assert.Equal(t, http.MethodPost, req.Method)
	assert.Equal(t, "/engine-rest/external-task/fetchAndLock", req.EscapedPath)
	assert.Equal(t, "application/json", req.Header.Get("Content-Type"))
	assert.Equal(t, "application/json", req.Header.Get("Accept"))
	assert.JSONEq(t, `{"workerId":"w","maxTasks":5,"usePriority":true,"asyncResponseTimeout":1500,
		"sorting":[{"sortBy":"createTime","sortOrder":"asc"}],
		"topics":[
			{"topicName":"none","lockDuration":90000,"variables":[],"deserializeValues":false},
			{"topicName":"all","lockDuration":1,"variables":null,"deserializeValues":false},
			{"topicName":"some","lockDuration":3600000,"variables":["a","b"],"localVariables":true,"businessKey":"bk",
			 "processDefinitionKeyIn":["p1","p2"],"tenantIdIn":["x"],"withoutTenantId":true,"processVariables":{"k":"v"},
			 "deserializeValues":false,"includeExtensionProperties":true},
			{"topicName":"empty","lockDuration":60000,"variables":[],"deserializeValues":false}]}`, string(req.Body))
}

func TestWireFetchAndLockOmitsZeroAsyncResponseTimeout(t *testing.T) {
	f := newFakeEngine(t, jsonAnswer(200, `[]`))
	_, err := f.client(t, Config{}).FetchAndLock(t.Context(), fetchRequest())
	require.NoError(t, err)
	var body map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(f.only(t).Body, &body))
	assert.NotContains(t, body, "asyncResponseTimeout")
	assert.NotContains(t, body, "sorting")
	assert.JSONEq(t, `[{"topicName":"t","lockDuration":60000,"variables":[],"deserializeValues":false}]`, string(body["topics"]))
}

func TestWirePerTaskRequests(t *testing.T) {
	cases := []struct {
		name string
		call func(context.Context, *Client) error
		path string
		body string // "" means no body at all
	}{
		{"complete", completeCall, "/external-task/1/complete", `{"workerId":"a"}`},
		{"complete with variables", func(ctx context.Context, c *Client) error {
			return c.Complete(ctx, "1", CompleteRequest{WorkerID: "a", Variables: Variables{"n": LongVar(1)},
				LocalVariables: Variables{"s": StringVar("x")}})
		}, "/external-task/1/complete", `{"workerId":"a","variables":{"n":{"type":"Long","value":1,"valueInfo":{}}},
			"localVariables":{"s":{"type":"String","value":"x","valueInfo":{}}}}`},
		{"failure with zero retries", func(ctx context.Context, c *Client) error {
			return c.Failure(ctx, "1", FailureRequest{WorkerID: "a"})
		}, "/external-task/1/failure", `{"workerId":"a","retries":0,"retryTimeout":0}`},
		{"failure with retries and timeout", func(ctx context.Context, c *Client) error {
			return c.Failure(ctx, "1", FailureRequest{WorkerID: "a", ErrorMessage: "boom", ErrorDetails: "stack",
				Retries: 3, RetryTimeout: 2500*time.Millisecond + 999*time.Microsecond})
		}, "/external-task/1/failure", `{"workerId":"a","errorMessage":"boom","errorDetails":"stack","retries":3,"retryTimeout":2500}`},
		{"bpmnError", func(ctx context.Context, c *Client) error {
			return c.BPMNError(ctx, "1", BPMNErrorRequest{WorkerID: "a", ErrorCode: "E1"})
		}, "/external-task/1/bpmnError", `{"workerId":"a","errorCode":"E1"}`},
		{"extendLock", func(ctx context.Context, c *Client) error {
			return c.ExtendLock(ctx, "1", "a", 2*time.Minute)
		}, "/external-task/1/extendLock", `{"workerId":"a","newDuration":120000}`},
		{"lock", func(ctx context.Context, c *Client) error {
			return c.Lock(ctx, "1", "a", 1500*time.Millisecond)
		}, "/external-task/1/lock", `{"workerId":"a","lockDuration":1500}`},
		{"unlock", func(ctx context.Context, c *Client) error {
			return c.Unlock(ctx, "1")
		}, "/external-task/1/unlock", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeEngine(t, nil)
			require.NoError(t, tc.call(t.Context(), f.client(t, Config{})))
			req := f.only(t)
			assert.Equal(t, http.MethodPost, req.Method)
			assert.Equal(t, "/engine-rest"+tc.path, req.EscapedPath)
			if tc.body == "" {
				assert.Empty(t, req.Body)
				assert.Empty(t, req.Header.Get("Content-Type"))
				return
			}
			assert.Equal(t, "application/json", req.Header.Get("Content-Type"))
			assert.JSONEq(t, tc.body, string(req.Body))
		})
	}
}

func TestWirePathEscaping(t *testing.T) {
	const id = "a/b c?d#e%f{g}"
	const esc = "a%2Fb%20c%3Fd%23e%25f%7Bg%7D"
	require.Equal(t, esc, url.PathEscape(id))
	cases := []struct {
		name   string
		call   func(context.Context, *Client) error
		method string
		path   string
	}{
		{"complete", func(ctx context.Context, c *Client) error {
			return c.Complete(ctx, id, CompleteRequest{WorkerID: "w"})
		}, http.MethodPost, "/external-task/" + esc + "/complete"},
		{"unlock", func(ctx context.Context, c *Client) error { return c.Unlock(ctx, id) },
			http.MethodPost, "/external-task/" + esc + "/unlock"},
		{"get task", func(ctx context.Context, c *Client) error {
			_, err := c.ExternalTask(ctx, id)
			return err
		}, http.MethodGet, "/external-task/" + esc},
		{"retries", func(ctx context.Context, c *Client) error { return c.SetExternalTaskRetries(ctx, id, 1) },
			http.MethodPut, "/external-task/" + esc + "/retries"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeEngine(t, jsonAnswer(200, `{}`))
			require.NoError(t, tc.call(t.Context(), f.client(t, Config{})))
			req := f.only(t)
			assert.Equal(t, tc.method, req.Method)
			assert.Equal(t, "/engine-rest"+tc.path, req.EscapedPath)
			assert.Empty(t, req.RawQuery)
		})
	}
}

func TestWireBaseURLTrailingSlashAndQuery(t *testing.T) {
	f := newFakeEngine(t, jsonAnswer(200, `[]`))
	c := newTestClient(t, Config{BaseURL: f.url() + "/"})
	assert.Equal(t, f.url(), c.BaseURL())
	_, err := c.ExternalTasks(t.Context(), ExternalTaskQuery{TopicName: "a b&c", Locked: true, MaxResults: 3})
	require.NoError(t, err)
	req := f.only(t)
	assert.Equal(t, "/engine-rest/external-task", req.EscapedPath)
	q, err := url.ParseQuery(req.RawQuery)
	require.NoError(t, err)
	assert.Equal(t, url.Values{"topicName": {"a b&c"}, "locked": {"true"}, "maxResults": {"3"}}, q)
}

// ---- 5. Validation before sending ----

func TestValidationBeforeSending(t *testing.T) {
	withFetch := func(mod func(*FetchAndLockRequest)) func(context.Context, *Client) error {
		return func(ctx context.Context, c *Client) error {
			r := fetchRequest()
			mod(&r)
			_, err := c.FetchAndLock(ctx, r)
			return err
		}
	}
	cases := []struct {
		name string
		call func(context.Context, *Client) error
		op   string
	}{
		{"fetch empty WorkerID", withFetch(func(r *FetchAndLockRequest) { r.WorkerID = "" }), "fetch and lock external tasks"},
		{"fetch MaxTasks 0", withFetch(func(r *FetchAndLockRequest) { r.MaxTasks = 0 }), "fetch and lock external tasks"},
		{"fetch MaxTasks negative", withFetch(func(r *FetchAndLockRequest) { r.MaxTasks = -1 }), "fetch and lock external tasks"},
		{"fetch no topics", withFetch(func(r *FetchAndLockRequest) { r.Topics = nil }), "fetch and lock external tasks"},
		{"fetch empty topic name", withFetch(func(r *FetchAndLockRequest) { r.Topics[0].TopicName = "" }), "fetch and lock external tasks"},
		{"fetch zero LockDuration", withFetch(func(r *FetchAndLockRequest) { r.Topics[0].LockDuration = 0 }), "fetch and lock external tasks"},
		{"fetch sub-millisecond LockDuration", withFetch(func(r *FetchAndLockRequest) { r.Topics[0].LockDuration = 999 * time.Microsecond }), "fetch and lock external tasks"},
		{"fetch negative LockDuration", withFetch(func(r *FetchAndLockRequest) { r.Topics[0].LockDuration = -time.Second }), "fetch and lock external tasks"},
		{"fetch AsyncResponseTimeout over 30min", withFetch(func(r *FetchAndLockRequest) {
			r.AsyncResponseTimeout = MaxAsyncResponseTimeout + time.Millisecond
		}), "fetch and lock external tasks"},
		{"fetch negative AsyncResponseTimeout", withFetch(func(r *FetchAndLockRequest) { r.AsyncResponseTimeout = -time.Second }), "fetch and lock external tasks"},
		{"fetch sort by priority", withFetch(func(r *FetchAndLockRequest) {
			r.Sorting = []Sorting{{SortBy: "priority", SortOrder: SortAsc}}
		}), "fetch and lock external tasks"},
		{"fetch bad sort order", withFetch(func(r *FetchAndLockRequest) {
			r.Sorting = []Sorting{{SortBy: SortByCreateTime, SortOrder: "ASC"}}
		}), "fetch and lock external tasks"},
		{"complete empty worker id", func(ctx context.Context, c *Client) error {
			return c.Complete(ctx, "1", CompleteRequest{})
		}, "complete external task 1"},
		{"complete empty task id", func(ctx context.Context, c *Client) error {
			return c.Complete(ctx, "", CompleteRequest{WorkerID: "a"})
		}, "complete external task "},
		{"complete with an unsendable variable", func(ctx context.Context, c *Client) error {
			return c.Complete(ctx, "1", CompleteRequest{WorkerID: "a", Variables: Variables{"x": DoubleVar(math.NaN())}})
		}, "complete external task 1"},
		{"failure negative retries", func(ctx context.Context, c *Client) error {
			return c.Failure(ctx, "1", FailureRequest{WorkerID: "a", Retries: -1})
		}, "report failure of external task 1"},
		{"failure negative retry timeout", func(ctx context.Context, c *Client) error {
			return c.Failure(ctx, "1", FailureRequest{WorkerID: "a", RetryTimeout: -time.Second})
		}, "report failure of external task 1"},
		{"failure empty worker id", func(ctx context.Context, c *Client) error {
			return c.Failure(ctx, "1", FailureRequest{Retries: 1})
		}, "report failure of external task 1"},
		{"bpmnError empty code", func(ctx context.Context, c *Client) error {
			return c.BPMNError(ctx, "1", BPMNErrorRequest{WorkerID: "a"})
		}, "report BPMN error of external task 1"},
		{"extendLock zero duration", func(ctx context.Context, c *Client) error {
			return c.ExtendLock(ctx, "1", "a", 0)
		}, "extend lock of external task 1"},
		{"extendLock sub-millisecond duration", func(ctx context.Context, c *Client) error {
			return c.ExtendLock(ctx, "1", "a", time.Microsecond)
		}, "extend lock of external task 1"},
		{"extendLock empty worker id", func(ctx context.Context, c *Client) error {
			return c.ExtendLock(ctx, "1", "", time.Minute)
		}, "extend lock of external task 1"},
		{"lock zero duration", func(ctx context.Context, c *Client) error {
			return c.Lock(ctx, "1", "a", 0)
		}, "lock external task 1"},
		{"unlock empty id", func(ctx context.Context, c *Client) error { return c.Unlock(ctx, "") }, "unlock external task "},
		{"get task empty id", func(ctx context.Context, c *Client) error {
			_, err := c.ExternalTask(ctx, "")
			return err
		}, "get external task "},
	}
	f := newFakeEngine(t, nil)
	c := f.client(t, Config{})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(t.Context(), c)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidArgument)
			assert.ErrorIs(t, err, ErrNotSent)
			assert.NotErrorIs(t, err, ErrUnknownOutcome)
			assert.True(t, SafeToRetry(err))
			var te *TransportError
			assert.False(t, errors.As(err, &te), "a refused argument is not a transport failure")
			assert.True(t, strings.HasPrefix(err.Error(), tc.op+": "), "%q does not start with the op %q", err.Error(), tc.op)
		})
	}
	assert.Empty(t, f.requests(), "invalid requests must not be sent")
}

// ---- 6. Config ----

func TestConfigValidateListsEveryProblem(t *testing.T) {
	err := Config{
		BaseURL:          "ftp://engine/engine-rest",
		Timeout:          -time.Second,
		LongPollMargin:   -time.Second,
		MaxResponseBytes: -1,
		Password:         "secret",
		HTTPClient:       &http.Client{Timeout: time.Second},
	}.Validate()
	require.Error(t, err)
	msg := err.Error()
	for _, want := range []string{"camunda7 config", "scheme must be http or https", "Timeout -1s", "LongPollMargin -1s",
		"MaxResponseBytes -1", "Password is set but Username is empty", "HTTPClient.Timeout must be zero"} {
		assert.Contains(t, msg, want)
	}
	assert.NotContains(t, msg, "secret", "the password must not appear in errors")

	_, newErr := New(Config{BaseURL: "ftp://engine", Password: "secret"})
	require.Error(t, newErr)
	assert.Contains(t, newErr.Error(), "scheme must be http or https")
	assert.Contains(t, newErr.Error(), "Password is set but Username is empty")

	for _, bad := range []string{"http://", "engine-rest", "://x", "127.0.0.1:8080/engine-rest"} {
		assert.Error(t, Config{BaseURL: bad}.Validate(), bad)
	}
	assert.NoError(t, Config{}.WithDefaults().Validate())
	assert.NoError(t, Config{BaseURL: "https://engine.example/engine-rest", Username: "u"}.Validate())
}

func TestConfigWithDefaults(t *testing.T) {
	d := Config{}.WithDefaults()
	assert.Equal(t, DefaultBaseURL, d.BaseURL)
	assert.Equal(t, DefaultTimeout, d.Timeout)
	assert.Equal(t, DefaultLongPollMargin, d.LongPollMargin)
	assert.EqualValues(t, DefaultMaxResponseBytes, d.MaxResponseBytes)
	assert.NotNil(t, d.Logger)

	set := Config{BaseURL: "http://x/engine-rest", Timeout: time.Second, LongPollMargin: 2 * time.Second, MaxResponseBytes: 5}.WithDefaults()
	assert.Equal(t, "http://x/engine-rest", set.BaseURL)
	assert.Equal(t, time.Second, set.Timeout)
	assert.Equal(t, 2*time.Second, set.LongPollMargin)
	assert.EqualValues(t, 5, set.MaxResponseBytes)
}

func TestConfigLongPollTimeout(t *testing.T) {
	configs := []Config{
		{},
		{Timeout: time.Millisecond},
		{Timeout: time.Hour},
		{Timeout: time.Second, LongPollMargin: time.Millisecond},
		{Timeout: 30 * time.Second, LongPollMargin: time.Minute},
	}
	polls := []time.Duration{0, time.Millisecond, time.Second, 20 * time.Second, 59 * time.Minute, MaxAsyncResponseTimeout}
	for _, cfg := range configs {
		c := newTestClient(t, cfg)
		for _, d := range polls {
			lp := c.LongPollTimeout(d)
			assert.Greater(t, lp, d, "cfg %+v poll %v", cfg, d)
			assert.GreaterOrEqual(t, lp, c.cfg.Timeout, "cfg %+v poll %v", cfg, d)
		}
	}
}

// deadlineRecorder records how much time each request's context had left when the
// request reached the transport.
type deadlineRecorder struct {
	rt   http.RoundTripper
	mu   sync.Mutex
	left []time.Duration
}

func (d *deadlineRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	dl, ok := r.Context().Deadline()
	left := time.Duration(-1)
	if ok {
		left = time.Until(dl)
	}
	d.mu.Lock()
	d.left = append(d.left, left)
	d.mu.Unlock()
	return d.rt.RoundTrip(r)
}

func TestConfigFetchAndLockDeadlineCoversLongPoll(t *testing.T) {
	f := newFakeEngine(t, jsonAnswer(200, `[]`))
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	rec := &deadlineRecorder{rt: tr}
	c := f.client(t, Config{Timeout: time.Second, LongPollMargin: 5 * time.Second, HTTPClient: &http.Client{Transport: rec}})

	r := fetchRequest()
	r.AsyncResponseTimeout = 20 * time.Second
	_, err := c.FetchAndLock(t.Context(), r)
	require.NoError(t, err)
	require.NoError(t, completeCall(t.Context(), c))

	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Len(t, rec.left, 2)
	assert.Greater(t, rec.left[0], 20*time.Second, "the long poll's deadline must outlast asyncResponseTimeout")
	assert.LessOrEqual(t, rec.left[0], 25*time.Second)
	assert.Greater(t, rec.left[1], 0*time.Second)
	assert.LessOrEqual(t, rec.left[1], time.Second, "ordinary requests use Timeout")
}

func TestConfigLongPollAnswerAfterTimeoutSucceeds(t *testing.T) {
	const poll = 300 * time.Millisecond
	f := newFakeEngine(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		var req struct {
			AsyncResponseTimeout int64 `json:"asyncResponseTimeout"`
		}
		if json.Unmarshal(body, &req) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		// Like the engine: hold the poll for asyncResponseTimeout (plus a little), then
		// answer an empty list.
		timer := time.NewTimer(time.Duration(req.AsyncResponseTimeout)*time.Millisecond + 100*time.Millisecond)
		defer timer.Stop()
		select {
		case <-timer.C:
			jsonAnswer(200, `[]`)(w, r, body)
		case <-r.Context().Done():
		}
	})
	// Timeout (100ms) is far shorter than the poll: only the long-poll timeout keeps it alive.
	c := f.client(t, Config{Timeout: 100 * time.Millisecond, LongPollMargin: time.Second})
	r := fetchRequest()
	r.AsyncResponseTimeout = poll
	start := time.Now()
	tasks, err := c.FetchAndLock(t.Context(), r)
	require.NoError(t, err)
	assert.Empty(t, tasks)
	assert.GreaterOrEqual(t, time.Since(start), poll)
}

// ---- 7. Auth and TLS ----

func TestAuthBasic(t *testing.T) {
	f := newFakeEngine(t, nil)
	require.NoError(t, completeCall(t.Context(), f.client(t, Config{Username: "demo", Password: "p:ss wörd"})))
	req := http.Request{Header: f.only(t).Header}
	u, p, ok := req.BasicAuth()
	require.True(t, ok)
	assert.Equal(t, "demo", u)
	assert.Equal(t, "p:ss wörd", p)
}

func TestAuthStaticBearerTokenAndHeaders(t *testing.T) {
	f := newFakeEngine(t, nil)
	c := f.client(t, Config{BearerToken: "static", Headers: map[string]string{"X-Tenant": "t1", "X-Route": "blue"}})
	require.NoError(t, completeCall(t.Context(), c))
	require.NoError(t, c.Unlock(t.Context(), "1"))
	for _, req := range f.requests() {
		assert.Equal(t, "Bearer static", req.Header.Get("Authorization"))
		assert.Equal(t, "t1", req.Header.Get("X-Tenant"))
		assert.Equal(t, "blue", req.Header.Get("X-Route"))
	}
}

func TestAuthTokenSourcePerRequest(t *testing.T) {
	f := newFakeEngine(t, nil)
	var calls atomic.Int32
	ts := TokenSourceFunc(func(ctx context.Context) (string, error) {
		if _, ok := ctx.Deadline(); !ok {
			return "", errors.New("token source got a context without deadline")
		}
		return fmt.Sprintf("tok-%d", calls.Add(1)), nil
	})
	// The TokenSource wins over a static token.
	c := f.client(t, Config{TokenSource: ts, BearerToken: "static"})
	for range 3 {
		require.NoError(t, completeCall(t.Context(), c))
	}
	assert.EqualValues(t, 3, calls.Load())
	reqs := f.requests()
	require.Len(t, reqs, 3)
	for i, req := range reqs {
		assert.Equal(t, fmt.Sprintf("Bearer tok-%d", i+1), req.Header.Get("Authorization"))
	}
}

func TestAuthTokenSourceErrorIsNotSent(t *testing.T) {
	f := newFakeEngine(t, nil)
	idpDown := errors.New("identity provider unreachable")
	c := f.client(t, Config{TokenSource: TokenSourceFunc(func(context.Context) (string, error) { return "", idpDown })})
	err := completeCall(t.Context(), c)
	requireNotSent(t, err)
	assert.ErrorIs(t, err, idpDown)
	assert.Contains(t, err.Error(), "complete external task 1")
	assert.Empty(t, f.requests())
}

func TestTLS(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		jsonAnswer(200, `{"version":"7.24.0"}`)(w, nil, nil)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the failed handshake below is expected
	srv.StartTLS()
	t.Cleanup(srv.Close)

	t.Run("trusted CA", func(t *testing.T) {
		pool := x509.NewCertPool()
		pool.AddCert(srv.Certificate())
		c := newTestClient(t, Config{BaseURL: srv.URL + "/engine-rest", TLS: &tls.Config{RootCAs: pool}})
		v, err := c.Version(t.Context())
		require.NoError(t, err)
		assert.Equal(t, "7.24.0", v)
	})
	t.Run("unknown CA", func(t *testing.T) {
		before := hits.Load()
		c := newTestClient(t, Config{BaseURL: srv.URL + "/engine-rest"})
		_, err := c.Version(t.Context())
		requireNotSent(t, err)
		var certErr *tls.CertificateVerificationError
		assert.ErrorAs(t, err, &certErr)
		assert.Equal(t, before, hits.Load())
	})
}

func ptr[T any](v T) *T { return &v }
