package inbox_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/extworker/extworker/internal/digest"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/testenv"
)

// The inbox at its edges: each test here was a report of an outside tester against the
// consumer, reproduced against the real database, engine and broker.

// proxyRule says what the network between a consumer and the engine does to the requests
// it matches; the others pass through.
type proxyRule struct {
	match func(*http.Request) bool
	// hold keeps a request until release is closed, then forwards it whatever became of
	// its sender (an engine that answers late).
	hold bool
	// drop does not forward it (the engine never sees it).
	drop bool
	// status and body, when status is set, replace the answer the sender gets.
	status int
	body   string
}

// engineProxy is a network in front of the real engine.
type engineProxy struct {
	url     string        // the engine's REST root through the proxy
	arrived chan struct{} // a held request arrived
	release chan struct{} // closed: held requests go on
	landed  chan struct{} // a held request was answered by the engine
}

func newEngineProxy(t *testing.T, rule proxyRule) *engineProxy {
	t.Helper()
	engine, err := url.Parse(testenv.EngineURL())
	require.NoError(t, err)
	p := &engineProxy{arrived: make(chan struct{}, 16), release: make(chan struct{}), landed: make(chan struct{}, 16)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body) // all of it, before the sender can go away
		if err != nil {
			return
		}
		matched := rule.match(r)
		if matched && rule.hold {
			p.arrived <- struct{}{}
			<-p.release
		}
		status, answer, header := rule.status, []byte(rule.body), http.Header{"Content-Type": {"application/json"}}
		if !matched || !rule.drop {
			status, answer, header = forward(r, engine, body)
		}
		if matched && rule.hold {
			p.landed <- struct{}{}
		}
		if matched && rule.status != 0 {
			status, answer = rule.status, []byte(rule.body)
		}
		for k, v := range header {
			w.Header()[k] = v
		}
		w.WriteHeader(status)
		_, _ = w.Write(answer)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-p.release:
		default:
			close(p.release)
		}
	})
	p.url = srv.URL + engine.Path
	return p
}

// forward sends r (with body) to the engine, on a context of its own.
func forward(r *http.Request, engine *url.URL, body []byte) (int, []byte, http.Header) {
	u := *r.URL
	u.Scheme, u.Host = engine.Scheme, engine.Host
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, r.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return http.StatusBadGateway, nil, nil
	}
	req.Header = r.Header.Clone()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return http.StatusBadGateway, nil, nil
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(res.Body)
	return res.StatusCode, out, res.Header
}

// within waits for ch, for at most 30s.
func within(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out after 30s waiting for %s", what)
	}
}

func posts(suffix string) func(*http.Request) bool {
	return func(r *http.Request) bool {
		return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, suffix)
	}
}

// consumerVia is a consumer of e's source whose engine is at base.
func (e env) consumerVia(t *testing.T, base string, timeout time.Duration, cfg inbox.Config) *inbox.Consumer {
	t.Helper()
	ec := quickClient(t, base, timeout)
	cfg.Source = e.source
	if cfg.Queue == "" {
		cfg.Queue = "unused"
	}
	c, err := inbox.NewConsumer(e.pool, admin.New(ec), testenv.AMQPURL(), e.decide, cfg)
	require.NoError(t, err)
	return c
}

// handleUntil hands m to c until done says so (a retried message comes back), and returns
// the last outcome.
func handleUntil(t *testing.T, c *inbox.Consumer, m inbox.Message, what string, done func(inbox.Handling) bool) inbox.Handling {
	t.Helper()
	var out inbox.Handling
	testenv.Eventually(t, 30*time.Second, what, func() (bool, error) {
		var err error
		out, err = c.Handle(context.Background(), m)
		return err == nil && done(out), err
	})
	return out
}

