package taskstest_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/lockext"
	"github.com/extworker/extworker/tasks"
	"github.com/extworker/extworker/tasks/taskstest"
)

func ptr[T any](v T) *T { return &v }

// A completion carries the handler's variables, its local variables, and the task's
// identifiers reach the handler.
func TestRunCompleted(t *testing.T) {
	var seen struct{ bk, topic, pi string }
	res := taskstest.Run(t, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		seen.bk, seen.topic, seen.pi = tk.BusinessKey(), tk.Topic(), tk.ProcessInstanceID()
		tk.SetLocalVariable("auditId", camunda7.StringVar("a-1"))
		return camunda7.Variables{"paymentRef": camunda7.StringVar("pay-1"), "amount": camunda7.LongVar(1 << 60)}, nil
	}, taskstest.Task{Topic: "collect", BusinessKey: "B-1", ProcessInstanceID: "pi-9"})

	assert.Equal(t, tasks.OutcomeCompleted, res.Outcome)
	assert.Empty(t, res.Classification)
	require.NotNil(t, res.Completed)
	assert.Nil(t, res.BPMNError)
	assert.Nil(t, res.Failure)
	ref, err := res.Completed.Variables.String("paymentRef")
	require.NoError(t, err)
	assert.Equal(t, "pay-1", ref)
	n, err := res.Completed.Variables.Long("amount")
	require.NoError(t, err)
	assert.EqualValues(t, 1<<60, n, "variables travel as JSON, Longs keep every digit")
	audit, err := res.Completed.LocalVariables.String("auditId")
	require.NoError(t, err)
	assert.Equal(t, "a-1", audit)
	assert.Equal(t, struct{ bk, topic, pi string }{"B-1", "collect", "pi-9"}, seen)
	assert.Equal(t, 1, res.Deliveries)
}

// A BPMN error carries its code, message and variables, typed as the worker sends them.
func TestRunBPMNError(t *testing.T) {
	res := taskstest.Run(t, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		return nil, failure.BPMNError("DECLINED", "card declined", map[string]any{"reason": "insufficient funds", "tries": 2})
	}, taskstest.Task{Topic: "collect"})

	assert.Equal(t, tasks.OutcomeBPMNError, res.Outcome)
	require.NotNil(t, res.BPMNError)
	assert.Nil(t, res.Completed)
	assert.Equal(t, "DECLINED", res.BPMNError.Code)
	assert.Equal(t, "card declined", res.BPMNError.Message)
	reason, err := res.BPMNError.Variables.String("reason")
	require.NoError(t, err)
	assert.Equal(t, "insufficient funds", reason)
	tries, err := res.BPMNError.Variables.Long("tries")
	require.NoError(t, err)
	assert.EqualValues(t, 2, tries)
}

// A plain error is retryable: retries counted down by the topic's policy, its backoff as
// the retry timeout, and the errorMessage and errorDetails production writes.
func TestRunRetryableFailure(t *testing.T) {
	opts := tasks.TopicOptions{AllVariables: true, Retry: failure.RetryPolicy{MaxAttempts: 4, InitialDelay: 3 * time.Second}}
	h := func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		return nil, errors.New("provider unavailable")
	}
	res := taskstest.Run(t, h, taskstest.Task{Topic: "collect", BusinessKey: "B-2"}, opts)
	assert.Equal(t, tasks.OutcomeRetryable, res.Outcome)
	assert.Equal(t, "retryable", res.Classification)
	require.NotNil(t, res.Failure)
	assert.Equal(t, 3, res.Failure.Retries)
	assert.Equal(t, 3*time.Second, res.Failure.RetryTimeout)
	assert.False(t, res.Failure.Incident())
	assert.Equal(t, "retryable: provider unavailable (attempt 1 of 4, retrying in 3s)", res.Failure.Message)
	for _, line := range []string{"extworker: failure report v1\n", "classification: retryable\n", "attempt: 1 of 4\n",
		"retries left: 3, next attempt in 3s\n", "topic: collect\n", "business key: B-2\n", "error: provider unavailable\n", "*errors.errorString"} {
		assert.Contains(t, res.Failure.Details, line)
	}

	// The last attempt (the engine holds 1 retry): retries exhausted, an incident.
	res = taskstest.Run(t, h, taskstest.Task{Topic: "collect", Retries: ptr(1), ErrorMessage: "retryable: provider unavailable"}, opts)
	assert.Equal(t, tasks.OutcomeIncident, res.Outcome)
	assert.Equal(t, "retryable", res.Classification)
	assert.True(t, res.Failure.Incident())
	assert.Zero(t, res.Failure.RetryTimeout)
	assert.Equal(t, "retryable: provider unavailable (attempt 4 of 4, retries exhausted)", res.Failure.Message)
	assert.Contains(t, res.Failure.Details, "operator action: retries exhausted")
}

