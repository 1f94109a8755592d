package console_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/console"
	"github.com/extworker/extworker/internal/testenv"
)

// fuzzInput is one input of FuzzConsoleForms: every field a form or a query has.
type fuzzInput struct {
	name, password                             string // the login form
	as, providerRef, values, errorCode, reason string // the resolve form
	decision                                   string // the reject form's reason
	scope, key, status                         string // query parameters
}

// fuzzConsole is the console FuzzConsoleForms posts to: alice and bob logged in, and an
// orphaned intent on hold, so that every verdict waits for a second operator and the
// intent stays open for the next input.
type fuzzConsole struct {
	e          env
	base       string
	alice, bob *http.Client
	// aliceCSRF and bobCSRF are their sessions' tokens; anon is a browser at the login
	// form, with that form's token.
	aliceCSRF, bobCSRF string
	anon               *http.Client
	anonCSRF           string
	key                string
	n                  atomic.Int64
}

// FuzzConsoleForms posts arbitrary bytes (not UTF-8, NUL, bidi overrides, very long
// strings) in every form field and query parameter to the real handler on the real
// ledger. Never a 5xx and never a panic; every answer is UTF-8 and every page shows no
// hidden character; a verdict or a decision is stored as typed (trimmed), and the page
// shows what was stored.
func FuzzConsoleForms(f *testing.F) {
	for _, in := range []fuzzInput{
		{"alice", "alice-password", "confirmed", "ch_1", "bookingId=B-1", "", "seen in the dashboard", "not found", "payment.collect", "invoice:1", "pending"},
		{"S-\u202E2001", "\x00", "close", "", "", "", "refunded \u2066by hand\u2069", "\xff\xfe", "\x00", "S-\u202E2001", "\u202Epending"},
		{"\xff", strings.Repeat("p", 20000), "rejected", "", "", "CARD\u200BDECLINED", strings.Repeat("r", 5000), "", strings.Repeat("s", 5000), "", "stale"},
		{"bob", "", "retry", "ref", "a=1\na=2", "code", " ", "\r\n", "payment.collect", "\xc3\x28", "all"},
	} {
		f.Add(in.name, in.password, in.as, in.providerRef, in.values, in.errorCode, in.reason, in.decision, in.scope, in.key, in.status)
	}
	fc := newFuzzConsole(f)
	f.Fuzz(func(t *testing.T, name, password, as, providerRef, values, errorCode, reason, decision, scope, key, status string) {
		in := fuzzInput{name, password, as, providerRef, values, errorCode, reason, decision, scope, key, status}
		fc.login(t, in)
		fc.queries(t, in)
		fc.resolve(t, in)
	})
}

func newFuzzConsole(f testing.TB) *fuzzConsole {
	e := newEnv(f)
	srv, _, _ := serve(f, e, console.Options{})
	fc := &fuzzConsole{e: e, base: srv.URL, alice: loggedIn(f, srv.URL, "alice"), bob: loggedIn(f, srv.URL, "bob"), anon: browser(f)}
	_, page := get(f, fc.alice, srv.URL+"/")
	fc.aliceCSRF = csrfOf(f, page)
	_, page = get(f, fc.bob, srv.URL+"/")
	fc.bobCSRF = csrfOf(f, page)
	_, page = get(f, fc.anon, srv.URL+"/login")
	fc.anonCSRF = csrfOf(f, page)
	ctx := testenv.Context(f, time.Minute)
	pi := testenv.Unique("pi")
	fc.key = testenv.Unique("invoice:F")
	task := idempotency.TaskRef{Actor: "w", TaskID: testenv.Unique("task"), ProcessInstanceID: pi}
	heldWith(f, e.worker, "payment.collect", fc.key, task, "read timeout")
	_, err := e.worker.Operations().MarkOrphaned(ctx, pi, task.TaskID, "instance cancelled")
	require.NoError(f, err)
	return fc
}

