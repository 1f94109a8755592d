package console_test

import (
	"context"
	"errors"
	"fmt"
	"html"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/console"
	"github.com/extworker/extworker/internal/testenv"
)

// These tests are the outside tester's findings, one or more each.

// clock is a test's time: the real one, or stopped at a moment (freeze), moved forward
// by advance.
type clock struct{ off, frozen atomic.Int64 }

func (c *clock) now() time.Time {
	t := time.Now()
	if f := c.frozen.Load(); f != 0 {
		t = time.Unix(0, f)
	}
	return t.Add(time.Duration(c.off.Load()))
}

func (c *clock) advance(d time.Duration) { c.off.Add(int64(d)) }
func (c *clock) freeze()                 { c.frozen.Store(time.Now().UnixNano()) }

// serve serves a console built from o, with e's ledger and pool (and, unless o says
// otherwise, no engine and alice's and bob's passwords), on a clock of the test's own.
// A request may claim the remote address its X-Test-Remote header names (see from), as
// requests from many clients would.
func serve(t testing.TB, e env, o console.Options) (*httptest.Server, http.Handler, *clock) {
	t.Helper()
	o.Ledger, o.DB = e.console, e.consolePool
	if o.Engine.Dial == nil {
		o.Engine = noEngine
	}
	if o.Operators == nil && o.AuthHeader == "" {
		o.Operators = operatorHashes(t)
	}
	h, err := console.New(o)
	require.NoError(t, err)
	c := &clock{}
	console.SetClock(h, c.now)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a := r.Header.Get("X-Test-Remote"); a != "" {
			r.RemoteAddr = net.JoinHostPort(a, "40000")
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, h, c
}

// remoteTransport sends every request as from its address (serve believes it).
type remoteTransport string

func (a remoteTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Test-Remote", string(a))
	return http.DefaultTransport.RoundTrip(r)
}

// from is a new browser whose requests come from addr.
func from(t testing.TB, addr string) *http.Client {
	c := browser(t)
	c.Transport = remoteTransport(addr)
	return c
}

// tryLogin logs c in as name and reports whether that worked, with the page the
// redirect led to (the login form, with why not, when it did not).
func tryLogin(t testing.TB, c *http.Client, base, name, password string) (bool, string) {
	t.Helper()
	resp := login(t, c, base, name, password)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "a login's answer is a redirect")
	loc := resp.Header.Get("Location")
	_, page := get(t, c, base+loc)
	return !strings.HasPrefix(loc, "/login"), page
}

// formField is the value of the first input named name in page.
func formField(t testing.TB, page, name string) string {
	t.Helper()
	m := regexp.MustCompile(`name="` + regexp.QuoteMeta(name) + `"[^>]*value="([^"]*)"`).FindStringSubmatch(page)
	require.NotNil(t, m, "no field %s in the page:\n%s", name, page)
	return htmlUnescape(m[1])
}

var tagOrTextarea = regexp.MustCompile(`(?s)<textarea[^>]*>.*?</textarea>|<[^>]*>`)

// assertNothingHidden checks that page's text (outside tags, attribute values and the
// form's own textarea) has no character a reader cannot see for what it is or that
// reorders text (unseenRune: controls, format characters, spaces other than U+0020,
// fillers, variation selectors) and no invalid UTF-8.
func assertNothingHidden(t testing.TB, page, where string) {
	t.Helper()
	assert.True(t, utf8.ValidString(page), "%s: the page is not valid UTF-8", where)
	text := tagOrTextarea.ReplaceAllString(page, " ")
	for i, r := range text {
		if unseenRune(r) || r == utf8.RuneError {
			assert.Failf(t, "a hidden character is rendered", "%s: %U at %d: %q", where, r, i, text[max(0, i-40):min(len(text), i+40)])
			return
		}
	}
}

