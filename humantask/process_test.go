package humantask_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/humantask"
	"github.com/extworker/extworker/internal/failpoint"
	"github.com/extworker/extworker/internal/testenv"
)

// The crash rows and the load test run the service in processes of its own: this test
// binary run again as a child (childEnv set), serving humantask.Service.Handler on an
// address the test gives, until a failpoint or the test SIGKILLs it.

const childEnv = "EXTWORKER_HUMANTASK_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(serveChild())
	}
	os.Exit(m.Run())
}

// serveChild is the service process: engine, namespace, address and lease from the
// environment (no lease: the service's default); exit status 3 says it outlived its
// ten minutes, 2 that it could not start.
func serveChild() int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "humantask child:", err); return 2 }
	pcfg, err := pgxpool.ParseConfig(testenv.DBURL())
	if err != nil {
		return fail(err)
	}
	pcfg.MaxConns = 10 // the load test's 50 users (the default is 4 on this machine)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	ec, err := camunda7.New(camunda7.Config{BaseURL: os.Getenv(childEnv + "_ENGINE")})
	if err != nil {
		return fail(err)
	}
	id, err := humantask.NewProxyHeader(humantask.ProxyHeader{UserHeader: "X-User", GroupsHeader: "X-Groups",
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	if err != nil {
		return fail(err)
	}
	cfg := humantask.Config{Engine: admin.New(ec), Pool: pool, Identity: id, Namespace: os.Getenv(childEnv + "_NS"),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if l := os.Getenv(childEnv + "_LEASE"); l != "" {
		if cfg.Lease, err = time.ParseDuration(l); err != nil {
			return fail(err)
		}
	}
	s, err := humantask.New(cfg)
	if err != nil {
		return fail(err)
	}
	ln, err := net.Listen("tcp", os.Getenv(childEnv+"_ADDR"))
	if err != nil {
		return fail(err)
	}
	fmt.Println("ready")
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	_ = srv.Serve(ln)
	return 3
}

// serviceProc is a running service process.
type serviceProc struct {
	addr   string
	cmd    *exec.Cmd
	exited chan struct{} // closed when it has ended, err its Wait's
	err    error
}

// procOpts say how a service process runs: its engine URL, ledger namespace, address
// (default a free one), ledger lease ("": the service's default) and failpoint.
type procOpts struct {
	engine, ns, addr, lease, failpoint string
}

// startService runs a service process and waits until it listens; it is SIGKILLed at
// cleanup if still running.
func startService(t *testing.T, o procOpts) *serviceProc {
	t.Helper()
	if o.addr == "" {
		o.addr = testenv.FreeAddr(t)
	}
	p, err := spawnService(o)
	if p != nil {
		t.Cleanup(p.kill)
	}
	require.NoError(t, err)
	return p
}

// spawnService is startService for any goroutine: the caller kills the process it returns
// (also with the error, when it is not nil).
func spawnService(o procOpts) (*serviceProc, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=serve", childEnv+"_ENGINE="+o.engine, childEnv+"_NS="+o.ns,
		childEnv+"_ADDR="+o.addr, childEnv+"_LEASE="+o.lease)
	if o.failpoint != "" {
		cmd.Env = append(cmd.Env, failpoint.Env+"="+o.failpoint)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &serviceProc{addr: o.addr, cmd: cmd, exited: make(chan struct{})}
	ready := make(chan bool, 1)
	go func() {
		r := bufio.NewReader(out)
		line, _ := r.ReadString('\n')
		ready <- strings.TrimSpace(line) == "ready"
		_, _ = io.Copy(io.Discard, r)
		p.err = cmd.Wait()
		close(p.exited)
	}()
	select {
	case ok := <-ready:
		if !ok {
			return p, errors.New("the service process did not start")
		}
	case <-time.After(60 * time.Second):
		return p, errors.New("the service process did not listen within 60s")
	}
	return p, nil
}

// kill SIGKILLs the process (if it still runs) and waits for it.
func (p *serviceProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// killedBy reports whether the process has ended by SIGKILL (its failpoint's or kill's).
func (p *serviceProc) killedBy() bool {
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// url is the process's base URL.
func (p *serviceProc) url() string { return "http://" + p.addr }

// countingEngine is a proxy to the engine that counts the completions of user tasks the
// engine accepted (2xx). It sends every request whole to the engine whatever becomes of
// its sender: a service process killed while its completion is on the way does not
// cancel it, so the count is the engine's.
func countingEngine(t *testing.T) (string, *atomic.Int32) {
	t.Helper()
	target, err := url.Parse(testenv.EngineURL())
	require.NoError(t, err)
	var completions atomic.Int32
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	rp.ModifyResponse = func(r *http.Response) error {
		if r.Request.Method == http.MethodPost && strings.HasSuffix(r.Request.URL.Path, "/complete") && r.StatusCode/100 == 2 {
			completions.Add(1)
		}
		return nil
	}
	rp.ErrorLog = nil
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
		defer cancel()
		rp.ServeHTTP(w, r.WithContext(ctx))
	}))
	t.Cleanup(srv.Close)
	return srv.URL + target.Path, &completions
}