// fetch sends req with c and checks the answer: no 5xx, UTF-8, and a page without
// hidden characters. It follows one redirect (a form's answer) and returns the page.
func (fc *fuzzConsole) fetch(t *testing.T, c *http.Client, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := c.Do(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	where := req.Method + " " + req.URL.Path
	require.Less(t, resp.StatusCode, 500, "%s: %s", where, b)
	require.True(t, utf8.Valid(b), "%s: not UTF-8", where)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") && len(b) > 0 && resp.StatusCode != http.StatusSeeOther {
		assertNothingHidden(t, string(b), where)
	}
	if resp.StatusCode == http.StatusSeeOther {
		next, err := http.NewRequest(http.MethodGet, fc.base+resp.Header.Get("Location"), nil)
		require.NoError(t, err)
		return fc.fetch(t, c, next)
	}
	return resp, string(b)
}

func (fc *fuzzConsole) postForm(t *testing.T, c *http.Client, path string, form url.Values) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, fc.base+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return fc.fetch(t, c, req)
}

func (fc *fuzzConsole) getPage(t *testing.T, c *http.Client, path string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, fc.base+path, nil)
	require.NoError(t, err)
	_, page := fc.fetch(t, c, req)
	return page
}

// login tries the login form from an address of the input's own (the answer, a
// redirect, is not followed: the form's token stays the same); it logs in only with an
// operator's password.
func (fc *fuzzConsole) login(t *testing.T, in fuzzInput) {
	n := fc.n.Add(1)
	fc.anon.Transport = remoteTransport(fmt.Sprintf("198.18.%d.%d", n>>8&255, n&255))
	resp, page := post(t, fc.anon, fc.base+"/login", url.Values{"csrf": {fc.anonCSRF}, "name": {in.name}, "password": {in.password}, "next": {in.key}})
	if resp.StatusCode == http.StatusForbidden { // a form too large for the login form: shown again, with a new token
		require.Contains(t, page, "larger than the console takes")
		assertNothingHidden(t, page, "POST /login")
		fc.anonCSRF = csrfOf(t, page)
		return
	}
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	if loc := resp.Header.Get("Location"); !strings.HasPrefix(loc, "/login") {
		name := strings.ToLower(strings.TrimSpace(in.name))
		require.Equal(t, passwords[name], in.password, "logged in as %q", in.name)
		fc.anon.Jar, _ = cookiejar.New(nil)
		_, page := get(t, fc.anon, fc.base+"/login")
		fc.anonCSRF = csrfOf(t, page)
	}
}

// queries reads the pages that take query parameters.
func (fc *fuzzConsole) queries(t *testing.T, in fuzzInput) {
	fc.getPage(t, fc.alice, "/intent?"+url.Values{"scope": {in.scope}, "key": {in.key}}.Encode())
	fc.getPage(t, fc.alice, "/resolutions?"+url.Values{"status": {in.status}}.Encode())
	fc.getPage(t, fc.alice, "/login?"+url.Values{"next": {in.key}}.Encode())
}

// resolve posts the input's verdict on the fuzz intent, and on the input's own scope and
// key; checks what was stored against what was typed and what the page shows; and has
// bob reject it with the input's decision reason (or a plain one), so that the intent is
// open for the next input.
func (fc *fuzzConsole) resolve(t *testing.T, in fuzzInput) {
	form := url.Values{"csrf": {fc.aliceCSRF}, "scope": {in.scope}, "key": {in.key}, "as": {in.as}, "provider_ref": {in.providerRef},
		"values": {in.values}, "error_code": {in.errorCode}, "reason": {in.reason}}
	fc.postForm(t, fc.alice, "/intent/resolve", form)
	form.Set("scope", "payment.collect")
	form.Set("key", fc.key)
	_, page := fc.postForm(t, fc.alice, "/intent/resolve", form)
	ctx := testenv.Context(t, time.Minute)
	pending, err := fc.e.worker.Operations().Resolutions(ctx, idempotency.ResolutionFilter{Scope: "payment.collect", Key: fc.key, Status: idempotency.ResolutionPending})
	require.NoError(t, err)
	if len(pending) == 0 {
		require.Contains(t, page, `id="error"`, "nothing stored, and the page says why")
		return
	}
	require.Len(t, pending, 1)
	req := pending[0]
	assertStoredAsTyped(t, in, req)
	assertShown(t, page, req)
	fc.reject(t, in, req.ID)
}

