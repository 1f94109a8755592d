package console_test

import (
	"context"
	"errors"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/console"
	"github.com/extworker/extworker/internal/operate"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
	"github.com/extworker/extworker/outbox"
)

var migrateOnce sync.Once

// env is a ledger namespace of the test's own: the worker's ledger (the database owner)
// to create intents with, and the console's (its login, a member of extworker_console).
type env struct {
	worker            *idempotency.Ledger
	console           *idempotency.Operations
	pool, consolePool *pgxpool.Pool // the owner's, the console's
}

func newEnv(t testing.TB) env {
	t.Helper()
	pool := testenv.DB(t) // skips (or fails in CI) without a database
	migrateOnce.Do(func() {
		db := stdlib.OpenDBFromPool(pool)
		defer db.Close()
		_, err := migrations.Up(context.Background(), db)
		require.NoError(t, err)
	})
	testenv.RegisterOperators(t, pool) // the people the console names: alice, bob, carol
	ns := testenv.Unique("ns")
	t.Cleanup(func() {
		// The test's intents and resolutions go with it (events are append-only, and stay).
		for _, table := range []string{"extworker_intents", "extworker_resolutions", "extworker_intent_tombstones"} {
			if _, err := pool.Exec(context.Background(), `DELETE FROM `+table+` WHERE namespace = $1`, ns); err != nil {
				t.Logf("cleanup: delete namespace %s from %s: %v", ns, table, err)
			}
		}
	})
	w, err := idempotency.New(pool, idempotency.Config{Namespace: ns})
	require.NoError(t, err)
	cp := testenv.DBAs(t, testenv.ConsoleLogin)
	c, err := idempotency.NewOperations(cp, idempotency.Config{Namespace: ns})
	require.NoError(t, err)
	return env{worker: w, console: c, pool: pool, consolePool: cp}
}

// hold drives an intent into operator hold: its dispatch is ambiguous, and it has no
// way to reconcile.
func hold(t testing.TB, l *idempotency.Ledger, scope, key, taskID string) {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	in := idempotency.Intent{Scope: scope, Key: key, Request: map[string]string{"id": key}, Task: idempotency.TaskRef{Actor: "w", TaskID: taskID}}
	eff := idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		return idempotency.Result{}, errors.New("read timeout after the request was sent")
	}}
	_, err := l.Do(ctx, in, eff)
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	_, err = l.Do(ctx, in, eff)
	require.Equal(t, failure.KindUnknownOutcome, failure.Classify(err).Kind)
	r, err := l.Operations().Get(ctx, scope, key)
	require.NoError(t, err)
	require.Equal(t, idempotency.StateOperatorHold, r.State)
}

// passwords are alice's and bob's, for the login form.
var passwords = map[string]string{"alice": "alice-password", "bob": "bob-password"}

func operatorHashes(t testing.TB) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for name, pw := range passwords {
		// The least cost: the tests log in often, under the race detector.
		h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
		require.NoError(t, err)
		out[name] = h
	}
	return out
}

// noEngine is an engine these tests never reach.
var noEngine = operate.Engine{URL: "http://engine.invalid/engine-rest", Dial: func() (*camunda7.Client, error) {
	return nil, errors.New("no engine in this test")
}}