// Permanent and unknown-outcome errors raise an incident at once; RetryableAfter sets
// its own retry timeout; Deferred keeps the retries.
func TestRunClassification(t *testing.T) {
	cases := []struct {
		name    string
		outcome tasks.Outcome
		class   string
		err     error
		retries int
		timeout time.Duration
		message string
	}{
		{"permanent", "incident", "permanent", failure.Permanent(errors.New("bad iban")), 0, 0, "permanent: bad iban"},
		{"unknown outcome", "incident", "unknown-outcome", failure.UnknownOutcome(errors.New("timeout after sending")), 0, 0, "unknown-outcome: timeout after sending"},
		{"retryable after", "retryable", "retryable", failure.RetryableAfter(errors.New("rate limited"), 42*time.Second), 2, 42 * time.Second, "retryable: rate limited (attempt 1 of 3, retrying in 42s)"},
		{"deferred", "deferred", "deferred", failure.Deferred(errors.New("in progress elsewhere"), 5*time.Second), 3, 5 * time.Second, "deferred: in progress elsewhere (not a failure: retries unchanged at 3, trying again in 5s)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := taskstest.Run(t, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) { return nil, tc.err },
				taskstest.Task{Topic: "t"})
			assert.Equal(t, tc.outcome, res.Outcome)
			assert.Equal(t, tc.class, res.Classification)
			require.NotNil(t, res.Failure)
			assert.Equal(t, tc.retries, res.Failure.Retries)
			assert.Equal(t, tc.timeout, res.Failure.RetryTimeout)
			assert.Equal(t, tc.message, res.Failure.Message)
		})
	}
}

// A panic is recovered and reported as a retryable failure whose details carry the stack.
func TestRunPanic(t *testing.T) {
	res := taskstest.Run(t, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		var m map[string]int
		m["boom"]++
		return nil, nil
	}, taskstest.Task{Topic: "t"})
	assert.Equal(t, tasks.OutcomeRetryable, res.Outcome)
	require.NotNil(t, res.Failure)
	assert.Contains(t, res.Failure.Message, "handler panicked: assignment to entry in nil map")
	assert.Contains(t, res.Failure.Details, "panic stack:\n")
	assert.Contains(t, res.Failure.Details, "TestRunPanic")
}

// The handler gets only the variables its topic fetches, as the engine sends them; Fetch
// shows what was asked for.
func TestRunFetchesWhatTheTopicAsksFor(t *testing.T) {
	task := taskstest.Task{Topic: "t",
		Variables:      camunda7.Variables{"a": camunda7.StringVar("A"), "b": camunda7.StringVar("B"), "doc": camunda7.FileVar("x.pdf", "application/pdf", "", []byte("%PDF"))},
		LocalVariables: camunda7.Variables{"a": camunda7.StringVar("local A"), "l": camunda7.BoolVar(true)},
	}
	var got camunda7.Variables
	h := func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		got = tk.Variables()
		return nil, nil
	}

	res := taskstest.Run(t, h, task, tasks.TopicOptions{Variables: []string{"a", "doc", "missing"}})
	assert.Equal(t, []string{"a", "doc", "missing"}, res.Fetch.Variables)
	assert.Equal(t, got, res.Fetched)
	assert.ElementsMatch(t, []string{"a", "doc"}, keys(got))
	a, _ := got.String("a")
	assert.Equal(t, "local A", a, "a local variable hides the process variable")
	f, err := got.File("doc")
	require.NoError(t, err)
	assert.Equal(t, "x.pdf", f.Filename)
	assert.Nil(t, f.Content, "fetchAndLock sends a File's metadata, not its content")

	res = taskstest.Run(t, h, task, tasks.TopicOptions{})
	assert.Empty(t, got, "no variables unless asked for")
	assert.Equal(t, tasks.OutcomeCompleted, res.Outcome)

	taskstest.Run(t, h, task, tasks.TopicOptions{AllVariables: true, LocalVariables: true})
	assert.ElementsMatch(t, []string{"a", "l"}, keys(got))

	taskstest.Run(t, h, task) // without options: everything
	assert.ElementsMatch(t, []string{"a", "b", "doc", "l"}, keys(got))
}

