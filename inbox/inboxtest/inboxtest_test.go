package inboxtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/inbox/inboxtest"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
)

var migrateOnce sync.Once

// event is the test's message body: an order, started as process "order" and paid by a
// message "paid" its instance waits for.
type event struct {
	Kind  string `json:"kind"` // "placed" or "paid"
	Order string `json:"order"`
}

func decide(m inbox.Message) (inbox.Action, error) {
	var e event
	if err := json.Unmarshal(m.Body, &e); err != nil {
		return inbox.Action{}, err
	}
	switch e.Kind {
	case "placed":
		return inbox.Action{Start: &inbox.Start{ProcessKey: "order", BusinessKey: e.Order}}, nil
	case "paid":
		return inbox.Action{Correlate: &inbox.Correlate{ProcessDefinitionKey: "order", MessageName: "paid", BusinessKey: e.Order}}, nil
	}
	return inbox.Action{Ignore: "not for orders: " + e.Kind}, nil
}

func message(id, kind, order string) inbox.Message {
	b, _ := json.Marshal(event{Kind: kind, Order: order})
	return inbox.Message{ID: id, Type: "order." + kind, Body: b}
}

// consumer is a consumer of cfg.Source (default a source of its own), on the test database, acting through
// engine: no broker (Handle is called directly), no Camunda.
func consumer(t *testing.T, engine inbox.Engine, cfg inbox.Config) *inbox.Consumer {
	t.Helper()
	pool := testenv.DB(t)
	migrateOnce.Do(func() {
		_, err := migrations.Up(context.Background(), stdlib.OpenDBFromPool(pool))
		require.NoError(t, err)
	})
	if cfg.Source == "" {
		cfg.Source = testenv.Unique("src")
	}
	cfg.Queue = "unused"
	c, err := inbox.NewConsumer(pool, engine, "amqp://unused", decide, cfg)
	require.NoError(t, err)
	return c
}

// TestHandlingWithTheEngineInMemory walks a message's classes through the inbox with the
// engine in memory: a start once per business key, its redelivery a duplicate, a
// payment early until the instance waits, then correlated, then late for a second
// payment; a start of a key someone else started is ignored.
func TestHandlingWithTheEngineInMemory(t *testing.T) {
	engine := inboxtest.New(0)
	c := consumer(t, engine, inbox.Config{EarlyWindow: time.Hour})
	ctx := testenv.Context(t, 30*time.Second)
	handle := func(m inbox.Message) inbox.Handling {
		t.Helper()
		out, err := c.Handle(ctx, m)
		require.NoError(t, err)
		return out
	}

	out := handle(message("placed-1", "placed", "A-1"))
	assert.Equal(t, inbox.Retry, out.Disposition, "the process is not deployed yet: %s", out.Reason)
	assert.Equal(t, inbox.ClassEarly, out.Class)
	assert.Equal(t, inbox.StateFailedRetryable, out.State)

	engine.Deploy("order", "paid")
	paid := message("paid-1", "paid", "A-1")
	out = handle(paid)
	assert.Equal(t, inbox.ClassEarly, out.Class, "no instance waits for the payment yet: %s", out.Reason)

	out = handle(message("placed-1", "placed", "A-1"))
	require.Equal(t, inbox.ClassStarted, out.Class, out.Reason)
	assert.Equal(t, inbox.StateProcessed, out.State)
	instances := engine.Instances("order", "A-1")
	require.Len(t, instances, 1)
	assert.Equal(t, instances[0].ID, out.ProcessInstanceID)
	mark, err := instances[0].Variables.String(inbox.StartMarkVariable)
	require.NoError(t, err)
	assert.Contains(t, mark, "/placed-1", "the start marks the instance with its message")

	out = handle(message("placed-1", "placed", "A-1"))
	assert.Equal(t, inbox.Handling{Disposition: inbox.Ack, State: inbox.StateProcessed, Class: inbox.ClassDuplicate}, out)
	out = handle(message("placed-2", "placed", "A-1"))
	assert.Equal(t, inbox.ClassIgnored, out.Class, "another message for the key: %s", out.Reason)
	assert.Equal(t, inbox.StateIgnoredDuplicate, out.State)
	assert.Len(t, engine.Instances("order", "A-1"), 1, "one instance per business key")

	out = handle(paid)
	assert.Equal(t, inbox.ClassCorrelated, out.Class, out.Reason)
	assert.Empty(t, engine.Instances("order", "A-1")[0].Waiting, "the instance moved past the wait")
	out = handle(message("paid-2", "paid", "A-1"))
	assert.Equal(t, inbox.ClassLate, out.Class, out.Reason)
	assert.Equal(t, inbox.StateIgnoredDuplicate, out.State)

	other := engine.Run("order", "B-1")
	out = handle(message("placed-3", "placed", "B-1"))
	assert.Equal(t, inbox.ClassIgnored, out.Class, out.Reason)
	assert.Equal(t, other, out.ProcessInstanceID)

	out = handle(message("shipped-1", "shipped", "A-1"))
	assert.Equal(t, inbox.Handling{Disposition: inbox.Ack, State: inbox.StateProcessed, Class: inbox.ClassIgnored,
		Reason: "ignored: not for orders: shipped"}, out)

	st := c.Stats()
	assert.Equal(t, int64(1), st.Started.Load())
	assert.Equal(t, int64(1), st.Correlated.Load())
	assert.Equal(t, int64(1), st.Duplicates.Load())
	assert.Equal(t, int64(3), st.Ignored.Load(), "the late payment and the two starts of keys that had their instance")
}