// TestEarlyNotLateWhenAnotherDefinitionEndedWithTheKey: an instance of another process
// definition with the same business key has ended. The message is early for its own
// process (none waits yet), not late: it is retried, and correlated once its instance
// waits.
func TestEarlyNotLateWhenAnotherDefinitionEndedWithTheKey(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, inbox.Config{BackoffInitial: 100 * time.Millisecond})
	ctx := testenv.Context(t, 30*time.Second)
	bk := testenv.Unique("INV")
	other, err := e.engine.StartProcess(ctx, e.ship, admin.StartProcessRequest{BusinessKey: bk}) // ends at once
	require.NoError(t, err)
	require.Equal(t, 1, e.instances(t, e.ship, bk))

	m := msg("early-"+bk, payload{Do: "correlate", BusinessKey: bk})
	out, err := c.Handle(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, inbox.Retry, out.Disposition, "reason: %s", out.Reason)
	assert.Equal(t, inbox.ClassEarly, out.Class)
	assert.NotEqual(t, inbox.ClassLate, out.Class)
	assert.Equal(t, inbox.StateFailedRetryable, out.State)
	assert.NotContains(t, out.Reason, other.ID)

	pi := e.startWaiting(t, bk)
	done, err := c.Handle(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, inbox.ClassCorrelated, done.Class, "reason: %s", done.Reason)
	assert.Equal(t, pi, done.ProcessInstanceID)
	assert.Equal(t, 1, e.correlations(t, bk))
}

// TestCorrelateNeedsItsProcessDefinition: a Correlate that does not name its process
// definition is parked with a reason that says so; nothing is sent to the engine.
func TestCorrelateNeedsItsProcessDefinition(t *testing.T) {
	e := newEnv(t)
	bk := testenv.Unique("INV")
	e.startWaiting(t, bk)
	c, err := inbox.NewConsumer(e.pool, e.engine, testenv.AMQPURL(), func(inbox.Message) (inbox.Action, error) {
		return inbox.Action{Correlate: &inbox.Correlate{MessageName: e.paid, BusinessKey: bk}}, nil
	}, inbox.Config{Source: e.source, Queue: "unused"})
	require.NoError(t, err)
	out, err := c.Handle(testenv.Context(t, 30*time.Second), inbox.Message{ID: "no-def", Body: []byte("{}")})
	require.NoError(t, err)
	assert.Equal(t, inbox.Park, out.Disposition)
	assert.Contains(t, out.Reason, "ProcessDefinitionKey")
	assert.Equal(t, 0, e.correlations(t, bk))
}

// TestUnstorableFieldsAreParked: a message whose id, type or correlation id (or the
// business key its Decide takes from the body) PostgreSQL cannot store as text (invalid
// UTF-8, NUL) is parked with the reason, under an escaped id, visible in the list and
// counted; its redelivery is a duplicate, not another round.
func TestUnstorableFieldsAreParked(t *testing.T) {
	e := newEnv(t)
	raw := func(m inbox.Message) (inbox.Action, error) {
		return inbox.Action{Start: &inbox.Start{ProcessKey: e.ship, BusinessKey: string(m.Body)}}, nil
	}
	c, err := inbox.NewConsumer(e.pool, e.engine, testenv.AMQPURL(), raw, inbox.Config{Source: e.source, Queue: "unused"})
	require.NoError(t, err)
	ctx := testenv.Context(t, 60*time.Second)
	for _, tc := range []struct {
		name   string
		m      inbox.Message
		stored string // the row's message id
		reason string
	}{
		{"invalid UTF-8 id", inbox.Message{ID: "bad-\xff", Body: []byte("BK-1")}, "hex:6261642dff", "message id"},
		{"NUL in id", inbox.Message{ID: "a\x00b", Body: []byte("BK-2")}, "hex:610062", "message id"},
		{"invalid type", inbox.Message{ID: "typ-1", Type: "t\xfe", Body: []byte("BK-3")}, "typ-1", "type"},
		{"NUL in correlation id", inbox.Message{ID: "corr-1", CorrelationID: "c\x00", Body: []byte("BK-4")}, "corr-1", "correlation id"},
		{"NUL in business key", inbox.Message{ID: "bk-nul", Body: []byte("A\x00B")}, "bk-nul", "business key"},
		{"invalid business key", inbox.Message{ID: "bk-bad", Body: []byte("A\xc3")}, "bk-bad", "business key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := c.Handle(ctx, tc.m)
			require.NoError(t, err, "the database refused the message: an outage to the consumer, which retries it forever")
			assert.Equal(t, inbox.Park, out.Disposition)
			assert.Equal(t, inbox.StateFailedFinal, out.State)
			assert.Contains(t, out.Reason, tc.reason)
			rows, err := inbox.List(ctx, e.pool, inbox.Filter{Source: e.source, MessageID: tc.stored})
			require.NoError(t, err)
			require.Len(t, rows, 1, "a row under %q", tc.stored)
			assert.Equal(t, inbox.StateFailedFinal, rows[0].State)
			assert.Equal(t, out.Reason, rows[0].Reason)
			again, err := c.Handle(ctx, tc.m)
			require.NoError(t, err)
			assert.Equal(t, inbox.ClassDuplicate, again.Class, "the redelivery is a duplicate")
		})
	}
	p, err := inbox.ReadParked(ctx, e.pool, e.source)
	require.NoError(t, err)
	assert.Equal(t, 6, p.Messages)
	assert.Equal(t, int64(6), c.Stats().Parked.Load())
	assert.Zero(t, c.Stats().Started.Load())
}

