package taskpage_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/humantask"
	"github.com/extworker/extworker/humantask/taskpage"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

// posted is one form post the page answered: its command, status and page.
type posted struct {
	command string
	status  int
	page    string // sha256 of the page
}

// env is the service and its page on one server, behind one reverse proxy per user
// that names the user in X-User (the trusted-proxy identity source, loopback), the
// engine with the approval process, and the ledger.
type env struct {
	pool    *pgxpool.Pool
	engine  *admin.Client
	key, ns string
	srv     *httptest.Server
	svc     *humantask.Service
	proxies map[string]string // user -> the proxy's URL

	mu        sync.Mutex
	posts     []posted
	holdFirst bool
	arrived   map[string]chan struct{}
	firstHeld chan string // the command of a first post held, if one waits for it
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{pool: testenv.DB(t), engine: testenv.Engine(t), key: testenv.Unique("approval"), ns: testenv.Unique("htpage"),
		proxies: map[string]string{}, firstHeld: make(chan string, 1)}
	ctx := testenv.Context(t, time.Minute)
	_, err := migrations.Up(ctx, stdlib.OpenDBFromPool(e.pool))
	require.NoError(t, err)
	testenv.DeployUserTask(t, e.engine, testenv.UserTaskProcess{Key: e.key, Name: "Approve invoice", CandidateUsers: []string{"alice", "bob"}})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = e.pool.Exec(ctx, `DELETE FROM extworker_intents WHERE namespace = $1`, e.ns)
	})
	id, err := humantask.NewProxyHeader(humantask.ProxyHeader{UserHeader: "X-User",
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}})
	require.NoError(t, err)
	svc, err := humantask.New(humantask.Config{Engine: e.engine, Pool: e.pool, Identity: id, Namespace: e.ns, Lease: 5 * time.Second})
	require.NoError(t, err)
	e.svc = svc
	page, err := taskpage.New(taskpage.Config{Service: svc})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/tasks", svc.Handler())
	mux.Handle("/tasks/", svc.Handler())
	mux.Handle("/ui/", e.recordPosts(page))
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	target, err := url.Parse(e.srv.URL)
	require.NoError(t, err)
	for _, user := range []string{"alice", "bob"} {
		proxy := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = r.In.Host // the browser's host, as a proxy in front of the page keeps it
			r.Out.Header.Set("X-User", user)
		}})
		t.Cleanup(proxy.Close)
		e.proxies[user] = proxy.URL
	}
	return e
}

// recordPosts records each form post's command and the page it got.
func (e *env) recordPosts(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		form, _ := url.ParseQuery(string(body))
		e.hold(form.Get("command"))
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		sum := sha256.Sum256(rec.Body.Bytes())
		e.mu.Lock()
		e.posts = append(e.posts, posted{command: form.Get("command"), status: rec.Code, page: hex.EncodeToString(sum[:])})
		e.mu.Unlock()
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
}

// hold holds the first post of a command, while holdFirst is on, until a second one
// arrives (for at most 10s), and says so on firstHeld: a slow server.
func (e *env) hold(command string) {
	e.mu.Lock()
	if !e.holdFirst {
		e.mu.Unlock()
		return
	}
	if e.arrived == nil {
		e.arrived = map[string]chan struct{}{}
	}
	ch, second := e.arrived[command]
	if second {
		close(ch)
		e.mu.Unlock()
		return
	}
	ch = make(chan struct{})
	e.arrived[command] = ch
	e.mu.Unlock()
	select {
	case e.firstHeld <- command:
	default:
	}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
	}
}

// postsOf are the posts of command, in order.
func (e *env) postsOf(command string) []posted {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []posted
	for _, p := range e.posts {
		if p.command == command {
			out = append(out, p)
		}
	}
	return out
}

// startInstance starts an instance of the approval and returns its task's id.
func (e *env) startInstance(t *testing.T) string {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	pi, err := e.engine.StartProcess(ctx, e.key, admin.StartProcessRequest{Variables: camunda7.Variables{
		"amount": camunda7.LongVar(740), "approved": camunda7.BoolVar(false), "comment": camunda7.StringVar("")}})
	require.NoError(t, err)
	ts, err := e.engine.UserTasks(ctx, url.Values{"processInstanceId": {pi.ID}})
	require.NoError(t, err)
	require.Len(t, ts, 1)
	return ts[0].ID
}

