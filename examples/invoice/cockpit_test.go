package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/testenv"
)

// The Cockpit login services/engine creates (camunda.bpm.admin-user in its
// application.yaml): a demo credential of the local engines under test only.
const cockpitUser, cockpitPassword = "demo", "demo"

// What an operator sees in Cockpit for an incident the worker raised: a small demo run
// leaves its invoice without an amount with an incident, and headless Chromium logs into
// Cockpit (at the URL the demo's last line names) as the demo user, goes as a user would
// from the dashboard to the process definitions, the demo's definition, the instance
// with the incident and its Incidents tab, reads the incident's message there, then opens
// its error details: the worker's failure report (package tasks, describeFailure), in
// Cockpit's dialog and at the link the dialog gives for it.
//
// EXTWORKER_SCREENSHOTS=<directory> saves the dialog over the Incidents tab as
// cockpit-incident.png there (docs/images has the one the docs show).
func TestCockpitShowsTheWorkersFailureReport(t *testing.T) {
	c := testenv.Engine(t)
	testenv.DB(t)
	base := cockpitURL(testenv.EngineURL())
	require.NotEmpty(t, base, "EXTWORKER_TEST_ENGINE_URL %s does not end in /engine-rest", testenv.EngineURL())
	requireCockpit(t, base)
	browser := testenv.Browser(t, 4*time.Minute)
	ctx := testenv.Context(t, 4*time.Minute)

	// Ten invoices: the tenth has no amount, a permanent failure, so an incident.
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	t.Setenv("EXTWORKER_LOG_LEVEL", "warn")
	out, _ := runDemoLogged(t, "-instances", "10")
	assert.Contains(t, out, "demo OK: incidents are visible in Cockpit ("+base+")")
	m := regexp.MustCompile(`\((demo-\d+)\)`).FindStringSubmatch(out)
	require.NotNil(t, m, "no run id in the demo's output:\n%s", out)
	withIncident, err := c.ProcessInstances(ctx, url.Values{"processDefinitionKey": {demoProcessKey},
		"businessKeyLike": {"INV-" + m[1] + "-%"}, "withIncident": {"true"}})
	require.NoError(t, err)
	require.Len(t, withIncident, 1, "the run's instances with an incident")
	pi := withIncident[0]
	incidents, err := c.Incidents(ctx, url.Values{"processInstanceId": {pi.ID}})
	require.NoError(t, err)
	require.Len(t, incidents, 1)
	incident := incidents[0]
	require.Equal(t, admin.IncidentTypeFailedExternalTask, incident.IncidentType)
	t.Logf("invoice %s: process instance %s, incident %q", pi.BusinessKey, pi.ID, incident.IncidentMessage)

	login := `form[name="signinForm"]`
	cockpitStep(t, browser, "log in as "+cockpitUser,
		chromedp.Navigate(base),
		chromedp.SendKeys(chromedp.CSS(login+` input[type="text"]`), cockpitUser),
		chromedp.SendKeys(chromedp.CSS(login+` input[type="password"]`), cockpitPassword),
		chromedp.Click(chromedp.CSS(login+` button[type="submit"]`)))
	// The dashboard's count of deployed process definitions links to their list.
	cockpitStep(t, browser, "open the process definitions from the dashboard",
		chromedp.Click(chromedp.CSS(`.stats-section.processes a[href="#/processes"]`)))
	cockpitStep(t, browser, "open the demo's process definition",
		chromedp.Click(chromedp.CSS(`a[href="#/process-definition/`+pi.DefinitionID+`"]`)))
	// Its Process Instances tab lists the running ones, newest first: the demo's other
	// invoices have ended, so this one is at the top.
	cockpitStep(t, browser, "open the process instance with the incident",
		chromedp.Click(chromedp.CSS(`td.instance-id a[href="#/process-instance/`+pi.ID+`"]`)))
	// The instance's tabs (Variables, Incidents, ...), not the definition's (Process
	// Instances, Incidents, ...), which may linger in the page while the route changes.
	tab := chromedp.Search(`//ul[contains(@class,"nav-tabs")][.//a[normalize-space()="Variables"]]//a[normalize-space()="Incidents"]`)
	message := chromedp.CSS(`table.incidents-tab td.message a`)
	cockpitStep(t, browser, "open the instance's Incidents tab", chromedp.Click(tab), chromedp.WaitVisible(message))
	shown, err := chromedp.Run(browser, chromedp.Text(message))
	require.NoError(t, err)
	assert.Equal(t, incident.IncidentMessage, strings.Join(strings.Fields(shown), " "), "the incident's message in the Incidents tab")
	assert.Contains(t, shown, "permanent: invoice "+pi.BusinessKey+": ")

	// The message opens a dialog with the failure report (Cockpit fetches the external
	// task's errorDetails); it is read once the dialog has faded in, so that a screenshot
	// shows it whole.
	details := chromedp.CSS(`.modal-body textarea#value`)
	cockpitStep(t, browser, "open the incident's error details", chromedp.Click(message), chromedp.WaitVisible(details),
		chromedp.Poll[chromedp.Void](`(() => {
			const modal = document.querySelector('.modal'), dialog = document.querySelector('.modal-dialog');
			const text = document.querySelector('.modal-body textarea#value');
			return !!(modal && dialog && text) && getComputedStyle(modal).opacity === '1' &&
				new DOMMatrix(getComputedStyle(dialog).transform).f === 0 && text.value.includes('extworker: failure report');
		})()`))
	report, err := chromedp.Run(browser, chromedp.Value(details))
	require.NoError(t, err)
	t.Logf("the failure report in Cockpit's dialog:\n%s", report)
	assertFailureReport(t, report, pi, incident)
	if dir := os.Getenv("EXTWORKER_SCREENSHOTS"); dir != "" {
		require.True(t, filepath.IsAbs(dir), "EXTWORKER_SCREENSHOTS=%s: give an absolute directory (go test runs in the package's)", dir)
		png, err := chromedp.Run(browser, chromedp.FullScreenshot(100)) // 100: PNG
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "cockpit-incident.png"), png, 0o644))
		t.Logf("screenshot: %s", filepath.Join(dir, "cockpit-incident.png"))
	}

	// The dialog links to the report itself (the engine's errorDetails through Cockpit's
	// API, for the whole text in a tab of its own): the browser follows the link.
	link, err := chromedp.Run(browser, chromedp.AttributeValue(chromedp.CSS(`.modal-body a[target="_blank"]`), "href"))
	require.NoError(t, err)
	require.True(t, link.Exists, "the dialog's link to the error details")
	require.Contains(t, link.Value, "/external-task/"+incident.Configuration+"/errorDetails")
	here, err := chromedp.Run(browser, chromedp.Location())
	require.NoError(t, err)
	target, err := url.Parse(here)
	require.NoError(t, err)
	target, err = target.Parse(link.Value)
	require.NoError(t, err)
	cockpitStep(t, browser, "follow the error details link", chromedp.Navigate(target.String()))
	page, err := chromedp.Run(browser, chromedp.Text(chromedp.CSS("body")))
	require.NoError(t, err)
	assertFailureReport(t, page, pi, incident)
}