// TestEngineDownThenTheAnswerLost: an engine that cannot be reached is retried, nothing
// parked; a start whose answer was lost is an unknown outcome, waited out for the
// in-flight window, then reconciled from the instance's mark: never started twice.
func TestEngineDownThenTheAnswerLost(t *testing.T) {
	engine := inboxtest.New(time.Second)
	engine.Deploy("order")
	const window = 1100 * time.Millisecond
	cfg := inbox.Config{Source: testenv.Unique("src"), InFlightWindow: window, BackoffInitial: time.Millisecond}
	c := consumer(t, engine, cfg)
	ctx := testenv.Context(t, 30*time.Second)
	m := message("placed-1", "placed", "C-1")

	engine.Fail(camunda7.ErrNotSent)
	out, err := c.Handle(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, inbox.ClassRetry, out.Class, out.Reason)
	assert.Equal(t, inbox.StateFailedRetryable, out.State)

	// The start reaches the engine, and its answer is lost.
	engine.Fail(nil)
	out, err = consumer(t, &lossyEngine{Engine: engine}, cfg).Handle(ctx, m)
	require.NoError(t, err)
	require.Equal(t, inbox.ClassUnknownOutcome, out.Class, out.Reason)
	assert.Equal(t, inbox.StateUnknown, out.State)
	require.Len(t, engine.Instances("order", "C-1"), 1, "the start landed")

	// Redelivered at once: its request may still be in flight, so the inbox waits.
	out, err = c.Handle(ctx, m)
	require.NoError(t, err)
	assert.Equal(t, inbox.ClassUnknownOutcome, out.Class, out.Reason)
	assert.Greater(t, out.Delay, time.Duration(0))
	assert.LessOrEqual(t, out.Delay, window)

	deadline := time.Now().Add(10 * time.Second)
	for out.Class == inbox.ClassUnknownOutcome && time.Now().Before(deadline) {
		<-time.After(out.Delay)
		out, err = c.Handle(ctx, m)
		require.NoError(t, err)
	}
	assert.Equal(t, inbox.ClassReconciled, out.Class, out.Reason)
	assert.Equal(t, inbox.StateProcessed, out.State)
	assert.Len(t, engine.Instances("order", "C-1"), 1, "not started twice")
}

// lossyEngine starts the process, then loses the answer.
type lossyEngine struct{ *inboxtest.Engine }

var errLost = errors.New("read tcp: connection reset by peer")

func (e *lossyEngine) StartProcess(ctx context.Context, key string, r admin.StartProcessRequest) (*admin.ProcessInstance, error) {
	if _, err := e.Engine.StartProcess(ctx, key, r); err != nil {
		return nil, err
	}
	return nil, errLost
}
