package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
)

// TestMain doubles as the crash helper: with EXTWORKER_CRASH_HELPER set, the test binary
// is a worker process that runs one intent and SIGKILLs itself at the named point, so
// the crash tests kill a real process, with no deferred cleanup.
func TestMain(m *testing.M) {
	if mode := os.Getenv("EXTWORKER_CRASH_HELPER"); mode != "" {
		crashHelper(mode)
		return
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}

// httpProvider is a payment provider over HTTP that honours Idempotency-Key: POST
// /charges charges once per key, GET /charges?key= looks a key up.
type httpProvider struct {
	srv     *httptest.Server
	mu      sync.Mutex
	n       int               // POSTs received
	latency time.Duration     // how long a charge takes
	by      map[string]string // key -> charge id
}

func newHTTPProvider(t *testing.T) *httpProvider {
	p := &httpProvider{by: map[string]string{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		defer p.mu.Unlock()
		switch r.Method {
		case http.MethodPost:
			p.n++
			time.Sleep(p.latency) // the provider's own processing time, widening the race
			key := r.Header.Get("Idempotency-Key")
			ref, ok := p.by[key]
			if !ok {
				ref = fmt.Sprintf("ch_%d", len(p.by)+1)
				p.by[key] = ref
			}
			_ = json.NewEncoder(w).Encode(map[string]string{"id": ref})
		case http.MethodGet:
			ref, ok := p.by[r.URL.Query().Get("key")]
			if !ok {
				http.NotFound(w, r)
				return
			}
			_ = json.NewEncoder(w).Encode(map[string]string{"id": ref})
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *httpProvider) counts() (posts, effects int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n, len(p.by)
}

// httpEffect reaches the provider at base; crash, if set, runs at the named point.
func httpEffect(base string, crash func(point string)) idempotency.Effect {
	return idempotency.Effect{
		Dispatch: func(ctx context.Context, key string) (idempotency.Result, error) {
			crash("before-send")
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/charges", nil)
			req.Header.Set("Idempotency-Key", key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return idempotency.Result{}, err
			}
			defer resp.Body.Close()
			var body struct{ ID string }
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				return idempotency.Result{}, err
			}
			crash("after-answer")
			return idempotency.Result{ProviderRef: body.ID, Values: map[string]any{"chargeId": body.ID}}, nil
		},
		Reconcile: func(ctx context.Context, q idempotency.Query) (idempotency.Reconciliation, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/charges?key="+q.ProviderKey, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return idempotency.Reconciliation{}, err
			}
			defer resp.Body.Close()
			if resp.StatusCode == http.StatusNotFound {
				return idempotency.Absent(), nil
			}
			var body struct{ ID string }
			data, _ := io.ReadAll(resp.Body)
			if err := json.Unmarshal(data, &body); err != nil {
				return idempotency.StillUnknown("unreadable lookup answer"), nil
			}
			return idempotency.Found(idempotency.Result{ProviderRef: body.ID, Values: map[string]any{"chargeId": body.ID}}), nil
		},
	}
}

// crashHelper runs one intent in this process and dies by SIGKILL at the point mode names.
func crashHelper(mode string) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("EXTWORKER_CRASH_DB"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	l, err := idempotency.New(pool, idempotency.Config{Namespace: os.Getenv("EXTWORKER_CRASH_NS"), Lease: 2 * time.Second})
	if err != nil {
		os.Exit(3)
	}
	eff := httpEffect(os.Getenv("EXTWORKER_CRASH_PROVIDER"), func(point string) {
		if point == mode {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	})
	if mode == "race" {
		// Not a crash: race the other processes on the intent, backing off as told.
		for {
			out, err := l.Do(ctx, intent("INV-RACE", 4200), eff)
			if err == nil {
				fmt.Println(out.ProviderRef)
				os.Exit(0)
			}
			if !errors.Is(err, idempotency.ErrInProgress) {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(5)
			}
			time.Sleep(50 * time.Millisecond) // the helper's own backoff, not a test wait
		}
	}
	_, err = l.Do(ctx, intent("INV-CRASH", 4200), eff)
	fmt.Fprintln(os.Stderr, "crash helper survived:", err)
	os.Exit(4)
}

func runCrashHelper(t *testing.T, mode, ns, provider string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "EXTWORKER_CRASH_HELPER="+mode, "EXTWORKER_CRASH_DB="+testenv.DBURL(),
		"EXTWORKER_CRASH_NS="+ns, "EXTWORKER_CRASH_PROVIDER="+provider)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "helper output: %s", out)
	ws := exit.Sys().(syscall.WaitStatus)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the helper died by SIGKILL; output: %s", out)
}

// doUntilLeaseEnds runs Do until the dead process's lease has run out.
func doUntilLeaseEnds(t *testing.T, l *idempotency.Ledger, eff idempotency.Effect) idempotency.Receipt {
	t.Helper()
	var out idempotency.Receipt
	testenv.Eventually(t, 20*time.Second, "the dead attempt's lease to run out", func() (bool, error) {
		var err error
		out, err = l.Do(context.Background(), intent("INV-CRASH", 4200), eff)
		return err == nil, err
	})
	return out
}

func TestCrashAfterProviderAnswerReconciles(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t, idempotency.Config{Lease: 2 * time.Second})
	ns := l.Namespace()
	p := newHTTPProvider(t)
	runCrashHelper(t, "after-answer", ns, p.srv.URL)
	r, err := l.Operations().Get(context.Background(), "payment.collect", "invoice:INV-CRASH:v1")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateDispatched, r.State, "the dispatched mark was committed before the request left")
	out := doUntilLeaseEnds(t, l, httpEffect(p.srv.URL, func(string) {}))
	assert.Equal(t, idempotency.StateReconciled, out.State, "reconciled instead of dispatched again")
	posts, effects := p.counts()
	assert.Equal(t, 1, posts)
	assert.Equal(t, 1, effects)
}

