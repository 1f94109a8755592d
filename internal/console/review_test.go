package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"regexp"
	"regexp/syntax"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/console"
	"github.com/extworker/extworker/internal/testenv"
)

// These tests are a second outside review's findings: the kept form, invisible and
// look-alike characters, the proxy header's names and tokens, the result message, and
// the resolutions' status filter.

// postFrom posts form to path with c, as a page of the console would (its Origin), and
// returns the answer without following it.
func postFrom(t testing.TB, c *http.Client, base, path string, form url.Values) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", base)
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp
}

// retryForm is alice's form: retry invoice, for a reason she typed.
func retryForm(csrf, key string) url.Values {
	return url.Values{"csrf": {csrf}, "scope": {"payment.collect"}, "key": {key}, "as": {"retry"}, "reason": {"alice typed this"}}
}

// assertNotPrefilled checks that the intent's page has the resolve form empty.
func assertNotPrefilled(t testing.TB, page, who string) {
	t.Helper()
	assert.NotRegexp(t, `id="as-retry"[^>]* checked`, page, "%s: the retry verdict is not chosen for them", who)
	assert.NotContains(t, page, "alice typed this", "%s: the reason is not filled in", who)
}

// 1. A form sent without a session, or with a session's cookie but a token that is not
// that session's, is not kept: nothing is filled in for whoever logs in next in that
// browser.
func TestKeptFormNeedsTheEndedSessionAndItsToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hold(t, e.worker, "payment.collect", "invoice:R1", "task-R1")
	srv, _, clk := serve(t, e, console.Options{})
	c := browser(t)
	resp := postFrom(t, c, srv.URL, "/intent/resolve", retryForm("bogus", "invoice:R1"))
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "no session: refused, not kept")
	assert.Nil(t, cookieNamed(resp.Cookies(), "extworker_console_draft"), "no draft without a session")

	alice := loggedIn(t, srv.URL, "alice")
	clk.advance(9 * time.Hour) // her session has expired
	resp = postFrom(t, alice, srv.URL, "/intent/resolve", retryForm("bogus", "invoice:R1"))
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "an ended session, a token not its own: refused, not kept")
	assert.Nil(t, cookieNamed(resp.Cookies(), "extworker_console_draft"))

	ok, _ := tryLogin(t, c, srv.URL, "bob", "bob-password")
	require.True(t, ok)
	_, page := get(t, c, intentURL(srv.URL, "payment.collect", "invoice:R1"))
	assertNotPrefilled(t, page, "bob")
	reqs, err := e.worker.Operations().Resolutions(testenv.Context(t, time.Minute), idempotency.ResolutionFilter{Key: "invoice:R1"})
	require.NoError(t, err)
	assert.Empty(t, reqs)
}

// 1. A form kept for alice (her session was logged out, her token was right) is not
// given to bob when he logs in in that browser, and is dropped; alice gets it back when
// she logs in.
func TestKeptFormGoesOnlyToItsOperator(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hold(t, e.worker, "payment.collect", "invoice:R2", "task-R2")
	srv, _, _ := serve(t, e, console.Options{})
	base, err := url.Parse(srv.URL)
	require.NoError(t, err)
	page := intentURL(srv.URL, "payment.collect", "invoice:R2")

	keep := func() *http.Client {
		t.Helper()
		alice := loggedIn(t, srv.URL, "alice")
		_, body := get(t, alice, page)
		token := csrfOf(t, body)
		elsewhere := browser(t) // her session, logged out in another browser
		elsewhere.Jar.SetCookies(base, alice.Jar.Cookies(base))
		_, body = get(t, elsewhere, srv.URL+"/")
		require.Equal(t, http.StatusSeeOther, postFrom(t, elsewhere, srv.URL, "/logout", url.Values{"csrf": {csrfOf(t, body)}}).StatusCode)
		resp := postFrom(t, alice, srv.URL, "/intent/resolve", retryForm(token, "invoice:R2"))
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		require.True(t, strings.HasPrefix(resp.Header.Get("Location"), "/login"), resp.Header.Get("Location"))
		require.NotNil(t, cookieNamed(resp.Cookies(), "extworker_console_draft"), "her own ended session with its token: kept")
		return alice
	}

	c := keep()
	ok, _ := tryLogin(t, c, srv.URL, "bob", "bob-password")
	require.True(t, ok)
	_, body := get(t, c, page)
	assertNotPrefilled(t, body, "bob")
	ok, _ = tryLogin(t, c, srv.URL, "alice", "alice-password")
	require.True(t, ok)
	_, body = get(t, c, page)
	assertNotPrefilled(t, body, "alice, after bob's login dropped it")

	c = keep()
	ok, _ = tryLogin(t, c, srv.URL, "alice", "alice-password")
	require.True(t, ok)
	_, body = get(t, c, page)
	assert.Regexp(t, `id="as-retry"[^>]* checked`, body, "alice gets her form back")
	assert.Equal(t, "alice typed this", formField(t, body, "reason"))
}