// completions are the engine's completions of task: the commands its history records
// (the marker variable of each), and whether it still waits.
func (e *env) completions(t *testing.T, task string) (commands []string, waiting bool) {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	if _, err := e.engine.UserTask(ctx, task); err == nil {
		waiting = true
	}
	hs, err := e.engine.HistoricUserTasks(ctx, url.Values{"taskId": {task}})
	require.NoError(t, err)
	require.Len(t, hs, 1)
	if hs[0].DeleteReason != "completed" {
		return nil, waiting
	}
	vs, err := e.engine.HistoricVariableInstances(ctx, url.Values{"processInstanceId": {hs[0].ProcessInstanceID},
		"variableName": {"extworker_completion_" + task}})
	require.NoError(t, err)
	for _, v := range vs {
		var text string
		require.NoError(t, json.Unmarshal(v.Value, &text))
		var m map[string]string
		require.NoError(t, json.Unmarshal([]byte(text), &m))
		commands = append(commands, m["command"]+" by "+m["user"])
	}
	return commands, waiting
}

// ledger lists the commands the ledger holds for task, with their states.
func (e *env) ledger(t *testing.T, task string) []string {
	t.Helper()
	rows, err := e.pool.Query(testenv.Context(t, 10*time.Second), `SELECT intent_key, state FROM extworker_intents
		WHERE namespace = $1 AND scope = $2 AND intent_key LIKE $3 ORDER BY id`, e.ns, humantask.Scope, task+"/%")
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var key, state string
		require.NoError(t, rows.Scan(&key, &state))
		command, _ := humantask.CommandOfKey(task, key)
		out = append(out, command+" "+state)
	}
	require.NoError(t, rows.Err())
	return out
}

// browser is one user's headless Chromium, reaching the page through the user's proxy.
type browser struct {
	t     *testing.T
	ctx   context.Context
	base  string
	shots string
}

func (e *env) browser(t *testing.T, user string) *browser {
	return &browser{t: t, ctx: testenv.Browser(t, 4*time.Minute), base: e.proxies[user], shots: os.Getenv("EXTWORKER_SCREENSHOTS")}
}

// open loads task's form and returns its command id.
func (b *browser) open(task string) string {
	b.t.Helper()
	resp, err := chromedp.RunResponse(b.bounded(), chromedp.Navigate(b.base+"/ui/tasks/"+task))
	require.NoError(b.t, err)
	require.Equal(b.t, int64(http.StatusOK), resp.Status)
	return b.command()
}

// step bounds one browser step.
const step = 30 * time.Second

// bounded is the browser's context, within step.
func (b *browser) bounded() context.Context {
	ctx, cancel := context.WithTimeout(b.ctx, step)
	b.t.Cleanup(cancel)
	return ctx
}

// do runs actions, within step.
func (b *browser) do(actions ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(b.ctx, step)
	defer cancel()
	return chromedp.Do(ctx, actions...)
}

// back goes back one entry in the tab's history, as the back button does, and returns
// what the page there shows: "form <command id>" or "result <status> <command id>". A
// page restored from the back/forward cache is read with the page's own DOM (chromedp's
// node tree does not follow such a restore).
func (b *browser) back() string {
	b.t.Helper()
	ctx := b.bounded()
	h, err := chromedp.Call(ctx, page.GetNavigationHistory, cdp.Empty{})
	require.NoError(b.t, err)
	require.Positive(b.t, h.CurrentIndex)
	_, err = chromedp.Call(ctx, page.NavigateToHistoryEntry, page.NavigateToHistoryEntryParams{EntryID: h.Entries[h.CurrentIndex-1].ID})
	require.NoError(b.t, err)
	return b.shown("")
}