func TestCrashBeforeSendDispatchesAgainWithSameKey(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t, idempotency.Config{Lease: 2 * time.Second})
	p := newHTTPProvider(t)
	runCrashHelper(t, "before-send", l.Namespace(), p.srv.URL)
	out := doUntilLeaseEnds(t, l, httpEffect(p.srv.URL, func(string) {}))
	assert.Equal(t, idempotency.StateConfirmed, out.State, "authoritative not found: dispatched again")
	posts, effects := p.counts()
	assert.Equal(t, 1, posts)
	assert.Equal(t, 1, effects)
	events, err := l.Operations().Events(context.Background(), "payment.collect", "invoice:INV-CRASH:v1")
	require.NoError(t, err)
	var reasons []string
	for _, e := range events {
		reasons = append(reasons, string(e.ToState)+": "+e.Reason)
	}
	assert.Contains(t, reasons, "unknown: attempt 1 ended after dispatch without recording an outcome")
	assert.Contains(t, reasons, "prepared: reconciled: the provider has no record; dispatch again with the same key")
}

// Two worker processes and several goroutines race on one intent: exactly one dispatch,
// and every racer observes the same charge.
func TestProcessesRaceOnOneIntent(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t, idempotency.Config{Lease: 10 * time.Second, InProgressBackoff: 50 * time.Millisecond})
	p := newHTTPProvider(t)
	p.latency = 300 * time.Millisecond
	refs := make(chan string, 6)
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "EXTWORKER_CRASH_HELPER=race", "EXTWORKER_CRASH_DB="+testenv.DBURL(),
				"EXTWORKER_CRASH_NS="+l.Namespace(), "EXTWORKER_CRASH_PROVIDER="+p.srv.URL)
			out, err := cmd.Output()
			if err != nil {
				t.Errorf("racing process: %v", err)
				return
			}
			refs <- strings.TrimSpace(string(out))
		}()
	}
	eff := httpEffect(p.srv.URL, func(string) {})
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				out, err := l.Do(context.Background(), intent("INV-RACE", 4200), eff)
				if err == nil {
					refs <- out.ProviderRef
					return
				}
				if !errors.Is(err, idempotency.ErrInProgress) {
					t.Errorf("racing goroutine: %v", err)
					return
				}
				backoff := time.NewTimer(failure.Classify(err).RetryDelay) // as the ledger said
				<-backoff.C
			}
			t.Error("no outcome within 30s")
		}()
	}
	wg.Wait()
	close(refs)
	var all []string
	for r := range refs {
		all = append(all, r)
	}
	require.Len(t, all, 6)
	for _, r := range all {
		assert.Equal(t, all[0], r)
	}
	posts, effects := p.counts()
	assert.Equal(t, 1, posts, "exactly one dispatch")
	assert.Equal(t, 1, effects)
}
