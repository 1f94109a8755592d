package tasks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/tasks"
)

// memEngine hands out generated tasks, decoded from the JSON the engine would send,
// until it has handed out n; then its polls wait. It keeps nothing per task, so that
// what the heap holds per in-flight task is the worker's.
type memEngine struct {
	n       atomic.Int64
	handed  atomic.Int64
	extends atomic.Int64
}

// fetchedJSON is one task as fetchAndLock returns it, with three variables: what a
// typical production task looks like on the wire.
const fetchedJSON = `{"activityId":"charge-card","activityInstanceId":"charge-card:5e3a1f0c-7b2d-11ef-8c3a-0242ac120002",
"errorMessage":null,"errorDetails":null,"executionId":"5e3a1f0b-7b2d-11ef-8c3a-0242ac120002",
"id":"%s","lockExpirationTime":"2026-12-01T23:59:59.000+0000","createTime":"2026-12-01T23:00:00.000+0000",
"processDefinitionId":"invoice:3:1a2b3c4d-7b2d-11ef-8c3a-0242ac120002","processDefinitionKey":"invoice",
"processDefinitionVersionTag":null,"processInstanceId":"5e3a1f00-7b2d-11ef-8c3a-0242ac120002",
"retries":null,"suspended":false,"workerId":"w","topicName":"mem","tenantId":null,"priority":0,
"businessKey":"order-%s","extensionProperties":{},
"variables":{"invoiceId":{"type":"String","value":"INV-2026-000123","valueInfo":{}},
"amount":{"type":"Long","value":12999,"valueInfo":{}},
"customer":{"type":"Json","value":"{\"id\":\"c-42\",\"name\":\"Ada Lovelace\",\"email\":\"ada@example.com\"}","valueInfo":{}}}}`

func (e *memEngine) FetchAndLock(ctx context.Context, r camunda7.FetchAndLockRequest) ([]camunda7.LockedExternalTask, error) {
	var out []camunda7.LockedExternalTask
	for range r.MaxTasks {
		i := e.handed.Add(1)
		if i > e.n.Load() {
			e.handed.Add(-1)
			break
		}
		id := fmt.Sprintf("5e3a%032d", i)
		var t camunda7.LockedExternalTask
		if err := json.Unmarshal(fmt.Appendf(nil, fetchedJSON, id, id), &t); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	if len(out) > 0 {
		return out, nil
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(r.AsyncResponseTimeout):
		return nil, nil
	}
}

func (e *memEngine) ExtendLock(context.Context, string, string, time.Duration) error {
	e.extends.Add(1)
	return nil
}
func (e *memEngine) Lock(context.Context, string, string, time.Duration) error { return nil }
func (e *memEngine) Complete(context.Context, string, camunda7.CompleteRequest) error {
	return nil
}
func (e *memEngine) Failure(context.Context, string, camunda7.FailureRequest) error { return nil }
func (e *memEngine) BPMNError(context.Context, string, camunda7.BPMNErrorRequest) error {
	return nil
}
func (e *memEngine) Unlock(context.Context, string) error { return nil }
func (e *memEngine) ExternalTask(context.Context, string) (*camunda7.ExternalTask, error) {
	return nil, camunda7.ErrTaskGone
}
func (e *memEngine) ExternalTasks(context.Context, camunda7.ExternalTaskQuery) ([]camunda7.ExternalTask, error) {
	return nil, nil
}
func (e *memEngine) ExternalTaskLog(context.Context, url.Values) ([]camunda7.ExternalTaskLogEntry, error) {
	return nil, nil
}

// inUse is what the process holds in Go memory after a collection: live heap and
// goroutine stacks.
func inUse() (heap, stacks int64) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc), int64(m.StackInuse)
}

// BenchmarkInFlightMemory reports the bytes the worker holds per in-flight task: n
// tasks whose handlers wait (the handler reads its variables, as a real one would,
// then blocks), each with its lock being kept alive, its logger and its contexts,
// measured as live heap plus goroutine stacks against the same worker idle. Run it with
//
//	go test ./tasks/ -run '^$' -bench InFlightMemory -benchtime 1x
//
// With INFLIGHT_HEAPPROFILE=<file> it writes a heap profile of the n tasks in flight,
// every allocation sampled, for go tool pprof -sample_index=inuse_space.
func BenchmarkInFlightMemory(b *testing.B) {
	const n = 2000
	if os.Getenv("INFLIGHT_HEAPPROFILE") != "" {
		runtime.MemProfileRate = 1
	}
	for range b.N {
		b.StopTimer()
		eng := &memEngine{}
		release := make(chan struct{})
		var started sync.WaitGroup
		started.Add(n)
		reg := tasks.NewRegistry()
		if err := reg.Register("mem", func(ctx context.Context, t *tasks.Task) (camunda7.Variables, error) {
			_, _ = t.Variables().String("invoiceId")
			started.Done()
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil, nil
		}, tasks.TopicOptions{LockDuration: 5 * time.Minute}); err != nil {
			b.Fatal(err)
		}
		w, err := tasks.New(eng, reg, tasks.Config{WorkerID: "w", MaxConcurrency: n, AsyncResponseTimeout: time.Second,
			Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		time.Sleep(100 * time.Millisecond)
		heap0, stacks0 := inUse()
		eng.n.Store(n) // the baseline was the worker idle, without tasks
		b.StartTimer()
		started.Wait()
		b.StopTimer()
		heap, stacks := inUse()
		if p := os.Getenv("INFLIGHT_HEAPPROFILE"); p != "" {
			f, _ := os.Create(p)
			_ = pprof.WriteHeapProfile(f)
			f.Close()
		}
		b.ReportMetric(float64(heap-heap0+stacks-stacks0)/n, "B/task")
		b.ReportMetric(float64(heap-heap0)/n, "heap-B/task")
		b.ReportMetric(float64(stacks-stacks0)/n, "stack-B/task")
		b.ReportMetric(float64(runtime.NumGoroutine())/n, "goroutines/task")
		close(release)
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
}

// reportEngine is a memEngine whose completes take a while and are counted, with the
// most that were in flight at once.
type reportEngine struct {
	memEngine
	mu                  sync.Mutex
	completes, inFlight int
	maxInFlight         int
}

func (e *reportEngine) Complete(context.Context, string, camunda7.CompleteRequest) error {
	e.mu.Lock()
	e.inFlight++
	e.maxInFlight = max(e.maxInFlight, e.inFlight)
	e.mu.Unlock()
	time.Sleep(20 * time.Millisecond)
	e.mu.Lock()
	e.inFlight--
	e.completes++
	e.mu.Unlock()
	return nil
}

// Handlers that end together report a few at a time (ReportConcurrency), and every
// result is reported.
func TestReportConcurrencyBoundsReportsInFlight(t *testing.T) {
	const n = 40
	eng := &reportEngine{}
	eng.n.Store(n)
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(n)
	reg := tasks.NewRegistry()
	require.NoError(t, reg.Register("mem", func(ctx context.Context, _ *tasks.Task) (camunda7.Variables, error) {
		started.Done()
		<-release
		return nil, nil
	}, tasks.TopicOptions{}))
	w, err := tasks.New(eng, reg, tasks.Config{WorkerID: "w", MaxConcurrency: n, ReportConcurrency: 3, AsyncResponseTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	started.Wait()
	close(release)
	require.Eventually(t, func() bool { return w.Stats().Completed.Load() == n }, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	eng.mu.Lock()
	defer eng.mu.Unlock()
	assert.Equal(t, n, eng.completes)
	assert.Equal(t, 3, eng.maxInFlight, "never more than ReportConcurrency at once")
}
