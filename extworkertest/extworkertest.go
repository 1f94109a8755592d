// Package extworkertest runs a worker program's handlers against a real Camunda 7 engine
// and PostgreSQL from a test of the program's own module: the engine-backed half of a
// handler author's tests (docs/handlers.md, Testing). The other half, without services,
// is package tasks/taskstest with the in-memory ledger (idempotency.NewInMemory).
//
//	func TestBookingOnTheEngine(t *testing.T) {
//		c := extworkertest.Engine(t)
//		key := extworkertest.Unique("courier")
//		extworkertest.Deploy(t, c, key, []byte(fmt.Sprintf(processBPMN, key)))
//		extworkertest.Start(t, extworker.Options{}, setup) // what main registers
//		pi, err := c.StartProcess(ctx, key, admin.StartProcessRequest{...})
//		ends := extworkertest.WaitEnded(t, c, pi.ID, time.Minute) // the end events reached
//		...
//	}
//
// The services are the worker's own variables: EXTWORKER_ENGINE_URL and
// EXTWORKER_DATABASE_URL, whose defaults are the local ones `make up` starts. A test
// whose engine or database does not answer is skipped, or failed when CI=true. Start
// sets variables with t.Setenv: its tests cannot run in parallel.
package extworkertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
)

// Defaults of the services' variables, as the worker reads them.
const (
	DefaultEngineURL   = "http://127.0.0.1:8080/engine-rest"
	DefaultDatabaseURL = "postgres://extworker:extworker@127.0.0.1:5432/extworker"
)

// EngineURL is EXTWORKER_ENGINE_URL, or DefaultEngineURL.
func EngineURL() string { return env("EXTWORKER_ENGINE_URL", DefaultEngineURL) }

// DatabaseURL is EXTWORKER_DATABASE_URL, or DefaultDatabaseURL.
func DatabaseURL() string { return env("EXTWORKER_DATABASE_URL", DefaultDatabaseURL) }

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// unavailable skips the test, or fails it under CI=true, where every service is there.
func unavailable(t testing.TB, what string, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s: %v", what, err)
	}
	t.Skipf("%s: %v (start it, or set the variable)", what, err)
}

