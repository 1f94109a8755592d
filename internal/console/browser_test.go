package console_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/console"
	"github.com/extworker/extworker/internal/operate"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/tasks"
)

// The console end to end, in headless Chromium, against the engine and a running worker:
// a payment whose outcome the worker cannot find out goes to operator hold and its task
// to an incident; alice logs in, finds it in the held queue and proposes "confirmed";
// she cannot approve her own proposal (no button, and the server refuses it); a form
// without its CSRF token is refused; bob logs in and approves; the console gives the
// task its retry back, the worker completes it from the ledger without calling the
// provider again, and the event trail names both. With EXTWORKER_SCREENSHOTS=DIR the
// main pages are written there (docs/images holds the ones docs/console.md shows).
func TestConsoleInBrowser(t *testing.T) {
	c := testenv.Engine(t)
	e := newEnv(t)
	ctx := testenv.Context(t, 4*time.Minute)
	m := testenv.Deploy(t, c, testenv.ModelOptions{NoMessageWait: true})
	invoice := testenv.Unique("INV")
	key := "invoice:" + invoice

	// The worker: its provider call always times out after the request left, and the
	// effect has no way to ask the provider, so a second look puts it on hold.
	var dispatches atomic.Int32
	reg := tasks.NewRegistry()
	require.NoError(t, reg.Register(m.Topic, func(ctx context.Context, task *tasks.Task) (camunda7.Variables, error) {
		in := task.Intent("payment.collect", "invoice:"+task.BusinessKey(), map[string]string{"invoice": task.BusinessKey()})
		eff := idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
			dispatches.Add(1)
			return idempotency.Result{}, errors.New("read timeout after the request was sent")
		}}
		out, err := e.worker.Do(ctx, in, eff)
		if errors.Is(err, idempotency.ErrUnknownOutcome) {
			out, err = e.worker.Do(ctx, in, eff)
		}
		if err != nil {
			return nil, err
		}
		return camunda7.Variables{"paymentRef": camunda7.StringVar(out.ProviderRef)}, nil
	}, tasks.TopicOptions{LockDuration: 30 * time.Second}))
	w, err := tasks.New(c.Client, reg, tasks.Config{WorkerID: testenv.Unique("w"), AsyncResponseTimeout: time.Second})
	require.NoError(t, err)
	wctx, stopWorker := context.WithCancel(context.Background())
	workerDone := make(chan struct{})
	go func() { defer close(workerDone); _ = w.Run(wctx) }()
	t.Cleanup(func() { stopWorker(); <-workerDone })

	pi, err := c.StartProcess(ctx, m.Key, admin.StartProcessRequest{BusinessKey: invoice})
	require.NoError(t, err)
	var taskID string
	testenv.Eventually(t, time.Minute, "the intent held and its task failed with an incident", func() (bool, error) {
		r, err := e.worker.Operations().Get(ctx, "payment.collect", key)
		if err != nil || r.State != idempotency.StateOperatorHold || r.TaskID == nil {
			return false, err
		}
		task, err := c.ExternalTask(ctx, *r.TaskID)
		if err != nil || task.Retries == nil || *task.Retries != 0 {
			return false, err
		}
		taskID = task.ID
		return true, nil
	})

	h, err := console.New(console.Options{Ledger: e.console, DB: e.consolePool, Operators: operatorHashes(t),
		Engine:     operate.Engine{URL: testenv.EngineURL(), Dial: func() (*camunda7.Client, error) { return c.Client, nil }},
		CockpitURL: strings.TrimSuffix(testenv.EngineURL(), "/engine-rest") + "/camunda"})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	b := testenv.Browser(t, 3*time.Minute)
	shots := os.Getenv("EXTWORKER_SCREENSHOTS")
	screenshot := func(name string) {
		t.Helper()
		if shots == "" {
			return
		}
		png, err := chromedp.Run(b, chromedp.FullScreenshot(100)) // quality 100 is a PNG; below, a JPEG
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(shots, "console-"+name+".png"), png, 0o644))
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(b, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		return s
	}
	submit := func(sel string) int {
		t.Helper()
		resp, err := chromedp.RunResponse(b, chromedp.Click(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		return int(resp.Status)
	}
	logIn := func(name string) {
		t.Helper()
		require.NoError(t, chromedp.Do(b, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#name")),
			chromedp.SendKeys(chromedp.CSS("#name"), name), chromedp.SendKeys(chromedp.CSS("#password"), passwords[name])))
		if name == "alice" {
			screenshot("login")
		}
		require.Equal(t, http.StatusOK, submit("#login"))
		require.Equal(t, name, text("#operator"))
	}

	// alice finds the held intent in its queue, with the engine's view beside it. A key
	// with a right-to-left override reads as it is, not reversed.
	spoof := "S-\u202E" + invoice
	hold(t, e.worker, "payment.collect", spoof, "task-"+invoice)
	logIn("alice")
	held := text("#held")
	assert.Contains(t, held, key)
	assert.Contains(t, held, `S-\u202E`+invoice, "the override shown escaped")
	assert.NotContains(t, held, "\u202E", "and not applied")
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(intentURL(srv.URL, "payment.collect", spoof))))
	assert.Equal(t, `S-\u202E`+invoice, text("#intent-key"))
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(srv.URL+"/")))
	screenshot("overview")
	require.Equal(t, http.StatusOK, submit(`#held a.intent[href*="invoice%3A"]`))
	assert.Equal(t, "0 (incident)", text("#task-retries"))
	assert.Contains(t, text("#engine"), "failedExternalTask")
	cockpit, err := chromedp.Run(b, chromedp.Attributes(chromedp.CSS("#cockpit")))
	require.NoError(t, err)
	assert.Contains(t, cockpit["href"], "/camunda/app/cockpit/default/#/process-instance/"+pi.ID+"/runtime")

	// She proposes "confirmed": no amount, so it waits for a second operator.
	require.NoError(t, chromedp.Do(b, chromedp.Click(chromedp.CSS("#as-confirmed")),
		chromedp.SendKeys(chromedp.CSS("#provider_ref"), "ch_"+invoice),
		chromedp.SendKeys(chromedp.CSS("#values"), "paymentRef=ch_"+invoice),
		chromedp.SendKeys(chromedp.CSS("#reason"), "charge ch_"+invoice+" found in the provider dashboard")))
	require.Equal(t, http.StatusOK, submit("#resolve-submit"))
	assert.Contains(t, text(".done"), "until a second operator approves it")
	assert.Contains(t, text("#own-request"), "You requested this")
	n, err := chromedp.Run(b, chromedp.Nodes(chromedp.CSS("button.approve"), chromedp.AtLeast(0)))
	require.NoError(t, err)
	assert.Empty(t, n, "no approve button for the requester")
	screenshot("intent-pending")
	pending, err := e.worker.Operations().Resolutions(ctx, idempotency.ResolutionFilter{Key: key, Status: idempotency.ResolutionPending})
	require.NoError(t, err)
	require.Len(t, pending, 1)
	assert.Equal(t, "alice", pending[0].RequestedBy)
	approveURL := srv.URL + "/resolutions/" + itoa(pending[0].ID) + "/approve"

	// With alice's session from the browser: her approval is refused by the ledger, and
	// a form without the CSRF token is refused before it.
	cookies, err := chromedp.Call(b, network.GetCookies, network.GetCookiesParams{URLs: []string{srv.URL}})
	require.NoError(t, err)
	form, err := chromedp.Run(b, chromedp.Attributes(chromedp.CSS(`input[name="csrf"]`)))
	require.NoError(t, err)
	aliceHTTP := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	asAlice := func(req *http.Request, extra []*http.Cookie) *http.Response {
		t.Helper()
		for _, ck := range cookies.Cookies {
			req.AddCookie(&http.Cookie{Name: ck.Name, Value: ck.Value})
		}
		for _, ck := range extra {
			req.AddCookie(ck)
		}
		resp, err := aliceHTTP.Do(req)
		require.NoError(t, err)
		return resp
	}
	// postAsAlice posts her approval, and follows its redirect: the status, and the page
	// it shows.
	postAsAlice := func(values url.Values) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, approveURL, strings.NewReader(values.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp := asAlice(req, nil)
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusSeeOther {
			req, err = http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+resp.Header.Get("Location"), nil)
			require.NoError(t, err)
			next := asAlice(req, resp.Cookies())
			defer next.Body.Close()
			var sb strings.Builder
			_, _ = io.Copy(&sb, next.Body)
			return resp.StatusCode, sb.String()
		}
		var sb strings.Builder
		_, _ = io.Copy(&sb, resp.Body)
		return resp.StatusCode, sb.String()
	}
	status, body := postAsAlice(url.Values{"reason": {"no token"}})
	assert.Equal(t, http.StatusForbidden, status)
	assert.Contains(t, body, "CSRF token is missing or wrong")
	status, body = postAsAlice(url.Values{"csrf": {form["value"]}, "reason": {"my own"}})
	assert.Equal(t, http.StatusSeeOther, status, "refused, and said so on the page it leads to")
	assert.Contains(t, body, "a resolution is approved by a different operator")
	still, err := e.worker.Operations().Resolution(ctx, pending[0].ID)
	require.NoError(t, err)
	assert.Equal(t, idempotency.ResolutionPending, still.Status)

	// bob sees what he approves, before the button: the verdict, the provider's
	// reference and the values the task completes with.
	require.Equal(t, http.StatusOK, submit("#logout"), "back at the login form")
	logIn("bob")
	article := "#resolution-" + itoa(pending[0].ID)
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(intentURL(srv.URL, "payment.collect", key))))
	verdict := text(article + " .verdict")
	for _, want := range []string{"confirmed", "Provider reference", "ch_" + invoice, "Result values", "paymentRef", "ch_" + invoice} {
		assert.Contains(t, verdict, want)
	}

	// bob approves; the console gives the task its retry back. The answer is a page of
	// its own: reloading it approves nothing again.
	require.NoError(t, chromedp.Do(b, chromedp.SendKeys(chromedp.CSS("#approve-reason-"+itoa(pending[0].ID)), "ch_"+invoice+" checked in the dashboard")))
	require.Equal(t, http.StatusOK, submit("#approve-"+itoa(pending[0].ID)))
	assert.Contains(t, text(".done"), "approved: the intent is now confirmed")
	assert.Equal(t, "Engine: retries set to 1 on task "+taskID, text("#engine-action"))
	screenshot("intent-approved")
	resp, err := chromedp.RunResponse(b, chromedp.Reload())
	require.NoError(t, err)
	assert.Equal(t, int64(http.StatusOK), resp.Status, "a reload is a GET")
	n, err = chromedp.Run(b, chromedp.Nodes(chromedp.CSS(".done, .error"), chromedp.AtLeast(0)))
	require.NoError(t, err)
	assert.Empty(t, n, "what the form did is said once")

	// The worker completes the task from the ledger; the provider is not called again.
	testenv.Eventually(t, time.Minute, "the process instance completed", func() (bool, error) {
		hpi, err := c.HistoricProcessInstance(ctx, pi.ID)
		return err == nil && hpi.State == "COMPLETED", err
	})
	assert.Equal(t, int32(1), dispatches.Load(), "sent once; the rest came from the ledger")
	r, err := e.worker.Operations().Get(ctx, "payment.collect", key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateConfirmed, r.State)
	events, err := e.worker.Operations().Events(ctx, "payment.collect", key)
	require.NoError(t, err)
	var trail []string
	for _, ev := range events {
		trail = append(trail, ev.Actor+": "+ev.Reason)
	}
	all := strings.Join(trail, "\n")
	assert.Contains(t, all, "operator:alice: resolution #"+itoa(pending[0].ID)+" requested")
	assert.Contains(t, all, "requested by alice (database user "+testenv.ConsoleLogin+")")
	assert.Contains(t, all, "approved by bob (database user "+testenv.ConsoleLogin+")")

	require.NoError(t, chromedp.Do(b, chromedp.Navigate(srv.URL+"/resolutions")))
	assert.Contains(t, text("table"), "approved")
	screenshot("resolutions")
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(intentURL(srv.URL, "payment.collect", key))))
	assert.Contains(t, text("#engine"), "gone")
}