// shown waits for a page other than not and returns what it shows: "form <command
// id>", or "result <status> <command id>: <message>", read with the page's own DOM.
func (b *browser) shown(not string) string {
	b.t.Helper()
	var shown string
	testenv.Eventually(b.t, step, "the page", func() (bool, error) {
		s, err := chromedp.Run(b.bounded(), chromedp.Evaluate[string](`(() => {
			const f = document.querySelector('#complete-form input[name="command"]');
			if (f) return 'form ' + f.value;
			const r = document.querySelector('#result[data-status]');
			return r ? 'result ' + r.dataset.status + ' ' + document.querySelector('#command').textContent +
				': ' + document.querySelector('#message').textContent : '';
		})()`))
		shown = s
		return s != "" && s != not, err
	})
	return shown
}

// resubmit sends the form on the page again, as its Complete button does.
func (b *browser) resubmit() {
	b.t.Helper()
	_, err := chromedp.Run(b.bounded(), chromedp.Evaluate[bool](`document.getElementById('complete-form').requestSubmit(), true`))
	require.NoError(b.t, err)
}

// has reports whether the page has an element matching sel.
func (b *browser) has(sel string) bool {
	b.t.Helper()
	n, err := chromedp.Run(b.bounded(), chromedp.Nodes(chromedp.CSS(sel), chromedp.AtLeast(0)))
	require.NoError(b.t, err)
	return len(n) > 0
}

// command is the form's command id, as its hidden field holds it.
func (b *browser) command() string {
	b.t.Helper()
	attrs, err := chromedp.Run(b.bounded(), chromedp.Attributes(chromedp.CSS(`input[name="command"]`)))
	require.NoError(b.t, err)
	require.Len(b.t, attrs["value"], 32, "128 bits, hex")
	return attrs["value"]
}

// submit clicks Complete and returns the status of the page it leads to.
func (b *browser) submit() int {
	b.t.Helper()
	resp, err := chromedp.RunResponse(b.bounded(), chromedp.Click(chromedp.CSS("#complete")))
	require.NoError(b.t, err)
	return int(resp.Status)
}

// result waits for the result page and returns its status, message and command.
func (b *browser) result() (status int, message, command string) {
	b.t.Helper()
	require.NoError(b.t, chromedp.Do(b.bounded(), chromedp.WaitVisible(chromedp.CSS("#result[data-status]"))))
	attrs, err := chromedp.Run(b.bounded(), chromedp.Attributes(chromedp.CSS("#result")))
	require.NoError(b.t, err)
	status, err = strconv.Atoi(attrs["data-status"])
	require.NoError(b.t, err)
	return status, b.text("#message"), b.text("#command")
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.bounded(), chromedp.Text(chromedp.CSS(sel)))
	require.NoError(b.t, err, sel)
	return s
}

// screenshot writes the page to $EXTWORKER_SCREENSHOTS/humantask-<name>.png.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	if b.shots == "" {
		return
	}
	png, err := chromedp.Run(b.bounded(), chromedp.FullScreenshot(100))
	require.NoError(b.t, err)
	require.NoError(b.t, os.WriteFile(filepath.Join(b.shots, "humantask-"+name+".png"), png, 0o644))
}