// The demo's last line names Cockpit's URL, derived from the engine's.
func TestCockpitURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8080/engine-rest":                "http://127.0.0.1:8080/camunda/app/cockpit/default/",
		"http://127.0.0.1:8080/engine-rest/":               "http://127.0.0.1:8080/camunda/app/cockpit/default/",
		"https://admin:s3cret@camunda.example/engine-rest": "https://camunda.example/camunda/app/cockpit/default/",
		"https://camunda.example/prod/engine-rest?x=1":     "https://camunda.example/prod/camunda/app/cockpit/default/",
		"https://camunda.example/rest":                     "",
	} {
		assert.Equal(t, want, cockpitURL(in), in)
	}
}

// assertFailureReport checks the lines of the worker's failure report (tasks'
// describeFailure) that say what happened to this invoice and what to do; not the whole
// text, which names the worker and a time.
func assertFailureReport(t *testing.T, report string, pi admin.ProcessInstance, incident admin.Incident) {
	t.Helper()
	for _, line := range []string{
		"extworker: failure report v1",
		"classification: permanent",
		"retries left: 0: incident raised",
		"topic: " + demoTopicCollect,
		"external task: " + incident.Configuration,
		"process instance: " + pi.ID,
		"business key: " + pi.BusinessKey,
		"operator action: fix the cause, then set retries > 0 to run the handler again",
		"error: " + strings.TrimPrefix(incident.IncidentMessage, "permanent: "),
	} {
		assert.Contains(t, strings.Split(report, "\n"), line, "a line of the failure report:\n%s", report)
	}
}

// cockpitStep runs a step of the way through Cockpit, each with a minute of its own. A
// step that fails names itself and where the browser was.
func cockpitStep(t *testing.T, browser context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(browser, time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		where, _ := chromedp.Run(browser, chromedp.Location())
		t.Fatalf("Cockpit: %s: %v (the browser was at %s)", what, err, where)
	}
}

// requireCockpit checks that the engine serves Cockpit at base. An engine that answers
// but has none was started from a jar built before the webapps were added to
// services/engine, and `make up` leaves an engine that answers alone: like a missing
// engine, that fails in CI and skips elsewhere, saying how to restart it.
func requireCockpit(t *testing.T, base string) {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return
		}
		err = fmt.Errorf("GET %s: status %d", base, resp.StatusCode)
	}
	msg := "no Cockpit: " + err.Error() + " (an engine started before services/engine had the webapps: stop it with services/engine-down.sh, then `make up`)"
	if testenv.InCI() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