// newConsole serves a console with the login form for alice and bob.
func newConsole(t *testing.T, e env, engine operate.Engine) *httptest.Server {
	t.Helper()
	h, err := console.New(console.Options{Ledger: e.console, DB: e.consolePool, Engine: engine, CockpitURL: "http://engine.invalid/camunda",
		Operators: operatorHashes(t)})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// browser is an HTTP client with cookies that does not follow redirects, so that tests
// see them.
func browser(t testing.TB) *http.Client {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &http.Client{Jar: jar, Timeout: 20 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func get(t testing.TB, c *http.Client, u string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

func post(t testing.TB, c *http.Client, u string, form url.Values) (*http.Response, string) {
	t.Helper()
	resp, err := c.PostForm(u, form)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrfOf is the CSRF token in a page's forms.
func csrfOf(t testing.TB, page string) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(page)
	require.NotNil(t, m, "no CSRF token in the page:\n%s", page)
	return html.UnescapeString(m[1])
}

// login logs c in as name with password, and returns the overview page.
func login(t testing.TB, c *http.Client, base, name, password string) *http.Response {
	t.Helper()
	_, page := get(t, c, base+"/login")
	resp, _ := post(t, c, base+"/login", url.Values{"csrf": {csrfOf(t, page)}, "name": {name}, "password": {password}})
	return resp
}

func loggedIn(t testing.TB, base, name string) *http.Client {
	t.Helper()
	c := browser(t)
	resp := login(t, c, base, name, passwords[name])
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	return c
}

func intentURL(base, scope, key string) string {
	return base + "/intent?" + url.Values{"scope": {scope}, "key": {key}}.Encode()
}

// Without a login every page goes to the login form (and back after it) and every
// action is refused; a wrong password logs nobody in; the right one sets a session
// cookie that scripts cannot read and other sites cannot send.
func TestLogin(t *testing.T) {
	t.Parallel()
	srv := newConsole(t, newEnv(t), noEngine)
	c := browser(t)
	for _, path := range []string{"/", "/resolutions", "/inbox", "/outbox", "/intent?scope=a&key=b"} {
		resp, _ := get(t, c, srv.URL+path)
		assert.Equal(t, http.StatusSeeOther, resp.StatusCode, path)
		want := "/login"
		if path != "/" {
			want += "?" + url.Values{"next": {path}}.Encode()
		}
		assert.Equal(t, want, resp.Header.Get("Location"), path)
	}
	resp, _ := post(t, c, srv.URL+"/resolutions/1/approve", url.Values{"reason": {"x"}})
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	for _, bad := range [][2]string{{"alice", "bob-password"}, {"mallory", "alice-password"}, {"alice", ""}} {
		resp = login(t, c, srv.URL, bad[0], bad[1])
		assert.Equal(t, http.StatusSeeOther, resp.StatusCode, bad[0])
		assert.Equal(t, "/login", resp.Header.Get("Location"), bad[0])
		for _, ck := range resp.Cookies() {
			assert.NotEqual(t, "extworker_console", ck.Name, "no session for a failed login")
		}
		_, page := get(t, c, srv.URL+"/login")
		assert.Contains(t, page, "Unknown name or wrong password.", bad[0])
	}
	resp = login(t, c, srv.URL, "Alice", "alice-password")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, "/", resp.Header.Get("Location"))
	var session *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == "extworker_console" {
			session = ck
		}
	}
	require.NotNil(t, session)
	assert.True(t, session.HttpOnly)
	assert.Equal(t, http.SameSiteStrictMode, session.SameSite)
	assert.False(t, session.Expires.IsZero(), "the session expires")
	_, page := get(t, c, srv.URL+"/")
	assert.Contains(t, page, `<span id="operator">alice</span>`)

	// A tampered cookie is nobody.
	u, _ := url.Parse(srv.URL)
	c.Jar.SetCookies(u, []*http.Cookie{{Name: "extworker_console", Value: strings.Replace(session.Value, "|", "x|", 1), Path: "/"}})
	resp, _ = get(t, c, srv.URL+"/")
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)

	// Logging out ends the session in the browser.
	c = loggedIn(t, srv.URL, "bob")
	_, page = get(t, c, srv.URL+"/")
	resp, _ = post(t, c, srv.URL+"/logout", url.Values{"csrf": {csrfOf(t, page)}})
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
	resp, _ = get(t, c, srv.URL+"/")
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
}

// The login form carries a token bound to a cookie of its own: another site cannot log a
// browser in. Failures slow a name down: after three, the next attempt waits, even with
// the right password (TestLoginThrottle has the whole policy).
func TestLoginCSRFAndRateLimit(t *testing.T) {
	t.Parallel()
	srv := newConsole(t, newEnv(t), noEngine)
	c := browser(t)
	resp, _ := post(t, c, srv.URL+"/login", url.Values{"name": {"alice"}, "password": {"alice-password"}})
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "no login token")
	for range 3 {
		resp = login(t, c, srv.URL, "bob", "guess")
		assert.Equal(t, "/login", resp.Header.Get("Location"))
	}
	resp = login(t, c, srv.URL, "bob", "bob-password")
	assert.Equal(t, "/login", resp.Header.Get("Location"), "not in")
	_, page := get(t, c, srv.URL+"/login")
	assert.Contains(t, page, "Too many failed logins")
}

