package callback_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/inbox/callback"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

var migrateOnce sync.Once

// waitBPMN is a process that waits for message %[2]s, then holds in a user task: an
// instance past the catch is still running (a callback for it then is late).
const waitBPMN = `<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn"
  id="defs-%[1]s" targetNamespace="http://extworker.dev/test">
  <bpmn:message id="Msg_%[1]s" name="%[2]s"/>
  <bpmn:process id="%[1]s" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="waitPaid"/>
    <bpmn:intermediateCatchEvent id="waitPaid"><bpmn:messageEventDefinition messageRef="Msg_%[1]s"/></bpmn:intermediateCatchEvent>
    <bpmn:sequenceFlow id="f2" sourceRef="waitPaid" targetRef="hold"/>
    <bpmn:userTask id="hold"/>
    <bpmn:sequenceFlow id="f3" sourceRef="hold" targetRef="end"/>
    <bpmn:endEvent id="end"/>
  </bpmn:process>
</bpmn:definitions>`

// env is a migrated database, the real engine with a waiting process of the test's own,
// a source of its own with two secrets (old and new: mid-rotation), and a Server
// mounted at /callbacks/{source}.
type env struct {
	pool             *pgxpool.Pool
	engine           *admin.Client
	source           string
	wait, paid       string
	oldText, newText string
	old, new         callback.Secret
	srv              *callback.Server
	url              string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{pool: testenv.DB(t), engine: testenv.Engine(t), source: testenv.Unique("cb"),
		wait: testenv.Unique("wait"), paid: testenv.Unique("paid")}
	migrateOnce.Do(func() {
		_, err := migrations.Up(context.Background(), stdlib.OpenDBFromPool(e.pool))
		require.NoError(t, err)
	})
	e.oldText, e.old = newSecret(t)
	e.newText, e.new = newSecret(t)
	ctx := testenv.Context(t, 30*time.Second)
	res, err := e.engine.Deploy(ctx, admin.Deployment{Name: e.wait, Resources: []admin.Resource{{Name: e.wait + ".bpmn",
		Content: fmt.Appendf(nil, waitBPMN, e.wait, e.paid)}}})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = e.engine.DeleteDeployment(ctx, res.ID, true)
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, table := range []string{"extworker_inbox_callbacks", "extworker_inbox", "extworker_inbox_conflicts"} {
			if _, err := e.pool.Exec(ctx, `DELETE FROM `+table+` WHERE source = $1`, e.source); err != nil {
				t.Logf("cleanup: delete source %s from %s: %v", e.source, table, err)
			}
		}
	})
	e.restart(t)
	return e
}