func keys(vs camunda7.Variables) []string {
	out := []string{}
	for k := range vs {
		out = append(out, k)
	}
	return out
}

// Every filter of the topic applies: a task it excludes is not handled, and Handle says
// which filter excluded it; a task that matches them all is.
func TestHandleTopicFilters(t *testing.T) {
	nop := func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) { return nil, nil }
	task := taskstest.Task{Topic: "t", BusinessKey: "B", TenantID: "acme", ProcessDefinitionKey: "order", ProcessDefinitionVersionTag: "v2",
		Variables: camunda7.Variables{"region": camunda7.StringVar("eu"), "n": camunda7.LongVar(5)}}
	cases := []struct {
		name string
		opts tasks.TopicOptions
		want string // "" when the task is fetched
	}{
		{"all match", tasks.TopicOptions{BusinessKey: "B", TenantIDIn: []string{"acme"}, ProcessDefinitionKeyIn: []string{"x", "order"},
			ProcessDefinitionVersionTag: "v2", ProcessVariables: map[string]any{"region": "eu", "n": 5}}, ""},
		{"business key", tasks.TopicOptions{BusinessKey: "other"}, `filter BusinessKey "other" does not match the task's "B"`},
		{"tenant", tasks.TopicOptions{TenantIDIn: []string{"other"}}, "filter TenantIDIn"},
		{"without tenant", tasks.TopicOptions{WithoutTenantID: true}, "filter WithoutTenantID"},
		{"definition key", tasks.TopicOptions{ProcessDefinitionKey: "invoice"}, "filter ProcessDefinitionKey"},
		{"version tag", tasks.TopicOptions{ProcessDefinitionVersionTag: "v1"}, "filter ProcessDefinitionVersionTag"},
		{"process variable", tasks.TopicOptions{ProcessVariables: map[string]any{"region": "us"}}, `filter ProcessVariables["region"]`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reg := tasks.NewRegistry()
			require.NoError(t, reg.Register("t", nop, tc.opts))
			res, err := taskstest.Handle(context.Background(), reg, task)
			if tc.want == "" {
				require.NoError(t, err)
				assert.Equal(t, tasks.OutcomeCompleted, res.Outcome)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Zero(t, res.Deliveries)
		})
	}
	reg := tasks.NewRegistry()
	require.NoError(t, reg.Register("other-topic", nop, tasks.TopicOptions{}))
	_, err := taskstest.Handle(context.Background(), reg, task)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `no topic of the worker's fetch is named "t"`)
}

// MaxRunTime cancels the handler's context as in production, and the failure says so.
func TestRunMaxRunTime(t *testing.T) {
	res := taskstest.Run(t, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		<-ctx.Done()
		assert.ErrorIs(t, context.Cause(ctx), lockext.ErrMaxRunTime)
		return nil, ctx.Err()
	}, taskstest.Task{Topic: "t"}, tasks.TopicOptions{MaxRunTime: 100 * time.Millisecond})
	assert.Equal(t, tasks.OutcomeRetryable, res.Outcome)
	require.NotNil(t, res.Failure)
	assert.Contains(t, res.Failure.Message, "maximum run time exceeded")
}