// Every response carries the security headers; pages are not cached and carry no script.
func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hold(t, e.worker, "payment.collect", "invoice:H1", "task-H1")
	srv := newConsole(t, e, noEngine)
	c := loggedIn(t, srv.URL, "alice")
	for _, path := range []string{"/login", "/", "/resolutions", "/resolutions?status=pending", "/inbox", "/outbox",
		"/intent?scope=payment.collect&key=invoice:H1", "/intent?scope=payment.collect&key=nope", "/static/console.css", "/nothing-here"} {
		resp, body := get(t, c, srv.URL+path)
		assert.Equal(t, "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
			resp.Header.Get("Content-Security-Policy"), path)
		assert.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), path)
		assert.Equal(t, "same-origin", resp.Header.Get("Referrer-Policy"), path)
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
			assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"), path)
			assert.NotContains(t, strings.ToLower(body), "<script", path)
			assert.NotContains(t, strings.ToLower(body), "style=", path)
		}
	}
	resp, body := get(t, c, srv.URL+"/")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, "invoice:H1", "the held intent is in its queue")
	resp, body = get(t, c, srv.URL+"/intent?scope=payment.collect&key=nope")
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Contains(t, body, "no such intent")
}

// A form without the session's CSRF token, with another session's, or from another
// origin is refused, and changes nothing.
func TestCSRF(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hold(t, e.worker, "payment.collect", "invoice:C1", "task-C1")
	srv := newConsole(t, e, noEngine)
	alice, bob := loggedIn(t, srv.URL, "alice"), loggedIn(t, srv.URL, "bob")
	_, bobPage := get(t, bob, srv.URL+"/")
	_, alicePage := get(t, alice, srv.URL+"/")
	form := func(csrf string) url.Values {
		return url.Values{"csrf": {csrf}, "scope": {"payment.collect"}, "key": {"invoice:C1"}, "as": {"confirmed"}, "provider_ref": {"ch_1"},
			"reason": {"forged"}}
	}
	for name, f := range map[string]url.Values{"missing": form(""), "wrong": form("nope"), "another session's": form(csrfOf(t, bobPage))} {
		resp, body := post(t, alice, srv.URL+"/intent/resolve", f)
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, name)
		assert.Contains(t, body, "CSRF token is missing or wrong", name)
	}
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/intent/resolve", strings.NewReader(form(csrfOf(t, alicePage)).Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	resp, err := alice.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "another origin")

	reqs, err := e.worker.Operations().Resolutions(testenv.Context(t, time.Minute), idempotency.ResolutionFilter{Key: "invoice:C1"})
	require.NoError(t, err)
	assert.Empty(t, reqs, "nothing was recorded")
	r, err := e.worker.Operations().Get(testenv.Context(t, time.Minute), "payment.collect", "invoice:C1")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateOperatorHold, r.State)
}

