package tasks

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
)

func nop(context.Context, *Task) (camunda7.Variables, error) { return nil, nil }

func testWorker(t *testing.T, max int, topics map[string]int) *Worker {
	t.Helper()
	reg := NewRegistry()
	for name, limit := range topics {
		require.NoError(t, reg.Register(name, nop, TopicOptions{MaxConcurrency: limit}))
	}
	c, err := camunda7.New(camunda7.Config{})
	require.NoError(t, err)
	w, err := New(c, reg, Config{MaxConcurrency: max, WorkerID: "w"})
	require.NoError(t, err)
	return w
}

// plan asks for no more tasks than there are free slots, globally and per topic.
func TestPlanAsksOnlyForFreeSlots(t *testing.T) {
	cases := []struct {
		name       string
		max        int
		topics     map[string]int // topic -> per-topic limit (0: none)
		inflight   map[string]int
		wantOK     bool
		wantMax    int
		wantTopics []string
	}{
		{"idle, no topic limits", 8, map[string]int{"a": 0, "b": 0}, nil, true, 8, []string{"a", "b"}},
		{"partly busy", 8, map[string]int{"a": 0, "b": 0}, map[string]int{"a": 5}, true, 3, []string{"a", "b"}},
		{"full", 4, map[string]int{"a": 0}, map[string]int{"a": 4}, false, 0, nil},
		{"topic at its limit is left out", 8, map[string]int{"a": 2, "b": 0}, map[string]int{"a": 2}, true, 6, []string{"b"}},
		{"smallest topic room bounds the shared maxTasks", 8, map[string]int{"a": 3, "b": 0}, map[string]int{"a": 1}, true, 2, []string{"a", "b"}},
		{"every topic at its limit", 8, map[string]int{"a": 1, "b": 1}, map[string]int{"a": 1, "b": 1}, false, 0, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := testWorker(t, tc.max, tc.topics)
			for topic, n := range tc.inflight {
				w.perTopic[topic] = n
				w.inflight += n
			}
			req, ok := w.plan(0)
			require.Equal(t, tc.wantOK, ok)
			if !ok {
				return
			}
			assert.Equal(t, tc.wantMax, req.MaxTasks)
			var names []string
			for _, tp := range req.Topics {
				names = append(names, tp.TopicName)
				assert.Empty(t, tp.Variables, "no variables unless named")
				assert.False(t, tp.AllVariables)
			}
			assert.Equal(t, tc.wantTopics, names)
			assert.True(t, req.UsePriority)
			assert.Equal(t, "w", req.WorkerID)
		})
	}
}

func TestDescribeFailureFormat(t *testing.T) {
	raw := camunda7.LockedExternalTask{ExternalTask: camunda7.ExternalTask{ID: "task-1", TopicName: "pay", ProcessInstanceID: "pi-1", ProcessDefinitionKey: "invoice", ActivityID: "collect", BusinessKey: "INV-1"}}
	tp := &topic{name: "pay", opts: TopicOptions{}.WithDefaults()}
	task := newTask(raw, "w-1", 1)
	msg, details := describeFailure("w-1", tp, task, failure.Classify(errors.New("provider: 503\nretry later")), 2, time.Second)
	assert.Equal(t, "retryable: provider: 503 retry later (attempt 1 of 3, retrying in 1s)", msg)
	for _, want := range []string{
		"extworker: failure report v1\n", "classification: retryable\n", "attempt: 1 of 3\n", "retries left: 2, next attempt in 1s\n",
		"worker: w-1\n", "topic: pay\n", "external task: task-1\n", "process instance: pi-1\n", "process definition: invoice\n",
		"activity: collect\n", "business key: INV-1\n", "\nerror: provider: 503\nretry later", "error chain:\n  *errors.errorString",
	} {
		assert.Contains(t, details, want)
	}
	long := strings.Repeat("é", 1000)
	msg, _ = describeFailure("w-1", tp, task, failure.Classify(failure.Permanent(errors.New(long))), 0, 0)
	assert.LessOrEqual(t, len(msg), maxErrorMessage+len("…"), "fits the engine's 666-character column")
	assert.True(t, strings.HasPrefix(msg, "permanent: é"))
}

func TestToVariables(t *testing.T) {
	when := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	vs, err := toVariables(map[string]any{"s": "x", "b": true, "i": 7, "f": 1.5, "d": when, "n": nil, "raw": camunda7.LongVar(9007199254740993), "obj": map[string]int{"a": 1}})
	require.NoError(t, err)
	for name, typ := range map[string]string{"s": "String", "b": "Boolean", "i": "Long", "f": "Double", "d": "Date", "n": "Null", "raw": "Long", "obj": "Json"} {
		assert.Equal(t, typ, vs[name].Type, name)
	}
	_, err = toVariables(map[string]any{"ch": make(chan int)})
	assert.Error(t, err)
}

// The held map (tasks waiting out a retry timeout) stays bounded by the tasks actually
// waiting: expired entries go whenever the map has doubled since the last purge. It used
// to shrink only in the orphan sweep, which runs only after a failed poll.
func TestHeldMapBounded(t *testing.T) {
	w := testWorker(t, 4, map[string]int{"t": 0})
	for i := range 100_000 {
		w.holdForRetry(fmt.Sprintf("task-%d", i), -2*time.Second) // already over
		require.LessOrEqual(t, heldCount(w), 2*minHeldPurge, "after %d holds", i+1)
	}
	for i := range 300 {
		w.holdForRetry(fmt.Sprintf("waiting-%d", i), time.Hour)
	}
	for i := range 10_000 {
		w.holdForRetry(fmt.Sprintf("late-%d", i), -2*time.Second)
	}
	assert.GreaterOrEqual(t, heldCount(w), 300, "tasks still waiting are kept")
	assert.LessOrEqual(t, heldCount(w), 4*300+minHeldPurge)
}

func heldCount(w *Worker) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.held)
}