// A handler still running when Handle's context ends is cancelled (tasks.ErrShutdown),
// its task unlocked, and Handle reports it.
func TestHandleContextEnds(t *testing.T) {
	reg := tasks.NewRegistry()
	require.NoError(t, reg.Register("t", func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}, tasks.TopicOptions{}))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	res, err := taskstest.Handle(ctx, reg, taskstest.Task{Topic: "t"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not handled when the context ended")
	assert.True(t, res.Unlocked)
	assert.Equal(t, tasks.OutcomeUnlocked, res.Outcome)
}

// A variable the client cannot send (a NaN Double) makes the completion an incident
// naming the variable, not a report resent for minutes.
func TestRunUnsendableVariableIsAnIncident(t *testing.T) {
	start := time.Now()
	res := taskstest.Run(t, func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		return camunda7.Variables{"ratio": camunda7.DoubleVar(math.NaN())}, nil
	}, taskstest.Task{Topic: "t"})
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Equal(t, tasks.OutcomeIncident, res.Outcome)
	assert.Equal(t, "permanent", res.Classification)
	require.NotNil(t, res.Failure)
	assert.Contains(t, res.Failure.Message, "complete refused before sending")
	assert.Contains(t, res.Failure.Message, `"ratio"`)
}

// Run refuses what cannot be handled: a task without a topic, one with an incident.
func TestHandleRefusesImpossibleTasks(t *testing.T) {
	reg := tasks.NewRegistry()
	require.NoError(t, reg.Register("t", func(context.Context, *tasks.Task) (camunda7.Variables, error) { return nil, nil }, tasks.TopicOptions{}))
	_, err := taskstest.Handle(context.Background(), reg, taskstest.Task{})
	assert.ErrorContains(t, err, "no Topic")
	_, err = taskstest.Handle(context.Background(), reg, taskstest.Task{Topic: "t", Retries: ptr(0)})
	assert.ErrorContains(t, err, "incident")
	_, err = taskstest.Handle(context.Background(), reg, taskstest.Task{Topic: "t", Variables: camunda7.Variables{"x": camunda7.DoubleVar(math.Inf(1))}})
	assert.ErrorContains(t, err, `"x"`)
}