// restart gives the env a new inbox handler, Server and listener, as a worker that
// restarted has: nothing of the old one's memory is left.
func (e *env) restart(t *testing.T) {
	t.Helper()
	e.restartWith(t, inbox.Config{Source: e.source, BackoffInitial: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
}

// restartWith is restart with the inbox settings cfg.
func (e *env) restartWith(t *testing.T, cfg inbox.Config) {
	t.Helper()
	h, err := inbox.NewHandler(e.pool, e.engine, e.decide, cfg)
	require.NoError(t, err)
	e.srv, err = callback.New(e.pool, []callback.Source{{Handler: h, Secrets: []string{e.oldText, e.newText}}},
		callback.Config{PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/callbacks/{source}", e.srv)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	e.url = hs.URL + "/callbacks/" + e.source
}

// event is a test callback's body: "ping" is ignored, "payment.captured" correlates
// message paid to the instance of invoice.
type event struct {
	Type    string `json:"type"`
	Invoice string `json:"invoice,omitempty"`
	Note    string `json:"note,omitempty"`
}

func (e *env) decide(m inbox.Message) (inbox.Action, error) {
	var ev event
	if err := json.Unmarshal(m.Body, &ev); err != nil {
		return inbox.Action{}, fmt.Errorf("body is not JSON: %w", err)
	}
	if m.Type != "payment.captured" {
		return inbox.Action{Ignore: "not for this process: " + m.Type}, nil
	}
	return inbox.Action{Correlate: &inbox.Correlate{ProcessDefinitionKey: e.wait, MessageName: e.paid, BusinessKey: ev.Invoice}}, nil
}

func body(ev event) []byte {
	b, _ := json.Marshal(ev)
	return b
}

// signed is a callback request's headers, signed with s now.
func signed(s callback.Secret, id string, b []byte) http.Header {
	return signedAt(s, id, b, time.Now())
}

func signedAt(s callback.Secret, id string, b []byte, at time.Time) http.Header {
	ts := strconv.FormatInt(at.Unix(), 10)
	h := http.Header{}
	h.Set(callback.HeaderID, id)
	h.Set(callback.HeaderTimestamp, ts)
	h.Set(callback.HeaderSignature, callback.Sign(s, id, ts, b))
	return h
}

// reply is what the server answered.
type reply struct {
	status int
	body   string
}

func (e *env) post(t *testing.T, method string, h http.Header, b []byte) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(testenv.Context(t, 30*time.Second), method, e.url, bytes.NewReader(b))
	require.NoError(t, err)
	for k, v := range h {
		req.Header[k] = v
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	got, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return reply{res.StatusCode, string(got)}
}

func (e *env) send(t *testing.T, id string, b []byte) reply {
	t.Helper()
	return e.post(t, http.MethodPost, signed(e.new, id, b), b)
}

// rows returns the inbox rows of id (none or one).
func (e *env) rows(t *testing.T, id string) []inbox.Record {
	t.Helper()
	rs, err := inbox.List(testenv.Context(t, 10*time.Second), e.pool, inbox.Filter{Source: e.source, MessageID: id})
	require.NoError(t, err)
	return rs
}

// held counts the held bodies of id.
func (e *env) held(t *testing.T, id string) int {
	t.Helper()
	var n int
	require.NoError(t, e.pool.QueryRow(testenv.Context(t, 10*time.Second),
		`SELECT count(*) FROM extworker_inbox_callbacks WHERE source = $1 AND message_id = $2`, e.source, id).Scan(&n))
	return n
}

func (e *env) startWaiting(t *testing.T, invoice string) {
	t.Helper()
	_, err := e.engine.StartProcess(testenv.Context(t, 10*time.Second), e.wait, admin.StartProcessRequest{BusinessKey: invoice})
	require.NoError(t, err)
}

// correlations counts how often the instance of invoice passed the message catch.
func (e *env) correlations(t *testing.T, invoice string) int {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	his, err := e.engine.HistoricProcessInstances(ctx, url.Values{"processDefinitionKey": {e.wait}, "processInstanceBusinessKey": {invoice}})
	require.NoError(t, err)
	n := 0
	for _, h := range his {
		acts, err := e.engine.HistoricActivityInstances(ctx, url.Values{"processInstanceId": {h.ID}, "activityId": {"waitPaid"}, "finished": {"true"}})
		require.NoError(t, err)
		n += len(acts)
	}
	return n
}

func processed(id string) reply {
	return reply{http.StatusOK, `{"id":"` + id + `","state":"processed"}` + "\n"}
}

// TestSignature: a callback signed with either of the source's secrets (mid-rotation) is
// recorded and answered; one whose signature is missing, malformed, made with another
// secret, or stale, is answered 401 and leaves no inbox row; so are a GET (405) and a
// body over the cap (413).
func TestSignature(t *testing.T) {
	e := newEnv(t)
	_, stranger := newSecret(t)
	ping := body(event{Type: "ping"})
	stale := func(id string) http.Header { return signedAt(e.new, id, ping, time.Now().Add(-6*time.Minute)) }
	without := func(id, header string) http.Header { h := signed(e.new, id, ping); h.Del(header); return h }

	for _, tc := range []struct {
		name   string
		method string
		header func(id string) http.Header
		body   []byte
		status int
	}{
		{"the new secret", http.MethodPost, func(id string) http.Header { return signed(e.new, id, ping) }, ping, http.StatusOK},
		{"the old secret, still listed", http.MethodPost, func(id string) http.Header { return signed(e.old, id, ping) }, ping, http.StatusOK},
		{"a secret the source does not have", http.MethodPost, func(id string) http.Header { return signed(stranger, id, ping) }, ping, http.StatusUnauthorized},
		{"stale by six minutes", http.MethodPost, stale, ping, http.StatusUnauthorized},
		{"no webhook-id", http.MethodPost, func(id string) http.Header { return without(id, callback.HeaderID) }, ping, http.StatusUnauthorized},
		{"no webhook-timestamp", http.MethodPost, func(id string) http.Header { return without(id, callback.HeaderTimestamp) }, ping, http.StatusUnauthorized},
		{"no webhook-signature", http.MethodPost, func(id string) http.Header { return without(id, callback.HeaderSignature) }, ping, http.StatusUnauthorized},
		{"signed for another body", http.MethodPost, func(id string) http.Header { return signed(e.new, id, ping) }, body(event{Type: "ping", Note: "x"}), http.StatusUnauthorized},
		{"a GET, signed", http.MethodGet, func(id string) http.Header { return signed(e.new, id, nil) }, nil, http.StatusMethodNotAllowed},
		{"a body over 1 MiB, signed", http.MethodPost, func(id string) http.Header { return signed(e.new, id, big) }, big, http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := testenv.Unique("msg_")
			got := e.post(t, tc.method, tc.header(id), tc.body)
			assert.Equal(t, tc.status, got.status, got.body)
			if tc.status == http.StatusOK {
				assert.Equal(t, processed(id), got)
				assert.Len(t, e.rows(t, id), 1)
				return
			}
			assert.NotContains(t, got.body, id, "a refusal says no more than its status")
			assert.Empty(t, e.rows(t, id), "a refused callback leaves no inbox row")
			assert.Zero(t, e.held(t, id))
		})
	}
}

var big = bytes.Repeat([]byte("x"), callback.DefaultMaxBody+1)

// TestTenCopiesAtOnce: the same provider callback (the same id, body and signature) sent
// ten times at once reaches the waiting instance once, and all ten get the same answer,
// byte for byte.
func TestTenCopiesAtOnce(t *testing.T) {
	e := newEnv(t)
	invoice := testenv.Unique("INV-")
	e.startWaiting(t, invoice)
	id, b := testenv.Unique("msg_"), body(event{Type: "payment.captured", Invoice: invoice})
	h := signed(e.new, id, b)

	const copies = 10
	answers := make([]reply, copies)
	var wg sync.WaitGroup
	for i := range copies {
		wg.Go(func() { answers[i] = e.post(t, http.MethodPost, h, b) })
	}
	wg.Wait()
	for i, a := range answers {
		assert.Equal(t, processed(id), a, "copy %d", i)
	}
	assert.Equal(t, 1, e.correlations(t, invoice), "one correlation in the engine")
	rows := e.rows(t, id)
	require.Len(t, rows, 1)
	assert.Equal(t, copies, rows[0].Deliveries)
	assert.Equal(t, copies-1, rows[0].Duplicates)
	assert.Zero(t, e.held(t, id), "nothing held: it never waited")
}

// TestConflict: the id of a recorded callback with another body is answered 409, each
// time the same, and acts on nothing; the first body's row is as it was.
func TestConflict(t *testing.T) {
	e := newEnv(t)
	id := testenv.Unique("msg_")
	require.Equal(t, processed(id), e.send(t, id, body(event{Type: "ping"})))
	other := body(event{Type: "ping", Note: "another body"})
	first := e.send(t, id, other)
	assert.Equal(t, http.StatusConflict, first.status)
	assert.Equal(t, first, e.send(t, id, other), "the conflict answered the same again")
	rows := e.rows(t, id)
	require.Len(t, rows, 1)
	assert.Equal(t, inbox.StateProcessed, rows[0].State)
	assert.Equal(t, 2, rows[0].Conflicts)
	assert.Equal(t, processed(id), e.send(t, id, body(event{Type: "ping"})), "the first body still answered as before")
}

// TestEarlyThenCorrelated: a callback no instance waits for yet is answered 202 and its
// body held; once the instance waits, Run correlates it, once, and lets go of the body;
// the provider sending it again then gets 200, processed.
func TestEarlyThenCorrelated(t *testing.T) {
	e := newEnv(t)
	invoice := testenv.Unique("INV-")
	id, b := testenv.Unique("msg_"), body(event{Type: "payment.captured", Invoice: invoice})
	early := e.send(t, id, b)
	assert.Equal(t, reply{http.StatusAccepted, `{"id":"` + id + `","state":"failed_retryable"}` + "\n"}, early)
	assert.Equal(t, 1, e.held(t, id), "the body is held while it waits")
	assert.Equal(t, early, e.send(t, id, b), "sent again while it waits: the same answer")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	e.startWaiting(t, invoice)
	testenv.Eventually(t, 30*time.Second, "the held callback correlated", func() (bool, error) {
		rs := e.rows(t, id)
		return len(rs) == 1 && rs[0].State == inbox.StateProcessed, nil
	})
	// Run deletes the held body right after the row settles, in a statement of its own:
	// under load the test can see the settled row first (it did once in CI).
	testenv.Eventually(t, 30*time.Second, "the body let go of once the row settled", func() (bool, error) {
		return e.held(t, id) == 0, nil
	})
	assert.Equal(t, 1, e.correlations(t, invoice))
	assert.Equal(t, processed(id), e.send(t, id, b))
	assert.Equal(t, 1, e.correlations(t, invoice))
}

// TestLate: a callback for an instance that has moved past the wait state (another
// callback reached it) is answered 200, ignored_duplicate, and sends nothing.
func TestLate(t *testing.T) {
	e := newEnv(t)
	invoice := testenv.Unique("INV-")
	e.startWaiting(t, invoice)
	first := testenv.Unique("msg_")
	require.Equal(t, processed(first), e.send(t, first, body(event{Type: "payment.captured", Invoice: invoice})))
	late := testenv.Unique("msg_")
	b := body(event{Type: "payment.captured", Invoice: invoice, Note: "captured twice"})
	want := reply{http.StatusOK, `{"id":"` + late + `","state":"ignored_duplicate"}` + "\n"}
	assert.Equal(t, want, e.send(t, late, b))
	assert.Equal(t, want, e.send(t, late, b), "sent again: the same answer")
	assert.Equal(t, 1, e.correlations(t, invoice))
	assert.Zero(t, e.held(t, late))
}

// TestRestartAnswersTheSame: a worker that restarted (a new handler, Server and
// listener) answers a callback the old one took with the first answer's bytes.
func TestRestartAnswersTheSame(t *testing.T) {
	e := newEnv(t)
	invoice := testenv.Unique("INV-")
	e.startWaiting(t, invoice)
	id, b := testenv.Unique("msg_"), body(event{Type: "payment.captured", Invoice: invoice})
	h := signed(e.new, id, b)
	first := e.post(t, http.MethodPost, h, b)
	require.Equal(t, processed(id), first)
	e.restart(t)
	assert.Equal(t, first, e.post(t, http.MethodPost, h, b))
	assert.Equal(t, 1, e.correlations(t, invoice))
}

// TestParked: a callback Decide cannot read is parked: answered 200, failed_final (the
// provider sending it again cannot help), the same again, nothing held, and the inbox's
// reason is not in the answer.
func TestParked(t *testing.T) {
	e := newEnv(t)
	id, b := testenv.Unique("msg_"), []byte("not JSON at all")
	want := reply{http.StatusOK, `{"id":"` + id + `","state":"failed_final"}` + "\n"}
	assert.Equal(t, want, e.send(t, id, b))
	assert.Equal(t, want, e.send(t, id, b))
	rows := e.rows(t, id)
	require.Len(t, rows, 1)
	assert.Equal(t, inbox.StateFailedFinal, rows[0].State)
	assert.NotEmpty(t, rows[0].Reason, "the row says why")
	assert.Zero(t, e.held(t, id))
}

// TestUnstorableIDIsParked: a webhook-id PostgreSQL cannot store (not UTF-8) is the
// callback's fault, never an outage: parked, escaped, and answered 200 failed_final
// every time (it was answered 503 on every copy: letting go of its held body, which it
// never had, failed on the raw id).
func TestUnstorableIDIsParked(t *testing.T) {
	e := newEnv(t)
	id, b := "cb-\xff-"+testenv.Unique("x"), body(event{Type: "ping"})
	first := e.send(t, id, b)
	assert.Equal(t, http.StatusOK, first.status, first.body)
	assert.Contains(t, first.body, `"state":"failed_final"`)
	assert.Equal(t, first, e.send(t, id, b), "the same answer again")
	rows := e.rows(t, inbox.StoredID(id))
	require.Len(t, rows, 1)
	assert.Equal(t, inbox.StateFailedFinal, rows[0].State)
}

// TestManyEarlyCopiesDoNotDelayIt: twenty copies of an early callback at once, at the
// shipped backoff (1s doubling to 1m): once the instance waits, it is correlated within
// seconds (the copies had pushed its next try a minute away), once.
func TestManyEarlyCopiesDoNotDelayIt(t *testing.T) {
	e := newEnv(t)
	e.restartWith(t, inbox.Config{Source: e.source})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = e.srv.Run(ctx) }()
	invoice := testenv.Unique("INV")
	id, b := "evt-"+invoice, body(event{Type: "payment.captured", Invoice: invoice})
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() { assert.Equal(t, http.StatusAccepted, e.send(t, id, b).status) })
	}
	wg.Wait()
	e.startWaiting(t, invoice)
	began := time.Now()
	testenv.Eventually(t, 90*time.Second, "the early callback correlated", func() (bool, error) {
		rs := e.rows(t, id)
		return len(rs) == 1 && rs[0].State == inbox.StateProcessed, nil
	})
	t.Logf("correlated %v after the instance began waiting", time.Since(began).Round(100*time.Millisecond))
	assert.Less(t, time.Since(began), 10*time.Second, "its next try stayed within the backoff of Run's own takes")
	assert.Equal(t, 1, e.correlations(t, invoice))
}
