package extworker_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/inbox/callback"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/kafkarec"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
	"github.com/extworker/extworker/outbox"
)

const waitBPMN = `<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" xmlns:camunda="http://camunda.org/schema/1.0/bpmn"
  id="defs-%[1]s" targetNamespace="http://extworker.dev/test">
  <bpmn:message id="Msg_%[1]s" name="%[1]s.paid"/>
  <bpmn:process id="%[1]s" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="waitPaid"/>
    <bpmn:intermediateCatchEvent id="waitPaid"><bpmn:messageEventDefinition messageRef="Msg_%[1]s"/></bpmn:intermediateCatchEvent>
    <bpmn:sequenceFlow id="f2" sourceRef="waitPaid" targetRef="end"/>
    <bpmn:endEvent id="end"/>
  </bpmn:process>
</bpmn:definitions>`

// Through the entry point, configured by the environment as a user configures it: a
// Kafka topic and provider callbacks each correlate their message once, and the outbox's
// relay publishes to Kafka (EXTWORKER_OUTBOX_BROKER=kafka).
func TestAppKafkaAndCallbacks(t *testing.T) {
	c := testenv.Engine(t)
	pool := testenv.DB(t)
	brokers := testenv.Kafka(t)
	ctx := testenv.Context(t, 3*time.Minute)
	_, err := migrations.Up(ctx, stdlib.OpenDBFromPool(pool))
	require.NoError(t, err)
	key := testenv.Unique("wait")
	_, err = c.Deploy(ctx, admin.Deployment{Name: key, Resources: []admin.Resource{{Name: key + ".bpmn", Content: fmt.Appendf(nil, waitBPMN, key)}}})
	require.NoError(t, err)
	topic, events, source, ns := testenv.Unique("payments"), testenv.Unique("events"), testenv.Unique("psp"), testenv.Unique("ns")
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("a key of thirty-two bytes, or so"))
	addr := testenv.FreeAddr(t)
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	t.Setenv("EXTWORKER_LEDGER_NAMESPACE", ns)
	t.Setenv("EXTWORKER_HTTP_ADDR", "off")
	t.Setenv("EXTWORKER_KAFKA_BROKERS", brokers)
	t.Setenv("EXTWORKER_OUTBOX_BROKER", "kafka")
	t.Setenv("EXTWORKER_CALLBACK_ADDR", addr)
	t.Setenv(daemon.CallbackSecretsVar(source), secret)

	app, err := extworker.New(ctx, extworker.Options{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer app.Close()
	decide := func(m inbox.Message) (inbox.Action, error) {
		return inbox.Action{Correlate: &inbox.Correlate{ProcessDefinitionKey: key, MessageName: key + ".paid", BusinessKey: string(m.Body)}}, nil
	}
	require.NoError(t, app.ConsumeKafka(inbox.Config{Source: source, Queue: topic}, testenv.Unique("group"), decide))
	require.NoError(t, app.Callback(inbox.Config{Source: source}, decide))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- app.Run(runCtx) }()
	defer func() { stop(); <-done }()

	bkKafka, bkHTTP := testenv.Unique("INV"), testenv.Unique("INV")
	for _, bk := range []string{bkKafka, bkHTTP} {
		_, err := c.StartProcess(ctx, key, admin.StartProcessRequest{BusinessKey: bk})
		require.NoError(t, err)
	}
	pub, err := outbox.NewKafkaPublisher([]string{brokers})
	require.NoError(t, err)
	defer pub.Close()
	for range 2 {
		require.NoError(t, pub.Publish(ctx, outbox.Event{MessageID: "pay-" + bkKafka, Type: "paid", RoutingKey: topic, Body: []byte(bkKafka)}))
	}
	answers := make([]string, 2)
	for i := range answers {
		answers[i] = postCallback(t, "http://"+addr+"/callbacks/"+source, secret, "cb-"+bkHTTP, []byte(bkHTTP))
	}
	assert.Equal(t, answers[0], answers[1], "the same callback twice: the same answer")
	res, err := http.Get("http://" + addr + "/callbacks/" + source)
	require.NoError(t, err)
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, res.StatusCode)
	assert.JSONEq(t, `{"error":"POST only"}`, string(b), "the server's own answer, not the mux's text")
	assert.Contains(t, answers[0], "200 ")

	testenv.Eventually(t, time.Minute, "both instances correlated", func() (bool, error) {
		n, err := c.HistoricProcessInstanceCount(ctx, url.Values{"processDefinitionKey": {key}, "finished": {"true"}})
		return n == 2, err
	})
	require.NoError(t, outbox.Add(ctx, app.Pool(), ns, outbox.Event{MessageID: "ev-" + bkKafka, Type: "announced", RoutingKey: events, Body: []byte(`{}`)}))
	rec := firstRecord(t, brokers, events)
	assert.Equal(t, "ev-"+bkKafka, kafkarec.Header(rec, outbox.KafkaHeaderMessageID), "the relay published the event to Kafka")
}