// The sample task page in headless Chromium, against the engine and the ledger: a
// double click, a back-button resubmit, two users on one task, a form posted from
// another site's page, and a form left open while the task is claimed and then
// reassigned. With EXTWORKER_SCREENSHOTS=DIR each
// result page is written there (docs/images holds the ones docs/humantasks.md shows).
func TestTaskPageInBrowser(t *testing.T) {
	e := newEnv(t)
	alice, bob := e.browser(t, "alice"), e.browser(t, "bob")

	t.Run("double click is one completion", func(t *testing.T) {
		alice.t = t
		e.mu.Lock()
		e.holdFirst = true
		e.mu.Unlock()
		t.Cleanup(func() { e.mu.Lock(); e.holdFirst = false; e.mu.Unlock() })
		task := e.startInstance(t)
		cmd := alice.open(task)
		require.NoError(t, alice.do(chromedp.Click(chromedp.CSS(`input[name="var.approved"]`))))
		box, err := chromedp.Run(alice.bounded(), chromedp.Dimensions(chromedp.CSS("#complete")))
		require.NoError(t, err)
		q := box.Content
		x, y := (q[0]+q[4])/2, (q[1]+q[5])/2
		// Two presses, as a mouse's double click sends them, on a slow server: the second
		// comes while the first post is on its way (pressed together, the browser may send
		// only the second), and submits the form again.
		require.NoError(t, alice.do(chromedp.MouseClickXY(x, y)))
		select {
		case held := <-e.firstHeld:
			require.Equal(t, cmd, held)
		case <-time.After(step):
			t.Fatal("the first post did not arrive")
		}
		require.NoError(t, alice.do(chromedp.MouseClickXY(x, y, chromedp.ClickCount(2))))
		status, msg, shown := alice.result()
		assert.Equal(t, http.StatusOK, status)
		assert.Equal(t, "You completed this task.", msg)
		assert.Equal(t, cmd, shown)
		alice.screenshot("double-click")

		testenv.Eventually(t, 20*time.Second, "both posts answered", func() (bool, error) {
			return len(e.postsOf(cmd)) >= 2, nil
		})
		posts := e.postsOf(cmd)
		for _, p := range posts[1:] {
			assert.Equal(t, posts[0], p, "the same command, the same page")
		}
		assert.Equal(t, http.StatusOK, posts[0].status)
		commands, waiting := e.completions(t, task)
		assert.False(t, waiting)
		assert.Equal(t, []string{cmd + " by alice"}, commands, "one completion, by this command")
		assert.Equal(t, []string{cmd + " confirmed"}, e.ledger(t, task), "one command in the ledger")
	})

	t.Run("back button resubmit is the same command", func(t *testing.T) {
		alice.t = t
		task := e.startInstance(t)
		cmd := alice.open(task)
		require.Equal(t, http.StatusOK, alice.submit())
		_, first, _ := alice.result()
		shown := alice.back()
		if shown == "form "+cmd {
			// The form as it was (the back/forward cache): the same command, sent again.
			alice.resubmit()
			shown = alice.shown(shown)
			require.Len(t, e.postsOf(cmd), 2)
		}
		// Or loaded again from its address, which names the command: its answer.
		assert.Equal(t, "result 200 "+cmd+": "+first, shown)
		alice.screenshot("back-button")
		for _, p := range e.postsOf(cmd) {
			assert.Equal(t, http.StatusOK, p.status)
		}
		commands, _ := e.completions(t, task)
		assert.Equal(t, []string{cmd + " by alice"}, commands)
		assert.Equal(t, []string{cmd + " confirmed"}, e.ledger(t, task))
	})

	// The same command posted again with an edited form (back button, then an edit) is
	// answered with the command's own answer and a note, not a 422 that reads "not
	// completed" (an outside tester's find), and completes nothing more.
	t.Run("an edited resubmit shows the command's answer", func(t *testing.T) {
		task := e.startInstance(t)
		etag, err := e.svc.Task(testenv.Context(t, 30*time.Second), humantask.Identity{User: "alice"}, task)
		require.NoError(t, err)
		post := func(comment string) (int, string) {
			form := url.Values{"command": {"0123456789abcdef0123456789abcdef"}, "etag": {etag.ETag},
				"kind.comment": {"string"}, "var.comment": {comment}}
			req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/ui/tasks/"+task, strings.NewReader(form.Encode()))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("X-User", "alice")
			req.Header.Set("Origin", e.srv.URL)
			resp, err := e.srv.Client().Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			return resp.StatusCode, string(b)
		}
		status, _ := post("first")
		require.Equal(t, http.StatusOK, status)
		status, page := post("edited after the back button")
		assert.Equal(t, http.StatusOK, status, page)
		assert.Contains(t, page, "the change was not sent")
		assert.Contains(t, page, "You completed this task.")
		assert.NotContains(t, page, "not completed")
		commands, _ := e.completions(t, task)
		assert.Equal(t, []string{"0123456789abcdef0123456789abcdef by alice"}, commands)
	})

	t.Run("two users on one task", func(t *testing.T) {
		alice.t, bob.t = t, t
		task := e.startInstance(t)
		aliceCmd, bobCmd := alice.open(task), bob.open(task)
		assert.NotEqual(t, aliceCmd, bobCmd)
		require.Equal(t, http.StatusOK, alice.submit())
		assert.Equal(t, http.StatusConflict, bob.submit())
		status, msg, _ := bob.result()
		assert.Equal(t, http.StatusConflict, status)
		assert.Contains(t, msg, "already completed by alice at ")
		assert.Equal(t, "alice", bob.text("#completed-by"))
		bob.screenshot("conflict")
		commands, _ := e.completions(t, task)
		assert.Equal(t, []string{aliceCmd + " by alice"}, commands)
		assert.ElementsMatch(t, []string{aliceCmd + " confirmed", bobCmd + " rejected"}, e.ledger(t, task))

		// alice's command address, opened by bob, is not alice's answer (an outside tester
		// was told "You completed this task"): bob has no answer under that command.
		resp, err := chromedp.RunResponse(bob.bounded(), chromedp.Navigate(e.proxies["bob"]+"/ui/tasks/"+task+"?command="+aliceCmd))
		require.NoError(t, err)
		assert.Equal(t, int64(http.StatusNotFound), resp.Status)
		assert.NotContains(t, bob.text("body"), "You completed")
	})

	t.Run("a form from another site completes nothing", func(t *testing.T) {
		alice.t = t
		ctx := testenv.Context(t, time.Minute)
		task := e.startInstance(t)
		// The other site knows the task, its ETag and the form's fields; alice's proxy
		// names her on whatever her browser sends it.
		tk, err := e.svc.Task(ctx, humantask.Identity{User: "alice"}, task)
		require.NoError(t, err)
		evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			fmt.Fprintf(w, `<!doctype html><form method="post" action="%s/ui/tasks/%s">
<input type="hidden" name="command" value="0123456789abcdef0123456789abcdef">
<input type="hidden" name="etag" value="%s">
<input type="hidden" name="kind.approved" value="boolean"><input type="hidden" name="var.approved" value="true">
<button id="win" type="submit">Claim your prize</button></form>`, e.proxies["alice"], task, html.EscapeString(tk.ETag))
		}))
		defer evil.Close()
		require.NoError(t, alice.do(chromedp.Navigate(evil.URL)))
		resp, err := chromedp.RunResponse(alice.bounded(), chromedp.Click(chromedp.CSS("#win")))
		require.NoError(t, err)
		assert.Equal(t, int64(http.StatusForbidden), resp.Status)
		assert.Contains(t, alice.text("#message"), "not sent from this site's own page; nothing was done")
		commands, waiting := e.completions(t, task)
		assert.True(t, waiting)
		assert.Empty(t, commands)
		assert.Empty(t, e.ledger(t, task), "nothing recorded")
	})

	t.Run("a form left open while the task changes", func(t *testing.T) {
		alice.t = t
		ctx := testenv.Context(t, time.Minute)
		task := e.startInstance(t)
		alice.open(task)
		// Claimed for her meanwhile (in Tasklist, say): still hers, but not as she saw it.
		require.NoError(t, e.engine.SetUserTaskAssignee(ctx, task, "alice"))
		assert.Equal(t, http.StatusPreconditionFailed, alice.submit())
		status, msg, _ := alice.result()
		assert.Equal(t, http.StatusPreconditionFailed, status)
		assert.Contains(t, msg, "changed since you opened it")
		alice.screenshot("stale")

		// She reloads it: a new form, a new command. Reassigned to bob before she sends it.
		resp, err := chromedp.RunResponse(alice.bounded(), chromedp.Click(chromedp.CSS("#reload")))
		require.NoError(t, err)
		require.Equal(t, int64(http.StatusOK), resp.Status)
		assert.Equal(t, "alice", alice.text("#assignee"))
		require.NoError(t, e.engine.SetUserTaskAssignee(ctx, task, "bob"))
		assert.Equal(t, http.StatusForbidden, alice.submit())
		status, msg, _ = alice.result()
		assert.Equal(t, http.StatusForbidden, status)
		assert.Contains(t, msg, "not yours")
		alice.screenshot("not-yours")
		commands, waiting := e.completions(t, task)
		assert.True(t, waiting, "nothing was completed")
		assert.Empty(t, commands)
	})
}
