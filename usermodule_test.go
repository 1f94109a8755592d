package extworker_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

// claimBPMN is the claim a damaged parcel opens.
const claimBPMN = `<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn"
  id="defs-%[1]s" targetNamespace="http://extworker.dev/test">
  <bpmn:process id="%[1]s" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="reported"/>
    <bpmn:sequenceFlow id="f1" sourceRef="reported" targetRef="opened"/>
    <bpmn:endEvent id="opened"/>
  </bpmn:process>
</bpmn:definitions>`

// courierBPMN is the user's process: book a courier for a shipment; an address the
// courier refuses ends on its own path.
const courierBPMN = `<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn"
                  id="courier" targetNamespace="http://example.com/courier">
  <bpmn:error id="Rejected" name="Address rejected" errorCode="ADDRESS_REJECTED"/>
  <bpmn:process id="%s" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="book"/>
    <bpmn:serviceTask id="book" camunda:type="external" camunda:topic="shipping.book-courier"/>
    <bpmn:sequenceFlow id="f2" sourceRef="book" targetRef="booked"/>
    <bpmn:endEvent id="booked"/>
    <bpmn:boundaryEvent id="rejected" attachedToRef="book"><bpmn:errorEventDefinition errorRef="Rejected"/></bpmn:boundaryEvent>
    <bpmn:sequenceFlow id="f3" sourceRef="rejected" targetRef="undeliverable"/>
    <bpmn:endEvent id="undeliverable"/>
  </bpmn:process>
</bpmn:definitions>`

// courier is the user's provider: it books once per Idempotency-Key, refuses postcode
// 00000 with a 422, and looks bookings up by key.
type courier struct {
	mu       sync.Mutex
	bookings map[string]string // key -> booking id
	posts    int
}

func (c *courier) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.Method == http.MethodGet {
		id, ok := c.bookings[r.URL.Query().Get("key")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `{"id":%q}`, id)
		return
	}
	c.posts++
	body, _ := io.ReadAll(r.Body)
	if strings.Contains(string(body), `"postcode":"00000"`) {
		w.WriteHeader(http.StatusUnprocessableEntity)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	id, ok := c.bookings[key]
	if !ok {
		id = fmt.Sprintf("bk_%d", len(c.bookings)+1)
		c.bookings[key] = id
	}
	fmt.Fprintf(w, `{"id":%q}`, id)
}

// buildUserModule builds examples/courier, the model user module: a module of its own
// that requires this one.
func buildUserModule(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "courier")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join("examples", "courier")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build examples/courier: %s", out)
	return bin
}