// TestSecondMessageDoesNotStartASecondInstance: message a's start reaches the engine
// late, after a's consumer gave up waiting for the answer; message b, another id with
// the same business key, comes meanwhile. b must not start a second instance: it waits
// until a's start can no longer land, then finds a's instance.
func TestSecondMessageDoesNotStartASecondInstance(t *testing.T) {
	e := newEnv(t)
	bk := testenv.Unique("INV")
	p := newEngineProxy(t, proxyRule{match: posts("/start"), hold: true})
	cfg := inbox.Config{InFlightWindow: 3 * time.Second, BackoffInitial: 50 * time.Millisecond}
	ca := e.consumerVia(t, p.url, time.Second, cfg)
	a, b := msg("a-"+bk, payload{Do: "start", BusinessKey: bk}), msg("b-"+bk, payload{Do: "start", BusinessKey: bk})

	out, err := ca.Handle(testenv.Context(t, 30*time.Second), a)
	require.NoError(t, err)
	require.Equal(t, inbox.Retry, out.Disposition)
	require.Equal(t, inbox.StateUnknown, out.State, "a's answer was lost: %s", out.Reason)
	within(t, p.arrived, "a's start to reach the network")

	cb := e.consumerVia(t, testenv.EngineURL(), 2*time.Second, cfg)
	first, err := cb.Handle(testenv.Context(t, 30*time.Second), b)
	require.NoError(t, err)
	assert.NotEqual(t, inbox.ClassStarted, first.Class, "b started an instance while a's start was in flight")
	close(p.release)
	within(t, p.landed, "a's start to land at the engine")

	bOut := handleUntil(t, cb, b, "b settled", func(o inbox.Handling) bool { return o.Disposition != inbox.Retry })
	aOut := handleUntil(t, ca, a, "a settled", func(o inbox.Handling) bool { return o.Disposition != inbox.Retry })
	assert.Equal(t, 1, e.instances(t, e.ship, bk), "instances with business key %s", bk)
	assert.Equal(t, inbox.StateIgnoredDuplicate, bOut.State, "b: %s", bOut.Reason)
	assert.NotEqual(t, inbox.ClassStarted, bOut.Class)
	assert.Equal(t, inbox.StateProcessed, aOut.State, "a: %s", aOut.Reason)
	assert.Equal(t, inbox.ClassReconciled, aOut.Class, "a: %s", aOut.Reason)
	assert.Equal(t, aOut.ProcessInstanceID, bOut.ProcessInstanceID)
}

// loopBPMN waits for its message again each time it takes it.
const loopBPMN = `<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn"
  id="defs-%[1]s" targetNamespace="http://extworker.dev/test">
  <bpmn:message id="Msg_%[1]s" name="%[2]s"/>
  <bpmn:process id="%[1]s" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="join"/>
    <bpmn:exclusiveGateway id="join"/>
    <bpmn:sequenceFlow id="f2" sourceRef="join" targetRef="waitPaid"/>
    <bpmn:intermediateCatchEvent id="waitPaid"><bpmn:messageEventDefinition messageRef="Msg_%[1]s"/></bpmn:intermediateCatchEvent>
    <bpmn:sequenceFlow id="f3" sourceRef="waitPaid" targetRef="join"/>
  </bpmn:process>
</bpmn:definitions>`