// The operator in the ledger is the logged-in one, whatever the form says; the requester
// cannot approve (the button is not there, and the server refuses anyway, with the
// ledger's message); another operator approves through the same database login.
func TestTwoPersonRule(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hold(t, e.worker, "payment.collect", "invoice:T1", "task-T1")
	srv := newConsole(t, e, noEngine)
	alice, bob := loggedIn(t, srv.URL, "alice"), loggedIn(t, srv.URL, "bob")
	page := intentURL(srv.URL, "payment.collect", "invoice:T1")
	_, body := get(t, alice, page)
	resp, _ := post(t, alice, srv.URL+"/intent/resolve", url.Values{"csrf": {csrfOf(t, body)}, "scope": {"payment.collect"},
		"key": {"invoice:T1"}, "as": {"confirmed"}, "provider_ref": {"ch_T1"}, "values": {"paymentRef=ch_T1"}, "reason": {"in the dashboard"},
		"operator": {"bob"}, "requested_by": {"bob"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	_, body = get(t, alice, srv.URL+resp.Header.Get("Location"))
	assert.Contains(t, body, "until a second operator approves it")
	ctx := testenv.Context(t, time.Minute)
	reqs, err := e.worker.Operations().Resolutions(ctx, idempotency.ResolutionFilter{Key: "invoice:T1", Status: idempotency.ResolutionPending})
	require.NoError(t, err)
	require.Len(t, reqs, 1)
	assert.Equal(t, "alice", reqs[0].RequestedBy, "the operator is the login, not a form field")
	assert.Equal(t, testenv.ConsoleLogin, reqs[0].RequestedDBUser)
	id := reqs[0].ID

	_, body = get(t, alice, page)
	assert.Contains(t, body, `id="own-request"`)
	assert.NotContains(t, body, `/approve"`, "no approve button for the requester")
	approve := srv.URL + "/resolutions/" + itoa(id) + "/approve"
	resp, _ = post(t, alice, approve, url.Values{"csrf": {csrfOf(t, body)}, "reason": {"mine"}, "operator": {"bob"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	_, body = get(t, alice, srv.URL+resp.Header.Get("Location"))
	assert.Contains(t, html.UnescapeString(body), "a resolution is approved by a different operator")
	r, err := e.worker.Operations().Get(ctx, "payment.collect", "invoice:T1")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateOperatorHold, r.State, "a refused approval changes nothing")

	_, body = get(t, bob, page)
	assert.Contains(t, body, `/resolutions/`+itoa(id)+`/approve"`)
	resp, _ = post(t, bob, srv.URL+"/resolutions/"+itoa(id)+"/approve", url.Values{"csrf": {csrfOf(t, body)}, "reason": {"ch_T1 checked"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	_, body = get(t, bob, srv.URL+resp.Header.Get("Location"))
	assert.Contains(t, body, "approved: the intent is now confirmed")
	assert.Contains(t, body, `id="engine-action"`, "what was done in the engine is shown")
	assert.Contains(t, body, "no engine in this test")
	r, err = e.worker.Operations().Get(ctx, "payment.collect", "invoice:T1")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateConfirmed, r.State)
	req, err := e.worker.Operations().Resolution(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, "bob", *req.DecidedBy)

	// Bad input is shown plainly, and records nothing.
	hold(t, e.worker, "payment.collect", "invoice:T2", "task-T2")
	_, body = get(t, alice, intentURL(srv.URL, "payment.collect", "invoice:T2"))
	resp, _ = post(t, alice, srv.URL+"/intent/resolve", url.Values{"csrf": {csrfOf(t, body)}, "scope": {"payment.collect"},
		"key": {"invoice:T2"}, "as": {"confirmed"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	_, body = get(t, alice, srv.URL+resp.Header.Get("Location"))
	assert.Contains(t, html.UnescapeString(body), "a reason is required")
	assert.Contains(t, html.UnescapeString(body), "confirming needs the provider's reference")
	reqs, err = e.worker.Operations().Resolutions(ctx, idempotency.ResolutionFilter{Key: "invoice:T2"})
	require.NoError(t, err)
	assert.Empty(t, reqs)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// The operators file takes what hash-password prints and what htpasswd -B writes ($2y$),
// and names the line of a problem without showing it.
func TestReadOperators(t *testing.T) {
	h, err := console.HashPassword("alice-password")
	require.NoError(t, err)
	line, err := console.OperatorLine("alice", h)
	require.NoError(t, err)
	htpasswd := "bob:$2y$" + strings.TrimPrefix(mustHash(t, "bob-password"), "$2a$")
	ops, err := console.ReadOperators(testenv.WriteFile(t, "operators", "# console operators\n\n"+line+"\n"+htpasswd+"\n"))
	require.NoError(t, err)
	assert.Len(t, ops, 2)
	e := newEnv(t)
	srv := httptest.NewServer(must(console.New(console.Options{Ledger: e.console, DB: e.consolePool, Engine: noEngine, Operators: ops})))
	defer srv.Close()
	assert.Equal(t, http.StatusSeeOther, login(t, browser(t), srv.URL, "bob", "bob-password").StatusCode, "an htpasswd -B hash logs in")

	for content, want := range map[string]string{
		"alice:secret-in-clear\n":    "line 1 (alice): not a bcrypt hash",
		"# only\n\n":                 "no operators",
		"al ice:" + h + "\n":         "line 1: want name:bcrypt-hash",
		line + "\nALICE:" + h + "\n": "line 2: ALICE appears twice",
	} {
		_, err := console.ReadOperators(testenv.WriteFile(t, "operators", content))
		require.Error(t, err)
		assert.Contains(t, err.Error(), want)
		assert.NotContains(t, err.Error(), "secret-in-clear")
	}
	_, err = console.HashPassword("short")
	assert.Error(t, err)
	_, err = console.OperatorLine("bad name", h)
	assert.Error(t, err)
}

func mustHash(t *testing.T, pw string) string {
	h, err := console.HashPassword(pw)
	require.NoError(t, err)
	return h
}

func must(h http.Handler, err error) http.Handler {
	if err != nil {
		panic(err)
	}
	return h
}

// Behind a proxy, the operator is the proxy's header, believed only from the proxy's
// addresses.
func TestProxyHeader(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, err := console.New(console.Options{Ledger: e.console, DB: e.consolePool, Engine: noEngine, AuthHeader: "X-Forwarded-User",
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, AllowedHosts: []string{"example.com"}})
	require.NoError(t, err)
	serve := func(remote, user string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = remote
		if user != "" {
			req.Header.Set("X-Forwarded-User", user)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	w := serve("10.1.2.3:5555", "carol")
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Contains(t, w.Body.String(), `<span id="operator">carol</span>`)
	assert.NotContains(t, w.Body.String(), `id="logout"`)
	w = serve("192.0.2.7:5555", "carol")
	assert.Equal(t, http.StatusUnauthorized, w.Code, "not through the proxy")
	assert.NotContains(t, w.Body.String(), "carol")
	w = serve("10.1.2.3:5555", "")
	assert.Equal(t, http.StatusUnauthorized, w.Code, "the proxy named nobody")
	w = serve("10.1.2.3:5555", "carol<script>")
	assert.Equal(t, http.StatusUnauthorized, w.Code)

	// Its forms carry a token too.
	req := httptest.NewRequest(http.MethodPost, "/resolutions/1/approve", strings.NewReader("reason=x"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Forwarded-User", "carol")
	req.RemoteAddr = "10.1.2.3:5555"
	w = httptest.NewRecorder()
	h.ServeHTTP(w, req)
	assert.Equal(t, http.StatusForbidden, w.Code)

	_, err = console.New(console.Options{Ledger: e.console, DB: e.consolePool, Engine: noEngine, AuthHeader: "X-Forwarded-User"})
	assert.ErrorContains(t, err, "trusted proxies")
}

// The inbox page shows parked messages with their reason; the outbox page shows the
// namespace's unpublished events with their last error, never their bodies.
func TestInboxAndOutboxPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t, time.Minute)
	source, id := testenv.Unique("billing"), testenv.Unique("evt")
	_, err := e.pool.Exec(ctx, `INSERT INTO extworker_inbox (source, message_id, type, body_digest, state, reason, parked_at)
		VALUES ($1, $2, 'invoice.paid', 'd', 'failed_final', 'early for <b>start</b>, past the window', now())`, source, id)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = e.pool.Exec(context.Background(), `DELETE FROM extworker_inbox WHERE source = $1`, source)
	})
	msg := testenv.Unique("invoice.paid")
	require.NoError(t, outbox.Add(ctx, e.pool, e.worker.Namespace(), outbox.Event{MessageID: msg, Type: "invoice.paid", RoutingKey: "billing",
		Body: []byte(`{"secret":"business-value"}`)}))
	_, err = e.pool.Exec(ctx, `UPDATE extworker_outbox SET attempts = 3, last_error = 'broker unreachable' WHERE namespace = $1`, e.worker.Namespace())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = e.pool.Exec(context.Background(), `DELETE FROM extworker_outbox WHERE namespace = $1`, e.worker.Namespace())
	})

	srv := newConsole(t, e, noEngine)
	c := loggedIn(t, srv.URL, "alice")
	resp, body := get(t, c, srv.URL+"/inbox")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, id)
	assert.Contains(t, body, "early for &lt;b&gt;start&lt;/b&gt;, past the window", "escaped")
	resp, body = get(t, c, srv.URL+"/outbox")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, msg)
	assert.Contains(t, body, "broker unreachable")
	assert.NotContains(t, body, "business-value")
	_, body = get(t, c, srv.URL+"/")
	assert.Regexp(t, `<strong>1</strong> unpublished outbox events`, body)
}