func trimmed(s string) string { return strings.TrimSpace(strings.ReplaceAll(s, "\r\n", "\n")) }

// assertStoredAsTyped checks a stored verdict against the form: trimmed, and nothing
// else changed.
func assertStoredAsTyped(t *testing.T, in fuzzInput, req idempotency.ResolutionRequest) {
	t.Helper()
	require.Equal(t, trimmed(in.reason), req.Reason)
	require.Equal(t, trimmed(in.providerRef), deref(req.ProviderRef))
	require.Equal(t, trimmed(in.errorCode), deref(req.ErrorCode))
	require.Equal(t, "alice", req.RequestedBy)
	var values map[string]any
	if len(req.Values) > 0 && string(req.Values) != "null" {
		require.NoError(t, json.Unmarshal(req.Values, &values))
	}
	lines := strings.Split(strings.ReplaceAll(in.values, "\r\n", "\n"), "\n")
	for name, v := range values {
		found := false
		for _, l := range lines {
			n, val, ok := strings.Cut(l, "=")
			found = found || ok && strings.TrimSpace(n) == name && strings.TrimSpace(val) == v
		}
		require.True(t, found, "value %s=%v was typed", name, v)
	}
}

// assertShown checks that the page shows a stored verdict as stored.
func assertShown(t *testing.T, page string, req idempotency.ResolutionRequest) {
	t.Helper()
	require.Contains(t, page, console.Visible(req.Reason))
	if ref := deref(req.ProviderRef); ref != "" {
		require.Contains(t, page, console.Visible(ref))
	}
	var values map[string]any
	if len(req.Values) > 0 && string(req.Values) != "null" {
		require.NoError(t, json.Unmarshal(req.Values, &values))
	}
	for name, v := range values {
		require.Contains(t, page, "<td>"+console.Visible(name)+"</td><td>"+console.Visible(fmt.Sprint(v))+"</td>")
	}
}

// reject has bob reject resolution id with the input's reason, or with a plain one when
// the console refuses that; a decision is stored as typed, and shown.
func (fc *fuzzConsole) reject(t *testing.T, in fuzzInput, id int64) {
	path := "/resolutions/" + itoa(id) + "/reject"
	_, page := fc.postForm(t, fc.bob, path, url.Values{"csrf": {fc.bobCSRF}, "reason": {in.decision}})
	ctx := testenv.Context(t, time.Minute)
	req, err := fc.e.worker.Operations().Resolution(ctx, id)
	require.NoError(t, err)
	if req.Status == idempotency.ResolutionRejected {
		require.Equal(t, trimmed(in.decision), deref(req.DecisionReason))
		require.Contains(t, page, console.Visible(trimmed(in.decision)))
		return
	}
	fc.postForm(t, fc.bob, path, url.Values{"csrf": {fc.bobCSRF}, "reason": {"not this one"}})
	req, err = fc.e.worker.Operations().Resolution(ctx, id)
	require.NoError(t, err)
	require.Equal(t, idempotency.ResolutionRejected, req.Status)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// TestMain caps how long go test minimizes an input FuzzConsoleForms found interesting:
// a minute by default, and with eleven fields each candidate is a few milliseconds of
// HTTP and SQL, so a 20-second run in CI would spend itself minimizing its first finds.
// A -fuzzminimizetime on the command line still wins.
func TestMain(m *testing.M) {
	_ = flag.Set("test.fuzzminimizetime", "2s")
	os.Exit(m.Run())
}
