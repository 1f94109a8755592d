package callback_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/inbox/callback"
	"github.com/extworker/extworker/internal/failpoint"
	"github.com/extworker/extworker/internal/testenv"
)

// The callback endpoint's crash rows: a server in a process of its own (this test binary,
// run again as a child) SIGKILLed at a failpoint while it handles a callback; the
// provider, whose request got no answer, sends it again to a server that took over. The
// engine acts once, and every answer after the crash is the same.

const childEnv = "EXTWORKER_CALLBACK_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(child())
	}
	os.Exit(m.Run())
}

// tierSettings are a tier's engine client and inbox settings: the shipped ones, or the
// short tier's (a quick client, a short in-flight window and backoff).
func tierSettings(tier, source string) (camunda7.Config, inbox.Config) {
	if tier == "defaults" {
		return camunda7.Config{BaseURL: testenv.EngineURL()}, inbox.Config{Source: source}
	}
	return camunda7.Config{BaseURL: testenv.EngineURL(), Timeout: time.Second, LongPollMargin: time.Second},
		inbox.Config{Source: source, InFlightWindow: 1500 * time.Millisecond, BackoffInitial: 100 * time.Millisecond, BackoffMax: 500 * time.Millisecond}
}

// child serves the callbacks of source _SOURCE on _ADDR until its failpoint kills it;
// exit status 3 says it outlived its minute.
func child() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, testenv.DBURL())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	e := &env{source: os.Getenv(childEnv + "_SOURCE"), wait: os.Getenv(childEnv + "_WAIT"), paid: os.Getenv(childEnv + "_PAID")}
	ccfg, icfg := tierSettings(os.Getenv(childEnv+"_TIER"), e.source)
	ec, err := camunda7.New(ccfg)
	if err == nil {
		var h *inbox.Handler
		if h, err = inbox.NewHandler(pool, admin.New(ec), e.decide, icfg); err == nil {
			var srv *callback.Server
			if srv, err = callback.New(pool, []callback.Source{{Handler: h, Secrets: []string{os.Getenv(childEnv + "_SECRET")}}}, callback.Config{}); err == nil {
				mux := http.NewServeMux()
				mux.Handle("/callbacks/{source}", srv)
				err = (&http.Server{Addr: os.Getenv(childEnv + "_ADDR"), Handler: mux, ReadHeaderTimeout: 10 * time.Second}).ListenAndServe()
			}
		}
	}
	fmt.Fprintln(os.Stderr, err)
	return 3
}

// TestServerKilledAfterTheEngineActed: the engine correlated the callback, and the
// server died before the inbox row said so (inbox-after-engine): the provider got no
// answer and sends the callback again, to a server that took over. It reconciles with
// the engine (the message's mark is on the instance) instead of correlating again:
// one correlation, and the provider's next copies all get the same answer, 200
// processed. In the defaults tier the copy sent at once is held (202) until the engine
// client's in-flight window has passed, then reconciled.
func TestServerKilledAfterTheEngineActed(t *testing.T) {
	testenv.NeedFailpoints(t)
	for _, tier := range []string{"defaults", "short"} {
		t.Run(tier, func(t *testing.T) {
			e := newEnv(t)
			invoice := testenv.Unique("INV")
			e.startWaiting(t, invoice)
			addr := testenv.FreeAddr(t)
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"=serve", childEnv+"_SOURCE="+e.source, childEnv+"_WAIT="+e.wait, childEnv+"_PAID="+e.paid,
				childEnv+"_SECRET="+e.newText, childEnv+"_ADDR="+addr, childEnv+"_TIER="+tier, failpoint.Env+"="+failpoint.InboxAfterEngine)
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			require.NoError(t, cmd.Start())
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()

			b := body(event{Type: "payment.captured", Invoice: invoice})
			id := "evt-" + invoice
			dead := e.url
			e.url = "http://" + addr + "/callbacks/" + e.source
			testenv.Eventually(t, 30*time.Second, "the child's server answers, or dies at its failpoint", func() (bool, error) {
				req, err := http.NewRequest(http.MethodPost, e.url, bytes.NewReader(b))
				if err != nil {
					return false, err
				}
				req.Header = signed(e.new, id, b)
				res, err := http.DefaultClient.Do(req)
				if err == nil {
					res.Body.Close()
					return false, fmt.Errorf("the child answered %d instead of dying at its failpoint", res.StatusCode)
				}
				select {
				case <-exited:
					return true, nil
				default:
					return false, nil // not listening yet, or dying
				}
			})
			ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
			require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the child ended with %v, not by its failpoint", cmd.ProcessState)
			require.Equal(t, []inbox.State{inbox.StateProcessing}, states(e.rows(t, id)), "the dead server's row")
			require.Equal(t, 1, e.correlations(t, invoice), "the engine acted before the server died")

			// A server takes over, at the tier's settings; the provider sends again until
			// it is told the callback is processed.
			e.url = dead
			e.restartTier(t, tier)
			first := e.send(t, id, b)
			t.Logf("%s: the first copy after the crash: %d %s", tier, first.status, first.body)
			assert.Contains(t, []int{http.StatusOK, http.StatusAccepted}, first.status)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { _ = e.srv.Run(ctx) }()
			var last reply
			testenv.Eventually(t, 3*time.Minute, "the callback processed", func() (bool, error) {
				last = e.send(t, id, b)
				return last.status == http.StatusOK, nil
			})
			assert.JSONEq(t, fmt.Sprintf(`{"id":%q,"state":"processed"}`, id), last.body)
			for range 3 {
				assert.Equal(t, last, e.send(t, id, b), "every copy after: the same answer")
			}
			assert.Equal(t, 1, e.correlations(t, invoice), "reconciled, not correlated again")
			assert.Zero(t, e.held(t, id), "nothing held once processed")
		})
	}
}

// restartTier is restart at tier's settings.
func (e *env) restartTier(t *testing.T, tier string) {
	t.Helper()
	ccfg, icfg := tierSettings(tier, e.source)
	ec, err := camunda7.New(ccfg)
	require.NoError(t, err)
	e.engine = admin.New(ec)
	e.restartWith(t, icfg)
}

func states(rs []inbox.Record) []inbox.State {
	var out []inbox.State
	for _, r := range rs {
		out = append(out, r.State)
	}
	return out
}