// TestUnknownOutcomeSurvivesRetryableFailures: a correlation's answer is lost (the
// engine took it); the next attempt cannot reach the engine to ask. The attempt after
// that must still ask before it sends: the process waits for the same message again, so
// sending it again would be taken a second time.
func TestUnknownOutcomeSurvivesRetryableFailures(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, 60*time.Second)
	loop := testenv.Unique("loop")
	res, err := e.engine.Deploy(ctx, admin.Deployment{Name: loop, Resources: []admin.Resource{{Name: loop + ".bpmn",
		Content: []byte(fmt.Sprintf(loopBPMN, loop, e.paid))}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.engine.DeleteDeployment(context.Background(), res.ID, true) })
	decide := func(m inbox.Message) (inbox.Action, error) {
		return inbox.Action{Correlate: &inbox.Correlate{ProcessDefinitionKey: loop, MessageName: e.paid, BusinessKey: string(m.Body)}}, nil
	}
	consumer := func(base string) *inbox.Consumer {
		c, err := inbox.NewConsumer(e.pool, admin.New(quickClient(t, base, quickTimeout)), testenv.AMQPURL(), decide,
			inbox.Config{Source: e.source, Queue: "unused", InFlightWindow: quickWindow})
		require.NoError(t, err)
		return c
	}
	bk := testenv.Unique("INV")
	pi, err := e.engine.StartProcess(ctx, loop, admin.StartProcessRequest{BusinessKey: bk})
	require.NoError(t, err)
	m := inbox.Message{ID: "loop-" + bk, Body: []byte(bk)}

	lost := newEngineProxy(t, proxyRule{match: posts("/message"), status: http.StatusBadGateway, body: "<html>bad gateway</html>"})
	out, err := consumer(lost.url).Handle(ctx, m)
	require.NoError(t, err)
	require.Equal(t, inbox.StateUnknown, out.State, out.Reason)

	time.Sleep(quickWindow) // the lost request can no longer land: the next attempt asks
	out, err = consumer("http://127.0.0.1:1/engine-rest").Handle(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, inbox.Retry, out.Disposition)
	assert.Equal(t, inbox.StateUnknown, out.State, "the engine unreachable: the outcome is still unknown (%s)", out.Reason)

	time.Sleep(quickWindow)
	out, err = consumer(testenv.EngineURL()).Handle(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, inbox.ClassReconciled, out.Class, "asked the engine first: %s", out.Reason)
	assert.NotEqual(t, inbox.ClassCorrelated, out.Class)
	acts, err := e.engine.HistoricActivityInstances(ctx, url.Values{"processInstanceId": {pi.ID}, "activityId": {"waitPaid"}, "finished": {"true"}})
	require.NoError(t, err)
	assert.Len(t, acts, 1, "the message was taken once")
}

// engine500 is the engine's answer to a business key its database cannot store.
const engine500 = `{"type":"ProcessEngineException","message":"ENGINE-03004 Exception while executing Database Operation 'INSERT ExecutionEntity[x]' with message 'value too long for type character varying(255)'. Flush summary: ...","code":0}`

// TestEngineFailuresAreParkedAfterALimit: an engine that answers 500 to a message each
// time (a failure of its own that will not go away) parks it after
// inbox.DefaultMaxEngineFailures attempts, instead of retrying it forever.
func TestEngineFailuresAreParkedAfterALimit(t *testing.T) {
	e := newEnv(t)
	p := newEngineProxy(t, proxyRule{match: posts("/start"), drop: true, status: http.StatusInternalServerError, body: engine500})
	c := e.consumerVia(t, p.url, quickTimeout, inbox.Config{InFlightWindow: quickWindow, BackoffInitial: time.Millisecond})
	ctx := testenv.Context(t, 60*time.Second)
	m := msg("fail-"+testenv.Unique("x"), payload{Do: "start", BusinessKey: testenv.Unique("INV")})
	var out inbox.Handling
	for i := 1; i <= 20 && out.Disposition != inbox.Park; i++ {
		// Each failure leaves an outcome to reconcile: the next attempt waits out the
		// in-flight window (as the retry queue would hold the message) before it asks.
		time.Sleep(out.Delay)
		var err error
		out, err = c.Handle(ctx, m)
		require.NoError(t, err)
		if out.Disposition != inbox.Park {
			require.Equal(t, inbox.Retry, out.Disposition, "delivery %d: %s", i, out.Reason)
		}
	}
	assert.Equal(t, inbox.Park, out.Disposition, out.Reason)
	assert.Equal(t, inbox.StateFailedFinal, out.State)
	assert.Contains(t, out.Reason, "ENGINE-03004")
	assert.Equal(t, inbox.DefaultMaxEngineFailures, e.record(t, m.ID).EngineFailures, "parked at the limit's failure")
}