// A user's own module, with one ledger-backed handler, one inbox consumer and a short
// main, serves its topic and its queue through the entry point against the real engine,
// PostgreSQL and RabbitMQ: every shipment booked once (a twin delivery of one shipment
// too), a refused address on the process's error path, each booking announced once, a
// damaged parcel reported three times opening one claim, /readyz ready, /metrics
// exposed, and a clean exit on SIGTERM.
func TestUserModule(t *testing.T) {
	c := testenv.Engine(t)
	pool := testenv.DB(t)
	ctx := testenv.Context(t, 4*time.Minute)
	db := stdlib.OpenDBFromPool(pool)
	_, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	bin := buildUserModule(t)

	main, err := os.ReadFile(filepath.Join("examples", "courier", "main.go"))
	require.NoError(t, err)
	body := string(main)[strings.Index(string(main), "func main()"):]
	assert.LessOrEqual(t, strings.Count(strings.TrimSpace(body), "\n")+1, 15, "a complete worker's main in at most 15 lines")

	prov := &courier{bookings: map[string]string{}}
	srv := httptest.NewServer(prov)
	defer srv.Close()
	key := testenv.Unique("courier")
	_, err = c.Deploy(ctx, admin.Deployment{Name: key, Resources: []admin.Resource{{Name: key + ".bpmn", Content: []byte(fmt.Sprintf(courierBPMN, key))}}})
	require.NoError(t, err)
	start := func(shipment, postcode string) string {
		pi, err := c.StartProcess(ctx, key, admin.StartProcessRequest{BusinessKey: shipment,
			Variables: camunda7.Variables{"shipmentId": camunda7.StringVar(shipment), "postcode": camunda7.StringVar(postcode)}})
		require.NoError(t, err)
		return pi.ID
	}
	run := testenv.Unique("S")
	ids := []string{start(run+"-1", "10115"), start(run+"-2", "80331"), start(run+"-1", "10115"), start(run+"-3", "00000")}

	amqpConn := testenv.AMQP(t)
	events, ch := testenv.Queue(t, amqpConn)
	// The carrier's parcel.damaged events, which the program consumes into claims.
	claimKey, claims := testenv.Unique("claim"), testenv.Unique("claims")
	_, err = c.Deploy(ctx, admin.Deployment{Name: claimKey, Resources: []admin.Resource{{Name: claimKey + ".bpmn", Content: []byte(fmt.Sprintf(claimBPMN, claimKey))}}})
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, q := range []string{claims, claims + ".retry", claims + ".dlq"} {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
	})
	addr, consoleAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	// The operator console, on through the entry point as a user turns it on: an operators
	// file and the console's own database login (docs/console.md).
	hash, err := bcrypt.GenerateFromPassword([]byte("courier-ops-password"), bcrypt.DefaultCost) // the console refuses costs under 10
	require.NoError(t, err)
	operators := filepath.Join(t.TempDir(), "operators")
	require.NoError(t, os.WriteFile(operators, []byte("carol:"+string(hash)+"\n"), 0o600))
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "EXTWORKER_ENGINE_URL="+testenv.EngineURL(), "EXTWORKER_DATABASE_URL="+testenv.DBURL(),
		"EXTWORKER_LEDGER_NAMESPACE="+key, "EXTWORKER_HTTP_ADDR="+addr, "EXTWORKER_LOG_LEVEL=warn", "COURIER_URL="+srv.URL,
		"EXTWORKER_AMQP_URL="+testenv.AMQPURL(), "COURIER_EVENTS="+events, "COURIER_CLAIMS="+claims, "COURIER_CLAIM_PROCESS="+claimKey,
		"EXTWORKER_CONSOLE_ADDR="+consoleAddr, "EXTWORKER_CONSOLE_OPERATORS_FILE="+operators,
		"EXTWORKER_CONSOLE_DATABASE_URL="+testenv.DBURLAs(testenv.ConsoleLogin))
	var logs testenv.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("worker logs:\n%s", logs.String())
		}
	}()

	testenv.Eventually(t, 2*time.Minute, "every instance ended", func() (bool, error) {
		for _, id := range ids {
			h, err := c.HistoricProcessInstance(ctx, id)
			if err != nil || h.State != "COMPLETED" {
				return false, err
			}
		}
		return true, nil
	})
	ends := map[string]int{}
	for _, id := range ids {
		acts, err := c.HistoricActivityInstances(ctx, url.Values{"processInstanceId": {id}})
		require.NoError(t, err)
		for _, a := range acts {
			if a.ActivityType == "noneEndEvent" {
				ends[a.ActivityID]++
			}
		}
	}
	assert.Equal(t, map[string]int{"booked": 3, "undeliverable": 1}, ends)
	prov.mu.Lock()
	assert.Len(t, prov.bookings, 2, "one booking per shipment, the twin delivery included")
	prov.mu.Unlock()

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Each booking announced itself once, through the outbox in the booking's transaction.
	var announced []string
	testenv.Eventually(t, 30*time.Second, "two courier.booked events", func() (bool, error) {
		for {
			d, ok, err := ch.Get(events, true)
			if err != nil || !ok {
				return len(announced) >= 2, err
			}
			announced = append(announced, d.MessageId)
		}
	})
	assert.ElementsMatch(t, []string{"courier.booked:" + run + "-1", "courier.booked:" + run + "-2"}, announced)

	// A damaged parcel reported three times (a redelivery, and the carrier's retry under
	// a new message id) opens one claim.
	pch, err := amqpConn.Channel()
	require.NoError(t, err)
	require.NoError(t, pch.Confirm(false))
	report := func(id string) {
		dc, err := pch.PublishWithDeferredConfirmWithContext(ctx, "", claims, true, false, amqp.Publishing{MessageId: id, Type: "parcel.damaged",
			DeliveryMode: amqp.Persistent, Body: []byte(`{"shipment":"` + run + `-2","note":"box crushed"}`)})
		require.NoError(t, err)
		ok, err := dc.WaitContext(ctx)
		require.NoError(t, err)
		require.True(t, ok, "confirmed")
	}
	testenv.Eventually(t, 30*time.Second, "the program to declare its claims queue", func() (bool, error) {
		_, err := pch.QueueDeclarePassive(claims, true, false, false, false, nil)
		if err != nil { // a failed passive declare closes the channel
			pch, _ = amqpConn.Channel()
			_ = pch.Confirm(false)
		}
		return err == nil, nil
	})
	report("damaged:" + run)
	report("damaged:" + run)
	report("damaged:" + run + ":retry")
	// One started the claim, the redelivery was a duplicate, the retry found the claim.
	want := map[string]int{"received": 3, "started": 1, "duplicate": 1, "ignored": 1, "parked": 0}
	testenv.Eventually(t, 30*time.Second, "three reports consumed", func() (bool, error) {
		_, m := get("/metrics")
		for outcome, n := range want {
			if !strings.Contains(m, fmt.Sprintf(`extworker_inbox_messages_total{outcome=%q,queue=%q} %d`+"\n", outcome, claims, n)) {
				return false, fmt.Errorf("no %s %d for %s in %q", outcome, n, claims, inboxLines(m))
			}
		}
		return true, nil
	})
	n, err := c.HistoricProcessInstanceCount(ctx, url.Values{"processDefinitionKey": {claimKey}, "processInstanceBusinessKey": {run + "-2"}})
	require.NoError(t, err)
	assert.Equal(t, 1, n, "one claim for the damaged parcel")

	code, _ := get("/readyz")
	assert.Equal(t, http.StatusOK, code, "/readyz")
	code, metrics := get("/metrics")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, metrics, `extworker_tasks_completed_total{topic="shipping.book-courier"}`)
	assert.Contains(t, metrics, "extworker_outbox_published_total 2")
	assert.Contains(t, metrics, "extworker_outbox_unpublished 0")

	// The console answers on its own address, not on the operations endpoint's, and only
	// to an operator who logged in.
	code, _ = get("/login")
	assert.Equal(t, http.StatusNotFound, code, "no console on the operations endpoint")
	checkConsole(t, "http://"+consoleAddr, "carol", "courier-ops-password")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		assert.NoError(t, err, "a graceful stop exits 0")
	case <-time.After(time.Minute):
		t.Fatal("no exit within a minute of SIGTERM")
	}
}