// unseenSamples are characters a reader cannot see for what they are, beyond the
// controls and format characters: spaces other than U+0020, the combining grapheme
// joiner, variation selectors, fillers, the Braille blank, tags.
var unseenSamples = []rune{0x00A0, 0x1680, 0x2000, 0x2005, 0x200A, 0x202F, 0x205F, 0x3000, 0x034F, 0x17B4, 0x180B, 0xFE00, 0xFE0F,
	0xE0100, 0xE01EF, 0x2800, 0x3164, 0x115F, 0x1160, 0xFFA0, 0xE0000, 0xE0041, 0xE007F, '\t'}

// unseenRune is what a page must never show as itself: see unseenSamples, with the
// controls (but newline), format characters and separators.
func unseenRune(r rune) bool {
	return r != '\n' && r != ' ' && unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zs, unicode.Zl, unicode.Zp,
		unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector) || r == 0x2800
}

func escapeOf(r rune) string {
	if r > 0xFFFF {
		return fmt.Sprintf(`\U%08X`, r)
	}
	return fmt.Sprintf(`\u%04X`, r)
}

// 2. Spaces other than U+0020, fillers, variation selectors, the Braille blank and tags
// in a key, a provider reference, values, a reason and an engine message are shown as
// their escapes; a key's run of spaces is shown as it is (white-space: pre-wrap).
func TestUnseenCharactersShownEscaped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t, time.Minute)
	var b strings.Builder
	for _, r := range unseenSamples {
		b.WriteString("x" + string(r))
	}
	odd := b.String()
	scope, key := "payment.collect", "invoice:  U"+odd
	heldWith(t, e.worker, scope, key, idempotency.TaskRef{Actor: "w", TaskID: "task-U"}, "timeout"+odd)
	r, err := e.worker.Operations().Get(ctx, scope, key)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `INSERT INTO extworker_resolutions (intent_id, namespace, scope, intent_key, from_state, attempt, verdict,
		provider_ref, result, reason, requested_by) VALUES ($1, $2, $3, $4, $5, $6, 'confirmed', $7, $8, $9, 'carol')`,
		r.ID, e.worker.Namespace(), scope, key, r.State, r.Attempt, "ch"+odd, map[string]string{"bookingId": "B" + odd}, "seen"+odd)
	require.NoError(t, err)

	srv, _, _ := serve(t, e, console.Options{})
	alice := loggedIn(t, srv.URL, "alice")
	for _, path := range []string{"/", "/resolutions", strings.TrimPrefix(intentURL(srv.URL, scope, key), srv.URL)} {
		_, page := get(t, alice, srv.URL+path)
		text := tagOrTextarea.ReplaceAllString(page, " ")
		for _, r := range text {
			if unseenRune(r) {
				assert.Failf(t, "an unseen character is shown as itself", "%s: %U", path, r)
				break
			}
		}
		for _, r := range unseenSamples {
			assert.Contains(t, page, `x<span class="ctl">`+escapeOf(r)+`</span>`, "%s: %U", path, r)
		}
		assert.Regexp(t, `<span class="ws">invoice:  U`, page, "%s: the key's spaces are kept", path)
	}
}

