package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/extworker/extworker/internal/digest"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

var migrateOnce sync.Once

// env is a migrated database, the real engine with two processes of the test's own, and
// a source name of its own (so its inbox rows are its own).
type env struct {
	pool   *pgxpool.Pool
	engine *admin.Client
	source string
	// ship is started by "shipment.requested" messages; wait waits for message "paid".
	ship, wait string
	paid       string
}

const procBPMN = `<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn"
  id="defs-%[1]s" targetNamespace="http://extworker.dev/test">
  <bpmn:message id="Msg_%[1]s" name="%[2]s"/>
  <bpmn:process id="%[3]s" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="s"/>
    <bpmn:sequenceFlow id="f0" sourceRef="s" targetRef="e"/>
    <bpmn:endEvent id="e"/>
  </bpmn:process>
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

func newEnv(t testing.TB) env {
	t.Helper()
	pool := testenv.DB(t)
	migrateOnce.Do(func() {
		_, err := migrations.Up(context.Background(), stdlib.OpenDBFromPool(pool))
		require.NoError(t, err)
	})
	e := env{pool: pool, engine: testenv.Engine(t), source: testenv.Unique("src")}
	e.wait, e.ship, e.paid = testenv.Unique("wait"), testenv.Unique("ship"), testenv.Unique("paid")
	ctx := testenv.Context(t, 30*time.Second)
	res, err := e.engine.Deploy(ctx, admin.Deployment{Name: e.wait, Resources: []admin.Resource{{Name: e.wait + ".bpmn",
		Content: []byte(fmt.Sprintf(procBPMN, e.wait, e.paid, e.ship))}}})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = e.engine.DeleteDeployment(ctx, res.ID, true)
	})
	return e
}

// payload is the test's message body: what the decide function reads.
type payload struct {
	Do          string `json:"do"` // "start" or "correlate"
	BusinessKey string `json:"bk"`
	Note        string `json:"note,omitempty"`
}

func (e env) decide(m inbox.Message) (inbox.Action, error) {
	var p payload
	if err := json.Unmarshal(m.Body, &p); err != nil {
		return inbox.Action{}, fmt.Errorf("body is not JSON: %w", err)
	}
	switch p.Do {
	case "start":
		return inbox.Action{Start: &inbox.Start{ProcessKey: e.ship, BusinessKey: p.BusinessKey}}, nil
	case "correlate":
		return inbox.Action{Correlate: &inbox.Correlate{ProcessDefinitionKey: e.wait, MessageName: e.paid, BusinessKey: p.BusinessKey,
			Variables: camunda7.Variables{"paidBy": camunda7.StringVar(m.ID)}}}, nil
	}
	return inbox.Action{}, fmt.Errorf("unknown instruction %q", p.Do)
}

func (e env) consumer(t *testing.T, cfg inbox.Config) *inbox.Consumer {
	t.Helper()
	if cfg.Source == "" {
		cfg.Source = e.source
	}
	if cfg.Queue == "" {
		cfg.Queue = testenv.Unique("q")
	}
	c, err := inbox.NewConsumer(e.pool, e.engine, testenv.AMQPURL(), e.decide, cfg)
	require.NoError(t, err)
	return c
}

// The tests' short in-flight window, and the timeout of the engine client that goes with
// it: NewConsumer refuses a window that does not exceed the client's timeout.
const (
	quickTimeout = time.Second
	quickWindow  = 1500 * time.Millisecond
)

// quickClient is a client of the engine at base whose requests time out after timeout
// (its long-poll margin is no longer: inbox.ClientTimeout is the longer of the two).
func quickClient(t testing.TB, base string, timeout time.Duration) *camunda7.Client {
	t.Helper()
	ec, err := camunda7.New(camunda7.Config{BaseURL: base, Timeout: timeout, LongPollMargin: timeout})
	require.NoError(t, err)
	return ec
}

func msg(id string, p payload) inbox.Message {
	b, _ := json.Marshal(p)
	return inbox.Message{ID: id, Type: "test." + p.Do, CorrelationID: "corr-" + id, Body: b}
}

func (e env) record(t *testing.T, id string) inbox.Record {
	t.Helper()
	rows, err := inbox.List(testenv.Context(t, 10*time.Second), e.pool, inbox.Filter{Source: e.source, MessageID: id})
	require.NoError(t, err)
	require.Len(t, rows, 1, "inbox row for %s", id)
	return rows[0]
}

// instances counts the instances (running or ended) of process key with business key.
func (e env) instances(t *testing.T, key, bk string) int {
	t.Helper()
	n, err := e.engine.HistoricProcessInstanceCount(testenv.Context(t, 10*time.Second),
		url.Values{"processDefinitionKey": {key}, "processInstanceBusinessKey": {bk}})
	require.NoError(t, err)
	return n
}

// correlations counts how often the instance with bk passed the message catch.
func (e env) correlations(t *testing.T, bk string) int {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	his, err := e.engine.HistoricProcessInstances(ctx, url.Values{"processDefinitionKey": {e.wait}, "processInstanceBusinessKey": {bk}})
	require.NoError(t, err)
	n := 0
	for _, h := range his {
		acts, err := e.engine.HistoricActivityInstances(ctx, url.Values{"processInstanceId": {h.ID}, "activityId": {"waitPaid"}, "finished": {"true"}})
		require.NoError(t, err)
		n += len(acts)
	}
	return n
}

func (e env) startWaiting(t *testing.T, bk string) string {
	t.Helper()
	pi, err := e.engine.StartProcess(testenv.Context(t, 10*time.Second), e.wait, admin.StartProcessRequest{BusinessKey: bk})
	require.NoError(t, err)
	return pi.ID
}

// TestEngineCorrelationMismatchMessage pins the engine's answer to a message nothing
// waits for, which the consumer tells from other refusals by its text.
func TestEngineCorrelationMismatchMessage(t *testing.T) {
	e := newEnv(t)
	err := e.engine.CorrelateMessage(testenv.Context(t, 10*time.Second), admin.MessageCorrelation{MessageName: e.paid, BusinessKey: "nobody"})
	var ee *camunda7.Error
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 400, ee.StatusCode)
	assert.Contains(t, ee.Message, "Cannot correlate message '"+e.paid+"'")
	t.Logf("engine: %d %s: %s", ee.StatusCode, ee.Type, ee.Message)

	// The consumer sends a message to an instance by its id (the engine's /message takes
	// no process definition): one that no longer waits gives the same answer.
	ctx := testenv.Context(t, 10*time.Second)
	bk := testenv.Unique("INV")
	pi := e.startWaiting(t, bk)
	require.NoError(t, e.engine.CorrelateMessage(ctx, admin.MessageCorrelation{MessageName: e.paid, BusinessKey: bk, ProcessInstanceID: pi}))
	err = e.engine.CorrelateMessage(ctx, admin.MessageCorrelation{MessageName: e.paid, BusinessKey: bk, ProcessInstanceID: pi})
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 400, ee.StatusCode)
	assert.Contains(t, ee.Message, "Cannot correlate message '"+e.paid+"'")
}

func TestStartOncePerMessageAndBusinessKey(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, inbox.Config{})
	ctx := testenv.Context(t, 30*time.Second)
	bk := testenv.Unique("INV")

	out, err := c.Handle(ctx, msg("m1", payload{Do: "start", BusinessKey: bk}))
	require.NoError(t, err)
	assert.Equal(t, inbox.Ack, out.Disposition)
	assert.Equal(t, inbox.ClassStarted, out.Class)
	assert.NotEmpty(t, out.ProcessInstanceID)

	// Redelivered: the inbox row answers, the engine is not asked.
	again, err := c.Handle(ctx, msg("m1", payload{Do: "start", BusinessKey: bk}))
	require.NoError(t, err)
	assert.Equal(t, inbox.Handling{Disposition: inbox.Ack, State: inbox.StateProcessed, Class: inbox.ClassDuplicate}, again)

	// The same fact announced again under a new message id (a replayed event): the
	// business key decides, nothing is started.
	replayed, err := c.Handle(ctx, msg("m1-replayed", payload{Do: "start", BusinessKey: bk}))
	require.NoError(t, err)
	assert.Equal(t, inbox.StateIgnoredDuplicate, replayed.State)
	assert.NotEqual(t, inbox.ClassStarted, replayed.Class)
	assert.Equal(t, out.ProcessInstanceID, replayed.ProcessInstanceID)

	assert.Equal(t, 1, e.instances(t, e.ship, bk), "instances with business key %s", bk)
	r := e.record(t, "m1")
	assert.Equal(t, inbox.StateProcessed, r.State)
	assert.Equal(t, 2, r.Deliveries)
	assert.Equal(t, 1, r.Duplicates)
	assert.Equal(t, "corr-m1", r.CorrelationID)
	assert.Equal(t, digest.Bytes(msg("m1", payload{Do: "start", BusinessKey: bk}).Body), r.BodyDigest)
	assert.Equal(t, out.ProcessInstanceID, r.ProcessInstanceID)
}

// TestParallelDeliveriesActOnce: the same message handed to eight consumers at once
// (two consumer processes each getting a redelivery, say) starts one instance.
func TestParallelDeliveriesActOnce(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t, 60*time.Second)
	for _, do := range []string{"start", "correlate"} {
		t.Run(do, func(t *testing.T) {
			bk := testenv.Unique("INV")
			if do == "correlate" {
				e.startWaiting(t, bk)
			}
			m := msg("par-"+bk, payload{Do: do, BusinessKey: bk})
			outs := make([]inbox.Handling, 8)
			var wg sync.WaitGroup
			for i := range outs {
				c := e.consumer(t, inbox.Config{}) // a consumer each, as in separate processes
				wg.Add(1)
				go func() {
					defer wg.Done()
					var err error
					outs[i], err = c.Handle(ctx, m)
					assert.NoError(t, err)
				}()
			}
			wg.Wait()
			acted, dup := 0, 0
			for _, o := range outs {
				if o.Class == inbox.ClassStarted || o.Class == inbox.ClassCorrelated {
					acted++
				}
				if o.Class == inbox.ClassDuplicate {
					dup++
				}
				assert.Equal(t, inbox.Ack, o.Disposition)
			}
			assert.Equal(t, 1, acted, "deliveries that acted")
			assert.Equal(t, 7, dup, "deliveries answered as duplicates")
			if do == "start" {
				assert.Equal(t, 1, e.instances(t, e.ship, bk))
			} else {
				assert.Equal(t, 1, e.correlations(t, bk))
			}
		})
	}
}

func TestCorrelateOnceThenLate(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, inbox.Config{})
	ctx := testenv.Context(t, 30*time.Second)
	bk := testenv.Unique("INV")
	pi := e.startWaiting(t, bk)

	out, err := c.Handle(ctx, msg("pay-1", payload{Do: "correlate", BusinessKey: bk}))
	require.NoError(t, err)
	assert.Equal(t, inbox.ClassCorrelated, out.Class)
	assert.Equal(t, pi, out.ProcessInstanceID)
	vars, err := e.engine.ProcessInstanceVariables(ctx, pi)
	require.NoError(t, err)
	paidBy, _ := vars.String("paidBy")
	assert.Equal(t, "pay-1", paidBy, "the message's variables reached the instance")

	dup, err := c.Handle(ctx, msg("pay-1", payload{Do: "correlate", BusinessKey: bk}))
	require.NoError(t, err)
	assert.Equal(t, inbox.ClassDuplicate, dup.Class)

	// Another payment for the same invoice, after the process moved on: late.
	late, err := c.Handle(ctx, msg("pay-2", payload{Do: "correlate", BusinessKey: bk, Note: "second"}))
	require.NoError(t, err)
	assert.Equal(t, inbox.Ack, late.Disposition)
	assert.Equal(t, inbox.ClassLate, late.Class)
	assert.Equal(t, inbox.StateIgnoredDuplicate, late.State)
	assert.Contains(t, late.Reason, "late: process instance "+pi)
	assert.Contains(t, late.Reason, e.source+"/pay-1")
	assert.Equal(t, 1, e.correlations(t, bk))
}

func TestEarlyMessageRetriedUntilTheProcessWaits(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, inbox.Config{BackoffInitial: 100 * time.Millisecond})
	ctx := testenv.Context(t, 30*time.Second)
	bk := testenv.Unique("INV")
	m := msg("early-1", payload{Do: "correlate", BusinessKey: bk})

	out, err := c.Handle(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, inbox.Retry, out.Disposition)
	assert.Equal(t, inbox.StateFailedRetryable, out.State)
	assert.Equal(t, 100*time.Millisecond, out.Delay)
	assert.Contains(t, out.Reason, "early: no process instance of "+e.wait+" with business key "+bk)

	again, err := c.Handle(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, 200*time.Millisecond, again.Delay, "backoff doubles")

	pi := e.startWaiting(t, bk)
	done, err := c.Handle(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, inbox.ClassCorrelated, done.Class)
	assert.Equal(t, pi, done.ProcessInstanceID)
	r := e.record(t, "early-1")
	assert.Equal(t, 3, r.Attempts)
	assert.Equal(t, inbox.StateProcessed, r.State)
}

func TestEarlyMessageParkedAfterItsWindow(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, inbox.Config{EarlyWindow: 50 * time.Millisecond})
	ctx := testenv.Context(t, 30*time.Second)
	m := msg("early-2", payload{Do: "correlate", BusinessKey: testenv.Unique("INV")})
	out, err := c.Handle(ctx, m)
	require.NoError(t, err)
	require.Equal(t, inbox.Retry, out.Disposition)
	testenv.Eventually(t, 10*time.Second, "the early window to pass", func() (bool, error) {
		return time.Since(e.record(t, "early-2").ReceivedAt) > 100*time.Millisecond, nil
	})
	out, err = c.Handle(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, inbox.Park, out.Disposition)
	assert.Equal(t, inbox.StateFailedFinal, out.State)
	assert.Contains(t, out.Reason, "past the window of 50ms")
	r := e.record(t, "early-2")
	assert.NotNil(t, r.ParkedAt)
	assert.Equal(t, out.Reason, r.Reason)
}

func TestConflictingBodyIsParkedNotActedOn(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, inbox.Config{})
	ctx := testenv.Context(t, 30*time.Second)
	bk, other := testenv.Unique("INV"), testenv.Unique("INV")
	_, err := c.Handle(ctx, msg("c-1", payload{Do: "start", BusinessKey: bk}))
	require.NoError(t, err)

	out, err := c.Handle(ctx, msg("c-1", payload{Do: "start", BusinessKey: other}))
	require.NoError(t, err)
	assert.Equal(t, inbox.Park, out.Disposition)
	assert.Equal(t, inbox.ClassConflict, out.Class)
	assert.Contains(t, out.Reason, "conflict: message id c-1")
	assert.Equal(t, 0, e.instances(t, e.ship, other), "the conflicting message started nothing")
	r := e.record(t, "c-1")
	assert.Equal(t, inbox.StateProcessed, r.State, "the consumed message's record is unchanged")
	assert.Equal(t, 1, r.Conflicts)
	parked, err := inbox.List(ctx, e.pool, inbox.Filter{Source: e.source, Parked: true})
	require.NoError(t, err)
	require.Len(t, parked, 1)
}

func TestUnreadableMessagesAreParked(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, inbox.Config{})
	ctx := testenv.Context(t, 30*time.Second)
	out, err := c.Handle(ctx, inbox.Message{ID: "bad-1", Body: []byte("not json")})
	require.NoError(t, err)
	assert.Equal(t, inbox.Park, out.Disposition)
	assert.Contains(t, out.Reason, "could not read the message: body is not JSON")

	out, err = c.Handle(ctx, inbox.Message{Body: []byte(`{"do":"start","bk":"x"}`)})
	require.NoError(t, err)
	assert.Equal(t, inbox.Park, out.Disposition)
	assert.Contains(t, out.Reason, "no message id")
	assert.Equal(t, 0, e.instances(t, e.ship, "x"))
}

// TestEngineDownIsRetriedNotParked: an engine that cannot be reached parks nothing; the
// message waits and is handled once the engine is back.
func TestEngineDownIsRetriedNotParked(t *testing.T) {
	e := newEnv(t)
	down, err := camunda7.New(camunda7.Config{BaseURL: "http://127.0.0.1:1/engine-rest"})
	require.NoError(t, err)
	c, err := inbox.NewConsumer(e.pool, admin.New(down), testenv.AMQPURL(), e.decide, inbox.Config{Source: e.source, Queue: "unused", EarlyWindow: time.Millisecond})
	require.NoError(t, err)
	ctx := testenv.Context(t, 30*time.Second)
	bk := testenv.Unique("INV")
	m := msg("down-1", payload{Do: "start", BusinessKey: bk})
	out, err := c.Handle(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, inbox.Retry, out.Disposition)
	assert.Equal(t, inbox.StateFailedRetryable, out.State)

	up := e.consumer(t, inbox.Config{})
	out, err = up.Handle(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, inbox.ClassStarted, out.Class)
	assert.Equal(t, 1, e.instances(t, e.ship, bk))
}

// TestPruneKeepsWhatIsNotSettled: settled rows past the retention go; parked ones stay;
// a message redelivered after its row went is still not acted on twice.
func TestPruneKeepsWhatIsNotSettled(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, inbox.Config{})
	ctx := testenv.Context(t, 30*time.Second)
	bk := testenv.Unique("INV")
	done := msg("old-done", payload{Do: "start", BusinessKey: bk})
	_, err := c.Handle(ctx, done)
	require.NoError(t, err)
	_, err = c.Handle(ctx, inbox.Message{ID: "old-parked", Body: []byte("?")})
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE extworker_inbox SET updated_at = now() - interval '40 days' WHERE source = $1`, e.source)
	require.NoError(t, err)

	n, err := inbox.Prune(ctx, e.pool, 30*24*time.Hour)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, n, int64(1))
	rows, err := inbox.List(ctx, e.pool, inbox.Filter{Source: e.source})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	assert.Equal(t, "old-parked", rows[0].MessageID)

	again, err := c.Handle(ctx, done)
	require.NoError(t, err)
	assert.NotEqual(t, inbox.ClassStarted, again.Class)
	assert.Equal(t, inbox.ClassReconciled, again.Class, "the instance's mark names this message: %s", again.Reason)
	assert.Equal(t, inbox.StateProcessed, again.State)
	assert.Equal(t, 1, e.instances(t, e.ship, bk))
}