// checkConsole logs into the console at base as name: its pages need a login (a
// redirect before), every answer carries the Content-Security-Policy, a wrong password is
// refused, and the overview is served after the login.
func checkConsole(t *testing.T, base, name, password string) {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := &http.Client{Jar: jar, Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path string, form url.Values) (*http.Response, string) {
		req, err := http.NewRequest(method, base+path, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Origin", base)
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'none'", "%s %s", method, path)
		return resp, string(b)
	}
	resp, _ := do(http.MethodGet, "/", nil)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "the overview before a login")
	assert.Equal(t, "/login", resp.Header.Get("Location"))
	csrf := func(page string) string {
		m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(page)
		require.NotNil(t, m, "a CSRF token in %q", page)
		return m[1]
	}
	_, page := do(http.MethodGet, "/login", nil)
	resp, _ = do(http.MethodPost, "/login", url.Values{"csrf": {csrf(page)}, "name": {name}, "password": {"not-" + password}})
	// Every form is answered with a redirect (POST/Redirect/GET): a wrong password goes back
	// to the login form, with no session.
	assert.True(t, strings.HasPrefix(resp.Header.Get("Location"), "/login"), "a wrong password logs nobody in: %s", resp.Header.Get("Location"))
	for _, ck := range resp.Cookies() {
		assert.NotEqual(t, "extworker_console", ck.Name, "no session for a wrong password")
	}
	_, page = do(http.MethodGet, "/login", nil)
	resp, _ = do(http.MethodPost, "/login", url.Values{"csrf": {csrf(page)}, "name": {name}, "password": {password}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "the login")
	resp, page = do(http.MethodGet, "/", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, page, "Overview")
	assert.Contains(t, page, name, "the operator's name in the page")
}

// The same program exits 78 (ExitConfig) when the engine rejects its credentials, with
// what to check, and without the secret.
func TestUserModuleRejectedCredentials(t *testing.T) {
	testenv.AuthEngine(t)
	testenv.DB(t)
	bin := buildUserModule(t)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "EXTWORKER_ENGINE_URL="+testenv.AuthEngineURL(), "EXTWORKER_ENGINE_USER="+testenv.AuthEngineUser,
		"EXTWORKER_ENGINE_PASSWORD=wrong-s3cret", "EXTWORKER_DATABASE_URL="+testenv.DBURL(), "EXTWORKER_HTTP_ADDR=off")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "exit status expected, got %v: %s", err, out)
	assert.Equal(t, 78, ee.ExitCode(), "%s", out)
	assert.Contains(t, string(out), "rejected the credentials")
	assert.NotContains(t, string(out), "wrong-s3cret")
	assert.NotContains(t, string(out), "panic")
}

// inboxLines are the inbox's metric lines, for a failure message.
func inboxLines(metrics string) []string {
	var out []string
	for _, l := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(l, "extworker_inbox_messages_total") {
			out = append(out, l)
		}
	}
	return out
}
