package idempotency_test

import (
	"context"
	"errors"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/tasks"
)

// A task redelivered after its effect was confirmed (the worker failed between the
// charge and the completion) completes from the ledger: zero provider calls, and the
// same result variables as the first time.
func TestRedeliveredTaskCompletesFromTheLedger(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t, idempotency.Config{})
	c := testenv.Engine(t)
	m := testenv.Deploy(t, c, testenv.ModelOptions{NoMessageWait: true})
	ctx := testenv.Context(t, 2*time.Minute)
	pi, err := c.StartProcess(ctx, m.Key, admin.StartProcessRequest{BusinessKey: "INV-77", Variables: camunda7.Variables{"amountCents": camunda7.LongVar(990)}})
	require.NoError(t, err)

	p := newProvider()
	var mu sync.Mutex
	var outcomes []idempotency.Receipt
	reg := tasks.NewRegistry()
	require.NoError(t, reg.Register(m.Topic, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		amount, err := tk.Variables().Long("amountCents")
		if err != nil {
			return nil, failure.Permanent(err)
		}
		out, err := l.Do(ctx, idempotency.Intent{Scope: "payment.collect", Key: "invoice:" + tk.BusinessKey(), Request: invoice{tk.BusinessKey(), amount},
			Task: idempotency.TaskRef{Actor: tk.WorkerID(), TaskID: tk.ID(), ProcessInstanceID: tk.ProcessInstanceID(), BusinessKey: tk.BusinessKey()}}, p.effect())
		if err != nil {
			return nil, err
		}
		mu.Lock()
		outcomes = append(outcomes, out)
		first := len(outcomes) == 1
		mu.Unlock()
		if first {
			return nil, errors.New("worker trouble after the charge, before the completion")
		}
		return camunda7.Variables{"chargeId": camunda7.StringVar(out.Values["chargeId"].(string))}, nil
	}, tasks.TopicOptions{Variables: []string{"amountCents"}, Retry: failure.RetryPolicy{MaxAttempts: 3, InitialDelay: 50 * time.Millisecond}}))
	w, err := tasks.New(c, reg, tasks.Config{WorkerID: testenv.Unique("w"), AsyncResponseTimeout: time.Second})
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	testenv.Eventually(t, time.Minute, "the instance to complete", func() (bool, error) {
		h, err := c.HistoricProcessInstance(ctx, pi.ID)
		return err == nil && h.State == "COMPLETED", err
	})
	cancel()
	require.NoError(t, <-done)

	require.Len(t, outcomes, 2)
	assert.False(t, outcomes[0].Replayed)
	assert.True(t, outcomes[1].Replayed)
	assert.Equal(t, outcomes[0].Values, outcomes[1].Values, "the same result variables")
	calls, effects := p.stats()
	assert.Equal(t, 1, calls, "zero provider calls on redelivery")
	assert.Equal(t, 1, effects)
	hv, err := c.HistoricVariableInstances(ctx, url.Values{"processInstanceId": {pi.ID}, "variableName": {"chargeId"}})
	require.NoError(t, err)
	require.Len(t, hv, 1)
	got, err := camunda7.Variables{"v": hv[0].Variable()}.String("v")
	require.NoError(t, err)
	assert.Equal(t, outcomes[0].ProviderRef, got)
}