// TestOverlongBusinessKeyIsParkedAtOnce: a business key longer than the engine can store
// (255 characters) is parked at its first delivery, without asking the engine.
func TestOverlongBusinessKeyIsParkedAtOnce(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, inbox.Config{})
	bk := strings.Repeat("k", 300)
	out, err := c.Handle(testenv.Context(t, 30*time.Second), msg("long-"+testenv.Unique("x"), payload{Do: "start", BusinessKey: bk}))
	require.NoError(t, err)
	assert.Equal(t, inbox.Park, out.Disposition, out.Reason)
	assert.Contains(t, out.Reason, "255")
	assert.Equal(t, 0, e.instances(t, e.ship, bk))
}

// lockedBuffer is a log sink for a consumer's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestEveryParkLogsAWarning: each parked message is a WARN record, a conflicting copy
// among them, with its id escaped and without its body or business key.
func TestEveryParkLogsAWarning(t *testing.T) {
	e := newEnv(t)
	var logs lockedBuffer
	c := e.consumer(t, inbox.Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	ctx := testenv.Context(t, 30*time.Second)
	bk, other := testenv.Unique("SECRET"), testenv.Unique("SECRET")
	id := "conflict-\u202e" + testenv.Unique("x")
	_, err := c.Handle(ctx, msg(id, payload{Do: "start", BusinessKey: bk}))
	require.NoError(t, err)
	out, err := c.Handle(ctx, msg(id, payload{Do: "start", BusinessKey: other}))
	require.NoError(t, err)
	require.Equal(t, inbox.ClassConflict, out.Class)
	_, err = c.Handle(ctx, inbox.Message{ID: "unreadable", Body: []byte("SECRET-body")})
	require.NoError(t, err)

	var warns []string
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(l, `"level":"WARN"`) {
			warns = append(warns, l)
		}
	}
	require.Len(t, warns, 2, "one WARN a parked message:\n%s", logs.String())
	assert.Contains(t, warns[0], `\\u202e`, "the id escaped")
	assert.Contains(t, warns[0], "conflict")
	for _, l := range strings.Split(logs.String(), "\n") {
		assert.NotContains(t, l, "SECRET", "no business key or body in the log")
		assert.NotContains(t, l, "\u202e", "no raw bidi override in the log")
	}
}