// 2. The forms refuse the same characters, naming them, before the ledger does; and a
// provider reference with two spaces in a row.
func TestUnseenCharactersRefusedInForms(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hold(t, e.worker, "payment.collect", "invoice:U2", "task-U2")
	srv, _, _ := serve(t, e, console.Options{})
	alice := loggedIn(t, srv.URL, "alice")
	page := intentURL(srv.URL, "payment.collect", "invoice:U2")
	for _, tc := range []struct{ field, value, want string }{
		{"provider_ref", "ch_\u31641", "U+3164 HANGUL FILLER is not allowed in the provider reference"},
		{"provider_ref", "ch\u00A01", "U+00A0 NO-BREAK SPACE is not allowed in the provider reference"},
		{"provider_ref", "ch\u2800", "U+2800 BRAILLE PATTERN BLANK is not allowed in the provider reference"},
		{"provider_ref", "ch\tx", "U+0009 CHARACTER TABULATION is not allowed in the provider reference"},
		{"provider_ref", "ch  1", "the provider reference has two spaces in a row"},
		{"values", "bookingId=B\uFE0F1", "U+FE0F VARIATION SELECTOR-16 is not allowed in the result values"},
		{"values", "bookingId=B\U000E01001", "U+E0100 VARIATION SELECTOR-17 is not allowed in the result values"},
		{"reason", "seen\u2003it", "U+2003 EM SPACE is not allowed in the reason"},
		{"reason", "seen\U000E0041", "U+E0041 TAG LATIN CAPITAL LETTER A is not allowed in the reason"},
		{"reason", "seen\u034F", "U+034F COMBINING GRAPHEME JOINER is not allowed in the reason"},
	} {
		_, body := get(t, alice, page)
		form := url.Values{"csrf": {csrfOf(t, body)}, "scope": {"payment.collect"}, "key": {"invoice:U2"}, "as": {"confirmed"},
			"provider_ref": {"ch_1"}, "values": {"bookingId=B-1"}, "reason": {"seen"}}
		form.Set(tc.field, tc.value)
		resp := postFrom(t, alice, srv.URL, "/intent/resolve", form)
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		_, body = get(t, alice, srv.URL+resp.Header.Get("Location"))
		assert.Contains(t, htmlUnescape(body), tc.want, "%s %q", tc.field, tc.value)
	}
	reqs, err := e.worker.Operations().Resolutions(testenv.Context(t, time.Minute), idempotency.ResolutionFilter{Key: "invoice:U2"})
	require.NoError(t, err)
	assert.Empty(t, reqs, "nothing recorded")
}

// 2. Every character the ledger refuses in a verdict (extworker_unseen_pattern) the
// console refuses first, and shows escaped.
func TestConsoleRefusesWhatTheLedgerRefuses(t *testing.T) {
	e := newEnv(t)
	var pattern string
	require.NoError(t, e.pool.QueryRow(testenv.Context(t, time.Minute), `SELECT extworker_unseen_pattern()`).Scan(&pattern))
	goPattern := regexp.MustCompile(`\\[uU]([0-9a-fA-F]+)`).ReplaceAllString(pattern, `\x{$1}`)
	re, err := syntax.Parse(goPattern, syntax.Perl)
	require.NoError(t, err, goPattern)
	require.Equal(t, syntax.OpCharClass, re.Op, goPattern)
	n := 0
	var taken, shown []string
	for i := 0; i+1 < len(re.Rune); i += 2 {
		for r := re.Rune[i]; r <= re.Rune[i+1]; r++ {
			n++
			if console.CheckProviderRef("ch"+string(r)+"1") == nil {
				taken = append(taken, fmt.Sprintf("%U", r))
			}
			if r != '\n' && !strings.Contains(console.Visible(string(r)), `class="ctl"`) {
				shown = append(shown, fmt.Sprintf("%U", r))
			}
		}
	}
	assert.Empty(t, taken, "the ledger refuses these; the console takes them")
	assert.Empty(t, shown, "the ledger refuses these; the console shows them as themselves")
	assert.Greater(t, n, 4000)
}

// headerTransport sends every request as the proxy would, naming user.
type headerTransport string

func (u headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Forwarded-User", string(u))
	return http.DefaultTransport.RoundTrip(r)
}

// asProxied is a browser behind the proxy, logged in as user.
func asProxied(t testing.TB, user string) *http.Client {
	c := browser(t)
	c.Transport = headerTransport(user)
	return c
}