// heldWith drives an intent into operator hold as hold does, with the task, process
// instance, business key and provider message given.
func heldWith(t testing.TB, l *idempotency.Ledger, scope, key string, task idempotency.TaskRef, message string) {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	in := idempotency.Intent{Scope: scope, Key: key, Request: map[string]string{"id": key}, Task: task}
	eff := idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		return idempotency.Result{}, errors.New(message)
	}}
	_, err := l.Do(ctx, in, eff)
	require.ErrorIs(t, err, idempotency.ErrUnknownOutcome)
	_, _ = l.Do(ctx, in, eff)
	r, err := l.Operations().Get(ctx, scope, key)
	require.NoError(t, err)
	require.Equal(t, idempotency.StateOperatorHold, r.State)
}

// (a) Text from outside with bidi overrides and other invisible characters is shown
// with those characters escaped, visibly, never interpreted: a key of S-, U+202E and
// 2001 reads S-\u202E2001, not S-1002.
func TestExternalTextShownEscaped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t, time.Minute)
	scope, key, pi := "payment.collect", "S-\u202E2001", testenv.Unique("pi")
	task := idempotency.TaskRef{Actor: "w", TaskID: "task-\u2066x\u2069", ProcessInstanceID: pi, BusinessKey: "BK-\u200F1"}
	heldWith(t, e.worker, scope, key, task, "timeout \u202Eafter\x1b[2J the send\u2028")
	_, err := e.worker.Operations().MarkOrphaned(ctx, pi, task.TaskID, "cancelled \u061C by a \u200Bboundary event")
	require.NoError(t, err)
	r, err := e.worker.Operations().Get(ctx, scope, key)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `INSERT INTO extworker_resolutions (intent_id, namespace, scope, intent_key, from_state, attempt, verdict,
		provider_ref, result, reason, requested_by) VALUES ($1, $2, $3, $4, $5, $6, 'confirmed', $7, $8, $9, 'carol')`,
		r.ID, e.worker.Namespace(), scope, key, r.State, r.Attempt, "ch_\u202E1", `{"booking\u200EId": "B-\u202E77"}`, "seen \u202E in the dashboard")
	require.NoError(t, err)

	srv, _, _ := serve(t, e, console.Options{})
	alice := loggedIn(t, srv.URL, "alice")
	for _, path := range []string{"/", "/resolutions", "/resolutions?status=pending"} {
		_, page := get(t, alice, srv.URL+path)
		assertNothingHidden(t, page, path)
		assert.Contains(t, page, `S-<span class="ctl">\u202E</span>2001`, path)
	}
	_, page := get(t, alice, intentURL(srv.URL, scope, key))
	assertNothingHidden(t, page, "the intent page")
	assert.Contains(t, page, `<title>payment.collect / S-\u202E2001`)
	for _, want := range []string{`S-<span class="ctl">\u202E</span>2001`, `task-<span class="ctl">\u2066</span>x<span class="ctl">\u2069</span>`,
		`BK-<span class="ctl">\u200F</span>1`, `timeout <span class="ctl">\u202E</span>after<span class="ctl">\u001B</span>[2J the send<span class="ctl">\u2028</span>`,
		`cancelled <span class="ctl">\u061C</span> by a <span class="ctl">\u200B</span>boundary event`, `ch_<span class="ctl">\u202E</span>1`,
		`booking<span class="ctl">\u200E</span>Id`, `B-<span class="ctl">\u202E</span>77`, `seen <span class="ctl">\u202E</span> in the dashboard`} {
		assert.Contains(t, page, want)
	}
	assert.Equal(t, key, formField(t, page, "key"), "the form still names the intent as it is")
}

// (b) A login for a name that does not exist takes as long as one with a wrong
// password: the comparison for an unknown name is against a hash of the configured
// hashes' cost.
func TestLoginTimingDoesNotTellNamesApart(t *testing.T) {
	e := newEnv(t)
	ops := map[string][]byte{}
	for i := range 8 {
		h, err := bcrypt.GenerateFromPassword([]byte("password"), bcrypt.MinCost+2)
		require.NoError(t, err)
		ops[fmt.Sprintf("op%d", i)] = h
	}
	srv, _, _ := serve(t, e, console.Options{Operators: ops})
	timed := func(name, addr string) time.Duration {
		c := from(t, addr)
		_, page := get(t, c, srv.URL+"/login")
		start := time.Now()
		resp, _ := post(t, c, srv.URL+"/login", url.Values{"csrf": {csrfOf(t, page)}, "name": {name}, "password": {"wrong-password"}})
		d := time.Since(start)
		require.Less(t, resp.StatusCode, 500)
		return d
	}
	known, unknown := time.Hour, time.Hour
	for i := range 8 {
		known = min(known, timed(fmt.Sprintf("op%d", i), fmt.Sprintf("192.0.2.%d", i+1)))
		unknown = min(unknown, timed(fmt.Sprintf("nobody%d", i), fmt.Sprintf("198.51.100.%d", i+1)))
	}
	ratio := float64(unknown) / float64(known)
	assert.True(t, ratio > 1.0/3 && ratio < 3, "an unknown name took %v, a known one %v", unknown, known)
}