// TestEarlyWindowOnTheDatabaseClock: the early window is measured on the database's
// clock, against the row's first-seen time, not on the worker's. Here the database's
// clock is an hour ahead of the worker's (a now() of its own, in a schema first on the
// consumer's search_path): the window of an early message still passes, and it is parked.
func TestEarlyWindowOnTheDatabaseClock(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, 30*time.Second)
	schema := strings.ReplaceAll(testenv.Unique("skew"), "-", "_")
	_, err := e.pool.Exec(ctx, `CREATE SCHEMA `+schema+`;
		CREATE FUNCTION `+schema+`.now() RETURNS timestamptz LANGUAGE sql STABLE AS $$ SELECT pg_catalog.now() + interval '1 hour' $$`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = e.pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`) })
	pc, err := pgxpool.ParseConfig(testenv.DBURL())
	require.NoError(t, err)
	pc.ConnConfig.RuntimeParams["search_path"] = schema + ", pg_catalog, public"
	skewed, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	t.Cleanup(skewed.Close)
	c, err := inbox.NewConsumer(skewed, e.engine, testenv.AMQPURL(), e.decide,
		inbox.Config{Source: e.source, Queue: "unused", EarlyWindow: 200 * time.Millisecond, BackoffInitial: 10 * time.Millisecond})
	require.NoError(t, err)
	m := msg("skew-"+testenv.Unique("x"), payload{Do: "correlate", BusinessKey: testenv.Unique("INV")})
	out, err := c.Handle(ctx, m)
	require.NoError(t, err)
	require.Equal(t, inbox.Retry, out.Disposition, out.Reason)
	// The row was first seen now by the database's clock (an hour ahead of the worker's).
	_, err = skewed.Exec(ctx, `UPDATE extworker_inbox SET received_at = now() WHERE source = $1`, e.source)
	require.NoError(t, err)
	out = handleUntil(t, c, m, "the early message parked once its window passed", func(o inbox.Handling) bool { return o.Disposition == inbox.Park })
	assert.Contains(t, out.Reason, "past the window of 200ms")
}

// TestCopiesOfAWaitingMessageShareOneRetryChain: a producer sends an early message twice.
// The second copy finds the first waiting in the retry queue and is acknowledged as a
// duplicate: one copy of the message waits, not one a delivery.
func TestCopiesOfAWaitingMessageShareOneRetryChain(t *testing.T) {
	e := newEnv(t)
	b := newBroker(t)
	c := e.consumer(t, inbox.Config{Queue: b.queue, BackoffInitial: 20 * time.Second, BackoffMax: 20 * time.Second, Concurrency: 1})
	run(t, c)
	bk := testenv.Unique("INV")
	m := msg("twice-early-"+bk, payload{Do: "correlate", BusinessKey: bk})
	b.publish(t, m)
	b.publish(t, m)
	testenv.Eventually(t, 30*time.Second, "both copies handled", func() (bool, error) {
		st := c.Stats()
		return st.Retried.Load()+st.Duplicates.Load() == 2, nil
	})
	q, err := b.ch.QueueDeclarePassive(inbox.RetryQueue(b.queue), true, false, false, false, nil)
	require.NoError(t, err)
	assert.Equal(t, 1, q.Messages, "copies waiting in the retry queue")
	assert.Equal(t, int64(1), c.Stats().Retried.Load())
	assert.Equal(t, int64(1), c.Stats().Duplicates.Load())
	r := e.record(t, m.ID)
	assert.Equal(t, inbox.StateFailedRetryable, r.State)
	assert.Equal(t, 1, r.Duplicates)
}

// TestInFlightWindowMustExceedTheClientTimeout: a window that does not exceed the engine
// client's timeout is refused, naming both; left zero, it is made longer than the
// client's timeout.
func TestInFlightWindowMustExceedTheClientTimeout(t *testing.T) {
	pool := testenv.DB(t)
	ec, err := camunda7.New(camunda7.Config{BaseURL: testenv.EngineURL(), Timeout: 2 * time.Minute})
	require.NoError(t, err)
	decide := func(inbox.Message) (inbox.Action, error) { return inbox.Action{Ignore: "x"}, nil }
	for _, w := range []time.Duration{time.Millisecond, time.Minute, 2 * time.Minute} {
		_, err := inbox.NewConsumer(pool, admin.New(ec), testenv.AMQPURL(), decide, inbox.Config{Source: "s", Queue: "q", InFlightWindow: w})
		require.Error(t, err, "InFlightWindow %v with a client timeout of 2m", w)
		assert.Contains(t, err.Error(), "InFlightWindow "+w.String())
		assert.Contains(t, err.Error(), "2m0s")
	}
	for _, w := range []time.Duration{0, 2*time.Minute + time.Second} {
		_, err := inbox.NewConsumer(pool, admin.New(ec), testenv.AMQPURL(), decide, inbox.Config{Source: "s", Queue: "q", InFlightWindow: w})
		assert.NoError(t, err, "InFlightWindow %v", w)
	}
}

// TestStartFindsTwoInstancesOfItsBusinessKey: two instances of the definition with the
// business key exist (a start that reached the engine after InFlightWindow, say). A start
// message for the key finds them: nothing is started or cancelled, and the inbox says so
// (a WARN, without the business key, and Stats.DuplicateStarts).
func TestStartFindsTwoInstancesOfItsBusinessKey(t *testing.T) {
	for _, tc := range []struct{ name, process string }{{"ended", "ship"}, {"running", "wait"}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			process := map[string]string{"ship": e.ship, "wait": e.wait}[tc.process]
			ctx := testenv.Context(t, 30*time.Second)
			bk := testenv.Unique("SECRET")
			for range 2 {
				_, err := e.engine.StartProcess(ctx, process, admin.StartProcessRequest{BusinessKey: bk})
				require.NoError(t, err)
			}
			var logs lockedBuffer
			c, err := inbox.NewConsumer(e.pool, e.engine, testenv.AMQPURL(), func(inbox.Message) (inbox.Action, error) {
				return inbox.Action{Start: &inbox.Start{ProcessKey: process, BusinessKey: bk}}, nil
			}, inbox.Config{Source: e.source, Queue: "unused", Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
			require.NoError(t, err)
			out, err := c.Handle(ctx, inbox.Message{ID: testenv.Unique("start"), Body: []byte("{}")})
			require.NoError(t, err)
			assert.Equal(t, inbox.StateIgnoredDuplicate, out.State, out.Reason)
			assert.NotEqual(t, inbox.ClassStarted, out.Class)
			assert.Equal(t, 2, e.instances(t, process, bk), "nothing started, nothing cancelled")
			assert.Equal(t, int64(1), c.Stats().DuplicateStarts.Load())
			assert.Contains(t, logs.String(), `"level":"WARN"`)
			assert.Contains(t, logs.String(), "more than one process instance")
			assert.Contains(t, logs.String(), `"instances":2`)
			assert.NotContains(t, logs.String(), "SECRET", "no business key in the log")
		})
	}
}

// TestExplicitSHA256IDIsNotTheIDOfAMessageWithoutOne: a message without an id is
// recorded under "sha256:" and its body's digest. A message that carries exactly that
// text as its own id is another message: it is acted on, not acknowledged as a
// duplicate of the parked one.
func TestExplicitSHA256IDIsNotTheIDOfAMessageWithoutOne(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, inbox.Config{})
	ctx := testenv.Context(t, 30*time.Second)
	bk := testenv.Unique("INV")
	noID := msg("", payload{Do: "start", BusinessKey: bk})
	out, err := c.Handle(ctx, noID)
	require.NoError(t, err)
	require.Equal(t, inbox.Park, out.Disposition, out.Reason)
	derived := "sha256:" + digest.Bytes(noID.Body)
	require.Equal(t, inbox.StateFailedFinal, e.record(t, derived).State)

	withID := noID
	withID.ID = derived
	out, err = c.Handle(ctx, withID)
	require.NoError(t, err)
	assert.NotEqual(t, inbox.ClassDuplicate, out.Class, "acknowledged as the message without an id: %s", out.Reason)
	assert.Equal(t, inbox.ClassStarted, out.Class, out.Reason)
	assert.Equal(t, 1, e.instances(t, e.ship, bk))
	assert.NotEqual(t, derived, inbox.StoredID(derived))
	assert.Equal(t, inbox.StateProcessed, e.record(t, inbox.StoredID(derived)).State)
	assert.Equal(t, inbox.StateFailedFinal, e.record(t, derived).State, "the message without an id stays parked")
}

// TestDuplicateFromAnotherQueueDoesNotMoveTheRow: a message parked from one queue, then
// delivered again from another queue of the same source (a duplicate), keeps the queue
// its parked copy waits in; a delivery that acts on the message records its own queue.
func TestDuplicateFromAnotherQueueDoesNotMoveTheRow(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, 30*time.Second)
	qa, qb := testenv.Unique("qa"), testenv.Unique("qb")
	a, b := e.consumer(t, inbox.Config{Queue: qa}), e.consumer(t, inbox.Config{Queue: qb})
	parked := inbox.Message{ID: testenv.Unique("parked"), Body: []byte("not json")}
	out, err := a.Handle(ctx, parked)
	require.NoError(t, err)
	require.Equal(t, inbox.Park, out.Disposition)
	out, err = b.Handle(ctx, parked)
	require.NoError(t, err)
	require.Equal(t, inbox.ClassDuplicate, out.Class)
	assert.Equal(t, qa, e.record(t, parked.ID).Queue, "the queue whose dead-letter queue holds the parked copy")

	early := msg(testenv.Unique("early"), payload{Do: "correlate", BusinessKey: testenv.Unique("INV")})
	out, err = a.Handle(ctx, early)
	require.NoError(t, err)
	require.Equal(t, inbox.Retry, out.Disposition)
	out, err = b.Handle(ctx, early) // acted on again from qb: its copies now go through qb's queues
	require.NoError(t, err)
	require.NotEqual(t, inbox.ClassDuplicate, out.Class, out.Reason)
	assert.Equal(t, qb, e.record(t, early.ID).Queue)
}