// postCallback posts a signed callback and returns "status body".
func postCallback(t *testing.T, u, secret, id string, body []byte) string {
	t.Helper()
	s, err := callback.ParseSecret(secret)
	require.NoError(t, err)
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req, err := http.NewRequest(http.MethodPost, u, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set(callback.HeaderID, id)
	req.Header.Set(callback.HeaderTimestamp, ts)
	req.Header.Set(callback.HeaderSignature, callback.Sign(s, id, ts, body))
	var resp *http.Response
	testenv.Eventually(t, 30*time.Second, "the callbacks' listener answers", func() (bool, error) {
		resp, err = http.DefaultClient.Do(req.Clone(context.Background()))
		if err != nil {
			req.Body = io.NopCloser(bytes.NewReader(body))
			return false, nil
		}
		return true, nil
	})
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.Status + " " + string(b)
}

func firstRecord(t *testing.T, brokers, topic string) *kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	ctx := testenv.Context(t, time.Minute)
	for ctx.Err() == nil {
		if rs := cl.PollFetches(ctx).Records(); len(rs) > 0 {
			return rs[0]
		}
	}
	t.Fatalf("nothing published to %s", topic)
	return nil
}

// newChannelsApp is an App configured by the environment for the channel tests.
func newChannelsApp(t *testing.T, vars map[string]string) *extworker.App {
	t.Helper()
	testenv.Engine(t)
	pool := testenv.DB(t)
	ctx := testenv.Context(t, time.Minute)
	_, err := migrations.Up(ctx, stdlib.OpenDBFromPool(pool))
	require.NoError(t, err)
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	t.Setenv("EXTWORKER_HTTP_ADDR", "off")
	for k, v := range vars {
		t.Setenv(k, v)
	}
	app, err := extworker.New(ctx, extworker.Options{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(app.Close)
	return app
}

// A callbacks' listener that cannot take its address fails Run at once with a
// configuration error, whatever else the App runs (with a Kafka consumer beside it, the
// process ran on without callbacks, /readyz ready, until SIGTERM).
func TestAppCallbackListenerTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("a key of thirty-two bytes, or so"))
	app := newChannelsApp(t, map[string]string{"EXTWORKER_KAFKA_BROKERS": testenv.Kafka(t), "EXTWORKER_CALLBACK_ADDR": taken.Addr().String(),
		daemon.CallbackSecretsVar("psp"): secret})
	ignore := func(inbox.Message) (inbox.Action, error) { return inbox.Action{Ignore: "test"}, nil }
	require.NoError(t, app.ConsumeKafka(inbox.Config{Source: "psp", Queue: testenv.Unique("t")}, testenv.Unique("g"), ignore))
	require.NoError(t, app.Callback(inbox.Config{Source: "psp"}, ignore))
	done := make(chan error, 1)
	go func() { done <- app.Run(context.Background()) }()
	select {
	case err := <-done:
		require.Error(t, err)
		assert.True(t, extworker.IsConfigError(err), "a configuration error: %v", err)
		assert.Contains(t, err.Error(), "EXTWORKER_CALLBACK_ADDR")
	case <-time.After(30 * time.Second):
		t.Fatal("Run went on without its callbacks' listener")
	}
}

// Callback sources are told apart: two whose names share a secrets variable, a name
// KafkaSource makes, and a secret that is not one are configuration errors at
// registration.
func TestAppCallbackSourcesApart(t *testing.T) {
	good := "whsec_" + base64.StdEncoding.EncodeToString([]byte("a key of thirty-two bytes, or so"))
	app := newChannelsApp(t, map[string]string{"EXTWORKER_CALLBACK_ADDR": testenv.FreeAddr(t),
		daemon.CallbackSecretsVar("a-b"): good, daemon.CallbackSecretsVar("short"): "whsec_c2hvcnQ=",
		daemon.CallbackSecretsVar("x@kafka:t"): good})
	ignore := func(inbox.Message) (inbox.Action, error) { return inbox.Action{Ignore: "test"}, nil }
	require.NoError(t, app.Callback(inbox.Config{Source: "a-b"}, ignore))
	for source, want := range map[string]string{"a_b": "would share the secrets of", "short": daemon.CallbackSecretsVar("short"),
		"x@kafka:t": "Kafka topic's source"} {
		err := app.Callback(inbox.Config{Source: source}, ignore)
		assert.True(t, extworker.IsConfigError(err), "%s: %v", source, err)
		assert.ErrorContains(t, err, want, source)
	}
}
