package tasks_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/migrations"
	"github.com/extworker/extworker/tasks"
)

// syncBuf is a bytes.Buffer safe for the worker's concurrent log writes.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// records decodes the JSON log lines with the given message.
func (s *syncBuf) records(t *testing.T, msg string) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, line := range bytes.Split(s.b.Bytes(), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var r map[string]any
		require.NoError(t, json.Unmarshal(line, &r), "log line %s", line)
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

// countingObserver counts what the worker reported, by "method topic/outcome".
type countingObserver struct {
	tasks.NopObserver
	mu     sync.Mutex
	counts map[string]int
}

func (o *countingObserver) inc(k string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.counts[k]++
}
func (o *countingObserver) get(k string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.counts[k]
}
func (o *countingObserver) Polled(int, time.Duration, error) { o.inc("polled") }
func (o *countingObserver) Fetched(topic string)             { o.inc("fetched") }
func (o *countingObserver) Handled(_ string, outcome tasks.Outcome, class string, _ time.Duration) {
	o.inc("handled " + outcome.String() + " " + class)
}
func (o *countingObserver) Slots(_ string, inFlight, free int) {
	if inFlight > 0 {
		o.inc("slot taken")
	}
}

// Every record about a task carries the task's fields; when the handler runs an effect
// through the ledger (wired with tasks.Logger and tasks.AddLogAttrs), the ledger's records
// carry them too, and the "task handled" record names the intent, its ledger state and
// the outcome. The observer sees the fetch, the slot and the outcome.
func TestTaskLogFieldsAndObserver(t *testing.T) {
	f := newFixture(t, testenv.ModelOptions{NoMessageWait: true})
	pool := testenv.DB(t)
	db := stdlib.OpenDBFromPool(pool)
	_, err := migrations.Up(f.ctx, db)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	base, err := idempotency.New(pool, idempotency.Config{Namespace: testenv.Unique("ns")})
	require.NoError(t, err)
	ledger := base.WithHooks(idempotency.Hooks{ContextLogger: tasks.Logger, Annotate: tasks.AddLogAttrs})

	logs := &syncBuf{}
	obs := &countingObserver{counts: map[string]int{}}
	reg := tasks.NewRegistry()
	require.NoError(t, reg.Register(f.m.Topic, func(ctx context.Context, task *tasks.Task) (camunda7.Variables, error) {
		if tasks.Logger(ctx) == nil {
			return nil, failure.Permanent(errors.New("no task logger in the handler's context"))
		}
		_, err := ledger.Do(ctx, idempotency.Intent{Scope: "test.effect", Key: "k:" + task.ProcessInstanceID(), Request: 1,
			Task: idempotency.TaskRef{Actor: task.WorkerID(), TaskID: task.ID()}},
			idempotency.Effect{Dispatch: func(context.Context, string) (idempotency.Result, error) {
				return idempotency.Result{ProviderRef: "ref-1"}, nil
			}})
		return nil, err
	}, tasks.TopicOptions{LockDuration: 10 * time.Second}))
	ids := f.start(1)
	w, stop := f.run(reg, tasks.Config{Observer: obs, Logger: newJSONLogger(logs)})
	testenv.Eventually(t, time.Minute, "the task to be handled", func() (bool, error) {
		return len(logs.records(t, "task handled")) == 1, nil
	})
	stop()

	taskFields := map[string]any{"worker_id": w.WorkerID(), "topic": f.m.Topic, "process_instance_id": ids[0],
		"process_definition_key": f.m.Key, "activity_id": f.m.ActivityID, "business_key": "order-0", "attempt": float64(1)}
	handled := logs.records(t, "task handled")[0]
	for k, v := range taskFields {
		assert.Equal(t, v, handled[k], "task handled: field %s", k)
	}
	assert.NotEmpty(t, handled["external_task_id"])
	assert.Equal(t, "completed", handled["outcome"])
	assert.Equal(t, "test.effect", handled["idempotency_scope"])
	assert.Equal(t, "k:"+ids[0], handled["idempotency_key"])
	assert.Equal(t, "confirmed", handled["ledger_state"])

	transitions := logs.records(t, "intent transition")
	require.Len(t, transitions, 2, "prepared -> dispatched -> confirmed")
	for _, r := range transitions {
		for k, v := range taskFields {
			assert.Equal(t, v, r[k], "ledger record: field %s", k)
		}
		assert.Equal(t, handled["external_task_id"], r["external_task_id"])
		assert.Equal(t, "test.effect", r["idempotency_scope"])
		assert.Equal(t, "k:"+ids[0], r["idempotency_key"])
		assert.Contains(t, []any{"dispatched", "confirmed"}, r["ledger_state"])
	}

	assert.Equal(t, 1, obs.get("fetched"))
	assert.Equal(t, 1, obs.get("handled completed "))
	assert.Equal(t, 1, obs.get("slot taken"))
	assert.Positive(t, obs.get("polled"))
}

func newJSONLogger(w *syncBuf) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