// The engine answers as a real engine does, with the errors the worker decides on.
func TestEngineAnswers(t *testing.T) {
	ctx := context.Background()
	e := taskstest.NewEngine()
	id, err := e.Add(taskstest.Task{Topic: "t", ID: "42"})
	require.NoError(t, err)
	_, err = e.Add(taskstest.Task{Topic: "t", ID: "42"})
	assert.ErrorContains(t, err, "exists already")

	got, err := e.FetchAndLock(ctx, camunda7.FetchAndLockRequest{WorkerID: "w", MaxTasks: 5,
		Topics: []camunda7.FetchTopic{{TopicName: "t", LockDuration: 50 * time.Millisecond}}})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "42", got[0].ID)
	assert.Equal(t, "w", got[0].WorkerID)

	err = e.Complete(ctx, id, camunda7.CompleteRequest{WorkerID: "other"})
	assert.ErrorIs(t, err, camunda7.ErrLockLost)
	var ee *camunda7.Error
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 400, ee.StatusCode)
	assert.Contains(t, ee.Message, "It is locked by worker 'w'")
	assert.ErrorIs(t, e.ExtendLock(ctx, id, "other", time.Second), camunda7.ErrLockLost)

	time.Sleep(60 * time.Millisecond) // the lock runs out; nobody takes the task
	err = e.ExtendLock(ctx, id, "w", time.Second)
	assert.ErrorIs(t, err, camunda7.ErrLockExpired)
	assert.ErrorIs(t, err, camunda7.ErrLockLost)
	assert.False(t, lockext.LostAnswer(err), "an expired lock nobody took is not lost")
	require.NoError(t, e.Lock(ctx, id, "w", time.Second))
	require.NoError(t, e.ExtendLock(ctx, id, "w", time.Second))
	assert.ErrorIs(t, e.Lock(ctx, id, "other", time.Second), camunda7.ErrLockLost)

	locked, err := e.ExternalTasks(ctx, camunda7.ExternalTaskQuery{WorkerID: "w", Locked: true})
	require.NoError(t, err)
	require.Len(t, locked, 1)

	// A failure with retries keeps the task locked for its retry timeout.
	require.NoError(t, e.Failure(ctx, id, camunda7.FailureRequest{WorkerID: "w", ErrorMessage: "m", Retries: 2, RetryTimeout: time.Hour}))
	x, err := e.ExternalTask(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, 2, *x.Retries)
	assert.Equal(t, "m", x.ErrorMessage)
	got, err = e.FetchAndLock(ctx, camunda7.FetchAndLockRequest{WorkerID: "w2", MaxTasks: 5,
		Topics: []camunda7.FetchTopic{{TopicName: "t", LockDuration: time.Second}}})
	require.NoError(t, err)
	assert.Empty(t, got, "waiting out its retry timeout")

	require.NoError(t, e.Complete(ctx, id, camunda7.CompleteRequest{WorkerID: "w", Variables: camunda7.Variables{"v": camunda7.BoolVar(true)}}))
	_, err = e.ExternalTask(ctx, id)
	assert.ErrorIs(t, err, camunda7.ErrTaskGone)
	assert.ErrorIs(t, e.Complete(ctx, id, camunda7.CompleteRequest{WorkerID: "w"}), camunda7.ErrTaskGone)
	assert.ErrorIs(t, e.Unlock(ctx, id), camunda7.ErrTaskGone)
	log, err := e.ExternalTaskLog(ctx, map[string][]string{"externalTaskId": {id}})
	require.NoError(t, err)
	require.Len(t, log, 3)
	assert.True(t, log[0].CreationLog && log[1].FailureLog && log[2].SuccessLog)

	res, ok := e.Result(id)
	require.True(t, ok)
	require.NotNil(t, res.Completed)
	assert.NotNil(t, res.Failure, "the failure before stays on record")

	// Refused before sending, as the client refuses it.
	err = e.Complete(ctx, "", camunda7.CompleteRequest{WorkerID: "w"})
	assert.ErrorIs(t, err, camunda7.ErrInvalidArgument)
	assert.ErrorIs(t, err, camunda7.ErrNotSent)
	_, err = e.FetchAndLock(ctx, camunda7.FetchAndLockRequest{WorkerID: "w", MaxTasks: 1})
	assert.ErrorIs(t, err, camunda7.ErrInvalidArgument)
}

// A long poll waits for a task and returns it as soon as it is added; Close ends it.
func TestEngineLongPoll(t *testing.T) {
	e := taskstest.NewEngine()
	req := camunda7.FetchAndLockRequest{WorkerID: "w", MaxTasks: 1, AsyncResponseTimeout: 10 * time.Second,
		Topics: []camunda7.FetchTopic{{TopicName: "t", LockDuration: time.Second}}}
	got := make(chan []camunda7.LockedExternalTask, 1)
	go func() {
		tasks, err := e.FetchAndLock(context.Background(), req)
		assert.NoError(t, err)
		got <- tasks
	}()
	time.Sleep(50 * time.Millisecond)
	_, err := e.Add(taskstest.Task{Topic: "t"})
	require.NoError(t, err)
	select {
	case tasks := <-got:
		assert.Len(t, tasks, 1)
	case <-time.After(5 * time.Second):
		t.Fatal("the long poll did not return the new task")
	}

	go func() {
		tasks, err := e.FetchAndLock(context.Background(), req)
		assert.NoError(t, err)
		got <- tasks
	}()
	time.Sleep(50 * time.Millisecond)
	e.Close()
	select {
	case tasks := <-got:
		assert.Empty(t, tasks)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the long poll")
	}
}

