package testenv

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB that records whether the test failed or skipped. Like the
// real ones, Fatal and Skip do not return (here: a panic the caller recovers).
type recorder struct {
	testing.TB
	fatal, skipped bool
}

type stopped struct{}

func (r *recorder) Helper()               {}
func (r *recorder) Fatal(...any)          { r.fatal = true; panic(stopped{}) }
func (r *recorder) Fatalf(string, ...any) { r.fatal = true; panic(stopped{}) }
func (r *recorder) Skip(...any)           { r.skipped = true; panic(stopped{}) }

func (r *recorder) run(f func()) {
	defer func() {
		if v := recover(); v != nil {
			if _, ok := v.(stopped); !ok {
				panic(v)
			}
		}
	}()
	f()
}

// In CI a missing engine or database fails the test; only elsewhere is it skipped.
func TestUnavailableFailsInCI(t *testing.T) {
	for _, ci := range []string{"true", ""} {
		t.Setenv("CI", ci)
		r := &recorder{TB: t}
		r.run(func() { unavailable(r, "engine at http://127.0.0.1:1/engine-rest", errors.New("connection refused")) })
		if ci == "true" && (!r.fatal || r.skipped) {
			t.Errorf("CI=true: fatal %v, skipped %v; want a failure, never a skip", r.fatal, r.skipped)
		}
		if ci == "" && (r.fatal || !r.skipped) {
			t.Errorf("outside CI: fatal %v, skipped %v; want a skip", r.fatal, r.skipped)
		}
	}
}

// EXTWORKER_TEST_SERVICES=none (make check) skips a test that needs a service at once,
// without connecting to it; with CI=true it fails the test, as a missing service does.
func TestNoServicesSkipsWithoutConnecting(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var accepted atomic.Int64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}()
	addr := l.Addr().String()
	t.Setenv("EXTWORKER_TEST_SERVICES", "none")
	t.Setenv("EXTWORKER_TEST_ENGINE_URL", "http://"+addr+"/engine-rest")
	t.Setenv("EXTWORKER_TEST_DB_URL", "postgres://u:p@"+addr+"/db")
	t.Setenv("EXTWORKER_TEST_AMQP_URL", "amqp://u:p@"+addr+"/")
	helpers := map[string]func(testing.TB){
		"Engine": func(tb testing.TB) { Engine(tb) },
		"DB":     func(tb testing.TB) { DB(tb) },
		"DBAs":   func(tb testing.TB) { DBAs(tb, WorkerLogin) },
		"AMQP":   func(tb testing.TB) { AMQP(tb) },
	}
	for _, ci := range []string{"true", ""} {
		t.Setenv("CI", ci)
		for name, h := range helpers {
			r := &recorder{TB: t}
			began := time.Now()
			r.run(func() { h(r) })
			if ci == "true" && (!r.fatal || r.skipped) {
				t.Errorf("%s, CI=true: fatal %v, skipped %v; want a failure", name, r.fatal, r.skipped)
			}
			if ci == "" && (r.fatal || !r.skipped) {
				t.Errorf("%s: fatal %v, skipped %v; want a skip", name, r.fatal, r.skipped)
			}
			if d := time.Since(began); d > time.Second {
				t.Errorf("%s took %v to skip", name, d)
			}
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("%d connections to the service; want none", n)
	}
}

func TestVersionParts(t *testing.T) {
	for v, want := range map[string][]int{"7.24.0": {7, 24, 0}, "7.20.0-ee": {7, 20, 0}, "2.1.3": {2, 1, 3}, "x": nil} {
		if got := versionParts(v); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("versionParts(%q) = %v, want %v", v, got, want)
		}
	}
}