func proxiedConsole(t *testing.T, e env) (*httptest.Server, *clock) {
	srv, _, clk := serve(t, e, console.Options{AuthHeader: "X-Forwarded-User", TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	return srv, clk
}

// 3. Behind a proxy, a name the register does not know is refused on every page, and a
// registered one is shown as the register spells it.
func TestProxyHeaderNamesRegisteredOperatorsOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t, time.Minute)
	dana := "Dana." + strings.TrimPrefix(testenv.Unique("x"), "x-")
	_, err := e.pool.Exec(ctx, `INSERT INTO extworker_operators (name) VALUES ($1)`, dana)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = e.pool.Exec(context.Background(), `DELETE FROM extworker_operators WHERE name = $1`, dana)
	})
	srv, _ := proxiedConsole(t, e)
	for _, path := range []string{"/", "/resolutions", "/inbox", "/outbox", "/intent?scope=a&key=b"} {
		resp, body := get(t, asProxied(t, "mallory"), srv.URL+path)
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, path)
		assert.Contains(t, body, "mallory is not a registered operator of this ledger", path)
		assert.NotContains(t, body, `id="operator"`, path)
	}
	_, body := get(t, asProxied(t, "CAROL"), srv.URL+"/")
	assert.Contains(t, body, `<span id="operator">carol</span>`)
	_, body = get(t, asProxied(t, strings.ToLower(dana)), srv.URL+"/")
	assert.Contains(t, body, `<span id="operator">`+dana+`</span>`, "the register's spelling")
}

// 3. Behind a proxy, the forms' token is not one per name for the process's life: two
// browsers of one operator have different tokens, neither takes the other's, and a
// token ends.
func TestProxyHeaderTokenRotates(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hold(t, e.worker, "payment.collect", "invoice:X1", "task-X1")
	srv, clk := proxiedConsole(t, e)
	page := intentURL(srv.URL, "payment.collect", "invoice:X1")
	one, two := asProxied(t, "carol"), asProxied(t, "carol")
	_, body := get(t, one, page)
	tokenOne := csrfOf(t, body)
	_, body = get(t, two, page)
	tokenTwo := csrfOf(t, body)
	assert.NotEqual(t, tokenOne, tokenTwo, "one token per browser, not per name")

	invalid := func(token string) url.Values { // refused by the form's checks, after the token's
		return url.Values{"csrf": {token}, "scope": {"payment.collect"}, "key": {"invoice:X1"}, "reason": {"x"}}
	}
	assert.Equal(t, http.StatusSeeOther, postFrom(t, one, srv.URL, "/intent/resolve", invalid(tokenOne)).StatusCode, "its own token")
	assert.Equal(t, http.StatusForbidden, postFrom(t, one, srv.URL, "/intent/resolve", invalid(tokenTwo)).StatusCode, "another browser's")
	clk.advance(9 * time.Hour)
	assert.Equal(t, http.StatusForbidden, postFrom(t, one, srv.URL, "/intent/resolve", invalid(tokenOne)).StatusCode, "a token ends")
	_, body = get(t, one, page)
	assert.NotEqual(t, tokenOne, csrfOf(t, body), "and a new one comes with the next page")
	assert.Equal(t, http.StatusSeeOther, postFrom(t, one, srv.URL, "/intent/resolve", invalid(csrfOf(t, body))).StatusCode)
}