// An Engine runs a worker of one's own over several tasks: a failed attempt comes back
// after its retry timeout, as the next attempt, and completes.
func TestEngineWithOwnWorker(t *testing.T) {
	e := taskstest.NewEngine()
	var mu sync.Mutex
	attempts := map[string][]int{}
	reg := tasks.NewRegistry()
	require.NoError(t, reg.Register("t", func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
		mu.Lock()
		attempts[tk.ID()] = append(attempts[tk.ID()], tk.Attempt())
		n := len(attempts[tk.ID()])
		mu.Unlock()
		if n == 1 {
			return nil, errors.New("first attempt fails")
		}
		return nil, nil
	}, tasks.TopicOptions{Retry: failure.RetryPolicy{MaxAttempts: 3, InitialDelay: 20 * time.Millisecond}}))
	var ids []string
	for range 3 {
		id, err := e.Add(taskstest.Task{Topic: "t"})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	w, err := tasks.New(e, reg, tasks.Config{WorkerID: "w", MaxConcurrency: 2, AsyncResponseTimeout: time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	require.Eventually(t, func() bool {
		for _, id := range ids {
			if res, _ := e.Result(id); res.Completed == nil {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond)
	cancel()
	e.Close()
	require.NoError(t, <-done)
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		assert.Equal(t, []int{1, 2}, attempts[id], id)
		res, _ := e.Result(id)
		assert.Equal(t, 2, res.Deliveries)
	}
}

// A String variable the engine's database refuses (more than 4000 characters, or a
// NUL) is answered as a real engine answers it (camunda7's
// TestConformanceCompleteWithStringTheDatabaseRefuses): 500
// ProcessEnginePersistenceException, the task still locked, the report not applied; 4000
// characters of four bytes each are stored. It was accepted.
func TestEngineRefusesStringsTheDatabaseRefuses(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		s       string
		refused bool
	}{
		{"4000 four-byte characters", strings.Repeat("🚀", tasks.MaxStringLength), false},
		{"4001 characters", strings.Repeat("x", tasks.MaxStringLength+1), true},
		{"a NUL", "a\x00b", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := taskstest.NewEngine()
			id, err := e.Add(taskstest.Task{Topic: "t"})
			require.NoError(t, err)
			got, err := e.FetchAndLock(ctx, camunda7.FetchAndLockRequest{WorkerID: "w", MaxTasks: 1,
				Topics: []camunda7.FetchTopic{{TopicName: "t", LockDuration: time.Minute}}})
			require.NoError(t, err)
			require.Len(t, got, 1)
			vs := camunda7.Variables{"s": camunda7.StringVar(tc.s)}
			reports := map[string]func() error{
				"failure": func() error {
					return e.Failure(ctx, id, camunda7.FailureRequest{WorkerID: "w", Retries: 1, Variables: vs})
				},
				"bpmnError": func() error {
					return e.BPMNError(ctx, id, camunda7.BPMNErrorRequest{WorkerID: "w", ErrorCode: "E", Variables: vs})
				},
				"complete local": func() error {
					return e.Complete(ctx, id, camunda7.CompleteRequest{WorkerID: "w", LocalVariables: vs})
				},
				"complete": func() error { return e.Complete(ctx, id, camunda7.CompleteRequest{WorkerID: "w", Variables: vs}) },
			}
			for _, op := range []string{"failure", "bpmnError", "complete local", "complete"} {
				err := reports[op]()
				if !tc.refused {
					require.NoError(t, err, op)
					res, ok := e.Result(id)
					require.True(t, ok)
					require.NotNil(t, res.Failure)
					return
				}
				var ee *camunda7.Error
				require.ErrorAs(t, err, &ee, op)
				assert.Equal(t, 500, ee.StatusCode, op)
				assert.Equal(t, "ProcessEnginePersistenceException", ee.Type, op)
				assert.True(t, camunda7.SafeToRetry(err), op)
				assert.NotErrorIs(t, err, camunda7.ErrLockLost, op)
				x, err := e.ExternalTask(ctx, id)
				require.NoError(t, err, op)
				assert.Equal(t, "w", x.WorkerID, "%s: still locked", op)
				assert.Nil(t, x.Retries, "%s: not applied", op)
			}
			res, _ := e.Result(id)
			assert.True(t, res.Completed == nil && res.BPMNError == nil && res.Failure == nil, "nothing applied: %+v", res)
		})
	}
}