// Engine returns an admin client of the engine at EngineURL, after checking it answers.
func Engine(t testing.TB) *admin.Client {
	t.Helper()
	cc, err := camunda7.New(camunda7.Config{BaseURL: EngineURL()})
	if err != nil {
		t.Fatalf("engine client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := admin.New(cc)
	if _, err := c.Version(ctx); err != nil {
		unavailable(t, "engine at EXTWORKER_ENGINE_URL "+redact(EngineURL()), err)
	}
	return c
}

// Deploy deploys a BPMN model as resource name+".bpmn", or fails the test.
func Deploy(t testing.TB, c *admin.Client, name string, bpmn []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Deploy(ctx, admin.Deployment{Name: name, Resources: []admin.Resource{{Name: name + ".bpmn", Content: bpmn}}}); err != nil {
		t.Fatalf("deploy %s: %v", name, err)
	}
}

// Unique returns prefix plus a random suffix, for process keys, business keys and ledger
// namespaces that no other test, or earlier run against the same engine, uses.
func Unique(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// Start runs a worker in the test's process until the test ends, as the program's main
// would (extworker.Serve): the configuration from the EXTWORKER_* variables, then
// setup to register the handlers, then App.Run. Before that it checks that the engine
// and the database answer, and migrates the database with opts (extworker.Migrate: the
// ledger's migrations, then opts.Migrations). Unless the test set them, it sets what a
// test wants: a ledger namespace of the test's own (EXTWORKER_LEDGER_NAMESPACE), no
// operations endpoint (EXTWORKER_HTTP_ADDR=off), a 1s long poll; and opts.Logger, unless
// given, writes to t.Log at EXTWORKER_LOG_LEVEL, info by default (the worker starting,
// each task handled, warnings and errors). When the test ends, the worker stops gracefully, and an error
// from Run fails the test.
func Start(t testing.TB, opts extworker.Options, setup func(*extworker.App) error) *extworker.App {
	t.Helper()
	Engine(t)
	checkDatabase(t)
	for k, v := range map[string]string{"EXTWORKER_LEDGER_NAMESPACE": Unique("test"), "EXTWORKER_HTTP_ADDR": "off", "EXTWORKER_LONG_POLL": "1s"} {
		if _, set := os.LookupEnv(k); !set {
			t.Setenv(k, v)
		}
	}
	var logs *testLog
	if opts.Logger == nil {
		logs = &testLog{t: t}
		opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: logLevel()}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := extworker.Migrate(ctx, opts, io.Discard); err != nil {
		cancel()
		t.Fatalf("migrate: %v", err)
	}
	app, err := extworker.New(ctx, opts)
	if err != nil {
		cancel()
		t.Fatalf("extworker.New: %v", err)
	}
	if err := setup(app); err != nil {
		cancel()
		app.Close()
		t.Fatalf("setup: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		err := <-done
		app.Close()
		if logs != nil {
			logs.close()
		}
		if err != nil {
			t.Errorf("the worker stopped with an error: %v", err)
		}
	})
	return app
}

// logLevel is EXTWORKER_LOG_LEVEL's level, as the program reads it, or info: a failing
// test's log then shows the worker starting and every task handled. A value the program
// refuses is left to extworker.New to report.
func logLevel() slog.Level {
	var l slog.Level
	if l.UnmarshalText([]byte(os.Getenv("EXTWORKER_LOG_LEVEL"))) != nil {
		return slog.LevelInfo
	}
	return l
}

// checkDatabase skips (or fails) the test when the database does not answer.
func checkDatabase(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, DatabaseURL())
	if err == nil {
		err = conn.Ping(ctx)
		_ = conn.Close(ctx)
	}
	if err != nil {
		unavailable(t, "database at EXTWORKER_DATABASE_URL "+redact(DatabaseURL()), err)
	}
}

// WaitEnded waits until the process instance id has ended, within d, and returns the
// ids of the end events it reached (the path it took). It fails the test when the
// instance is still running at the deadline, naming its incidents if it has any.
func WaitEnded(t testing.TB, c *admin.Client, id string, d time.Duration) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d+10*time.Second)
	defer cancel()
	deadline := time.Now().Add(d)
	for {
		h, err := c.HistoricProcessInstance(ctx, id)
		if err != nil {
			t.Fatalf("process instance %s: %v", id, err)
		}
		if h.State != "ACTIVE" && h.State != "SUSPENDED" {
			acts, err := c.HistoricActivityInstances(ctx, map[string][]string{"processInstanceId": {id}})
			if err != nil {
				t.Fatalf("process instance %s: %v", id, err)
			}
			var ends []string
			for _, a := range acts {
				if strings.HasSuffix(a.ActivityType, "EndEvent") {
					ends = append(ends, a.ActivityID)
				}
			}
			return ends
		}
		if time.Now().After(deadline) {
			inc, _ := c.Incidents(ctx, map[string][]string{"processInstanceId": {id}})
			var msgs []string
			for _, i := range inc {
				msgs = append(msgs, i.IncidentMessage)
			}
			t.Fatalf("process instance %s still %s after %v; incidents: %q", id, h.State, d, msgs)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("process instance %s: %v", id, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// testLog writes the worker's records to t.Log until the test's cleanup has stopped it.
type testLog struct {
	mu     sync.Mutex
	t      testing.TB
	closed bool
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

func (l *testLog) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
}

// redact is a URL without its password, for messages.
func redact(u string) string {
	if i, j := strings.Index(u, "://"), strings.LastIndex(u, "@"); i > 0 && j > i {
		return u[:i+3] + "***" + u[j:]
	}
	return u
}