// (b) An operators file with hashes cheaper than cost 10 is refused, and so are hashes
// of different costs (a login's time would tell the names apart).
func TestOperatorsHashCost(t *testing.T) {
	cheap, err := bcrypt.GenerateFromPassword([]byte("alice-password"), bcrypt.MinCost)
	require.NoError(t, err)
	_, err = console.ReadOperators(testenv.WriteFile(t, "operators", "alice:"+string(cheap)+"\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cost 4")
	assert.Contains(t, err.Error(), "at least 10")
	e := newEnv(t)
	other, err := bcrypt.GenerateFromPassword([]byte("bob-password"), bcrypt.MinCost+1)
	require.NoError(t, err)
	_, err = console.New(console.Options{Ledger: e.console, DB: e.consolePool, Engine: noEngine,
		Operators: map[string][]byte{"alice": cheap, "bob": other}})
	assert.ErrorContains(t, err, "different bcrypt costs")
}

// (c) Failures for one name from many addresses slow every attempt for that name, for a
// bounded short time; a browser that logged in before as that operator is not slowed by
// other people's failures; failures from one address (a proxy's) slow only browsers
// that have not logged in before.
func TestLoginThrottle(t *testing.T) {
	t.Parallel()
	srv, _, clk := serve(t, newEnv(t), console.Options{})
	clk.freeze()
	for i := range 6 {
		clk.advance(time.Minute) // each guess after the last one's delay: every one counts
		ok, page := tryLogin(t, from(t, fmt.Sprintf("192.0.2.%d", i+1)), srv.URL, "bob", "guess")
		require.False(t, ok)
		require.Contains(t, page, "Unknown name or wrong password")
	}
	ok, page := tryLogin(t, from(t, "198.51.100.1"), srv.URL, "bob", "bob-password")
	assert.False(t, ok, "slowed: the name had failures from many addresses")
	assert.Contains(t, page, "Too many failed logins")
	assert.Contains(t, page, "try again in ")
	ok, page = tryLogin(t, from(t, "198.51.100.2"), srv.URL, "bob", "guess")
	assert.False(t, ok)
	assert.Contains(t, page, "Too many failed logins", "a guess while slowed is not even checked")
	clk.advance(2*time.Minute + time.Second)
	ok, _ = tryLogin(t, from(t, "198.51.100.1"), srv.URL, "bob", "bob-password")
	assert.True(t, ok, "in after the delay, which is at most two minutes")

	alice := from(t, "203.0.113.5")
	ok, _ = tryLogin(t, alice, srv.URL, "alice", "alice-password")
	require.True(t, ok)
	for i := range 20 {
		ok, _ = tryLogin(t, from(t, fmt.Sprintf("192.0.2.%d", 100+i)), srv.URL, "alice", "guess")
		require.False(t, ok)
	}
	ok, _ = tryLogin(t, from(t, "198.51.100.9"), srv.URL, "alice", "alice-password")
	assert.False(t, ok, "a new browser is slowed")
	alice.Transport = remoteTransport("198.51.100.77")
	ok, page = tryLogin(t, alice, srv.URL, "alice", "alice-password")
	assert.True(t, ok, "alice's own browser gets in at once, from another address: %s", page)

	proxy := "10.9.9.9"
	for i := range 12 {
		ok, _ = tryLogin(t, from(t, proxy), srv.URL, fmt.Sprintf("guess%d", i), "guess")
		require.False(t, ok)
	}
	ok, page = tryLogin(t, from(t, proxy), srv.URL, "bob", "bob-password")
	assert.False(t, ok, "the address is slowed for a browser without a login before")
	assert.Contains(t, page, "Too many failed logins")
	alice.Transport = remoteTransport(proxy)
	ok, _ = tryLogin(t, alice, srv.URL, "alice", "alice-password")
	assert.True(t, ok, "alice's browser behind the same proxy gets in")
}

// (c) A flood of failures for 20,000 other names and addresses does not unlock a
// throttled name, known or not: the limiter's memory is bounded by evicting the entries
// with the fewest failures, never by forgetting everything.
func TestLoginThrottleSurvivesFlood(t *testing.T) {
	t.Parallel()
	srv, h, clk := serve(t, newEnv(t), console.Options{})
	clk.freeze()
	for i := range 6 {
		tryLogin(t, from(t, fmt.Sprintf("192.0.2.%d", i+1)), srv.URL, "bob", "guess")
		tryLogin(t, from(t, fmt.Sprintf("192.0.2.%d", i+101)), srv.URL, "mallory", "guess")
	}
	console.FloodLoginFailures(h, 20000)
	ok, page := tryLogin(t, from(t, "198.51.100.1"), srv.URL, "bob", "bob-password")
	assert.False(t, ok, "still throttled after the flood")
	assert.Contains(t, page, "Too many failed logins")
	ok, page = tryLogin(t, from(t, "198.51.100.2"), srv.URL, "mallory", "guess")
	assert.False(t, ok)
	assert.Contains(t, page, "Too many failed logins", "an unknown name is throttled alike, flood or not")
}

// (d) Logging out revokes the session on the server: the old cookie, replayed, is
// nobody.
func TestLogoutRevokesSession(t *testing.T) {
	t.Parallel()
	srv, _, _ := serve(t, newEnv(t), console.Options{})
	bob := loggedIn(t, srv.URL, "bob")
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	var old *http.Cookie
	for _, ck := range bob.Jar.Cookies(u) {
		if ck.Name == "extworker_console" {
			old = ck
		}
	}
	require.NotNil(t, old)
	_, page := get(t, bob, srv.URL+"/")
	resp, _ := post(t, bob, srv.URL+"/logout", url.Values{"csrf": {csrfOf(t, page)}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)

	replay := browser(t)
	replay.Jar.SetCookies(u, []*http.Cookie{{Name: old.Name, Value: old.Value, Path: "/"}})
	resp, _ = get(t, replay, srv.URL+"/")
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.True(t, strings.HasPrefix(resp.Header.Get("Location"), "/login"), resp.Header.Get("Location"))
	resp, _ = post(t, replay, srv.URL+"/resolutions/1/reject", url.Values{"csrf": {csrfOf(t, page)}, "reason": {"x"}})
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

// (e) Behind a proxy, a request naming more than one operator (two header lines, or a
// list) is refused, and so is an empty name.
func TestProxyHeaderOneName(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, err := console.New(console.Options{Ledger: e.console, DB: e.consolePool, Engine: noEngine, AuthHeader: "X-Forwarded-User",
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, AllowedHosts: []string{"example.com"}})
	require.NoError(t, err)
	serve := func(users ...string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = "10.1.2.3:5555"
		for _, u := range users {
			req.Header.Add("X-Forwarded-User", u)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	assert.Equal(t, http.StatusOK, serve("carol").Code)
	for _, users := range [][]string{{"carol", "mallory"}, {"carol, mallory"}, {"carol,mallory"}, {"mallory", "carol"}} {
		w := serve(users...)
		assert.Equal(t, http.StatusBadRequest, w.Code, "%q", users)
		assert.NotContains(t, w.Body.String(), `id="operator"`, "%q", users)
	}
	for _, users := range [][]string{{""}, {"  "}, {"carol\u202E"}} {
		assert.Equal(t, http.StatusUnauthorized, serve(users...).Code, "%q", users)
	}
}

// (e) Trusted proxies wider than a /8 (IPv4) or a /32 (IPv6) are refused, naming the
// variable: 0.0.0.0/0 would believe the header from anyone.
func TestTrustedProxiesTooWide(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	build := func(p string) error {
		_, err := console.New(console.Options{Ledger: e.console, DB: e.consolePool, Engine: noEngine, AuthHeader: "X-Forwarded-User",
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix(p)}})
		return err
	}
	for _, p := range []string{"0.0.0.0/0", "::/0", "10.0.0.0/7", "::ffff:0.0.0.0/96", "2001::/16"} {
		err := build(p)
		require.Error(t, err, p)
		assert.Contains(t, err.Error(), "EXTWORKER_CONSOLE_TRUSTED_PROXIES", p)
	}
	for _, p := range []string{"10.0.0.0/8", "2001:db8::/32", "192.0.2.7/32", "::ffff:10.0.0.0/104"} {
		assert.NoError(t, build(p), p)
	}
}

func cookieNamed(cs []*http.Cookie, name string) *http.Cookie {
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// (f) Over TLS served directly every cookie is Secure; behind a proxy that terminates
// TLS, Options.SecureCookies makes them so.
func TestSecureCookies(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, err := console.New(console.Options{Ledger: e.console, DB: e.consolePool, Engine: noEngine, Operators: operatorHashes(t)})
	require.NoError(t, err)
	srv := httptest.NewTLSServer(h)
	defer srv.Close()
	c := srv.Client()
	c.Jar = browser(t).Jar
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, page := get(t, c, srv.URL+"/login")
	require.NotNil(t, cookieNamed(resp.Cookies(), "extworker_console_login"))
	assert.True(t, cookieNamed(resp.Cookies(), "extworker_console_login").Secure, "the login form's cookie")
	resp, _ = post(t, c, srv.URL+"/login", url.Values{"csrf": {csrfOf(t, page)}, "name": {"alice"}, "password": {"alice-password"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	for _, ck := range resp.Cookies() {
		assert.True(t, ck.Secure, ck.Name)
	}

	plain, _, _ := serve(t, e, console.Options{SecureCookies: true})
	resp, _ = get(t, browser(t), plain.URL+"/login")
	assert.True(t, cookieNamed(resp.Cookies(), "extworker_console_login").Secure, "SecureCookies behind a proxy")
}

// (g) Every response carries Cache-Control: no-store, redirects and errors too.
func TestNoStoreOnEveryResponse(t *testing.T) {
	t.Parallel()
	srv, _, _ := serve(t, newEnv(t), console.Options{})
	c := browser(t)
	for _, tc := range []struct{ method, path, host string }{
		{"GET", "/", ""}, {"GET", "/nothing-here", ""}, {"DELETE", "/", ""}, {"POST", "/logout", ""}, {"GET", "/static/console.css", ""},
		{"GET", "/login", ""}, {"GET", "/", "evil.example"}, {"PUT", "/login", ""},
	} {
		req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		require.NoError(t, err)
		if tc.host != "" {
			req.Host = tc.host
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"), "%s %s (%d)", tc.method, tc.path, resp.StatusCode)
	}
}

// (h) A request naming a host the console is not (a DNS-rebinding page, say) is refused
// with 421; the default allows the listen address's names (loopback's when listening on
// loopback), Options.AllowedHosts others.
func TestHostAllowList(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	status := func(o console.Options, host string) int {
		o.Ledger, o.DB, o.Engine, o.Operators = e.console, e.consolePool, noEngine, operatorHashes(t)
		h, err := console.New(o)
		require.NoError(t, err)
		req := httptest.NewRequest(http.MethodGet, "/login", nil)
		req.Host = host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	for _, tc := range []struct {
		addr    string
		allowed []string
		host    string
		want    int
	}{
		{"", nil, "127.0.0.1:8080", 200}, {"", nil, "localhost:8080", 200}, {"", nil, "[::1]:8080", 200}, {"", nil, "evil.example", 421},
		{"127.0.0.1:9465", nil, "localhost:9465", 200}, {"127.0.0.1:9465", nil, "LOCALHOST.", 200}, {"127.0.0.1:9465", nil, "evil.example:9465", 421},
		{"10.0.3.7:9465", nil, "10.0.3.7:9465", 200}, {"10.0.3.7:9465", nil, "rebound.evil.example:9465", 421},
		{"10.0.3.7:9465", []string{"console.example.com"}, "console.example.com", 200},
		{"10.0.3.7:9465", []string{"console.example.com"}, "Console.Example.COM:443", 200},
		{"10.0.3.7:9465", []string{"console.example.com"}, "10.0.3.7:9465", 421},
		{"", nil, "", 421},
	} {
		assert.Equal(t, tc.want, status(console.Options{Addr: tc.addr, AllowedHosts: tc.allowed}, tc.host), "%+v", tc)
	}
}

// (i) Every form's answer is a redirect to a page that says what happened, once: a
// reload resubmits nothing.
func TestPostRedirectGet(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hold(t, e.worker, "payment.collect", "invoice:P1", "task-P1")
	srv, _, _ := serve(t, e, console.Options{})
	alice, bob := loggedIn(t, srv.URL, "alice"), loggedIn(t, srv.URL, "bob")
	page := intentURL(srv.URL, "payment.collect", "invoice:P1")
	_, body := get(t, alice, page)
	form := url.Values{"csrf": {csrfOf(t, body)}, "scope": {"payment.collect"}, "key": {"invoice:P1"}, "as": {"confirmed"},
		"provider_ref": {"ch_P1"}, "reason": {"in the dashboard"}}
	resp, _ := post(t, alice, srv.URL+"/intent/resolve", form)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	back := resp.Header.Get("Location")
	assert.Equal(t, strings.TrimPrefix(page, srv.URL), back)
	_, body = get(t, alice, srv.URL+back)
	assert.Contains(t, body, "until a second operator approves it")
	_, body = get(t, alice, srv.URL+back)
	assert.NotContains(t, body, "until a second operator approves it", "said once")

	// A refusal is a redirect too, with the form as it was typed.
	resp, _ = post(t, alice, srv.URL+"/intent/resolve", form)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	_, body = get(t, alice, srv.URL+resp.Header.Get("Location"))
	assert.Contains(t, body, "already pending")

	reqs, err := e.worker.Operations().Resolutions(testenv.Context(t, time.Minute), idempotency.ResolutionFilter{Key: "invoice:P1"})
	require.NoError(t, err)
	require.Len(t, reqs, 1)
	_, body = get(t, bob, page)
	resp, _ = post(t, bob, srv.URL+"/resolutions/"+itoa(reqs[0].ID)+"/reject", url.Values{"csrf": {csrfOf(t, body)}, "reason": {"no \u202Echarge"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	_, body = get(t, bob, srv.URL+resp.Header.Get("Location"))
	assert.Contains(t, body, `U+202E RIGHT-TO-LEFT OVERRIDE is not allowed in the reason (character 4, shown as \u202E`)
	assert.Contains(t, body, `id="reject-reason-`+itoa(reqs[0].ID)+"\" name=\"reason\" required value=\"no \u202Echarge\"", "the refused form as typed")
	resp, _ = post(t, bob, srv.URL+"/resolutions/"+itoa(reqs[0].ID)+"/reject", url.Values{"csrf": {csrfOf(t, body)}, "reason": {"no charge found"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	_, body = get(t, bob, srv.URL+resp.Header.Get("Location"))
	assert.Contains(t, body, "rejected; the intent is unchanged")

	_, body = get(t, alice, page)
	form.Set("csrf", csrfOf(t, body))
	form.Set("reason", "   ")
	form.Set("provider_ref", "ch_typed")
	resp, _ = post(t, alice, srv.URL+"/intent/resolve", form)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	_, body = get(t, alice, srv.URL+resp.Header.Get("Location"))
	assert.Contains(t, htmlUnescape(body), "a reason is required")
	assert.Equal(t, "ch_typed", formField(t, body, "provider_ref"), "the form as typed")

	_, body = get(t, bob, srv.URL+"/")
	resp, _ = post(t, bob, srv.URL+"/logout", url.Values{"csrf": {csrfOf(t, body)}})
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
	ok, body := tryLogin(t, browser(t), srv.URL, "bob", "wrong")
	assert.False(t, ok)
	assert.Contains(t, body, "Unknown name or wrong password")
}

// (j) A form posted after the session ended is kept: after logging in again, the page
// has it filled in as typed (and nothing was recorded).
func TestExpiredSessionKeepsTypedForm(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hold(t, e.worker, "payment.collect", "invoice:J1", "task-J1")
	srv, _, clk := serve(t, e, console.Options{})
	alice := loggedIn(t, srv.URL, "alice")
	page := intentURL(srv.URL, "payment.collect", "invoice:J1")
	_, body := get(t, alice, page)
	clk.advance(9 * time.Hour)
	form := url.Values{"csrf": {csrfOf(t, body)}, "scope": {"payment.collect"}, "key": {"invoice:J1"}, "as": {"confirmed"},
		"provider_ref": {"ch_J1"}, "values": {"bookingId=B-9"}, "reason": {"typed before the session ended"}}
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/intent/resolve", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", srv.URL)
	resp, err := alice.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	loc := resp.Header.Get("Location")
	require.True(t, strings.HasPrefix(loc, "/login"), loc)

	_, body = get(t, alice, srv.URL+loc)
	assert.Contains(t, body, "log in again")
	resp, _ = post(t, alice, srv.URL+"/login", url.Values{"csrf": {csrfOf(t, body)}, "next": {formField(t, body, "next")},
		"name": {"alice"}, "password": {"alice-password"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, strings.TrimPrefix(page, srv.URL), resp.Header.Get("Location"), "back to the page of the form")
	_, body = get(t, alice, page)
	assert.Equal(t, "typed before the session ended", formField(t, body, "reason"))
	assert.Equal(t, "ch_J1", formField(t, body, "provider_ref"))
	assert.Contains(t, body, ">bookingId=B-9</textarea>")
	assert.Regexp(t, `id="as-confirmed"[^>]* checked`, body)
	reqs, err := e.worker.Operations().Resolutions(testenv.Context(t, time.Minute), idempotency.ResolutionFilter{Key: "invoice:J1"})
	require.NoError(t, err)
	assert.Empty(t, reqs, "nothing recorded: the operator submits it again")
}

// (k) The approver sees what they approve: the verdict, the provider reference and the
// result values, on the intent's page before the approve button and on /resolutions.
func TestApproverSeesValues(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hold(t, e.worker, "payment.collect", "invoice:K1", "task-K1")
	srv, _, _ := serve(t, e, console.Options{})
	alice, bob := loggedIn(t, srv.URL, "alice"), loggedIn(t, srv.URL, "bob")
	page := intentURL(srv.URL, "payment.collect", "invoice:K1")
	_, body := get(t, alice, page)
	resp, _ := post(t, alice, srv.URL+"/intent/resolve", url.Values{"csrf": {csrfOf(t, body)}, "scope": {"payment.collect"},
		"key": {"invoice:K1"}, "as": {"confirmed"}, "provider_ref": {"ch_K1"}, "values": {"bookingId=B-77\nseat=12A"}, "reason": {"seen"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	reqs, err := e.worker.Operations().Resolutions(testenv.Context(t, time.Minute), idempotency.ResolutionFilter{Key: "invoice:K1"})
	require.NoError(t, err)
	require.Len(t, reqs, 1)

	_, body = get(t, bob, page)
	article := body[strings.Index(body, `id="resolution-`+itoa(reqs[0].ID)+`"`):]
	button := strings.Index(article, `id="approve-`+itoa(reqs[0].ID)+`"`)
	require.Positive(t, button)
	for _, want := range []string{"Provider reference", "ch_K1", "Result values", "<td>bookingId</td><td>B-77</td>", "<td>seat</td><td>12A</td>"} {
		i := strings.Index(article, want)
		assert.True(t, i >= 0 && i < button, "%q before the approve button", want)
	}
	_, body = get(t, bob, srv.URL+"/resolutions?status=pending")
	for _, want := range []string{"ch_K1", "<td>bookingId</td><td>B-77</td>", "<td>seat</td><td>12A</td>"} {
		assert.Contains(t, body, want)
	}
}

// (l) An orphaned intent, in any state, can be closed: the verdict is recorded pending,
// a second operator approves it, and the orphan leaves the queue.
func TestCloseOrphan(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t, time.Minute)
	pi := testenv.Unique("pi")
	task := idempotency.TaskRef{Actor: "w", TaskID: "task-L1", ProcessInstanceID: pi}
	in := idempotency.Intent{Scope: "payment.collect", Key: "invoice:L1", Request: map[string]string{"id": "L1"}, Task: task}
	_, err := e.worker.Do(ctx, in, idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
		return idempotency.Result{ProviderRef: "ch_L1"}, nil
	}})
	require.NoError(t, err)
	_, err = e.worker.Operations().MarkOrphaned(ctx, pi, task.TaskID, "instance cancelled")
	require.NoError(t, err)

	srv, _, _ := serve(t, e, console.Options{})
	alice, bob := loggedIn(t, srv.URL, "alice"), loggedIn(t, srv.URL, "bob")
	_, body := get(t, alice, srv.URL+"/")
	assert.Contains(t, body, "invoice:L1", "in the orphan queue")
	page := intentURL(srv.URL, "payment.collect", "invoice:L1")
	_, body = get(t, alice, page)
	assert.Contains(t, body, `id="as-close"`, "a confirmed orphan can be closed")
	assert.NotContains(t, body, `id="as-confirmed"`, "and only closed: it is settled")
	resp, _ := post(t, alice, srv.URL+"/intent/resolve", url.Values{"csrf": {csrfOf(t, body)}, "scope": {"payment.collect"},
		"key": {"invoice:L1"}, "as": {"close"}, "reason": {"refunded by hand, ticket 42"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	_, body = get(t, alice, page)
	assert.Contains(t, body, "until a second operator approves it")
	reqs, err := e.worker.Operations().Resolutions(ctx, idempotency.ResolutionFilter{Key: "invoice:L1", Status: idempotency.ResolutionPending})
	require.NoError(t, err)
	require.Len(t, reqs, 1, "pending on the ledger: %s", htmlUnescape(body))
	assert.Equal(t, idempotency.VerdictClose, reqs[0].As)

	_, body = get(t, bob, page)
	resp, _ = post(t, bob, srv.URL+"/resolutions/"+itoa(reqs[0].ID)+"/approve", url.Values{"csrf": {csrfOf(t, body)}, "reason": {"ticket 42 seen"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	_, body = get(t, bob, srv.URL+resp.Header.Get("Location"))
	assert.Contains(t, body, "approved")
	assert.NotContains(t, body, `id="as-close"`, "closed: nothing more to do")
	_, body = get(t, bob, srv.URL+"/")
	assert.NotContains(t, body, "invoice:L1", "out of the orphan queue")
}

// (m) Times read as absolute UTC with their age, the age without zero units; every
// list says plainly when it is empty.
func TestTimesAndEmptyStates(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv, _, clk := serve(t, e, console.Options{})
	alice := loggedIn(t, srv.URL, "alice")
	_, body := get(t, alice, srv.URL+"/")
	for _, want := range []string{"No intent is held for an operator.", "No intent has an unknown outcome.",
		"No orphaned intent waits for a verdict.", "No resolution is pending."} {
		assert.Contains(t, body, want)
	}
	_, body = get(t, alice, srv.URL+"/resolutions?status=pending")
	assert.Contains(t, body, "No pending resolutions.")
	_, body = get(t, alice, srv.URL+"/resolutions")
	assert.Contains(t, body, "No resolutions.")

	hold(t, e.worker, "payment.collect", "invoice:M1", "task-M1")
	clk.advance(26 * time.Minute)
	_, body = get(t, alice, srv.URL+"/")
	assert.Regexp(t, `\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} UTC`, body)
	assert.Regexp(t, `\b26m(\d+s)? ago`, body)
	assert.NotContains(t, body, "m0s")
	_, body = get(t, alice, intentURL(srv.URL, "payment.collect", "invoice:M1"))
	assert.Regexp(t, `\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} UTC</time> \(26m(\d+s)? ago\)`, body)
	assert.NotContains(t, body, "m0s")
}

func htmlUnescape(s string) string { return html.UnescapeString(s) }