// TestReopenParkedMessage: a parked message of a channel that keeps no copy (provider
// callbacks) goes back to received, and its next delivery is acted on; one not parked is
// not reopened.
func TestReopenParkedMessage(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, inbox.Config{Queue: inbox.CallbackChannel})
	ctx := testenv.Context(t, 30*time.Second)
	bk := testenv.Unique("INV")
	e.startWaiting(t, bk)
	bad := inbox.Message{ID: "cb-1", Body: []byte(`{"do":"correlate","bk":"` + bk + `"`)} // cut short: unreadable
	out, err := c.Handle(ctx, bad)
	require.NoError(t, err)
	require.Equal(t, inbox.StateFailedFinal, out.State)

	ok, err := inbox.Reopen(ctx, e.pool, e.source, "cb-1")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, inbox.StateReceived, e.record(t, "cb-1").State)
	again, err := inbox.Reopen(ctx, e.pool, e.source, "cb-1")
	require.NoError(t, err)
	assert.False(t, again, "a message not parked is not reopened")
	// The provider sends it again (the same body: a reopened row keeps its digest).
	out, err = c.Handle(ctx, bad)
	require.NoError(t, err)
	assert.Equal(t, inbox.StateFailedFinal, out.State, "acted on anew (and parked again: the body is still unreadable)")
	assert.Equal(t, 1, e.record(t, "cb-1").Replays)
}