// 4. What a form did is shown on the page it was meant for, to the operator who sent
// it, once: not on the next page read, not to another operator, not again from a copy.
func TestResultShownOnItsPageOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hold(t, e.worker, "payment.collect", "invoice:F1", "task-F1")
	hold(t, e.worker, "payment.collect", "invoice:F4", "task-F4")
	srv, _, _ := serve(t, e, console.Options{})
	base, err := url.Parse(srv.URL)
	require.NoError(t, err)
	alice, bob := loggedIn(t, srv.URL, "alice"), loggedIn(t, srv.URL, "bob")
	f4 := intentURL(srv.URL, "payment.collect", "invoice:F4")
	_, body := get(t, alice, f4)
	resp := postFrom(t, alice, srv.URL, "/intent/resolve", url.Values{"csrf": {csrfOf(t, body)}, "scope": {"payment.collect"},
		"key": {"invoice:F4"}, "as": {"confirmed"}, "provider_ref": {"ch_F4"}, "reason": {"seen"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	_, _ = get(t, alice, srv.URL+resp.Header.Get("Location"))
	reqs, err := e.worker.Operations().Resolutions(testenv.Context(t, time.Minute), idempotency.ResolutionFilter{Key: "invoice:F4"})
	require.NoError(t, err)
	require.Len(t, reqs, 1)

	_, body = get(t, bob, f4)
	resp = postFrom(t, bob, srv.URL, "/resolutions/"+itoa(reqs[0].ID)+"/approve", url.Values{"csrf": {csrfOf(t, body)}, "reason": {"ch_F4 seen"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	flash := cookieNamed(resp.Cookies(), "extworker_console_flash")
	require.NotNil(t, flash)
	approved := "Resolution #" + itoa(reqs[0].ID) + " approved"
	_, body = get(t, bob, intentURL(srv.URL, "payment.collect", "invoice:F1"))
	assert.NotContains(t, body, approved, "not on another page")
	_, body = get(t, bob, srv.URL+"/")
	assert.NotContains(t, body, approved, "nor on the overview")
	copied := browser(t)
	copied.Jar.SetCookies(base, append(alice.Jar.Cookies(base), &http.Cookie{Name: flash.Name, Value: flash.Value, Path: "/"}))
	_, body = get(t, copied, f4)
	assert.NotContains(t, body, approved, "not to another operator")
	_, body = get(t, bob, f4)
	assert.Contains(t, body, approved, "on its page, to its operator")
	_, body = get(t, bob, f4)
	assert.NotContains(t, body, approved, "once")
	bob.Jar.SetCookies(base, []*http.Cookie{{Name: flash.Name, Value: flash.Value, Path: "/"}})
	_, body = get(t, bob, f4)
	assert.NotContains(t, body, approved, "a copy of the cookie is not shown again")
}

// 5. /resolutions?status=all lists every resolution, as the manual says.
func TestResolutionsStatusAll(t *testing.T) {
	t.Parallel()
	srv, _, _ := serve(t, newEnv(t), console.Options{})
	alice := loggedIn(t, srv.URL, "alice")
	resp, body := get(t, alice, srv.URL+"/resolutions?status=all")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, "No resolutions.")
	assert.Contains(t, body, `<option value="all" selected>all</option>`)
	resp, body = get(t, alice, srv.URL+"/resolutions?status=sideways")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, body, "want all, pending, approved, rejected or stale")
}

// 2. What only a browser shows: a run of spaces in a key, a provider reference and a
// value is shown as it is, not collapsed into one.
func TestSpacesKeptInBrowser(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, 2*time.Minute)
	scope, key := "payment.collect", "invoice:  S1"
	hold(t, e.worker, scope, key, "task-S1")
	r, err := e.worker.Operations().Get(ctx, scope, key)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `INSERT INTO extworker_resolutions (intent_id, namespace, scope, intent_key, from_state, attempt, verdict,
		provider_ref, result, reason, requested_by) VALUES ($1, $2, $3, $4, $5, $6, 'confirmed', 'ch  S1', '{"bookingId": "B   1"}', 'seen', 'carol')`,
		r.ID, e.worker.Namespace(), scope, key, r.State, r.Attempt)
	require.NoError(t, err)
	srv, _, _ := serve(t, e, console.Options{})

	b := testenv.Browser(t, 2*time.Minute)
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(b, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		return s
	}
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(srv.URL+"/login"), chromedp.WaitVisible(chromedp.CSS("#name")),
		chromedp.SendKeys(chromedp.CSS("#name"), "alice"), chromedp.SendKeys(chromedp.CSS("#password"), passwords["alice"]),
		chromedp.Click(chromedp.CSS("#login")), chromedp.WaitVisible(chromedp.CSS("#operator"))))
	assert.Contains(t, text("#held"), key, "the overview keeps the key's spaces")
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(intentURL(srv.URL, scope, key))))
	assert.Equal(t, key, text("#intent-key"))
	verdict := text("#resolutions .verdict")
	assert.Contains(t, verdict, "ch  S1")
	assert.Contains(t, verdict, "B   1")
}
