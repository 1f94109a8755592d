package testenv

import (
	"errors"
	"fmt"
	"testing"
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

func TestVersionParts(t *testing.T) {
	for v, want := range map[string][]int{"7.24.0": {7, 24, 0}, "7.20.0-ee": {7, 20, 0}, "2.1.3": {2, 1, 3}, "x": nil} {
		if got := versionParts(v); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("versionParts(%q) = %v, want %v", v, got, want)
		}
	}
}
